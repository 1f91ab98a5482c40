"""Single-label classification metrics: top-k accuracy and mean class accuracy (Kinetics, UCF ...).

- top<k>: share of samples whose label is among the k best-scored classes (ties go to the lower
  class id; k is capped at the number of classes).
- mean_class_acc: per-class recall of the top-1 prediction, averaged over the classes present in
  the ground truth. MMAction2's `mean_class_accuracy` also averages in a 0 for every class that is
  predicted but never a label; on a full validation set, where every class occurs, both agree.

Per sample only the k best class ids and the label are kept, not the score matrix. The inference
output of classification (`TopK`) is in outputs/classification.py.
"""
import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, check_scores, to_numpy, top_k


def mean_class_accuracy(top1, labels):
    classes, inverse = np.unique(labels, return_inverse=True)
    correct = np.bincount(inverse, weights=(top1 == labels), minlength=len(classes))
    return float(np.mean(correct / np.bincount(inverse, minlength=len(classes))))


@METRICS.register("Classification")
class Classification(IndexedMetric):
    """top1/top5 (from `topk`), mean_class_acc over preds['logits'] (or ['probs']) and batch['label']."""

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
