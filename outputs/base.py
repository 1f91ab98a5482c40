"""The output-writer contract (`OutputWriter`, what the OUTPUTS registry builds for tools/infer.py) and
the small helpers the writers share."""
import os

import numpy as np


class OutputWriter:
    """What a task writes for `tools/infer.py`: the inference side of a task family.

    It takes numpy predictions (a dict of arrays, or of lists with one array per sample for ragged
    outputs) and the batch's metadata as numpy/Python values (`index`, `id` from the dataset's
    `describe`, plus whatever the reader put in the batch: file names, sizes), so the exported-model
    predictor can reuse it unchanged. `write` returns one printable line per sample and appends to
    `answers` one JSON-able dict per sample (its `id`, the task's answer, and under `files` the
    per-sample files written, by role): what an inferencer (api/inferencer.py) and the server answer
    for it. `close` returns the files written.
    """

    def open(self, output_dir, dataset, label_names=None):
        os.makedirs(output_dir, exist_ok=True)
        self.output_dir, self.dataset = output_dir, dataset
        self.label_names = getattr(dataset, "label_names", None) or label_names
        self.answers = []

    def label(self, class_id):
        names = self.label_names
        return names[class_id] if names is not None and 0 <= class_id < len(names) else str(class_id)

    def write(self, preds, meta):
        raise NotImplementedError

    def close(self):
        return []


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def file_stem(name):
    """'dir/img_01.jpg' -> 'img_01': the name of the files written for one sample."""
    return os.path.splitext(os.path.basename(str(name)))[0] or str(name)
