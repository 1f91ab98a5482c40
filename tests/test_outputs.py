"""Inference output per task: each writer takes numpy predictions and the batch metadata (as the
exported-model predictor will give them) and writes what a user of that task expects."""
import json

import cv2
import numpy as np
import pytest
from PIL import Image

from engine.components import load_all
from engine.errors import ConfigError
from engine.registry import OUTPUTS
from outputs.detection import rle_encode
from outputs.palettes import voc_palette

load_all()


class Named:
    label_names = None


def _writer(cfg, tmp_path, names=None):
    w = OUTPUTS.build(cfg)
    w.open(str(tmp_path), Named(), names)
    return w


def test_topk_names_labels(tmp_path):
    w = _writer({"name": "TopK", "top_k": 2}, tmp_path, ["cat", "dog", "cow"])
    lines = w.write({"logits": np.array([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0]], np.float32)},
                    {"index": np.array([0, 1]), "id": ["a.mp4", "b.mp4"]})
    assert lines[0].startswith("a.mp4: dog 0.665")           # softmax([0, 2, 1])[1] = e^2 / (1 + e^2 + e)
    (path,) = w.close()
    got = json.load(open(path))
    assert [t["label"] for t in got[1]["top_k"]] == ["cat", "dog"]   # a tie goes to the lower id
    assert got[1]["top_k"][0]["score"] == pytest.approx(np.exp(3) / (2 * np.exp(3) + 1))


def test_youtube8m_writer_adds_the_kaggle_csv(tmp_path):
    w = _writer({"name": "YouTube8MTopK", "top_k": 1, "csv_top_k": 2}, tmp_path)
    w.write({"probs": np.array([[0.1, 0.7, 0.2]], np.float32)}, {"index": np.array([0]), "id": ["vid0"]})
    paths = w.close()
    assert open(paths[1]).read().splitlines() == ["VideoId,LabelConfidencePairs", "vid0,1 0.700000 2 0.200000"]


def test_label_map_png_and_overlay(tmp_path):
    img = np.zeros((4, 6, 3), np.uint8)
    img[:, :, 2] = 200                                         # BGR on disk: red 200
    cv2.imwrite(str(tmp_path / "street.png"), img)
    label = np.zeros((2, 3), np.int64)
    label[1, 2] = 1                                            # half-size map: resized (nearest) to 4x6
    w = _writer({"name": "LabelMap", "alpha": 0.5}, tmp_path / "out", ["road", "car"])
    lines = w.write({"label_map": label[None]}, {"index": np.array([0]), "id": ["street.png"],
                                                 "image_path": [str(tmp_path / "street.png")]})
    assert lines == [f"street.png: {tmp_path / 'out' / 'street.png'} (road, car)"]
    png = Image.open(tmp_path / "out" / "street.png")
    assert png.mode == "P"
    ids = np.asarray(png)
    assert ids.shape == (4, 6) and ids[2:, 4:].tolist() == [[1, 1], [1, 1]] and ids[:2].sum() == 0
    assert png.getpalette()[3:6] == [128, 0, 0]                # VOC colour of class 1
    over = cv2.imread(str(tmp_path / "out" / "street_overlay.png"))[:, :, ::-1]
    assert over[3, 5].tolist() == [(200 + 128) // 2, 0, 0]     # 0.5 * red 200 + 0.5 * (128, 0, 0)
    assert over[0, 0].tolist() == [100, 0, 0]                  # class 0 is black: the image darkened


def test_voc_palette_known_colours():
    p = voc_palette()
    assert p[:4].tolist() == [[0, 0, 0], [128, 0, 0], [0, 128, 0], [128, 128, 0]]
    assert p[15].tolist() == [192, 128, 128]                   # VOC "person"


def test_rle_is_column_major_and_starts_with_zeros():
    m = np.array([[0, 1], [1, 1]], bool)                       # column-major: 0, 1, 1, 1
    assert rle_encode(m) == {"size": [2, 2], "counts": [1, 3]}
    assert rle_encode(np.ones((1, 2), bool))["counts"] == [0, 2]


def test_detections_json_and_drawing(tmp_path):
    cv2.imwrite(str(tmp_path / "im.jpg"), np.full((40, 50, 3), 255, np.uint8))
    mask = np.zeros((2, 40, 50), np.uint8)
    mask[0, 5:10, 5:20] = 1
    preds = {"boxes": [np.array([[5, 5, 20, 10], [30, 30, 40, 35]], np.float32)],
             "scores": [np.array([0.9, 0.2], np.float32)], "labels": [np.array([1, 0])], "masks": [mask]}
    w = _writer({"name": "Detections", "draw_threshold": 0.5}, tmp_path / "out", ["person", "car"])
    (line,) = w.write(preds, {"index": np.array([0]), "id": [str(tmp_path / "im.jpg")], "image_id": [42]})
    assert "1 detections >= 0.5 (2 in all)" in line
    paths = w.close()
    dets = json.load(open(paths[0]))
    assert dets[0]["bbox"] == [5.0, 5.0, 15.0, 5.0] and dets[0]["image_id"] == 42
    assert dets[0]["label"] == "car" and dets[1]["label"] == "person" and dets[1]["score"] == pytest.approx(0.2)
    assert sum(dets[0]["segmentation"]["counts"][1::2]) == 5 * 15     # mask pixels in the RLE
    drawn = cv2.imread(paths[1])
    assert drawn.shape == (40, 50, 3) and (drawn != 255).any()
    assert (drawn[30:36, 30:41] == 255).all()                 # the 0.2 detection is not drawn
    with pytest.raises(ConfigError, match="lack 'scores'"):
        w.write({"boxes": preds["boxes"]}, {"index": np.array([0]), "id": ["x"]})


def test_text_in_input_order(tmp_path):
    w = _writer({"name": "Text"}, tmp_path)
    w.write({"text": ["zwei", "null"]}, {"index": np.array([2, 0]), "id": ["2", "0"]})
    w.write({"text": ["eins\nx"]}, {"index": np.array([1]), "id": ["1"]})
    (path,) = w.close()
    assert open(path, encoding="utf-8").read() == "null\neins x\nzwei\n"
