"""YouTube-8M metrics: GAP@k, Hit@1 and PERR, as google/youtube-8m `eval_util.py` defines them.

- Hit@1: share of videos whose arg-max class is a ground-truth label (numpy arg-max: the first
  maximum, i.e. the lowest class id on ties).
- PERR: per video with n labels, the share of its n best-scored classes that are labels, where a
  class only counts if its score is > 0; a video with no label scores 0 (the starter code takes
  `argpartition(x, -0)[-0:]`, i.e. all classes, none of which is a label). Averaged over videos.
- GAP: per video keep the top-k (score, is-label) pairs; pool the pairs of ALL videos of the
  evaluation; sort by score; AP = sum over ranks i holding a label of precision@i / P, where P
  counts every ground-truth label of every video, including labels outside the video's top k
  (`num_positives` in `top_k_by_class`). It is computed once over the whole evaluation, like the
  starter code's `EvaluationMetrics.global_ap_calculator` (top_n=None, so P is not capped).
  PaddleVideo 2.x averages per-batch GAPs instead, which gives a different (batch-size dependent)
  number.

Ties, where the starter code is arbitrary: within a video the top k (and the n best for PERR)
keep the lower class ids; across the pool, the starter code shuffles with a fixed seed before a
stable sort, so tied scores land in an order that depends on batch order. Here tied scores count
with their expected AP over all orders of the tie (McSherry & Najork 2008), which does not depend
on batch order or world size and equals the starter code's number whenever no scores tie.

Memory: per video only the top-k scores, classes and hits, the label count, the labels outside the
top k (mostly none: an empty tuple), and two scalars are kept (docs/performance.md#reader-figures
for YouTube-8M val), never the [N, classes] score matrix.

`report()` (tools/eval.py --report; multi-label, so no confusion matrix): per class its support
(videos labelled with it), AP over the top-k pool of the class (the pairs (score, is-label) of the
videos that have the class in their top k, against all its labelled videos: the starter code's
per-class AP behind its mAP, ties as for GAP), and the hit rates of the top-1 class: precision (of
the videos whose top-1 class it is, the share labelled with it) and recall (of its labelled videos,
the share whose top-1 class it is). The summary's mAP averages the classes with support.
"""
import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, check_scores, to_numpy, top_k
from metrics.classification import class_names


def hit_at_one(scores, positives):
    """Per video: 1.0 if the arg-max class (first maximum) is a label."""
    return positives[np.arange(len(scores)), np.argmax(scores, axis=1)].astype(np.float64)


def precision_at_equal_recall(scores, positives, chunk=1024):
    """Per video with n labels: labels among its n best classes with score > 0, divided by n."""
    num_videos, num_classes = scores.shape
    num_labels = positives.sum(axis=1)
    rows, cols = np.nonzero(positives)
    found = np.zeros(num_videos, dtype=np.float64)
    classes = np.arange(num_classes)
    for start in range(0, len(rows), chunk):
        r, c = rows[start:start + chunk], cols[start:start + chunk]
        row_scores, own = scores[r], scores[r, c][:, None]
        # rank of the label among its video's classes, ties going to the lower class id
        rank = (row_scores > own).sum(axis=1) + ((row_scores == own) & (classes < c[:, None])).sum(axis=1)
        inside = (rank < num_labels[r]) & (own[:, 0] > 0)
        found += np.bincount(r, weights=inside, minlength=num_videos)
    return np.where(num_labels > 0, found / np.maximum(num_labels, 1), 0.0)


def global_average_precision(scores, hits, num_positives):
    """Non-interpolated AP of a pooled ranked list, with `num_positives` as the recall base.

    Tied scores count with their expected AP over every order of the tie: in a tie group of n
    items holding p labels after c earlier labels, the item at rank j (1-based, group starting
    after rank s) is a label with probability p/n and then has c + 1 + (j-s-1)(p-1)/(n-1) labels
    at or before it in expectation. Memory stays O(pool) with a handful of arrays, for a few seconds
    (docs/performance.md#reader-figures for YouTube-8M val).
    """
    scores = np.asarray(scores).reshape(-1)
    hits = np.asarray(hits).reshape(-1) > 0
    if num_positives <= 0 or scores.size == 0:
        return 0.0
    order = np.argsort(-scores, kind="stable")
    scores, hits = scores[order], hits[order]
    del order
    found = np.cumsum(hits, dtype=np.float64)             # labels at or before each rank
    starts = np.ones(scores.size + 1, dtype=bool)         # item i starts a run of equal scores
    np.not_equal(scores[1:], scores[:-1], out=starts[1:-1])
    single = starts[:-1] & starts[1:]                     # a run of one: no tie
    ranks = np.flatnonzero(single & hits)
    total = np.sum(found[ranks] / (ranks + 1))
    tie_first = np.flatnonzero(starts[:-1] & ~starts[1:])
    tie_end = np.flatnonzero(~starts[:-1] & starts[1:]) + 1
    if len(tie_first):
        before = np.where(tie_first > 0, found[tie_first - 1], 0.0)
        pos = found[tie_end - 1] - before
        keep = pos > 0
        first, n, before, pos = tie_first[keep], (tie_end - tie_first)[keep], before[keep], pos[keep]
        group = np.repeat(np.arange(len(n)), n)
        offset = np.arange(len(group)) - np.repeat(np.cumsum(n) - n, n)   # j - s - 1
        expected = before[group] + 1 + offset * ((pos - 1) / (n - 1))[group]
        total += np.sum((pos / n)[group] * expected / (first[group] + offset + 1))
    return float(total / num_positives)


def gap(scores, labels, k=20):
    """GAP of one score matrix [N, C] against multi-hot labels [N, C] (one global pool)."""
    scores = np.asarray(scores, dtype=np.float32)
    positives = np.asarray(labels) > 0
    cols, values = top_k(scores, k)
    hits = np.take_along_axis(positives, cols, axis=1)
    return global_average_precision(values, hits, int(positives.sum()))


def youtube8m_report(classes, scores, hits, missed, names):
    """The per-class table of top-k class ids, scores, hits [N, k] and each video's labels outside its top k."""
    c = len(names)
    classes, hits = np.asarray(classes, np.int64), np.asarray(hits, bool)
    support = np.bincount(classes[hits], minlength=c)
    outside = [i for m in missed for i in m]
    support += np.bincount(np.asarray(outside, np.int64), minlength=c)
    flat = classes.reshape(-1)
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(c + 1))
    pool_scores, pool_hits = np.asarray(scores).reshape(-1)[order], hits.reshape(-1)[order]
    ap = np.array([global_average_precision(pool_scores[bounds[i]:bounds[i + 1]], pool_hits[bounds[i]:bounds[i + 1]],
                                            int(support[i])) for i in range(c)])
    top1 = classes[:, 0] if len(classes) else np.zeros(0, np.int64)
    predicted = np.bincount(top1, minlength=c)
    right = np.bincount(top1[hits[:, 0]] if len(classes) else top1, minlength=c)
    precision = np.where(predicted > 0, right / np.maximum(predicted, 1), 0.0)
    recall = np.where(support > 0, right / np.maximum(support, 1), 0.0)
    rows = [{"class": n, "support": int(s), "ap": float(a), "top1_precision": float(p), "top1_recall": float(r)}
            for n, s, a, p, r in zip(names, support, ap, precision, recall)]
    labelled = support > 0
    return {"columns": ["class", "support", "ap", "top1_precision", "top1_recall"], "rows": rows,
            "summary": {"videos": int(len(classes)), "classes_with_support": int(labelled.sum()),
                        "map": float(ap[labelled].mean()) if labelled.any() else 0.0}}


@METRICS.register("YouTube8M")
class YouTube8M(IndexedMetric):
    """GAP@top_k, Hit@1, PERR over preds['probs'] [B, C] and batch['labels'] multi-hot [B, C].

    Args:
        top_k: the classes per video kept for GAP (20: the YouTube-8M challenge's GAP@20).
    """

    def __init__(self, top_k: int = 20):
        super().__init__()
        if not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"metric YouTube8M: top_k must be a positive integer, got {top_k!r}")
        self.top_k = top_k

    def names(self):
        return ["gap", "hit_at_1", "perr", "num_samples"]

    def update(self, preds, batch):
        scores = to_numpy(preds["probs"]).astype(np.float32, copy=False)
        check_scores("YouTube8M", "probs", scores)
        positives = to_numpy(batch["labels"]) > 0
        if positives.shape != scores.shape:
            raise ValueError(f"metric YouTube8M: batch['labels'] shape {list(positives.shape)} does "
                             f"not match preds['probs'] shape {list(scores.shape)}")
        cols, values = top_k(scores, self.top_k)
        hits = np.take_along_axis(positives, cols, axis=1)
        outside = positives.copy()
        np.put_along_axis(outside, cols, False, axis=1)
        self.add(batch["index"],
                 scores=values,
                 hits=hits,
                 classes=cols.astype(np.int16 if scores.shape[1] <= 32767 else np.int32),
                 missed=[tuple(np.flatnonzero(row).tolist()) for row in outside],
                 num_labels=positives.sum(axis=1).astype(np.int32),
                 hit_at_1=hit_at_one(scores, positives),
                 perr=precision_at_equal_recall(scores, positives))

    def accumulate(self):
        index, rows = self.collect()
        if len(index) == 0:
            return {"gap": 0.0, "hit_at_1": 0.0, "perr": 0.0, "num_samples": 0}
        return {
            "gap": global_average_precision(rows["scores"], rows["hits"], int(rows["num_labels"].sum())),
            "hit_at_1": float(rows["hit_at_1"].mean()),
            "perr": float(rows["perr"].mean()),
            "num_samples": int(len(index)),
        }

    def report(self, label_names=None):
        """Per class: support, AP over its top-k pool, top-1 precision and recall (see the module docstring)."""
        _, rows = self.collect()
        c = getattr(self.dataset, "num_classes", None) or 0
        names = class_names(c, label_names)
        if not c or "classes" not in rows:
            return youtube8m_report(np.zeros((0, 1), np.int64), np.zeros((0, 1)), np.zeros((0, 1), bool), [], names)
        return youtube8m_report(rows["classes"], rows["scores"], rows["hits"], rows["missed"], names)
