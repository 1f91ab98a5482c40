"""Predict on raw inputs: python tools/infer.py -c CONFIG --weights W --input FILE|DIR [...]

What is written is the recipe's `infer:` writer's business (classification: top-k labels in
predictions.json, and for YouTube-8M the Kaggle CSV; segmentation: label PNGs and overlays;
detection: detections.json and drawn images; translation: a text file); change its settings with
-o, e.g. `-o infer.top_k=3`. The work is api/inferencer.py's, which the server and your scripts call too.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import pathlib

from engine import cli


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

    from api.inferencer import Inferencer  # after parsing: --help needs no paddle
    from engine import runtime
    inferencer = Inferencer(args.config or args.weights, weights=args.weights, backend=args.backend,
                            precision=args.precision, ov_hint=args.ov_hint, mkldnn=not args.no_mkldnn,
                            tensorrt=args.trt, weights_format=args.weights_format, overrides=args.override,
                            split=args.split, trust_weights=args.trust_weights)
    runtime.setup_logging(None)
    output = args.output or cli.default_output(args.config or args.weights, args.weights, "infer")
    # paths, never texts: a text model reads the named files
    result = inferencer.run([pathlib.Path(p) for p in args.input], output, args.batch_size, log=print)
    print("wrote " + ", ".join(result.files))
    if result.skipped:
        print(f"{result.skipped} of {result.skipped + len(result.lines)} inputs skipped (unreadable; each is "
              f"named above)")


if __name__ == "__main__":
    cli.run(main)
