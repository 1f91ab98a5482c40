"""tools/eval.py --report: the per-class computation of the metrics (metrics/*.py `report()`) on hand-made
cases, the files outputs/report.py writes, and the tool on the demo runs."""
import csv
import json
import os

import numpy as np
import pytest

from engine.components import load_all
from engine.errors import ConfigError
from metrics.classification import Classification
from metrics.glue import GLUEMetric
from metrics.segmentation import MeanIoU
from metrics.youtube8m import YouTube8M
from outputs.report import write_report
from tests.conftest import ATTENTION_LSTM_DEMO, MASK_RCNN_DEMO, TSN_DEMO
from tests.helpers import ROOT, read_metrics, tool

load_all()


class Data:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _one_hot(ids, c):
    return np.eye(c, dtype=np.float32)[ids]


def _classification_case():
    """3 named classes and a 4th nobody has: labels 0 0 1 1 2 2, top-1 predictions 0 1 1 1 0 2."""
    m = Classification(topk=[1])
    m.set_dataset(Data(label_names=["a", "b", "c", "d"], num_classes=4))
    m.update({"logits": _one_hot([0, 1, 1], 4)}, {"label": np.array([0, 0, 1]), "index": np.array([0, 1, 2])})
    m.update({"logits": _one_hot([1, 0, 2], 4)}, {"label": np.array([1, 2, 2]), "index": np.array([3, 4, 5])})
    return m


def test_classification_report_by_hand():
    m = _classification_case()
    assert m.accumulate()["top1"] == pytest.approx(4 / 6)
    r = m.report()
    # rows the label, columns the prediction
    assert r["confusion"]["matrix"] == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    rows = {row["class"]: row for row in r["rows"]}
    # a: 1 right of 2 labelled, 2 predicted; b: 2 of 2, 3 predicted; c: 1 of 2, 1 predicted; d: nothing
    assert [rows[c]["support"] for c in "abcd"] == [2, 2, 2, 0]
    assert [rows[c]["precision"] for c in "abcd"] == pytest.approx([1 / 2, 2 / 3, 1, 0])
    assert [rows[c]["recall"] for c in "abcd"] == pytest.approx([1 / 2, 1, 1 / 2, 0])
    # F1 = 2PR / (P + R): b 2 * (2/3) / (5/3) = 0.8, c 2 * 0.5 / 1.5 = 2/3
    assert [rows[c]["f1"] for c in "abcd"] == pytest.approx([1 / 2, 0.8, 2 / 3, 0])
    assert r["summary"]["samples"] == 6 and r["summary"]["accuracy"] == pytest.approx(4 / 6)


def test_recipe_label_names_when_the_dataset_has_none():
    m = Classification(topk=[1])
    m.set_dataset(Data(num_classes=2))
    m.update({"logits": _one_hot([0, 1], 2)}, {"label": np.array([0, 0]), "index": np.array([0, 1])})
    assert [row["class"] for row in m.report()["rows"]] == ["0", "1"]
    assert [row["class"] for row in m.report(["cat", "dog"])["rows"]] == ["cat", "dog"]


def test_glue_report_by_hand():
    # MNLI, 5 pairs: labels c e n n e, predictions c n n e e (both dev sets together)
    m = GLUEMetric(task="MNLI")
    m.update({"logits": _one_hot([0, 2, 2, 1, 1], 3)},
             {"label": np.array([0, 1, 2, 2, 1]), "index": np.arange(5), "subset": np.array([0, 0, 0, 1, 1])})
    r = m.report()
    assert [row["class"] for row in r["rows"]] == ["contradiction", "entailment", "neutral"]
    assert r["confusion"]["matrix"] == [[1, 0, 0], [0, 1, 1], [0, 1, 1]]
    assert [row["f1"] for row in r["rows"]] == pytest.approx([1, 1 / 2, 1 / 2])
    with pytest.raises(ConfigError, match="STS-B is a regression task"):
        GLUEMetric(task="STS-B").report()


def test_segmentation_iou_by_hand():
    # a 2x3 map, 255 ignored:    label 0 0 1     prediction 0 1 1
    #                                  1 1 255              1 0 0
    m = MeanIoU()
    m.set_dataset(Data(num_classes=3, ignore_index=255, label_names=["bg", "disc", "square"]))
    m.update({"label_map": np.array([[[0, 1, 1], [1, 0, 0]]])},
             {"label": np.array([[[0, 0, 1], [1, 1, 255]]]), "index": np.array([0])})
    r = m.report()
    assert r["confusion"]["matrix"] == [[1, 1, 0], [1, 2, 0], [0, 0, 0]]
    rows = {row["class"]: row for row in r["rows"]}
    assert [rows[c]["pixels"] for c in ("bg", "disc", "square")] == [2, 3, 0]
    # IoU = TP / (label + prediction - TP): bg 1 / (2 + 2 - 1), disc 2 / (3 + 3 - 2); square absent: 1
    assert [rows[c]["iou"] for c in ("bg", "disc", "square")] == pytest.approx([1 / 3, 1 / 2, 1])
    assert [rows[c]["accuracy"] for c in ("bg", "disc", "square")] == pytest.approx([1 / 2, 2 / 3, 0])
    assert r["summary"]["miou"] == pytest.approx((1 / 3 + 1 / 2 + 1) / 3)
    assert r["summary"]["pixel_acc"] == pytest.approx(3 / 5)
    assert m.accumulate()["iou_disc"] == pytest.approx(1 / 2)


def test_youtube8m_per_class_ap_by_hand():
    # top 2 of each video:  v0 0 (0.9, label), 2 (0.5)     labels {0}
    #                       v1 1 (0.8), 2 (0.6, label)     labels {2}
    #                       v2 0 (0.7), 2 (0.3, label)     labels {1, 2}: 1 is outside the top 2
    m = YouTube8M(top_k=2)
    m.set_dataset(Data(num_classes=3))
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.8, 0.6], [0.7, 0.1, 0.3]], np.float32)
    labels = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 1]], np.float32)
    m.update({"probs": scores}, {"labels": labels, "index": np.array([0, 1, 2])})
    r = m.report(["x", "y", "z"])
    rows = {row["class"]: row for row in r["rows"]}
    assert [rows[c]["support"] for c in "xyz"] == [1, 1, 2]
    # x: pool (0.9 label, 0.7) -> 1; y: pool (0.8) and its one label outside -> 0;
    # z: pool (0.6 label, 0.5, 0.3 label) -> (1/1 + 2/3) / 2
    assert [rows[c]["ap"] for c in "xyz"] == pytest.approx([1, 0, 5 / 6])
    # top-1 classes x, y, x; right only for v0
    assert [rows[c]["top1_precision"] for c in "xyz"] == pytest.approx([1 / 2, 0, 0])
    assert [rows[c]["top1_recall"] for c in "xyz"] == pytest.approx([1, 0, 0])
    assert r["summary"]["map"] == pytest.approx((1 + 0 + 5 / 6) / 3)
    assert "confusion" not in r


def test_write_report_files(tmp_path):
    paths = write_report(_classification_case().report(), str(tmp_path), "hand case")
    assert sorted(os.path.basename(p) for p in paths) == sorted(
        ["report.md", "report.json", "confusion.json", "confusion.csv", "confusion.png"])
    cm = json.load(open(tmp_path / "confusion.json"))
    assert cm["classes"] == ["a", "b", "c", "d"] and sum(map(sum, cm["matrix"])) == 6
    rows = list(csv.reader(open(tmp_path / "confusion.csv")))
    assert rows[0][1:] == ["a", "b", "c", "d"] and rows[3] == ["c", "1", "0", "1", "0"]
    md = open(tmp_path / "report.md").read()
    assert "| b | 2 | 0.6667 | 1.0000 | 0.8000 |" in md
    assert open(tmp_path / "confusion.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_eval_report_on_the_tsn_demo(tsn_demo_run, tmp_path):
    proc = tool("eval", "-c", TSN_DEMO, "--weights", tsn_demo_run / "final", "--split", "val", "--report",
                "--output", tmp_path)
    assert "confusion.png" in proc.stdout
    cm = json.load(open(tmp_path / "confusion.json"))
    appearance = os.path.join(ROOT, "data", "kinetics_demo", "kinetics_appearance")
    names = open(os.path.join(appearance, "label_names.txt")).read().split()
    videos = len(open(os.path.join(appearance, "val.list")).read().splitlines())
    assert cm["classes"] == names and videos == 60
    matrix = np.array(cm["matrix"])
    assert matrix.sum() == videos and matrix.sum(1).tolist() == [12] * 5   # 12 val videos per colour
    assert np.trace(matrix) / videos == pytest.approx(read_metrics(tmp_path)["top1"])
    md = open(tmp_path / "report.md").read()
    assert all(f"| {n} | 12 |" in md for n in names)


def test_eval_report_on_the_youtube8m_demo(attention_lstm_run, tmp_path):
    tool("eval", "-c", ATTENTION_LSTM_DEMO, "--weights", attention_lstm_run / "final", "--report", "--output", tmp_path)
    report = json.load(open(tmp_path / "report.json"))
    names = open(os.path.join(ROOT, "data", "youtube8m_demo", "label_names.txt")).read().splitlines()
    assert [r["class"] for r in report["rows"]] == names and len(names) == 8
    assert report["summary"]["videos"] == read_metrics(tmp_path)["num_samples"]
    assert not (tmp_path / "confusion.json").exists()      # multi-label: no confusion matrix
    assert all(0 <= r["ap"] <= 1 and r["support"] > 0 for r in report["rows"])


def test_report_refused_where_the_metric_has_none(coco_demo, tmp_path):
    proc = tool("eval", "-c", MASK_RCNN_DEMO, "--weights", tmp_path / "none.pdparams", "--report",
                "--output", tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --report: metric COCOMetric has no per-class report (classification, YouTube-8M, GLUE "
        "classification and segmentation metrics have one)"]
