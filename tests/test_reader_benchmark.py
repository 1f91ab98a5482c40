"""The reader table (tools/benchmark.py --readers, benchmarks/readers.py): one command times the full
recipes' readers on generated data, records the bytes a batch takes across the process boundary, and
writes its own block of docs/performance.md without touching the others. Small sizes (--scale 0.1)."""
import json
import os
import sys

import numpy as np
import pytest

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))

import benchmark  # noqa: E402  (tools/benchmark.py, the command line)
from benchmarks import readers, report  # noqa: E402

KIND = "intel-sapphirerapids"   # a kind other than the page's, so the run adds a block of its own
PAGE = """# title

<!-- bench amd-zen5: start (tools/benchmark.py --show --docs) -->
training table
<!-- bench amd-zen5: end -->

text

<!-- bench-readers amd-zen5: start (tools/benchmark.py --readers --show --docs) -->
old reader table
<!-- bench-readers amd-zen5: end -->

after
"""


def test_bytes_per_batch_is_the_arrays_nbytes():
    video = np.zeros((2, 3, 3, 224, 224), np.float32)   # batch 2 of 3 segments x 3 x 224 x 224
    assert readers.batch_bytes({"imgs": video})["arrays"] == 2 * 3 * 3 * 224 * 224 * 4
    assert readers.batch_bytes({"imgs": video.astype(np.uint8)})["arrays"] == 2 * 3 * 3 * 224 * 224
    mixed = readers.batch_bytes({"imgs": video, "index": np.arange(2), "names": ["a", "b"]})
    assert mixed["arrays"] == 2 * 3 * 3 * 224 * 224 * 4 + 2 * 8 and mixed["pickled"] > 0
    assert mixed["by_key"] == {"imgs": 2 * 3 * 3 * 224 * 224 * 4, "index": 16}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """One run of the command on two small rows (TSN and StNet video batches), 0 and 1 workers."""
    tmp = tmp_path_factory.mktemp("readers")
    mp = pytest.MonkeyPatch()
    mp.setattr(readers, "CACHE", str(tmp / "cache"))
    mp.setattr(report, "RESULTS", str(tmp / "results"))
    mp.setattr(report, "PERFORMANCE", str(tmp / "performance.md"))
    mp.setattr(report, "cpu_record", lambda info=None: {"cpu": "Test CPU", "cpu_vendor": "GenuineIntel",
                                                       "cpu_family": 6, "cpu_model_id": 143, "cpu_kind": KIND})
    (tmp / "performance.md").write_text(PAGE)
    mp.setattr(sys, "argv", ["tools/benchmark.py", "--readers", "--only", "TSN-R50 frames", "StNet-R50 frames",
                             "--workers", "0", "1", "--scale", "0.1", "--batches", "1", "--seconds", "0", "--docs"])
    try:
        benchmark.main()
    finally:
        mp.undo()
    return tmp


def test_the_command_writes_each_rows_figures(table):
    result = json.loads((table / "results" / KIND / "readers.json").read_text())
    assert result["cpu_kind"] == KIND and [r["row"] for r in result["rows"]] == ["TSN-R50 frames", "StNet-R50 frames"]
    for r in result["rows"]:
        assert set(r["readers"]) == {"workers_0", "workers_1"}
        assert all(v["samples_per_s"] > 0 and v["per_worker"] > 0 for v in r["readers"].values())
        assert set(r["split_s_per_sample"]) >= {"decode", "transforms", "collate", "transfer"}
        assert all(v >= 0 for v in r["split_s_per_sample"].values())
        assert r["accelerator"]["samples_per_s"] > 0 and r["workers_needed"] >= 1
        assert r["bytes_per_batch"] == r["bytes_per_batch_detail"]["arrays"] + r["bytes_per_batch_detail"]["pickled"]
    tsn, stnet = result["rows"]
    # the recipes' crops are 224 whatever the clip's size, uint8 across the boundary (Normalize in the
    # model): TSN 3 segments x RGB, StNet 7 segments x 5 frames x RGB, one byte each
    assert tsn["bytes_per_batch_detail"]["by_key"]["imgs"] == tsn["batch_size_timed"] * 3 * 3 * 224 * 224
    assert stnet["bytes_per_batch_detail"]["by_key"]["imgs"] == stnet["batch_size_timed"] * 7 * 15 * 224 * 224
    assert tsn["accelerator"]["samples_per_s"] == 2000


def test_the_docs_block_is_written_between_its_markers_and_the_others_stay(table):
    text = (table / "performance.md").read_text()
    start = text.index(f"<!-- bench-readers {KIND}: start (tools/benchmark.py --readers --show --docs) -->")
    block = text[start:text.index(f"<!-- bench-readers {KIND}: end -->")]
    assert "| TSN-R50 frames |" in block and "| StNet-R50 frames |" in block and "workers needed" in block
    assert "Test CPU" in block
    before = PAGE[:PAGE.index("\nafter\n")]
    assert text.startswith(before) and text.endswith("\nafter\n")     # the other blocks, byte for byte
    assert text.index("bench-readers amd-zen5: end") < start


def test_show_rewrites_the_block_from_the_json(table, monkeypatch, capsys):
    monkeypatch.setattr(report, "RESULTS", str(table / "results"))
    monkeypatch.setattr(report, "PERFORMANCE", str(table / "performance.md"))
    before = (table / "performance.md").read_text()
    monkeypatch.setattr(sys, "argv", ["tools/benchmark.py", "--readers", "--show", "--docs", "--kind", KIND])
    benchmark.main()
    assert (table / "performance.md").read_text() == before
    assert "| TSN-R50 frames |" in capsys.readouterr().out
