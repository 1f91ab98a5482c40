"""Machine translation: the inference output (text).

`Text` takes preds['text'] (one string per sample), or decodes preds['ids'] through the dataset, and
writes `translations.txt`, one line per input in the input order (by dataset index, whatever order
the batches came in).
"""
import os

from engine.errors import ConfigError
from engine.registry import OUTPUTS
from metrics.translation import decode_rows
from outputs.base import OutputWriter


@OUTPUTS.register("Text")
class Text(OutputWriter):
    """translations.txt, one line per input, in input order.

    Args:
        file_name: the name of the file written in the output folder (a plain name, no folder).
    """

    def __init__(self, file_name: str = "translations.txt"):
        if not file_name or os.path.basename(file_name) != file_name:
            raise ConfigError(f"infer Text: file_name must be a plain file name, got {file_name!r}")
        self.file_name = file_name

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.lines = {}

    def write(self, preds, meta):
        if "text" in preds:
            texts = list(preds["text"])
        elif "ids" in preds:
            texts = [detok for detok, _ in decode_rows(preds, self.dataset)]
        else:
            raise ConfigError(f"infer Text: predictions have no 'text' nor 'ids' (keys: {sorted(preds)})")
        empty = getattr(self.dataset, "source_is_empty", lambda i: False)
        out = []
        for j, (index, text) in enumerate(zip(meta["index"], texts)):
            text = "" if empty(int(index)) else str(text).replace("\n", " ")   # an empty line stays empty
            self.lines[int(index)] = text
            self.answers.append({"id": str(meta["id"][j]) if "id" in meta else str(int(index)), "translation": text})
            out.append(text)
        return out

    def close(self):
        path = os.path.join(self.output_dir, self.file_name)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(self.lines[i] + "\n" for i in sorted(self.lines))
        os.replace(path + ".tmp", path)
        return [path]
