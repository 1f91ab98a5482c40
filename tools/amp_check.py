"""Check mixed precision on this machine: each demo recipe a few steps in fp32, fp16 O1/O2 and bf16.

python tools/amp_check.py [-c CONFIG ...] [--steps 20] [--modes fp32 fp16-O1 fp16-O2 bf16-O1 bf16-O2]
                          [--rtol 0.05] [--json PATH]

For each recipe and mode it trains from the same initial weights on the same batches, checks that every
loss is finite and that the final losses stay within `rtol` of fp32, and reports the speed-up over
fp32. On a CPU Paddle's AMP is a no-op (it warns and computes in fp32): the run then checks the code
path only and the speed-ups are ~1.0. Exit code 1 if a check fails.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import glob
import json
import math
import os
import time

from engine import cli

MODES = {"fp32": (False, "float16", "O1"), "fp16-O1": (True, "float16", "O1"),
         "fp16-O2": (True, "float16", "O2"), "bf16-O1": (True, "bfloat16", "O1"),
         "bf16-O2": (True, "bfloat16", "O2")}


def run_mode(cfg, batches, mode, seed):
    """The trainer's own TrainStep with the mode's AMP settings, from the same initial weights."""
    from engine import builder, config, runtime
    from engine.training import trainer
    enable, dtype, level = MODES[mode]
    amp = config.AmpSection(enable=enable, dtype=dtype, level=level)
    runtime.seed_all(seed)
    model = builder.build_model(cfg["model"])
    train_step = trainer.build_train_step(cfg, model, max(1, len(batches)), max(1, len(batches)), amp=amp)
    train_step.model.train()
    losses, tic = [], None
    for i, batch in enumerate(batches):
        if i == 1:
            tic = time.perf_counter()  # the first step pays for allocations
        losses.append(float(train_step(batch)["loss"].astype("float32").item()))
    step_time = (time.perf_counter() - tic) / max(1, len(batches) - 1)
    return losses, step_time


def check(config_path, steps, modes, rtol, seed=0):
    from engine import builder, config
    cfg = config.load(config_path)
    loader, _, _ = builder.build_loader(cfg, "train", seed)
    batches = []
    while len(batches) < steps:
        for batch in loader:
            batches.append(batch)
            if len(batches) == steps:
                break
    results = {m: run_mode(cfg, batches, m, seed) for m in modes}
    ref_losses, ref_time = results.get("fp32", next(iter(results.values())))
    ref = sum(ref_losses[-3:]) / len(ref_losses[-3:])
    rows = []
    for mode, (losses, step_time) in results.items():
        final = sum(losses[-3:]) / len(losses[-3:])
        finite = all(math.isfinite(v) for v in losses)
        close = abs(final - ref) <= rtol * max(abs(ref), 1e-8)
        rows.append({"config": config_path, "mode": mode, "finite": finite, "close_to_fp32": close,
                     "first_loss": losses[0], "final_loss": final, "s_per_step": step_time,
                     "speedup_vs_fp32": ref_time / step_time, "ok": finite and close})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", help="recipes (default: every *_demo.yaml)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--rtol", type=float, default=0.05, help="final loss vs fp32, relative")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()

    import paddle
    from engine import config, runtime
    from engine.components import load_all
    load_all()
    configs = args.config or sorted(glob.glob(os.path.join(_bootstrap.ROOT, "configs", "**", "*_demo.yaml"),
                                              recursive=True))
    rt = runtime.setup(config.RuntimeSection())
    print(f"device {rt['device']}, paddle {paddle.__version__}"
          + ("" if rt["device"] == "gpu" else " (CPU: AMP is a no-op, only the code path is checked)"))
    rows = []
    for path in configs:
        for r in check(path, args.steps, args.modes, args.rtol):
            rows.append(r)
            print(f"{os.path.relpath(r['config'], _bootstrap.ROOT):<60} {r['mode']:<8} loss {r['first_loss']:.4f} -> "
                  f"{r['final_loss']:.4f}  {r['s_per_step'] * 1000:7.1f} ms/step  x{r['speedup_vs_fp32']:.2f}  "
                  f"{'ok' if r['ok'] else 'FAIL (' + ('non-finite' if not r['finite'] else 'far from fp32') + ')'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
