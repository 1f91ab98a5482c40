"""Mixed precision against fp32 (tools/amp_check.py): each mode trains a recipe through the trainer's own
TrainStep from the same initial weights on the same batches, so that a loss drifting away from fp32's is
the precision's doing, not the harness's.

The engine beyond engine.config (the table of modes, no paddle) is imported inside the functions:
tools/amp_check.py builds its parser from MODES, and its --help or a wrong flag answers at once,
without paddle (docs/performance.md#import-costs).
"""
import glob
import math
import os
import time

from benchmarks.report import ROOT
from engine import config   # the table of modes: no paddle (the parser reads MODES)

# (enable, dtype, level) of each of engine.config.AMP_MODES, the one table of modes (fp32: AMP off)
MODES = {name: (amp is not None, *(amp or ("float16", "O1"))) for name, (amp, _) in config.AMP_MODES.items()}
CPU_MODES = list(config.CPU_AMP_MODES)


def run_mode(cfg, batches, mode, seed):
    """The trainer's own TrainStep with the mode's AMP settings (resolved for this machine: None when it
    cannot run them), from the same initial weights. Returns (losses, s/step) or None."""
    # import cost: paddle loads once a check runs, not for tools/amp_check.py's parser (MODES)
    from engine import builder, runtime
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
    from engine import builder  # import cost: as in run_mode
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


def check_all(configs, steps, modes, rtol, overrides, tail):
    """check() of each recipe (default: every *_demo.yaml) in each mode (default: this device's), a line
    per row printed as soon as the recipe is done (a long check shows its progress). Returns the rows."""
    # import cost: as in run_mode
    import paddle
    from engine import runtime
    from engine.components import load_all
    load_all()
    configs = configs or sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"), recursive=True))
    rt = runtime.setup(config.RuntimeSection())
    modes = modes or (CPU_MODES if rt["device"] == "cpu" else list(MODES))
    print(f"device {rt['device']}, paddle {paddle.__version__}, modes {' '.join(modes)}")
    rows = []
    for path in configs:
        for r in check(path, steps, modes, rtol, overrides, tail):
            rows.append(r)
            name = f"{os.path.relpath(r['config'], ROOT):<60} {r['mode']:<8}"
            if not r["ran"]:
                print(f"{name} FAIL (not run: this machine cannot, see the log line above)")
                continue
            print(f"{name} loss {r['first_loss']:.4f} -> {r['final_loss']:.4f} (last {r['tail']}, "
                  f"{100 * r['relative_to_fp32']:+.2f}% vs fp32)  {r['s_per_step'] * 1000:7.1f} ms/step  "
                  f"x{r['speedup_vs_fp32']:.2f}  "
                  f"{'ok' if r['ok'] else 'FAIL (' + ('non-finite' if not r['finite'] else 'far from fp32') + ')'}")
    return rows
