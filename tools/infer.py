"""Predict on raw inputs: python tools/infer.py -c CONFIG --weights W --input FILE|DIR [...]

What is written is the recipe's `infer:` writer's business (classification: top-k labels in
predictions.json, and for YouTube-8M the Kaggle CSV; segmentation: label PNGs and overlays;
detection: detections.json and drawn images; translation: a text file); change its settings with
-o, e.g. `-o infer.top_k=3`.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import os

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--weights", required=True, help="a .pdparams file, checkpoint dir, entry name or URL; "
                                                    "an export directory with --backend inference")
    p.add_argument("--weights-format", default=None, metavar="LAYOUT",
                   help="key layout of a weights file: native or a pretrained entry name "
                        "(default: detected from the file's keys)")
    p.add_argument("--input", required=True, nargs="+", help="input files or folders")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--backend", choices=["dynamic", "inference"], default="dynamic",
                   help="inference: --weights is a directory written by tools/export.py, run by Paddle Inference")
    p.add_argument("--no-mkldnn", action="store_true", help="inference backend on CPU without oneDNN")
    p.add_argument("--output", help="output directory (default output/<config name>/infer)")
    args = p.parse_args()

    import paddle
    from engine import builder, config, runtime
    from engine.components import load_all
    from engine.pretrained import load_pretrained
    from engine.registry import DATASETS, OUTPUTS, ConfigError
    load_all()
    cfg = config.load(args.config, list(args.override))
    if not cfg.get("infer"):
        raise ConfigError(f"{args.config}: the recipe has no infer section (how to write predictions, "
                          f"e.g. infer: {{name: TopK}}; known: {', '.join(OUTPUTS.names())})")
    rt_cfg = config.section(cfg, "runtime", config.RUNTIME_KEYS)
    rt = runtime.setup(rt_cfg)
    output = args.output or os.path.join(cli.default_output(args.config), "infer")
    runtime.setup_logging(None)
    split = "test" if "test" in cfg.get("reader", {}) else "val"
    reader_cfg, _ = builder.split_loader_cfg(cfg["reader"][split])
    dataset = DATASETS.get(reader_cfg.pop("name")).for_inputs(args.input, **reader_cfg)
    if args.backend == "inference":
        from engine.predictor import Predictor
        model = Predictor(args.weights, mkldnn=not args.no_mkldnn, threads=rt["threads"], device=rt["device"],
                          model_name=cfg["model"]["name"])
    else:
        model = builder.build_model(cfg["model"])
        weights = os.path.join(args.weights, "model.pdparams") if os.path.isdir(args.weights) else args.weights
        load_pretrained(model, weights, strict=True, weights_format=args.weights_format,
                        trust=args.trust_weights)
    model.eval()
    loader, _, _ = builder.build_loader(cfg, split, rt_cfg["seed"], dataset=dataset, batch_size=args.batch_size)
    writer = OUTPUTS.build(cfg["infer"])
    writer.open(output, dataset, _label_file(cfg.get("labels")))
    with paddle.no_grad():
        for batch in loader:
            if "index" not in batch:
                continue
            preds, meta = to_numpy(model(batch)), to_numpy(batch)
            meta["id"] = [dataset.describe(i) for i in meta["index"].tolist()]
            for line in writer.write(preds, meta):
                print(line)
    print("wrote " + ", ".join(writer.close()))


def to_numpy(tree):
    """Tensors (and lists of tensors) as numpy; bfloat16 as float32; everything else unchanged."""
    import paddle
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_numpy(v) for v in tree]
    if isinstance(tree, paddle.Tensor):
        return (tree.astype("float32") if tree.dtype == paddle.bfloat16 else tree).numpy()
    return tree


def _label_file(path):
    if not path:
        return None
    if not os.path.isfile(path):
        from engine.registry import ConfigError
        raise ConfigError(f"labels file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


if __name__ == "__main__":
    cli.run(main)
