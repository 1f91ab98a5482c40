"""Export a recipe's model: python tools/export.py -c CONFIG --weights W --output DIR [--format onnx]

Writes DIR/model.json + model.pdiparams (the eval forward as a static program, with dynamic batch
and, where the model allows, dynamic length or image size), or one such pair per network of a model
that declares programs (the Transformer's encoder and decoder step, Mask R-CNN's detect and mask
heads), and DIR/infer_cfg.yml (the reader's pre-processing, the infer writer, class names and the
settings of the model's Python between its networks). Run it with
`python tools/infer.py -c CONFIG --backend inference --weights DIR --input ...`.

`--precision bf16` records that Paddle Inference is to run the program with oneDNN's bf16 kernels
(the files are the fp32 program's; where the CPU has no native bf16 it runs fp32 and says so).
`--format onnx` converts each program to DIR/<program>.onnx (paddle2onnx, opset 16; the packages of
requirements-onnx.txt) beside the same infer_cfg.yml; run it with `--backend onnxruntime`.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli
from engine.errors import ConfigError


def main():
    p = cli.parser(__doc__)
    cli.weights_args(p, help="a .pdparams file, checkpoint dir, entry name or URL "
                             "(omitted: the model's initial weights, for testing the export)")
    p.add_argument("--output", required=True, type=cli.check_output, help="the export directory")
    p.add_argument("--format", choices=["paddle", "onnx"], default="paddle",
                   help="paddle: Paddle Inference programs (.json + .pdiparams); onnx: .onnx files for ONNX Runtime")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 (--format paddle): Paddle Inference runs oneDNN's bf16 kernels where the CPU has "
                        "native bf16 (AVX512_BF16, AMX), else fp32 with a note; INT8 is tools/quantize.py")
    args = p.parse_args()

    from engine import runtime  # after parsing: --help needs no paddle
    from engine.deploy import export, onnx
    from engine.session import Session
    s = Session.from_args(args)
    if args.format == "onnx":   # before the model is built: a missing package is one line at once
        onnx.require("--format onnx")
    s.setup(device="cpu")
    runtime.setup_logging(None)
    model = s.model(args.weights, args.weights_format)
    spec = export.export(model, s.cfg, args.output, label_names=s.label_names(), example=_example(s),
                         fmt=args.format, precision=args.precision)
    print(f"exported {s.cfg['model']['name']} ({args.format}, {args.precision}) to {args.output}: inputs "
          + ", ".join(f"{n} {list(sp.shape)}" for n, sp in spec["inputs"].items())
          + f"; outputs {', '.join(spec['outputs'])}")


def _example(session):
    """One batch of the split tools/infer.py reads, when its data is here (it fixes layouts such as
    several views per video); without data the model's default layout is exported."""
    split = session.cfg.eval_split()
    try:
        loader, _, _ = session.loader(split, batch_size=1, sharded=False)
        return next(iter(loader))
    except (ConfigError, StopIteration) as e:
        print(f"note: no {split} batch to take the input layout from ({e}); exporting the default layout")
        return None


if __name__ == "__main__":
    cli.run(main)
