"""mkdocs hooks: a page's relative link into the repository (`../configs/...yaml`, `../engine/data.py`)
resolves to a copy of that file in the site, under repo/; CHANGELOG.md is the site's Changelog page;
the header links to the repository where the clone the site is built from has a web address.

Why: the pages point at recipes and code, and a built site must not hold dead links. Each such file is
added to the site's files (so mkdocs' own link validation sees it), the link is rewritten to it, and a
link to a missing file, a folder or a Markdown file outside docs/ (README.md would render as a page
whose own links point nowhere) is a warning, which `--strict` turns into a failed build.
"""
import logging
import os
import posixpath
import re
import subprocess

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](target) and ![alt](target); the target stops at whitespace, ')' or '#'.
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
FENCE = re.compile(r"^(```|~~~)")
PREFIX = "repo"


def _root(config):
    return os.path.dirname(os.path.abspath(config.config_file_path))


def _outside_targets(page_src, markdown, config):
    """(link target, repository-relative path or None) for each link that leaves docs_dir."""
    docs = os.path.abspath(config.docs_dir)
    root = _root(config)
    page_dir = os.path.dirname(os.path.join(docs, page_src))
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if in_fence:
            continue
        for m in LINK.finditer(line):
            target = m.group(2)
            if "://" in target or target.startswith(("mailto:", "/")):
                continue
            path = os.path.normpath(os.path.join(page_dir, target))
            if path == docs or path.startswith(docs + os.sep):
                continue
            rel = os.path.relpath(path, root)
            yield target, (None if rel.startswith("..") else rel.replace(os.sep, "/"))


CHANGELOG = "changelog.md"
REPO_URL_ENV = "PADDLE_ZOO_REPO_URL"


def web_address(remote):
    """The https address of a git remote (`https://host/owner/name(.git)` or `git@host:owner/name.git`),
    or None for one a browser cannot open (a local path, file://)."""
    remote = remote.strip()
    m = re.fullmatch(r"(?:ssh://)?git@([^:/]+)[:/](.+?)(?:\.git)?/?", remote)
    if m:
        return f"https://{m.group(1)}/{m.group(2)}"
    m = re.fullmatch(r"https?://(?:[^@/]+@)?([^/]+)/(.+?)(?:\.git)?/?", remote)
    return f"https://{m.group(1)}/{m.group(2)}" if m else None


def on_config(config):
    """repo_url (the header's repository link) from $PADDLE_ZOO_REPO_URL, else from the clone's `origin`
    remote: the project names no public address of its own, and a link written into mkdocs.yml would
    point wherever one copy lives. With neither, the site has no repository link."""
    if config.repo_url:
        return config
    url = os.environ.get(REPO_URL_ENV, "").strip()
    if not url:
        try:
            proc = subprocess.run(["git", "-C", _root(config), "remote", "get-url", "origin"],
                                  capture_output=True, text=True, timeout=10)
            url = web_address(proc.stdout) if proc.returncode == 0 else None
        except OSError:     # no git: a site built from an unpacked archive
            url = None
    if url:
        config.repo_url = url
        config.repo_name = config.repo_name or "paddle-zoo"
    return config


def on_files(files, config):
    root = _root(config)
    # CHANGELOG.md as a page at the top of docs/: its relative links must then read from docs/, which
    # --strict checks (it has none today)
    if files.get_file_from_path(CHANGELOG) is None:
        files.append(File.generated(config, CHANGELOG, abs_src_path=os.path.join(root, "CHANGELOG.md")))
    for f in list(files.documentation_pages()):
        with open(f.abs_src_path, encoding="utf-8") as fh:
            markdown = fh.read()
        for target, rel in _outside_targets(f.src_uri, markdown, config):
            if rel is None or rel.endswith(".md") or not os.path.isfile(os.path.join(root, rel)):
                continue
            uri = f"{PREFIX}/{rel}"
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=os.path.join(root, rel)))
    return files


def on_page_markdown(markdown, page, config, files):
    root = _root(config)
    rewrites = {}
    for target, rel in _outside_targets(page.file.src_uri, markdown, config):
        full = os.path.join(root, rel) if rel else None
        if rel is None:
            log.warning("%s: the link %s leaves the repository", page.file.src_uri, target)
        elif rel.endswith(".md"):
            log.warning("%s: the link %s is a Markdown file outside docs/: link the docs page that says it",
                        page.file.src_uri, target)
        elif os.path.isdir(full):
            log.warning("%s: the link %s is a folder: link a file in it", page.file.src_uri, target)
        elif not os.path.isfile(full):
            log.warning("%s: the link %s names no file of the repository", page.file.src_uri, target)
        else:
            page_dir = posixpath.dirname(page.file.src_uri)
            rewrites[target] = posixpath.relpath(f"{PREFIX}/{rel}", page_dir or ".")
    if not rewrites:
        return markdown

    def swap(m):
        new = rewrites.get(m.group(2))
        return m.group(0) if new is None else f"{m.group(1)}{new}{m.group(3)}"

    out, in_fence = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
        out.append(line if in_fence else LINK.sub(swap, line))
    return "\n".join(out)
