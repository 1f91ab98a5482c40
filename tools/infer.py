"""Predict top-k classes: python tools/infer.py -c CONFIG --weights W --input FILE|DIR [...]

Writes DIR/predictions.json (id, top-k labels and scores) and any format-specific files the reader
adds (for YouTube-8M, the Kaggle submission CSV).
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import json
import os

from engine import cli


def main():
    p = cli.parser(__doc__)
    p.add_argument("--weights", required=True, help="a .pdparams file, checkpoint dir, entry name or URL")
    p.add_argument("--weights-format", default=None, metavar="LAYOUT",
                   help="key layout of a weights file: native or a pretrained entry name "
                        "(default: detected from the file's keys)")
    p.add_argument("--input", required=True, nargs="+", help="input files or folders")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--output", help="output directory (default output/<config name>/infer)")
    args = p.parse_args()

    import numpy as np
    import paddle
    from engine import builder, config, runtime
    from engine.components import load_all
    from engine.pretrained import load_pretrained
    from engine.registry import DATASETS
    load_all()
    cfg = config.load(args.config, args.override)
    rt_cfg = config.section(cfg, "runtime", config.RUNTIME_KEYS)
    runtime.setup(rt_cfg)
    output = args.output or os.path.join(cli.default_output(args.config), "infer")
    runtime.setup_logging(None)
    split = "test" if "test" in cfg.get("reader", {}) else "val"
    reader_cfg, _ = builder.split_loader_cfg(cfg["reader"][split])
    cls = DATASETS.get(reader_cfg.pop("name"))
    dataset = cls.for_inputs(args.input, **reader_cfg)
    model = builder.build_model(cfg["model"])
    weights = os.path.join(args.weights, "model.pdparams") if os.path.isdir(args.weights) else args.weights
    load_pretrained(model, weights, strict=True, weights_format=args.weights_format)
    model.eval()
    loader, _, _ = builder.build_loader(cfg, split, rt_cfg["seed"], dataset=dataset, batch_size=args.batch_size)
    names = dataset.label_names or _label_file(cfg.get("labels"))
    ids, all_probs, results = [], [], []
    with paddle.no_grad():
        for batch in loader:
            if "index" not in batch:
                continue
            preds = model(batch)
            probs = preds["probs"].numpy() if "probs" in preds else \
                paddle.nn.functional.softmax(preds["logits"], -1).numpy()
            for idx, row in zip(batch["index"].numpy().tolist(), probs):
                top = np.argsort(-row)[: args.top_k]
                vid = dataset.describe(idx)
                ids.append(vid)
                all_probs.append(row)
                results.append({"id": vid, "top_k": [
                    {"class_id": int(c), "label": names[c] if names else str(c), "score": float(row[c])}
                    for c in top]})
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, "predictions.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    extra = dataset.write_predictions(output, ids, np.stack(all_probs)) if all_probs else []
    for r in results:
        print(r["id"] + ": " + ", ".join(f"{t['label']} {t['score']:.3f}" for t in r["top_k"]))
    print("wrote " + ", ".join([path] + list(extra)))


def _label_file(path):
    if not path:
        return None
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


if __name__ == "__main__":
    cli.run(main)
