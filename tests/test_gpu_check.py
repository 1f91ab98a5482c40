"""tools/gpu_check.py on this CPU: the rows a CPU can run (fp32, bf16 O1) pass through train, resume,
eval with AMP on and off, export and infer; every fp16, O2 and 2-card cell says "needs a GPU", never
passed; the TensorRT rows say "needs a GPU with TensorRT" (and on a GPU export with --trt and infer
with it); a step that fails is a FAILED cell with its error line and exit code 1."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks import amp_check
from engine.cpu import cpu_info, has_bf16
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ENV, ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))

import gpu_check  # noqa: E402  (tools/gpu_check.py)

CPU_ROWS = ("fp32", "bf16-O1")
GPU_ROWS = ("bf16-O2", "fp16-O1", "fp16-O2")
TRT_ROWS = ("trt-fp32", "trt-fp16")


def _table(stdout):
    """The printed table's rows, (demo, mode, cards) -> [cells], and the table's text."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| demo | mode | cards |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = lines[start:end]
    assert table[0].split("|")[4:-1] == [f" {s} " for s in gpu_check.STEPS]
    rows = {}
    for line in table[2:]:
        demo, mode, cards, *cells = [c.strip() for c in line.strip("|").split("|")]
        rows[(demo, mode.split(":")[0], int(cards))] = (mode, cells)
    return rows, "\n".join(table)


@pytest.mark.isa
def test_gpu_check_runs_what_a_cpu_can_and_marks_the_rest(yt8m_demo, tmp_path):
    out = tmp_path / "gpu_check"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gpu_check.py"), "--configs",
                           ATTENTION_LSTM_DEMO, "--steps", "2", "--output", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    head = proc.stdout.splitlines()[0]
    assert head.startswith("gpu_check: ") and cpu_info()["model"] in head and "CPU, no GPU" in head, head
    assert "paddle 3." in head
    rows, table = _table(proc.stdout)
    demo = "attention_lstm_demo"
    assert set(rows) == {(demo, m, 1) for m in CPU_ROWS + GPU_ROWS + TRT_ROWS} | {(demo, "fp32 + fastest AMP", 2)}
    for mode in CPU_ROWS:
        label, cells = rows[(demo, mode, 1)]
        assert all(c.startswith("ok ") for c in cells), (mode, cells)
        if mode == "bf16-O1" and not has_bf16():   # the trainer computed fp32 and said so
            assert label == "bf16-O1: no native bf16 on this CPU (ran fp32)", label
            assert all(c.endswith("(ran fp32)") for c in cells[:3]), cells   # train, resume, eval as trained
        else:
            assert label == mode and not any("ran fp32" in c for c in cells), (label, cells)
    for key in [(demo, m, 1) for m in GPU_ROWS] + [(demo, "fp32 + fastest AMP", 2)]:
        assert rows[key][1] == [gpu_check.NEEDS_GPU] * len(gpu_check.STEPS), (key, rows[key])
    for mode in TRT_ROWS:
        assert rows[(demo, mode, 1)][1] == ["needs a GPU with TensorRT"] * len(gpu_check.STEPS), rows[(demo, mode, 1)]
    # the JSON says what the table says
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["header"] == head and report["table"] == table
    assert report["device"]["kind"] == "cpu" and report["device"]["gpus"] == 0
    assert len(report["rows"]) == len(rows)
    for r in report["rows"]:
        label, cells = rows[(r["demo"], r["mode"], r["cards"])]
        assert [r["cells"][s]["text"] for s in gpu_check.STEPS] == cells
        want = "ok" if r["mode"] in CPU_ROWS else gpu_check.NEEDS_GPU
        assert {c["status"] for c in r["cells"].values()} == {want}, r
    # what the cells claim is on disk: the resumed run's checkpoint, the export, the predictions
    for mode in CPU_ROWS:
        folder = out / demo / mode
        assert (folder / "checkpoints" / "step_4" / "state.json").is_file()
        assert (folder / "export" / "infer_cfg.yml").is_file() and (folder / "infer" / "predictions.json").is_file()
        assert "resumed from" in (folder / "logs" / "resume.log").read_text()


def test_a_failing_step_is_a_failed_cell_with_its_error_line_and_exit_code_1(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('step 1 loss 2.0'); "
                                 "print('Traceback (most recent call last):\\nValueError: inner', file=sys.stderr); "
                                 "sys.exit('error: ValueError: the last line')"]
    cell = gpu_check.run_step(cmd, str(tmp_path / "x.log"), 60)
    assert cell["status"] == "FAILED" and cell["text"] == "FAILED: error: ValueError: the last line", cell
    assert "step 1 loss" in (tmp_path / "x.log").read_text()
    # through the real tools: a recipe that does not exist fails its train step; the rest do not run
    seen = []
    cells = gpu_check.check_row(os.path.join(ROOT, "configs", "video", "nope_demo.yaml"), "fp32", 1,
                                str(tmp_path / "row"), 300, progress=seen.append)
    assert cells["train"]["text"].startswith("FAILED: error: config file not found: "), cells["train"]
    assert cells["train"]["text"].endswith("nope_demo.yaml")
    assert all(cells[s]["status"] == "not run" for s in gpu_check.STEPS[1:]), cells
    assert len(seen) == len(gpu_check.STEPS) and seen[0].startswith("nope_demo fp32 train: FAILED: error: ")
    row = {"config": "nope_demo.yaml", "demo": "nope_demo", "mode": "fp32", "cards": 1, "note": None, "cells": cells}
    ok_row = dict(row, cells={s: {"status": "ok", "text": "ok 1.0 s", "seconds": 1.0} for s in gpu_check.STEPS})
    gpu_row = dict(row, cells=gpu_check.skipped_row(gpu_check.NEEDS_GPU))
    assert gpu_check.exit_code([ok_row, gpu_row]) == 0
    assert gpu_check.exit_code([ok_row, gpu_row, row]) == 1
    assert "| nope_demo | fp32 | 1 | FAILED: error: config file not found: " in gpu_check.markdown([row])


def test_trt_rows_export_with_trt_and_infer_with_it_where_paddle_has_tensorrt(tmp_path, monkeypatch):
    """The TensorRT rows' commands on a (pretended) GPU with TensorRT: trained in fp32, exported with
    --trt --trt-precision, inferred with --trt; without TensorRT in paddle, or on a CPU, nothing runs."""
    cmds = []

    def fake_step(cmd, log_path, timeout, verify=None, worker_logs=None):
        cmds.append([str(c) for c in cmd])
        if cmd[1].endswith("train.py"):   # the weights the later steps look for
            folder = cmd[cmd.index("--output") + 1]
            os.makedirs(os.path.join(folder, "final"), exist_ok=True)
            open(os.path.join(folder, "final", "model.pdparams"), "w").close()
        return {"status": "ok", "text": "ok 0.0 s", "seconds": 0.0, "output": "wrote x"}
    monkeypatch.setattr(gpu_check, "run_step", fake_step)
    gpu = {"kind": "gpu", "gpus": 1, "bf16": False, "tensorrt": "8.6.1"}
    rows = gpu_check.check_all([ATTENTION_LSTM_DEMO], list(TRT_ROWS), gpu, 1, str(tmp_path), 60, progress=lambda _: None)
    assert [(r["mode"], r["cards"]) for r in rows] == [("trt-fp32", 1), ("trt-fp16", 1), ("fp32 + fastest AMP", 2)]
    assert all(c["status"] == "ok" for r in rows[:2] for c in r["cells"].values())
    by_tool = {}
    for cmd in cmds:
        by_tool.setdefault(os.path.basename(cmd[1]), []).append(cmd)
    assert len(by_tool["export.py"]) == len(by_tool["infer.py"]) == 2
    for precision, export_cmd, infer_cmd in zip(("fp32", "fp16"), by_tool["export.py"], by_tool["infer.py"]):
        assert export_cmd[-3:] == ["--trt", "--trt-precision", precision], export_cmd
        assert infer_cmd[-1] == "--trt", infer_cmd
    assert all("train.amp.enable=false" in cmd for cmd in by_tool["train.py"])
    for dev, text in ((dict(gpu, tensorrt=None), "needs paddle with TensorRT"),
                      ({"kind": "cpu", "gpus": 0, "bf16": False, "tensorrt": None}, "needs a GPU with TensorRT")):
        cmds.clear()
        rows = gpu_check.check_all([ATTENTION_LSTM_DEMO], list(TRT_ROWS), dev, 1, str(tmp_path), 60,
                                   progress=lambda _: None)
        assert not cmds and [r["cells"]["export"]["text"] for r in rows[:2]] == [text, text]


def test_one_table_of_modes_and_the_docs_show_it():
    """MODES is the modes' only table: the CPU rows and the TensorRT rows are its rows (the hand lists
    above, from the module docstring's account of what a CPU runs), --modes offers its names, and
    docs/tools.md holds the table `--docs` writes from it."""
    assert gpu_check.CPU_MODES == CPU_ROWS and tuple(gpu_check.TRT_MODES) == TRT_ROWS
    assert set(gpu_check.MODES) == set(CPU_ROWS + GPU_ROWS + TRT_ROWS)
    assert gpu_check.parser().parse_args(["--modes", "fp16-O2"]).modes == ["fp16-O2"]
    assert gpu_check.amp_overrides("bf16-O2")[-2:] == ["-o", "train.amp.level=O2"]
    # tools/amp_check.py runs the same training modes, from the same table
    assert list(amp_check.MODES) == [m for m, r in gpu_check.MODES.items() if not r.trt]
    assert tuple(amp_check.CPU_MODES) == gpu_check.CPU_MODES
    assert amp_check.MODES["bf16-O2"] == (True, "bfloat16", "O2") and not amp_check.MODES["fp32"][0]
    with open(gpu_check.DOCS_PAGE, encoding="utf-8") as f:
        page = f.read()
    assert gpu_check.docs_page(page) == page, "docs/tools.md is stale: run python tools/gpu_check.py --docs"
    assert "| `trt-fp16` | off | `--trt --trt-precision fp16` | no |" in page
