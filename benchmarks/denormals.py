"""Masked against random inputs: do our kernels slow down where subnormal floats could appear?

python benchmarks/denormals.py [--threads 2] [--no-flush] [--json PATH]

Intel cores compute on subnormal operands far slower; an exp that clamped its argument used to
fill every masked attention position with ~1e-38, which made BERT-base's step many times slower
there (docs/performance.md#cpu-environment). Each row times one piece of a BERT-base training step (batch 8, 12 heads, seq 128,
hidden 768) on two inputs of the same shape, random and masked, and prints the ratio
(masked / random: 1.0 means no penalty; the target on Intel is <= 1.2):
- attention: scores = q k^T, softmax with the additive padding mask (-1e4 on half the positions
  of every row in the masked case, none in the random one) and dropout, then probs @ v: forward and
  backward, all through ops.functional (oneDNN matmuls, the fused softmax);
- probs @ v alone: the batched GEMM 96 x 128x128 @ 128x64 on the probabilities of those two
  softmaxes (the product the subnormals slowed most);
- FFN GEMM 1024x768 @ 768x3072 on oneDNN, its input random or with a quarter of its values tiny
  (1e-37: normal floats whose products with the weights, ~0.02, fall below 2^-126);
- the same GEMM on an input that is itself half subnormal (1e-39): only the FTZ/DAZ guard
  (runtime.flush_denormals, on unless --no-flush) keeps this one fast on Intel.
Milliseconds are medians of >= 5 calls after a warm-up. The JSON (default
benchmarks/results/<cpu kind>/denormals.json) records the CPU, the threads and the guard.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import report  # noqa: E402
from engine.cpu import before_paddle  # noqa: E402  (no paddle import)
from engine import cpu  # noqa: E402


def _median_ms(fn, budget=1.0):
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < budget:
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return 1000 * statistics.median(times)


def cases():
    """name -> (random inputs, masked inputs, fn(inputs) to time)."""
    # import cost and environment: as in run(), which calls this after before_paddle()
    import numpy as np
    import paddle
    from ops import functional
    rng = np.random.default_rng(0)
    B, H, S, D = 8, 12, 128, 64

    def t(a, grad=False):
        x = paddle.to_tensor(np.ascontiguousarray(a, np.float32))
        x.stop_gradient = not grad
        return x

    qkv = [rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3)]
    no_mask = np.zeros((B, 1, 1, S), np.float32)
    half = no_mask.copy()
    half[..., S // 2:] = -1e4

    def attention(inp):
        q, k, v = (t(a, grad=True) for a in qkv)
        scores = functional.matmul(q, k, transpose_y=True)
        probs = functional.softmax_dropout(scores, inp["mask"], 1.0 / np.sqrt(D), 0.1, True)
        out = functional.matmul(probs, v)
        out.backward(inp["grad"])
        return out

    grad = t(rng.standard_normal((B, H, S, D)))

    def probs_of(mask):
        with paddle.no_grad():
            scores = functional.matmul(t(qkv[0]), t(qkv[1]), transpose_y=True)
            return functional.softmax_dropout(scores, t(mask), 1.0 / np.sqrt(D), 0.0, False)

    v = t(qkv[2])
    x = rng.standard_normal((1024, 768)).astype(np.float32)
    tiny = x.copy()
    tiny[rng.random(x.shape) < 0.25] = 1e-37
    sub = x.copy()
    sub[rng.random(x.shape) < 0.5] = 1e-39
    w = t(rng.standard_normal((768, 3072)) * 0.02)

    def gemm(inp):
        with paddle.no_grad():
            return functional.matmul(inp["x"], w)

    return {
        "attention fwd+bwd (fused softmax, oneDNN matmuls)":
            ({"mask": t(no_mask), "grad": grad}, {"mask": t(half), "grad": grad}, attention),
        "probs @ v, 96 x 128x128 @ 128x64":
            ({"p": probs_of(no_mask)}, {"p": probs_of(half)}, lambda inp: functional.matmul(inp["p"], v)),
        "FFN GEMM 1024x768 @ 768x3072, 1/4 of the input 1e-37": ({"x": t(x)}, {"x": t(tiny)}, gemm),
        "FFN GEMM 1024x768 @ 768x3072, 1/2 of the input 1e-39 (subnormal)": ({"x": t(x)}, {"x": t(sub)}, gemm),
    }


def run(threads, flush):
    before_paddle()
    # import cost and environment: paddle loads once the flags are parsed and before_paddle() has run
    import paddle
    from ops import functional, library
    paddle.base.core.set_num_threads(threads)
    cpu.flush_denormals(flush)
    library.set_threads(threads)
    library.set_flush_denormals(flush)
    functional.set_precision(fast_ops=True)
    if not library.load():
        raise SystemExit(f"error: the fused operators are not available ({library.state['error']})")
    rows = []
    for name, (random, masked, fn) in cases().items():
        r, m = _median_ms(lambda: fn(random)), _median_ms(lambda: fn(masked))
        rows.append({"name": name, "random_ms": r, "masked_ms": m, "ratio": m / r})
        print(f"  {name:<68} random {r:8.2f} ms  masked {m:8.2f} ms  ratio {m / r:5.2f}", flush=True)
    return {"command": " ".join(["benchmarks/denormals.py"] + sys.argv[1:]), **report.cpu_record(),
            "threads": threads, "flush_denormals": flush, "paddle": paddle.__version__, "python": platform.python_version(),
            "git_commit": report.git_commit(), "load_average_end": os.getloadavg()[0], "rows": rows}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--no-flush", action="store_true", help="runtime.flush_denormals off: the kernels alone")
    p.add_argument("--json", help="default: benchmarks/results/<cpu kind>/denormals[-noflush].json")
    args = p.parse_args()
    result = run(args.threads, not args.no_flush)
    path = args.json or os.path.join(report.results_dir(), "denormals" + ("-noflush" if args.no_flush else "") + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['cpu']} ({result['cpu_kind']}), {args.threads} threads, flush_denormals "
          f"{'on' if result['flush_denormals'] else 'off'}: {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
