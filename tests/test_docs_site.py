"""The documentation site builds with `mkdocs build --strict` (as `make docs` does), and a broken link,
anchor or repository link fails that build: mkdocs.yml's validation turns each into a warning and
--strict makes a warning fatal; docs/hooks.py resolves the pages' links into the repository."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT as _ROOT

ROOT = pathlib.Path(_ROOT)
ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1")


def _build(root, site):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], cwd=root, env=ENV, capture_output=True, text=True, timeout=300)


def test_site_builds_strict(tmp_path):
    r = _build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]
    # a page's link into the repository resolves to a copy of that file in the site
    assert (tmp_path / "site" / "repo" / "configs").is_dir()


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
