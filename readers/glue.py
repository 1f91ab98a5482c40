"""GLUE tasks from their official TSV files (the GLUE download's `<TASK>/train.tsv`, `dev.tsv`, `test.tsv`).

Each task reads its own columns, as the reference processors do (google-research/bert
`run_classifier.py`, HF `glue.py`), splitting lines on tabs with no quote processing (the files
contain unbalanced quotes). Column numbers (0-based) and labels:

| task | train/dev: text_a, text_b, label | header | test: id, text_a, text_b | labels |
|---|---|---|---|---|
| CoLA | 3, -, 1 | no | 0, 1, - | 0, 1 |
| SST-2 | 0, -, 1 | yes | 0, 1, - | 0, 1 |
| MRPC | 3, 4, 0 | yes | 0, 3, 4 | 0, 1 |
| STS-B | 7, 8, 9 (score 0-5) | yes | 0, 7, 8 | regression |
| QQP | 3, 4, 5 | yes | 0, 1, 2 | 0, 1 |
| MNLI | 8, 9, last | yes | 0, 8, 9 | contradiction, entailment, neutral |
| QNLI | 1, 2, 3 | yes | 0, 1, 2 | entailment, not_entailment |
| RTE | 1, 2, 3 | yes | 0, 1, 2 | entailment, not_entailment |

MNLI has two dev (and test) sets: `split: dev` reads dev_matched.tsv and dev_mismatched.tsv and
tags each sample with `subset` (0 matched, 1 mismatched) so that the metric reports `accuracy` and
`accuracy_mm` from one evaluation. Samples: input_ids, token_type_ids (truncated to
`max_seq_length` as BERT does), label (int64 class, float32 score for STS-B; not in test), guid
(the test file's id, for the submission file). A missing column or an unknown label is one line
naming the file and line.
"""
import dataclasses
import os
import typing

import numpy as np

from engine.data import SampleDataset
from engine.errors import ConfigError, did_you_mean
from engine.registry import DATASETS
from readers.tokenization import BertTokenizer


@dataclasses.dataclass
class Task:
    name: str
    labels: tuple            # None: regression
    metrics: tuple
    columns: tuple           # train/dev: (text_a, text_b or None, label)
    test_columns: tuple      # (id, text_a, text_b or None)
    header: bool = True      # train/dev files start with a header line (test files always do)
    dev_files: tuple = ("dev.tsv",)
    test_files: tuple = ("test.tsv",)
    submission: tuple = None  # GLUE leaderboard file name per subset


TASKS = {t.name: t for t in [
    Task("CoLA", ("0", "1"), ("mcc",), (3, None, 1), (0, 1, None), header=False),
    Task("SST-2", ("0", "1"), ("accuracy",), (0, None, 1), (0, 1, None)),
    Task("MRPC", ("0", "1"), ("accuracy", "f1"), (3, 4, 0), (0, 3, 4)),
    Task("STS-B", None, ("pearson", "spearman"), (7, 8, 9), (0, 7, 8)),
    Task("QQP", ("0", "1"), ("accuracy", "f1"), (3, 4, 5), (0, 1, 2)),
    Task("MNLI", ("contradiction", "entailment", "neutral"), ("accuracy", "accuracy_mm"), (8, 9, -1), (0, 8, 9),
         dev_files=("dev_matched.tsv", "dev_mismatched.tsv"), test_files=("test_matched.tsv", "test_mismatched.tsv"),
         submission=("MNLI-m.tsv", "MNLI-mm.tsv")),
    Task("QNLI", ("entailment", "not_entailment"), ("accuracy",), (1, 2, 3), (0, 1, 2)),
    Task("RTE", ("entailment", "not_entailment"), ("accuracy",), (1, 2, 3), (0, 1, 2)),
]}


def get_task(name):
    if name not in TASKS:
        raise ConfigError(f"GLUE task '{name}' unknown{did_you_mean(name, TASKS)}; known: {', '.join(TASKS)}")
    return TASKS[name]


def read_tsv(path, task, test):
    """[(guid, text_a, text_b, label_or_None)] of one file; one-line errors for bad rows."""
    if not os.path.isfile(path):
        raise ConfigError(f"GLUE {task.name}: file not found: {path}")
    if test:
        (guid_col, a_col, b_col), label_col = task.test_columns, None
    else:
        guid_col, (a_col, b_col, label_col) = None, task.columns
    header_line, header = test or task.header, []
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if no == 1 and header_line:
                header = line.split("\t")
                continue
            if not line.strip():
                continue
            parts = line.split("\t")
            need = [c for c in (guid_col, a_col, b_col, label_col) if c is not None]
            for c in need:
                if (c >= len(parts)) if c >= 0 else (-c > len(parts)):
                    name = f" ('{header[c]}')" if header_line and -len(header) <= c < len(header) else ""
                    raise ConfigError(f"{path}:{no}: {len(parts)} tab-separated columns; GLUE {task.name} needs "
                                      f"column {c + 1 if c >= 0 else len(parts) + c + 1}{name}")
            label = None
            if label_col is not None:
                label = parts[label_col].strip()
                if task.labels is None:
                    try:
                        label = float(label)
                    except ValueError:
                        raise ConfigError(f"{path}:{no}: score {label!r} is not a number ({task.name})") from None
                elif label not in task.labels:
                    raise ConfigError(f"{path}:{no}: label {label!r} is not one of {task.name}'s labels "
                                      f"({', '.join(task.labels)})")
            guid = parts[guid_col] if guid_col is not None else str(len(rows))
            rows.append((guid, parts[a_col], parts[b_col] if b_col is not None else None, label))
    return rows


@DATASETS.register("GLUE")
class GLUE(SampleDataset):
    """One GLUE task's split, tokenized on the fly (module docstring).

    Args:
        task: the GLUE task: its TSV columns, labels and metrics.
        vocab_file: the BERT WordPiece vocabulary (vocab.txt) of the model.
        data_dir: the folder holding the task's TSV files (train.tsv, dev.tsv, test.tsv; MNLI's
            matched and mismatched files).
        split: which of the task's files are read; `test` has no labels (GLUE's server scores it).
        files: TSV files in the task's layout read instead of the split's (your own data).
        lowercase: lowercase (and strip accents) before WordPiece, as an uncased vocabulary needs.
        max_seq_length: the tokens of `[CLS] a [SEP] b [SEP]`; longer pairs are truncated (>= 3);
            checked against the model's position embeddings.
    """

    SOURCE_KEYS = ("data_dir", "split", "files")
    def __init__(self, task: typing.Literal[tuple(TASKS)], vocab_file: str, data_dir: str = "",
                 split: typing.Literal["train", "dev", "test"] = "train", files: list = None,
                 lowercase: bool = True, max_seq_length: int = 128, transforms: list = (), seed: int = 0,
                 skip_bad: bool = False):
        super().__init__(transforms, seed, skip_bad)
        self.task = get_task(task)
        if split not in ("train", "dev", "test"):
            raise ConfigError(f"GLUE: split must be train, dev or test, got '{split}'")
        if max_seq_length < 3:
            raise ConfigError(f"GLUE: max_seq_length must be >= 3, got {max_seq_length}")
        if files is None:
            names = {"train": ("train.tsv",), "dev": self.task.dev_files, "test": self.task.test_files}[split]
            files = [os.path.join(data_dir, n) for n in names]
        elif isinstance(files, str):
            files = [files]
        self.split, self.files, self.max_seq_length = split, list(files), max_seq_length
        self.tokenizer = BertTokenizer(vocab_file, lowercase=lowercase)
        self.vocab_size = len(self.tokenizer)
        self.rows, self.subset = [], []
        for path in self.files:
            rows = read_tsv(path, self.task, test=split == "test")
            # MNLI: the second file of a split (or a file named *mismatched*) is the mismatched set
            mm = int("mismatched" in os.path.basename(path) or (len(self.files) == 2 and path == self.files[1]))
            self.rows += rows
            self.subset += [mm] * len(rows)
        if not self.rows:
            raise ConfigError(f"GLUE {self.task.name}: no examples in {', '.join(self.files)}")
        self.num_classes = len(self.task.labels) if self.task.labels else 1
        self.label_names = list(self.task.labels) if self.task.labels else None
        self.labelled = split != "test"

    def __len__(self):
        return len(self.rows)

    def describe(self, index):
        return str(self.rows[index][0])

    def load(self, index):
        guid, a, b, label = self.rows[index]
        ids, types = self.tokenizer.encode(a, b, self.max_seq_length)
        sample = {"input_ids": np.asarray(ids, np.int64), "token_type_ids": np.asarray(types, np.int64),
                  "guid": guid}
        if self.task.name == "MNLI":
            sample["subset"] = np.int64(self.subset[index])
        if label is not None:
            sample["label"] = (np.float32(label) if self.task.labels is None
                               else np.int64(self.task.labels.index(label)))
        return sample

    @classmethod
    def write_texts(cls, texts, path, task, **_):
        """`texts` (a sentence, or a pair (a, b) for the pair tasks) as `path`, a TSV in the task's test
        layout that for_inputs reads: what an inferencer turns sentences into, so they take the path a
        file given to tools/infer.py takes. The ids are 0, 1, ... in order."""
        spec = get_task(task)
        id_col, a_col, b_col = spec.test_columns
        width = max(c for c in spec.test_columns if c is not None) + 1
        rows = []
        for n, text in enumerate(texts):
            pair = isinstance(text, (tuple, list))
            if pair != (b_col is not None) or (pair and len(text) != 2):
                want = "a pair of sentences [a, b]" if b_col is not None else "one sentence"
                raise ConfigError(f"GLUE {spec.name}: input {n} must be {want}, got {text!r:.80}")
            cells = [""] * width
            cells[id_col] = str(n)
            for col, value in zip((a_col, b_col), text if pair else (text,)):
                if not isinstance(value, str):
                    raise ConfigError(f"GLUE {spec.name}: input {n} holds a {type(value).__name__}, not text")
                cells[col] = " ".join(value.split())   # a tab or newline would split the row
            rows.append("\t".join(cells))
        with open(path, "w", encoding="utf-8") as f:
            f.write("\t".join(f"col{i}" for i in range(width)) + "\n")
            f.writelines(row + "\n" for row in rows)
        return path

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """The given TSV files read in the task's test layout (tools/infer.py)."""
        kwargs = dict(kwargs, split="test", files=list(inputs))
        return cls(**kwargs)
