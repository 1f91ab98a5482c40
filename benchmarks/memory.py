"""Where a training step's memory goes: ours beside PyTorch's, at the shapes of benchmarks/peers.py.

python benchmarks/memory.py [--only NAME ...] [--rounds 2] [--json PATH]   # `make bench-memory`
python benchmarks/memory.py --show [--docs] [--kind KIND]                # the table (docs/performance.md)
python benchmarks/memory.py --run NAME --side ours|theirs [--batch N] [--precision P] [--bf16-activations]
                                                                        # one side's profile, a JSON line

Each side runs in its own process, the sides alternating per round (ours, theirs, then theirs, ours),
with engine/cpu.py's settings for this CPU and the same number of threads. Memory is the process's
resident set, from /proc/self/status: the *baseline* is VmRSS once the framework is imported, before
the model is built (what a user's process has anyway); the model, optimizer and batch are built
(peers.py's), one warm-up step runs, the high-water mark is reset (/proc/self/clear_refs) and one
more step runs: its VmHWM is the *peak*. The table's figure is the peak above the baseline.

What is alive at the peak, counted during that step: parameters, gradients (one per trainable
parameter), the optimizer's state (its tensors), and the tensors saved for the backward pass (caught
by the framework's saved-tensor hooks, each buffer once, parameters excluded, charged to the innermost
layer running when it was saved). The rest is everything else: the batch, transient buffers of the
backward, the kernels' work space, memory the allocator keeps, library pages touched after the
baseline. For ours, paddle's host allocator also gives its peak of live tensors in the step, and
what lies outside it (oneDNN work space, glibc's kept blocks, libraries).

Where a model can recompute its activations (RECOMPUTE), a third run per round is ours with it on:
the table gives its peak and its step time over ours without (one more step after the profiled one,
timed without the counting hooks, in every run).
"""
import argparse
import collections
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import peers, report  # noqa: E402  (no paddle import)
from engine.cpu import process_environment  # noqa: E402
from engine.errors import ConfigError  # noqa: E402  (no paddle import)

MB = 2 ** 20

# the recipe override that turns activation recomputation on, per model (AttentionLSTM has none: its
# LSTMs are one paddle operator each); the table's third run, "ours with recompute"
RECOMPUTE = {"BERT-base": "model.recompute=true", "Transformer-base": "model.recompute=true",
             "TSN-R50": "model.backbone.recompute=true", "DeepLabV3-R50": "model.backbone.recompute=true"}


def status_kb(pid, field):
    """A /proc/PID/status field in kB (VmRSS, VmHWM); None when the process or the field is not there
    (a server's child may end between listing and reading)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def status_mb(key):
    """VmRSS, VmHWM, ... of this process in MB (from /proc/self/status)."""
    kb = status_kb("self", key)
    if kb is None:
        raise KeyError(key)
    return kb / 1024


def reset_peak():
    """Reset VmHWM to the current VmRSS (Linux >= 4.0: "5" to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class SavedForBackward:
    """The bytes of the tensors the autograd saves during a forward, by the innermost layer kind
    running when each was saved; a buffer saved twice (or by two operators) counts once, and buffers in
    `exclude` (the parameters) not at all. `address(t)` and `size(t)` read a framework's tensor."""

    def __init__(self, address, size, exclude=()):
        self.address, self.size = address, size
        self.seen = set(exclude)
        self.by_kind = collections.Counter()
        self.stack = ["(model)"]
        self.saves = 0

    def pack(self, t):
        self.saves += 1
        key = self.address(t)
        if key not in self.seen:
            self.seen.add(key)
            self.by_kind[self.stack[-1]] += self.size(t)
        return t

    @staticmethod
    def unpack(t):
        return t

    def enter(self, layer, *_):
        self.stack.append(type(layer).__name__)      # returns None: the layer's input is kept

    def leave(self, *_):
        self.stack.pop()                             # returns None: the layer's output is kept

    def total(self):
        return sum(self.by_kind.values())


def _mb(nbytes):
    return round(nbytes / MB, 1)


def _ours(spec, threads, precision):
    """(run one step, the layers, parameters, optimizer-state tensors, saved-tensor hooks, allocator)."""
    step, batch, versions = peers.our_step(spec, threads, precision=precision)
    import paddle  # already imported by our_step (the --run child)
    from paddle.base import core  # its host allocator's statistics (the --run child, paddle loaded)
    params = [p for p in step.model.parameters()]

    def nbytes(t):
        return int(t._numel()) * t.element_size()
    saved = SavedForBackward(lambda t: t.data_ptr(), nbytes, {p.data_ptr() for p in params})
    state = lambda: [v for v in step.optimizer.state_dict().values() if isinstance(v, paddle.Tensor)]  # noqa: E731
    allocator = {"reset": lambda: core.host_memory_stat_reset_peak_value("Allocated", 0),
                 "peak": lambda: core.host_memory_stat_peak_value("Allocated", 0)}
    return (lambda: step(batch)["loss"].item(), step.model.sublayers(include_self=True), params, nbytes, state,
            saved, lambda: paddle.autograd.saved_tensors_hooks(saved.pack, saved.unpack), allocator, versions)


def _theirs(spec, threads, precision):
    model, optimizer, step, batch, versions = peers.their_step(spec, threads, precision)
    import torch  # already imported by their_step (the --run child)
    params = list(model.parameters())

    def nbytes(t):
        return t.untyped_storage().nbytes()
    saved = SavedForBackward(lambda t: t.untyped_storage().data_ptr(), nbytes,
                             {p.untyped_storage().data_ptr() for p in params})
    state = lambda: [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]  # noqa: E731
    return (lambda: step(batch).item(), list(model.modules()), params, nbytes, state, saved,
            lambda: torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack), None, versions)


def _in_bf16_activations(run):
    import ops  # the --run child's, paddle loaded

    def bf16_run():
        with ops.precision(bf16_act=True):
            return run()
    return bf16_run


def _hook(layers, side, saved):
    """Forward pre/post hooks on every layer that keep `saved`'s stack of the layer kinds running."""
    if side == "ours":
        return [h for m in layers for h in (m.register_forward_pre_hook(saved.enter),
                                            m.register_forward_post_hook(saved.leave))]
    return [h for m in layers for h in (m.register_forward_pre_hook(saved.enter), m.register_forward_hook(saved.leave))]


def profile(name, side, threads, batch=None, overrides=(), bf16_activations=False, precision="fp32"):
    """One side's memory profile of one training step of peers.PEERS[name] (see the module's doc);
    `overrides`: more recipe overrides on our side (e.g. runtime.keep_freed_memory=false);
    `precision`: one of peers.AMP (ours through train.amp, where the CPU runs it; theirs under autocast);
    `bf16_activations`: our step inside ops.precision(bf16_act=True) whatever the CPU (issue 43; train.amp enters it
    only with native bf16; without, the convolutions compute in fp32 on the rounded operands, the same
    tensors kept)."""
    spec = dict(peers.PEERS[name], **({"batch": batch} if batch else {}))
    spec["overrides"] = list(spec.get("overrides", [])) + list(overrides)
    peers.before_paddle()
    if side == "ours":
        import paddle  # noqa: F401  the framework in the baseline (paddle's import is not the model's memory)
    else:
        import torch  # noqa: F401  (optional, benchmarks/requirements.txt) in the baseline likewise
    baseline = status_mb("VmRSS")
    run, layers, params, nbytes, state, saved, hooks, allocator, versions = (_ours if side == "ours" else _theirs)(
        spec, threads, precision)
    if bf16_activations:
        run = _in_bf16_activations(run)
    built = status_mb("VmRSS")
    run()                                           # warm-up: the optimizer's state, kernel choice, caches
    warm = status_mb("VmRSS")
    # paddle's recompute holds the saved-tensor hooks itself (one pair at a time): with it on, the saved
    # tensors are not counted (they are in the rest)
    counting = RECOMPUTE.get(name) not in overrides
    handles = _hook(layers, side, saved) if counting else []
    reset_peak()
    if allocator:
        allocator["reset"]()
    with hooks() if counting else contextlib.nullcontext():
        loss = run()
    peak = status_mb("VmHWM")
    for h in handles:
        h.remove()
    tic = time.perf_counter()
    run()                                           # timed without the hooks: what recompute costs
    seconds = time.perf_counter() - tic
    state = state()                                # made by the first step
    trainable = [p for p in params if (not p.stop_gradient if side == "ours" else p.requires_grad)]
    parts = {"parameters": sum(nbytes(p) for p in params), "gradients": sum(nbytes(p) for p in trainable),
             "optimizer_state": sum(nbytes(t) for t in state), "saved_for_backward": saved.total()}
    out = {"name": name, "side": side, "batch": spec["batch"], "threads": threads, "loss": loss,
           "baseline_mb": round(baseline, 1), "built_mb": round(built, 1), "warm_mb": round(warm, 1),
           "peak_mb": round(peak, 1), "peak_above_baseline_mb": round(peak - baseline, 1), "s_per_step": seconds,
           "overrides": list(overrides), "precision": precision,
           **({"bf16_activations": True} if bf16_activations else {}),
           **{k + "_mb": _mb(v) for k, v in parts.items()}, **({} if counting else {"saved_for_backward_mb": None}),
           "rest_mb": round(peak - baseline - sum(parts.values()) / MB, 1),
           "saved_by_kind_mb": {k: _mb(v) for k, v in saved.by_kind.most_common() if v >= MB / 10},
           "saved_tensors": saved.saves, **versions}
    if allocator:
        out["allocator_peak_mb"] = _mb(allocator["peak"]())
        out["outside_allocator_mb"] = round(peak - baseline - out["allocator_peak_mb"], 1)
    return out


# ------------------------------------------------------------------------------- the table
def _spawn(name, side, args, env):
    """One profile in its own process; side "recompute" is ours with RECOMPUTE[name]."""
    cmd = [sys.executable, os.path.abspath(__file__), "--run", name, "--threads", str(args.threads)]
    cmd += ["--side", "ours", "-o", RECOMPUTE[name]] if side == "recompute" else ["--side", side]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"error: {name} ({side}) failed")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {name:<17} {side:<7} peak {r['peak_mb']:7.0f} MB, above its baseline {r['peak_above_baseline_mb']:7.0f} "
          f"MB (baseline {r['baseline_mb']:.0f})", flush=True)
    return r


def table(args):
    env = process_environment(dict(os.environ))
    commit = report.git_commit()
    rows = []
    for name in args.only or list(peers.PEERS):
        sides = ("ours", "theirs") + (("recompute",) if name in RECOMPUTE else ())
        runs = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                runs[side].append(_spawn(name, side, args, env))
        # each side's median run by its peak above the baseline (the figure the table compares)
        med = {side: sorted(v, key=lambda x: x["peak_above_baseline_mb"])[(len(v) - 1) // 2] for side, v in runs.items()}
        rows.append({"name": name, "batch": peers.PEERS[name]["batch"], "input": peers.PEERS[name]["input"],
                     "ours": med["ours"], "theirs": med["theirs"], "recompute": med.get("recompute"),
                     "ratio": med["ours"]["peak_above_baseline_mb"] / med["theirs"]["peak_above_baseline_mb"],
                     "runs": runs})
        result = _save(args, rows, commit)
    show(result)


def _save(args, rows, commit):
    first = rows[0]["runs"]
    result = {"command": " ".join(["benchmarks/memory.py"] + sys.argv[1:]), **report.cpu_record(),
              "threads": args.threads, "python": platform.python_version(), "git_commit": commit,
              "rounds": args.rounds, "paddle": first["ours"][0].get("paddle"), "torch": first["theirs"][0].get("torch"),
              "rows": rows}
    peers.write_rows(os.path.join(ROOT, args.json), result, args.only)
    return result


def _parts(p):
    return (f"{p['parameters_mb']:.0f} / {p['gradients_mb']:.0f} / {p['optimizer_state_mb']:.0f} / "
            f"{p['saved_for_backward_mb']:.0f} / {p['rest_mb']:.0f}")


def table_lines(result):
    lines = [f"{result['cpu']} ({result.get('cpu_kind')}), {result['threads']} threads, paddle {result.get('paddle')} "
             f"vs torch {result.get('torch')}, fp32, {result['rounds']} rounds per side (each side's median run by peak "
             f"above baseline; of two, the lower), commit "
             f"{str(result.get('git_commit'))[:10]}",
             "",
             "| model | batch | ours: peak / baseline MB | PyTorch: peak / baseline MB | ours / PyTorch above baseline "
             "| ours: params / grads / optimizer / saved / rest MB | PyTorch: the same | ours: outside paddle's allocator MB "
             "| ours with recompute: above baseline MB (step time x) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        o, t = r["ours"], r["theirs"]
        lines.append(f"| {r['name']} | {r['batch']} | {o['peak_mb']:.0f} / {o['baseline_mb']:.0f} | "
                     f"{t['peak_mb']:.0f} / {t['baseline_mb']:.0f} | **{r['ratio']:.2f}** | {_parts(o)} | {_parts(t)} | "
                     f"{o.get('outside_allocator_mb', float('nan')):.0f} | {_recompute(r)} |")
    return lines


def _recompute(row):
    """"peak (step time with / without)", the medians of the recompute and plain runs; "-" without."""
    rc = row.get("recompute")
    if not rc:
        return "-"
    times = {side: statistics.median(x["s_per_step"] for x in row["runs"][side]) for side in ("ours", "recompute")}
    return f"{rc['peak_above_baseline_mb']:.0f} ({times['recompute'] / times['ours']:.2f}x)"


def show(result):
    print("\n" + "\n".join(table_lines(result)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=list(peers.PEERS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--json", help="default: benchmarks/results/<this CPU's kind>/memory.json")
    p.add_argument("--kind", help="with --show/--docs: the results of this CPU kind (default: this machine's)")
    p.add_argument("--show", action="store_true")
    p.add_argument("--docs", action="store_true", help="write the table from the JSON into docs/performance.md")
    p.add_argument("--run", choices=list(peers.PEERS), help="one side's profile in this process: a JSON line")
    p.add_argument("--side", choices=["ours", "theirs"], default="ours")
    p.add_argument("--batch", type=int, help="with --run: another batch size than the table's")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="with --run --side ours: a recipe override (e.g. runtime.keep_freed_memory=false)")
    p.add_argument("--precision", choices=list(peers.AMP), default="fp32",
                   help="with --run: the side's precision (benchmarks/peers.py's; ours needs native bf16)")
    p.add_argument("--bf16-activations", action="store_true",
                   help="with --run --side ours: the step inside ops.precision(bf16_act=True) (issue 43, measuring)")
    args = p.parse_args()
    args.json = args.json or os.path.relpath(os.path.join(report.results_dir(args.kind), "memory.json"), ROOT)
    if args.run:
        try:
            print(json.dumps(profile(args.run, args.side, args.threads, args.batch, args.override,
                                     args.bf16_activations, args.precision)))
        except ConfigError as e:      # a bad -o: one line, as the tools give it
            raise SystemExit(f"error: {e}") from None
    elif args.show or args.docs:
        if not os.path.isfile(os.path.join(ROOT, args.json)):
            raise SystemExit(f"error: {args.json}: no memory results of this CPU kind yet (make bench-memory)")
        with open(os.path.join(ROOT, args.json)) as f:
            result = json.load(f)
        show(result)
        if args.docs:
            report.write_page("bench-memory", result.get("cpu_kind"), table_lines(result), "benchmarks/memory.py --docs")
    else:
        table(args)


if __name__ == "__main__":
    main()
