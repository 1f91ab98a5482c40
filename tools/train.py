"""Train a recipe: python tools/train.py -c configs/...yaml [-o key=value ...] [--resume PATH|auto]"""
import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--output", help="output directory (default output/<config name>)")
    p.add_argument("--resume", help="a checkpoint directory, or 'auto' for the newest in --output")
    p.add_argument("--seed", type=int, help="overrides runtime.seed")
    args = p.parse_args()

    from engine import config, runtime, trainer
    from engine.components import load_all
    load_all()
    overrides = list(args.override) + ([f"runtime.seed={args.seed}"] if args.seed is not None else [])
    cfg = config.load(args.config, overrides)
    output = args.output or cli.default_output(args.config)
    runtime.setup_logging(output, runtime.world()[1])
    _, metrics = trainer.fit(cfg, output, resume=args.resume, trust_weights=args.trust_weights)
    if metrics and runtime.world()[1] == 0:
        print("final metrics: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in metrics.items()))


if __name__ == "__main__":
    cli.run(main)
