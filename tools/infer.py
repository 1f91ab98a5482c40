"""Predict on raw inputs: python tools/infer.py -c CONFIG --weights W --input FILE|DIR [...]

What is written is the recipe's `infer:` writer's business (classification: top-k labels in
predictions.json, and for YouTube-8M the Kaggle CSV; segmentation: label PNGs and overlays;
detection: detections.json and drawn images; translation: a text file); change its settings with
-o, e.g. `-o infer.top_k=3`.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import os

from engine import cli


def _parser():
    p = cli.parser(__doc__)
    cli.weights_args(p, required=True, help="a .pdparams file, checkpoint dir, entry name or URL; "
                                            "an export directory with --backend inference or onnxruntime")
    p.add_argument("--input", required=True, nargs="+", help="input files or folders")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--backend", choices=["dynamic", "inference", "onnxruntime"], default="dynamic",
                   help="inference: --weights is a directory written by tools/export.py, run by Paddle Inference; "
                        "onnxruntime: one written with --format onnx, run by ONNX Runtime on the CPU")
    p.add_argument("--no-mkldnn", action="store_true", help="inference backend on CPU without oneDNN")
    p.add_argument("--output", help="output directory (default output/<config name>/infer)")
    p.add_argument("--split", default=None, help="whose pre-processing reads the inputs (default: test if "
                                                 "defined, else val; a model quantized with --split S takes S's)")
    return p


def main():
    args = _parser().parse_args()

    import paddle  # after parsing: --help needs no paddle
    from engine import runtime
    from engine.data import empty
    from engine.deploy.predictor import Predictor
    from engine.session import Session
    s = Session.from_args(args)
    writer = s.infer_writer()
    rt = s.setup()
    runtime.setup_logging(None)
    split = args.split or s.cfg.eval_split()
    dataset = s.input_dataset(args.input, split)
    if args.backend != "dynamic":
        model = Predictor(args.weights, mkldnn=not args.no_mkldnn, threads=rt["threads"], device=rt["device"],
                          model_name=s.cfg["model"]["name"], backend=args.backend)
    else:
        model = s.model(args.weights, args.weights_format)
    model.eval()
    loader, _, _ = s.loader(split, dataset=dataset, batch_size=args.batch_size, sharded=False)
    writer.open(args.output or os.path.join(cli.default_output(args.config), "infer"), dataset,
                s.label_names(required=True))
    with paddle.no_grad(), runtime.autocast(s.eval_amp):   # eval.amp; an exported program is fp32 (no effect)
        for batch in loader:
            if empty(batch):
                continue
            preds, meta = to_numpy(model(batch)), to_numpy(batch)
            meta["id"] = [dataset.describe(i) for i in meta["index"].tolist()]
            for line in writer.write(preds, meta):
                print(line)
    print("wrote " + ", ".join(writer.close()))


def to_numpy(tree):
    """Tensors (and lists of tensors) as numpy; bfloat16 as float32; everything else unchanged."""
    import paddle  # after the flags are parsed (main's imports): --help needs no paddle
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_numpy(v) for v in tree]
    if isinstance(tree, paddle.Tensor):
        return (tree.astype("float32") if tree.dtype == paddle.bfloat16 else tree).numpy()
    return tree


if __name__ == "__main__":
    cli.run(main)
