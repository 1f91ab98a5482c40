"""Single-label classification metrics: top-k accuracy and mean class accuracy (Kinetics, UCF ...).

- top<k>: share of samples whose label is among the k best-scored classes (ties go to the lower
  class id; k is capped at the number of classes).
- mean_class_acc: per-class recall of the top-1 prediction, averaged over the classes present in
  the ground truth. MMAction2's `mean_class_accuracy` also averages in a 0 for every class that is
  predicted but never a label; on a full validation set, where every class occurs, both agree.

Per sample only the k best class ids and the label are kept, not the score matrix. The inference
output of classification (`TopK`) is in outputs/classification.py.

`report()` (tools/eval.py --report; written by outputs/report.py): the confusion matrix of the top-1
predictions (rows the label, columns the prediction, in samples) and per class its support (samples
labelled with it), precision (share of the samples predicted as it that are labelled with it; 0 when
it is never predicted), recall and F1 (0 when precision + recall is 0), as sklearn's
`classification_report` with zero_division=0.
"""
import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, check_scores, to_numpy, top_k


def confusion_counts(pred, label, num_classes):
    """int64 [C, C]: cell (i, j) counts the samples labelled i and predicted j."""
    pred, label = np.asarray(pred, np.int64).reshape(-1), np.asarray(label, np.int64).reshape(-1)
    return np.bincount(label * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def class_names(num_classes, *candidates):
    """The first of `candidates` (lists of names, or None) with one name per class, else the class ids."""
    for names in candidates:
        if names is not None and len(names) == num_classes:
            return [str(n) for n in names]
    return [str(i) for i in range(num_classes)]


def _ratio(a, b):
    return np.where(b > 0, a / np.maximum(b, 1), 0.0)


def confusion_report(cm, names):
    """The per-class table and the confusion matrix of a [C, C] count matrix (see the module docstring)."""
    cm = np.asarray(cm, np.int64)
    tp, support, predicted = np.diag(cm), cm.sum(1), cm.sum(0)
    precision, recall = _ratio(tp, predicted), _ratio(tp, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    rows = [{"class": n, "support": int(s), "precision": float(p), "recall": float(r), "f1": float(f)}
            for n, s, p, r, f in zip(names, support, precision, recall, f1)]
    total = int(cm.sum())
    return {"columns": ["class", "support", "precision", "recall", "f1"], "rows": rows,
            "summary": {"samples": total, "accuracy": float(tp.sum() / total) if total else 0.0,
                        "macro_precision": float(precision.mean()), "macro_recall": float(recall.mean()),
                        "macro_f1": float(f1.mean())},
            "confusion": {"classes": list(names), "unit": "samples", "matrix": cm.tolist()}}


def mean_class_accuracy(top1, labels):
    classes, inverse = np.unique(labels, return_inverse=True)
    correct = np.bincount(inverse, weights=(top1 == labels), minlength=len(classes))
    return float(np.mean(correct / np.bincount(inverse, minlength=len(classes))))


@METRICS.register("Classification")
class Classification(IndexedMetric):
    """top1/top5 (from `topk`), mean_class_acc over preds['logits'] (or ['probs']) and batch['label'].

    Args:
        topk: the k of each reported top-k accuracy (`top<k>`), positive integers; k beyond the number
            of classes counts as all of them.
    """

    def __init__(self, topk: list = [1, 5]):  # noqa: B006 (never mutated; the validator reads it)
        super().__init__()
        if not topk or any(not isinstance(k, int) or k < 1 for k in topk):
            raise ConfigError(f"metric Classification: topk must be a list of positive integers, "
                              f"got {topk!r}")
        self.topk = sorted(set(topk))

    def names(self):
        return [f"top{k}" for k in self.topk] + ["mean_class_acc", "num_samples"]

    def update(self, preds, batch):
        key = "logits" if "logits" in preds else "probs"
        if key not in preds:
            raise ValueError(f"metric Classification: preds has neither 'logits' nor 'probs' "
                             f"(keys: {sorted(preds)})")
        scores = to_numpy(preds[key])
        check_scores("Classification", key, scores)
        labels = to_numpy(batch["label"]).astype(np.int64).reshape(-1)
        if len(labels) != len(scores):
            raise ValueError(f"metric Classification: {len(labels)} labels for {len(scores)} predictions")
        cols, _ = top_k(scores, max(self.topk))
        self.add(batch["index"], topk_ids=cols.astype(np.int32), label=labels)

    def accumulate(self):
        index, rows = self.collect()
        out = {f"top{k}": 0.0 for k in self.topk}
        out.update(mean_class_acc=0.0, num_samples=int(len(index)))
        if len(index) == 0:
            return out
        ids, labels = rows["topk_ids"], rows["label"]
        for k in self.topk:
            out[f"top{k}"] = float(np.mean((ids[:, :k] == labels[:, None]).any(axis=1)))
        out["mean_class_acc"] = mean_class_accuracy(ids[:, 0], labels)
        return out

    def report(self, label_names=None):
        """Per-class precision/recall/F1 and the confusion matrix of the top-1 predictions; the class names
        are the dataset's, else `label_names` (the recipe's `labels:`), else the class ids."""
        _, rows = self.collect()
        ids, labels = rows.get("topk_ids", np.zeros((0, 1), np.int64)), rows.get("label", np.zeros(0, np.int64))
        num_classes = getattr(self.dataset, "num_classes", None) or 0
        num_classes = max([num_classes, int(ids[:, 0].max(initial=-1)) + 1, int(labels.max(initial=-1)) + 1])
        cm = confusion_counts(ids[:, 0], labels, num_classes)
        return confusion_report(cm, class_names(num_classes, getattr(self.dataset, "label_names", None), label_names))
