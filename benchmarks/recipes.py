"""One recipe timed on this machine: its reader alone, its train step and eval forward alone (on
batches already in memory), or its prediction latency through each exported backend.
tools/benchmark.py runs it on one config, benchmarks/tables.py on each row of docs/performance.md's tables.
"""
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
import paddle

from benchmarks import report
from benchmarks.tables import BF16_EXPORT, INT8_EXPORT, ONNX_RUNTIME, OPENVINO, OPENVINO_BF16, OPENVINO_INT8, \
    OPENVINO_INT8_BF16
from engine import builder, runtime
from deploy import export, quantize
from deploy.predictor import Predictor
from engine.errors import ConfigError
from engine.session import Session
from engine.training import trainer


def _command():
    """The command as typed at the repository's root: a record says how to measure it again."""
    return " ".join([os.path.relpath(sys.argv[0], report.ROOT)] + sys.argv[1:])


def _time_reader(cfg, batch_size, workers, steps, seed):
    cfg = json.loads(json.dumps(cfg))
    cfg["reader"]["train"]["num_workers"] = workers
    loader, _, _ = builder.build_loader(cfg, "train", seed, batch_size=batch_size)
    it = iter(loader)
    for _ in range(1 + 2 * workers):  # start-up and the batches workers prefetched are not throughput
        next(it)
    n, tic = 0, time.perf_counter()
    for _ in range(steps):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        n += len(batch["index"])
    return n / (time.perf_counter() - tic), (time.perf_counter() - tic) / steps


def _batches(cfg, batch_size, steps, seed):
    loader, _, sampler = builder.build_loader(cfg, "train", seed, batch_size=batch_size)
    fixed = type(sampler).__name__ == "Epoch"   # other samplers make batches of their own sizes
    out = []
    while len(out) < min(steps, 4):
        for batch in loader:
            if not fixed or len(batch["index"]) == batch_size:
                out.append(batch)
            if len(out) >= min(steps, 4):
                break
    return out


def _synthetic(batch):
    return {k: (paddle.randn(v.shape, v.dtype) if isinstance(v, paddle.Tensor) and v.dtype == paddle.float32
                and k.split("_")[-1] not in ("mask", "labels") else v) for k, v in batch.items()}


def _count(batch, tokens):
    return int(batch[tokens + "_len"].sum().item()) if tokens else len(batch["index"])


def _time_model(cfg, batches, steps, train, amp, tokens=None):
    """Train steps through the trainer's own TrainStep (what training runs), or eval forwards, with
    the resolved AMP settings `amp` (Session.train_amp / eval_amp).
    Returns (samples/s, s/step, parameters, tokens/s or None)."""
    model = builder.build_model(cfg["model"])
    if train:
        train_step = trainer.build_train_step(cfg, model, steps_per_epoch=max(steps, 1), total_steps=steps + 1,
                                              amp=amp)
        model = train_step.model
        model.train()

        def step(batch):
            return train_step(batch)["loss"]
    else:
        model.eval()

        def step(batch):
            with paddle.no_grad(), runtime.autocast(amp):
                return next(iter(model(batch).values()))

    step(batches[0]).numpy()  # warm-up: first-call allocations and kernel selection
    tic = time.perf_counter()
    for i in range(steps):
        out = step(batches[i % len(batches)])
    out.numpy()  # wait for the last step (asynchronous devices)
    elapsed = time.perf_counter() - tic
    n = sum(len(batches[i % len(batches)]["index"]) for i in range(steps))
    n_tokens = sum(_count(batches[i % len(batches)], tokens) for i in range(steps)) if tokens else None
    return n / elapsed, elapsed / steps, builder.count_params(model), n_tokens / elapsed if tokens else None


def bench(config_path, overrides, steps, batch_size, workers, synthetic, tokens=None, drop_keys=()):
    """The JSON record of a table row (docs/performance.md): with the machine, versions, environment and
    AMP settings that make its figures comparable, and the reader's share of a train step for each
    worker count."""
    s = Session.from_file(config_path, overrides)
    rt, cfg, seed = s.setup(), s.cfg, s.cfg.runtime.seed
    bs = batch_size or cfg["reader"]["train"].get("batch_size", 1)
    result = {
        "command": _command(),
        "config": config_path, "overrides": list(overrides), "batch_size": bs, "steps": steps,
        "git_commit": report.git_commit(), "paddle": paddle.__version__, "python": platform.python_version(),
        **report.cpu_record(), "device": rt["device"],
        "threads": rt["threads"],
        "env": {k: os.environ.get(k) for k in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS", "FLAGS_use_stride_kernel")},
        "synthetic_inputs": synthetic, "reader": {},
        "amp": {"train": dataclasses.asdict(s.train_amp), "eval": dataclasses.asdict(s.eval_amp)},
    }
    for w in workers:
        sps, per_batch = _time_reader(cfg, bs, w, steps, seed)
        result["reader"][f"workers_{w}"] = {"samples_per_s": sps, "s_per_batch": per_batch}
    batches = _batches(cfg, bs, steps, seed)
    if synthetic:
        batches = [_synthetic(b) for b in batches]
    if tokens and tokens + "_len" not in batches[0]:
        raise ConfigError(f"--tokens {tokens}: the batch has no '{tokens}_len' (a PadSequences key)")
    train_sps, train_step, params, train_tps = _time_model(cfg, batches, steps, True, s.train_amp, tokens)
    eval_batches = [{k: v for k, v in b.items() if k not in drop_keys} for b in batches]
    eval_sps, eval_step, _, eval_tps = _time_model(cfg, eval_batches, steps, False, s.eval_amp,
                                                   tokens if tokens not in drop_keys else None)
    result.update(params=params, train_samples_per_s=train_sps, train_s_per_step=train_step,
                  eval_samples_per_s=eval_sps, eval_s_per_step=eval_step,
                  peak_memory_mb=runtime.peak_memory_mb(), drop_keys_in_eval=list(drop_keys))
    if tokens:
        result.update(tokens_key=tokens, train_tokens_per_s=train_tps, eval_tokens_per_s=eval_tps)
    for w, r in result["reader"].items():
        r["share_of_train_step"] = r["s_per_batch"] / (r["s_per_batch"] + train_step)
    return result


def _percentile(values, q):
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def _rounds(runs, steps, warmup=2):
    """{name: [seconds] of `steps` rounds}: round r runs every backend once, the order rotated by r, so
    what else loads the machine (a CI run on the same cores) falls on all of them alike; `warmup`
    untimed runs of each first (first-call allocations, kernel selection, OpenVINO's compilation)."""
    names = list(runs)
    for name in names:
        for _ in range(warmup):
            runs[name]()
    times = {name: [] for name in names}
    for r in range(steps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            tic = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - tic)
    return times


def _backends(tmp, onnx_dir, int8_dir, int8_ov_dir, threads):
    """The predictors the latency table compares, by column name; a bf16 one only where its runtime
    computes bf16 on this CPU (elsewhere the column would time fp32 again)."""
    from deploy import openvino  # optional: requirements-openvino.txt only
    ov_cache = os.path.join(tmp, "openvino_cache")
    backends = {"exported, oneDNN": Predictor(tmp, mkldnn=True, threads=threads),
                "exported, no oneDNN": Predictor(tmp, mkldnn=False, threads=threads),
                ONNX_RUNTIME: Predictor(onnx_dir, threads=threads, backend="onnxruntime"),
                OPENVINO: Predictor(onnx_dir, threads=threads, backend="openvino", cache_dir=ov_cache),
                BF16_EXPORT: Predictor(tmp, threads=threads, precision="bf16"),
                INT8_EXPORT: Predictor(int8_dir, threads=threads, backend="onnxruntime")}
    if openvino.has_bf16():
        backends[OPENVINO_BF16] = Predictor(onnx_dir, threads=threads, backend="openvino", precision="bf16",
                                            cache_dir=ov_cache)
    # the IR's float layers run in bf16 where OpenVINO has bf16 here (Predictor): the column says which;
    # there also with its float layers in f32, the INT8 a CPU without bf16 would get
    int8 = Predictor(int8_ov_dir, threads=threads, backend="openvino", cache_dir=ov_cache)
    bf16 = any(p.inference_precision == "bf16" for p in int8.programs.values())
    backends[OPENVINO_INT8_BF16 if bf16 else OPENVINO_INT8] = int8
    if bf16:
        backends[OPENVINO_INT8] = Predictor(int8_ov_dir, threads=threads, backend="openvino", cache_dir=ov_cache,
                                            int8_float="fp32")
    if backends[BF16_EXPORT].precision != "bf16":   # no native bf16 here: the column would time fp32
        del backends[BF16_EXPORT]
    return backends


def _quantized_for_timing(onnx_dir, int8_dir, feeds, threads):
    """ONNX Runtime's INT8 of the random-weight export. Its simulation check compares relative errors,
    which near-zero outputs make unstable: a random BERT-base's logits failed it once and passed it on
    other batches (docs/performance.md#deployment-figures); a trained model's are not near
    zero (tests/test_quantize.py checks every demo). Timed anyway, the check's report kept in the JSON."""
    try:
        return quantize.quantize(onnx_dir, int8_dir, feeds, threads=threads)
    except ConfigError as e:
        print(f"note: {e}; timed anyway (random weights)", file=sys.stderr)
        return dict(quantize.quantize(onnx_dir, int8_dir, feeds, threads=threads, check_feeds=0),
                    simulation_check_failed=str(e))


def bench_inference(config_path, overrides, steps, batch_sizes, weights=None):
    """Latency per batch of each backend a deployment could choose, on the same batches and threads,
    timed in alternating rounds (_rounds), with the load average around the run."""
    from deploy import openvino  # optional: requirements-openvino.txt only
    s = Session.from_file(config_path, overrides)
    rt, cfg = s.setup(), s.cfg
    model = s.model(weights, log=lambda *_: None)
    model.eval()
    split = cfg.eval_split()
    rows = []
    load_before = round(os.getloadavg()[0], 2)   # other work on the machine skews latency: recorded
    example = next(iter(s.loader(split, batch_size=1, sharded=False)[0]))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir, int8_dir, int8_ov_dir = (os.path.join(tmp, d) for d in ("onnx", "int8", "int8_openvino"))
        export.export(model, cfg, tmp, example=example)
        export.export(model, cfg, onnx_dir, example=example, fmt="onnx")
        batches = {}
        for bs in batch_sizes:
            loader, _, _ = s.loader(split, batch_size=bs, sharded=False)
            batches[bs] = next(b for b in loader if len(b["index"]) == bs)
        # INT8 calibrated on the timed batches themselves (random weights: ranges, not accuracy, matter)
        feeds = quantize.record_feeds(onnx_dir, batches.values(), rt["threads"])
        quant = _quantized_for_timing(onnx_dir, int8_dir, feeds, rt["threads"])
        quant_ov = quantize.quantize_openvino(onnx_dir, int8_ov_dir, feeds, threads=rt["threads"])
        backends = _backends(tmp, onnx_dir, int8_dir, int8_ov_dir, rt["threads"])
        precisions = {name: {prog: p.inference_precision for prog, p in b.programs.items()}
                      for name, b in backends.items() if b.backend == "openvino"}
        sizes = {"paddle": quantize.size_on_disk(tmp), "onnx": quant["fp32_bytes"], "int8": quant["int8_bytes"],
                 "openvino_int8": quant_ov["int8_bytes"]}
        for bs, batch in batches.items():
            def dynamic():
                with paddle.no_grad():   # to host, as the predictor (lists: one array per sample)
                    return {k: [t.numpy() for t in v] if isinstance(v, list) else v.numpy()
                            for k, v in model(batch).items()}
            runs = {"dynamic": dynamic, **{name: (lambda p=p: p(batch)) for name, p in backends.items()}}
            for name, times in _rounds(runs, steps).items():
                rows.append({"batch": bs, "backend": name, "p50_ms": _percentile(times, 50),
                             "p90_ms": _percentile(times, 90), "samples_per_s": bs * len(times) / sum(times)})
    return {"command": _command(),
            "config": config_path, "overrides": list(overrides), "model": cfg["model"]["name"], "split": split,
            "steps": steps, "rounds": "alternating, order rotated each round", "weights": weights,
            "git_commit": report.git_commit(), "paddle": paddle.__version__, **openvino.versions(),
            **report.cpu_record(), "threads": rt["threads"],
            "env": {k: os.environ.get(k) for k in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS")},
            "rows": rows, "size_on_disk_mb": {k: v / 2 ** 20 for k, v in sizes.items()},
            "openvino_inference_precision": precisions,
            "quantization": {k: quant[k] for k in ("route", "observer", "simulation_gap", "simulation_check_failed")
                             if k in quant},
            "quantization_openvino": {k: quant_ov[k] for k in ("route", "nncf", "weights", "int8_vs_fp32")
                                      if k in quant_ov},
            "peak_memory_mb": runtime.peak_memory_mb(),
            "load_avg_1m_before_after": [load_before, round(os.getloadavg()[0], 2)]}


def print_inference(name, r):
    for row in r["rows"]:
        print(f"  {name} batch {row['batch']:>3} {row['backend']:<22} p50 {row['p50_ms']:9.1f} ms  "
              f"p90 {row['p90_ms']:9.1f} ms  {row['samples_per_s']:8.2f} samples/s")
    for name, programs in r.get("openvino_inference_precision", {}).items():
        print(f"  {name}: OpenVINO {r.get('openvino')} computes " + ", ".join(f"{k} in {v}" for k, v in programs.items()))


def print_result(result):
    print(f"{result['config']} batch {result['batch_size']}, {result['threads']} threads on {result['cpu']}")
    print(f"  train {result['train_samples_per_s']:.2f} samples/s ({result['train_s_per_step']:.3f} s/step), "
          f"eval {result['eval_samples_per_s']:.2f} samples/s, peak memory {result['peak_memory_mb']:.0f} MB")
    if result.get("tokens_key"):
        print(f"  train {result['train_tokens_per_s']:.0f} {result['tokens_key']} tokens/s")
    for w, r in result["reader"].items():
        print(f"  reader {w}: {r['samples_per_s']:.1f} samples/s, "
              f"{100 * r['share_of_train_step']:.1f}% of a train step")
