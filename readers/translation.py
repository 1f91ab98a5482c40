"""Parallel text for translation: one sentence per line, line i of the source file translated by line i
of the target file, turned into token ids by one of two tokenisation paths.

- `spm_model`: a sentencepiece model over both languages (one joint vocabulary; `tools/spm_train.py`
  trains one with `<s>`/`<e>`/`<unk>` = 0/1/2). The default for new models.
- `vocab` + `bpe_codes`: PaddleNLP's WMT14 en-de pipeline (`gen_data.sh`): Moses tokenisation
  (`tokenizer.perl -l LANG`, escaping on, no aggressive hyphen splitting; sacremoses here), then
  subword-nmt BPE with its codes and the `@@ ` separator, looked up in a vocabulary file with one
  token per line whose first three lines are `<s>`, `<e>`, `<unk>` (ids 0, 1, 2). Its prepared files
  are already tokenised and BPE-split: `input_format: bpe` reads them as they are (`tok`: Moses-
  tokenised, BPE still to apply; `raw`: plain text).

Samples: `src_ids` (source + `<e>`), and with a target `tgt_in` (`<s>` + target) and `tgt_out`
(target + `<e>`), int64, as PaddleNLP's `prepare_train_input`. Everything is tokenised once when the
reader is built, so `lengths()` (for the TokenBudget sampler) costs nothing and `load()` is a slice.
Line pairs with an empty side are skipped and counted (`data_faults`); `max_len` drops pairs whose
longer side, plus its `<s>`/`<e>`, exceeds it (PaddleNLP's `min_max_filer`).
The vocabulary size is padded up to a multiple of `pad_vocab_to` (PaddleNLP's `pad_factor` 8:
33708 -> 33712) and reported as `num_classes`, which the engine checks against the model.
"""
import inspect
import logging
import os
import sys
import typing

import numpy as np
import sentencepiece as spm
from subword_nmt.apply_bpe import BPE

from engine.data import SampleDataset
from engine.errors import ConfigError
from engine.registry import DATASETS
from engine.weights.pretrained import resolve_asset

log = logging.getLogger("zoo")

BPE_SEPARATOR = "@@"
FIT_LINES = 1000          # lines read to check that a tokenizer fits its vocabulary
MAX_UNKNOWN_RATE = 0.05   # more unknown tokens than this means codes/model and vocabulary disagree


def _read_lines(path, what):
    if path == "-":
        return [line.rstrip("\r\n") for line in sys.stdin]
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: {path} is not UTF-8 text (byte {e.start})") from None


# ------------------------------------------------------------------------------------ tokenizers

class SentencePieceTokenizer:
    """Joint sentencepiece model: text <-> ids; the vocabulary is the model's pieces."""

    def __init__(self, model_file, bos_token, eos_token, unk_token):
        if not os.path.isfile(model_file):
            raise ConfigError(f"spm_model: file not found: {model_file}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=model_file)
        except Exception as e:  # noqa: BLE001  sentencepiece raises RuntimeError/OSError on a bad file
            raise ConfigError(f"spm_model {model_file}: not a sentencepiece model ({str(e).splitlines()[0][:100]})") from None
        self.path = model_file
        self.size = self.sp.get_piece_size()
        self.tokens = [self.sp.id_to_piece(i) for i in range(self.size)]
        wanted = {"bos": (bos_token, self.sp.bos_id()), "eos": (eos_token, self.sp.eos_id()),
                  "unk": (unk_token, self.sp.unk_id())}
        for role, (token, sp_id) in wanted.items():
            if sp_id < 0 or self.tokens[sp_id] != token:
                have = f"'{self.tokens[sp_id]}' (id {sp_id})" if sp_id >= 0 else "none"
                raise ConfigError(f"spm_model {model_file}: its {role} piece is {have}, the reader expects "
                                  f"'{token}'; train it with data/spm_train.py (<s>/<e>/<unk> = 0/1/2) or set "
                                  f"reader {role}_token")
        self.unk_id = self.sp.unk_id()

    def encode_many(self, lines):
        return self.sp.encode(list(lines), out_type=int)

    def decode(self, ids):
        """(detokenised text, text tokenised for bleu_tok: None = Moses-tokenise the detokenised text)."""
        return self.sp.decode([int(i) for i in ids]), None

    def reference(self, line):
        return line, None


class MosesBPETokenizer:
    """PaddleNLP's WMT pipeline: Moses tokenisation, subword-nmt BPE, a vocabulary file."""

    def __init__(self, vocab_file, bpe_codes, lang, input_format, bos_token, eos_token, unk_token):
        import sacremoses  # import cost (docs/performance.md#import-costs): load_all imports this reader in every tool run
        self.path = vocab_file
        self.tokens = [line.split()[0] if line.split() else "" for line in _read_lines(vocab_file, "vocab")]
        if not self.tokens:
            raise ConfigError(f"vocab {vocab_file}: empty vocabulary")
        self.size = len(self.tokens)
        self.index = {}
        for i, tok in enumerate(self.tokens):
            self.index.setdefault(tok, i)
        for role, token in (("bos", bos_token), ("eos", eos_token), ("unk", unk_token)):
            if token not in self.index:
                raise ConfigError(f"vocab {vocab_file}: no '{token}' line (reader {role}_token)")
        self.unk_id = self.index[unk_token]
        self.input_format, self.lang = input_format, lang
        self.moses = sacremoses.MosesTokenizer(lang=lang)
        self.detok = sacremoses.MosesDetokenizer(lang=lang)
        self.bpe = None
        if input_format in ("raw", "tok"):
            if not bpe_codes:
                raise ConfigError(f"reader: input_format '{input_format}' needs bpe_codes (or give files "
                                  f"already split into subwords with input_format: bpe)")
            if not os.path.isfile(bpe_codes):
                raise ConfigError(f"bpe_codes: file not found: {bpe_codes}")
            try:
                with open(bpe_codes, encoding="utf-8") as f:
                    self.bpe = BPE(f, separator=BPE_SEPARATOR)
            except Exception as e:  # noqa: BLE001  subword-nmt raises ValueError/IndexError on a foreign file
                raise ConfigError(f"bpe_codes {bpe_codes}: not a subword-nmt codes file "
                                  f"({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})") from None
            self.codes = bpe_codes

    def subwords(self, line):
        if self.input_format == "raw":
            line = self.moses.tokenize(line, return_str=True, escape=True)
        if self.bpe is not None:
            line = self.bpe.process_line(line)
        return line.split()

    def encode_many(self, lines):
        get, unk = self.index.get, self.unk_id
        return [[get(t, unk) for t in self.subwords(line)] for line in lines]

    def decode(self, ids):
        words = " ".join(self.tokens[int(i)] for i in ids if 0 <= int(i) < self.size)
        tok = (words + " ").replace(BPE_SEPARATOR + " ", "").strip()   # sed -r 's/(@@ )|(@@ ?$)//g'
        return self.detok.detokenize(tok.split()), tok

    def reference(self, line):
        """(detokenised, tokenised) text of a target line in this reader's input format."""
        if self.input_format == "raw":
            return line, None
        tok = (line + " ").replace(BPE_SEPARATOR + " ", "").strip() if self.input_format == "bpe" else line
        return self.detok.detokenize(tok.split()), tok


# ------------------------------------------------------------------------------------ dataset

@DATASETS.register("Translation")
class Translation(SampleDataset):
    """A parallel corpus (or a source file alone, for inference); see the module docstring.

    Args:
        src_file: the source sentences, one per line (`-`: standard input); required.
        tgt_file: the target sentences, line i translating line i of `src_file` (none: inference).
        spm_model: a joint sentencepiece model of both languages (a path, or `ENTRY:ASSET` of a
            pretrained entry); give it or `vocab`.
        vocab: a token-per-line vocabulary for the Moses + BPE path (first lines `<s>`, `<e>`,
            `<unk>`); a path or `ENTRY:ASSET`.
        bpe_codes: the subword-nmt BPE codes applied before the `vocab` lookup (not needed with
            `input_format: bpe`).
        input_format: what the files hold on the Moses + BPE path: `raw` text, `tok` (Moses-tokenised,
            BPE still to apply) or `bpe` (tokenised and BPE-split, as PaddleNLP's prepared WMT14
            files); a sentencepiece model reads `raw` only.
        src_lang: the source language code for Moses tokenisation and detokenisation.
        tgt_lang: the target language code, for the same.
        bos_token: the begin-of-sentence token, prefixed to the decoder input.
        eos_token: the end-of-sentence token, appended to the source and the target.
        unk_token: the token of out-of-vocabulary pieces.
        pad_token: the token padding batches (default: `bos_token`, as PaddleNLP pads with id 0).
        bos_id: the id `bos_token` must have: a vocabulary where it differs does not fit the recipe.
        eos_id: the id `eos_token` must have.
        unk_id: the id `unk_token` must have.
        pad_vocab_to: the vocabulary size is padded up to a multiple of this (PaddleNLP's pad_factor
            8: 33708 -> 33712), the size the model's embedding and output layer must have.
        max_len: drop pairs whose longer side plus its `<s>`/`<e>` is longer than this (>= 2; none:
            keep all).
    """

    SOURCE_KEYS = ("src_file", "tgt_file")
    def __init__(self, src_file: str = None, tgt_file: str = None, spm_model: str = None, vocab: str = None,
                 bpe_codes: str = None, input_format: typing.Literal["raw", "tok", "bpe"] = "raw", src_lang: str = "en", tgt_lang: str = "de",
                 bos_token: str = "<s>", eos_token: str = "<e>", unk_token: str = "<unk>", pad_token: str = None,
                 bos_id: int = 0, eos_id: int = 1, unk_id: int = 2, pad_vocab_to: int = 8, max_len: int = None,
                 transforms: list = (), seed: int = 0, skip_bad: bool = False):
        super().__init__(transforms, seed, skip_bad)
        self._tokenizers(spm_model, vocab, bpe_codes, input_format, src_lang, tgt_lang, bos_token, eos_token,
                         unk_token, pad_token, bos_id, eos_id, unk_id, pad_vocab_to)
        if max_len is not None and max_len < 2:
            raise ConfigError(f"reader Translation: max_len must be >= 2, got {max_len}")
        if not src_file:
            raise ConfigError("reader Translation: src_file is required")
        src_lines = _read_lines(src_file, "src_file")
        tgt_lines = _read_lines(tgt_file, "tgt_file") if tgt_file else None
        if tgt_lines is not None and len(tgt_lines) != len(src_lines):
            raise ConfigError(f"reader Translation: {src_file} has {len(src_lines)} lines but {tgt_file} has "
                              f"{len(tgt_lines)}; the files of a parallel corpus must align line by line")
        self.src_file, self.tgt_file = src_file, tgt_file
        self._input_names = None
        self._build(src_lines, tgt_lines, max_len, skip_empty=True)

    def _tokenizers(self, spm_model, vocab, bpe_codes, input_format, src_lang, tgt_lang, bos_token, eos_token,
                    unk_token, pad_token, bos_id, eos_id, unk_id, pad_vocab_to):
        if (spm_model is None) == (vocab is None):
            raise ConfigError("reader Translation: give spm_model (sentencepiece) or vocab (+ bpe_codes), one of them")
        if input_format not in ("raw", "tok", "bpe"):
            raise ConfigError(f"reader Translation: input_format must be raw, tok or bpe, got {input_format!r}")
        if spm_model is not None and input_format != "raw":
            raise ConfigError("reader Translation: a sentencepiece model reads raw text (input_format: raw)")
        if pad_vocab_to < 1:
            raise ConfigError(f"reader Translation: pad_vocab_to must be >= 1, got {pad_vocab_to}")
        spm_model, vocab, bpe_codes = (resolve_asset(x) if x else x for x in (spm_model, vocab, bpe_codes))
        if spm_model is not None:
            self.src_tok = self.tgt_tok = SentencePieceTokenizer(spm_model, bos_token, eos_token, unk_token)
        else:
            self.src_tok = MosesBPETokenizer(vocab, bpe_codes, src_lang, input_format, bos_token, eos_token, unk_token)
            self.tgt_tok = self.src_tok if src_lang == tgt_lang else \
                MosesBPETokenizer(vocab, bpe_codes, tgt_lang, input_format, bos_token, eos_token, unk_token)
        tok, what = self.src_tok, f"spm_model {spm_model}" if spm_model else f"vocab {vocab}"
        pad_token = pad_token or bos_token
        for role, token, want in (("bos", bos_token, bos_id), ("eos", eos_token, eos_id), ("unk", unk_token, unk_id)):
            have = tok.tokens.index(token) if token in tok.tokens else -1
            if have != want:
                raise ConfigError(f"{what}: '{token}' has id {have}, the recipe expects {role}_id {want}; this "
                                  f"vocabulary does not fit the recipe")
        if pad_token not in tok.tokens:
            raise ConfigError(f"{what}: no pad token '{pad_token}'")
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, tok.tokens.index(pad_token)
        self.vocab_size = tok.size
        self.num_classes = -(-tok.size // pad_vocab_to) * pad_vocab_to
        self.tgt_lang = tgt_lang

    # ---------------------------------------------------------------- building
    def _build(self, src_lines, tgt_lines, max_len, skip_empty):
        n = len(src_lines)
        keep = np.ones(n, dtype=bool)
        if skip_empty:
            keep &= np.array([bool(line.strip()) for line in src_lines], dtype=bool)
            if tgt_lines is not None:
                keep &= np.array([bool(line.strip()) for line in tgt_lines], dtype=bool)
        self.empty = int(n - keep.sum())
        self._summary = ""
        if self.empty:
            first = self._line_name(int(np.argmin(keep)))
            self._summary = f"{self.empty} line pairs with an empty side skipped (first at {first})"
            log.warning("reader Translation: %s", self._summary)
        lines = np.nonzero(keep)[0]
        self.src = _Packed.encode(self.src_tok, [src_lines[i].strip() for i in lines])
        self._check_fit(self.src, self.src_tok, getattr(self, "src_file", None) or "the input")
        self.tgt = None
        if tgt_lines is not None:
            self.tgt = _Packed.encode(self.tgt_tok, [tgt_lines[i].strip() for i in lines])
            self._check_fit(self.tgt, self.tgt_tok, self.tgt_file)
        self.filtered = 0
        if max_len is not None and self.tgt is not None:
            ok = np.maximum(self.src.lengths, self.tgt.lengths) + 1 <= max_len
            self.filtered = int(len(ok) - ok.sum())
            if self.filtered:
                log.info("reader Translation: %d of %d line pairs are longer than max_len %d and left out",
                         self.filtered, len(ok), max_len)
                self.src, self.tgt, lines = self.src.subset(ok), self.tgt.subset(ok), lines[ok]
        self.lines = lines.astype(np.int64)    # dataset index -> line number (0-based)

    def _check_fit(self, packed, tok, path):
        """Most tokens of the first lines must be known: BPE codes or a vocabulary made for other data
        (or each other) turn words into unknown subwords."""
        m = min(FIT_LINES, len(packed))
        first = packed.data[:packed.offsets[m]]
        if not len(first):
            return
        rate = float((first == tok.unk_id).mean())
        if rate > MAX_UNKNOWN_RATE:
            what = (f"bpe_codes {tok.codes} and vocab {tok.path}" if getattr(tok, "bpe", None) is not None
                    else f"vocab {tok.path}" if isinstance(tok, MosesBPETokenizer) else f"spm_model {tok.path}")
            raise ConfigError(f"reader Translation: {100 * rate:.1f}% of the tokens of the first {m} lines of "
                              f"{path} are unknown (<unk>): {what} do not fit each other or this text")

    # ---------------------------------------------------------------- the dataset contract
    def __len__(self):
        return len(self.lines)

    def load(self, index):
        src = self.src[index]
        sample = {"src_ids": np.concatenate([src, [self.eos_id]]).astype(np.int64)}
        if self.tgt is not None:
            tgt = self.tgt[index]
            sample["tgt_in"] = np.concatenate([[self.bos_id], tgt]).astype(np.int64)
            sample["tgt_out"] = np.concatenate([tgt, [self.eos_id]]).astype(np.int64)
        return sample

    def describe(self, index):
        return self._line_name(int(self.lines[index]))

    def _line_name(self, line):
        if self._input_names is not None:
            return self._input_names[line]
        return f"{self.src_file}:{line + 1}"

    def lengths(self):
        """[N, 2]: the lengths of `src_ids` and `tgt_in` (a sentence plus one special token)."""
        src = self.src.lengths + 1
        return src if self.tgt is None else np.stack([src, self.tgt.lengths + 1], axis=1)

    def source_is_empty(self, index):
        """An empty input line (inference keeps them, so that output lines match input lines)."""
        return self.src.lengths[index] == 0

    def data_faults(self):
        return {"records_lost": self.empty, "summary": self._summary}

    # ---------------------------------------------------------------- text for metrics and output
    def decode(self, ids):
        """Model output ids -> (detokenised text, tokenised text for bleu_tok or None); stops at <e>."""
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tgt_tok.decode([i for i in ids if i not in (self.bos_id, self.pad_id)])

    def references(self):
        """Per dataset index the reference (detokenised, tokenised or None), read from tgt_file."""
        if not getattr(self, "tgt_file", None):
            raise ConfigError("reader Translation: BLEU needs the references: give tgt_file in the evaluation reader")
        lines = _read_lines(self.tgt_file, "tgt_file")
        return [self.tgt_tok.reference(lines[i].strip()) for i in self.lines]

    def moses_tokenize(self, text):
        """Moses tokenisation of the target language (escaped, as tokenizer.perl), for bleu_tok."""
        if getattr(self, "_moses", None) is None:
            import sacremoses  # import cost (docs/performance.md#import-costs): load_all imports this reader in every tool run
            self._moses = sacremoses.MosesTokenizer(lang=self.tgt_lang)
        return self._moses.tokenize(text, return_str=True, escape=True)

    @classmethod
    def write_texts(cls, texts, path, **_):
        """Source sentences as `path`, one per line (a newline inside one becomes a space): what an
        inferencer turns sentences into, so they take the path a file given to tools/infer.py takes."""
        with open(path, "w", encoding="utf-8") as f:
            for n, text in enumerate(texts):
                if not isinstance(text, str):
                    raise ConfigError(f"Translation: input {n} must be a sentence, got a {type(text).__name__}")
                f.write(" ".join(text.split()) + "\n")
        return path

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """Source sentences from text files or stdin ('-'), one per line, every line translated (an empty
        line gives an empty translation), with the tokenisation of the recipe's reader `kwargs`."""
        lines, names = [], []
        for path in inputs:
            got = _read_lines(path, "--input")
            lines += got
            names += [f"{'<stdin>' if path == '-' else path}:{n + 1}" for n in range(len(got))]
        for key in ("src_file", "tgt_file", "max_len"):
            kwargs.pop(key, None)
        self = cls.__new__(cls)
        SampleDataset.__init__(self, kwargs.pop("transforms", ()), kwargs.pop("seed", 0), kwargs.pop("skip_bad", False))
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                    if k not in ("self", "src_file", "tgt_file", "max_len", "transforms", "seed", "skip_bad")}
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise ConfigError(f"reader Translation: unknown keys {sorted(unknown)}")
        defaults.update(kwargs)
        self._tokenizers(**defaults)
        self.src_file, self.tgt_file = None, None
        self._input_names = names
        self._build(lines, None, None, skip_empty=False)
        return self


class _Packed:
    """Many int sequences in one flat array + offsets: compact for millions of sentences and cheap to
    fork into DataLoader workers."""

    CHUNK = 100_000

    def __init__(self, lengths, data):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.data = data

    @classmethod
    def encode(cls, tok, lines):
        """Tokenise in chunks, so a large corpus never exists as Python lists of ints all at once."""
        lengths, parts = [], []
        for start in range(0, len(lines), cls.CHUNK):
            seqs = tok.encode_many(lines[start:start + cls.CHUNK])
            lengths.append(np.array([len(s) for s in seqs], dtype=np.int64))
            parts.append(np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(lengths[-1].sum())))
        data = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return cls(np.concatenate(lengths) if lengths else np.zeros(0, np.int64), data)

    def subset(self, keep):
        return _Packed(self.lengths[keep], self.data[np.repeat(keep, self.lengths)])

    def __getitem__(self, i):
        return self.data[self.offsets[i]:self.offsets[i + 1]]

    def __len__(self):
        return len(self.lengths)
