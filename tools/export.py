"""Export a recipe's model for Paddle Inference: python tools/export.py -c CONFIG --weights W --output DIR

Writes DIR/model.json + model.pdiparams (the eval forward as a static program, with dynamic batch
and, where the model allows, dynamic length or image size), or one such pair per network of a model
that declares programs (the Transformer's encoder and decoder step, Mask R-CNN's detect and mask
heads), and DIR/infer_cfg.yml (the reader's pre-processing, the infer writer, class names and the
settings of the model's Python between its networks). Run it with
`python tools/infer.py -c CONFIG --backend inference --weights DIR --input ...`.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import os

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--weights", help="a .pdparams file, checkpoint dir, entry name or URL "
                                     "(omitted: the model's initial weights, for testing the export)")
    p.add_argument("--weights-format", help="layout of --weights (default: detected from its keys)")
    p.add_argument("--output", required=True, help="the export directory")
    args = p.parse_args()

    from engine import builder, config, export, runtime
    from engine.components import load_all
    from engine.pretrained import load_pretrained
    load_all()
    cfg = config.load(args.config, list(args.override))
    rt_cfg = config.section(cfg, "runtime", config.RUNTIME_KEYS)
    runtime.setup(dict(rt_cfg, device="cpu"))
    runtime.setup_logging(None)
    runtime.seed_all(rt_cfg["seed"])
    model = builder.build_model(cfg["model"])
    if args.weights:
        weights = os.path.join(args.weights, "model.pdparams") if os.path.isdir(args.weights) else args.weights
        load_pretrained(model, weights, strict=True, weights_format=args.weights_format,
                        trust=args.trust_weights)
    spec = export.export(model, cfg, args.output, label_names=_label_names(cfg), example=_example(cfg, rt_cfg))
    print(f"exported {cfg['model']['name']} to {args.output}: inputs "
          + ", ".join(f"{n} {list(s.shape)}" for n, s in spec["inputs"].items())
          + f"; outputs {', '.join(spec['outputs'])}")


def _example(cfg, rt_cfg):
    """One batch of the split tools/infer.py reads, when its data is here (it fixes layouts such as
    several views per video); without data the model's default layout is exported."""
    from engine import builder
    from engine.registry import ConfigError
    split = "test" if "test" in cfg.get("reader", {}) else "val"
    try:
        loader, _, _ = builder.build_loader(cfg, split, rt_cfg["seed"], batch_size=1)
        return next(iter(loader))
    except (ConfigError, StopIteration) as e:
        print(f"note: no {split} batch to take the input layout from ({e}); exporting the default layout")
        return None


def _label_names(cfg):
    path = cfg.get("labels")
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


if __name__ == "__main__":
    cli.run(main)
