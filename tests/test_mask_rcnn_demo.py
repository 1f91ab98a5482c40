"""The Mask R-CNN demo recipe trained once (session fixture): box and mask AP, eval from saved
results, inference output."""
import json
import os

from tests.conftest import MASK_RCNN_DEMO
from tests.helpers import launch, read_metrics, tool


def test_demo_reaches_box_and_mask_ap(mask_rcnn_demo_run):
    m = read_metrics(mask_rcnn_demo_run)
    assert m["num_samples"] == 60 and m["num_skipped"] == 0
    assert m["bbox_ap"] >= 0.25, m
    assert m["segm_ap"] >= 0.25, m
    assert all(0.0 <= v <= 1.0 for k, v in m.items() if k.startswith(("bbox_", "segm_")))


def test_eval_tool_and_saved_results_give_the_training_metrics(mask_rcnn_demo_run, tmp_path):
    trained = read_metrics(mask_rcnn_demo_run)
    tool("eval", "-c", MASK_RCNN_DEMO, "--weights", os.path.join(mask_rcnn_demo_run, "final"),
         "-o", f"metric.save_results={tmp_path / 'results'}", "--output", tmp_path / "eval")
    evaluated = read_metrics(tmp_path / "eval")
    for k in ("bbox_ap", "bbox_ap50", "segm_ap", "segm_ar100"):
        assert evaluated[k] == trained[k], k
    ann = "data/coco_demo/annotations/instances_val.json"
    tool("coco_eval", "--ann", ann, "--bbox", tmp_path / "results" / "bbox.json",
         "--segm", tmp_path / "results" / "segm.json", "--output", tmp_path / "again")
    again = read_metrics(tmp_path / "again")
    for k in ("bbox_ap", "segm_ap", "bbox_ar100"):
        assert abs(again[k] - trained[k]) < 1e-9, k


def test_infer_writes_detections_and_drawings(mask_rcnn_demo_run, tmp_path):
    images = ["data/coco_demo/val/val_0000.png", "data/coco_demo/val/val_0001.png"]
    proc = tool("infer", "-c", MASK_RCNN_DEMO, "--weights", os.path.join(mask_rcnn_demo_run, "final"),
                "--input", *images, "--output", tmp_path)
    assert "val_0000.png:" in proc.stdout
    dets = json.load(open(tmp_path / "detections.json"))
    assert dets and {d["category_id"] for d in dets} <= {1, 3, 7, 12}
    assert {d["label"] for d in dets} <= {"disc", "square", "triangle", "star"}
    assert all(len(d["bbox"]) == 4 and "segmentation" in d for d in dets)
    assert os.path.isfile(tmp_path / "val_0000_det.png")


def test_two_process_evaluation_equals_one_process(mask_rcnn_demo_run, tmp_path):
    """60 images on 2 ranks (gloo): gathered detections give exactly the 1-process COCOeval numbers."""
    launch(2, "eval", "-c", MASK_RCNN_DEMO, "--weights", os.path.join(mask_rcnn_demo_run, "final"),
           "--output", tmp_path / "two", log_dir=tmp_path / "log")
    two, one = read_metrics(tmp_path / "two"), read_metrics(mask_rcnn_demo_run)
    assert two["num_samples"] == 60
    for k, v in one.items():
        assert two[k] == v, (k, two[k], v)
