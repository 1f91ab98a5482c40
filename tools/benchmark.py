"""Throughput of a recipe on this machine: reader alone, model alone (train and eval), peak memory.

python tools/benchmark.py -c CONFIG [-o k=v ...] [--steps N] [--batch-size B] [--workers 0 2]
                          [--synthetic] [--tokens KEY] [--drop-keys KEY ...] [--json PATH]
python tools/benchmark.py --table     # the training table (BENCH_TABLE in benchmarks/tables.py), JSON per row
python tools/benchmark.py --show [--docs] [--kind KIND]   # the same table from the committed JSON
python tools/benchmark.py -c CONFIG --backend inference [--batch-sizes 1 8] [--weights W]
python tools/benchmark.py --table --backend inference   # the latency table (INFER_TABLE)
python tools/benchmark.py --amp-table [--only ...] [--docs]   # fp32 beside bf16 (AMP_TABLE), peak memory
python tools/benchmark.py --readers [--only ROW ...] [--workers 0 1 2] [--docs]   # the reader table
python tools/benchmark.py --readers --show [--docs] [--kind KIND]   # the same from the committed JSON

The JSON of the tables lives per CPU kind, benchmarks/results/<kind>/ (and .../<kind>/inference/),
of the machine that ran them; `--show` reads this machine's kind unless `--kind` names another, and
`--docs` (alias `--readme`) replaces only that kind's table in docs/performance.md (benchmarks/report.py).

The reader is timed alone (iterating the train DataLoader, for each worker count) and the model alone
(train steps and eval forwards on batches already in memory), so the reader's share of a step is
reader_time / (reader_time + model_time) for a reader with the given workers feeding the model.

`--backend inference` times prediction instead: the dynamic model in eval mode against the same
model exported by tools/export.py and run by Paddle Inference, with oneDNN on and off, and exported
with --format onnx and run by ONNX Runtime and OpenVINO (the same threads), each also in bf16 where
the CPU computes it and INT8 (tools/quantize.py, both routes), on a val batch of each size; the
backends alternate in rounds (each round runs every one once, the order rotated), so other load on
the machine falls on all alike; it reports the latency per batch (p50, p90 of the rounds) and samples/s.

`--amp-table` runs each AMP_TABLE row twice, fp32 and `train.amp` bf16 (each in its own process, so
each peak memory is its own), and tabulates samples/s, their ratio and the peak memory side by side;
`--show --amp-table` prints it from benchmarks/results/<kind>/amp/.

`--readers` times each full recipe's train reader alone on generated data of its real size
(READER_TABLE in benchmarks/readers.py; data cached under data/bench_real/): samples/s per worker
count, bytes per batch across the process boundary, the split of a sample's time (read + decode,
transforms, collate, transfer) and the workers an accelerator of a stated rate needs; JSON in
benchmarks/results/<kind>/readers.json (rows not rerun are kept). `--scale` shrinks the data (tests).

`--tokens KEY` also reports tokens/s, counting the batch's `KEY_len` (e.g. the target tokens of a
translation batch); `--drop-keys` removes batch keys before the eval forwards (e.g. the targets, so
that a translation model's eval times decoding alone). A row of BENCH_TABLE may end with such
extra arguments.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import json
import os

from benchmarks import tables
from engine import cli


def _parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--workers", type=int, nargs="+", help="worker counts the reader is timed with "
                   "(default: 0 2; with --readers 0 1 2)")
    p.add_argument("--synthetic", action="store_true", help="random features of the real batch shapes")
    p.add_argument("--tokens", metavar="KEY", help="also count tokens/s from the batch's KEY_len")
    p.add_argument("--drop-keys", nargs="+", default=[], metavar="KEY", help="batch keys removed before eval forwards")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--table", action="store_true", help="run BENCH_TABLE, write benchmarks/results/<kind>/*.json")
    p.add_argument("--show", action="store_true", help="print the table from benchmarks/results/<kind>/*.json")
    p.add_argument("--amp-table", action="store_true", help="fp32 and bf16 rows of AMP_TABLE (--show: print them)")
    p.add_argument("--only", nargs="+", help="with --table: rerun only these rows (names as in BENCH_TABLE); "
                   "with --readers: as in READER_TABLE")
    p.add_argument("--readers", action="store_true",
                   help="the reader table: each full recipe's reader on real-size generated data")
    p.add_argument("--scale", type=float, default=1.0, help="with --readers: shrink the generated data (tests)")
    p.add_argument("--batches", type=int, default=3,
                   help="with --readers: batches timed per worker count and per worker (at least)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="with --readers: time each worker count at least this long (up to 4x --batches)")
    p.add_argument("--kind", help="with --show: the results of this CPU kind (e.g. amd-zen4; default: this machine's)")
    p.add_argument("--docs", "--readme", dest="docs", action="store_true",
                   help="with --show/--table: write the table into docs/performance.md (--readme: the same)")
    p.add_argument("--backend", choices=["dynamic", "inference"], default="dynamic",
                   help="inference: prediction latency, dynamic vs exported (Paddle Inference with oneDNN on/off, "
                        "ONNX Runtime, OpenVINO)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="with --backend inference")
    p.add_argument("--weights", help="with --backend inference: weights to load (default: initial weights)")
    return p


def _readers(args):
    from benchmarks import readers, report   # readers imports paddle only when it measures
    if args.show:
        p = readers.path(args.kind)
        if not os.path.isfile(p):
            raise SystemExit(f"error: no {p}: run tools/benchmark.py --readers first")
        with open(p) as f:
            result = json.load(f)
    else:
        if args.kind:
            raise SystemExit("error: --kind is for --show: --readers measures this machine's kind")
        names = args.only or [r[0] for r in readers.READER_TABLE]
        for n in names:
            readers.row(n)
        result = readers.run(names, args.scale, tuple(args.workers or (0, 1, 2)), args.batches,
                             args.seconds)
        saved = readers.save(result)   # rows not rerun are kept: the table shows them all
        print(f"wrote {saved}")
        with open(saved) as f:
            result = json.load(f)
    print("\n".join(readers.table_lines(result)))
    if args.docs:
        readers.write_docs(result)
        print(f"wrote the {result['cpu_kind']} block of {report.PERFORMANCE}")


def main():
    p = _parser()
    args = p.parse_args()
    if args.kind and args.table:
        p.error("--kind is for --show: --table measures this machine's kind")
    if args.readers:
        return _readers(args)
    if args.workers is None:
        args.workers = [0, 2]
    if args.amp_table:
        args.table = not args.show
        return tables.amp_table(args)
    if args.table or args.show:
        return tables.inference_table(args) if args.backend == "inference" else tables.train_table(args)
    if not args.config:
        p.error("-c CONFIG is required (or --table)")
    from benchmarks import recipes  # import cost: paddle loads for a measurement only, once the flags are parsed
    if args.backend == "inference":
        result = recipes.bench_inference(args.config, args.override, args.steps, args.batch_sizes, args.weights)
        recipes.print_inference(args.config, result)
    else:
        result = recipes.bench(args.config, args.override, args.steps, args.batch_size, args.workers, args.synthetic,
                               args.tokens, args.drop_keys)
        recipes.print_result(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
