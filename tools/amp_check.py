"""Check mixed precision on this machine: each recipe trained in fp32 and in each AMP mode on the same
batches from the same initial weights; losses compared, speed-up reported.

python tools/amp_check.py [-c CONFIG ...] [-o k=v ...] [--steps 20] [--tail 3] [--modes fp32 bf16-O1 ...]
                          [--rtol 0.05] [--json PATH]

A mode passes when every loss is finite and the mean of its last `--tail` losses is within `rtol` of
fp32's. On a CPU the AMP modes are bf16 on the fused oneDNN operators (the default modes: fp32 and
bf16-O1; O2 runs as O1 there, float16 is refused), on a GPU paddle.amp's fp16 and bf16 at O1 and O2.
A mode this machine cannot run (a CPU without native bf16) is reported as not run and fails the check.
Exit code 1 if a check fails.

The check of the full-size models (200 steps, the mean of steps 151-200 within 2%):
  python tools/amp_check.py -c configs/nlp/bert/bert_base_1000k_pretrain.yaml --steps 200 --tail 50 \
      --rtol 0.02 -o reader.train.files=[data/bert_demo/corpus/train.txt] \
      -o reader.train.vocab_file=data/bert_demo/vocab_30522.txt -o reader.train.collate.max_len=128
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import json

from benchmarks import amp_check
from engine import cli


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", help="recipes (default: every *_demo.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], help="key=value for every recipe")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tail", type=int, default=3, help="compare the mean of the last N losses")
    p.add_argument("--modes", nargs="+", choices=list(amp_check.MODES),
                   help="default: fp32 bf16-O1 on a CPU, all on a GPU")
    p.add_argument("--rtol", type=float, default=0.05, help="final loss vs fp32, relative")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    rows = amp_check.check_all(args.config, args.steps, args.modes, args.rtol, args.override, args.tail)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
