"""Throughput of a recipe on this machine: reader alone, model alone (train and eval), peak memory.

python tools/benchmark.py -c CONFIG [-o k=v ...] [--steps N] [--batch-size B] [--workers 0 2]
                          [--synthetic] [--tokens KEY] [--drop-keys KEY ...] [--json PATH]
python tools/benchmark.py --table     # the README's table (BENCH_TABLE below), JSON per row
python tools/benchmark.py --show [--readme] [--kind KIND]   # the same table from the committed JSON
python tools/benchmark.py -c CONFIG --backend inference [--batch-sizes 1 8] [--weights W]
python tools/benchmark.py --table --backend inference   # README latency table (INFER_TABLE)
python tools/benchmark.py --amp-table [--only ...] [--readme]   # fp32 beside bf16 (AMP_TABLE), peak memory

The JSON of the tables lives per CPU kind, benchmarks/results/<kind>/ (and .../<kind>/inference/),
of the machine that ran them; `--show` reads this machine's kind unless `--kind` names another, and
`--readme` replaces only that kind's table in README.md (benchmarks/report.py).

The reader is timed alone (iterating the train DataLoader, for each worker count) and the model alone
(train steps and eval forwards on batches already in memory), so the reader's share of a step is
reader_time / (reader_time + model_time) for a reader with the given workers feeding the model.

`--backend inference` times prediction instead: the dynamic model in eval mode against the same
model exported by tools/export.py and run by Paddle Inference, with oneDNN on and off, and exported
with --format onnx and run by ONNX Runtime (the same threads), on a val batch of each size; it
reports the latency per batch (p50, p90) and samples/s.

`--amp-table` runs each AMP_TABLE row twice, fp32 and `train.amp` bf16 (each in its own process, so
each peak memory is its own), and tabulates samples/s, their ratio and the peak memory side by side;
`--show --amp-table` prints it from benchmarks/results/<kind>/amp/.

`--tokens KEY` also reports tokens/s, counting the batch's `KEY_len` (e.g. the target tokens of a
translation batch); `--drop-keys` removes batch keys before the eval forwards (e.g. the targets, so
that a translation model's eval times decoding alone). A row of BENCH_TABLE may end with such
extra arguments.
"""
import _bootstrap  # noqa: F401  (environment before paddle)

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

from benchmarks import report
from engine import cli

# (name, config, overrides, batch size, note): what `make bench` measures for the README.
YT8M_DEMO = ["reader.train.files=[data/youtube8m_demo/train.list]", "reader.train.num_workers=0"]
VOC_DEMO = ["reader.train.root=data/voc_demo/VOCdevkit", "reader.train.mode=train", "runtime.sync_bn=false"]
PCA_DEMO = ["reader.train.transforms.0.eigenvalues_file=data/youtube8m_demo/yt8m_pca/eigenvals.npy"]
TRANSFORMER_ON_DEMO = [f"reader.train.{k}={v}" for k, v in (
    ("src_file", "data/translation_demo/train.en"), ("tgt_file", "data/translation_demo/train.xx"),
    ("spm_model", "data/translation_demo/spm.model"), ("vocab", "null"), ("input_format", "raw"),
    ("sampler", "null"), ("num_workers", 0))]
# untrained decoding to a fixed length: the recorded figures' setting (the length-penalty search's limit)
SOURCE_PLUS_5 = ["model.beam_search_version=length_penalty", "model.max_len_a=1.0", "model.max_len_b=5"]
BERT_DEMO = ["reader.train.files=[data/bert_demo/corpus/train.txt]",
             "reader.train.vocab_file=data/bert_demo/vocab_30522.txt", "reader.train.collate.max_len=128"]
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
    # translation: training tokens/s (target tokens) and decoding sentences/s (eval forwards on
    # source-only batches) with the decoder's cache, then without it (-o model.use_cache=false). The
    # weights are untrained, so every hypothesis runs to the length limit: the length-penalty search's,
    # relative to the source, set to |source| + 5 (v1's max_out_len would be 256 steps of noise).
    *[(f"Transformer-{size}{'-nocache' if not cache else ''}", cfg,
       ovr + SOURCE_PLUS_5 + ([] if cache else ["model.use_cache=false"]),
       bs, note, ["--tokens", "tgt_out", "--drop-keys", "tgt_in", "tgt_out"])
      for size, cfg, ovr, bs, note in (
          ("base", "configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml", TRANSFORMER_ON_DEMO, 32,
           "full-size base (vocabulary 33712), beam 5, demo sentences (15 source / 20 target subwords)"),
          ("demo", "configs/nlp/transformer/transformer_demo.yaml", ["reader.train.sampler=null"], 64,
           "demo model (2+2 layers, d 128, vocabulary 320), beam 4, demo sentences"))
      for cache in (True, False)],
    # BERT-base pretraining (MLM + NSP) at sequence length 128 (padded: tokens/s = samples/s x 128),
    # pairs and masks made by the reader from the demo corpus, with a vocab of BERT-base's size
    ("BERT-base", "configs/nlp/bert/bert_base_1000k_pretrain.yaml", BERT_DEMO, 8,
     "full-size pretraining model, seq 128 (padded), 20 masked tokens max, demo corpus"),
    ("BERT-base-recompute", "configs/nlp/bert/bert_base_1000k_pretrain.yaml", BERT_DEMO + ["model.recompute=true"], 8,
     "the same with recompute (activation checkpointing) of every encoder layer"),
    # the full R50-FPN recipe (frozen stem/res2/BN, 1000 train proposals, 512 RoIs, 100 detections
    # with masks pasted at full size) on the demo's 480x800 bench images, resized to 800x1333
    ("MaskRCNN-R50-FPN", "configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml",
     ["reader.train.ann_file=data/coco_demo/annotations/instances_bench.json",
      "reader.train.image_dir=data/coco_demo/bench", "reader.train.transforms.0.short_sizes=[800]"], 1,
     "full-size model, 800x1333 (8 synthetic 480x800 images, 1-4 objects each)"),
    # the VOC recipe's transforms (512x512 padding crops) on the demo images, which they pad up to 512
    ("DeepLabV3-R50-OS8", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml", VOC_DEMO, 2,
     "full-size R50-vd OS8, 21 classes, 512x512 crops (demo images padded up)"),
    ("DeepLabV3-R50-OS8-recompute", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml",
     VOC_DEMO + ["model.backbone.recompute=true"], 2, "the same with backbone.recompute: true"),
]


# issue 22's four models, fp32 and bf16 (BENCH_TABLE's rows by name); `--workers 0` only: the reader
# does not change with the precision
AMP_TABLE = ("BERT-base", "Transformer-base", "TSN-R50", "DeepLabV3-R50-OS8")
BF16 = ["train.amp.enable=true", "train.amp.dtype=bfloat16"]


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
    import paddle
    return {k: (paddle.randn(v.shape, v.dtype) if isinstance(v, paddle.Tensor) and v.dtype == paddle.float32
                and k.split("_")[-1] not in ("mask", "labels") else v) for k, v in batch.items()}


def _count(batch, tokens):
    return int(batch[tokens + "_len"].sum().item()) if tokens else len(batch["index"])


def _time_model(cfg, batches, steps, train, amp, tokens=None):
    """Train steps through the trainer's own TrainStep (what training runs), or eval forwards, with
    the resolved AMP settings `amp` (Session.train_amp / eval_amp).
    Returns (samples/s, s/step, parameters, tokens/s or None)."""
    import paddle
    from engine import builder, runtime
    from engine.training import trainer
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
    import paddle
    from engine import runtime
    from engine.session import Session
    s = Session.from_file(config_path, overrides)
    rt, cfg, seed = s.setup(), s.cfg, s.cfg.runtime.seed
    bs = batch_size or cfg["reader"]["train"].get("batch_size", 1)
    result = {
        "command": " ".join([os.path.relpath(sys.argv[0], _bootstrap.ROOT)] + sys.argv[1:]),
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
        from engine.errors import ConfigError
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
    import numpy as np
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def bench_inference(config_path, overrides, steps, batch_sizes, weights=None):
    import tempfile

    import paddle
    from engine import runtime
    from engine.deploy import export, quantize
    from engine.deploy.predictor import Predictor
    from engine.session import Session
    s = Session.from_file(config_path, overrides)
    rt, cfg = s.setup(), s.cfg
    model = s.model(weights, log=lambda *_: None)
    model.eval()
    split = cfg.eval_split()
    rows = []
    load_before = round(os.getloadavg()[0], 2)   # other work on the machine skews latency: recorded
    example = next(iter(s.loader(split, batch_size=1, sharded=False)[0]))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir, int8_dir = os.path.join(tmp, "onnx"), os.path.join(tmp, "int8")
        export.export(model, cfg, tmp, example=example)
        export.export(model, cfg, onnx_dir, example=example, fmt="onnx")
        batches = {}
        for bs in batch_sizes:
            loader, _, _ = s.loader(split, batch_size=bs, sharded=False)
            batches[bs] = next(b for b in loader if len(b["index"]) == bs)
        # INT8 calibrated on the timed batches themselves (random weights: ranges, not accuracy, matter)
        quant = quantize.quantize(onnx_dir, int8_dir, quantize.record_feeds(onnx_dir, batches.values(), rt["threads"]),
                                  threads=rt["threads"])
        backends = {"dynamic": None,
                    "exported, oneDNN": Predictor(tmp, mkldnn=True, threads=rt["threads"]),
                    "exported, no oneDNN": Predictor(tmp, mkldnn=False, threads=rt["threads"]),
                    ONNX_RUNTIME: Predictor(onnx_dir, threads=rt["threads"], backend="onnxruntime"),
                    BF16_EXPORT: Predictor(tmp, threads=rt["threads"], precision="bf16"),
                    INT8_EXPORT: Predictor(int8_dir, threads=rt["threads"], backend="onnxruntime")}
        if backends[BF16_EXPORT].precision != "bf16":   # no native bf16 here: the column would time fp32
            del backends[BF16_EXPORT]
        sizes = {"paddle": quantize.size_on_disk(tmp), "onnx": quant["fp32_bytes"], "int8": quant["int8_bytes"]}
        for bs, batch in batches.items():
            for name, predictor in backends.items():
                def run():
                    if predictor is not None:
                        return predictor(batch)
                    with paddle.no_grad():   # to host, as the predictor (lists: one array per sample)
                        return {k: [t.numpy() for t in v] if isinstance(v, list) else v.numpy()
                                for k, v in model(batch).items()}
                for _ in range(2):
                    run()
                times = []
                for _ in range(steps):
                    tic = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - tic)
                rows.append({"batch": bs, "backend": name, "p50_ms": _percentile(times, 50),
                             "p90_ms": _percentile(times, 90), "samples_per_s": bs * len(times) / sum(times)})
    return {"command": " ".join([os.path.relpath(sys.argv[0], _bootstrap.ROOT)] + sys.argv[1:]),
            "config": config_path, "overrides": list(overrides), "split": split, "steps": steps,
            "weights": weights, "git_commit": report.git_commit(), "paddle": paddle.__version__,
            **report.cpu_record(), "threads": rt["threads"],
            "env": {k: os.environ.get(k) for k in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS")},
            "rows": rows, "size_on_disk_mb": {k: v / 2 ** 20 for k, v in sizes.items()},
            "quantization": {k: quant[k] for k in ("route", "observer", "simulation_gap")},
            "peak_memory_mb": runtime.peak_memory_mb(),
            "load_avg_1m_before_after": [load_before, round(os.getloadavg()[0], 2)]}


ONNX_RUNTIME = "exported, ONNX Runtime"   # tools/export.py --format onnx, the same threads
BF16_EXPORT = "exported, oneDNN bf16"            # tools/export.py --precision bf16 (CPUs with native bf16 only)
INT8_EXPORT = "ONNX Runtime INT8"                # tools/quantize.py
# (name, config, overrides, batch sizes, note): the README's latency table
INFER_TABLE = [
    ("TSN-R50", "configs/video/tsn/tsn_r50_100e_k400.yaml",
     ["reader.val.list_file=data/kinetics_demo/kinetics_appearance/val.list",
      "reader.val.label_names=data/kinetics_demo/kinetics_appearance/label_names.txt",
      "reader.test.list_file=data/kinetics_demo/kinetics_appearance/val.list",
      "reader.test.label_names=data/kinetics_demo/kinetics_appearance/label_names.txt",
      "reader.test.num_seg=3", "reader.test.transforms.1.name=CenterCrop", "reader.test.num_workers=0"],
     [1, 4], "full-size, 3 segments x 224 centre crop"),
    ("AttentionLSTM", "configs/video/attention_lstm/attention_lstm_bilstm_10e_youtube8m.yaml",
     ["reader.val.files=[data/youtube8m_demo/val.list]", "reader.val.num_workers=0"],
     [1, 16], "full-size, demo TFRecords (10-150 frames)"),
    # BERT-base classification on the demo GLUE test pairs (no labels: no loss), padded to 128 tokens
    ("BERT-base", "configs/nlp/bert/bert_base_3e_glue_rte.yaml",
     ["reader.test.data_dir=data/bert_demo/glue", "reader.test.vocab_file=data/bert_demo/vocab_30522.txt",
      "reader.test.collate.max_len=128"],
     [1, 8], "full-size, seq 128 (padded), demo RTE-format test pairs"),
    # Transformer-base decoding (exported: encoder + decoder step programs, the same Python beam
    # search) of demo source sentences alone; untrained weights run every hypothesis to |source| + 5
    ("Transformer-base", "configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml",
     [f"reader.test.{k}={v}" for k, v in (
         ("src_file", "data/translation_demo/test.en"), ("tgt_file", "null"),
         ("spm_model", "data/translation_demo/spm.model"), ("vocab", "null"), ("input_format", "raw"))]
     + SOURCE_PLUS_5,
     [1, 8], "full-size base (vocabulary 33712), beam 5, demo sentences (~15 subwords)"),
    # the exported networks are timed with the Python the model's exported_runner runs around them:
    # the arg-max for DeepLabV3; proposals to detections (NMS, top-100, mask head, pasting) for Mask R-CNN
    ("DeepLabV3-R50-OS8", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml",
     ["reader.val.root=data/voc_demo/VOCdevkit", "reader.val.num_workers=0", "runtime.sync_bn=false",
      "reader.val.transforms=[{name: Scale, short_size: 512}, {name: CenterCrop, size: 512}, "
      "{name: Normalize, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}]"],
     [1, 4], "full-size R50-vd OS8, 21 classes, whole 512x512 image (demo images resized)"),
    ("MaskRCNN-R50-FPN", "configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml",
     ["reader.val.ann_file=data/coco_demo/annotations/instances_bench.json",
      "reader.val.image_dir=data/coco_demo/bench", "reader.val.num_workers=0"],
     [1, 2], "full-size R50-FPN, 800x1333 (480x800 demo images resized), 1000 proposals, 100 detections"),
]


def _print_inference(name, r):
    for row in r["rows"]:
        print(f"  {name} batch {row['batch']:>3} {row['backend']:<22} p50 {row['p50_ms']:9.1f} ms  "
              f"p90 {row['p90_ms']:9.1f} ms  {row['samples_per_s']:8.2f} samples/s")


def _heading(rows):
    """The line above a table: the CPU, threads, paddle and commits of its rows' JSON."""
    r = rows[0][-1]
    vendor = next((x[-1]["cpu_vendor"] for x in rows if x[-1].get("cpu_vendor")), "?")
    kind = next((x[-1]["cpu_kind"] for x in rows if x[-1].get("cpu_kind")), "?")
    commits = sorted({str(x[-1].get("git_commit"))[:10] for x in rows})
    return (f"{r['cpu']} ({kind}, {vendor}), {r['threads']} threads, paddle {r['paddle']}; "
            f"rows measured at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}")


def _emit(args, name, lines, rows):
    """Print the table (under its heading) and, with --readme, write it into this kind's README block."""
    if rows:
        lines = [_heading(rows), ""] + lines
    else:
        flags = {"bench-inference": "--table --backend inference", "bench-amp": "--amp-table"}.get(name, "--table")
        lines = [f"Not measured on this CPU kind ({args.kind or report.cpu_kind()}) yet: run `tools/benchmark.py "
                 f"{flags}` on such a machine."]
    print("\n" + "\n".join(lines))
    if args.readme:
        report.write_readme(name, args.kind or report.cpu_kind(), lines, "tools/benchmark.py --show --readme"
                            + {"bench-inference": " --backend inference", "bench-amp": " --amp-table"}.get(name, ""))


def _table_rows(args, entries):
    """(name, note, result) of each (name, note, json path, flags) entry: with --table (re)measured in
    a process of its own (clean peak memory), then read from its JSON."""
    rows = []
    for name, note, out, flags in entries:
        if args.table and (not args.only or name in args.only or name.split(" ")[0] in args.only):
            cmd = [sys.executable, os.path.abspath(__file__), *flags, "--steps", str(args.steps),
                   "--json", os.path.relpath(out, _bootstrap.ROOT)]
            subprocess.run(cmd, check=True, cwd=_bootstrap.ROOT)
        if os.path.isfile(out):
            with open(out) as f:
                rows.append((name, note, json.load(f)))
    return rows


def _amp_table(args):
    """AMP_TABLE in fp32 and bf16: samples/s (train, eval), bf16 / fp32, peak memory."""
    rows = _table_rows(args, [
        (f"{name} {prec}", note, os.path.join(report.results_dir(args.kind), "amp", f"{name.lower()}.{prec}.json"),
         ["-c", cfg_path, "--batch-size", str(bs), "--workers", "0",
          *[x for o in overrides + (BF16 if prec == "bf16" else []) for x in ("-o", o)],
          *[a for args_ in extra for a in args_]])
        for name, cfg_path, overrides, bs, note, *extra in BENCH_TABLE if name in AMP_TABLE
        for prec in ("fp32", "bf16")])
    by = {name: r for name, _, r in rows}
    lines = ["| model | batch | train samples/s fp32 / bf16 | bf16 / fp32 | eval samples/s fp32 / bf16 | "
             "peak MB fp32 / bf16 |", "|---|---|---|---|---|---|"]
    for name in AMP_TABLE:
        f, b = by.get(f"{name} fp32"), by.get(f"{name} bf16")
        if f and b:
            lines.append(f"| {name} | {f['batch_size']} | {f['train_samples_per_s']:.2f} / {b['train_samples_per_s']:.2f} | "
                         f"**{b['train_samples_per_s'] / f['train_samples_per_s']:.2f}** | {f['eval_samples_per_s']:.2f} / "
                         f"{b['eval_samples_per_s']:.2f} | {f['peak_memory_mb']:.0f} / {b['peak_memory_mb']:.0f} |")
    _emit(args, "bench-amp", lines, rows)


def _inference_table(args):
    rows = _table_rows(args, [
        (name, note, os.path.join(report.results_dir(args.kind), "inference", f"{name.lower()}.json"),
         ["-c", cfg_path, "--backend", "inference", "--batch-sizes", *map(str, sizes),
          *[x for o in overrides for x in ("-o", o)]])
        for name, cfg_path, overrides, sizes, note in INFER_TABLE])
    lines = ["| model | input | batch | dynamic p50 / p90 ms | exported + oneDNN p50 / p90 ms | exported, no oneDNN "
             "p50 / p90 ms | ONNX Runtime p50 / p90 ms | oneDNN bf16 p50 / p90 ms | ORT INT8 p50 / p90 ms | "
             "bf16, INT8 speed-up over oneDNN fp32 (p50) | size on disk fp32 / INT8 MB | samples/s (the six, in order) | "
             "load (1 min) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    columns = ("dynamic", "exported, oneDNN", "exported, no oneDNN", ONNX_RUNTIME, BF16_EXPORT, INT8_EXPORT)
    for name, note, r in rows:
        for bs in sorted({row["batch"] for row in r["rows"]}):
            by = {row["backend"]: row for row in r["rows"] if row["batch"] == bs}   # older rows lack some: -
            cells = [f"{by[b]['p50_ms']:.1f} / {by[b]['p90_ms']:.1f}" if b in by else "-" for b in columns]
            base = by.get("exported, oneDNN")
            gain = " / ".join(f"**{base['p50_ms'] / by[b]['p50_ms']:.2f}x**" if b in by and base else "-"
                              for b in (BF16_EXPORT, INT8_EXPORT))
            size = r.get("size_on_disk_mb")
            size = f"{size['paddle']:.1f} / {size['int8']:.1f}" if size else "-"
            load = r.get("load_avg_1m_before_after")
            load = "-" if load is None else " / ".join(map(str, load))
            sps = " / ".join(f"{by[b]['samples_per_s']:.2f}" if b in by else "-" for b in columns)
            lines.append(f"| {name} | {note} | {bs} | {' | '.join(cells)} | {gain} | {size} | {sps} | {load} |")
    _emit(args, "bench-inference", lines, rows)


def _print(result):
    print(f"{result['config']} batch {result['batch_size']}, {result['threads']} threads on {result['cpu']}")
    print(f"  train {result['train_samples_per_s']:.2f} samples/s ({result['train_s_per_step']:.3f} s/step), "
          f"eval {result['eval_samples_per_s']:.2f} samples/s, peak memory {result['peak_memory_mb']:.0f} MB")
    if result.get("tokens_key"):
        print(f"  train {result['train_tokens_per_s']:.0f} {result['tokens_key']} tokens/s")
    for w, r in result["reader"].items():
        print(f"  reader {w}: {r['samples_per_s']:.1f} samples/s, "
              f"{100 * r['share_of_train_step']:.1f}% of a train step")


def _parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--synthetic", action="store_true", help="random features of the real batch shapes")
    p.add_argument("--tokens", metavar="KEY", help="also count tokens/s from the batch's KEY_len")
    p.add_argument("--drop-keys", nargs="+", default=[], metavar="KEY", help="batch keys removed before eval forwards")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--table", action="store_true", help="run BENCH_TABLE, write benchmarks/results/<kind>/*.json")
    p.add_argument("--show", action="store_true", help="print the table from benchmarks/results/<kind>/*.json")
    p.add_argument("--amp-table", action="store_true", help="fp32 and bf16 rows of AMP_TABLE (--show: print them)")
    p.add_argument("--only", nargs="+", help="with --table: rerun only these rows (names as in BENCH_TABLE)")
    p.add_argument("--kind", help="with --show: the results of this CPU kind (e.g. amd-zen4; default: this machine's)")
    p.add_argument("--readme", action="store_true", help="with --show/--table: write the table into README.md")
    p.add_argument("--backend", choices=["dynamic", "inference"], default="dynamic",
                   help="inference: prediction latency, dynamic vs exported (Paddle Inference with oneDNN on/off, "
                        "ONNX Runtime)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="with --backend inference")
    p.add_argument("--weights", help="with --backend inference: weights to load (default: initial weights)")
    return p


def main():
    p = _parser()
    args = p.parse_args()
    if args.kind and args.table:
        p.error("--kind is for --show: --table measures this machine's kind")
    if args.amp_table:
        args.table = not args.show
        return _amp_table(args)
    if args.table or args.show:
        return _inference_table(args) if args.backend == "inference" else _train_table(args)
    if not args.config:
        p.error("-c CONFIG is required (or --table)")
    if args.backend == "inference":
        result = bench_inference(args.config, args.override, args.steps, args.batch_sizes, args.weights)
        _print_inference(args.config, result)
    else:
        result = bench(args.config, args.override, args.steps, args.batch_size, args.workers, args.synthetic,
                       args.tokens, args.drop_keys)
        _print(result)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def _train_table(args):
    """BENCH_TABLE, one process per row (clean peak memory), or (--show) the stored results."""
    rows = _table_rows(args, [
        (name, note, os.path.join(report.results_dir(args.kind), f"{name.lower()}.json"),
         ["-c", cfg_path, "--batch-size", str(bs), "--workers", *map(str, args.workers),
          *[x for o in overrides for x in ("-o", o)], *[a for args_ in extra for a in args_]])
        for name, cfg_path, overrides, bs, note, *extra in BENCH_TABLE])
    lines = ["| model | batch | input | params | train samples/s | eval samples/s | reader alone, samples/s "
             "(workers) | reader share of a train step | peak MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, note, r in rows:
        workers = " / ".join(f"{v['samples_per_s']:.0f} ({w.split('_')[1]})" for w, v in r["reader"].items())
        share = " / ".join(f"{100 * v['share_of_train_step']:.1f}%" for v in r["reader"].values())
        tokens = f" ({r['train_tokens_per_s']:.0f} tokens/s)" if r.get("train_tokens_per_s") else ""
        lines.append(f"| {name} | {r['batch_size']} | {note} | {r['params']:,} | "
                     f"{r['train_samples_per_s']:.2f}{tokens} | {r['eval_samples_per_s']:.2f} | {workers} | "
                     f"{share} | {r['peak_memory_mb']:.0f} |")
    _emit(args, "bench", lines, rows)


if __name__ == "__main__":
    cli.run(main)
