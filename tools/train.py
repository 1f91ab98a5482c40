"""Train a recipe: python tools/train.py -c configs/...yaml [-o key=value ...] [--resume PATH|auto]"""
import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--output", type=cli.check_output, help="output directory (default output/<config name>)")
    p.add_argument("--resume", help="a checkpoint directory, or 'auto' for the newest in --output")
    p.add_argument("--seed", type=int, help="overrides runtime.seed")
    args = p.parse_args()

    from engine import runtime  # after parsing: --help needs no paddle
    from engine.session import Session
    from engine.training import trainer
    overrides = list(args.override) + ([f"runtime.seed={args.seed}"] if args.seed is not None else [])
    s = Session.from_file(args.config, overrides, args.trust_weights)
    output = args.output or cli.default_output(args.config)
    runtime.setup_logging(output, runtime.world()[1])
    _, metrics = trainer.fit(s, output, resume=args.resume)
    if metrics and runtime.world()[1] == 0:
        print("final metrics: " + cli.format_metrics(metrics))


if __name__ == "__main__":
    cli.run(main)
