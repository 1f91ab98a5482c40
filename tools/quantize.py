"""INT8 post-training quantization: python tools/quantize.py -c CONFIG --weights W --output DIR
    [--backend onnxruntime|openvino ...] [--calib-batches N] [--max-drop X] [--observer minmax|percentile|entropy]
    [--metric KEY] [--split S]

Exports the model to ONNX (as tools/export.py --format onnx does), records what each of its programs
receives on N batches of the recipe's training samples read through the evaluation split's
pre-processing (in file order, so the same N batches every time), quantizes each program with ONNX
Runtime's static QDQ quantization calibrated on them (deploy/quantize.py: what is kept in
float, the check against its own fake-quant simulation), and writes DIR: run it with
`tools/infer.py --backend onnxruntime --weights DIR`. `--backend openvino` quantizes with NNCF instead
(the same calibration feeds, the same layers kept in float) into OpenVINO's IR, run with `--backend
openvino`; where the CPU has bf16, OpenVINO runs the layers left in float in bf16. `--backend onnxruntime
openvino` writes both routes, into DIR/onnxruntime and DIR/openvino, from one export, one calibration
and one fp32 evaluation (through the first backend named). Then fp32 and INT8 are evaluated on the
evaluation split (test where the recipe has one, else val; or --split) and both metrics are printed
with the drop of --metric (default train.best_metric, else the metric's first); with --max-drop X the
tool exits with status 1 when that drop exceeds X on any route (in the metric's units: 0.01 is one point of a
0-1 accuracy). The model takes the input layout of that split's processing (TSN's test split: several
views per video): run tools/infer.py with the same --split.
"""
import os

import _bootstrap  # noqa: F401  (environment before paddle)

from engine import cli


def _args():
    p = cli.parser(__doc__)
    cli.weights_args(p, required=True, help="a .pdparams file, checkpoint dir, entry name or URL")
    p.add_argument("--output", required=True, type=cli.check_output, help="the quantized export directory")
    p.add_argument("--calib-batches", type=int, default=8, help="calibration batches (of the split's batch size)")
    p.add_argument("--batch-size", type=int, default=None, help="calibration and evaluation batch size")
    p.add_argument("--backend", choices=["onnxruntime", "openvino"], nargs="+", default=["onnxruntime"],
                   help="onnxruntime: ONNX Runtime's QDQ INT8 (.onnx); openvino: NNCF's INT8 as OpenVINO IR (.xml); "
                   "both: each into --output/<backend>")
    p.add_argument("--observer", default="minmax", help="how activation ranges are found: minmax (default, "
                   "chosen by measurement: docs/deployment.md 'INT8'), percentile or entropy")
    p.add_argument("--max-drop", type=float, default=None, help="exit 1 when fp32 - INT8 of --metric exceeds this")
    p.add_argument("--metric", default=None, help="the metric the drop is of")
    p.add_argument("--split", default=None, help="evaluation split (default: test if defined, else val)")
    return p.parse_args()


def main():
    args = _args()
    from engine import runtime  # after parsing: --help needs no paddle
    from deploy import onnx, openvino, quantize
    from engine.session import Session
    s = Session.from_file(args.config, args.override, args.trust_weights)
    onnx.require("tools/quantize.py")
    backends = list(dict.fromkeys(args.backend))
    outputs = {b: cli.check_output(args.output if len(backends) == 1 else os.path.join(args.output, b))
               for b in backends}
    if "openvino" in backends:
        openvino.require("tools/quantize.py --backend openvino", quantize=True)
    quantize.check_options(args.observer, args.calib_batches)
    rt = s.setup(device="cpu")
    runtime.setup_logging(None)
    model = s.model(args.weights, args.weights_format)
    results = quantize.quantize_recipe(s, model, outputs, args.calib_batches, args.observer, args.split, args.metric,
                                       args.batch_size, rt["threads"])
    print(f"fp32: {cli.format_metrics(results[backends[0]]['fp32'])}")
    for b, m in results.items():
        key, route = m["metric"], f" ({b}: {outputs[b]})" if len(backends) > 1 else ""
        print(f"int8{route}: {cli.format_metrics(m['int8'])}")
        print(f"{key}: fp32 {m['fp32'][key]:.4f}, int8 {m['int8'][key]:.4f}, drop {m['drop']:.4f}{route}")
    over = [b for b, m in results.items() if args.max_drop is not None and m["drop"] > args.max_drop]
    for b in over:
        print(f"error: INT8 {results[b]['metric']} is {results[b]['drop']:.4f} below fp32 (more than --max-drop "
              f"{args.max_drop}); the quantized model is in {outputs[b]}")
    if over:
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
