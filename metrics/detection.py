"""Object detection and instance segmentation: the COCO evaluation.

`COCO` is the evaluation metric: the predictions that outputs/detection.py's `Detections` writes at
inference become COCO results (boxes x, y, w, h; masks as compressed RLE) scored by pycocotools'
COCOeval against the reader's own annotation file (`set_dataset`), with the standard 12 numbers per
IoU type as `bbox_ap`, `bbox_ap50`, ..., `segm_ar_l` (0-1). `evaluate_results` scores results JSON
files saved earlier (tools/coco_eval.py).
"""
import contextlib
import io
import json
import logging
import os
import typing

import numpy as np
import paddle.distributed as dist
from pycocotools import mask as mask_util
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, to_numpy
from readers.coco import COCODataset

log = logging.getLogger("zoo")


# ------------------------------------------------------------------------------- COCO evaluation
# COCOeval.stats order (pycocotools cocoeval.py summarize): AP@[.5:.95], AP50, AP75, AP small,
# medium, large, AR@1, AR@10, AR@100, AR small, medium, large
COCO_STATS = ["ap", "ap50", "ap75", "ap_s", "ap_m", "ap_l", "ar1", "ar10", "ar100", "ar_s", "ar_m", "ar_l"]
IouType = typing.Literal["bbox", "segm"]   # box AP, mask AP
IOU_TYPES = typing.get_args(IouType)


def _slug(name):
    return "".join(c if c.isalnum() else "_" for c in str(name).lower())


def coco_results(image_id, boxes, scores, labels, masks=None, cat_ids=None):
    """One image's predictions as COCO results: {"bbox": [...], "segm": [...]} (boxes x, y, w, h in
    original pixels; masks [K, H, W] binary -> compressed RLE with a str `counts`)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    out = {"bbox": [], "segm": []}
    for j in range(len(boxes)):
        x1, y1, x2, y2 = boxes[j]
        cat = int(cat_ids[labels[j]]) if cat_ids is not None else int(labels[j])
        det = {"image_id": int(image_id), "category_id": cat, "score": round(float(scores[j]), 5)}
        out["bbox"].append(dict(det, bbox=[round(float(v), 2) for v in (x1, y1, x2 - x1, y2 - y1)]))
        if masks is not None:
            rle = mask_util.encode(np.asfortranarray(np.asarray(masks[j], np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            out["segm"].append(dict(det, segmentation=rle))
    return out


def _load_results(coco_gt, results):
    """pycocotools' results object; an empty list gives an empty one (loadRes refuses it)."""
    if results:
        with contextlib.redirect_stdout(io.StringIO()):
            return coco_gt.loadRes(list(results))
    empty = COCO()
    empty.dataset = {"images": list(coco_gt.dataset["images"]), "categories": list(coco_gt.dataset["categories"]),
                     "annotations": []}
    with contextlib.redirect_stdout(io.StringIO()):
        empty.createIndex()
    return empty


def coco_evaluate(coco_gt, results, image_ids=None, per_class=False, label_names=None):
    """COCOeval of `results` {iou_type: list of result dicts} against `coco_gt` (a pycocotools COCO),
    restricted to `image_ids` when given. Returns {"bbox_ap": ..., ...} in 0-1; a number COCOeval
    reports as -1 (no ground truth in that size range) is left out. per_class adds
    `<type>_ap_class_<name>` (AP@[.5:.95] of each category with ground truth)."""
    out = {}
    cats = sorted(coco_gt.getCatIds())
    names = label_names or [coco_gt.cats[c].get("name", c) for c in cats]
    for iou_type, dets in results.items():
        if iou_type not in IOU_TYPES:
            raise ConfigError(f"COCO metric: unknown IoU type '{iou_type}'; known: {', '.join(IOU_TYPES)}")
        coco_dt = _load_results(coco_gt, dets)
        ev = COCOeval(coco_gt, coco_dt, iou_type)
        if image_ids is not None:
            ev.params.imgIds = sorted(int(i) for i in image_ids)
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        log.info("COCOeval %s:\n%s", iou_type, text.getvalue().rstrip())
        for name, value in zip(COCO_STATS, ev.stats):
            if value >= 0:
                out[f"{iou_type}_{name}"] = float(value)
        if per_class:
            precision = ev.eval["precision"]            # [iou, recall, category, area, max dets]
            for k, name in enumerate(names):
                p = precision[:, :, k, 0, -1]
                if (p > -1).any():
                    out[f"{iou_type}_ap_class_{_slug(name)}"] = float(p[p > -1].mean())
    return out


def evaluate_results(ann_file, result_files, per_class=False):
    """Score results JSON files saved earlier: {iou_type: path} -> the metrics of `coco_evaluate`
    over every image of `ann_file`."""
    coco_gt = COCODataset(ann_file).coco     # the annotations the reader keeps (bad ones dropped)
    results = {}
    for iou_type, path in result_files.items():
        if not os.path.isfile(path):
            raise ConfigError(f"results file not found: {path}")
        try:
            with open(path) as f:
                results[iou_type] = json.load(f)
        except ValueError as e:
            raise ConfigError(f"{path}: not a valid JSON results file ({e})") from None
        if not isinstance(results[iou_type], list):
            raise ConfigError(f"{path}: a COCO results file holds a list of detections")
        unknown = {d.get("image_id") for d in results[iou_type]} - set(coco_gt.getImgIds())
        if unknown:
            raise ConfigError(f"{path}: image ids not in {ann_file}: {sorted(unknown)[:5]}")
    return coco_evaluate(coco_gt, results, per_class=per_class)


@METRICS.register("COCO")
class COCOMetric(IndexedMetric):
    """COCO box and mask AP/AR of the predictions (`boxes`, `scores`, `labels`, `masks`: one array
    per image, original image pixels) against the evaluation reader's annotation file.

    Args:
        iou_types: what is scored: `bbox` (box AP/AR) and/or `segm` (mask AP/AR, needs preds['masks']).
        per_class: also report the AP of every category (`<type>_ap_class_<name>`).
        save_results: a folder where rank 0 writes bbox.json / segm.json (COCO results format), which
            `evaluate_results` / tools/coco_eval.py can score again later.
    """

    def __init__(self, iou_types: list[IouType] = ["bbox", "segm"], per_class: bool = False,  # noqa: B006
                 save_results: str = None):
        super().__init__()
        bad = [t for t in iou_types if t not in IOU_TYPES]
        if bad or not iou_types:
            raise ConfigError(f"COCO metric: iou_types must be among {list(IOU_TYPES)}, got {iou_types}")
        self.iou_types, self.per_class, self.save_results = list(iou_types), per_class, save_results

    def set_dataset(self, dataset):
        super().set_dataset(dataset)
        if getattr(dataset, "coco", None) is None or not hasattr(dataset, "image_ids"):
            raise ConfigError(f"COCO metric: the evaluation reader {type(dataset).__name__} has no COCO "
                              f"annotations (use the COCO reader with an ann_file)")
        self.image_id_of = dataset.image_ids()

    def names(self):
        names = [f"{t}_{n}" for t in self.iou_types for n in COCO_STATS]
        if self.per_class and self.dataset is not None:
            names += [f"{t}_ap_class_{_slug(n)}" for t in self.iou_types for n in self.dataset.label_names]
        return names + ["num_samples"]

    def update(self, preds, batch):
        for key in ("boxes", "scores", "labels") + (("masks",) if "segm" in self.iou_types else ()):
            if key not in preds:
                raise ConfigError(f"COCO metric: predictions lack '{key}' (keys: {sorted(preds)})")
        index = to_numpy(batch["index"]).astype(np.int64).reshape(-1)
        rows = []
        for i, idx in enumerate(index):
            masks = to_numpy(preds["masks"][i]) if "segm" in self.iou_types else None
            rows.append(coco_results(self.image_id_of[idx], to_numpy(preds["boxes"][i]),
                                     to_numpy(preds["scores"][i]), to_numpy(preds["labels"][i]), masks,
                                     self.dataset.cat_ids))
        self.add(index, dets=rows)

    def accumulate(self):
        index, rows = self.collect()
        results = {t: [d for r in rows.get("dets", []) for d in r[t]] for t in self.iou_types}
        if self.save_results and _rank() == 0:
            os.makedirs(self.save_results, exist_ok=True)
            for t, dets in results.items():
                path = os.path.join(self.save_results, f"{t}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump(dets, f)
                os.replace(path + ".tmp", path)
        image_ids = [self.image_id_of[i] for i in index]
        out = coco_evaluate(self.dataset.coco, results, image_ids, self.per_class, self.dataset.label_names)
        out["num_samples"] = len(index)
        return out


def _rank():
    return dist.get_rank() if dist.get_world_size() > 1 else 0
