"""Our training step against a PyTorch eager peer at the same shapes, on this machine, in one run.

python benchmarks/peers.py [--only BERT-base ...] [--rounds 2] [--steps 3] [--reference]
                           [--json PATH]                 # `make bench-peers`
python benchmarks/peers.py --show [--docs] [--kind KIND]   # the table from the JSON (into docs/performance.md)
python benchmarks/peers.py --mixed [--only ...] [--rounds 2]   # bf16: ours vs torch.autocast, ours fp32 beside
python benchmarks/peers.py --show --mixed [--docs]             # that table (peers_bf16.json)
python benchmarks/peers.py --plain [--only TSN-R50 ...]   # the models as a library, in a plain loop each side
python benchmarks/peers.py --show --plain [--docs]            # that table (peers_plain.json)
python benchmarks/peers.py --run NAME --side ours|theirs [--precision fp32|bf16|bf16act|bf16-fp32act] [--steps N]
                           [--profile] [--plain]

Each (model, side) runs in its own process with the same environment (engine/cpu.py's settings for
this CPU) and the same number of math threads; the sides alternate (ours, theirs, then theirs,
ours, ...) so that a change in the machine's load hits both. Ours is timed through the trainer's
own step function (`engine.training.trainer.build_train_step` -> TrainStep: forward, backward, clipping,
optimizer, LR schedule) on the model the recipe builds; theirs is benchmarks/torch_peers.py. Both
get the same numpy batch (`make_batch`), a warm-up step, then `--steps` timed steps; a side's time is
the median step. The ratio is our samples/s over theirs (> 1: we are faster). `--reference` adds
our pure-Paddle path (`runtime.fast_ops: false`). `--profile` prints the per-op table of a side.
`--mixed` times mixed precision instead: our bf16 step (train.amp.dtype bfloat16: oneDNN bf16 GEMMs and
convolutions, bf16 activations between a CNN's operators), PyTorch's step under torch.autocast("cpu",
bfloat16), and our fp32 step, alternating in the same way; each side's peak memory (ru_maxrss of its
process) beside. JSON: peers_bf16.json. `--run ... --precision bf16-fp32act`: our bf16 step with fp32
activations between the operators (train.amp.activations float32; `bf16act` names the default);
PyTorch's side runs the same autocast for every bf16 precision.
`--plain` times what a user who takes a model into a loop of their own gets (issue 62): ours built as
`api.models.create_model` builds it (our kernels and CPU settings come with it) and trained by paddle's own
Momentum (backward, step, clear_grad), theirs the same network with torch.optim.SGD and no clipping;
both children start from this process's environment as it is, without our pre-import settings.
Results are per CPU kind (benchmarks/report.py): the JSON defaults to
benchmarks/results/<kind>/peers.json of the machine at hand, and `--docs` (alias `--readme`) replaces
only that kind's table in docs/performance.md (`--kind` shows or writes another kind's JSON).
Needs benchmarks/requirements.txt (torch, transformers) on top of the runtime requirements.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import report  # noqa: E402
from engine.cpu import before_paddle, process_environment  # noqa: E402  (no paddle import)

# the precisions a side can run: ours through the recipe's AMP keys, theirs with torch.autocast("cpu", bfloat16)
# (bf16: train.amp's default activations, bfloat16; bf16act names them; bf16-fp32act: float32 between operators)
AMP = {"fp32": [], "bf16": ["train.amp.enable=true", "train.amp.dtype=bfloat16"],
       "bf16act": ["train.amp.enable=true", "train.amp.dtype=bfloat16", "train.amp.activations=bfloat16"],
       "bf16-fp32act": ["train.amp.enable=true", "train.amp.dtype=bfloat16", "train.amp.activations=float32"]}

# the models of the mixed-precision table (issue 22's four)
MIXED = ("BERT-base", "Transformer-base", "TSN-R50", "DeepLabV3-R50")

# --plain: the models a plain loop is timed for, with their recipes' Momentum (learning rate, weight decay)
PLAIN = {"TSN-R50": dict(lr=0.01, weight_decay=1e-4, input="4 videos x 3 segments x 224, Momentum + L2 1e-4, no clip"),
         "DeepLabV3-R50": dict(lr=0.01, weight_decay=4e-5, input="R50-vd OS8, 2 x 512x512, 21 classes, Momentum + L2 4e-5")}

# name -> our recipe (+ overrides), batch size, the shapes in words
PEERS = {
    "BERT-base": dict(key="bert", config="configs/nlp/bert/bert_base_1000k_pretrain.yaml", batch=8,
                      input="pretraining MLM + NSP, seq 128 (lengths 64-128, padded), 20 masked tokens, AdamW"),
    "Transformer-base": dict(key="transformer", config="configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml",
                             batch=32, input="32 sentence pairs of 10-32 subwords (padded to 32), vocabulary 33712, Adam"),
    "TSN-R50": dict(key="tsn", config="configs/video/tsn/tsn_r50_100e_k400.yaml", batch=4,
                    input="4 videos x 3 segments x 224, Momentum, clip 40"),
    "DeepLabV3-R50": dict(key="deeplabv3", config="configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml",
                          batch=2, overrides=["runtime.sync_bn=false"],
                          input="R50-vd OS8, 2 x 512x512, 21 classes, Momentum"),
    "AttentionLSTM": dict(key="attention_lstm", config="configs/video/attention_lstm/attention_lstm_bilstm_10e_youtube8m.yaml",
                          batch=16, input="16 videos of 10-150 frames (padded), rgb 1024 + audio 128, RMSProp"),
}


def make_batch(key, batch, seed=0):
    """The numpy batch both sides train on (keys as our readers and collates name them)."""
    rng = np.random.default_rng(seed)
    if key == "bert":
        S, P = 128, 20
        lengths = rng.integers(64, S + 1, batch)
        ids = rng.integers(1000, 30522, (batch, S))
        mask = (np.arange(S)[None] < lengths[:, None])
        types = (np.arange(S)[None] >= (lengths // 2)[:, None]) & mask
        pos = np.stack([np.sort(rng.choice(np.arange(1, n - 1), P, replace=False)) for n in lengths])
        return {"input_ids": (ids * mask).astype(np.int64), "token_type_ids": types.astype(np.int64),
                "input_ids_mask": mask.astype(np.float32), "masked_lm_positions": pos.astype(np.int64),
                "masked_lm_ids": rng.integers(1000, 30522, (batch, P)).astype(np.int64),
                "next_sentence_label": rng.integers(0, 2, batch).astype(np.int64)}
    if key == "transformer":
        T, V = 32, 33712
        out = {}
        for name, lengths in (("src", rng.integers(10, T + 1, batch)), ("tgt", rng.integers(10, T + 1, batch))):
            mask = np.arange(T)[None] < lengths[:, None]
            words = rng.integers(3, V, (batch, T))
            words[np.arange(batch), lengths - 1] = 1                      # <e>
            if name == "src":
                out["src_ids"], out["src_ids_mask"] = (words * mask).astype(np.int64), mask.astype(np.float32)
            else:
                tgt_in = np.concatenate([np.zeros((batch, 1), np.int64), words[:, :-1]], 1) * mask   # <s> = 0
                out.update(tgt_in=tgt_in.astype(np.int64), tgt_out=(words * mask).astype(np.int64),
                           tgt_in_mask=mask.astype(np.float32), tgt_out_mask=mask.astype(np.float32))
        return out
    if key == "tsn":
        return {"imgs": rng.standard_normal((batch, 3, 3, 224, 224), np.float32),
                "label": rng.integers(0, 400, batch).astype(np.int64)}
    if key == "deeplabv3":
        label = rng.integers(0, 21, (batch, 512, 512)).astype(np.int64)
        label[:, :32] = 255
        return {"image": rng.standard_normal((batch, 3, 512, 512), np.float32), "label": label}
    if key == "attention_lstm":
        lengths = rng.integers(10, 151, batch)
        T = int(lengths.max())
        mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
        labels = np.zeros((batch, 3862), np.float32)
        labels[np.arange(batch)[:, None], rng.integers(0, 3862, (batch, 3))] = 1
        out = {"labels": labels}
        for name, dim in (("rgb", 1024), ("audio", 128)):
            out[name] = rng.standard_normal((batch, T, dim), np.float32) * mask[..., None]
            out[name + "_len"], out[name + "_mask"] = lengths.astype(np.int64), mask
        return out
    raise KeyError(key)


# ------------------------------------------------------------------------------- one process
def our_step(spec, threads, fast_ops=True, precision="fp32"):
    """(the trainer's TrainStep on the recipe's model, its batch of paddle tensors, versions)."""
    before_paddle()
    # in the --run child only, once before_paddle() has set what paddle reads when it loads
    import paddle
    from engine.session import Session
    from engine.training import trainer
    overrides = [f"runtime.num_threads={threads}", f"runtime.fast_ops={'true' if fast_ops else 'false'}",
                 "runtime.seed=0", *AMP[precision], *spec.get("overrides", [])]   # the spec's last: they win
    s = Session.from_file(os.path.join(ROOT, spec["config"]), overrides)
    s.setup()
    if precision != "fp32" and not s.train_amp.enable:
        raise SystemExit(f"error: {precision}: this CPU or build cannot run it (see the log line above)")
    step = trainer.build_train_step(s.cfg, s.model(), steps_per_epoch=100, total_steps=1000, amp=s.train_amp)
    step.model.train()
    batch = {k: paddle.to_tensor(v) for k, v in make_batch(spec["key"], spec["batch"]).items()}
    batch["index"] = paddle.arange(spec["batch"], dtype="int64")
    return step, batch, {"paddle": paddle.__version__}


def our_plain_step(name, spec, threads):
    """(step() -> loss, versions): the recipe's model in a plain paddle loop with paddle's Momentum, as a
    user writes it (no before_paddle(), no trainer): built as api.models.create_model builds it, the
    trainer's CPU settings (runtime.setup_cpu) then the registry's model (benchmarks sit below api/)."""
    import paddle   # in the --run child only, as a user's script loads it
    from engine import builder, config, runtime
    from engine.components import load_all
    load_all()
    cfg = config.load(os.path.join(ROOT, spec["config"]), [f"runtime.num_threads={threads}"])
    runtime.setup_cpu(cfg.runtime)
    model = builder.build_model(cfg["model"])
    paddle.seed(0)
    model.train()
    optimizer = paddle.optimizer.Momentum(learning_rate=PLAIN[name]["lr"], momentum=0.9,
                                          parameters=model.parameters(), weight_decay=PLAIN[name]["weight_decay"])
    batch = {k: paddle.to_tensor(v) for k, v in make_batch(spec["key"], spec["batch"]).items()}

    def step():
        loss = model(batch)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        return loss.item()
    return step, {"paddle": paddle.__version__}


def their_step(spec, threads, precision="fp32", plain=False):
    """(model, optimizer, step_fn(batch) -> loss, the numpy batch, versions) of benchmarks/torch_peers.py."""
    # an optional dependency (benchmarks/requirements.txt), in the --run child only
    import torch
    from benchmarks import torch_peers
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    extra = {"plain": True} if plain else {}
    model, optimizer, step = torch_peers.BUILDERS[spec["key"]](spec, autocast=precision != "fp32", **extra)
    return model, optimizer, step, make_batch(spec["key"], spec["batch"]), {"torch": torch.__version__}


def _ours(spec, threads, fast_ops, precision="fp32"):
    step, batch, versions = our_step(spec, threads, fast_ops, precision)
    return lambda: step(batch)["loss"].item(), versions


def _theirs(spec, threads, precision="fp32", plain=False):
    _, _, step, batch, versions = their_step(spec, threads, precision, plain)
    return lambda: step(batch).item(), versions


def _profile(side, run):
    if side == "theirs":
        import torch.profiler as tp   # optional (benchmarks/requirements.txt): the PyTorch side's child only
        with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
            run()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    else:
        import paddle.profiler as pp   # loaded for --profile only
        prof = pp.Profiler(targets=[pp.ProfilerTarget.CPU], timer_only=False)
        prof.start()
        run()
        prof.step()
        prof.stop()
        prof.summary(op_detail=True, thread_sep=False, time_unit="ms", views=pp.SummaryView.OperatorView)


def run_one(name, side, steps, threads, fast_ops=True, profile=False, precision="fp32", plain=False):
    spec = PEERS[name]
    if plain and name not in PLAIN:
        raise SystemExit(f"error: --plain times {', '.join(PLAIN)}, not {name}")
    if side == "theirs":
        run, versions = _theirs(spec, threads, precision, plain)
    else:
        run, versions = our_plain_step(name, spec, threads) if plain else _ours(spec, threads, fast_ops, precision)
    loss = run()                                   # warm-up: allocations, kernel choice, op compilation
    if profile:
        _profile(side, run)
    times = []
    for _ in range(steps):
        tic = time.perf_counter()
        loss = run()
        times.append(time.perf_counter() - tic)
    return {"name": name, "side": side, "fast_ops": fast_ops if side == "ours" else None, "threads": threads,
            "precision": precision, "plain": plain, "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "times": times, "s_per_step": statistics.median(times), "loss": loss,
            "samples_per_s": spec["batch"] / statistics.median(times), **versions}


# ------------------------------------------------------------------------------- the table
def _load():
    return os.getloadavg()[0]


def _spawn(name, side, args, env, fast_ops=True, root=ROOT, precision="fp32"):
    """One side in its own process; `root` another checkout for the baseline side (its own peers.py)."""
    cmd = [sys.executable, os.path.join(root, "benchmarks", "peers.py"), "--run", name, "--side", side,
           "--steps", str(args.steps), "--threads", str(args.threads)] + ([] if fast_ops else ["--no-fast-ops"])
    cmd += ["--precision", precision] if precision != "fp32" else []
    cmd += ["--plain"] if getattr(args, "plain", False) else []
    load = _load()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"error: {name} ({side}) failed")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(load_before=load, load_after=_load())
    label = side if side == "theirs" else ("baseline" if root != ROOT else "ours" if fast_ops else "ours-ref")
    label += "" if precision == "fp32" else f"-{precision}"
    print(f"  {name:<17} {label:<8} {result['s_per_step']:8.3f} s/step  {result['samples_per_s']:7.2f} samples/s  "
          f"(load {load:.2f})", flush=True)
    return result


def table(args):
    # --plain: the environment as a user's script has it (create_model applies our settings itself)
    env = dict(os.environ) if args.plain else process_environment(dict(os.environ))
    names = args.only or list(PLAIN if args.plain else PEERS)
    args.git_commit = report.git_commit()                    # the code the run started with
    rows = []
    for name in names:
        runs = {"ours": [], "theirs": [], "ours-ref": [], "baseline": []}
        for r in range(args.rounds):
            order = ["ours", "theirs"] if r % 2 == 0 else ["theirs", "ours"]
            if args.baseline:   # ours at another commit, beside ours: ours, baseline, theirs / theirs, baseline, ours
                order.insert(1, "baseline")
            for side in order:
                if side == "baseline":
                    runs[side].append(_spawn(name, "ours", args, env, root=os.path.abspath(args.baseline)))
                else:
                    runs[side].append(_spawn(name, side, args, env))
            if args.reference:
                runs["ours-ref"].append(_spawn(name, "ours", args, env, fast_ops=False))
        med = {k: statistics.median([t for r in v for t in r["times"]]) for k, v in runs.items() if v}
        row = {"name": name, "batch": PEERS[name]["batch"],
               "input": PLAIN[name]["input"] if args.plain else PEERS[name]["input"], "ours_s_per_step": med["ours"], "theirs_s_per_step": med["theirs"],
               "ratio": med["theirs"] / med["ours"], "runs": runs}
        if "ours-ref" in med:
            row.update(ours_reference_s_per_step=med["ours-ref"], reference_ratio=med["theirs"] / med["ours-ref"])
        if "baseline" in med:
            row.update(baseline_s_per_step=med["baseline"], over_baseline=med["baseline"] / med["ours"],
                       baseline_commit=report.git_commit(os.path.abspath(args.baseline)))
        rows.append(row)
        print(f"  {name}: ours/theirs throughput {row['ratio']:.2f}"
              + (f", ours/baseline {row['over_baseline']:.3f}" if "over_baseline" in row else ""), flush=True)
        result = _save(args, env, rows)                # after every row: a stopped run keeps what it measured
    show(result)


def mixed_table(args):
    """bf16: ours and PyTorch's autocast, with our fp32 step beside; the sides alternate per round."""
    env = process_environment(dict(os.environ))
    args.git_commit = report.git_commit()
    sides = [("ours", "bf16"), ("theirs", "bf16"), ("ours", "fp32")]
    rows = []
    for name in args.only or [n for n in PEERS if n in MIXED]:
        runs = {f"{side}-{prec}": [] for side, prec in sides}
        for r in range(args.rounds):
            for side, prec in (sides if r % 2 == 0 else sides[::-1]):
                runs[f"{side}-{prec}"].append(_spawn(name, side, args, env, precision=prec))
        med = {k: statistics.median([t for x in v for t in x["times"]]) for k, v in runs.items()}
        peak = {k: max(x["peak_memory_mb"] for x in v) for k, v in runs.items()}
        row = {"name": name, "batch": PEERS[name]["batch"], "input": PEERS[name]["input"],
               "ours_bf16_s_per_step": med["ours-bf16"], "theirs_bf16_s_per_step": med["theirs-bf16"],
               "ours_fp32_s_per_step": med["ours-fp32"], "bf16_over_fp32": med["ours-fp32"] / med["ours-bf16"],
               "ours_over_theirs_bf16": med["theirs-bf16"] / med["ours-bf16"],
               "peak_memory_mb": peak, "runs": runs}
        rows.append(row)
        print(f"  {name}: ours bf16 / fp32 {row['bf16_over_fp32']:.2f}, ours / PyTorch bf16 "
              f"{row['ours_over_theirs_bf16']:.2f}", flush=True)
        result = _save(args, env, rows, sides=("ours-bf16", "theirs-bf16"))
    show(result)


def _save(args, env, rows, sides=("ours", "theirs")):
    """The JSON of the rows measured so far (with --only, merged into the file's other rows)."""
    flags = open("/proc/cpuinfo").read().split("flags", 1)[-1].split("\n", 1)[0].split() if os.path.exists(
        "/proc/cpuinfo") else []
    result = {"command": " ".join(["benchmarks/peers.py"] + sys.argv[1:]), "mixed": bool(args.mixed),
              "plain": bool(args.plain),
              **report.cpu_record(),
              "cpu_count": os.cpu_count(),
              "cpu_flags": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags],
              "threads": args.threads, "python": platform.python_version(),
              "env": {k: env.get(k) for k in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS", "FLAGS_use_stride_kernel")},
              "git_commit": args.git_commit, "steps": args.steps, "rounds": args.rounds,
              "load_average_start": next(iter(rows[0]["runs"].values()))[0]["load_before"] if rows else None,
              "uptime_end": _uptime(), "rows": rows}
    for row in rows:
        for side in sides:
            result.update({k: row["runs"][side][0][k] for k in ("paddle", "torch") if k in row["runs"][side][0]})
    if args.json:
        write_rows(os.path.join(ROOT, args.json), result, args.only)
    return result


def write_rows(path, result, only):
    """Write `result` to `path`; with `only` (--only), its rows merged into the file's other rows, in
    PEERS' order. Atomic: a stopped run leaves the previous file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows = {}
    if os.path.isfile(path) and only:          # --only updates those rows, keeps the others
        with open(path) as f:
            rows = {r["name"]: r for r in json.load(f).get("rows", [])}
    rows.update({r["name"]: r for r in result["rows"]})
    result["rows"] = [rows[n] for n in PEERS if n in rows]
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def _uptime():
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def mixed_lines(result):
    """The markdown table of a peers_bf16.json (mixed_table)."""
    lines = [f"{result['cpu']} ({kind_of(result)}, {result['cpu_vendor']}), {result['threads']} threads, paddle "
             f"{result.get('paddle')} vs torch {result.get('torch')} (torch.autocast cpu bfloat16), {result['steps']} "
             f"timed steps x {result['rounds']} rounds per side, commit {str(result.get('git_commit'))[:10]}; load "
             f"average at the end: {result.get('uptime_end')}",
             "",
             "| model | batch | ours fp32 s/step | ours bf16 s/step | PyTorch bf16 s/step | ours bf16 / fp32 samples/s "
             "| ours / PyTorch bf16 samples/s | peak MB: ours fp32 / bf16 / PyTorch bf16 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        pk = r["peak_memory_mb"]
        lines.append(f"| {r['name']} | {r['batch']} | {r['ours_fp32_s_per_step']:.3f} | {r['ours_bf16_s_per_step']:.3f} | "
                     f"{r['theirs_bf16_s_per_step']:.3f} | **{r['bf16_over_fp32']:.2f}** | "
                     f"**{r['ours_over_theirs_bf16']:.2f}** | {pk['ours-fp32']:.0f} / {pk['ours-bf16']:.0f} / "
                     f"{pk['theirs-bf16']:.0f} |")
    return lines


def table_lines(result):
    """The markdown table (and its heading line) of a peers JSON."""
    if result.get("mixed"):
        return mixed_lines(result)
    ref = any("reference_ratio" in r for r in result["rows"])
    base = any("over_baseline" in r for r in result["rows"])
    plain = ("plain loops (the model as api.models.create_model builds it + paddle.optimizer.Momentum against "
             "torch.optim.SGD), "
             if result.get("plain") else "")
    lines = [f"{result['cpu']} ({kind_of(result)}, {result['cpu_vendor']}), {result['threads']} threads, {plain}paddle "
             f"{result.get('paddle')} vs torch {result.get('torch')}, {result['steps']} timed steps x {result['rounds']} "
             f"rounds per side, "
             f"commit {str(result.get('git_commit'))[:10]}; load average at the end: {result.get('uptime_end')}",
             "",
             "| model | batch | input | ours s/step | PyTorch s/step | ours / PyTorch samples/s |"
             + (" pure-Paddle path / PyTorch |" if ref else "") + (" ours / baseline (commit) |" if base else "")
             + " load (1 min) |",
             "|---|---|---|---|---|---|" + ("---|" if ref else "") + ("---|" if base else "") + "---|"]
    for r in result["rows"]:
        loads = [x["load_before"] for side in ("ours", "theirs") for x in r["runs"][side]]
        extra = f" {r['reference_ratio']:.2f} |" if "reference_ratio" in r else (" - |" if ref else "")
        if base:
            extra += (f" {r['over_baseline']:.3f} ({str(r.get('baseline_commit'))[:7]}) |" if "over_baseline" in r
                      else " - |")
        lines.append(f"| {r['name']} | {r['batch']} | {r['input']} | {r['ours_s_per_step']:.3f} | "
                     f"{r['theirs_s_per_step']:.3f} | **{r['ratio']:.2f}** |{extra} "
                     f"{min(loads):.1f}-{max(loads):.1f} |")
    return lines


def kind_of(result):
    return result.get("cpu_kind") or report.cpu_kind({"vendor": result.get("cpu_vendor")})


def write_page(result, path=None):
    """Replace this JSON's CPU kind's bench-peers (or bench-peers-bf16) table in docs/performance.md;
    other kinds' stay."""
    if result.get("mixed"):
        report.write_page("bench-peers-bf16", kind_of(result), table_lines(result),
                          "benchmarks/peers.py --mixed --docs", path)
    elif result.get("plain"):
        report.write_page("bench-peers-plain", kind_of(result), table_lines(result),
                          "benchmarks/peers.py --plain --docs", path)
    else:
        report.write_page("bench-peers", kind_of(result), table_lines(result), "benchmarks/peers.py --docs", path)


def show(result):
    print("\n" + "\n".join(table_lines(result)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=list(PEERS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--reference", action="store_true", help="also time our pure-Paddle path (fast_ops off)")
    p.add_argument("--baseline", metavar="CHECKOUT", help="also time ours from another checkout (e.g. a git "
                   "worktree of the previous commit), alternating: is a change faster or slower here?")
    p.add_argument("--json", help="default: benchmarks/results/<this CPU's kind>/peers.json")
    p.add_argument("--kind", help="with --show/--docs: the results of this CPU kind (default: this machine's)")
    p.add_argument("--show", action="store_true")
    p.add_argument("--docs", "--readme", dest="docs", action="store_true",
                   help="write the table from the JSON into docs/performance.md (--readme: the same)")
    p.add_argument("--mixed", action="store_true", help="bf16: ours and PyTorch's autocast, our fp32 beside")
    p.add_argument("--plain", action="store_true", help="the models as a library in a plain loop on each side "
                   f"({', '.join(PLAIN)})")
    p.add_argument("--run", choices=list(PEERS), help="one side in this process; prints a JSON line")
    p.add_argument("--side", choices=["ours", "theirs"], default="ours")
    p.add_argument("--no-fast-ops", action="store_true")
    p.add_argument("--precision", choices=list(AMP), default="fp32", help="with --run: the side's precision")
    p.add_argument("--profile", action="store_true", help="with --run: per-op table of one step")
    args = p.parse_args()
    if args.kind and not (args.show or args.docs):
        p.error("--kind is for --show/--docs: a run measures this machine's kind")
    if not args.json:
        name = "peers_bf16.json" if args.mixed else "peers_plain.json" if args.plain else "peers.json"
        args.json = os.path.relpath(os.path.join(report.results_dir(args.kind), name), ROOT)
    if args.plain and (args.mixed or args.reference or args.baseline):
        p.error("--plain times fp32 plain loops: not with --mixed, --reference or --baseline")
    if args.run:
        print(json.dumps(run_one(args.run, args.side, args.steps, args.threads, not args.no_fast_ops, args.profile,
                                 args.precision, args.plain)))
    elif args.show or args.docs:
        path = os.path.join(ROOT, args.json)
        if not os.path.isfile(path):
            raise SystemExit(f"error: {args.json}: no results of this CPU kind yet (run make bench-peers here)")
        with open(path) as f:
            result = json.load(f)
        show(result)
        if args.docs:
            write_page(result)
    elif args.mixed:
        mixed_table(args)
    else:
        table(args)


if __name__ == "__main__":
    main()
