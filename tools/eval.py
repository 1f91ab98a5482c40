"""Evaluate weights on a recipe's reader: python tools/eval.py -c CONFIG --weights PATH|NAME|URL"""
import _bootstrap  # noqa: F401  (environment before paddle)

import os

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--weights", required=True,
                   help="a .pdparams file, a checkpoint directory, a pretrained entry name or a URL")
    p.add_argument("--weights-format", default=None, metavar="LAYOUT",
                   help="key layout of a weights file: native or a pretrained entry name "
                        "(default: detected from the file's keys)")
    p.add_argument("--output", help="where metrics.json goes (default output/<config name>/eval)")
    p.add_argument("--split", default=None, help="reader split to evaluate (default: test if defined, else val)")
    args = p.parse_args()

    from engine import builder, config, runtime, trainer
    from engine.components import load_all
    from engine.evaluator import evaluate
    from engine.pretrained import load_pretrained
    load_all()
    cfg = config.load(args.config, list(args.override))
    rt_cfg = config.section(cfg, "runtime", config.RUNTIME_KEYS)
    rt = runtime.setup(rt_cfg)
    output = args.output or os.path.join(cli.default_output(args.config), "eval")
    runtime.setup_logging(output if rt["rank"] == 0 else None, rt["rank"])
    split = args.split or ("test" if "test" in cfg.get("reader", {}) else "val")
    model = builder.build_model(cfg["model"])
    weights = args.weights
    if os.path.isdir(weights):
        weights = os.path.join(weights, "model.pdparams")
    load_pretrained(model, weights, strict=True, weights_format=args.weights_format,
                    trust=args.trust_weights)
    loader, dataset, _ = builder.build_loader(cfg, split, rt_cfg["seed"], rt["world_size"], rt["rank"])
    amp = config.section(config.section(cfg, "train", config.TRAIN_KEYS), "amp", config.AMP_KEYS)
    metrics = evaluate(model, loader, builder.build_metric(cfg, dataset), amp)
    if rt["rank"] == 0:
        trainer.write_metrics(metrics, output)
        print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))


if __name__ == "__main__":
    cli.run(main)
