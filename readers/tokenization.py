"""BERT WordPiece tokenization from a `vocab.txt`, on Hugging Face `tokenizers` (Rust, kept upstream).

The pipeline is the one of the original BERT tokenizer (facts: google-research/bert
`tokenization.py`, HF `BertTokenizer`): clean text (drop control characters, whitespace to spaces),
put spaces around CJK ideographs, lower-case and strip accents for uncased vocabularies, split on
whitespace and punctuation, then greedy longest-match WordPiece with `##` continuations and
`[UNK]` for a word longer than 100 characters or not coverable. The special tokens are matched
as written in raw text (`[CLS]`, not `[cls]`), as the reference tokenizers do.

Presets: `uncased` (lower-case, accents stripped), `cased` (neither), `chinese` (bert-base-chinese:
lower-case). Pairs are assembled here, not by the library, so truncation is exactly BERT's
`_truncate_seq_pair`: drop the last token of the longer segment (of b on a tie) until it fits.
"""
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.errors import ConfigError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PRESETS = {"uncased": True, "cased": False, "chinese": True}   # preset -> lower-case


def read_vocab(vocab_file):
    """{token: id} with the id of a token its line number, as BERT's vocab files define it."""
    if not vocab_file or not os.path.isfile(vocab_file):
        raise ConfigError(f"vocab file not found: {vocab_file}")
    vocab = {}
    with open(vocab_file, encoding="utf-8") as f:
        for i, line in enumerate(f):
            token = line.rstrip("\n").rstrip("\r")
            if token in vocab:
                raise ConfigError(f"{vocab_file}:{i + 1}: token {token!r} repeats line {vocab[token] + 1}")
            vocab[token] = i
    if not vocab:
        raise ConfigError(f"{vocab_file}: empty vocabulary")
    missing = [t for t in ("[UNK]", "[CLS]", "[SEP]") if t not in vocab]
    if missing:
        raise ConfigError(f"{vocab_file}: not a BERT vocabulary (no {', '.join(missing)})")
    return vocab


class BertTokenizer:
    """WordPiece tokenizer of a BERT vocabulary.

    `encode(a, b=None, max_seq_length=None)` -> (ids, token_type_ids) with [CLS] a [SEP] (b [SEP]);
    `tokenize(text)` -> word pieces (no special tokens); `ids(text)` -> their ids.
    """

    def __init__(self, vocab_file, lowercase=True, strip_accents=None, tokenize_chinese_chars=True,
                 max_input_chars_per_word=100):
        self.vocab_file = vocab_file
        self.vocab = read_vocab(vocab_file)
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self.lowercase = lowercase
        tok = Tokenizer(models.WordPiece(self.vocab, unk_token="[UNK]",
                                         max_input_chars_per_word=max_input_chars_per_word))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                                    strip_accents=strip_accents, lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.add_special_tokens([t for t in SPECIAL_TOKENS if t in self.vocab])
        self._tok = tok
        self.pad_id = self.vocab.get("[PAD]", 0)
        self.unk_id, self.cls_id, self.sep_id = self.vocab["[UNK]"], self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.mask_id = self.vocab.get("[MASK]")
        self.special_ids = {self.vocab[t] for t in SPECIAL_TOKENS if t in self.vocab}

    @classmethod
    def preset(cls, vocab_file, preset="uncased"):
        if preset not in PRESETS:
            raise ConfigError(f"tokenizer preset '{preset}' unknown; known: {', '.join(PRESETS)}")
        return cls(vocab_file, lowercase=PRESETS[preset])

    def __len__(self):
        return len(self.vocab)

    # paddle's DataLoader workers receive the dataset by fork; pickling (spawn) rebuilds the Rust object
    def __getstate__(self):
        return {"vocab_file": self.vocab_file, "lowercase": self.lowercase}

    def __setstate__(self, state):
        self.__init__(state["vocab_file"], lowercase=state["lowercase"])

    def tokenize(self, text):
        return self._tok.encode(text, add_special_tokens=False).tokens

    def ids(self, text):
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_pieces(self, texts):
        """[(ids, tokens)] for many texts at once (the library parallelises the batch)."""
        return [(e.ids, e.tokens) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def build(self, a, b=None, max_seq_length=None):
        """[CLS] a [SEP] (b [SEP]) from id lists, truncated as BERT does; (ids, token_type_ids)."""
        a, b = list(a), (list(b) if b is not None else None)
        if max_seq_length is not None:
            if b is None:
                del a[max(max_seq_length - 2, 0):]
            else:
                truncate_pair(a, b, max_seq_length - 3)
        ids = [self.cls_id] + a + [self.sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += b + [self.sep_id]
            types += [1] * (len(b) + 1)
        return ids, types

    def encode(self, a, b=None, max_seq_length=None):
        return self.build(self.ids(a), None if b is None else self.ids(b), max_seq_length)

    def decode(self, ids):
        return self._tok.decode(list(ids))

    def convert_ids_to_tokens(self, ids):
        return [self.inv_vocab.get(int(i), "[UNK]") for i in ids]


def truncate_pair(a, b, max_length):
    """In place: drop the last token of the longer list (of b on a tie) until len(a)+len(b) fits."""
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
