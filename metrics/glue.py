"""GLUE metrics and BERT pretraining metrics (the GLUE submission files: outputs/glue.py).

Definitions (GLUE paper / HF `glue_compute_metrics`): accuracy; f1 of the positive class 1 (MRPC,
QQP); Matthews correlation of the binary predictions (CoLA; 0 when a row or column of the confusion
matrix is empty, as sklearn); Pearson and Spearman correlation of the predicted and true scores
(STS-B; Spearman = Pearson of the ranks, ties at their average rank, as scipy's spearmanr). MNLI:
`accuracy` on the matched dev set and `accuracy_mm` on the mismatched one (the reader tags them).
Pretraining: `mlm_acc` = masked tokens predicted right / masked tokens, `nsp_acc` = share of pairs
whose next-sentence label is predicted right. `report()` (tools/eval.py --report, classification tasks):
per-class precision/recall/F1 and the confusion matrix (metrics/classification.py's `confusion_report`;
MNLI: both dev sets together).
"""
import typing

import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, to_numpy
from metrics.classification import confusion_counts, confusion_report
from readers.glue import TASKS, get_task


def accuracy(pred, label):
    return float(np.mean(pred == label)) if len(label) else 0.0


def f1(pred, label):
    tp = float(np.sum((pred == 1) & (label == 1)))
    fp = float(np.sum((pred == 1) & (label != 1)))
    fn = float(np.sum((pred != 1) & (label == 1)))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def mcc(pred, label):
    tp = float(np.sum((pred == 1) & (label == 1)))
    tn = float(np.sum((pred != 1) & (label != 1)))
    fp = float(np.sum((pred == 1) & (label != 1)))
    fn = float(np.sum((pred != 1) & (label == 1)))
    den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / den) if den else 0.0


def pearson(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    den = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / den) if den else 0.0


def average_ranks(x):
    """Ranks 1..n, ties at their average rank."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    xs = x[order]
    start = 0
    for i in range(1, len(x) + 1):
        if i == len(x) or xs[i] != xs[start]:
            ranks[order[start:i]] = (start + 1 + i) / 2.0
            start = i
    return ranks


def spearman(x, y):
    return pearson(average_ranks(x), average_ranks(y))


FUNCS = {"accuracy": accuracy, "f1": f1, "mcc": mcc}


@METRICS.register("GLUE")
class GLUEMetric(IndexedMetric):
    """The metrics of the evaluated GLUE task (taken from the dataset, or `task`), over preds['logits'].

    Args:
        task: the GLUE task whose metrics are computed (accuracy, F1, MCC or correlations); default:
            the evaluation reader's, which must agree when both are set.
    """

    def __init__(self, task: typing.Literal[tuple(TASKS)] = None):
        super().__init__()
        self.task = None
        if task is not None:
            self.task = get_task(task)

    def set_dataset(self, dataset):
        super().set_dataset(dataset)
        task = getattr(dataset, "task", None)
        if self.task is None:
            if task is None:
                raise ConfigError(f"metric GLUE: reader {type(dataset).__name__} names no GLUE task; "
                                  f"set metric.task")
            self.task = task
        elif task is not None and task.name != self.task.name:
            raise ConfigError(f"metric GLUE: metric.task is {self.task.name} but the reader reads {task.name}")

    def names(self):
        if self.task is None:
            raise ConfigError("metric GLUE: no task (set metric.task, or evaluate a GLUE reader)")
        return list(self.task.metrics) + ["num_samples"]

    def update(self, preds, batch):
        logits = to_numpy(preds["logits"])
        if self.task is not None and self.task.labels is None:
            pred = logits.reshape(len(logits), -1)[:, 0].astype(np.float64)
            label = to_numpy(batch["label"]).astype(np.float64).reshape(-1)
        else:
            pred = logits.argmax(axis=-1).astype(np.int64)
            label = to_numpy(batch["label"]).astype(np.int64).reshape(-1)
        subset = to_numpy(batch["subset"]).reshape(-1) if "subset" in batch else np.zeros(len(pred), np.int64)
        self.add(batch["index"], pred=pred, label=label, subset=subset)

    def accumulate(self):
        index, rows = self.collect()
        out = {name: 0.0 for name in self.names()}
        out["num_samples"] = int(len(index))
        if not len(index):
            return out
        pred, label, subset = rows["pred"], rows["label"], rows["subset"]
        if self.task.labels is None:
            out.update(pearson=pearson(pred, label), spearman=spearman(pred, label))
            return out
        for name in self.task.metrics:
            if name == "accuracy_mm":
                out[name] = accuracy(pred[subset == 1], label[subset == 1])
            elif name == "accuracy" and "accuracy_mm" in self.task.metrics:
                out[name] = accuracy(pred[subset == 0], label[subset == 0])
            else:
                out[name] = FUNCS[name](pred, label)
        return out

    def report(self, label_names=None):
        if self.task.labels is None:
            raise ConfigError(f"metric GLUE: {self.task.name} is a regression task: it has no per-class report")
        _, rows = self.collect()
        c = len(self.task.labels)
        cm = confusion_counts(rows.get("pred", []), rows.get("label", []), c)
        return confusion_report(cm, [str(n) for n in self.task.labels])


@METRICS.register("Pretraining")
class PretrainingMetric(IndexedMetric):
    """mlm_acc and nsp_acc from BertForPretraining's eval outputs (mlm_correct, mlm_total, nsp_logits)."""

    def names(self):
        return ["mlm_acc", "nsp_acc", "num_samples"]

    def update(self, preds, batch):
        nsp = to_numpy(preds["nsp_logits"]).argmax(axis=-1)
        self.add(batch["index"], mlm_correct=to_numpy(preds["mlm_correct"]).astype(np.float64),
                 mlm_total=to_numpy(preds["mlm_total"]).astype(np.float64),
                 nsp_hit=(nsp == to_numpy(batch["next_sentence_label"]).reshape(-1)).astype(np.float64))

    def accumulate(self):
        index, rows = self.collect()
        if not len(index):
            return {"mlm_acc": 0.0, "nsp_acc": 0.0, "num_samples": 0}
        total = rows["mlm_total"].sum()
        return {"mlm_acc": float(rows["mlm_correct"].sum() / total) if total else 0.0,
                "nsp_acc": float(rows["nsp_hit"].mean()), "num_samples": int(len(index))}
