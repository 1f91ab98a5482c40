"""Train a joint sentencepiece BPE model for translation (source and target text together).

    python data/spm_train.py --input train.en train.de --model-prefix data/wmt/spm --vocab-size 32000

Writes PREFIX.model and PREFIX.vocab with the special pieces the Translation reader and the
Transformer expect, as in PaddleNLP's WMT vocabulary: `<s>` = 0 (begin, also padding), `<e>` = 1
(end), `<unk>` = 2. Pick a vocabulary size that is a multiple of 8 (PaddleNLP pads to one) and
that the text can fill: by default a text that cannot fill it fails, and `--no-hard-limit` returns
fewer pieces instead.
"""
import argparse
import os
import sys

import sentencepiece as spm


def train(inputs, model_prefix, vocab_size, model_type="bpe", character_coverage=1.0,
          max_sentences=0, hard_limit=True, threads=1, quiet=True):
    """Train and return the path of PREFIX.model. Deterministic for given inputs and settings."""
    for path in inputs:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"spm_train: input file not found: {path}")
    os.makedirs(os.path.dirname(os.path.abspath(model_prefix)), exist_ok=True)
    options = dict(
        input=",".join(inputs), model_prefix=model_prefix, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, bos_id=0, eos_id=1, unk_id=2, pad_id=-1,
        bos_piece="<s>", eos_piece="<e>", unk_piece="<unk>", hard_vocab_limit=hard_limit,
        num_threads=threads, input_sentence_size=max_sentences, shuffle_input_sentence=bool(max_sentences))
    with open(os.devnull, "w") if quiet else open(os.dup(sys.stderr.fileno()), "w") as logstream:
        spm.SentencePieceTrainer.train(logstream=logstream, **options)
    return model_prefix + ".model"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files, one sentence per line (both languages)")
    p.add_argument("--model-prefix", required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--character-coverage", type=float, default=1.0)
    p.add_argument("--max-sentences", type=int, default=0, help="sample this many lines (0: all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-hard-limit", action="store_true", help="allow fewer pieces than --vocab-size")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    try:
        path = train(args.input, args.model_prefix, args.vocab_size, args.model_type, args.character_coverage,
                     args.max_sentences, not args.no_hard_limit, args.threads, quiet=not args.verbose)
    except (OSError, RuntimeError) as e:
        print(f"error: {' '.join(str(e).split())[:300]}", file=sys.stderr)
        return 2
    print(f"wrote {path} and {args.model_prefix}.vocab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
