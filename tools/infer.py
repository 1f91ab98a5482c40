"""Predict on raw inputs: python tools/infer.py -c CONFIG --weights W --input FILE|DIR [...]

What is written is the recipe's `infer:` writer's business (classification: top-k labels in
predictions.json, and for YouTube-8M the Kaggle CSV; segmentation: label PNGs and overlays;
detection: detections.json and drawn images; translation: a text file); change its settings with
-o, e.g. `-o infer.top_k=3`.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli
from engine.errors import ConfigError


def _parser():
    p = cli.parser(__doc__, config_required=False)
    cli.weights_args(p, required=True, help="a .pdparams file, checkpoint dir, entry name or URL; or an export "
                                            "directory of tools/export.py (then -c is optional)")
    p.add_argument("--input", required=True, nargs="+", help="input files or folders")
    p.add_argument("--batch-size", type=int, default=None)
    cli.backend_args(p)
    p.add_argument("--output", type=cli.check_output,
                   help="output directory (default: infer/ in the run folder of --weights, else "
                        "output/<config name>/infer)")
    p.add_argument("--split", default=None, help="whose pre-processing reads the inputs (default: test if "
                                                 "defined, else val; a model quantized with --split S takes S's)")
    return p


def main():
    args = _parser().parse_args()

    from engine import runtime  # after parsing: --help needs no paddle
    from engine.session import Session
    s = Session.from_args(args)   # without -c: the recipe an export directory records
    writer = s.infer_writer()
    s.setup()
    runtime.setup_logging(None)
    split = args.split or s.cfg.eval_split()
    dataset = s.input_dataset(args.input, split)
    model = s.runnable(args.weights, args.weights_format, args=args)
    model.eval()
    loader, _, _ = s.loader(split, dataset=dataset, batch_size=args.batch_size, sharded=False)
    writer.open(args.output or cli.default_output(args.config or args.weights, args.weights, "infer"), dataset,
                s.label_names(required=True))
    skipped = predict(model, loader, dataset, writer, s.eval_amp)
    if skipped == len(dataset):
        what = "the one input" if len(dataset) == 1 else f"none of the {len(dataset)} inputs"
        raise ConfigError(f"{what} could not be read ({'it is' if len(dataset) == 1 else 'each is'} named above); "
                          f"nothing written")
    print("wrote " + ", ".join(writer.close()))
    if skipped:
        print(f"{skipped} of {len(dataset)} inputs skipped (unreadable; each is named above)")


def predict(model, loader, dataset, writer, amp):
    """Write what `model` predicts for every batch (printing the writer's lines); returns how many
    inputs were unreadable (each named by the reader as it skipped it)."""
    import paddle  # after the flags are parsed (main's imports): --help needs no paddle
    from engine import runtime
    from engine.data import empty
    skipped = 0
    with paddle.no_grad(), runtime.autocast(amp):   # eval.amp; an exported program is fp32 (no effect)
        for batch in loader:
            skipped += batch["num_skipped"]
            if empty(batch):
                continue
            preds, meta = to_numpy(model(batch)), to_numpy(batch)
            meta["id"] = [dataset.describe(i) for i in meta["index"].tolist()]
            for line in writer.write(preds, meta):
                print(line)
    return skipped


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
