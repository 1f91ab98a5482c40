"""Parameters and multiply-adds (MACs; FLOPs = 2 x MACs) of a recipe's model at its input shape, by module,
without training (benchmarks/flops.py counts; docs/tools.md, "analyze", says what and how).

    python tools/analyze.py -c configs/video/tsn/tsn_r50_100e_k400.yaml
    python tools/analyze.py -c CONFIG --input-shape segments=8 size=256 --depth 3 --json out.json
    python tools/analyze.py -c CONFIG --params-only          # parameters only, built under paddle.LazyGuard
    python tools/analyze.py --all --json configs/macs.json   # every recipe (docs/model-zoo.md's column)
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import json
import os

from engine import cli
from engine.errors import ConfigError


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--config", help="YAML recipe under configs/")
    p.add_argument("-o", "--override", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="override config values (as the other tools' -o)")
    p.add_argument("--input-shape", nargs="+", action="extend", default=[], metavar="NAME=N",
                   help="change a size of the dummy batch, e.g. batch=2 segments=8 size=224 (size= sets height "
                        "and width); the output lists each model's sizes and where their values come from")
    p.add_argument("--depth", type=int, default=2, help="depth of the per-module table (0: the model only; default 2)")
    p.add_argument("--json", metavar="PATH", help="also write the analysis as JSON (with --all: the table's record)")
    p.add_argument("--params-only", action="store_true",
                   help="count parameters only: the model built under paddle.LazyGuard, no forward")
    p.add_argument("--all", action="store_true", help="every recipe under configs/, one line each")
    return p


def _write(path, data):
    folder = os.path.dirname(os.path.abspath(path))
    cli.check_output(folder, "--json")
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    print(f"{path}: written")


def main():
    p = _parser()
    args = p.parse_args()
    if args.all == bool(args.config):
        raise ConfigError("give -c CONFIG or --all (not both)")
    if args.all and (args.input_shape or args.override):
        raise ConfigError("--all analyses each recipe as it is: --input-shape and -o take one -c CONFIG")
    if args.depth < 0:
        raise ConfigError(f"--depth must be >= 0, got {args.depth}")

    # after parsing: --help needs no paddle (benchmarks/flops.py imports it)
    from benchmarks import flops
    shape = flops.parse_shape(args.input_shape)
    macs = not args.params_only
    if not args.all:
        result = flops.analyze(args.config, args.override, shape, args.depth, macs)
        print(flops.report(result))
        if args.json:
            _write(args.json, result)
        return
    records = {}
    for path in flops.recipes():
        result = flops.analyze(path, depth=0, macs=macs)
        print(flops.summary_line(result), flush=True)
        records[result["config"]] = flops.table_entry(result) if macs else {
            "model": result["model"], "params": result["params"]["trainable"]}
    if args.json:
        _write(args.json, {"about": "tools/analyze.py --all: each recipe's trainable parameters and MACs "
                                    "(multiply-adds; FLOPs = 2 x MACs) of one forward at its input shape "
                                    "(benchmarks/flops.py); docs/model-zoo.md's column reads it",
                           "unit": "MACs", "counted": flops.COUNTED, "not_counted": flops.NOT_COUNTED,
                           "recipes": records})


if __name__ == "__main__":
    cli.run(main)
