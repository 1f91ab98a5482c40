"""The DeepLabV3 demo through the tools, as a user runs them: train (once, shared), eval, infer."""
import os
import shutil

import numpy as np
from PIL import Image

from tests.conftest import DEEPLAB_DEMO
from tests.helpers import read_metrics, tool

CLASSES = ["background", "disc", "square", "triangle", "cross"]


def test_demo_learns_the_shapes(deeplab_demo_run):
    m = read_metrics(deeplab_demo_run)
    # predicting background everywhere: IoU_bg = its pixel share, 0 for the shapes
    assert m["miou_all_background"] < 0.25, m
    assert m["miou"] >= 0.5, m
    assert m["num_samples"] == 48 and m["num_skipped"] == 0
    assert {f"iou_{c}" for c in CLASSES} <= set(m) and m["pixel_acc"] > m["miou"]
    assert os.path.isfile(os.path.join(deeplab_demo_run, "final", "model.pdparams"))


def test_eval_tool_reproduces_training_metrics(deeplab_demo_run, tmp_path):
    proc = tool("eval", "-c", DEEPLAB_DEMO, "--weights", os.path.join(deeplab_demo_run, "final"),
                "--output", tmp_path)
    got, trained = read_metrics(tmp_path), read_metrics(deeplab_demo_run)
    for k in ("miou", "pixel_acc", "iou_cross", "num_samples"):
        assert abs(got[k] - trained[k]) < 1e-9, k
    assert "miou=" in proc.stdout


def test_infer_writes_label_pngs_and_overlays(deeplab_demo_run, voc_demo, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("val_0000.jpg", "val_0001.jpg"):
        shutil.copy(os.path.join(voc_demo, "VOC2012", "JPEGImages", name), images / name)
    out = tmp_path / "out"
    proc = tool("infer", "-c", DEEPLAB_DEMO, "--weights", os.path.join(deeplab_demo_run, "final"),
                "--input", images, "--output", out)
    for name in ("val_0000", "val_0001"):
        png = Image.open(out / f"{name}.png")
        size = Image.open(images / f"{name}.jpg").size
        assert png.mode == "P" and png.size == size
        assert set(np.unique(np.asarray(png))) <= set(range(len(CLASSES)))
        over = Image.open(out / f"{name}_overlay.png").size   # the image above its legend strip
        assert over[0] >= size[0] and over[1] > size[1]
    assert "background" in proc.stdout
