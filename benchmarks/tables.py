"""The speed tables of docs/performance.md: the rows `make bench` measures (recipe, demo data, batch size) and their
markdown, from the JSON each row's run of tools/benchmark.py writes under benchmarks/results/<kind>/.
Nothing here loads paddle, so that `--show` answers at once; the measuring is benchmarks/recipes.py's.
"""
import json
import os
import subprocess
import sys

from benchmarks import report

# what --table runs once per row, in a process of its own (clean peak memory)
TOOL = os.path.join(report.ROOT, "tools", "benchmark.py")

# (name, config, overrides, batch size, note): what `make bench` measures for docs/performance.md.
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

# backends benchmarks/recipes.py times, under the names the latency table's columns look them up by
ONNX_RUNTIME = "exported, ONNX Runtime"   # tools/export.py --format onnx, the same threads
BF16_EXPORT = "exported, oneDNN bf16"            # tools/export.py --precision bf16 (CPUs with native bf16 only)
INT8_EXPORT = "ONNX Runtime INT8"                # tools/quantize.py
OPENVINO = "exported, OpenVINO"                  # the --format onnx export, --backend openvino
OPENVINO_BF16 = "OpenVINO bf16"                  # --backend openvino --precision bf16 (where OpenVINO has bf16)
OPENVINO_INT8 = "OpenVINO INT8"                  # tools/quantize.py --backend openvino (NNCF), float layers f32
OPENVINO_INT8_BF16 = "OpenVINO INT8 + bf16"      # the same IR where OpenVINO runs its float layers in bf16
# (column, header, precision, route as a deployment names it): the latency table's columns in order;
# a column no row of the CPU kind has is left out (no bf16 on this CPU, older rows)
INFER_COLUMNS = (
    ("dynamic", "dynamic", "fp32", None),
    ("exported, oneDNN", "Paddle Inference oneDNN", "fp32", "Paddle Inference (--backend inference)"),
    ("exported, no oneDNN", "Paddle Inference, no oneDNN", "fp32",
     "Paddle Inference without oneDNN (--backend inference --no-mkldnn)"),
    (ONNX_RUNTIME, "ONNX Runtime", "fp32", "ONNX Runtime (--format onnx, --backend onnxruntime)"),
    (OPENVINO, "OpenVINO", "fp32", "OpenVINO (--format onnx, --backend openvino)"),
    (BF16_EXPORT, "Paddle Inference oneDNN bf16", "bf16", "Paddle Inference bf16 (--precision bf16)"),
    (OPENVINO_BF16, "OpenVINO bf16", "bf16", "OpenVINO bf16 (--format onnx, --backend openvino --precision bf16)"),
    (INT8_EXPORT, "ONNX Runtime INT8", "int8", "ONNX Runtime INT8 (tools/quantize.py)"),
    (OPENVINO_INT8, "OpenVINO INT8", "int8", "OpenVINO INT8 (tools/quantize.py --backend openvino)"),
    (OPENVINO_INT8_BF16, "OpenVINO INT8 + bf16", "int8",
     "OpenVINO INT8, float layers bf16 (tools/quantize.py --backend openvino)"),
)
# (name, config, overrides, batch sizes, note): the latency table of docs/performance.md
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
     [1, 4], "full-size, seq 128 (padded), demo RTE-format test pairs"),
    # Transformer-base decoding (exported: encoder + decoder step programs, the same Python beam
    # search) of demo source sentences alone; untrained weights run every hypothesis to |source| + 5
    ("Transformer-base", "configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml",
     [f"reader.test.{k}={v}" for k, v in (
         ("src_file", "data/translation_demo/test.en"), ("tgt_file", "null"),
         ("spm_model", "data/translation_demo/spm.model"), ("vocab", "null"), ("input_format", "raw"))]
     + SOURCE_PLUS_5,
     [1, 4], "full-size base (vocabulary 33712), beam 5, demo sentences (~15 subwords)"),
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


def _heading(rows):
    """The line above a table: the CPU, threads, paddle and commits of its rows' JSON."""
    r = rows[0][-1]
    vendor = next((x[-1]["cpu_vendor"] for x in rows if x[-1].get("cpu_vendor")), "?")
    kind = next((x[-1]["cpu_kind"] for x in rows if x[-1].get("cpu_kind")), "?")
    commits = sorted({str(x[-1].get("git_commit"))[:10] for x in rows})
    return (f"{r['cpu']} ({kind}, {vendor}), {r['threads']} threads, paddle {r['paddle']}; "
            f"rows measured at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}")


def _inputs(rows):
    """The inputs of a table's rows, as a list below it (rows of one input share a line): a column of
    these notes made the tables too wide for the page."""
    by_note = {}
    for name, note, _ in rows:
        by_note.setdefault(note, []).append(name)
    return ["", "Inputs:", ""] + [f"- {', '.join(names)}: {note}" for note, names in by_note.items()] if rows else []


def _emit(args, name, lines, rows):
    """Print the table (under its heading) and, with --docs, write it into this kind's block of docs/performance.md."""
    if rows:
        lines = [_heading(rows), ""] + lines
    else:
        flags = {"bench-inference": "--table --backend inference", "bench-amp": "--amp-table"}.get(name, "--table")
        lines = [f"Not measured on this CPU kind ({args.kind or report.cpu_kind()}) yet: run `tools/benchmark.py "
                 f"{flags}` on such a machine."]
    print("\n" + "\n".join(lines))
    if args.docs:
        report.write_page(name, args.kind or report.cpu_kind(), lines, "tools/benchmark.py --show --docs"
                            + {"bench-inference": " --backend inference", "bench-amp": " --amp-table"}.get(name, ""))


def _table_rows(args, entries):
    """(name, note, result) of each (name, note, json path, flags) entry: with --table (re)measured in
    a process of its own (clean peak memory), then read from its JSON."""
    rows = []
    for name, note, out, flags in entries:
        if args.table and (not args.only or name in args.only or name.split(" ")[0] in args.only):
            cmd = [sys.executable, TOOL, *flags, "--steps", str(args.steps),
                   "--json", os.path.relpath(out, report.ROOT)]
            subprocess.run(cmd, check=True, cwd=report.ROOT)
        if os.path.isfile(out):
            with open(out) as f:
                rows.append((name, note, json.load(f)))
    return rows


def train_table(args):
    """BENCH_TABLE, one process per row (clean peak memory), or (--show) the stored results."""
    rows = _table_rows(args, [
        (name, note, os.path.join(report.results_dir(args.kind), f"{name.lower()}.json"),
         ["-c", cfg_path, "--batch-size", str(bs), "--workers", *map(str, args.workers),
          *[x for o in overrides for x in ("-o", o)], *[a for args_ in extra for a in args_]])
        for name, cfg_path, overrides, bs, note, *extra in BENCH_TABLE])
    lines = ["| model | batch | params | train samples/s | eval samples/s | reader alone, samples/s (workers) "
             "| reader share of a train step | peak MB |",
             "|---|---|---|---|---|---|---|---|"]
    for name, note, r in rows:
        workers = " / ".join(f"{v['samples_per_s']:.0f} ({w.split('_')[1]})" for w, v in r["reader"].items())
        share = " / ".join(f"{100 * v['share_of_train_step']:.1f}%" for v in r["reader"].values())
        tokens = f" ({r['train_tokens_per_s']:.0f} tokens/s)" if r.get("train_tokens_per_s") else ""
        lines.append(f"| {name} | {r['batch_size']} | {r['params']:,} | "
                     f"{r['train_samples_per_s']:.2f}{tokens} | {r['eval_samples_per_s']:.2f} | {workers} | "
                     f"{share} | {r['peak_memory_mb']:.0f} |")
    lines += _inputs(rows)
    _emit(args, "bench", lines, rows)


def amp_table(args):
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
            lines.append(f"| {name} | {f['batch_size']} "
                         f"| {f['train_samples_per_s']:.2f} / {b['train_samples_per_s']:.2f} "
                         f"| **{b['train_samples_per_s'] / f['train_samples_per_s']:.2f}** "
                         f"| {f['eval_samples_per_s']:.2f} / {b['eval_samples_per_s']:.2f} "
                         f"| {f['peak_memory_mb']:.0f} / {b['peak_memory_mb']:.0f} |")
    _emit(args, "bench-amp", lines, rows)


def inference_table(args):
    """INFER_TABLE: p50 / p90 latency of each backend per batch size, the speed-ups over Paddle Inference
    oneDNN fp32, sizes on disk, and below the table the fastest route per model and precision."""
    rows = _table_rows(args, [
        (name, note, os.path.join(report.results_dir(args.kind), "inference", f"{name.lower()}.json"),
         ["-c", cfg_path, "--backend", "inference", "--batch-sizes", *map(str, sizes),
          *[x for o in overrides for x in ("-o", o)]])
        for name, cfg_path, overrides, sizes, note in INFER_TABLE])
    measured = {row["backend"] for _, _, r in rows for row in r["rows"]}
    columns = [c for c in INFER_COLUMNS if c[0] in measured]
    faster = [c for c in columns if c[0] not in ("dynamic", "exported, oneDNN", "exported, no oneDNN")]
    # three tables of the same rows (fp32 latency; bf16 and INT8 latency; speed-ups, sizes and load):
    # one table of all the columns ran off the page at 1280 px
    parts = [[c for c in columns if c[2] == "fp32"], [c for c in columns if c[2] != "fp32"]]
    lines = []
    for part in parts:
        if not part:
            continue
        lines += [f"Latency, {' and '.join(dict.fromkeys(c[2] for c in part)).replace('int8', 'INT8')}, "
                  "p50 / p90 ms:", "", "| model | batch | " + " | ".join(c[1] for c in part) + " |",
                  "|" + "---|" * (len(part) + 2)]
        for name, note, r in rows:
            for bs in sorted({row["batch"] for row in r["rows"]}):
                by = {row["backend"]: row for row in r["rows"] if row["batch"] == bs}   # older rows lack some: -
                cells = [f"{by[c[0]]['p50_ms']:.1f} / {by[c[0]]['p90_ms']:.1f}" if c[0] in by else "-" for c in part]
                lines.append(f"| {name} | {bs} | {' | '.join(cells)} |")
        lines.append("")
    # the speed-ups, sizes and load: a column only where some row has it (older rows have neither)
    sized = any(r.get("size_on_disk_mb") for _, _, r in rows)
    head = (([f"p50 speed-up over oneDNN fp32 ({' / '.join(c[1] for c in faster)})"] if faster else [])
            + (["size on disk MB (Paddle / ONNX / ORT INT8 / OpenVINO INT8)"] if sized else []) + ["load (1 min)"])
    lines += ["| model | batch | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
    for name, note, r in rows:
        for bs in sorted({row["batch"] for row in r["rows"]}):
            by = {row["backend"]: row for row in r["rows"] if row["batch"] == bs}
            base = by.get("exported, oneDNN")
            cells = [" / ".join(f"**{base['p50_ms'] / by[c[0]]['p50_ms']:.2f}x**" if c[0] in by and base else "-"
                                for c in faster)] if faster else []
            size = r.get("size_on_disk_mb") or {}
            if sized:
                cells.append(" / ".join(f"{size[k]:.1f}" if k in size else "-"
                                        for k in ("paddle", "onnx", "int8", "openvino_int8")))
            load = r.get("load_avg_1m_before_after")
            cells.append("-" if load is None else " / ".join(map(str, load)))
            lines.append(f"| {name} | {bs} | {' | '.join(cells)} |")
    lines += _inputs(rows)
    if rows:
        lines += ["", f"Fastest route measured per model and precision on {rows[0][-1].get('cpu_kind', '?')} "
                      "(p50; against the runner-up of the same precision):", ""]
        lines += [f"- {name} {precision}: {text}" for name, _, r in rows for precision, text in fastest(r).items()]
    _emit(args, "bench-inference", lines, rows)


def winners(result):
    """{precision: [(batch, winning column, its p50 speed-up over the runner-up or None, runner-up's
    header)]} of one latency JSON: per batch size the deployable route (INFER_COLUMNS) with the lowest p50."""
    out = {}
    for precision in ("fp32", "bf16", "int8"):
        routes = [c for c in INFER_COLUMNS if c[2] == precision and c[3]]
        for bs in sorted({row["batch"] for row in result["rows"]}):
            by = {row["backend"]: row["p50_ms"] for row in result["rows"] if row["batch"] == bs}
            ranked = sorted(((by[c[0]], i) for i, c in enumerate(routes) if c[0] in by))
            if ranked:
                second = routes[ranked[1][1]] if len(ranked) > 1 else None
                out.setdefault(precision, []).append((bs, routes[ranked[0][1]], second and ranked[1][0] / ranked[0][0],
                                                      second and second[1]))
    return out


def fastest(result):
    """{precision: "OpenVINO 1.12x ONNX Runtime (batch 1), 1.05x ONNX Runtime (batch 4)"}: winners() as text."""
    out = {}
    for precision, wins in winners(result).items():
        against = [f"{ratio:.2f}x {second}" if second else "" for _, _, ratio, second in wins]
        if len({w[1] for w in wins}) == 1 and not any(against):
            out[precision] = f"{wins[0][1][1]} (the only route of {precision} measured)"
        elif len({w[1] for w in wins}) == 1:
            out[precision] = f"{wins[0][1][1]} " + ", ".join(f"{a} (batch {w[0]})" for w, a in zip(wins, against))
        else:
            out[precision] = ", ".join(f"batch {w[0]}: {w[1][1]} {a}" for w, a in zip(wins, against))
    return out
