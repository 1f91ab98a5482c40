"""Run every precision mode of the demo recipes through the user-facing tools, and print one table.

    python tools/gpu_check.py [--configs CFG ...] [--modes fp32 bf16-O1 ...] [--steps 4] [--output DIR]

Why: our users train on NVIDIA GPUs with paddlepaddle-gpu, but no machine of ours has a GPU, so none
of the GPU lines has run here: paddle.amp's fp16 and bf16 at O1 and O2, the fp16 loss scaler with
gradient clipping, a checkpoint of a GPU run and its resume, evaluation with and without AMP, Paddle
Inference on a GPU, two cards. On a GPU this tool runs them all; on a CPU it runs what a CPU can
(fp32, and bf16 O1 on our fused oneDNN operators) and prints every other cell as "needs a GPU",
never as passed.

If you have a GPU, please run it (no flags needed) and send us the whole printed table (the header
line names the GPU, CUDA and paddle), or DIR/gpu_check.json (DIR: --output, default output/gpu_check);
for a FAILED cell, also that step's log, DIR/<demo>/<mode>/logs/<step>.log. On our 2-core CPU the
default run (fp32 and bf16-O1 rows) takes ~22 minutes.

For each recipe (default: every configs/**/*_demo.yaml; its demo data is generated first with
data/make_demo.py) and each mode (fp32, bf16-O1, bf16-O2, fp16-O1, fp16-O2; trt-fp32 and trt-fp16:
trained in fp32, exported with --trt --trt-precision fp32|fp16 and inferred with --trt, TensorRT on
the GPU), one row; each of its cells is one tool run in a subprocess, as a user would type it:
  train         tools/train.py, --steps optimizer steps, train.clip_grad_norm=1.0, a checkpoint each step
  resume        tools/train.py --resume auto to twice the steps, from the newest checkpoint of the first run
  eval amp on   tools/eval.py on the final weights, eval.amp as trained
  eval amp off  the same with -o eval.amp.enable=false
  export        tools/export.py (the Paddle Inference program)
  infer         tools/infer.py --backend inference on the export, with a demo input
Where two GPUs exist, a 2-card row per recipe (fp32 and the fastest AMP mode of the 1-card rows:
train, resume and eval through `python -m paddle.distributed.launch --devices 0,1`).
A cell is "ok" (with its seconds), "FAILED: <the step's last error line>", "needs a GPU" ("needs a
GPU with TensorRT", "needs paddle with TensorRT" for the trt rows), or "not run" (an earlier step of
the row failed). Exit code 1 if a cell FAILED.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

from engine import cli, cpu

ROOT = _bootstrap.ROOT
# mode -> (train.amp.dtype, train.amp.level), None: fp32
MODES = {"fp32": None, "bf16-O1": ("bfloat16", "O1"), "bf16-O2": ("bfloat16", "O2"),
         "fp16-O1": ("float16", "O1"), "fp16-O2": ("float16", "O2"), "trt-fp32": None, "trt-fp16": None}
TRT_MODES = {"trt-fp32": "fp32", "trt-fp16": "fp16"}   # mode -> --trt-precision (trained in fp32)
CPU_MODES = ("fp32", "bf16-O1")   # what runs on a CPU (runtime.resolve_amp: O2 would run as O1, fp16 not at all)
STEPS = ("train", "resume", "eval amp on", "eval amp off", "export", "infer")
NEEDS_GPU = "needs a GPU"
NEEDS_TRT = "needs a GPU with TensorRT"
NEEDS_TRT_BUILD = "needs paddle with TensorRT"
# demo recipe -> (data/make_demo.py dataset, inputs for tools/infer.py), as tests/test_export.py picks them
DEMO_INPUTS = {
    "attention_lstm_demo": ("youtube8m", ["data/youtube8m_demo/tfrecord/validate0000.tfrecord"]),
    "attention_cluster_demo": ("youtube8m", ["data/youtube8m_demo/tfrecord/validate0000.tfrecord"]),
    "nextvlad_demo": ("youtube8m", ["data/youtube8m_demo/tfrecord/validate0000.tfrecord"]),
    "tsn_demo": ("kinetics", ["data/kinetics_demo/kinetics_appearance/videos/val/red"]),
    "stnet_demo": ("kinetics", ["data/kinetics_demo/kinetics_motion/videos/val/up"]),
    "bert_glue_demo": ("bert", ["data/bert_demo/glue/test.tsv"]),
    "bert_pretrain_demo": ("bert", ["data/bert_demo/corpus/val.txt"]),
    "transformer_demo": ("translation", ["data/translation_demo/test.en"]),
    "deeplabv3_demo": ("segmentation", [f"data/voc_demo/VOCdevkit/VOC2012/JPEGImages/val_{i:04d}.jpg"
                                        for i in range(3)]),
    "mask_rcnn_demo": ("coco", [f"data/coco_demo/val/val_{i:04d}.png" for i in range(3)]),
}


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", metavar="CFG", help="recipes (default: every configs/**/*_demo.yaml)")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                   help="precision modes (default: all seven; on a CPU the fp16, O2 and trt rows print 'needs a GPU')")
    p.add_argument("--steps", type=int, default=4,
                   help="optimizer steps of the first run (the resume runs as many more)")
    p.add_argument("--output", default=os.path.join("output", "gpu_check"),
                   help="the runs, each step's log and gpu_check.json (default output/gpu_check)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one step may take")
    return p


def main():
    args = parser().parse_args()
    if args.steps < 1:
        parser().error("--steps must be >= 1")
    configs = [os.path.abspath(c) for c in args.configs] if args.configs else \
        sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"), recursive=True))
    modes = [m for m in MODES if m in args.modes]
    output = os.path.abspath(args.output)
    dev = device()
    print(header(dev), flush=True)
    data_ok = make_demo_data(configs, output, args.timeout)
    rows = check_all(configs, modes, dev, args.steps, output, args.timeout)
    table = markdown(rows)
    print("\n" + header(dev) + "\n\n" + table, flush=True)
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "gpu_check.json"), "w") as f:
        json.dump({"header": header(dev), "device": dev, "steps": args.steps, "demo_data_ok": data_ok,
                   "rows": rows, "table": table}, f, indent=1)
    print(f"\nwrote {os.path.join(output, 'gpu_check.json')}; please send this table to us")
    code = exit_code(rows, data_ok)
    if code:
        raise SystemExit(code)


def device():
    """What this machine offers: {'kind': 'gpu'|'cpu', 'name', 'gpus', 'bf16' (a CPU's native bf16),
    'paddle', 'cuda', 'tensorrt' (the version paddle was built with, None: none), 'commit'}."""
    import paddle  # after parsing: --help needs no paddle
    import paddle.inference as pi
    gpus = paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0
    trt = tuple(pi.get_trt_compile_version())
    dev = {"kind": "gpu" if gpus > 0 else "cpu", "gpus": gpus, "paddle": paddle.__version__,
           "bf16": cpu.has_bf16(), "cpu": cpu.cpu_info()["model"], "cuda": None, "commit": _commit(),
           "tensorrt": ".".join(map(str, trt)) if any(trt) else None}
    if gpus:
        dev["name"] = paddle.device.cuda.get_device_name()
        dev["cuda"] = f"CUDA {paddle.version.cuda()}, cuDNN {paddle.version.cudnn()}, TensorRT {dev['tensorrt'] or 'none'}"
    else:
        dev["name"] = dev["cpu"]
    return dev


def header(dev):
    if dev["kind"] == "gpu":
        where = f"{dev['name']} ({dev['gpus']} GPU{'s' if dev['gpus'] > 1 else ''}, {dev['cuda']})"
    else:
        where = f"{dev['name']} (CPU, no GPU; native bf16: {'yes' if dev['bf16'] else 'no'})"
    return f"gpu_check: {where}; paddle {dev['paddle']}; commit {dev['commit']}"


def _commit():
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def demo_name(config):
    return os.path.splitext(os.path.basename(config))[0]


def make_demo_data(configs, output, timeout):
    """data/make_demo.py for the datasets the recipes read (a no-op where they exist). True if it ran."""
    names = sorted({DEMO_INPUTS[demo_name(c)][0] for c in configs if demo_name(c) in DEMO_INPUTS})
    if not names:
        return True
    os.makedirs(output, exist_ok=True)
    cell = run_step([sys.executable, os.path.join(ROOT, "data", "make_demo.py"), *names],
                    os.path.join(output, "make_demo.log"), timeout)
    print(f"demo data ({' '.join(names)}): {cell['text']}", flush=True)
    return cell["status"] == "ok"


def env():
    return dict(os.environ, GLOG_minloglevel="2", PYTHONUNBUFFERED="1")


def last_error_line(text, rc):
    """The line a failed step ends on: its last `error:` line (engine.cli.run writes one) or Python
    exception line, else its last non-empty line, else the exit code."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:") or re.match(r"^\w*(Error|Exception)\b", ln)]
    return (errors or lines or [f"exit code {rc}"])[-1]


def run_step(cmd, log_path, timeout, verify=None, worker_logs=None):
    """Run one step's command from the repo root; its output goes to `log_path`. Returns a cell
    {'status': 'ok'|'FAILED', 'text', 'seconds', 'output'}. `verify(output)` says why a step that exited
    0 did not do its job (None: it did); `worker_logs`: a glob of more output (paddle's launcher's workers)."""
    tic = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, _text(e.stdout) + _text(e.stderr)
    seconds = time.perf_counter() - tic
    for path in sorted(glob.glob(worker_logs)) if worker_logs else ():
        with open(path, errors="replace") as f:
            out += f"\n--- {path}\n" + f.read()
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n" + out)
    if rc is None:
        why = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        why = last_error_line(out, rc)
    else:
        why = verify(out) if verify else None
    if why:
        return {"status": "FAILED", "text": f"FAILED: {why}", "seconds": seconds, "output": out}
    return {"status": "ok", "text": f"ok {seconds:.1f} s", "seconds": seconds, "output": out}


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def amp_overrides(mode):
    amp = MODES[mode]
    if amp is None:
        return ["-o", "train.amp.enable=false"]
    return ["-o", "train.amp.enable=true", "-o", f"train.amp.dtype={amp[0]}", "-o", f"train.amp.level={amp[1]}"]


def launcher(cards, log_dir):
    """paddle's launcher on GPUs 0..cards-1, as docs/multi-node.md runs it (--devices is
    the launcher's --gpus)."""
    return [sys.executable, "-m", "paddle.distributed.launch", "--devices", ",".join(map(str, range(cards))),
            "--log_dir", log_dir]


def _has(path, what):
    return lambda out: None if os.path.exists(path) else f"exited 0 but wrote no {what} ({path})"


def _samples_per_s(out):
    found = re.findall(r"([\d.]+) samples/s", out)
    return float(found[-1]) if found else None


def _checkpoint_steps(folder):
    """The optimizer steps of the checkpoints a run folder holds."""
    steps = []
    for path in glob.glob(os.path.join(folder, "checkpoints", "*", "state.json")):
        try:
            with open(path) as f:
                steps.append(json.load(f)["step"])
        except (OSError, ValueError, KeyError):
            pass
    return steps


def check_row(config, mode, steps, folder, timeout, cards=1, progress=print):
    """The six steps of one (recipe, mode, cards) row, in `folder`; returns {step: cell}."""
    shutil.rmtree(folder, ignore_errors=True)   # a stale run's checkpoints would be resumed
    os.makedirs(folder)
    demo = demo_name(config)
    base = ["-c", config, *amp_overrides(mode)]
    train = [*base, "--output", folder, "-o", "train.epochs=null", "-o", "train.save_steps=1",
             "-o", "train.clip_grad_norm=1.0", "-o", "train.log_interval=1"]
    weights = os.path.join(folder, "final", "model.pdparams")
    export_dir = os.path.join(folder, "export")
    inputs = [os.path.join(ROOT, p) for p in DEMO_INPUTS.get(demo, (None, []))[1]]
    trt_export = ["--trt", "--trt-precision", TRT_MODES[mode]] if mode in TRT_MODES else []
    trt_infer = ["--trt"] if mode in TRT_MODES else []

    def resumed(out):
        if "resumed from" not in out:
            return "--resume auto did not resume (no 'resumed from' line)"
        if 2 * steps not in _checkpoint_steps(folder):
            return f"the resumed run wrote no checkpoint of step {2 * steps}"
        return None

    def evaluated(name):
        return _has(os.path.join(folder, name, "metrics.json"), f"{name}/metrics.json")

    # step -> (tool, arguments, verify); train, resume and eval through paddle's launcher on 2 cards
    plan = {
        "train": ("train", train + ["-o", f"train.max_steps={steps}"], _has(weights, "final/model.pdparams")),
        "resume": ("train", train + ["-o", f"train.max_steps={2 * steps}", "--resume", "auto"], resumed),
        "eval amp on": ("eval", base + ["--weights", weights, "--output", os.path.join(folder, "eval_amp_on")],
                        evaluated("eval_amp_on")),
        "eval amp off": ("eval", base + ["-o", "eval.amp.enable=false", "--weights", weights,
                                         "--output", os.path.join(folder, "eval_amp_off")], evaluated("eval_amp_off")),
        "export": ("export", base + ["--weights", weights, "--output", export_dir] + trt_export,
                   _has(os.path.join(export_dir, "infer_cfg.yml"), "export/infer_cfg.yml")),
        "infer": ("infer", base + ["--backend", "inference", "--weights", export_dir, "--input", *inputs,
                                   "--output", os.path.join(folder, "infer")] + trt_infer,
                  lambda out: None if "wrote " in out else "exited 0 but wrote no predictions"),
    }
    cells = {}
    for step, (tool, argv, verify) in plan.items():
        why_not = _not_run(step, cells, weights, inputs, demo)
        if why_not:
            cell = {"status": "not run", "text": f"not run: {why_not}", "seconds": None}
        else:
            log = os.path.join(folder, "logs", step.replace(" ", "_") + ".log")   # train.log is the trainer's
            script = os.path.join(ROOT, "tools", tool + ".py")
            workers = None
            if cards > 1 and tool in ("train", "eval"):
                log_dir = os.path.join(folder, step.replace(" ", "_") + "_workers")
                cmd = launcher(cards, log_dir) + [script, *argv]
                workers = os.path.join(log_dir, "workerlog.*")
            else:
                cmd = [sys.executable, script, *argv]
            cell = run_step(cmd, log, timeout, verify, workers)
            out = cell.pop("output")
            if cell["status"] == "ok":
                cell["text"] += _details(step, out, folder)
                if "computing in fp32" in out:   # runtime.resolve_amp's line: no native bf16 on this CPU
                    cell["text"] += " (ran fp32)"
                if step == "train":
                    cell["samples_per_s"] = _samples_per_s(out)
        cells[step] = cell
        progress(f"{demo} {mode}{f' on {cards} GPUs' if cards > 1 else ''} {step}: {cell['text']}")
    return cells


def _not_run(step, cells, weights, inputs, demo):
    """Why a step cannot run after the row's earlier ones (None: it can)."""
    if step == "resume" and cells["train"]["status"] != "ok":
        return "train FAILED"
    if step in ("eval amp on", "eval amp off", "export") and not os.path.isfile(weights):
        return "no final weights (train FAILED)"
    if step == "infer" and cells["export"]["status"] != "ok":
        return "export FAILED" if cells["export"]["status"] == "FAILED" else cells["export"]["text"][len("not run: "):]
    if step == "infer" and not inputs:
        return f"no demo input known for {demo}"
    return None


def _details(step, out, folder):
    """What a user would glance at beside "ok": the train speed; the eval's first metric and loss."""
    if step in ("train", "resume"):
        rate = _samples_per_s(out)
        return f", {rate:g} samples/s" if rate is not None else ""
    if step.startswith("eval"):
        try:
            with open(os.path.join(folder, step.replace(" ", "_"), "metrics.json")) as f:
                metrics = json.load(f)
        except (OSError, ValueError):
            return ""
        first = next((k for k in metrics if k not in ("loss", "num_samples", "num_skipped", "records_lost")), None)
        shown = [k for k in (first, "loss") if k in metrics and isinstance(metrics[k], (int, float))]
        return ", " + " ".join(f"{k} {metrics[k]:.4g}" for k in shown) if shown else ""
    return ""


def skipped_row(text):
    return {step: {"status": NEEDS_GPU, "text": text, "seconds": None} for step in STEPS}


def check_all(configs, modes, dev, steps, output, timeout, progress=None):
    """Every row: (recipe x mode) on one card, then the 2-card rows. Returns the list of rows."""
    progress = progress or (lambda line: print(line, flush=True))
    rows = []
    for config in configs:
        demo = demo_name(config)
        name = os.path.relpath(config, ROOT) if config.startswith(ROOT + os.sep) else config
        demo_rows = []
        for mode in modes:
            row = {"config": name, "demo": demo, "mode": mode, "cards": 1, "note": None}
            why = needs(mode, dev)
            if why:
                row["cells"] = skipped_row(why)
                progress(f"{demo} {mode}: {why} (all steps)")
            else:
                if dev["kind"] == "cpu" and MODES[mode] and MODES[mode][0] == "bfloat16" and not dev["bf16"]:
                    row["note"] = "no native bf16 on this CPU (ran fp32)"
                row["cells"] = check_row(config, mode, steps, os.path.join(output, demo, mode), timeout,
                                         progress=progress)
            demo_rows.append(row)
        rows += demo_rows
        rows += two_card_rows(config, name, demo, demo_rows, modes, dev, steps, output, timeout, progress)
    return rows


def needs(mode, dev):
    """What the machine lacks for a mode's row (None: it runs)."""
    if mode in TRT_MODES:
        return NEEDS_TRT if dev["kind"] == "cpu" else NEEDS_TRT_BUILD if not dev.get("tensorrt") else None
    return NEEDS_GPU if dev["kind"] == "cpu" and mode not in CPU_MODES else None


def two_card_rows(config, name, demo, demo_rows, modes, dev, steps, output, timeout, progress):
    """fp32 and the fastest AMP mode (train samples/s of the 1-card rows) on 2 GPUs; 'needs a GPU' elsewhere."""
    row = {"config": name, "demo": demo, "cards": 2, "note": None}
    if dev["gpus"] < 2:
        text = NEEDS_GPU if dev["gpus"] == 0 else "needs 2 GPUs (1 here)"
        progress(f"{demo} 2 cards: {text} (all steps)")
        return [dict(row, mode="fp32 + fastest AMP", cells=skipped_row(text))]
    amp = [r for r in demo_rows if MODES[r["mode"]] and r["cells"]["train"]["status"] == "ok"
           and r["cells"]["train"].get("samples_per_s")]
    chosen = (["fp32"] if "fp32" in modes else []) + \
        ([max(amp, key=lambda r: r["cells"]["train"]["samples_per_s"])["mode"]] if amp else [])
    return [dict(row, mode=mode, cells=check_row(config, mode, steps, os.path.join(output, demo, mode + "-2cards"),
                                                 timeout, cards=2, progress=progress))
            for mode in chosen]


def markdown(rows):
    lines = ["| demo | mode | cards | " + " | ".join(STEPS) + " |", "|" + "---|" * (len(STEPS) + 3)]
    for r in rows:
        mode = r["mode"] + (f": {r['note']}" if r["note"] else "")
        cells = [r["cells"][s]["text"].replace("|", "/") for s in STEPS]
        lines.append(f"| {r['demo']} | {mode} | {r['cards']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def exit_code(rows, data_ok=True):
    failed = any(c["status"] == "FAILED" for r in rows for c in r["cells"].values())
    return 1 if failed or not data_ok else 0


if __name__ == "__main__":
    cli.run(main)
