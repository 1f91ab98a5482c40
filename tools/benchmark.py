"""Throughput of a recipe on this machine: reader alone, model alone (train and eval), peak memory.

python tools/benchmark.py -c CONFIG [-o k=v ...] [--steps N] [--batch-size B] [--workers 0 2]
                          [--synthetic] [--json PATH]
python tools/benchmark.py --table     # the README's table (BENCH_TABLE below), JSON under benchmarks/results/
python tools/benchmark.py --show      # the same table from the committed JSON

The reader is timed alone (iterating the train DataLoader, for each worker count) and the model alone
(train steps and eval forwards on batches already in memory), so the reader's share of a step is
reader_time / (reader_time + model_time) for a reader with the given workers feeding the model.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from engine import cli
from engine.cpu import cpu_info

# (name, config, overrides, batch size, note): what `make bench` measures for the README.
YT8M_DEMO = ["reader.train.files=[data/youtube8m_demo/train.list]", "reader.train.num_workers=0"]
VOC_DEMO = ["reader.train.root=data/voc_demo/VOCdevkit", "reader.train.mode=train", "runtime.sync_bn=false"]
PCA_DEMO = ["reader.train.transforms.0.eigenvalues_file=data/youtube8m_demo/yt8m_pca/eigenvals.npy"]
BENCH_TABLE = [
    ("AttentionLSTM", "configs/video/attention_lstm/attention_lstm_bilstm_10e_youtube8m.yaml",
     YT8M_DEMO, 16, "full-size model on the demo TFRecords (10-150 frames, mean 50)"),
    ("NeXtVLAD", "configs/video/nextvlad/nextvlad_k128_6e_youtube8m.yaml",
     YT8M_DEMO + PCA_DEMO, 16, "full-size model on the demo TFRecords (10-150 frames, mean 50)"),
    ("AttentionCluster", "configs/video/attention_cluster/attention_cluster_att32_5e_youtube8m.yaml",
     YT8M_DEMO, 64, "full-size model on the demo TFRecords, 100 frames sampled"),
    # full-size models and transforms on the demo videos (80x64 mp4v/MJPG, 16 or 24 frames), which
    # the recipes' Scale enlarges to 256 before the 224 crops: decoding costs less than real K400's
    ("TSN-R50", "configs/video/tsn/tsn_r50_100e_k400.yaml",
     ["reader.train.list_file=data/kinetics_demo/kinetics_appearance/train.list",
      "reader.train.label_names=data/kinetics_demo/kinetics_appearance/label_names.txt"], 4,
     "full-size model, 3 segments x 224 (MultiScaleCrop), on the 80x64 demo videos"),
    ("StNet-R50", "configs/video/stnet/stnet_r50_60e_k400.yaml",
     ["reader.train.list_file=data/kinetics_demo/kinetics_motion/train.list",
      "reader.train.label_names=data/kinetics_demo/kinetics_motion/label_names.txt"], 2,
     "full-size model, 7 segments x 5 frames x 224, on the 80x64 demo videos"),
    # the VOC recipe's transforms (512x512 padding crops) on the demo images, which they pad up to 512
    ("DeepLabV3-R50-OS8", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml", VOC_DEMO, 2,
     "full-size R50-vd OS8, 21 classes, 512x512 crops (demo images padded up)"),
    ("DeepLabV3-R50-OS8-recompute", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml",
     VOC_DEMO + ["model.backbone.recompute=true"], 2, "the same with backbone.recompute: true"),
]


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=_bootstrap.ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _time_reader(cfg, batch_size, workers, steps, seed):
    from engine import builder
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
    from engine import builder
    loader, _, _ = builder.build_loader(cfg, "train", seed, batch_size=batch_size)
    out = []
    while len(out) < min(steps, 4):
        for batch in loader:
            if len(batch["index"]) == batch_size:
                out.append(batch)
            if len(out) >= min(steps, 4):
                break
    return out


def _synthetic(batch):
    import paddle
    return {k: (paddle.randn(v.shape, v.dtype) if isinstance(v, paddle.Tensor) and v.dtype == paddle.float32
                and k.split("_")[-1] not in ("mask", "labels") else v) for k, v in batch.items()}


def _time_model(cfg, batches, steps, train):
    """Train steps through the trainer's own TrainStep (what training runs), or eval forwards."""
    import paddle
    from engine import builder, trainer
    model = builder.build_model(cfg["model"])
    if train:
        train_step = trainer.build_train_step(cfg, model, steps_per_epoch=max(steps, 1), total_steps=steps + 1)
        model = train_step.model
        model.train()

        def step(batch):
            return train_step(batch)["loss"]
    else:
        model.eval()

        def step(batch):
            with paddle.no_grad():
                return next(iter(model(batch).values()))

    step(batches[0]).numpy()  # warm-up: first-call allocations and kernel selection
    tic = time.perf_counter()
    for i in range(steps):
        out = step(batches[i % len(batches)])
    out.numpy()  # wait for the last step (asynchronous devices)
    elapsed = time.perf_counter() - tic
    n = sum(len(batches[i % len(batches)]["index"]) for i in range(steps))
    return n / elapsed, elapsed / steps, builder.count_params(model)


def bench(config_path, overrides, steps, batch_size, workers, synthetic):
    import paddle
    from engine import config, runtime
    from engine.components import load_all
    load_all()
    cfg = config.load(config_path, overrides)
    rt_cfg = config.section(cfg, "runtime", config.RUNTIME_KEYS)
    rt = runtime.setup(rt_cfg)
    seed = rt_cfg["seed"]
    runtime.seed_all(seed)
    bs = batch_size or cfg["reader"]["train"].get("batch_size", 1)
    result = {
        "command": " ".join([os.path.relpath(sys.argv[0], _bootstrap.ROOT)] + sys.argv[1:]),
        "config": config_path, "overrides": list(overrides), "batch_size": bs, "steps": steps,
        "git_commit": _git_commit(), "paddle": paddle.__version__, "python": platform.python_version(),
        "cpu": cpu_info()["model"], "cpu_vendor": cpu_info()["vendor"], "device": rt["device"],
        "threads": rt["threads"],
        "env": {k: os.environ.get(k) for k in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS", "FLAGS_use_stride_kernel")},
        "synthetic_inputs": synthetic, "reader": {},
    }
    for w in workers:
        sps, per_batch = _time_reader(cfg, bs, w, steps, seed)
        result["reader"][f"workers_{w}"] = {"samples_per_s": sps, "s_per_batch": per_batch}
    batches = _batches(cfg, bs, steps, seed)
    if synthetic:
        batches = [_synthetic(b) for b in batches]
    train_sps, train_step, params = _time_model(cfg, batches, steps, train=True)
    eval_sps, eval_step, _ = _time_model(cfg, batches, steps, train=False)
    result.update(params=params, train_samples_per_s=train_sps, train_s_per_step=train_step,
                  eval_samples_per_s=eval_sps, eval_s_per_step=eval_step,
                  peak_memory_mb=runtime.peak_memory_mb())
    for w, r in result["reader"].items():
        r["share_of_train_step"] = r["s_per_batch"] / (r["s_per_batch"] + train_step)
    return result


def _print(result):
    print(f"{result['config']} batch {result['batch_size']}, {result['threads']} threads on {result['cpu']}")
    print(f"  train {result['train_samples_per_s']:.2f} samples/s ({result['train_s_per_step']:.3f} s/step), "
          f"eval {result['eval_samples_per_s']:.2f} samples/s, peak memory {result['peak_memory_mb']:.0f} MB")
    for w, r in result["reader"].items():
        print(f"  reader {w}: {r['samples_per_s']:.1f} samples/s, "
              f"{100 * r['share_of_train_step']:.1f}% of a train step")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--synthetic", action="store_true", help="random features of the real batch shapes")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--table", action="store_true", help="run BENCH_TABLE, write benchmarks/results/*.json")
    p.add_argument("--show", action="store_true", help="print the table from benchmarks/results/*.json")
    p.add_argument("--only", nargs="+", help="with --table: rerun only these rows (names as in BENCH_TABLE)")
    args = p.parse_args()
    if args.table or args.show:
        rows = []
        for name, cfg_path, overrides, bs, note in BENCH_TABLE:
            out = os.path.join(_bootstrap.ROOT, "benchmarks", "results", f"{name.lower()}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "-c", cfg_path, "--batch-size", str(bs),
                   "--steps", str(args.steps), "--json", os.path.relpath(out, _bootstrap.ROOT),
                   "--workers", *map(str, args.workers)]
            for o in overrides:
                cmd += ["-o", o]
            if args.table and (not args.only or name in args.only):
                subprocess.run(cmd, check=True, cwd=_bootstrap.ROOT)  # one process each: clean peak memory
            if os.path.isfile(out):
                with open(out) as f:
                    rows.append((name, note, json.load(f)))
        print("\n| model | batch | input | params | train samples/s | eval samples/s | reader alone, samples/s "
              "(workers) | reader share of a train step | peak MB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, note, r in rows:
            workers = " / ".join(f"{v['samples_per_s']:.0f} ({w.split('_')[1]})" for w, v in r["reader"].items())
            share = " / ".join(f"{100 * v['share_of_train_step']:.1f}%" for v in r["reader"].values())
            print(f"| {name} | {r['batch_size']} | {note} | {r['params']:,} | {r['train_samples_per_s']:.2f} | "
                  f"{r['eval_samples_per_s']:.2f} | {workers} | {share} | {r['peak_memory_mb']:.0f} |")
        return
    if not args.config:
        p.error("-c CONFIG is required (or --table)")
    result = bench(args.config, args.override, args.steps, args.batch_size, args.workers, args.synthetic)
    _print(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
