"""Evaluate weights on a recipe's reader: python tools/eval.py -c CONFIG --weights PATH|NAME|URL"""
import _bootstrap  # noqa: F401  (environment before paddle)

import logging
import os

from engine import cli
from engine.errors import ConfigError

log = logging.getLogger("zoo")


def main():
    p = cli.parser(__doc__)
    cli.weights_args(p, required=True)
    p.add_argument("--output", help="where metrics.json goes (default output/<config name>/eval)")
    p.add_argument("--split", default=None, help="reader split to evaluate (default: test if defined and "
                                                 "labelled, else val)")
    args = p.parse_args()

    from engine import runtime  # after parsing: --help needs no paddle
    from engine.session import Session
    from engine.training import trainer
    from engine.training.evaluator import evaluate
    s = Session.from_args(args)
    rt = s.setup()
    output = args.output or os.path.join(cli.default_output(args.config), "eval")
    runtime.setup_logging(output if rt["rank"] == 0 else None, rt["rank"])
    model = s.model(args.weights, args.weights_format)
    split = args.split or s.cfg.eval_split()
    loader, dataset, _ = s.loader(split)
    if not dataset.labelled:   # GLUE's test files: inputs only, for the leaderboard (tools/infer.py)
        if args.split or "val" not in s.cfg["reader"]:
            raise ConfigError(f"reader.{split}: {type(dataset).__name__}'s {split} split has no labels to score; "
                              f"evaluate --split val (tools/infer.py predicts the {split} split)")
        log.info("reader.test has no labels (%s): evaluating reader.val", type(dataset).__name__)
        split = "val"
        loader, dataset, _ = s.loader(split)
    metrics = evaluate(model, loader, s.metric(dataset), s.eval_amp)
    if rt["rank"] == 0:
        trainer.write_metrics(metrics, output)
        print(cli.format_metrics(metrics))


if __name__ == "__main__":
    cli.run(main)
