"""Single-label classification: the inference output (`TopK`, predictions.json).

The classes are ranked as the metrics rank them (`metrics.base.top_k`: best first, ties to the lower
class id).
"""
import json
import os

import numpy as np

from engine.errors import ConfigError
from engine.registry import OUTPUTS
from metrics.base import top_k
from outputs.base import OutputWriter, softmax


@OUTPUTS.register("TopK")
class TopK(OutputWriter):
    """`predictions.json`: per sample its id and the `top_k` classes with label names and scores
    (preds['probs'], or the softmax of preds['logits']).

    Args:
        top_k: the best-scored classes listed per sample (>= 1).
    """

    def __init__(self, top_k: int = 5):
        if top_k < 1:
            raise ConfigError(f"infer TopK: top_k must be >= 1, got {top_k}")
        self.top_k = top_k

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.results, self.ids, self.probs = [], [], []

    def write(self, preds, meta):
        probs = preds["probs"] if "probs" in preds else softmax(np.asarray(preds["logits"], np.float32))
        cols, scores = top_k(probs, self.top_k)
        lines = []
        for vid, row, ids, vals in zip(meta["id"], probs, cols, scores):
            top = [{"class_id": int(c), "label": self.label(int(c)), "score": float(v)} for c, v in zip(ids, vals)]
            self.results.append({"id": vid, "top_k": top})
            self.answers.append(self.results[-1])
            self.ids.append(vid)
            self.probs.append(row)
            lines.append(f"{vid}: " + ", ".join(f"{t['label']} {t['score']:.3f}" for t in top))
        return lines

    def close(self):
        path = os.path.join(self.output_dir, "predictions.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(path + ".tmp", path)
        return [path]
