"""Shared command-line plumbing: common flags and one-line errors with a non-zero exit."""
import argparse
import os
import sys
import traceback

from engine.errors import ConfigError, SampleError


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-c", "--config", required=True, help="YAML recipe under configs/")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o train.epochs=2 -o reader.train.batch_size=8")
    p.add_argument("--trust-weights", action="store_true",
                   help="unpickle weight files in full (they could run code): only for files you trust; "
                        "a flag of the command, never a config key, so no recipe can switch the guard off")
    return p


def weights_args(p, required=False, help=None):
    """--weights and --weights-format, as eval, infer and export take them."""
    p.add_argument("--weights", required=required,
                   help=help or "a .pdparams file, a checkpoint directory, a pretrained entry name or a URL")
    p.add_argument("--weights-format", default=None, metavar="LAYOUT",
                   help="key layout of a weights file: native or a pretrained entry name "
                        "(default: detected from the file's keys)")


def format_metrics(metrics):
    return " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def default_output(config_path):
    return os.path.join("output", os.path.splitext(os.path.basename(config_path))[0])


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
