"""The reader table: each full recipe's train reader alone, on generated data of the recipe's real size.

For each row (READER_TABLE) it measures, with the recipe's own reader, transforms, collate and batch
size (only the data paths overridden):
- samples/s through the loader with 0, 1, 2, ... workers, in total and per worker;
- bytes per batch across the process boundary: the nbytes of the collated batch's arrays as a worker
  hands them over (arrays go through shared memory, the rest is pickled: both counted);
- the split of the in-process work: read + decode (the dataset's `load`: file read, video/image decode,
  record parse, tokenising), transforms, collate (per sample), and transfer (per sample): the time a
  1-worker loader takes per batch to hand over the recipe's batch already collated (its worker
  returns it at once, so what is timed is the copy into shared memory, the queue and the tensors made
  in the main process, paddle's DataLoader being what it is).

Data is generated once under data/bench_real/ (git-ignored), a handful of distinct files per recipe,
listed many times so that every batch size fills: files are read from the page cache.
`scale` < 1 shrinks every size (frames, pixels, features, lengths) for the tests.
"""
import json
import math
import os
import pickle
import platform
import shutil
import time

import cv2
import numpy as np

from benchmarks import report

CACHE = os.path.join(report.ROOT, "data", "bench_real")

# Accelerator training rates the table converts into workers needed (samples/s of one accelerator).
# TSN-R50, BERT-base and DeepLabV3 are issue 40's figures; the others are scaled from TSN-R50's by
# forward compute (multiply-adds per sample, our count below): the same accelerator at the same
# share of its peak. Detectors and recurrent models reach a lower share, so for them the rate (and
# the workers needed) is an upper bound.
TSN_GMAC = 3 * 4.1   # 3 segments x ResNet-50 at 224 (4.1 GMAC)
ACCELERATOR = {
    "TSN-R50": (2000, "issue 40 (one fast GPU)"),
    "BERT-base": (3000, "issue 40 (one fast GPU, seq 128)"),
    "DeepLabV3-R50-OS8": (100, "issue 40 (one fast GPU, 1024x512 crops)"),
    "StNet-R50": (round(2000 * TSN_GMAC / (7 * 4.2), -1),
                  "TSN-R50's rate x 12.3 / 29.4 GMAC (7 ResNet-50 passes on 15-channel inputs)"),
    "MaskRCNN-R50-FPN": (round(2000 * TSN_GMAC / 260), "TSN-R50's rate x 12.3 / ~260 GMAC (R50-FPN at ~800x1333)"),
    "Transformer-base": (round(2000 * TSN_GMAC / 1.7, -2),
                         "TSN-R50's rate x 12.3 / 1.7 GMAC (a 27+28.5-subword pair: ~19 M MAC per source "
                         "token, ~42 M per target token with the 33712-way output)"),
    "AttentionLSTM": (round(2000 * TSN_GMAC / 7.8, -1),
                      "TSN-R50's rate x 12.3 / 7.8 GMAC (per modality a 512-wide embedding and a "
                      "bidirectional LSTM of 1024, over 300 frames)"),
    "NeXtVLAD": (round(2000 * TSN_GMAC / 1.5, -2),
                 "TSN-R50's rate x 12.3 / 1.5 GMAC (expansion x2, 8 groups x 128 clusters, over 300 frames)"),
    "AttentionCluster": (round(2000 * TSN_GMAC / 0.05, -3),
                         "TSN-R50's rate x 12.3 / 0.05 GMAC (32 attention clusters over 100 frames): "
                         "bounded by memory traffic in practice"),
}


# ------------------------------------------------------------------------------------ generators

def _done(folder, params):
    stamp = os.path.join(folder, "DONE")
    if os.path.isfile(stamp):
        with open(stamp) as f:
            try:
                return json.load(f) == params
            except ValueError:
                return False
    return False


def _fresh(folder):
    tmp = folder + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def _finish(tmp, folder, params):
    with open(os.path.join(tmp, "DONE"), "w") as f:
        json.dump(params, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def _texture(rng, h, w, sigma):
    """A smooth random field with fine noise: JPEG/PNG/H.264 see natural-image-like statistics."""
    small = rng.integers(0, 256, (max(2, h // 32), max(2, w // 32), 3)).astype(np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC).astype(np.float32)
    img += rng.normal(0, sigma, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def video_frames(rng, n, h, w):
    """n frames h x w of a camera panning over a textured scene with two moving objects."""
    scene = _texture(rng, h + 64, w + 96, 2.0)
    pos = rng.uniform(0.2, 0.8, (2, 2)) * [w, h]
    vel = rng.uniform(-3, 3, (2, 2))
    colours = rng.integers(0, 256, (2, 3)).tolist()
    for t in range(n):
        dx, dy = int(48 + 40 * math.sin(t / 40)), int(32 + 24 * math.cos(t / 55))
        frame = scene[dy:dy + h, dx:dx + w].copy()
        for k in range(2):
            p = pos[k] + vel[k] * t
            c = (int(p[0]) % w, int(p[1]) % h)
            cv2.circle(frame, c, max(3, h // 10), colours[k], -1)
        frame += rng.integers(0, 3, frame.shape, dtype=np.uint8)   # sensor noise: P-frames are not free
        yield frame


def encode_h264(path, frames, fps=25, gop=None, fast_decode=False):
    """H.264 (libx264 through PyAV, its default preset and CRF); `gop`: the keyframe interval
    (None: x264's default, keyint 250, so a 10 s clip has one keyframe); `fast_decode`: what
    data/prepare_kinetics.py --reencode writes by default (no B-frames, the fastdecode tuning,
    preset veryfast)."""
    try:
        import av  # optional: PyAV comes with the test requirements
    except ImportError:
        raise SystemExit("error: the H.264 clips are encoded with PyAV: pip install av "
                         "(requirements-test.txt)") from None
    with av.open(path, "w") as out:
        stream = None
        for frame in frames:
            if stream is None:
                options = {} if gop is None else {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
                if fast_decode:
                    options.update({"tune": "fastdecode", "preset": "veryfast", "x264-params": "bframes=0"})
                stream = out.add_stream("libx264", rate=fps, options=options)
                stream.height, stream.width = frame.shape[:2]
                stream.pix_fmt = "yuv420p"
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def keyframes(path):
    """Number of keyframes of a video file's first stream."""
    import av  # optional: PyAV comes with the test requirements
    with av.open(path) as f:
        return sum(1 for p in f.demux(video=0) if p.is_keyframe and p.size)


def make_kinetics(scale=1.0, clips=4, gop=None, root=None, fast_decode=False):
    """Kinetics-size clips: 340x256, 250 frames at 25 fps (scaled), in H.264 with keyframe interval
    `gop` (None: x264's default) and the same frames as JPEG folders. Returns the folder holding
    video.list, frames.list (one line per clip, repeated) and label_names.txt."""
    w, h, n = (max(16, int(round(v * scale / 2)) * 2) for v in (340, 256, 250))
    params = {"version": 1, "w": w, "h": h, "frames": n, "clips": clips, "gop": gop, "fps": 25,
              "fast_decode": fast_decode}
    folder = os.path.join(root or CACHE, f"kinetics_{w}x{h}x{n}_gop{gop or 'default'}{'_fast' * fast_decode}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    for c in range(clips):
        frames = list(video_frames(np.random.default_rng(c), n, h, w))
        encode_h264(os.path.join(tmp, f"clip{c}.mp4"), frames, gop=gop, fast_decode=fast_decode)
        os.makedirs(os.path.join(tmp, f"clip{c}"))
        for i, fr in enumerate(frames):
            cv2.imwrite(os.path.join(tmp, f"clip{c}", f"img_{i + 1:05d}.jpg"), fr[:, :, ::-1])
    with open(os.path.join(tmp, "label_names.txt"), "w") as f:
        f.writelines(f"class_{i}\n" for i in range(400))
    repeat = 256
    with open(os.path.join(tmp, "video.list"), "w") as f:
        f.writelines(f"clip{k % clips}.mp4 {k % 400}\n" for k in range(repeat))
    with open(os.path.join(tmp, "frames.list"), "w") as f:
        f.writelines(f"clip{k % clips} {n} {k % 400}\n" for k in range(repeat))
    params["keyframes_per_clip"] = keyframes(os.path.join(tmp, "clip0.mp4"))
    params["mp4_bytes"] = os.path.getsize(os.path.join(tmp, "clip0.mp4"))
    return _finish(tmp, folder, params)


def make_coco(scale=1.0, images=8, root=None):
    """COCO-size JPEGs (640x480, a few objects each) and a COCO instances JSON listing them many times."""
    from data import demo_coco  # only the COCO rows: its shapes and pycocotools
    h, w = (max(32, int(v * scale)) for v in (480, 640))
    params = {"version": 1, "h": h, "w": w, "images": images}
    folder = os.path.join(root or CACHE, f"coco_{w}x{h}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    os.makedirs(os.path.join(tmp, "images"))
    rng = np.random.default_rng(0)
    made = []
    for k in range(images):
        img, anns = demo_coco.make_image(rng, sizes=[(h, w)], scale=4.0 * scale)
        while not any(not a["iscrowd"] for a in anns):
            img, anns = demo_coco.make_image(rng, sizes=[(h, w)], scale=4.0 * scale)
        img = np.clip(img.astype(np.int16) + rng.integers(-6, 7, img.shape), 0, 255).astype(np.uint8)
        cv2.imwrite(os.path.join(tmp, "images", f"base_{k:03d}.jpg"), img[:, :, ::-1],
                    [cv2.IMWRITE_JPEG_QUALITY, 90])
        made.append(anns)
    out_images, out_anns = [], []
    for i in range(128):
        k = i % images
        name = f"img_{i:05d}.jpg"
        os.symlink(f"base_{k:03d}.jpg", os.path.join(tmp, "images", name))
        out_images.append({"id": i + 1, "file_name": name, "height": h, "width": w})
        for a in made[k]:
            out_anns.append(dict(a, id=len(out_anns) + 1, image_id=i + 1))
    cats = [{"id": cid, "name": name, "supercategory": "shape"} for name, cid, _ in demo_coco.CLASSES]
    with open(os.path.join(tmp, "instances.json"), "w") as f:
        json.dump({"images": out_images, "annotations": out_anns, "categories": cats}, f)
    return _finish(tmp, folder, params)


def make_cityscapes(scale=1.0, images=3, root=None):
    """Cityscapes-size PNGs (1024x2048 RGB and labelTrainIds) in Cityscapes' layout, listed 16 times."""
    h, w = (max(32, int(v * scale)) for v in (1024, 2048))
    params = {"version": 1, "h": h, "w": w, "images": images}
    folder = os.path.join(root or CACHE, f"cityscapes_{w}x{h}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    img_dir, lbl_dir = (os.path.join(tmp, sub, "train", "benchcity") for sub in ("leftImg8bit", "gtFine"))
    os.makedirs(img_dir)
    os.makedirs(lbl_dir)
    rng = np.random.default_rng(0)
    for k in range(images):
        img = _texture(rng, h, w, 6.0)
        blocks = rng.integers(0, 19, (max(1, h // 128), max(1, w // 128))).astype(np.uint8)
        label = cv2.resize(blocks, (w, h), interpolation=cv2.INTER_NEAREST)
        label[rng.random((h, w)) < 0.002] = 255
        cv2.imwrite(os.path.join(img_dir, f"base{k}.png"), img)     # not a sample: no _leftImg8bit suffix
        cv2.imwrite(os.path.join(lbl_dir, f"base{k}.png"), label)
    for i in range(16):
        for d, suffix in ((img_dir, "leftImg8bit"), (lbl_dir, "gtFine_labelTrainIds")):
            os.symlink(f"base{i % images}.png", os.path.join(d, f"benchcity_{i:06d}_{suffix}.png"))
    params["png_bytes"] = os.path.getsize(os.path.join(img_dir, "base0.png"))
    return _finish(tmp, folder, params)


def make_youtube8m(scale=1.0, videos=16, root=None):
    """YouTube-8M frame-level records: 150-300 frames (scaled) of 1024 rgb + 128 audio uint8 features,
    one TFRecord file listed 32 times, and PCA eigenvalues for NeXtVLAD."""
    from readers.tfrecord import encode_sequence_example, write_records  # only the YouTube-8M rows
    lo, hi = (max(2, int(v * scale)) for v in (150, 300))
    params = {"version": 1, "frames": [lo, hi], "videos": videos}
    folder = os.path.join(root or CACHE, f"youtube8m_{lo}-{hi}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    rng = np.random.default_rng(0)
    records = []
    for v in range(videos):
        n = int(rng.integers(lo, hi + 1))
        context = {"id": f"b{v:03d}".encode(), "labels": np.sort(rng.choice(3862, 3, replace=False)).astype(np.int64)}
        lists = {name: [[row.tobytes()] for row in rng.integers(0, 256, (n, dim), dtype=np.uint8)]
                 for name, dim in (("rgb", 1024), ("audio", 128))}
        records.append(encode_sequence_example(context, lists))
    write_records(os.path.join(tmp, "train0000.tfrecord"), records)
    with open(os.path.join(tmp, "train.list"), "w") as f:
        f.writelines("train0000.tfrecord\n" for _ in range(32))
    os.makedirs(os.path.join(tmp, "yt8m_pca"))
    np.save(os.path.join(tmp, "yt8m_pca", "eigenvals.npy"),
            (4.0 / (1.0 + np.arange(1024) / 64.0)).astype(np.float32)[:, None])
    return _finish(tmp, folder, params)


def _zipf_words(rng, vocab, n):
    ranks = np.minimum(rng.zipf(1.2, n), len(vocab)) - 1
    return [vocab[r] for r in ranks]


def make_wmt(scale=1.0, pairs=4000, root=None):
    """WMT14 en-de-length pairs, already BPE-split (the recipe's `input_format: bpe`): source ~27,
    target ~28 subwords on average (WMT14 en-de with 33708 BPE merges), and a 33708-line vocabulary."""
    params = {"version": 1, "scale": scale, "pairs": pairs}
    folder = os.path.join(root or CACHE, f"wmt14_{scale:g}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20000)]
    vocab = ["<s>", "<e>", "<unk>"] + words + [f"p{i}@@" for i in range(33708 - 3 - len(words))]
    with open(os.path.join(tmp, "vocab"), "w") as f:
        f.writelines(t + "\n" for t in vocab)
    for side, mean in (("en", 27.0), ("de", 28.5)):
        rng_side = np.random.default_rng(1 if side == "en" else 2)
        lengths = np.clip(rng_side.lognormal(math.log(mean * scale) - 0.18, 0.6, pairs), 1, 250).astype(int)
        with open(os.path.join(tmp, f"train.{side}"), "w") as f:
            for n in lengths:
                toks = _zipf_words(rng, vocab[3:], int(n))
                f.write(" ".join(toks) + "\n")
    return _finish(tmp, folder, params)


def make_bert(scale=1.0, docs=200, root=None):
    """English-like pretraining text (documents of 10-40 sentences of 8-30 words, a blank line between
    documents) over a 30522-entry WordPiece vocabulary; 1 word in 10 is split into pieces."""
    params = {"version": 1, "scale": scale, "docs": docs}
    folder = os.path.join(root or CACHE, f"bert_{scale:g}")
    if _done(folder, params):
        return folder
    tmp = _fresh(folder)
    rng = np.random.default_rng(0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    stems = [f"word{i}" for i in range(28000)]
    pieces = [f"##x{i}" for i in range(30522 - len(specials) - len(stems) - 2)]
    vocab = specials + [".", ","] + stems + pieces
    with open(os.path.join(tmp, "vocab.txt"), "w") as f:
        f.writelines(t + "\n" for t in vocab)
    lines = []
    for _ in range(docs):
        for _ in range(int(rng.integers(10, 41))):
            n = max(2, int(rng.integers(8, 31) * scale))
            ws = _zipf_words(rng, stems, n)
            ws = [w + "x" + str(int(rng.integers(len(pieces)))) if rng.random() < 0.1 else w for w in ws]
            lines.append(" ".join(ws) + " .")
        lines.append("")
    with open(os.path.join(tmp, "train.txt"), "w") as f:
        f.write("\n".join(lines[:-1]) + "\n")
    return _finish(tmp, folder, params)


# ------------------------------------------------------------------------------------ the table

def _kinetics(fmt, gop=None, fast_decode=False, backend=None):
    def overrides(scale):
        d = make_kinetics(scale, gop=gop, fast_decode=fast_decode)
        out = [f"reader.train.list_file={d}/{'video' if fmt == 'video' else 'frames'}.list",
               f"reader.train.label_names={d}/label_names.txt"]
        return out + (["reader.train.format=frames"] if fmt == "frames" else []) + (
            [f"reader.train.backend={backend}"] if backend else [])
    return overrides


def _yt8m(extra=()):
    def overrides(scale):
        d = make_youtube8m(scale)
        return [f"reader.train.files=[{d}/train.list]"] + [e.format(d=d) for e in extra]
    return overrides


def _wmt(scale):
    d = make_wmt(scale)
    return [f"reader.train.src_file={d}/train.en", f"reader.train.tgt_file={d}/train.de", f"reader.train.vocab={d}/vocab"]


def _bert(scale):
    d = make_bert(scale)
    return [f"reader.train.files=[{d}/train.txt]", f"reader.train.vocab_file={d}/vocab.txt"]


def _cityscapes(scale):
    return [f"reader.train.root={make_cityscapes(scale)}"]


def _coco(scale):
    d = make_coco(scale)
    return [f"reader.train.ann_file={d}/instances.json", f"reader.train.image_dir={d}/images"]


# (row, accelerator key, config, overrides(scale), batch size timed or None for the recipe's, data)
# Long-GOP H.264 rows time batch 8 instead of 32/16: at a few clips/s a batch of 32 takes ~10 s per
# worker count; the per-clip rate is what matters, and bytes/batch are given at the recipe's batch.
READER_TABLE = [
    ("TSN-R50 H.264", "TSN-R50", "configs/video/tsn/tsn_r50_100e_k400.yaml", _kinetics("video"), 8,
     "340x256, 250 frames, H.264, x264 default keyframe interval (one keyframe)"),
    ("TSN-R50 H.264 gop 4 fast, pyav", "TSN-R50", "configs/video/tsn/tsn_r50_100e_k400.yaml",
     _kinetics("video", 4, fast_decode=True, backend="pyav"), None,
     "the same frames as data/prepare_kinetics.py --reencode writes them (a keyframe every 4 frames, "
     "fast-decode tuning), read with backend: pyav"),
    ("TSN-R50 frames", "TSN-R50", "configs/video/tsn/tsn_r50_100e_k400.yaml", _kinetics("frames"), None,
     "the same frames as JPEG folders (format: frames)"),
    ("StNet-R50 H.264", "StNet-R50", "configs/video/stnet/stnet_r50_60e_k400.yaml", _kinetics("video"), 4,
     "340x256, 250 frames, H.264, x264 default keyframe interval"),
    ("StNet-R50 frames", "StNet-R50", "configs/video/stnet/stnet_r50_60e_k400.yaml", _kinetics("frames"), None,
     "the same frames as JPEG folders"),
    ("AttentionLSTM", "AttentionLSTM", "configs/video/attention_lstm/attention_lstm_bilstm_10e_youtube8m.yaml",
     _yt8m(), None, "TFRecords, 150-300 frames of 1024 rgb + 128 audio"),
    ("NeXtVLAD", "NeXtVLAD", "configs/video/nextvlad/nextvlad_k128_6e_youtube8m.yaml",
     _yt8m(["reader.train.transforms.0.eigenvalues_file={d}/yt8m_pca/eigenvals.npy"]), None,
     "TFRecords, 150-300 frames"),
    ("AttentionCluster", "AttentionCluster", "configs/video/attention_cluster/attention_cluster_att32_5e_youtube8m.yaml",
     _yt8m(), None, "TFRecords, 150-300 frames, 100 sampled"),
    ("BERT-base", "BERT-base", "configs/nlp/bert/bert_base_1000k_pretrain.yaml", _bert, None,
     "seq 128, 20 masked tokens max (the recipe's)"),
    ("Transformer-base", "Transformer-base", "configs/nlp/transformer/transformer_base_30e_wmt14ende.yaml", _wmt, None,
     "BPE pairs, 27 / 28.5 subwords mean, 8192-token batches"),
    ("DeepLabV3-R50-OS8", "DeepLabV3-R50-OS8", "configs/vision/deeplabv3/deeplabv3_r50vd_os8_80k_cityscapes.yaml",
     _cityscapes, None, "1024x2048 PNG + label PNG, 1024x512 crops"),
    ("MaskRCNN-R50-FPN", "MaskRCNN-R50-FPN", "configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml", _coco, None,
     "640x480 JPEG, 1-4 objects with polygons"),
]


def row(name):
    for r in READER_TABLE:
        if r[0] == name:
            return r
    raise SystemExit(f"error: no reader row '{name}' (rows: {', '.join(r[0] for r in READER_TABLE)})")


def batch_bytes(batch):
    """Bytes a worker hands over for a collated (not finalized) batch: the nbytes of its numeric
    arrays (shared memory) and the length of everything else pickled (metadata, ragged arrays)."""
    arrays = {k: v for k, v in batch.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    rest = {k: v for k, v in batch.items() if k not in arrays}
    return {"arrays": int(sum(v.nbytes for v in arrays.values())),
            "pickled": len(pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)),
            "by_key": {k: int(v.nbytes) for k, v in arrays.items()}}


def _time_transfer(batch, batches):
    """Seconds per batch for a 1-worker loader to hand `batch` (collated) to the main process."""
    import paddle  # paddle's side after the command's flags are parsed (import cost)
    from engine import data  # paddle's side after the command's flags are parsed (import cost)
    ready = batch

    class Set(paddle.io.Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            return 0

    sampler = [[0]] * (batches + 3)
    loader = data.WorkerLoader(Set(), sampler, lambda samples: ready, 1)
    it = _Batches(loader)
    for _ in range(3):
        next(it)
    tic = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - tic
    it.close()
    return elapsed / batches


def _split(dataset, sampler, collate, batches):
    """In-process seconds per sample of load (read + decode), transforms, collate, and the collated
    batches (for their bytes)."""
    from engine import data  # paddle's side after the command's flags are parsed (import cost)
    t = {"decode": 0.0, "transforms": 0.0, "collate": 0.0, "to_tensor": 0.0}
    n, made = 0, []
    for indices in sampler:
        samples = []
        for i in indices:
            tic = time.perf_counter()
            s = dataset.load(int(i))
            t["decode"] += time.perf_counter() - tic
            s["index"] = np.int64(i)
            s["_rng"] = np.random.default_rng([dataset.seed, dataset.epoch, int(i)])
            tic = time.perf_counter()
            for tr in dataset.transforms:
                s = tr(s)
            t["transforms"] += time.perf_counter() - tic
            samples.append(s)
        tic = time.perf_counter()
        b = collate(samples)
        t["collate"] += time.perf_counter() - tic
        tic = time.perf_counter()
        data.finalize(b)
        t["to_tensor"] += time.perf_counter() - tic
        n += len(samples)
        made.append(b)
        if len(made) >= batches:
            break
    return {k: v / n for k, v in t.items()}, made


class _Batches:
    """A loader's batches with a `close` that stops its worker processes at once: left to the
    garbage collector, they go on prefetching while the next measurement runs."""

    def __init__(self, loader):
        from engine import data  # paddle's side after the command's flags are parsed (import cost)
        self.worker = isinstance(loader, data.WorkerLoader)
        self.it = iter(loader.loader) if self.worker else iter(loader)

    def __next__(self):
        from engine import data  # paddle's side after the command's flags are parsed (import cost)
        batch = next(self.it)
        return data._unpack(batch) if self.worker else batch   # WorkerLoader.__iter__'s step

    def close(self):
        if self.worker:
            self.it._try_shutdown_all()
        self.it = None


def _rate(cfg, batch_size, workers, batches, seed, min_seconds):
    """samples/s of the recipe's train loader with `workers` workers. W workers hand over batches in
    groups of W (they start together): the clock runs from the end of the second group to the end of
    a later one, so start-up and the batches finished before the clock started do not count."""
    from engine import builder  # paddle's side after the command's flags are parsed (import cost)
    cfg = json.loads(json.dumps(cfg))
    cfg["reader"]["train"]["num_workers"] = workers
    loader, _, _ = builder.build_loader(cfg, "train", seed, batch_size=batch_size)
    group = max(1, workers)
    state = {"it": _Batches(loader)}

    def take():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"].close()
            state["it"] = _Batches(loader)
            return next(state["it"])
    for _ in range(2 * group):
        take()
    n, k, tic = 0, 0, time.perf_counter()
    while k < batches * group or (time.perf_counter() - tic < min_seconds and k < 4 * batches * group) \
            or k % group:
        n += len(take()["index"])
        k += 1
    elapsed = time.perf_counter() - tic
    state["it"].close()
    return n / elapsed, k


def measure(name, scale=1.0, workers=(0, 1, 2), batches=3, min_seconds=2.0, seed=0):
    """One row's record (see the module docstring)."""
    from engine import builder  # paddle's side after the command's flags are parsed (import cost)
    from engine.config import split_reader  # paddle's side after the command's flags are parsed (import cost)
    from engine.session import Session  # paddle's side after the command's flags are parsed (import cost)
    _, accel, config, overrides, timed_bs, note = row(name)
    ovr = overrides(scale)
    s = Session.from_file(config, ovr)
    s.setup()
    cfg = s.cfg
    recipe_bs = cfg["reader"]["train"].get("batch_size")
    bs = timed_bs or recipe_bs
    if scale < 1 and bs:
        bs = max(2, int(bs * scale))
    tic = time.perf_counter()
    _, dataset, sampler = builder.build_loader(json.loads(json.dumps(cfg)), "train", seed, batch_size=bs)
    setup_s = time.perf_counter() - tic
    from engine.registry import COLLATES  # paddle's side after the command's flags are parsed (import cost)
    _, loader_cfg = split_reader(cfg, "train")
    collate = COLLATES.build(loader_cfg.collate or {"name": "Stack"})
    split, made = _split(dataset, sampler, collate, batches)
    sizes = [batch_bytes(b) for b in made]
    per_batch = [len(b["index"]) for b in made]
    per_sample_bytes = sum(x["arrays"] + x["pickled"] for x in sizes) / sum(per_batch)
    transfer = _time_transfer(made[0], max(2, batches))
    split["transfer"] = transfer / per_batch[0]
    rates = {}
    for w in workers:
        sps, k = _rate(cfg, bs, w, batches, seed, min_seconds)
        rates[f"workers_{w}"] = {"samples_per_s": sps, "per_worker": sps / max(1, w), "batches": k}
    # timed at a smaller batch than the recipe's: bytes per sample x the recipe's batch (exact for
    # stacked batches; for padded ones, at the timed batches' padding)
    scaled = recipe_bs is not None and loader_cfg.sampler is None and bs != recipe_bs
    rate, rate_source = ACCELERATOR[accel]
    one = rates.get("workers_1", rates.get(f"workers_{workers[0]}"))
    return {
        "row": name, "config": config, "overrides": ovr, "note": note, "scale": scale,
        "recipe_batch_size": recipe_bs, "batch_size_timed": bs,
        "samples_per_batch": per_batch,
        "bytes_per_batch": sizes[0]["arrays"] + sizes[0]["pickled"], "bytes_per_batch_detail": sizes[0],
        "bytes_per_sample": per_sample_bytes,
        "bytes_per_recipe_batch": (per_sample_bytes * recipe_bs if scaled else sizes[0]["arrays"] + sizes[0]["pickled"]),
        "split_s_per_sample": split, "transfer_s_per_batch": transfer,
        "dataset_setup_s": setup_s, "readers": rates,
        # the other reading of "transfer": the 1-worker loop's time per sample beyond the in-process
        # loop's (everything a worker adds, noisy on a shared machine; may be negative)
        "worker_loop_minus_serial_s_per_sample": (1 / rates["workers_1"]["samples_per_s"] - 1 / rates["workers_0"]["samples_per_s"]
                                                  if {"workers_0", "workers_1"} <= set(rates) else None),
        "accelerator": {"name": accel, "samples_per_s": rate, "source": rate_source},
        "workers_needed": math.ceil(rate / one["per_worker"]) if one["per_worker"] > 0 else None,
        "workers_needed_from": "workers_1" if "workers_1" in rates else f"workers_{workers[0]}",
    }


def run(names, scale=1.0, workers=(0, 1, 2), batches=3, min_seconds=2.0, log=print):

    import paddle  # paddle's side after the command's flags are parsed (import cost)
    rows = []
    load_before = round(os.getloadavg()[0], 2)
    for name in names:
        tic = time.perf_counter()
        r = measure(name, scale, workers, batches, min_seconds)
        r["seconds"] = time.perf_counter() - tic
        log(format_row(r))
        rows.append(r)
    return {"git_commit": report.git_commit(), "paddle": paddle.__version__, "python": platform.python_version(),
            **report.cpu_record(), "cpus": os.cpu_count(), "workers": list(workers), "batches": batches,
            "scale": scale, "load_avg_1m_before_after": [load_before, round(os.getloadavg()[0], 2)], "rows": rows}


def format_row(r):
    rates = "  ".join(f"{k.split('_')[1]}w {v['samples_per_s']:.1f}/s" for k, v in r["readers"].items())
    sp = r["split_s_per_sample"]
    return (f"{r['row']:<22} {rates}  {r['bytes_per_recipe_batch'] / 2 ** 20:.1f} MB/batch  "
            f"ms/sample: decode {1e3 * sp['decode']:.2f} transforms {1e3 * sp['transforms']:.2f} "
            f"collate {1e3 * sp['collate']:.2f} transfer {1e3 * sp['transfer']:.2f}  "
            f"workers needed {r['workers_needed']}")


# ------------------------------------------------------------------------------------ JSON and docs

def path(kind=None):
    return os.path.join(report.results_dir(kind), "readers.json")


def save(result, merge=True):
    """Write benchmarks/results/<kind>/readers.json; with `merge`, the table's rows not rerun are kept."""
    p = path(result["cpu_kind"])
    if merge and os.path.isfile(p):
        with open(p) as f:
            old = json.load(f)
        new = {r["row"] for r in result["rows"]}
        order = [r[0] for r in READER_TABLE]
        # a row the table no longer has (renamed or dropped) goes with its old figures
        rows = [r for r in old.get("rows", []) if r["row"] not in new and r["row"] in order
                and r.get("scale") == result["scale"]] + result["rows"]
        rows.sort(key=lambda r: order.index(r["row"]))
        result = dict(result, rows=rows)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        json.dump(result, f, indent=1)
    return p


def _mb(n):
    return f"{n / 2 ** 20:.1f}" if n >= 2 ** 20 / 10 else f"{n / 2 ** 10:.0f} kB"


def _ms(s):
    return f"{1e3 * s:.2f}" if s < 0.01 else f"{1e3 * s:.0f}"


def _rate_cell(x):
    return "-" if not x else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def table_lines(result):
    workers = sorted({int(k.split("_")[1]) for r in result["rows"] for k in r["readers"]})
    # a column per worker count; the rate of one worker is its "1 worker" column (no column of its own:
    # ten columns ran off the page at 1280 px)
    head = ["row", "batch"] + [f"{w} workers" if w != 1 else "1 worker" for w in workers] + \
           ["MB/batch", "ms/sample: decode / transforms / collate / transfer",
            "accelerator rate", "workers needed"]
    lines = [f"Measured on {result['cpu']} ({result['cpu_kind']}, {result['cpus']} cores), load "
             f"{result['load_avg_1m_before_after'][0]} before the run; samples/s.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        rates = [r["readers"].get(f"workers_{w}", {}).get("samples_per_s") for w in workers]
        sp = r["split_s_per_sample"]
        bs = r["batch_size_timed"] if r["batch_size_timed"] == r["recipe_batch_size"] else \
            f"{r['recipe_batch_size']} ({r['batch_size_timed']} timed)"
        if r["recipe_batch_size"] is None:
            bs = f"~{round(sum(r['samples_per_batch']) / len(r['samples_per_batch']))} (token budget)"
        cells = [r["row"], str(bs)] + [_rate_cell(x) for x in rates] + [_mb(r["bytes_per_recipe_batch"]),
            " / ".join(_ms(sp[k]) for k in ("decode", "transforms", "collate", "transfer")),
            f"{r['accelerator']['samples_per_s']:,.0f}", str(r["workers_needed"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


DOCS_BLOCK = "bench-readers"
DOCS_COMMAND = "tools/benchmark.py --readers --show --docs"


def write_docs(result, page=None):
    report.write_page(DOCS_BLOCK, result["cpu_kind"], table_lines(result), DOCS_COMMAND, page)
