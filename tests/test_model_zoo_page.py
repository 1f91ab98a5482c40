"""docs/model-zoo.md holds the table `python tools/download.py --docs` generates from the pretrained entries.

A changed entry (a new metric, a renamed recipe) fails here until the page is regenerated; the text
around the table's markers is the page's own and is kept by the generator.
"""
import importlib.util
import os

from engine import components
from tests.helpers import ROOT

PAGE = os.path.join(ROOT, "docs", "model-zoo.md")


def _tool():
    spec = importlib.util.spec_from_file_location("zoo_tool_download_page", os.path.join(ROOT, "tools", "download.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_committed_page_is_the_generators_output():
    tool = _tool()
    components.load_all()
    page = open(PAGE, encoding="utf-8").read()
    assert page.count(tool.TABLE_BEGIN) == 1 and page.count(tool.TABLE_END) == 1
    assert tool.docs_page(page) == page, "docs/model-zoo.md is stale: run `python tools/download.py --docs`"
    # the links are relative to docs/ and name recipes that exist
    table = page.split(tool.TABLE_BEGIN, 1)[1].split(tool.TABLE_END, 1)[0]
    assert "](../configs/" in table and "](configs/" not in table


def test_docs_flag_writes_a_new_page_and_keeps_the_text_around_the_table(tmp_path, capsys):
    tool = _tool()
    path = tmp_path / "model-zoo.md"
    assert tool.main(["--docs", str(path)]) == 0
    fresh = path.read_text(encoding="utf-8")
    assert fresh.startswith("# Model zoo\n") and tool.TABLE_BEGIN in fresh and fresh.endswith(tool.TABLE_END + "\n")
    assert "written" in capsys.readouterr().out
    path.write_text(fresh.replace(tool.TABLE_END, tool.TABLE_END + "\n\nA note of ours.")
                    .replace("| Model | Weights | Config |", "| stale |", 1), encoding="utf-8")
    assert tool.main(["--docs", str(path)]) == 0
    again = path.read_text(encoding="utf-8")
    assert again == fresh.replace(tool.TABLE_END, tool.TABLE_END + "\n\nA note of ours.")
    assert tool.main(["--docs", str(path)]) == 0 and "unchanged" in capsys.readouterr().out.splitlines()[-1]
