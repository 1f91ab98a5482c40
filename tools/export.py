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

`--trt` (--format paddle) records TensorRT settings in infer_cfg.yml for Paddle Inference on a GPU:
dynamic shape ranges per program input (derived from the input specs and the example batch; the
image sides --trt-min-shape/--trt-opt-shape/--trt-max-shape as PaddleDetection names them; any input
by --trt-shapes FILE), --trt-precision, --trt-min-subgraph-size, --trt-workspace, --trt-max-batch and
--trt-static (serialized engines in DIR/trt_cache). tools/infer.py and eval.py then run TensorRT on a
GPU (--no-trt: without). deploy/tensorrt.py says what only a GPU can confirm.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli
from deploy.tensorrt import IMAGE_SIDES   # no paddle: --help stays fast
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
    _trt_args(p)
    args = p.parse_args()
    _check_trt(args)

    from engine import runtime  # after parsing: --help needs no paddle
    from deploy import export, onnx
    from engine.session import Session
    s = Session.from_file(args.config, args.override, args.trust_weights)
    if args.format == "onnx":   # before the model is built: a missing package is one line at once
        onnx.require("--format onnx")
    s.setup(device="cpu")
    runtime.setup_logging(None)
    model = s.model(args.weights, args.weights_format)
    spec = export.export(model, s.cfg, args.output, label_names=s.label_names(), example=_example(s),
                         fmt=args.format, precision=args.precision, trt=_trt_settings(args))
    print(f"exported {s.cfg['model']['name']} ({args.format}, {args.precision}{', TensorRT' if args.trt else ''}) "
          f"to {args.output}: inputs "
          + ", ".join(f"{n} {list(sp.shape)}" for n, sp in spec["inputs"].items())
          + f"; outputs {', '.join(spec['outputs'])}")


def _trt_args(p):
    """The TensorRT flags: PaddleDetection's --trt_*_shape names as image sides, the rest its Config."""
    trt = p.add_argument_group("TensorRT (--format paddle; used on a GPU)")
    trt.add_argument("--trt", action="store_true", help="record TensorRT settings (the tensorrt section of infer_cfg.yml)")
    trt.add_argument("--trt-precision", choices=["fp32", "fp16"], default=None, help="TensorRT's precision (default fp32)")
    trt.add_argument("--trt-min-subgraph-size", type=int, default=None,
                     help="fewest operators per TensorRT engine (default: the model's, else 3)")
    trt.add_argument("--trt-workspace", type=int, default=None, help="workspace bytes (default 1<<30)")
    trt.add_argument("--trt-max-batch", type=int, default=None, help="largest batch (default 32)")
    trt.add_argument("--trt-static", action="store_true", default=None,
                     help="serialize the built engines to DIR/trt_cache and reuse them")
    trt.add_argument("--trt-min-shape", type=int, default=None, help="smallest image side (default 32)")
    trt.add_argument("--trt-opt-shape", type=int, default=None, help="image side to tune for (default: the example's, else 640)")
    trt.add_argument("--trt-max-shape", type=int, default=None, help="largest image side (default 1344)")
    trt.add_argument("--trt-shapes", metavar="FILE", default=None,
                     help="YAML/JSON {program: {input: {min, opt, max}}} replacing derived ranges")


def _check_trt(args):
    """--trt-* without --trt, or --trt on an ONNX export: one line each."""
    trt_args = [a for a in ("trt_precision", "trt_min_subgraph_size", "trt_workspace", "trt_max_batch", "trt_static",
                            "trt_min_shape", "trt_opt_shape", "trt_max_shape", "trt_shapes") if getattr(args, a) is not None]
    if trt_args and not args.trt:
        raise ConfigError(f"--{trt_args[0].replace('_', '-')} needs --trt")
    if args.trt and args.format != "paddle":
        raise ConfigError(f"--trt with --format {args.format}: TensorRT runs a --format paddle export (Paddle Inference)")


def _trt_settings(args):
    """export.export's `trt` from the flags (None without --trt); the image sides default per unset flag."""
    if not args.trt:
        return None
    sides = tuple(d if v is None else v for v, d in zip((args.trt_min_shape, args.trt_opt_shape, args.trt_max_shape),
                                                       IMAGE_SIDES))
    return {"precision": args.trt_precision, "min_subgraph_size": args.trt_min_subgraph_size,
            "workspace_size": args.trt_workspace, "max_batch_size": args.trt_max_batch, "use_static": args.trt_static,
            "image_sides": sides, "shapes_file": args.trt_shapes}


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
