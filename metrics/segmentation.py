"""Semantic segmentation: mean IoU (confusion matrix).

`MeanIoU` follows PaddleSeg's evaluation (paddleseg/utils/metrics.py, core/val.py @d7975e7): pixels
whose label is the ignore index count nowhere; the confusion matrix is summed over the whole
dataset (not averaged per image); IoU_c = TP_c / (TP_c + FP_c + FN_c), and a class absent from both
the labels and the predictions has IoU 1 (PaddleSeg's `mean_iou`: union 0 -> 1) and counts in the
mean; pixel accuracy = the correctly predicted share of the counted pixels. The inference output
(`LabelMap`: label PNG + overlay) is in outputs/segmentation.py.

`report()` (tools/eval.py --report; written by outputs/report.py): per class its pixels (labelled
with it), IoU (as above) and accuracy (the share of its pixels predicted as it; 0 for a class no
pixel is labelled with), and the pixel confusion matrix.
"""
import re

import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, to_numpy
from metrics.classification import class_names


def confusion_matrix(pred, label, num_classes, ignore_index=255):
    """int64 [C, C], rows the label, columns the prediction, over the pixels whose label is not
    `ignore_index`."""
    pred, label = np.asarray(pred).reshape(-1), np.asarray(label).reshape(-1)
    if pred.shape != label.shape:
        raise ValueError(f"prediction of {pred.size} pixels for a label of {label.size}")
    keep = label != ignore_index
    pred, label = pred[keep].astype(np.int64), label[keep].astype(np.int64)
    if label.size and (label.min() < 0 or label.max() >= num_classes):
        raise ValueError(f"label values {label.min()}..{label.max()} outside 0..{num_classes - 1} "
                         f"(ignore index {ignore_index})")
    if pred.size and (pred.min() < 0 or pred.max() >= num_classes):
        raise ValueError(f"predicted classes {pred.min()}..{pred.max()} outside 0..{num_classes - 1}")
    return np.bincount(label * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def iou_scores(cm):
    """(per-class IoU [C], mean IoU, pixel accuracy) of a confusion matrix (PaddleSeg's rules)."""
    cm = np.asarray(cm, np.float64)
    tp = np.diag(cm)
    union = cm.sum(0) + cm.sum(1) - tp
    iou = np.where(union > 0, tp / np.maximum(union, 1), 1.0)
    total = cm.sum()
    return iou, float(iou.mean()), float(tp.sum() / total) if total else 0.0


def segmentation_report(cm, names):
    """The per-class table of a [C, C] pixel confusion matrix: pixels, IoU, accuracy."""
    cm = np.asarray(cm, np.int64)
    iou, miou, acc = iou_scores(cm)
    pixels, tp = cm.sum(1), np.diag(cm)
    accuracy = np.where(pixels > 0, tp / np.maximum(pixels, 1), 0.0)
    rows = [{"class": n, "pixels": int(p), "iou": float(i), "accuracy": float(a)}
            for n, p, i, a in zip(names, pixels, iou, accuracy)]
    return {"columns": ["class", "pixels", "iou", "accuracy"], "rows": rows,
            "summary": {"pixels": int(cm.sum()), "miou": miou, "pixel_acc": acc},
            "confusion": {"classes": list(names), "unit": "pixels", "matrix": cm.tolist()}}


def metric_name(name):
    """'traffic light' -> 'traffic_light': lower case, every non-alphanumeric as '_'."""
    return re.sub(r"[^a-z0-9]", "_", str(name).lower())


@METRICS.register("MeanIoU")
class MeanIoU(IndexedMetric):
    """`miou`, `pixel_acc`, `iou_<class name>` per class, `num_samples`.

    Predictions: preds['label_map'] int [B, H, W]; labels: batch['label'] (padding with the ignore
    index is not counted). The classes, their names and the ignore index come from the evaluation
    dataset (`num_classes`, `label_names`, `ignore_index`) unless given here. Each sample keeps its
    own sparse confusion counts, so N-card evaluation equals 1-card evaluation.

    Args:
        num_classes: the classes scored; default: the evaluation reader's (which must agree when both
            are set).
        ignore_index: the label value not counted (padding, void); default: the reader's, else 255.
        background_baseline: also report `miou_all_background`, the mIoU of predicting class 0
            everywhere on the same labels: a floor to read `miou` against.
    """

    def __init__(self, num_classes: int = None, ignore_index: int = None, background_baseline: bool = False):
        super().__init__()
        self.num_classes, self.ignore_index = num_classes, ignore_index
        self.background_baseline = background_baseline
        self.class_names = None

    def set_dataset(self, dataset):
        super().set_dataset(dataset)
        have = getattr(dataset, "num_classes", None)
        if self.num_classes is None:
            self.num_classes = have
        elif have is not None and have != self.num_classes:
            raise ConfigError(f"metric MeanIoU: num_classes {self.num_classes} but the dataset has {have}")
        if self.ignore_index is None:
            self.ignore_index = getattr(dataset, "ignore_index", None)
        names = getattr(dataset, "label_names", None)
        if names is not None and self.num_classes is not None and len(names) == self.num_classes:
            self.class_names = list(names)

    def _keys(self):
        if self.num_classes is None:
            return []
        names = self.class_names or [str(i) for i in range(self.num_classes)]
        keys = []
        for i, n in enumerate(names):
            k = "iou_" + metric_name(n)
            keys.append(k if k not in keys else f"{k}_{i}")
        return keys

    def names(self):
        baseline = ["miou_all_background"] if self.background_baseline else []
        return ["miou", "pixel_acc"] + self._keys() + baseline + ["num_samples"]

    def update(self, preds, batch):
        if self.num_classes is None:
            raise ConfigError("metric MeanIoU: num_classes unknown (the dataset does not say; "
                              "set metric.num_classes)")
        if "label_map" not in preds:
            raise ConfigError(f"metric MeanIoU: predictions have no 'label_map' (keys: {sorted(preds)})")
        if "label" not in batch:
            raise ConfigError("metric MeanIoU: the evaluation batch has no 'label' (is the split labelled?)")
        preds_np, labels = to_numpy(preds["label_map"]), to_numpy(batch["label"])
        c, ignore = self.num_classes, 255 if self.ignore_index is None else self.ignore_index
        rows = []
        for p, lab in zip(preds_np, labels):
            flat = confusion_matrix(p, lab, c, ignore).reshape(-1)
            nz = np.flatnonzero(flat)
            rows.append(np.stack([nz, flat[nz]], 1))        # sparse: (cell, count) pairs
        self.add(batch["index"], confusion=rows)

    def _matrix(self, rows):
        flat = np.zeros(self.num_classes ** 2, np.int64)
        for r in rows.get("confusion", []):
            np.add.at(flat, r[:, 0], r[:, 1])
        return flat.reshape(self.num_classes, self.num_classes)

    def confusion(self):
        """The dataset's confusion matrix [C, C] (gathered across ranks: every rank must call it)."""
        return self._matrix(self.collect()[1])

    def report(self, label_names=None):
        """Per-class IoU and accuracy, and the confusion matrix in pixels (see the module docstring)."""
        return segmentation_report(self.confusion(), class_names(self.num_classes, self.class_names, label_names))

    def accumulate(self):
        index, rows = self.collect()
        cm = self._matrix(rows)
        iou, miou, acc = iou_scores(cm)
        out = {"miou": miou, "pixel_acc": acc}
        out.update({k: float(v) for k, v in zip(self._keys(), iou)})
        if self.background_baseline:
            bg = np.zeros_like(cm)
            bg[:, 0] = cm.sum(1)
            out["miou_all_background"] = iou_scores(bg)[1]
        out["num_samples"] = len(index)
        return out
