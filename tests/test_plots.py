"""Pictures: the trainer's scalars.jsonl, tools/plot.py's curves, the segmentation overlay's legend and the
detection picture's name tags."""
import importlib.util
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from engine.components import load_all
from engine.registry import OUTPUTS
from outputs.palettes import voc_palette
from tests.helpers import ROOT, read_metrics

load_all()


def _plot_module():
    spec = importlib.util.spec_from_file_location("plot_tool", os.path.join(ROOT, "tools", "plot.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plot(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _lines(run):
    return [json.loads(line) for line in open(os.path.join(run, "scalars.jsonl"))]


def test_scalars_jsonl_of_the_attention_lstm_demo(attention_lstm_run):
    rows = _lines(attention_lstm_run)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    # 800 videos / batch 32 = 25 steps an epoch, 6 epochs; a line every 10 batches and at each epoch's end
    assert [r["step"] for r in train] == [25 * e + s for e in range(6) for s in (10, 20, 25)]
    assert [r["epoch"] for r in train] == [e + 1 for e in range(6) for _ in range(3)]
    assert all({"loss", "lr", "samples_per_s", "batch"} <= set(r) for r in train)
    # Piecewise after epoch 5 (the recipe's lr.boundaries): a line has the lr its last step used, so the
    # lines of epochs 1-5 (steps up to 125) have 2e-3 and epoch 6's 2e-4
    assert [r["lr"] for r in train] == pytest.approx([2e-3] * 15 + [2e-4] * 3)
    # evaluation after every epoch; the last one is the run's metrics.json
    assert [(r["step"], r["epoch"]) for r in evals] == [(25 * e, e) for e in range(1, 7)]
    assert evals[-1]["gap"] == pytest.approx(read_metrics(attention_lstm_run)["gap"])


def test_plot_draws_the_jsonl_values(attention_lstm_run, tmp_path):
    rows = _lines(attention_lstm_run)
    paths, drawn = _plot_module().plot([str(attention_lstm_run)], ["loss", "lr", "gap"], str(tmp_path / "c.png"))
    assert paths == [str(tmp_path / "c.png"), str(tmp_path / "c.svg")]
    label = os.path.basename(attention_lstm_run)
    for key, kind in (("loss", "train"), ("lr", "train"), ("gap", "eval")):
        steps, values = drawn[key][label]
        assert steps == [r["step"] for r in rows if r["kind"] == kind]
        assert values == [r[key] for r in rows if r["kind"] == kind]


def test_plot_cli_writes_png_and_svg_for_several_runs(tmp_path):
    for name, losses in (("run_a", [3.0, 2.0]), ("run_b", [4.0, 1.0])):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "scalars.jsonl", "w") as f:
            for step, loss in zip((10, 20), losses):
                f.write(json.dumps({"kind": "train", "step": step, "epoch": 1, "loss": loss, "lr": 0.1}) + "\n")
            f.write(json.dumps({"kind": "eval", "step": 20, "epoch": 1, "top1": 0.5, "loss": 9.0}) + "\n")
    proc = _plot(tmp_path / "run_a", tmp_path / "run_b", "--output", tmp_path / "out" / "both.png")
    assert proc.returncode == 0, proc.stderr
    png, svg = tmp_path / "out" / "both.png", tmp_path / "out" / "both.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]
    assert svg.read_text().count("run_a") >= 1 and svg.read_text().count("run_b") >= 1   # the legend
    # an evaluation metric named like a training value is eval/<name>
    _, drawn = _plot_module().plot([str(tmp_path / "run_a")], ["loss", "eval/loss", "top1"], str(tmp_path / "x.png"))
    assert drawn["loss"]["run_a"] == ([10, 20], [3.0, 2.0]) and drawn["eval/loss"]["run_a"] == ([20], [9.0])


def test_plot_a_resumed_run_keeps_the_later_line_of_a_step(tmp_path):
    # killed after step 30, resumed from the step-20 checkpoint: steps 30 and 40 logged again / anew
    lines = [(10, 5.0), (20, 4.0), (30, 3.5), (30, 3.0), (40, 2.5)]
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "scalars.jsonl", "w") as f:
        for step, loss in lines:
            f.write(json.dumps({"kind": "train", "step": step, "epoch": 1, "loss": loss}) + "\n")
        f.write('{"kind": "train", "step": 50, "lo')                         # cut by a kill
    _, drawn = _plot_module().plot([str(tmp_path / "run")], ["loss"], str(tmp_path / "c.png"))
    assert drawn["loss"]["run"] == ([10, 20, 30, 40], [5.0, 4.0, 3.0, 2.5])


def test_plot_errors_are_one_line(tmp_path):
    proc = _plot(tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {tmp_path}: no scalars.jsonl (is it a run " \
                                                           f"folder of tools/train.py, from a version that writes it?)"
    with open(tmp_path / "scalars.jsonl", "w") as f:
        f.write(json.dumps({"kind": "train", "step": 1, "epoch": 1, "loss": 1.0, "lr": 0.1}) + "\n")
        f.write(json.dumps({"kind": "eval", "step": 1, "epoch": 1, "miou": 0.5}) + "\n")
    proc = _plot(tmp_path, "--keys", "loss", "top1")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown key top1; the runs have: loss, lr, miou"


def test_overlay_legend_shows_the_classes_present(tmp_path):
    cv2.imwrite(str(tmp_path / "im.png"), np.full((60, 80, 3), 255, np.uint8))
    label = np.zeros((60, 80), np.int64)
    label[10:30, 10:40] = 2                                   # classes 0 and 2 present, 1 not
    w = OUTPUTS.build({"name": "LabelMap", "alpha": 0.5})
    w.open(str(tmp_path / "out"), None, ["background", "disc", "square"])
    w.write({"label_map": label[None]}, {"index": np.array([0]), "id": ["im.png"],
                                         "image_path": [str(tmp_path / "im.png")]})
    over = cv2.imread(str(tmp_path / "out" / "im_overlay.png"))[:, :, ::-1]
    assert over.shape[0] > 60 and over.shape[1] >= 80
    assert over[20, 20].tolist() == [(255 + 0) // 2, (255 + 128) // 2, (255 + 0) // 2]   # the blend is above
    strip = over[60:].reshape(-1, 3)
    colours = {tuple(c) for c in strip.tolist()}
    pal = voc_palette()
    assert tuple(pal[0]) in colours and tuple(pal[2]) in colours   # swatches: black background, green square
    assert tuple(pal[1]) not in colours                             # disc is absent
    assert (strip == pal[2]).all(axis=1).sum() >= 100               # a swatch, not a stray pixel
    plain = OUTPUTS.build({"name": "LabelMap", "legend": False})
    plain.open(str(tmp_path / "plain"), None, ["background", "disc", "square"])
    plain.write({"label_map": label[None]}, {"index": np.array([0]), "id": ["im.png"],
                                             "image_path": [str(tmp_path / "im.png")]})
    assert cv2.imread(str(tmp_path / "plain" / "im_overlay.png")).shape == (60, 80, 3)


def test_detection_picture_tags_each_box(tmp_path):
    cv2.imwrite(str(tmp_path / "im.png"), np.full((100, 120, 3), 255, np.uint8))
    preds = {"boxes": [np.array([[20, 50, 70, 90]], np.float32)], "scores": [np.array([0.87], np.float32)],
             "labels": [np.array([1])]}
    w = OUTPUTS.build({"name": "Detections", "draw_threshold": 0.5})
    w.open(str(tmp_path / "out"), None, ["disc", "square"])
    w.write(preds, {"index": np.array([0]), "id": ["im.png"], "image_path": [str(tmp_path / "im.png")]})
    drawn = cv2.imread(str(tmp_path / "out" / "im_det.png"))[:, :, ::-1]
    green = voc_palette()[2]                                  # the colour of class 1 (the palette from 1 on)
    tag = (drawn[35:49, 20:70] == green).all(axis=2)          # above the box: the filled tag
    assert tag.mean() > 0.5 and (drawn[35:49, 20:70] == 255).all(axis=2).any()   # with white text
    assert (drawn[55:85, 30:60] == 255).all()                # inside the box: untouched
