"""Semantic segmentation: mean IoU (confusion matrix) and the inference output (label PNG + overlay).

`MeanIoU` follows PaddleSeg's evaluation (paddleseg/utils/metrics.py, core/val.py @d7975e7): pixels
whose label is the ignore index count nowhere; the confusion matrix is summed over the whole
dataset (not averaged per image); IoU_c = TP_c / (TP_c + FP_c + FN_c), and a class absent from both
the labels and the predictions has IoU 1 (PaddleSeg's `mean_iou`: union 0 -> 1) and counts in the
mean; pixel accuracy = the correctly predicted share of the counted pixels.

`LabelMap` writes, per image, `<name>.png`: the class ids as a palette PNG (the Pascal VOC colour
map, so viewers show colours and `PIL.Image.open(...)` gives the ids back), and
`<name>_overlay.png`: the image blended with the class colours. Predictions are preds['label_map']
(int [B, H, W] or one [H, W] per image) or preds['logits'] [B, C, H, W] (arg-max); a padded batch's
map is cut to the image's `image_size` (PadImages), and a map of another size than the image is
resized (nearest) to it. The image comes from the batch's `image_path`
metadata, else from the dataset's `describe(index)` when that is a file.
"""
import os
import re

import cv2
import numpy as np

from engine.registry import METRICS, OUTPUTS, ConfigError
from metrics.base import IndexedMetric, OutputWriter, to_numpy


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
    `background_baseline` adds `miou_all_background`: the mIoU of predicting class 0 everywhere on
    the same labels, a floor to read `miou` against.
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


def voc_palette(n=256):
    """The Pascal VOC colour map: class c's RGB bits come from c's bits, interleaved (c=1: dark red)."""
    palette = np.zeros((n, 3), np.uint8)
    for c in range(n):
        v, r, g, b = c, 0, 0, 0
        for shift in range(7, -1, -1):
            r |= (v & 1) << shift
            g |= ((v >> 1) & 1) << shift
            b |= ((v >> 2) & 1) << shift
            v >>= 3
        palette[c] = (r, g, b)
    return palette


def _stem(name):
    return os.path.splitext(os.path.basename(str(name)))[0] or str(name)


@OUTPUTS.register("LabelMap")
class LabelMap(OutputWriter):
    """Label PNG + overlay per image (see the module docstring); `alpha` is the colour's weight."""

    def __init__(self, alpha: float = 0.5):
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"infer LabelMap: alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
        self.palette = voc_palette()

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.paths = []

    def _maps(self, preds):
        if "label_map" in preds:
            return list(preds["label_map"])
        if "logits" in preds:
            return list(np.asarray(preds["logits"]).argmax(axis=1))
        raise ConfigError(f"infer LabelMap: predictions have neither 'label_map' nor 'logits' "
                          f"(keys: {sorted(preds)})")

    def _image(self, meta, i):
        path = meta["image_path"][i] if "image_path" in meta else meta["id"][i]
        img = cv2.imread(str(path), cv2.IMREAD_COLOR) if os.path.isfile(str(path)) else None
        return None if img is None else img[:, :, ::-1]

    def write(self, preds, meta):
        from PIL import Image
        lines = []
        for i, label in enumerate(self._maps(preds)):
            label = np.asarray(label)
            if label.ndim != 2:
                raise ConfigError(f"infer LabelMap: a label map must be [H, W], got {list(label.shape)}")
            if label.min() < 0 or label.max() > 255:
                raise ConfigError(f"infer LabelMap: class ids must be in [0, 255] for a PNG, got "
                                  f"{label.min()}..{label.max()}")
            if "image_size" in meta:   # a padded batch (PadImages): the image's own part
                h, w = (int(v) for v in np.asarray(meta["image_size"][i]).reshape(-1)[:2])
                label = label[:h, :w]
            image = self._image(meta, i)
            if image is not None and image.shape[:2] != label.shape:
                label = cv2.resize(label.astype(np.uint8), (image.shape[1], image.shape[0]),
                                   interpolation=cv2.INTER_NEAREST)
            label = label.astype(np.uint8)
            stem = _stem(meta["id"][i])
            png = Image.fromarray(label, mode="P")
            png.putpalette(self.palette.reshape(-1).tolist())
            path = os.path.join(self.output_dir, stem + ".png")
            png.save(path)
            self.paths.append(path)
            if image is not None:
                colour = self.palette[label]
                blend = (image.astype(np.float32) * (1 - self.alpha) + colour * self.alpha).astype(np.uint8)
                over = os.path.join(self.output_dir, stem + "_overlay.png")
                cv2.imwrite(over, blend[:, :, ::-1])
                self.paths.append(over)
            present = ", ".join(self.label(int(c)) for c in np.unique(label))
            lines.append(f"{meta['id'][i]}: {path} ({present})")
        return lines

    def close(self):
        return list(self.paths)
