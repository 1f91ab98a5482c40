"""Evaluate weights on a recipe's reader: python tools/eval.py -c CONFIG --weights PATH|NAME|URL"""
import _bootstrap  # noqa: F401  (environment before paddle)
import os

from engine import cli
from engine.errors import ConfigError


def _args():
    p = cli.parser(__doc__, config_required=False)
    cli.weights_args(p, required=True, help="a .pdparams file, a checkpoint directory, a pretrained entry name, "
                                            "a URL, or an export directory of tools/export.py (then -c is optional)")
    p.add_argument("--output", type=cli.check_output,
                   help="where metrics.json goes (default: eval/ in the run folder of --weights, "
                        "else output/<config name>/eval)")
    p.add_argument("--split", default=None, help="reader split to evaluate (default: test if defined and "
                                                 "labelled, else val)")
    p.add_argument("--report", action="store_true",
                   help="also write a per-class report into the output folder: report.md and report.json, and "
                        "where the metric has one the confusion matrix (confusion.json, .csv, .png)")
    cli.backend_args(p)
    return p.parse_args()


def main():
    args = _args()
    from deploy import load  # after parsing: --help needs no paddle
    from engine import runtime
    from engine.training import trainer
    from engine.training.evaluator import evaluate
    s = load.from_args(args)   # the recipe's Session; without -c, the one an export directory records
    rt = s.setup()
    output = args.output or cli.default_output(args.config or args.weights, args.weights, "eval")
    runtime.setup_logging(output if rt["rank"] == 0 else None, rt["rank"])
    loader, dataset = s.scored_loader(args.split)
    metric = s.metric(dataset)
    if args.report and not hasattr(metric, "report"):
        raise ConfigError(f"--report: metric {type(metric).__name__} has no per-class report (classification, "
                          f"YouTube-8M, GLUE classification and segmentation metrics have one)")
    # an export runs on the backend its record names unless --backend says otherwise
    model = load.runnable(s, args.weights, args.weights_format, args=args)
    metrics = evaluate(model, loader, metric, s.eval_amp)
    report = metric.report(s.label_names()) if args.report else None   # every rank: the metric gathers across ranks
    if rt["rank"] == 0:
        trainer.write_metrics(metrics, output)
        print(cli.format_metrics(metrics))
        if report:
            from outputs.report import write_report  # after the flags are parsed: --help needs no matplotlib
            print("wrote " + ", ".join(write_report(report, output, _title(args, dataset))))


def _title(args, dataset):
    name = os.path.splitext(os.path.basename(os.path.normpath(args.config or args.weights)))[0]
    return f"{name}: {type(dataset).__name__} {args.split or ''}".strip()


if __name__ == "__main__":
    cli.run(main)
