"""Shared command-line plumbing: common flags and one-line errors with a non-zero exit."""
import argparse
import os
import sys
import traceback

from engine.errors import ConfigError, SampleError


class _Overrides(argparse.Action):
    """-o takes one or more KEY=VALUE, and may repeat: `-o a=1 b=2` (PaddleDetection's form) and
    `-o a=1 -o b=2` give the same flat list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(getattr(namespace, self.dest) or []) + list(values))


def parser(description, config_required=True):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-c", "--config", required=config_required, help="YAML recipe under configs/")
    p.add_argument("-o", "--override", action=_Overrides, nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config values, e.g. -o train.epochs=2 reader.train.batch_size=8 "
                        "(or -o repeated)")
    p.add_argument("--trust-weights", action="store_true",
                   help="unpickle weight files in full (they could run code): only for files you trust; "
                        "a flag of the command, never a config key, so no recipe can switch the guard off")
    return p


def trt_flag(p):
    """--trt / --no-trt, as infer and eval take them (deploy/predictor.py, `tensorrt`)."""
    p.add_argument("--trt", action=argparse.BooleanOptionalAction, default=None,
                   help="TensorRT for an export of tools/export.py --trt (default: on where the export records it "
                        "and the device is a GPU; --trt on a CPU is an error)")


def backend_args(p):
    """--backend and how an export runs, as infer and eval take them (deploy/load.py `runnable`)."""
    p.add_argument("--backend", choices=["dynamic", "inference", "onnxruntime", "openvino"], default=None,
                   help="dynamic: the model in Python; inference: an export run by Paddle Inference; onnxruntime or "
                        "openvino: an export of --format onnx (or an INT8 one of tools/quantize.py) run by ONNX Runtime "
                        "or OpenVINO on the CPU (default: what the export records, or dynamic for weights)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="an export's float precision (default: the export's); bf16 where the CPU has it, else fp32 "
                        "with one line")
    p.add_argument("--ov-hint", choices=["LATENCY", "THROUGHPUT"], default="LATENCY",
                   help="OpenVINO's performance hint: LATENCY (one request at a time, the default) or THROUGHPUT")
    p.add_argument("--no-mkldnn", action="store_true", help="inference backend on CPU without oneDNN")
    trt_flag(p)


def weights_args(p, required=False, help=None):
    """--weights and --weights-format, as eval, infer and export take them."""
    p.add_argument("--weights", required=required,
                   help=help or "a .pdparams file, a checkpoint directory, a pretrained entry name or a URL")
    p.add_argument("--weights-format", default=None, metavar="LAYOUT",
                   help="key layout of a weights file: native or a pretrained entry name "
                        "(default: detected from the file's keys)")


def format_metrics(metrics):
    return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def default_output(config_path, weights=None, sub=""):
    """Where a tool writes when --output is not given: `sub` inside the training run that `weights`
    come from (final/, best/, a checkpoint or an export inside the run folder), else
    output/<config name>/`sub`."""
    run = run_folder(weights)
    if run:
        return os.path.join(run, sub)
    return os.path.join("output", os.path.splitext(os.path.basename(config_path))[0], sub)


def check_output(path, flag="--output"):
    """A folder to write into: refused at once (one line) when it or a parent is an existing file."""
    if not path:
        return path
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "is an existing file" if probe == os.path.abspath(path) else f"lies under a file ({probe})"
        raise ConfigError(f"{flag} {path} {what}; it names a folder to write into")
    return path


def run_folder(weights, levels=3):
    """The training run folder (its config.yaml and final/ or checkpoints/ written by tools/train.py)
    that a local weights path lies in, or None (an entry name, a URL, a file elsewhere)."""
    if not weights or not os.path.exists(weights):
        return None
    folder = os.path.abspath(weights if os.path.isdir(weights) else os.path.dirname(weights))
    for _ in range(levels):
        if os.path.isfile(os.path.join(folder, "config.yaml")) and any(
                os.path.isdir(os.path.join(folder, d)) for d in ("final", "checkpoints")):
            return folder
        folder = os.path.dirname(folder)
    return None


def run(main):
    """Call `main()`; a user error becomes one line on stderr and exit code 2 (no traceback)."""
    try:
        main()
    except (ConfigError, SampleError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # an unexpected failure: keep the traceback, it is a bug to report
        if os.environ.get("ZOO_TRACEBACK"):
            raise
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
