"""`make ops`, or `python -m ops`: build the fused operators' library now (or find it cached) and say
where; on failure one `error:` line and exit 1 (training would then take the reference path)."""
import argparse
import logging
import sys
import warnings

from ops import library


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ops", description=__doc__)
    p.add_argument("--verbose", action="store_true", help="print the g++ commands")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="No ccache found")   # paddle's cpp_extension, not ours to act on
    log = logging.getLogger("zoo")   # the build's own lines ("compiling ... / compiled in N s") on stdout, plain
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:], log.propagate = [handler], False
    log.setLevel(logging.INFO)
    try:
        path = library.build(verbose=args.verbose)
    except RuntimeError as e:
        print(f"error: the fused operators could not be built: {e}", file=sys.stderr)
        return 1
    print(f"{path} ({'with' if len(library.sources()) > 1 else 'without'} the oneDNN matmul and convolution)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
