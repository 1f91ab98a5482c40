"""`make test-isa`: the tests marked `isa` under each ONEDNN_MAX_CPU_ISA cap this CPU can stand in for.

Why: each CPU kind we run on has its own oneDNN kernels (AMD Zen 3: AVX2; Zen 4/5: AVX-512 with bf16 and
VNNI; Intel Xeon: AMX as well), and a bound measured on one kind's kernels has broken on the next. The cap
makes oneDNN (paddle's, ours in ops/, OpenVINO's CPU plugin) use the kernels of the lower kind, and
ops/library.py builds our own loops without the instructions the cap excludes, so one AMX machine checks
every kind (AVX2, AVX512_CORE, AVX512_CORE_BF16, AVX512_CORE_AMX) and a Zen 4 the first three. What a cap
does not reach: ONNX Runtime's kernels (they read the CPU itself) and the CPU's own speed of subnormals.

    python -m tests.isa [--caps AVX2 ...] [pytest arguments]

Which tests carry the mark, and why: docs/contributing.md, "Tests that depend on the CPU's kernels".
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from engine import cpu  # noqa: E402  (imports nothing heavy)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    levels = cpu.isa_levels()
    parser.add_argument("--caps", nargs="+", default=levels, metavar="ISA",
                        help=f"ONEDNN_MAX_CPU_ISA values to run under (default, what this CPU has: {' '.join(levels)})")
    args, pytest_args = parser.parse_known_args(argv)
    unknown = [c for c in args.caps if c.upper() not in cpu.ONEDNN_ISA]
    if unknown:
        parser.error(f"unknown ISA {' '.join(unknown)}; oneDNN knows {', '.join(cpu.ONEDNN_ISA)}")
    above = [c for c in args.caps if c.upper() not in levels]
    if above:
        parser.error(f"this CPU cannot run as {' '.join(above)}: it has {' '.join(levels)}")
    results = []
    for cap in args.caps:
        print(f"== ONEDNN_MAX_CPU_ISA={cap}: pytest -m isa", flush=True)
        tic = time.perf_counter()
        env = dict(os.environ, ONEDNN_MAX_CPU_ISA=cap.upper())
        env.pop("DNNL_MAX_CPU_ISA", None)
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "isa", "tests", *pytest_args],
                               cwd=ROOT, env=env)
        results.append((cap, code, time.perf_counter() - tic))
    print("\nONEDNN_MAX_CPU_ISA   result   minutes")
    for cap, code, seconds in results:
        print(f"{cap:<20} {'passed' if code == 0 else f'FAILED ({code})':<8} {seconds / 60:7.1f}")
    return 0 if all(code == 0 for _, code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
