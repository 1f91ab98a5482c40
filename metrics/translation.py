"""Machine translation: BLEU and perplexity.

`BLEU` scores the model's decoded `ids` against the evaluation reader's references (the reader
turns ids back into text with `decode` and gives the references with `references()`), with sacrebleu:
- `bleu`: detokenised hypotheses against detokenised references, sacrebleu's own tokenisation (13a);
- `bleu_tok`: Moses-tokenised hypotheses against Moses-tokenised references, no further tokenisation
  (what `multi-bleu.perl` on `*.tok.*` files reports: PaddleNLP's published numbers, e.g. 26.89 for
  base on newstest2014). With BPE data the hypothesis is the model's own tokens with `@@ ` removed;
  with sentencepiece both sides are Moses-tokenised from the detokenised text.
- `loss` (label-smoothed cross entropy per target token, as in training) and `ppl` (exp of the
  unsmoothed per-token negative log-likelihood) from the teacher-forced pass.
Each score's sacrebleu signature is logged when it is computed.

The inference output (`Text`, translations.txt) is in outputs/translation.py.
"""
import logging
import math
import typing

import numpy as np

from engine.errors import ConfigError
from engine.registry import METRICS
from metrics.base import IndexedMetric, to_numpy

log = logging.getLogger("zoo")

# sacrebleu 2.x's tokenisers (sacrebleu.metrics.bleu.BLEU.TOKENIZERS, which BLEU checks against when
# built): written out so that loading the metric module does not import sacrebleu (docs/performance.md#import-costs)
Tokenize = typing.Literal["none", "zh", "13a", "intl", "char", "ja-mecab", "ko-mecab", "spm", "flores101",
                          "flores200", "spBLEU-1K"]


def decode_rows(preds, dataset):
    """[(detokenised, tokenised or None)] for each row of preds['ids'] (cut at preds['ids_len'])."""
    if not hasattr(dataset, "decode"):
        raise ConfigError(f"{type(dataset).__name__} cannot turn token ids into text (no decode())")
    ids = to_numpy(preds["ids"])
    lengths = to_numpy(preds["ids_len"]) if "ids_len" in preds else [ids.shape[1]] * len(ids)
    return [dataset.decode(row[:int(n)]) for row, n in zip(ids, lengths)]


@METRICS.register("BLEU")
class BLEU(IndexedMetric):
    """Corpus BLEU (0-100) on detokenised and on tokenised text, loss and perplexity.

    Args:
        tokenize: sacrebleu's tokenisation of the detokenised text for `bleu` (13a: WMT's
            mteval-v13a, the standard; zh, ja-mecab for those languages; none for pre-tokenised
            text); `bleu_tok` is not re-tokenised.
        lowercase: case-insensitive BLEU (both sides lowercased).
    """

    def __init__(self, tokenize: Tokenize = "13a", lowercase: bool = False):
        super().__init__()
        import sacrebleu  # import cost (docs/performance.md#import-costs), which every tool run would pay: load_all imports this module
        from sacrebleu.metrics.bleu import BLEU as _SacreBLEU
        if tokenize not in _SacreBLEU.TOKENIZERS:
            raise ConfigError(f"metric BLEU: tokenize must be one of {', '.join(_SacreBLEU.TOKENIZERS)}, "
                              f"got {tokenize!r}")
        self.sacrebleu = sacrebleu
        self.tokenize, self.lowercase = tokenize, lowercase
        self._refs = None

    def names(self):
        return ["bleu", "bleu_tok", "loss", "ppl", "num_samples"]

    def set_dataset(self, dataset):
        super().set_dataset(dataset)
        self._refs = None   # read when first needed: inference datasets have none

    def references(self):
        if self._refs is None:
            self._refs = self.dataset.references()
        return self._refs

    def update(self, preds, batch):
        texts = decode_rows(preds, self.dataset)
        rows = {"hyp": [t[0] for t in texts], "hyp_tok": [t[1] for t in texts]}
        for key in ("loss_sum", "nll_sum", "ntokens"):
            if key in preds:
                rows[key] = to_numpy(preds[key]).astype(np.float64)
        self.add(batch["index"], **rows)

    def accumulate(self):
        index, rows = self.collect()
        refs = self.references()
        ref_detok = [refs[i][0] for i in index]
        ref_tok = [refs[i][1] if refs[i][1] is not None else self.dataset.moses_tokenize(refs[i][0]) for i in index]
        hyp_tok = [tok if tok is not None else self.dataset.moses_tokenize(text)
                   for text, tok in zip(rows.get("hyp", []), rows.get("hyp_tok", []))]
        bleu = self.sacrebleu.metrics.BLEU(tokenize=self.tokenize, lowercase=self.lowercase)
        bleu_tok = self.sacrebleu.metrics.BLEU(tokenize="none", lowercase=self.lowercase, force=True)
        out = {"bleu": bleu.corpus_score(list(rows.get("hyp", [])), [ref_detok]).score,
               "bleu_tok": bleu_tok.corpus_score(hyp_tok, [ref_tok]).score}
        log.info("BLEU on %d sentences: bleu %.2f (sacrebleu %s), bleu_tok %.2f (Moses-tokenised, sacrebleu %s)",
                 len(index), out["bleu"], bleu.get_signature(), out["bleu_tok"], bleu_tok.get_signature())
        if "ntokens" in rows and rows["ntokens"].sum() > 0:
            n = rows["ntokens"].sum()
            out["loss"] = float(rows["loss_sum"].sum() / n)
            out["ppl"] = float(math.exp(min(rows["nll_sum"].sum() / n, 700.0)))
        out["num_samples"] = len(index)
        return out
