"""The kernels our oneDNN operators replace, shape by shape: paddle's own kernel against our operator
(ops/) in one process, and PyTorch's in another (same threads, same environment).

python benchmarks/kernel_shapes.py [--threads 2] [--no-torch] [--json PATH]
python benchmarks/kernel_shapes.py --conv-routes [--threads 2]

GEMMs of the Transformer-base step: batch 32 x 32 tokens (1024 rows), d_model 512, FFN 2048, 8 heads,
vocabulary 33712; per layer shape the forward GEMM and both gradients (dX = dY W^T, dW = X^T dY), the
tied output projection h @ E^T and the batched attention products (paddle.matmul vs functional.matmul).
Convolutions of the ResNet-50 recipes, forward + both gradients as in a training step: TSN-R50's
(4 videos x 3 segments = 12 frames at 224) and DeepLabV3-R50 OS8's dilated ones (2 images at 512),
paddle's conv2d vs functional.conv2d.

Prints milliseconds per call (the mean over `_per_call`'s budget of seconds; outputs allocated per
call, as in training) and the paddle / oneDNN ratio: where it is above 1 the operator is worth using
(docs/performance.md#fused-operators has our AMD EPYC's; re-run it on a new CPU).

The bf16 columns (issue 22) time the same calls under ops.precision(bf16=True), both routes: "bf16"
rounds the fp32 operands to bf16 at the operator (what train.amp.dtype bfloat16 runs), "fpmath" gives
oneDNN the fp32 operands with fpmath_mode = bf16; torch's under torch.autocast("cpu", bfloat16). fp32/bf16 is our
fp32 operator's time over our bf16 one's.

`--conv-routes` times our two fp32 convolution operators on the same layers, forward + backward:
oneDNN's direct kernels (zoo_conv2d) against im2col over the batch and one GEMM per pass
(zoo_conv2d_gemm), over output maps of 1 x 1 to 7 x 7, and prints direct / GEMM: above 1 the GEMM is
the faster. ops.functional.GEMM_MAP, the largest map the GEMM takes, comes from this table (re-run it
on a new CPU kind).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import report  # noqa: E402
from engine.cpu import before_paddle, process_environment  # noqa: E402  (no paddle import)
from engine import cpu  # noqa: E402

# name, batch (0: plain 2-D), M, K, N, transpose_x, transpose_y
SHAPES = []
for _k, _n, _name in [(512, 1536, "qkv"), (512, 512, "q/out"), (512, 1024, "kv"), (512, 2048, "ffn1"),
                      (2048, 512, "ffn2")]:
    SHAPES += [(f"{_name} fwd", 0, 1024, _k, _n, False, False), (f"{_name} dX", 0, 1024, _n, _k, False, True),
               (f"{_name} dW", 0, _k, 1024, _n, True, False)]
SHAPES += [("logits fwd", 0, 1024, 512, 33712, False, True), ("logits dH", 0, 1024, 33712, 512, False, False),
           ("logits dE", 0, 33712, 1024, 512, True, False),
           ("q k^T", 256, 32, 64, 32, False, True), ("w v", 256, 32, 32, 64, False, False),
           ("dw = dO v^T", 256, 32, 64, 32, False, True), ("dv = w^T dO", 256, 32, 32, 64, True, False)]


# name, N, C, H, W, out channels, kernel, stride, dilation (padding keeps the size: dilation * (k - 1) / 2)
CONVS = [("tsn stem 7x7/2", 12, 3, 224, 224, 64, 7, 2, 1), ("tsn res2 3x3", 12, 64, 56, 56, 64, 3, 1, 1),
         ("tsn res2 1x1", 12, 256, 56, 56, 64, 1, 1, 1), ("tsn res3 3x3", 12, 128, 28, 28, 128, 3, 1, 1),
         ("tsn res4 3x3", 12, 256, 14, 14, 256, 3, 1, 1), ("tsn res5 3x3", 12, 512, 7, 7, 512, 3, 1, 1),
         ("dlv3 res4 3x3 d2", 2, 256, 64, 64, 256, 3, 1, 2), ("dlv3 res5 3x3 d4", 2, 512, 64, 64, 512, 3, 1, 4),
         ("dlv3 aspp 3x3 d12", 2, 2048, 64, 64, 256, 3, 1, 12),
         ("demo res5 3x3 2x2", 24, 512, 2, 2, 512, 3, 1, 1),    # StNet's and TSN's demos (56 px): one GEMM
         ("dlv3 aspp pool 1x1", 2, 2048, 1, 1, 256, 1, 1, 1)]


def _per_call(fn, budget=0.5):
    fn()
    n, tic = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - tic < budget:
        fn()
        n += 1
    return (time.perf_counter() - tic) / n


def _operands(rand, batch, M, K, N, tx, ty):
    lead = [batch] if batch else []
    return rand(lead + ([K, M] if tx else [M, K])), rand(lead + ([N, K] if ty else [K, N]))


def _paddle_with_our_operators(threads):
    """paddle and ops.functional, set up for timing in a child process (--side paddle or routes)."""
    before_paddle()
    # in the child only, once before_paddle() has set what paddle reads when it loads
    import paddle
    from ops import functional, library
    cpu.keep_freed_memory()   # the kernels' time, not that of faulting their outputs in (runtime.keep_freed_memory)
    paddle.base.core.set_num_threads(threads)
    library.set_threads(threads)
    functional.set_precision(fast_ops=True)
    if not functional.active(paddle.ones([1])) or not library.state["dnnl"]:
        raise SystemExit(f"error: the oneDNN operators are not available ({library.state['error']})")
    return paddle, functional


def run_paddle(threads):
    paddle, functional = _paddle_with_our_operators(threads)
    import ops   # loaded by the setup above already; for the precision and the bf16 query
    bf16 = ops.bf16_supported()

    def timed(fn):
        """paddle's kernel, ours in fp32, ours in bf16 (both routes; None without native bf16)."""
        times = [_per_call(lambda: fn("paddle")), _per_call(lambda: fn("fp32"))]
        for route in ops.functional.BF16_ROUTES:
            with ops.precision(bf16=True, route=route):
                times.append(_per_call(lambda: fn("fp32")) if bf16 else None)
        return times

    gemms, convs = {}, {}
    for name, batch, M, K, N, tx, ty in SHAPES:
        x, y = _operands(paddle.rand, batch, M, K, N, tx, ty)
        gemms[name] = timed(lambda side: (paddle.matmul if side == "paddle" else functional.matmul)(x, y, tx, ty))
    for name, n, c, h, w, o, k, stride, dilation in CONVS:
        conv = paddle.nn.Conv2D(c, o, k, stride=stride, padding=dilation * (k - 1) // 2, dilation=dilation,
                                bias_attr=False)
        x = paddle.rand([n, c, h, w])
        x.stop_gradient = False

        def step(side):
            with functional.precision(fast_ops=side != "paddle"):
                functional.conv2d(x, conv).sum().backward()
        convs[name] = timed(step)
    return {"gemm": gemms, "conv": convs, "bf16": bf16}


# N, C, out channels, kernel (padding keeps the size) for --conv-routes: ResNet last-stage layers
ROUTE_LAYERS = [(8, 512, 512, 3), (32, 512, 512, 3), (32, 256, 256, 3), (32, 2048, 512, 1), (32, 512, 2048, 1),
                (32, 128, 128, 3)]


def run_routes(threads):
    """ms per forward + backward of zoo_conv2d and zoo_conv2d_gemm for each layer and map size."""
    paddle, functional = _paddle_with_our_operators(threads)
    rows = []
    for size in (1, 2, 3, 4, 5, 7):
        for n, c, o, k in ROUTE_LAYERS:
            x, w = paddle.rand([n, c, size, size]), paddle.rand([o, c, k, k]) - 0.5
            x.stop_gradient = w.stop_gradient = False
            pad = [k // 2] * 2
            times = [_per_call(lambda: functional._run(op, x, w, [1, 1], pad, [1, 1], *extra, True, False)[0]
                               .sum().backward()) for op, extra in (("zoo_conv2d", (1,)), ("zoo_conv2d_gemm", ()))]
            rows.append([n, c, size, o, k] + times)
    return rows


def run_torch(threads):
    import torch   # optional (benchmarks/requirements.txt), in the --side torch child only
    torch.set_num_threads(threads)
    gemms, convs = {}, {}

    def timed(fn):
        fp32 = _per_call(fn)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fp32, _per_call(fn)
    for name, batch, M, K, N, tx, ty in SHAPES:
        x, y = _operands(lambda s: torch.rand(*s), batch, M, K, N, tx, ty)
        a, b = (x.transpose(-1, -2) if tx else x), (y.transpose(-1, -2) if ty else y)
        gemms[name] = timed(lambda: torch.matmul(a, b))
    for name, n, c, h, w, o, k, stride, dilation in CONVS:
        x = torch.rand(n, c, h, w, requires_grad=True)
        weight = torch.rand(o, c, k, k, requires_grad=True)
        convs[name] = timed(lambda: torch.nn.functional.conv2d(
            x, weight, stride=stride, padding=dilation * (k - 1) // 2, dilation=dilation).sum().backward())
    return {"gemm": gemms, "conv": convs}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", help="also write the times here (e.g. benchmarks/results/<kind>/kernel_shapes.json)")
    p.add_argument("--conv-routes", action="store_true", help="our two convolution operators, map by map")
    p.add_argument("--side", choices=["paddle", "torch", "routes"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        print(json.dumps({"paddle": run_paddle, "torch": run_torch, "routes": run_routes}[args.side](args.threads)))
        return
    env = process_environment(dict(os.environ))
    if args.conv_routes:
        return _print_routes(_child("routes", args.threads, env), args.threads)
    results = {}
    for side in ["paddle"] + ([] if args.no_torch else ["torch"]):
        results[side] = _child(side, args.threads, env)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{cpu.cpu_info()['model']}, {args.threads} threads, load average {load}")
    tables = [("gemm", "GEMM", "M x K x N", [(r[0], (f"{r[1]}x" if r[1] else "") + f"{r[2]}x{r[3]}x{r[4]}")
                                             for r in SHAPES]),
              ("conv", "conv fwd+bwd", "N x C x H x W > O", [(r[0], f"{r[1]}x{r[2]}x{r[3]}x{r[4]}>{r[5]}")
                                                            for r in CONVS])]
    ms = lambda v: f"{v * 1e3:.2f}" if v is not None else "-"   # noqa: E731
    for kind, title, size_title, rows in tables:
        print(f"\n{title:<18} {size_title:>20} {'paddle':>8} {'oneDNN':>8} {'bf16':>8} {'fpmath':>8} {'torch':>8} "
              f"{'torch bf16':>10} {'paddle/oneDNN':>14} {'fp32/bf16':>10}   (ms per call)")
        for name, size in rows:
            pd_t, dn_t, b16, fpm = results["paddle"][kind][name]
            th, th16 = results["torch"][kind][name] if "torch" in results else (None, None)
            print(f"{name:<18} {size:>20} {ms(pd_t):>8} {ms(dn_t):>8} {ms(b16):>8} {ms(fpm):>8} {ms(th):>8} "
                  f"{ms(th16):>10} {pd_t / dn_t:14.2f} {dn_t / b16 if b16 else float('nan'):10.2f}")
    if args.json:
        record = {"command": " ".join(["benchmarks/kernel_shapes.py"] + sys.argv[1:]), **report.cpu_record(),
                  "threads": args.threads, "load_average_end": load, "git_commit": report.git_commit(),
                  "columns": ["paddle_s", "ours_fp32_s", "ours_bf16_s", "ours_fpmath_bf16_s"],
                  "torch_columns": ["torch_fp32_s", "torch_autocast_bf16_s"], **results}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)

def _child(side, threads, env):
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--threads", str(threads)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"error: {side} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_routes(rows, threads):
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{cpu.cpu_info()['model']}, {threads} threads, load average {load}\n")
    print(f"{'N x C x map > O, kernel':<28} {'direct':>8} {'GEMM':>8} {'direct/GEMM':>12}   (ms, forward + backward)")
    for n, c, size, o, k, direct, gemm in rows:
        layer = f"{n}x{c}x{size}x{size}>{o}, {k}x{k}"
        print(f"{layer:<28} {direct * 1e3:8.2f} {gemm * 1e3:8.2f} {direct / gemm:12.2f}")


if __name__ == "__main__":
    main()
