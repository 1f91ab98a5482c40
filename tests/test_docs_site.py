"""The documentation site builds with `mkdocs build --strict` (as `make docs` does), and a broken link,
anchor or repository link fails that build: mkdocs.yml's validation turns each into a warning and
--strict makes a warning fatal; docs/hooks.py resolves the pages' links into the repository, makes
CHANGELOG.md the Changelog page and links the header to the repository.

The built site in a real browser (Debian's chromium driven by playwright, as tests/test_serve_page.py,
with every request outside the test's own server refused: the theme's web fonts too): its search
finds a word of a page, and the widest pages at 1280 px need no horizontal scrolling. The site is
served over http on 127.0.0.1: from file:// the theme cannot fetch the search index for its web
worker and hides the search box, which is why search was not seen working on a site opened from
the disk (`make docs-serve` serves it)."""
import functools
import http.server
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

from tests.helpers import ROOT as _ROOT

ROOT = pathlib.Path(_ROOT)
ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1")
REPO_URL = "https://example.invalid/maintainers/paddle-zoo"   # what a publisher would set: any https address


def _build(root, site, env=ENV):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The repository's site, built once for the module (~2 s), with the repository address given."""
    out = tmp_path_factory.mktemp("docs") / "site"
    r = _build(ROOT, out, dict(ENV, PADDLE_ZOO_REPO_URL=REPO_URL))
    return out, r


def test_site_builds_strict(site):
    out, r = site
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]
    # a page's link into the repository resolves to a copy of that file in the site
    assert (out / "repo" / "configs").is_dir()


def test_the_site_has_the_changelog_and_links_the_repository(site):
    out, _ = site
    changelog = (out / "changelog" / "index.html").read_text(encoding="utf-8")
    versions = re.findall(r"(?m)^## (\[[^\]]+\])", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert versions and all(v in changelog for v in versions), versions
    home = (out / "index.html").read_text(encoding="utf-8")
    assert f'href="{REPO_URL}"' in home and "changelog/" in home
    assert re.search(r'md-source__repository">\s*paddle-zoo', home)


def test_the_repository_address_comes_from_a_remote_a_browser_can_open():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    for remote, url in [("git@github.com:owner/paddle-zoo.git\n", "https://github.com/owner/paddle-zoo"),
                        ("ssh://git@gitlab.example.org/group/paddle-zoo.git", "https://gitlab.example.org/group/paddle-zoo"),
                        ("https://user:token@github.com/owner/paddle-zoo.git", "https://github.com/owner/paddle-zoo"),
                        ("https://github.com/owner/paddle-zoo", "https://github.com/owner/paddle-zoo"),
                        ("/srv/git/paddle-zoo.git", None), ("file:///srv/git/paddle-zoo", None)]:
        assert hooks.web_address(remote) == url, remote


@pytest.fixture
def docs_copy(tmp_path):
    """The repository's top level with a real copy of docs/ and mkdocs.yml (the rest symlinked)."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in os.listdir(ROOT):
        if name in ("docs", "mkdocs.yml", ".git", ".venv", "site", "output"):
            continue
        os.symlink(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs")
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


@pytest.mark.parametrize("link, says", [
    ("[x](getting-started.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
    ("[x](no-such-page.md)", "'no-such-page.md', but the target is not found"),
    ("[x](../configs/no_such_recipe.yaml)", "names no file of the repository"),
    ("[x](../configs/video/)", "is a folder"),
])
def test_broken_link_fails_the_build(docs_copy, tmp_path, link, says):
    page = docs_copy / "docs" / "index.md"
    page.write_text(page.read_text() + f"\n\nSee {link}.\n")
    r = _build(docs_copy, tmp_path / "site")
    assert r.returncode != 0
    assert says in r.stderr, r.stderr[-3000:]


# ------------------------------------------------------------------------------ in a browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WIDE_PAGES = {"home": "index.html", "model zoo": "model-zoo/index.html", "performance": "performance/index.html",
              "config reference": "config-reference/index.html"}


@pytest.fixture(scope="module")
def served(site):
    """The built site over http on 127.0.0.1 (a thread of this process), its base URL."""
    out, r = site
    assert r.returncode == 0, r.stderr[-3000:]

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            if not isinstance(sys.exc_info()[1], ConnectionError):   # a page closed mid-transfer
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: apt-get install -y chromium (the Makefile does)"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _page(browser, served):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    # nothing leaves the machine: the theme's Google fonts fall back to the system's
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(served) else route.abort())
    return page


def test_the_search_finds_a_word_of_a_page(browser, served):
    """`sentencepiece` is on the own-data and Transformer pages: the search lists a result linking one
    of the pages whose text holds it."""
    word = "sentencepiece"
    holding = {p.stem for p in (ROOT / "docs").glob("*.md") if word in p.read_text(encoding="utf-8").lower()}
    assert {"own-data", "transformer"} <= holding, holding
    page = _page(browser, served)
    try:
        page.goto(served + "index.html")
        box = page.locator("input.md-search__input")
        box.click()
        for attempt in range(3):    # ~2 s; a query typed while the worker still builds its index on a
            box.fill("")            # loaded machine may go unanswered: typed again, it is answered
            box.fill(word)
            try:
                page.wait_for_selector(".md-search-result__item a", timeout=10_000)
                break
            except PlaywrightTimeout:
                if attempt == 2:
                    raise
        links = page.eval_on_selector_all(".md-search-result__item a", "els => els.map(e => e.getAttribute('href'))")
    finally:
        page.close()
    pages = {urllib.parse.urlsplit(href).path.strip("/").split("/")[-1] for href in links}
    assert pages & holding, (links, holding)


OVERFLOW_JS = """() => {
  const content = document.querySelector('.md-content__inner');
  const right = content.getBoundingClientRect().right;
  const out = [];
  document.querySelectorAll('.md-content__inner table').forEach((t, i) => {
    const box = t.closest('.md-typeset__scrollwrap') || t;
    const over = Math.max(box.scrollWidth - box.clientWidth, t.getBoundingClientRect().right - right);
    if (over > 1) out.push(`table ${i + 1} (${t.rows[0].innerText.replace(/\\s+/g, ' ').slice(0, 60)}): ${Math.round(over)} px`);
  });
  document.querySelectorAll('.md-content__inner pre > code').forEach((c, i) => {
    const over = Math.max(c.scrollWidth - c.clientWidth, c.getBoundingClientRect().right - right);
    if (over > 1) out.push(`code block ${i + 1} (${c.innerText.slice(0, 40).replace(/\\s+/g, ' ')}): ${Math.round(over)} px`);
  });
  const doc = document.scrollingElement;
  if (doc.scrollWidth - doc.clientWidth > 1) out.push(`the page itself: ${doc.scrollWidth - doc.clientWidth} px`);
  return out;
}"""


def test_the_wide_pages_fit_1280_px_without_horizontal_scrolling(browser, served, tmp_path):
    """Home, model zoo, performance and config reference at 1280 px: no table and no code block wider
    than the content column (Material puts a table in a scrolling wrapper: its scroll width then
    exceeds its width). Screenshots of each first screen go to the test's tmp_path for a look."""
    wide = {}
    for name, path in WIDE_PAGES.items():
        page = _page(browser, served)
        try:
            page.goto(served + path)
            page.wait_for_load_state("load")
            over = page.evaluate(OVERFLOW_JS)
            # the first screen (a full page of the performance notes costs seconds): where a reader looks
            page.screenshot(path=str(tmp_path / f"{path.split('/')[0].replace('.html', '')}.png"))
        finally:
            page.close()
        if over:
            wide[name] = over
    assert not wide, f"wider than the column at 1280 px (screenshots in {tmp_path}): {wide}"


def test_the_width_check_finds_a_table_and_a_code_block_too_wide(browser, served):
    page = _page(browser, served)
    try:
        page.goto(served + "index.html")
        page.evaluate("""() => document.querySelector('.md-content__inner').insertAdjacentHTML('beforeend',
            '<div class="md-typeset__scrollwrap"><div class="md-typeset__table"><table><tr><th>wide</th><td>'
            + 'x'.repeat(400) + '</td></tr></table></div></div>'
            + '<pre><code style="white-space: pre">' + 'y '.repeat(300) + '</code></pre>')""")
        over = page.evaluate(OVERFLOW_JS)
    finally:
        page.close()
    assert len(over) == 2 and over[0].startswith("table") and over[1].startswith("code block"), over
