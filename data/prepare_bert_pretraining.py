"""Pre-made BERT pretraining instances in HDF5 from a text corpus (one sentence per line, blank line
between documents), in the format PaddleNLP's and NVIDIA's pretraining scripts read.

python data/prepare_bert_pretraining.py --corpus data/bert_corpus/train.txt --vocab data/bert_corpus/vocab.txt \\
    --out data/bert_corpus/train.hdf5 [--dupe-factor 5 --max-seq-length 128 --max-predictions 20 --seed 12345]

Instance i of pass k is the `BertPretrainText` reader's sample i at epoch k: `--dupe-factor` passes
over the corpus with different masks, as the original script's dupe_factor (defaults from
create_pretraining_data.py). Then train with reader.train: {name: BertPretrainHDF5, files: [...]}.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.cli import run  # noqa: E402  (no paddle: the flags are parsed first)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--cased", action="store_true", help="do not lower-case (cased vocabularies)")
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument("--seed", type=int, default=12345)
    args = p.parse_args(argv)

    def job():
        # after parsing: --help answers without loading paddle (docs/performance.md#import-costs)
        from readers.bert_pretrain import BertPretrainText, write_hdf5
        ds = BertPretrainText(files=args.corpus, vocab_file=args.vocab, lowercase=not args.cased,
                              max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions,
                              masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
                              whole_word_mask=args.whole_word_mask, seed=args.seed)

        def instances():
            for epoch in range(args.dupe_factor):
                ds.set_epoch(epoch)
                for i in range(len(ds)):
                    yield ds[i]

        write_hdf5(args.out, instances(), args.max_seq_length, args.max_predictions)
        print(f"wrote {args.dupe_factor * len(ds)} instances to {args.out}")

    run(job)


if __name__ == "__main__":
    main()
