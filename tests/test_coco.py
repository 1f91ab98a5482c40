"""COCO reader, detection transforms and the COCO metric, on small annotation files written here."""
import json
import logging
import os
import subprocess
import sys
import textwrap

import cv2
import numpy as np
import pytest

from engine.components import load_all
from engine.errors import ConfigError, SampleError
from engine.data import Skipped
from engine.registry import METRICS, OUTPUTS, TRANSFORMS
from engine.training.samplers import EpochBatchSampler
from metrics.detection import coco_results, evaluate_results
from models.vision.mask_rcnn.roi_heads import polygons_to_mask
from readers.coco import COCODataset
from readers.detection_transforms import keep_ratio_size
from tests.helpers import ROOT, assert_one_line_error, tool

load_all()


def rle(mask):
    """COCO uncompressed RLE, written by hand: column-major runs starting with zeros."""
    flat = np.asarray(mask, bool).ravel(order="F")
    counts, current, run = [], False, 0
    for v in flat:
        if v != current:
            counts.append(run)
            current, run = v, 0
        run += 1
    counts.append(run)
    return {"size": list(mask.shape), "counts": counts}


def disc(h, w, cx, cy, r):
    yy, xx = np.mgrid[0:h, 0:w]
    return ((xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= r * r).astype(np.uint8)


def write_coco(folder):
    """Category ids 5 (ball) and 9 (box): not contiguous. Image 1: a polygon square (id 9), an RLE
    disc (id 5), a crowd region (RLE, id 5), a degenerate box, an empty polygon; image 2: nothing;
    image 3: only a crowd region; image 4 is missing on disk; image 5 is not an image."""
    os.makedirs(folder, exist_ok=True)
    h, w = 40, 60
    for name in ("a.png", "b.png", "c.png"):
        cv2.imwrite(os.path.join(folder, name), np.full((h, w, 3), 90, np.uint8))
    with open(os.path.join(folder, "broken.png"), "w") as f:
        f.write("not a png")
    ball = disc(h, w, 40, 20, 8)
    crowd = np.zeros((h, w), np.uint8)
    crowd[30:38, 2:12] = 1
    anns = [
        {"id": 11, "image_id": 1, "category_id": 9, "bbox": [5, 5, 20, 15], "area": 300, "iscrowd": 0,
         "segmentation": [[5, 5, 25, 5, 25, 20, 5, 20]]},
        {"id": 12, "image_id": 1, "category_id": 5, "bbox": [32, 12, 16, 16], "area": float(ball.sum()),
         "iscrowd": 0, "segmentation": rle(ball)},
        {"id": 13, "image_id": 1, "category_id": 5, "bbox": [2, 30, 10, 8], "area": 80, "iscrowd": 1,
         "segmentation": rle(crowd)},
        {"id": 14, "image_id": 1, "category_id": 9, "bbox": [10, 10, 0, 5], "area": 0, "iscrowd": 0,
         "segmentation": [[10, 10, 10, 15, 10, 12]]},
        {"id": 15, "image_id": 1, "category_id": 9, "bbox": [30, 30, 5, 5], "area": 25, "iscrowd": 0,
         "segmentation": []},
        {"id": 16, "image_id": 3, "category_id": 5, "bbox": [2, 30, 10, 8], "area": 80, "iscrowd": 1,
         "segmentation": rle(crowd)},
    ]
    images = [{"id": 1, "file_name": "a.png", "height": h, "width": w},
              {"id": 2, "file_name": "b.png", "height": h, "width": w},
              {"id": 3, "file_name": "c.png", "height": h, "width": w},
              {"id": 4, "file_name": "missing.png", "height": h, "width": w},
              {"id": 5, "file_name": "broken.png", "height": 50, "width": 40}]
    cats = [{"id": 9, "name": "box"}, {"id": 5, "name": "ball"}]
    path = os.path.join(folder, "instances.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": anns, "categories": cats}, f)
    return path, {"ball": ball, "crowd": crowd}


@pytest.fixture
def coco(tmp_path):
    return write_coco(str(tmp_path / "coco"))


# -------------------------------------------------------------------------------------- reader
def test_reader_maps_categories_and_reads_every_format(coco, caplog):
    path, masks = coco
    with caplog.at_level(logging.WARNING, logger="zoo"):
        ds = COCODataset(path)
    assert ds.cat_ids == [5, 9] and ds.label_names == ["ball", "box"] and ds.num_classes == 2
    assert ds.dropped == {"degenerate box": 1, "empty polygon": 1}
    warned = [r.getMessage() for r in caplog.records]
    assert any("1 annotation with a degenerate box, 1 annotation with a empty polygon" in m for m in warned)
    assert len(ds) == 5 and ds.image_ids() == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(ds.aspect_ratios(), [1.5, 1.5, 1.5, 1.5, 0.8])
    s = ds[0]
    np.testing.assert_allclose(s["gt_boxes"], [[5, 5, 25, 20], [32, 12, 48, 28], [2, 30, 12, 38]])
    assert s["gt_classes"].tolist() == [1, 0, 0] and s["gt_crowd"].tolist() == [0, 0, 1]
    assert s["image"].shape == (40, 60, 3) and s["image_id"] == 1 and s["orig_size"].tolist() == [40, 60]
    np.testing.assert_allclose(s["gt_polygons"][0][0], [[5, 5], [25, 5], [25, 20], [5, 20]])
    assert s["gt_polygons"][2] == []                                # crowd: no polygon needed
    # the RLE disc became a polygon that rasterises back to (nearly) the same pixels
    back = polygons_to_mask(s["gt_polygons"][1], 40, 60).astype(bool)
    ball = masks["ball"].astype(bool)
    assert (back & ball).sum() / (back | ball).sum() > 0.85
    empty = ds[1]
    assert empty["gt_boxes"].shape == (0, 4) and empty["gt_classes"].shape == (0,)


def test_reader_missing_and_corrupt_images(coco):
    path, _ = coco
    ds = COCODataset(path)
    with pytest.raises(SampleError, match="image not found: .*missing.png \\(image id 4 of"):
        ds[3]
    with pytest.raises(SampleError, match="cannot decode image .*broken.png"):
        ds[4]
    lenient = COCODataset(path, skip_bad=True)
    assert isinstance(lenient[3], Skipped) and isinstance(lenient[4], Skipped)


def test_skip_empty_keeps_images_with_a_trainable_instance(coco):
    path, _ = coco
    assert COCODataset(path, skip_empty=True).image_ids() == [1]   # 2: nothing, 3: only crowd, 4/5: none


def test_bad_annotation_files_fail_in_one_line(tmp_path, coco):
    path, _ = coco
    data = json.load(open(path))
    data["annotations"][0]["category_id"] = 7
    bad = tmp_path / "bad_cat.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="annotation 11 has category_id 7, which is not in 'categories'"):
        COCODataset(str(bad))
    data["annotations"][0].update(category_id=9, image_id=99)
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="annotation 11 refers to image_id 99"):
        COCODataset(str(bad))
    (tmp_path / "trunc.json").write_text('{"images": [')
    proc = tool("train", "-c", "configs/vision/mask_rcnn/mask_rcnn_demo.yaml", "--output", tmp_path / "out",
                "-o", f"reader.train.ann_file={tmp_path / 'trunc.json'}", check=False)
    assert_one_line_error(proc, "trunc.json: not a valid JSON file")


# ---------------------------------------------------------------------------------- transforms
def test_resize_short_records_the_scale_and_moves_boxes_and_polygons(coco):
    path, _ = coco
    ds = COCODataset(path, transforms=[{"name": "ResizeShort", "short_sizes": [20], "max_size": 1000}])
    s = ds[0]
    assert s["image"].shape == (20, 30, 3)
    np.testing.assert_allclose(s["scale_factor"], [0.5, 0.5])
    np.testing.assert_allclose(s["gt_boxes"][0], [2.5, 2.5, 12.5, 10])
    np.testing.assert_allclose(s["gt_polygons"][0][0], [[2.5, 2.5], [12.5, 2.5], [12.5, 10], [2.5, 10]])
    capped = TRANSFORMS.build({"name": "ResizeShort", "short_sizes": [800], "max_size": 90})(COCODataset(path)[0])
    assert capped["image"].shape == (60, 90, 3)                     # long side 60 -> 90 caps at 1.5
    np.testing.assert_allclose(capped["scale_factor"], [1.5, 1.5])
    # PaddleDetection's rounding: int(scale * side + 0.5), the factor is the real ratio
    assert keep_ratio_size(427, 640, 800, 1333) == (800, 1199)
    with pytest.raises(ConfigError, match="interp must be one of"):
        TRANSFORMS.build({"name": "ResizeShort", "interp": "bicubic"})


def test_random_sizes_and_flip_follow_the_sample_rng(coco):
    path, _ = coco
    tf = [{"name": "ResizeShort", "short_sizes": [20, 40, 80], "max_size": 1000}, {"name": "RandomFlip", "p": 0.5}]
    a, b = COCODataset(path, transforms=tf, seed=3), COCODataset(path, transforms=tf, seed=3)
    sizes = set()
    for epoch in range(6):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        sa, sb = a[0], b[0]
        np.testing.assert_array_equal(sa["gt_boxes"], sb["gt_boxes"])
        sizes.add(sa["image"].shape[0])
        poly = sa["gt_polygons"][0][0]                              # still the box of the square
        np.testing.assert_allclose([poly[:, 0].min(), poly[:, 1].min(), poly[:, 0].max(), poly[:, 1].max()],
                                   sa["gt_boxes"][0], atol=1e-4)
    assert len(sizes) > 1


# -------------------------------------------------------------------------------------- metric
def perfect_predictions(ds, index):
    """The ground truth itself as predictions (score 1), masks from the JSON through pycocotools."""
    image_id = ds.image_ids()[index]
    anns = [a for a in ds.coco.imgToAnns.get(image_id, []) if not a["iscrowd"] and a["bbox"][2] > 0
            and a["segmentation"]]
    boxes = np.array([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                      for a in anns], np.float32).reshape(-1, 4)
    labels = np.array([ds.cat_ids.index(a["category_id"]) for a in anns], np.int64)
    info = ds.coco.imgs[image_id]
    masks = np.stack([ds.coco.annToMask(a) for a in anns]) if anns else \
        np.zeros((0, info["height"], info["width"]), np.uint8)
    return boxes, np.ones(len(anns), np.float32), labels, masks


def run_metric(ds, indices, cfg=None, predict=perfect_predictions):
    metric = METRICS.build(cfg or {"name": "COCO"})
    metric.set_dataset(ds)
    for batch in indices:
        preds = {"boxes": [], "scores": [], "labels": [], "masks": []}
        for i in batch:
            for k, v in zip(("boxes", "scores", "labels", "masks"), predict(ds, i)):
                preds[k].append(v)
        metric.update(preds, {"index": np.array(batch)})
    return metric.accumulate()


def test_perfect_predictions_score_one(coco, tmp_path):
    path, _ = coco
    ds = COCODataset(path)
    out = run_metric(ds, [[0, 1], [2]], {"name": "COCO", "per_class": True, "save_results": str(tmp_path / "res")})
    for t in ("bbox", "segm"):
        assert out[f"{t}_ap"] == pytest.approx(1.0) and out[f"{t}_ap50"] == pytest.approx(1.0)
        assert out[f"{t}_ar100"] == pytest.approx(1.0)
        assert out[f"{t}_ap_class_ball"] == pytest.approx(1.0) and out[f"{t}_ap_class_box"] == pytest.approx(1.0)
        assert f"{t}_ap_l" not in out                    # no large object: COCOeval's -1 is left out
    assert out["num_samples"] == 3
    saved = json.load(open(tmp_path / "res" / "bbox.json"))
    assert {d["category_id"] for d in saved} == {5, 9}   # the dataset's own ids, not class indices
    again = evaluate_results(path, {"bbox": str(tmp_path / "res" / "bbox.json"),
                                    "segm": str(tmp_path / "res" / "segm.json")})
    assert again["bbox_ap"] == pytest.approx(1.0) and again["segm_ap"] == pytest.approx(1.0)


def test_detections_on_a_crowd_region_are_ignored_and_mistakes_count(coco):
    path, masks = coco
    ds = COCODataset(path)

    def with_crowd_hit(ds, i):
        boxes, scores, labels, m = perfect_predictions(ds, i)
        if i != 0:
            return boxes, scores, labels, m
        return (np.concatenate([boxes, [[2, 30, 12, 38]]]).astype(np.float32), np.append(scores, 0.5),
                np.append(labels, 0), np.concatenate([m, masks["crowd"][None]]))
    assert run_metric(ds, [[0, 1, 2]], predict=with_crowd_hit)["bbox_ap"] == pytest.approx(1.0)

    def wrong_class(ds, i):
        boxes, scores, labels, m = perfect_predictions(ds, i)
        return boxes, scores, 1 - labels, m
    out = run_metric(ds, [[0, 1, 2]], predict=wrong_class)
    assert out["bbox_ap"] == 0.0 and out["segm_ap"] == 0.0
    nothing = run_metric(ds, [[0, 1, 2]], predict=lambda ds, i: (np.zeros((0, 4)), np.zeros(0), np.zeros(0),
                                                                 np.zeros((0, 40, 60))))
    assert nothing["bbox_ap"] == 0.0 and nothing["segm_ar100"] == 0.0


def test_coco_results_layout():
    from pycocotools import mask as mask_util
    m = np.zeros((1, 4, 5), np.uint8)
    m[0, 1:3, 2:4] = 1
    out = coco_results(7, [[1, 2, 4, 6]], [0.91234567], [1], m, cat_ids=[5, 9])
    assert out["bbox"] == [{"image_id": 7, "category_id": 9, "score": 0.91235, "bbox": [1.0, 2.0, 3.0, 4.0]}]
    seg = out["segm"][0]["segmentation"]
    assert isinstance(seg["counts"], str) and mask_util.area(dict(seg, counts=seg["counts"].encode())) == 4


def test_metric_needs_a_coco_reader_and_masks():
    metric = METRICS.build({"name": "COCO"})
    with pytest.raises(ConfigError, match="has no COCO annotations"):
        metric.set_dataset(object())
    with pytest.raises(ConfigError, match="iou_types must be among"):
        METRICS.build({"name": "COCO", "iou_types": ["keypoints"]})


WORKER = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np
import paddle.distributed as dist
from engine.components import load_all
from readers.coco import COCODataset
from tests.test_coco import run_eval_split
load_all()
dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
out = run_eval_split(COCODataset({ann!r}), world, rank)
with open({out!r} + f"/rank{{rank}}.json", "w") as f:
    json.dump(out, f)
"""


def noisy_predictions(ds, index):
    """Imperfect but deterministic predictions: shifted boxes, and a false positive."""
    boxes, scores, labels, masks = perfect_predictions(ds, index)
    rng = np.random.default_rng(index)
    boxes = boxes + rng.uniform(-2, 2, boxes.shape).astype(np.float32)
    scores = rng.uniform(0.3, 1.0, len(scores)).astype(np.float32)
    fp = np.array([[0, 0, 10, 10]], np.float32)
    h, w = masks.shape[1:]
    fp_mask = np.zeros((1, h, w), np.uint8)
    fp_mask[0, :10, :10] = 1
    return (np.concatenate([boxes, fp]), np.append(scores, 0.4).astype(np.float32), np.append(labels, 0),
            np.concatenate([masks, fp_mask]))


def run_eval_split(ds, world, rank):
    sampler = EpochBatchSampler(len(ds), batch_size=2, shuffle=True, seed=1, num_replicas=world, rank=rank)
    return run_metric(ds, [list(b) for b in sampler], predict=noisy_predictions)


def test_two_process_metric_equals_one_process(tmp_path):
    """3 readable images on 2 ranks: the sampler repeats one; the gathered metric drops it."""
    path, _ = write_coco(str(tmp_path / "coco"))
    data = json.load(open(path))
    data["images"] = data["images"][:3]                 # images 1-3 (readable)
    ann = str(tmp_path / "three.json")
    with open(ann, "w") as f:
        json.dump(data, f)
    single = run_eval_split(COCODataset(ann), 1, 0)
    assert 0.0 < single["bbox_ap"] < 1.0 and single["num_samples"] == 3
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER.format(root=ROOT, ann=ann, out=str(tmp_path))))
    from tests.test_metrics import free_port
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
           str(tmp_path / "log"), "--max_restart", "0", "--start_port", str(free_port()), "--gloo_port",
           str(free_port()), str(script)]
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    logs = "".join((tmp_path / "log" / f).read_text() for f in sorted(os.listdir(tmp_path / "log"))
                   if f.startswith("workerlog")) if (tmp_path / "log").is_dir() else ""
    assert proc.returncode == 0, proc.stderr[-3000:] + logs[-3000:]
    for r in range(2):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == single


# ------------------------------------------------------------------------------ inference output
def test_detections_writer_uses_the_dataset_category_ids(coco, tmp_path):
    path, _ = coco
    ds = COCODataset(path)
    w = OUTPUTS.build({"name": "Detections", "draw_threshold": 0.5})
    w.open(str(tmp_path / "out"), ds)
    boxes, scores, labels, masks = perfect_predictions(ds, 0)
    (line,) = w.write({"boxes": [boxes], "scores": [scores], "labels": [labels], "masks": [masks]},
                      {"index": np.array([0]), "id": [ds.describe(0)], "image_id": [1]})
    assert "2 detections >= 0.5" in line
    files = w.close()
    dets = json.load(open(files[0]))
    assert [(d["category_id"], d["label"]) for d in dets] == [(9, "box"), (5, "ball")]
    assert os.path.isfile(files[1]) and files[1].endswith("a_det.png")
