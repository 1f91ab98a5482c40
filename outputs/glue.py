"""GLUE and BERT pretraining: the inference outputs (the GLUE leaderboard's submission files, the
pretraining scores per instance)."""
import json
import os

import numpy as np

from engine.errors import ConfigError
from engine.registry import OUTPUTS
from outputs.base import OutputWriter


@OUTPUTS.register("GLUESubmission")
class GLUESubmission(OutputWriter):
    """The GLUE leaderboard's files: `<TASK>.tsv` (MNLI: MNLI-m.tsv and MNLI-mm.tsv) with the header
    `index\\tprediction` and one row per test example in file order; predictions are label names
    (0/1 for the binary tasks, entailment/... for the NLI tasks) or the score for STS-B."""

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.task = getattr(dataset, "task", None)
        if self.task is None:
            raise ConfigError(f"infer GLUESubmission: reader {type(dataset).__name__} is not a GLUE reader")
        self.rows = {}

    def write(self, preds, meta):
        logits = np.asarray(preds["logits"])
        lines = []
        subsets = meta.get("subset")
        for j, (index, guid) in enumerate(zip(meta["index"], meta["guid"])):
            if self.task.labels is None:
                value = f"{float(logits[j].reshape(-1)[0]):.3f}"
            else:
                value = self.task.labels[int(logits[j].argmax())]
            subset = int(subsets[j]) if subsets is not None else 0
            self.rows[int(index)] = (subset, guid, value)
            self.answers.append({"id": str(guid), "prediction": value})
            lines.append(f"{guid}\t{value}")
        return lines

    def close(self):
        names = self.task.submission or (f"{self.task.name}.tsv",)
        written = []
        for subset, name in enumerate(names):
            rows = [r for i, r in sorted(self.rows.items()) if r[0] == subset]
            if not rows:
                continue
            path = os.path.join(self.output_dir, name)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("index\tprediction\n")
                f.writelines(f"{guid}\t{value}\n" for _, guid, value in rows)
            os.replace(path + ".tmp", path)
            written.append(path)
        return written


@OUTPUTS.register("PretrainingScores")
class PretrainingScores(OutputWriter):
    """`pretraining_scores.jsonl`: per instance its source (file:line), masked tokens predicted right
    of those masked, and the probability that B follows A (NSP class 0)."""

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.rows = {}

    def write(self, preds, meta):
        logits = np.asarray(preds["nsp_logits"], np.float64)
        p_next = np.exp(logits[:, 0] - np.logaddexp(logits[:, 0], logits[:, 1]))
        lines = []
        for j, (index, name) in enumerate(zip(meta["index"], meta["id"])):
            row = {"id": name, "mlm_correct": int(preds["mlm_correct"][j]), "mlm_total": int(preds["mlm_total"][j]),
                   "p_is_next": round(float(p_next[j]), 4)}
            self.rows[int(index)] = row
            self.answers.append(row)
            lines.append(f"{name}: {row['mlm_correct']}/{row['mlm_total']} masked tokens, P(is next) {row['p_is_next']}")
        return lines

    def close(self):
        path = os.path.join(self.output_dir, "pretraining_scores.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(self.rows[i]) + "\n" for i in sorted(self.rows))
        os.replace(path + ".tmp", path)
        return [path]
