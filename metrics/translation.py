"""Machine translation: the inference output (text).

`Text` takes preds['text'] (one detokenised string per sample) and writes `translations.txt`,
one line per input in the input order (by dataset index, whatever order the batches came in).
"""
import os

from engine.registry import OUTPUTS, ConfigError
from metrics.base import OutputWriter


@OUTPUTS.register("Text")
class Text(OutputWriter):
    """translations.txt, one line per input, in input order."""

    def __init__(self, file_name: str = "translations.txt"):
        if not file_name or os.path.basename(file_name) != file_name:
            raise ConfigError(f"infer Text: file_name must be a plain file name, got {file_name!r}")
        self.file_name = file_name

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.lines = {}

    def write(self, preds, meta):
        if "text" not in preds:
            raise ConfigError(f"infer Text: predictions have no 'text' (keys: {sorted(preds)})")
        out = []
        for index, text in zip(meta["index"], preds["text"]):
            text = str(text).replace("\n", " ")
            self.lines[int(index)] = text
            out.append(text)
        return out

    def close(self):
        path = os.path.join(self.output_dir, self.file_name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(self.lines[i] + "\n" for i in sorted(self.lines))
        os.replace(path + ".tmp", path)
        return [path]
