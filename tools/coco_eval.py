"""Score saved COCO results JSON files with COCOeval (no model, no images needed).

python tools/coco_eval.py --ann instances_val2017.json --bbox bbox.json [--segm segm.json]
                          [--per-class] [--output DIR]

The files are what the COCO metric writes with `-o metric.save_results=DIR` (or any COCO results
file: a list of {image_id, category_id, bbox | segmentation, score}); every image of the
annotation file counts. Prints the metrics and, with --output, writes DIR/metrics.json.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import os

from engine import cli
from engine.errors import ConfigError


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ann", required=True, help="COCO annotation file (instances_*.json)")
    p.add_argument("--bbox", help="box results JSON")
    p.add_argument("--segm", help="mask results JSON")
    p.add_argument("--per-class", action="store_true", help="also AP per category")
    p.add_argument("--output", help="write metrics.json here")
    args = p.parse_args()
    from engine.runtime import setup_logging  # after parsing: --help needs no paddle
    from engine.training.trainer import write_metrics
    from metrics.detection import evaluate_results
    files = {k: v for k, v in (("bbox", args.bbox), ("segm", args.segm)) if v}
    if not files:
        raise ConfigError("give --bbox and/or --segm results files")
    setup_logging(None)
    metrics = evaluate_results(args.ann, files, per_class=args.per_class)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        write_metrics(metrics, args.output)
    print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()))


if __name__ == "__main__":
    cli.run(main)
