"""BERT pretraining data: a plain-text corpus made into masked sentence pairs on the fly, and the
HDF5 files of pre-made instances.

Text corpus (google-research/bert `create_pretraining_data.py` format): one sentence per line, a
blank line between documents, UTF-8. The reader indexes it once (file, byte offset, document of
every sentence: ~20 bytes a sentence, the text stays on disk) and makes sample `i` in the worker
from the sentence `i` onward, with a generator seeded by (seed, epoch, i): the same instance for the
same (seed, epoch) whatever the workers, different masks every epoch. An epoch starts one instance
at every sentence, so each token is seen in about (sequence length / sentence length) instances per
epoch, which plays the role of the original's `dupe_factor`.

How one instance is made (facts from `create_instances_from_document`): the target length is
max_seq_length - 3, or with probability `short_seq_prob` (0.1) a random length in [2, that]; whole
sentences are taken until the target is reached; segment A is the first 1..n-1 of them; B is the
rest, or (with probability 0.5, and always when there is one sentence) sentences from a random other
document: then next_sentence_label is 1 (0: B really follows A). The pair is truncated to fit, one
token at a time from the longer segment, at its front or back at random. Masking
(`create_masked_lm_predictions`): round(15% of the tokens), at least 1, at most
`max_predictions_per_seq`, never [CLS]/[SEP]; each chosen token becomes [MASK] 80%, stays 10%,
becomes a random token 10%. With `whole_word_mask` the word pieces of a word (`##` continuations)
are chosen together. One deviation: the random token is drawn from the vocabulary without its
bracketed special entries ([PAD], [CLS], [unused0] ...); the original draws from all of it.

HDF5 (the format of PaddleNLP's / NVIDIA's pretraining data): datasets input_ids, input_mask,
segment_ids [N, S], masked_lm_positions, masked_lm_ids [N, P] (padded with 0), next_sentence_labels
[N]. `write_hdf5` writes instances of the text reader in that format (data/prepare_bert_pretraining.py).
"""
import os

import numpy as np

from engine.errors import ConfigError, SampleError
from engine.data import SampleDataset
from engine.registry import DATASETS
from readers.tokenization import BertTokenizer

SAMPLE_KEYS = ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_label")
_STREAM = 0x42455254  # a generator of its own, apart from the one transforms get for the same sample


class CorpusIndex:
    """(file, byte offset, line number, document) of every sentence of a set of text files."""

    def __init__(self, files):
        self.files = [os.fspath(f) for f in files]
        file_id, offset, line_no, doc = [], [], [], []
        n_docs = 0
        for fi, path in enumerate(self.files):
            if not os.path.isfile(path):
                raise ConfigError(f"corpus file not found: {path}")
            in_doc = False
            with open(path, "rb") as f:
                pos = 0
                for no, line in enumerate(f, 1):
                    if line.strip():
                        if not in_doc:
                            n_docs, in_doc = n_docs + 1, True
                        file_id.append(fi)
                        offset.append(pos)
                        line_no.append(no)
                        doc.append(n_docs - 1)
                    else:
                        in_doc = False
                    pos += len(line)
            # a file ends its last document (the original reads documents per file too)
        if not file_id:
            raise ConfigError(f"corpus {', '.join(self.files) or '(no files)'}: no sentences (the format is "
                              f"one sentence per line, a blank line between documents)")
        self.file_id = np.asarray(file_id, np.int32)
        self.offset = np.asarray(offset, np.int64)
        self.line_no = np.asarray(line_no, np.int64)
        self.doc = np.asarray(doc, np.int64)
        starts = np.flatnonzero(np.r_[True, self.doc[1:] != self.doc[:-1]])
        self.doc_start = starts                                    # first sentence of each document
        self.doc_end = np.r_[starts[1:], len(self.doc)]            # one past its last
        self._handles = (None, {})

    def __len__(self):
        return len(self.doc)

    @property
    def num_docs(self):
        return len(self.doc_start)

    def line(self, i):
        pid, handles = self._handles
        if pid != os.getpid():                # opened per process: a forked worker gets its own
            handles = {}
            self._handles = (os.getpid(), handles)
        fi = int(self.file_id[i])
        if fi not in handles:
            handles[fi] = open(self.files[fi], "rb")
        f = handles[fi]
        f.seek(int(self.offset[i]))
        raw = f.readline()
        try:
            return raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise SampleError(f"{self.files[fi]}:{int(self.line_no[i])}: not UTF-8 ({e.reason} at byte "
                              f"{e.start})") from None

    def where(self, i):
        return f"{self.files[int(self.file_id[i])]}:{int(self.line_no[i])}"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = (None, {})
        return state


class Masker:
    """BERT's masked-LM choice on a token list, with `rng` (numpy Generator)."""

    def __init__(self, tokenizer, masked_lm_prob=0.15, max_predictions_per_seq=20, whole_word_mask=False):
        if not 0.0 < masked_lm_prob < 1.0:
            raise ConfigError(f"masked_lm_prob must be in (0, 1), got {masked_lm_prob}")
        if max_predictions_per_seq < 1:
            raise ConfigError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
        if tokenizer.mask_id is None:
            raise ConfigError(f"{tokenizer.vocab_file}: no [MASK] token, which masked-LM pretraining needs")
        self.prob, self.max_pred, self.wwm = masked_lm_prob, max_predictions_per_seq, whole_word_mask
        self.mask_id = tokenizer.mask_id
        self.never = {tokenizer.cls_id, tokenizer.sep_id}
        words = [i for t, i in tokenizer.vocab.items() if not (t.startswith("[") and t.endswith("]"))]
        self.random_ids = np.asarray(sorted(words), np.int64)
        if not len(self.random_ids):
            raise ConfigError(f"{tokenizer.vocab_file}: no ordinary tokens to draw random replacements from")

    def __call__(self, ids, tokens, rng):
        """(masked ids, positions, original ids) for the token list `ids` (with [CLS]/[SEP])."""
        groups = []
        for i, (tid, tok) in enumerate(zip(ids, tokens)):
            if tid in self.never:
                continue
            if self.wwm and groups and tok.startswith("##") and groups[-1][-1] == i - 1:
                groups[-1].append(i)
            else:
                groups.append([i])
        order = rng.permutation(len(groups))
        num = min(self.max_pred, max(1, int(round(len(ids) * self.prob))))
        out, chosen = list(ids), []
        for g in order:
            if len(chosen) >= num:
                break
            group = groups[g]
            if len(chosen) + len(group) > num:
                continue
            for i in group:
                if rng.random() < 0.8:
                    new = self.mask_id
                elif rng.random() < 0.5:
                    new = ids[i]
                else:
                    new = int(self.random_ids[rng.integers(len(self.random_ids))])
                chosen.append(i)
                out[i] = new
        chosen.sort()
        return out, chosen, [ids[i] for i in chosen]


def truncate_pair_random(a, b, max_tokens, rng):
    """In place: drop a token of the longer segment, from its front or back at random, until it fits."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def as_sample(ids, types, positions, labels, is_random_next):
    return {"input_ids": np.asarray(ids, np.int64), "token_type_ids": np.asarray(types, np.int64),
            "masked_lm_positions": np.asarray(positions, np.int64), "masked_lm_ids": np.asarray(labels, np.int64),
            "next_sentence_label": np.int64(1 if is_random_next else 0)}


@DATASETS.register("BertPretrainText")
class BertPretrainText(SampleDataset):
    """Masked sentence pairs made on the fly from a one-sentence-per-line corpus (module docstring).

    Sample: input_ids, token_type_ids [L]; masked_lm_positions, masked_lm_ids [P];
    next_sentence_label (0: B follows A, 1: B is random). Collate with PadSequences
    (masked_lm_ids padded with -1).

    Args:
        files: the corpus files: one sentence per line, a blank line between documents, UTF-8.
        vocab_file: the WordPiece vocabulary (vocab.txt, one token per line: line i = id i).
        lowercase: lowercase (and strip accents) before WordPiece, as an uncased vocabulary needs;
            false for a cased one.
        max_seq_length: the tokens of a pair with its [CLS] and two [SEP] (>= 5); checked against the
            model's position embeddings.
        max_predictions_per_seq: the most masked positions per instance (BERT: 20 at 128 tokens, 80
            at 512).
        masked_lm_prob: the share of a pair's tokens chosen for masking, in (0, 1).
        short_seq_prob: the probability of a shorter random target length, in [0, 1], so the model
            also sees the short inputs of fine-tuning.
        random_next_prob: the probability that segment B comes from another document
            (next_sentence_label 1), in [0, 1].
        whole_word_mask: choose all word pieces of a word together (`##` continuations).
    """

    SOURCE_KEYS = ("files",)
    def __init__(self, files: list, vocab_file: str, lowercase: bool = True, max_seq_length: int = 128,
                 max_predictions_per_seq: int = 20, masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1,
                 random_next_prob: float = 0.5, whole_word_mask: bool = False, transforms: list = (),
                 seed: int = 0, skip_bad: bool = False):
        super().__init__(transforms, seed, skip_bad)
        if max_seq_length < 5:
            raise ConfigError(f"BertPretrainText: max_seq_length must be >= 5, got {max_seq_length}")
        for name, p in (("short_seq_prob", short_seq_prob), ("random_next_prob", random_next_prob)):
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"BertPretrainText: {name} must be in [0, 1], got {p}")
        if isinstance(files, str):
            files = [files]
        self.tokenizer = BertTokenizer(vocab_file, lowercase=lowercase)
        self.vocab_size = len(self.tokenizer)
        self.masker = Masker(self.tokenizer, masked_lm_prob, max_predictions_per_seq, whole_word_mask)
        self.index = CorpusIndex(files)
        self.max_seq_length, self.short_seq_prob, self.random_next_prob = max_seq_length, short_seq_prob, random_next_prob

    def __len__(self):
        return len(self.index)

    @classmethod
    def write_texts(cls, texts, path, **_):
        """Documents (each a text with one sentence per line) as `path`, a corpus file in the reader's
        format (a blank line between documents), so they take the path a file given to tools/infer.py takes."""
        with open(path, "w", encoding="utf-8") as f:
            for n, text in enumerate(texts):
                if not isinstance(text, str):
                    raise ConfigError(f"BertPretrainText: input {n} must be a text, got a {type(text).__name__}")
                lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
                f.write("\n".join(lines) + "\n\n")
        return path

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """Instances from the given corpus files (tools/infer.py)."""
        return cls(**dict(kwargs, files=list(inputs)))

    def describe(self, index):
        return self.index.where(index)

    def _sentences(self, first, stop, target):
        """Token lists (ids, pieces) of sentences first.. until `target` tokens or `stop`."""
        out, n = [], 0
        while first < stop:
            ids, pieces = self.tokenizer.encode_pieces([self.index.line(first)])[0]
            out.append((ids, pieces))
            n += len(ids)
            first += 1
            if n >= target:
                break
        return out

    def load(self, index):
        rng = np.random.default_rng([self.seed, self.epoch, index, _STREAM])
        ix = self.index
        max_tokens = self.max_seq_length - 3
        target = max_tokens
        if rng.random() < self.short_seq_prob:
            target = int(rng.integers(2, max_tokens + 1))
        doc = int(ix.doc[index])
        chunk = self._sentences(index, int(ix.doc_end[doc]), target)
        a_end = 1 if len(chunk) == 1 else int(rng.integers(1, len(chunk)))
        a = [t for s in chunk[:a_end] for t in zip(*s)]
        is_random = len(chunk) == 1 or rng.random() < self.random_next_prob
        if is_random and ix.num_docs > 1:
            other = doc
            for _ in range(10):            # as the original: ten tries at another document
                other = int(rng.integers(ix.num_docs))
                if other != doc:
                    break
            start = int(rng.integers(ix.doc_start[other], ix.doc_end[other]))
            b = [t for s in self._sentences(start, int(ix.doc_end[other]), max(target - len(a), 1)) for t in zip(*s)]
        elif is_random:                    # a one-document corpus has no other document
            is_random = False
            b = [t for s in chunk[a_end:] for t in zip(*s)]
        else:
            b = [t for s in chunk[a_end:] for t in zip(*s)]
        unk = (self.tokenizer.unk_id, "[UNK]")
        a, b = a or [unk], b or [unk]
        truncate_pair_random(a, b, max_tokens, rng)
        cls, sep = (self.tokenizer.cls_id, "[CLS]"), (self.tokenizer.sep_id, "[SEP]")
        pairs = [cls] + a + [sep] + b + [sep]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        ids, pieces = [p[0] for p in pairs], [p[1] for p in pairs]
        masked, positions, labels = self.masker(ids, pieces, rng)
        return as_sample(masked, types, positions, labels, is_random)


@DATASETS.register("BertPretrainHDF5")
class BertPretrainHDF5(SampleDataset):
    """Pre-made instances in HDF5 files (module docstring); the same sample keys as the text reader,
    trimmed to the real length (input_mask) and to the real masked positions.

    Args:
        files: the HDF5 files of pre-made instances (data/prepare_bert_pretraining.py writes them).
    """

    KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")

    SOURCE_KEYS = ("files",)
    def __init__(self, files: list, transforms: list = (), seed: int = 0, skip_bad: bool = False):
        super().__init__(transforms, seed, skip_bad)
        if isinstance(files, str):
            files = [files]
        self.files, counts = [os.fspath(f) for f in files], []
        import h5py  # import cost (docs/performance.md#import-costs), which every tool run would pay: load_all imports this reader
        for path in self.files:
            if not os.path.isfile(path):
                raise ConfigError(f"HDF5 file not found: {path}")
            try:
                with h5py.File(path, "r") as f:
                    missing = [k for k in self.KEYS if k not in f]
                    if missing:
                        raise ConfigError(f"{path}: no dataset '{missing[0]}' (BERT pretraining HDF5 files hold "
                                          f"{', '.join(self.KEYS)})")
                    n = {k: f[k].shape[0] for k in self.KEYS}
            except OSError as e:
                raise ConfigError(f"{path}: not an HDF5 file ({e})") from None
            if len(set(n.values())) != 1:
                raise ConfigError(f"{path}: datasets of different lengths {n}")
            counts.append(n["input_ids"])
        if not sum(counts):
            raise ConfigError(f"HDF5 files {', '.join(self.files) or '(none)'}: no instances")
        self.ends = np.cumsum(counts)
        self._handles = (None, {})

    def __len__(self):
        return int(self.ends[-1])

    def _locate(self, index):
        fi = int(np.searchsorted(self.ends, index, side="right"))
        return fi, index - (int(self.ends[fi - 1]) if fi else 0)

    def describe(self, index):
        fi, row = self._locate(index)
        return f"{self.files[fi]}[{row}]"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_handles"] = (None, {})
        return state

    def load(self, index):
        fi, row = self._locate(index)
        pid, handles = self._handles
        if pid != os.getpid():
            handles = {}
            self._handles = (os.getpid(), handles)
        if fi not in handles:
            import h5py  # import cost (docs/performance.md#import-costs), which every tool run would pay: load_all imports this reader
            handles[fi] = h5py.File(self.files[fi], "r")
        f = handles[fi]
        try:
            vals = {k: np.asarray(f[k][row]) for k in self.KEYS}
        except (OSError, KeyError) as e:
            raise SampleError(f"{self.describe(index)}: unreadable ({e})") from None
        n = int(vals["input_mask"].sum())
        pos = vals["masked_lm_positions"].astype(np.int64)
        zeros = np.flatnonzero(pos == 0)      # padding of the positions is 0 ([CLS] is never masked)
        p = int(zeros[0]) if len(zeros) else len(pos)
        return as_sample(vals["input_ids"][:n], vals["segment_ids"][:n], pos[:p],
                         vals["masked_lm_ids"][:p], int(vals["next_sentence_labels"]) != 0)


def write_hdf5(path, samples, max_seq_length, max_predictions_per_seq):
    """Write samples (dicts with SAMPLE_KEYS) as a BERT pretraining HDF5 file, padded with zeros."""
    samples = list(samples)
    N, S, P = len(samples), max_seq_length, max_predictions_per_seq
    arrays = {k: np.zeros((N, S), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    arrays.update({k: np.zeros((N, P), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")})
    arrays["next_sentence_labels"] = np.zeros(N, np.int8)
    for i, s in enumerate(samples):
        n, p = len(s["input_ids"]), len(s["masked_lm_positions"])
        if n > S or p > P:
            raise ConfigError(f"instance {i} has {n} tokens / {p} predictions, more than {S} / {P}")
        arrays["input_ids"][i, :n] = s["input_ids"]
        arrays["input_mask"][i, :n] = 1
        arrays["segment_ids"][i, :n] = s["token_type_ids"]
        arrays["masked_lm_positions"][i, :p] = s["masked_lm_positions"]
        arrays["masked_lm_ids"][i, :p] = s["masked_lm_ids"]
        arrays["next_sentence_labels"][i] = s["next_sentence_label"]
    tmp = path + ".partial"
    import h5py  # import cost (docs/performance.md#import-costs), which every tool run would pay: load_all imports this reader
    with h5py.File(tmp, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v, compression="gzip")
    os.replace(tmp, path)
    return path
