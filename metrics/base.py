"""Per-sample metric state keyed by dataset index, gathered across ranks and de-duplicated.

Why keyed by index: a distributed sampler pads its index list with repeats so that every rank gets
the same number of batches, and a metric that simply summed batches would count those samples
twice (and differently for every world size). Metrics built on `IndexedMetric` store one small row
of per-sample results per index; `collect()` gathers all ranks' rows, keeps one row per index and
sorts by index, so 1 process and N processes see exactly the same arrays and give the same numbers.
"""
import numpy as np
import paddle

from engine import distributed


def to_numpy(x):
    if isinstance(x, paddle.Tensor):
        if x.dtype == paddle.bfloat16:   # .numpy() would return the raw bits as uint16
            x = x.astype("float32")
        return x.numpy()
    return np.asarray(x)


def top_k(scores, k):
    """Indices and values of the k largest scores per row, best first; ties go to the lower class id.

    numpy's argpartition/argsort leave the order of equal scores implementation-defined; a fixed
    rule makes the metrics independent of batch composition and of the number of ranks.
    """
    scores = np.asarray(scores)
    rows, num_classes = scores.shape
    k = min(int(k), num_classes)
    if k == num_classes or rows == 0:
        cols = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    else:
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1:k]     # k-th largest value per row
        above = scores > kth
        tied = scores == kth
        need = k - above.sum(axis=1, keepdims=True)
        take = above | (tied & (np.cumsum(tied, axis=1) <= need))  # lowest class ids among ties
        cols = np.nonzero(take)[1].reshape(rows, k)                 # ascending class id per row
        order = np.argsort(-np.take_along_axis(scores, cols, axis=1), axis=1, kind="stable")
        cols = np.take_along_axis(cols, order, axis=1)
    return cols, np.take_along_axis(scores, cols, axis=1)


def check_scores(name, key, scores):
    if scores.ndim != 2:
        raise ValueError(f"metric {name}: preds['{key}'] must be [batch, classes], got shape "
                         f"{list(scores.shape)}")
    if np.isnan(scores).any():
        raise ValueError(f"metric {name}: preds['{key}'] contains NaN (did training diverge?)")


class IndexedMetric:
    """Base of every metric: `add(index, **rows)` in `update`, `collect()` in `accumulate`.

    Each field passed to `add` is either an array whose first axis is the batch, or a list with one
    Python object per sample (ragged rows: a list of detections, a hypothesis string). Under data
    parallel (`paddle.distributed.get_world_size() > 1`) `collect()` is a collective call: every rank
    must call `accumulate()`, and every rank gets the full result. A repeated index keeps its first
    row (repeats are the same sample, so the rows are equal).

    The engine calls `set_dataset(dataset)` with the evaluation dataset once it is built, so a
    metric reads what it needs from there (annotation file, image ids, reference sentences) instead
    of repeating reader settings in the metric section. `names()` lists the keys `accumulate()`
    returns (checked against `train.best_metric` before training starts).
    """

    def __init__(self):
        self._parts = []
        self.dataset = None

    def set_dataset(self, dataset):
        self.dataset = dataset

    def names(self):
        raise NotImplementedError

    def reset(self):
        self._parts = []

    def add(self, index, **fields):
        index = to_numpy(index).astype(np.int64).reshape(-1)
        rows = {}
        for key, value in fields.items():
            value = list(value) if isinstance(value, (list, tuple)) else np.asarray(value)
            if len(value) != len(index):
                raise ValueError(f"metric {type(self).__name__}: field '{key}' has {len(value)} "
                                 f"rows for a batch of {len(index)} indices")
            rows[key] = value
        self._parts.append((index, rows))

    @staticmethod
    def _concat(parts):
        parts = [p for p in parts if len(p[0])]
        if not parts:
            return np.zeros(0, np.int64), {}
        index = np.concatenate([p[0] for p in parts])
        fields = {}
        for key, first in parts[0][1].items():
            if isinstance(first, list):
                fields[key] = [row for p in parts for row in p[1][key]]
            else:
                fields[key] = np.concatenate([p[1][key] for p in parts])
        return index, fields

    def collect(self):
        """(index [N], {field: array [N, ...] or list of N rows}): one row per dataset index, sorted."""
        index, fields = self._concat(self._parts)
        self._parts = [(index, fields)] if len(index) else []   # keep one block, not many small ones
        if paddle.distributed.get_world_size() > 1:
            index, fields = self._concat(distributed.gather((index, fields)))
        index, first = np.unique(index, return_index=True)
        return index, {key: [value[i] for i in first] if isinstance(value, list) else value[first]
                       for key, value in fields.items()}
