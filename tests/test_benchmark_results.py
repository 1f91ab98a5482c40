"""Benchmark results are kept per CPU kind (benchmarks/report.py): one JSON folder and one table per
kind in docs/performance.md, so a run on an Intel machine never overwrites the AMD figures, nor the reverse."""
import json
import os
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))

import benchmark  # noqa: E402  (tools/benchmark.py, the command line)
from benchmarks import peers, report  # noqa: E402
from engine import cpu  # noqa: E402

KINDS = {"amd-zen4": ("AuthenticAMD", "AMD EPYC 9004", 1.97),
         "intel-sapphirerapids": ("GenuineIntel", "Intel Xeon 8480", 0.94)}
AMD, INTEL = KINDS


def _peers_json(kind):
    vendor, model, ratio = KINDS[kind]
    run = {"load_before": 1.5}
    return {"cpu": model, "cpu_vendor": vendor, "cpu_kind": kind, "threads": 2, "paddle": "3.3.1", "torch": "2.13.0",
            "steps": 3, "rounds": 2, "git_commit": "0123456789abcdef", "uptime_end": "1.0 1.0 1.0",
            "rows": [{"name": "BERT-base", "batch": 8, "input": "seq 128", "ours_s_per_step": 1.0,
                      "theirs_s_per_step": ratio, "ratio": ratio, "runs": {"ours": [run], "theirs": [run]}}]}


def _bench_json(kind):
    vendor, model, ratio = KINDS[kind]
    return {"cpu": model, "cpu_vendor": vendor, "cpu_kind": kind, "threads": 2, "paddle": "3.3.1",
            "git_commit": "fedcba9876543210",
            "batch_size": 16, "params": 108737304, "train_samples_per_s": 10 * ratio, "eval_samples_per_s": 9.0,
            "reader": {"workers_0": {"samples_per_s": 1000.0, "share_of_train_step": 0.002}}, "peak_memory_mb": 3119}


PAGE_TEXT = """# title

## Speed

<!-- bench amd-zen4: start (tools/benchmark.py --show --docs) -->
old amd training table
<!-- bench amd-zen4: end -->

text between

<!-- bench-peers amd-zen4: start (benchmarks/peers.py --docs) -->
old amd table
<!-- bench-peers amd-zen4: end -->

after
"""


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Results of both kinds under a temporary benchmarks/results/ and a performance page with AMD blocks only."""
    monkeypatch.setattr(report, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(report, "PERFORMANCE", str(tmp_path / "performance.md"))
    (tmp_path / "performance.md").write_text(PAGE_TEXT)
    for kind in KINDS:
        folder = tmp_path / "results" / kind
        folder.mkdir(parents=True)
        (folder / "peers.json").write_text(json.dumps(_peers_json(kind)))
        (folder / "attentionlstm.json").write_text(json.dumps(_bench_json(kind)))
    return tmp_path


def _block(text, name, kind):
    start = text.index(f"<!-- {name} {kind}: start")
    return text[start:text.index(f"<!-- {name} {kind}: end -->", start)]


@pytest.mark.parametrize("vendor, family, model, kind", [
    ("AuthenticAMD", 25, 17, "amd-zen4"), ("AuthenticAMD", 26, 2, "amd-zen5"), ("AuthenticAMD", 25, 1, "amd-zen3"),
    ("GenuineIntel", 6, 143, "intel-sapphirerapids"), ("GenuineIntel", 6, 207, "intel-emeraldrapids"),
    ("GenuineIntel", 6, 3, "intel-f6m3"), ("HygonGenuine", 24, 0, "hygongenuine-f24m0"),
    ("AuthenticAMD", None, None, "amd")])
def test_the_kind_is_vendor_and_microarchitecture(monkeypatch, vendor, family, model, kind):
    """From /proc/cpuinfo's family and model (AMD's family 19h models 10h-1Fh are Zen 4 (Genoa), family
    1Ah Zen 5; Intel's family 6 model 8Fh Sapphire Rapids): a hypervisor's plain 'AMD EPYC' hides it."""
    monkeypatch.setattr(cpu, "cpu_info", lambda: {"vendor": vendor, "model": "x", "family": family, "model_id": model})
    assert report.cpu_kind() == kind
    assert report.results_dir() == os.path.join(report.RESULTS, kind)


def test_this_machine_has_a_family_and_model():
    info = cpu.cpu_info()
    assert isinstance(info["family"], int) and isinstance(info["model_id"], int), info


def test_two_kinds_render_two_peer_tables_and_each_write_keeps_the_other(results):
    page = results / "performance.md"
    amd, intel = (json.loads((results / "results" / k / "peers.json").read_text()) for k in (AMD, INTEL))
    peers.write_page(intel, str(page))                 # no Intel block yet: added after the AMD one
    text = page.read_text()
    assert "old amd table" in _block(text, "bench-peers", AMD)
    peers.write_page(amd, str(page))
    text = page.read_text()
    amd_block, intel_block = _block(text, "bench-peers", AMD), _block(text, "bench-peers", INTEL)
    assert "AMD EPYC 9004 (amd-zen4, AuthenticAMD)" in amd_block and "**1.97**" in amd_block and "Intel" not in amd_block
    assert "Intel Xeon 8480 (intel-sapphirerapids, GenuineIntel)" in intel_block and "**0.94**" in intel_block and "AMD" not in intel_block
    assert text.index(f"bench-peers {AMD}: end") < text.index(f"bench-peers {INTEL}: start") < text.index("\nafter\n")
    assert "old amd training table" in text                # another table's block is untouched
    peers.write_page(intel, str(page))                 # rewriting one kind leaves the other byte for byte
    assert _block(page.read_text(), "bench-peers", AMD) == amd_block
    assert page.read_text().count(f"<!-- bench-peers {INTEL}: start") == 1


@pytest.mark.parametrize("flag", ["--docs", "--readme"])   # --readme: the flag's old name, kept
def test_benchmark_show_reads_and_writes_one_kind(results, monkeypatch, capsys, flag):
    for kind in (INTEL, AMD):
        monkeypatch.setattr(sys, "argv", ["tools/benchmark.py", "--show", flag, "--kind", kind])
        benchmark.main()
    text = (results / "performance.md").read_text()
    amd_block, intel_block = _block(text, "bench", AMD), _block(text, "bench", INTEL)
    assert "| AttentionLSTM | 16 |" in amd_block and "| 19.70 |" in amd_block and "Intel" not in amd_block
    assert "| AttentionLSTM | 16 |" in intel_block and "| 9.40 |" in intel_block and "AMD" not in intel_block
    assert "old amd table" in _block(text, "bench-peers", AMD)


def test_a_page_without_the_tables_markers_is_one_error_line(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text("# nothing here\n")
    with pytest.raises(SystemExit, match=r"^error: .*performance.md: no '<!-- bench-peers KIND: start -->' block"):
        report.write_page("bench-peers", "intel", ["a table"], "benchmarks/peers.py --docs", str(page))


def test_the_tables_live_in_the_performance_page_and_readme_is_an_alias():
    """docs/performance.md holds every table's blocks (the README links there); `--readme` still parses."""
    assert report.PERFORMANCE == os.path.join(ROOT, "docs", "performance.md")
    with open(report.PERFORMANCE, encoding="utf-8") as f:
        text = f.read()
    for name in ("bench", "bench-inference", "bench-peers", "bench-peers-bf16", "bench-amp", "bench-serve"):
        assert f"<!-- {name} " in text, name
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "<!-- bench" not in f.read()
    assert benchmark._parser().parse_args(["--show", "--readme"]).docs
    assert benchmark._parser().parse_args(["--show", "--docs"]).docs


def _latency_json(config, model, p50s):
    """A latency record (benchmarks/recipes.py bench_inference) with the given p50 per (batch, backend)."""
    return {"cpu": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_kind": AMD, "threads": 2, "paddle": "3.3.1",
            "git_commit": "0123456789", "config": config, "model": model,
            "rows": [{"batch": bs, "backend": b, "p50_ms": v, "p90_ms": v + 1, "samples_per_s": bs / v * 1000}
                     for (bs, b), v in p50s.items()]}


def test_the_latency_table_names_the_fastest_route(results, monkeypatch, capsys):
    """Per precision the lowest p50 among deployable routes (not the dynamic model), against the
    runner-up: 100 / 80 = 1.25x, 300 / 250 = 1.20x, 40 / 50 = 0.8 so ONNX Runtime INT8 wins at batch 4."""
    from benchmarks import tables
    p50s = {(1, "dynamic"): 10.0, (1, "exported, oneDNN"): 100.0, (1, "exported, ONNX Runtime"): 120.0,
            (1, "exported, OpenVINO"): 80.0, (4, "exported, oneDNN"): 300.0, (4, "exported, OpenVINO"): 250.0,
            (1, "ONNX Runtime INT8"): 40.0, (1, "OpenVINO INT8"): 30.0,
            (4, "ONNX Runtime INT8"): 40.0, (4, "OpenVINO INT8"): 50.0}
    folder = results / "results" / AMD / "inference"
    folder.mkdir()
    (folder / "tsn-r50.json").write_text(json.dumps(_latency_json("configs/video/tsn/tsn_r50_100e_k400.yaml", "TSN", p50s)))
    text = tables.fastest(json.loads((folder / "tsn-r50.json").read_text()))
    assert text["fp32"] == "OpenVINO 1.25x Paddle Inference oneDNN (batch 1), 1.20x Paddle Inference oneDNN (batch 4)"
    assert text["int8"] == "batch 1: OpenVINO INT8 1.33x ONNX Runtime INT8, batch 4: ONNX Runtime INT8 1.25x OpenVINO INT8"
    assert "bf16" not in text
    monkeypatch.setattr(sys, "argv", ["tools/benchmark.py", "--show", "--backend", "inference", "--kind", AMD])
    benchmark.main()
    out = capsys.readouterr().out
    assert "Latency, fp32, p50 / p90 ms:" in out and "| ONNX Runtime | OpenVINO |" in out and "bf16" not in out
    assert "- TSN-R50 fp32: OpenVINO 1.25x" in out


def test_the_latency_table_times_int8_whose_check_refused_random_weights(monkeypatch, capsys):
    """The latency table quantizes a random-weight export; where ONNX Runtime's simulation check refuses
    it (near-zero outputs, e.g. a random BERT's logits), the INT8 program is still made and timed, the
    check's line printed as a note and kept in the JSON record; a passing check changes nothing."""
    from benchmarks import recipes   # imports paddle: this test only
    from engine.errors import ConfigError
    calls, refuse = [], [True]

    def quantize(src, dst, feeds, threads=None, check_feeds=2):
        calls.append(check_feeds)
        if check_feeds and refuse[0]:
            raise ConfigError("x/int8/model.onnx: ONNX Runtime's INT8 kernels give y 0.259 away")
        return {"route": "onnxruntime-qdq", "simulation_gap": {}}
    monkeypatch.setattr(recipes.quantize, "quantize", quantize)
    q = recipes._quantized_for_timing("onnx", "int8", {}, 2)
    assert calls == [2, 0] and q["simulation_check_failed"].endswith("0.259 away"), (calls, q)
    assert capsys.readouterr().err.startswith("note: x/int8/model.onnx: ONNX Runtime's INT8 kernels")
    calls[:], refuse[0] = [], False
    assert recipes._quantized_for_timing("onnx", "int8", {}, 2) == {"route": "onnxruntime-qdq", "simulation_gap": {}}
    assert calls == [2]


def test_the_summary_and_its_charts_are_what_the_committed_json_gives():
    """docs/performance.md opens with benchmarks/summary.py's block and docs/images/perf-*.svg: a new
    peers/memory JSON without `python benchmarks/summary.py --docs` fails here."""
    from benchmarks import summary
    assert summary.stale() == [], "run python benchmarks/summary.py --docs"
    with open(report.PERFORMANCE, encoding="utf-8") as f:
        head = f.read().split("\n## ", 1)[0]
    assert "<!-- summary all-kinds: start" in head and "images/perf-amd-zen4-speed.svg" in head


def test_a_summary_chart_draws_the_json_and_goes_stale_with_it(results, monkeypatch):
    """Bars in proportion to the values on an axis from 0 (ratios 1.0 and 2.0: axis 0-2 in steps of
    0.5, so over the 196 px of the plot (340 - 104 - 40) the bars are 98 and 196 px and the dashed
    line at 1.0 sits at 104 + 98); a changed ratio in the JSON makes the chart and the page stale."""
    from benchmarks import summary
    svg = summary.svg_bars("t", ["A", "B"], {"fp32": {"A": 1.0, "B": 2.0}}, lambda v: f"{v:.2f}", reference=1.0)
    assert 'width="98.0"' in svg and 'width="196.0"' in svg and '<line x1="202.0"' in svg
    assert [f">{t}</text>" in svg for t in ("0", "0.5", "1", "1.5", "2")] == [True] * 5
    images = results / "images"
    images.mkdir()
    monkeypatch.setattr(summary, "IMAGES", str(images))
    page = results / "performance.md"
    page.write_text("# t\n\n<!-- summary all-kinds: start (x) -->\nold\n<!-- summary all-kinds: end -->\n" + PAGE_TEXT)
    summary.write()
    assert sorted(p.name for p in images.iterdir()) == [f"perf-{AMD}-speed.svg", f"perf-{INTEL}-speed.svg"]
    assert summary.stale() == []
    text = page.read_text()
    assert f'=== "{AMD}"' in text and "ours / PyTorch fp32 **1.97** (1 model)" in text and "old\n" not in text
    peers_json = results / "results" / INTEL / "peers.json"
    peers_json.write_text(peers_json.read_text().replace('"ratio": 0.94', '"ratio": 0.5'))
    assert summary.stale() == [str(images / f"perf-{INTEL}-speed.svg"), str(page)]
