"""Check mixed precision on this machine: each recipe trained in fp32 and in each AMP mode on the same
batches from the same initial weights; losses compared, speed-up reported.

python tools/amp_check.py [-c CONFIG ...] [-o k=v ...] [--steps 20] [--tail 3] [--modes fp32 bf16-O1 ...]
                          [--rtol 0.05] [--json PATH]

A mode passes when every loss is finite and the mean of its last `--tail` losses is within `rtol` of
fp32's. On a CPU the AMP modes are bf16 on the fused oneDNN operators (the default modes: fp32 and
bf16-O1; O2 runs as O1 there, float16 is refused), on a GPU paddle.amp's fp16 and bf16 at O1 and O2.
A mode this machine cannot run (a CPU without native bf16) is reported as not run and fails the check.
Exit code 1 if a check fails.

The issue-22 check of the full-size models (200 steps, the mean of steps 151-200 within 2%):
  python tools/amp_check.py -c configs/nlp/bert/bert_base_1000k_pretrain.yaml --steps 200 --tail 50 \
      --rtol 0.02 -o reader.train.files=[data/bert_demo/corpus/train.txt] \
      -o reader.train.vocab_file=data/bert_demo/vocab_30522.txt -o reader.train.collate.max_len=128
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
CPU_MODES = ["fp32", "bf16-O1"]


def run_mode(cfg, batches, mode, seed):
    """The trainer's own TrainStep with the mode's AMP settings (resolved for this machine: None when it
    cannot run them), from the same initial weights. Returns (losses, s/step) or None."""
    from engine import builder, config, runtime
    from engine.training import trainer
    enable, dtype, level = MODES[mode]
    amp = runtime.resolve_amp(config.AmpSection(enable=enable, dtype=dtype, level=level), f"mode {mode}")
    if enable and not amp.enable:
        return None
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


def check(config_path, steps, modes, rtol, overrides=(), tail=3, seed=0):
    from engine import builder, config
    cfg = config.load(config_path, list(overrides))
    loader, _, _ = builder.build_loader(cfg, "train", seed)
    batches = []
    while len(batches) < steps:
        for batch in loader:
            batches.append(batch)
            if len(batches) == steps:
                break
    results = {m: run_mode(cfg, batches, m, seed) for m in modes}
    ref_losses, ref_time = results.get("fp32") or next(r for r in results.values() if r)
    ref = sum(ref_losses[-tail:]) / len(ref_losses[-tail:])
    rows = []
    for mode, result in results.items():
        if result is None:
            rows.append({"config": config_path, "mode": mode, "ran": False, "ok": False})
            continue
        losses, step_time = result
        final = sum(losses[-tail:]) / len(losses[-tail:])
        finite = all(math.isfinite(v) for v in losses)
        close = abs(final - ref) <= rtol * max(abs(ref), 1e-8)
        rows.append({"config": config_path, "mode": mode, "ran": True, "finite": finite, "close_to_fp32": close,
                     "first_loss": losses[0], "final_loss": final, "tail": tail, "relative_to_fp32": final / ref - 1,
                     "losses": losses, "s_per_step": step_time, "speedup_vs_fp32": ref_time / step_time,
                     "ok": finite and close})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", help="recipes (default: every *_demo.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], help="key=value for every recipe")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tail", type=int, default=3, help="compare the mean of the last N losses")
    p.add_argument("--modes", nargs="+", choices=list(MODES), help="default: fp32 bf16-O1 on a CPU, all on a GPU")
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
    modes = args.modes or (CPU_MODES if rt["device"] == "cpu" else list(MODES))
    print(f"device {rt['device']}, paddle {paddle.__version__}, modes {' '.join(modes)}")
    rows = []
    for path in configs:
        for r in check(path, args.steps, modes, args.rtol, args.override, args.tail):
            rows.append(r)
            name = f"{os.path.relpath(r['config'], _bootstrap.ROOT):<60} {r['mode']:<8}"
            if not r["ran"]:
                print(f"{name} FAIL (not run: this machine cannot, see the log line above)")
                continue
            print(f"{name} loss {r['first_loss']:.4f} -> {r['final_loss']:.4f} (last {r['tail']}, "
                  f"{100 * r['relative_to_fp32']:+.2f}% vs fp32)  {r['s_per_step'] * 1000:7.1f} ms/step  "
                  f"x{r['speedup_vs_fp32']:.2f}  "
                  f"{'ok' if r['ok'] else 'FAIL (' + ('non-finite' if not r['finite'] else 'far from fp32') + ')'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(r["ok"] for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
