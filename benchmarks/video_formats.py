"""Clips/s per reader worker for each Kinetics storage format, and decord's access paths.

python benchmarks/video_formats.py [--clips 4] [--frames 250] [--size 340x256] [--rounds 5]
                                   [--gops 8,16] [--json PATH] [--workdir DIR]

Generates `--clips` clips of the same synthetic content (a panned texture, moving shapes, a little
noise; `--size` at 25 fps, `--frames` long) and stores them as
  - long-GOP H.264: libx264 with its defaults (preset medium, crf 23, keyint 250 and scene-cut
    keyframes), what downloaded Kinetics clips are;
  - short-GOP H.264: that file re-encoded by data/prepare_kinetics.py's --reencode (crf 23, preset
    veryfast, a keyframe every N frames, for each N of `--gops`; the last N also with
    --fast-decode: no B-frames, x264's fastdecode tuning);
  - mp4v: OpenCV's VideoWriter 'mp4v' (FFmpeg's MPEG-4 part 2, a keyframe every 12 frames), the
    demo videos' format;
  - frames: JPEG folders (quality 95) by prepare_kinetics.py's --frames.
Two tables, in alternating rounds in one process (one format after the other in each round;
medians over rounds, so a load that changes during the run touches every format alike):
  1. decode only: decord's two access paths on the same TSN train indices (3 segments, one frame
     each): `get_batch` on the sorted indices, and a seek per frame (`seek_accurate(i)` + `next()`,
     what `vr[i]` does); readers/kinetics.py picks between them by the rule this table supports.
  2. the reader, one worker (num_workers 0): KineticsDataset (backend decord; the short-GOP clips
     also with backend pyav, which seeks to the keyframe before each segment) with the TSN full
     recipe's train transforms (3 segments, Scale 256, MultiScaleCrop 224, flip, Normalize), clips/s per worker,
     and the ratio to the long-GOP clip. Also the bytes per clip on disk.
Clips/s per worker are from the process's CPU time (all its threads: decord decodes in a thread of
its own), which a busy machine disturbs far less than the wall clock (printed in brackets): a
worker with a core of its own reaches the CPU figure. The ratios, measured in the same rounds, hold.
The JSON (default benchmarks/results/<cpu kind>/video_formats.json) records the CPU and the rows.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import report  # noqa: E402
from data import prepare_kinetics  # noqa: E402
from engine.components import load_all  # noqa: E402
from readers.kinetics import KineticsDataset, _DecordVideo, sample_indices  # noqa: E402

TSN_TRAIN = [
    {"name": "Scale", "short_size": 256, "fixed_ratio": False},
    {"name": "MultiScaleCrop", "size": 224, "scales": [1.0, 0.875, 0.75, 0.66], "max_distort": 1,
     "fix_crop": True, "more_fix_crop": False},
    {"name": "RandomFlip", "p": 0.5},
    {"name": "Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
]


def _prepare_kinetics():
    return prepare_kinetics


def synthetic_frames(seed, n, width, height):
    """n RGB uint8 frames: a smooth texture panned across the frame, two moving blocks, noise."""
    rng = np.random.default_rng(seed)
    tex = cv2.GaussianBlur(rng.integers(0, 256, (height * 2, width * 2, 3), dtype=np.uint8), (0, 0), 1.2)
    tex = cv2.normalize(tex, None, 0, 255, cv2.NORM_MINMAX)
    colours = rng.integers(0, 256, (2, 3))
    for t in range(n):
        dx, dy = int(t * 0.9) % width, int(t * 0.4) % height
        f = tex[dy:dy + height, dx:dx + width].copy()
        for k, c in enumerate(colours):
            x = int((0.5 + 0.4 * np.sin(t / (15 + 10 * k) + k)) * (width - 40))
            y = int((0.5 + 0.4 * np.cos(t / (20 + 5 * k))) * (height - 40))
            f[y:y + 40, x:x + 40] = c
        noise = rng.integers(-6, 7, f.shape)
        yield np.clip(f.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def encode_long_gop(frames, path, rate=25):
    """H.264 with libx264's defaults (keyint 250, scene cuts): downloaded Kinetics clips."""
    import av  # optional: PyAV comes with the test requirements
    with av.open(path, "w") as c:
        s = c.add_stream("libx264", rate=rate, options={"crf": "23"})
        s.pix_fmt = "yuv420p"
        for i, a in enumerate(frames):
            if i == 0:
                s.height, s.width = a.shape[:2]
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def encode_mp4v(src, path):
    """OpenCV's 'mp4v' writer on the decoded frames of src (the demo videos' format)."""
    cap = cv2.VideoCapture(src)
    w = None
    while True:
        ok, f = cap.read()
        if not ok:
            break
        if w is None:
            w = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), 25, (f.shape[1], f.shape[0]))
        w.write(f)
    cap.release()
    w.release()


def _timed(fn):
    """(CPU seconds of this process, wall seconds) of fn()."""
    c, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c, time.perf_counter() - w


def tsn_train_indices(rng, n, num_seg=3):
    """TSN's train sampling (readers.kinetics.sample_indices), one frame per segment."""
    return sample_indices(n, num_seg, 1, True, rng).reshape(-1)


def decode(path, idx, access):
    """The reader's decord path (readers.kinetics._DecordVideo) with access 'batch' or 'seek'."""
    return _DecordVideo(path).read(idx, access)


def make_data(work, clips, nframes, width, height, gops):
    """{format name: (list file, format, [paths])} in work/."""
    pk = _prepare_kinetics()
    fmts = {"h264 long-GOP (keyint 250)": [], "mp4v": [], "frames (JPEG q95)": []}
    for g in gops:
        fmts[f"h264 short-GOP (keyint {g})"] = []
    fmts[f"h264 short-GOP (keyint {gops[-1]}, --fast-decode)"] = []
    frame_rows = []
    for k in range(clips):
        long = os.path.join(work, f"long_{k}.mp4")
        if not os.path.isfile(long):
            encode_long_gop(synthetic_frames(k, nframes, width, height), long)
        fmts["h264 long-GOP (keyint 250)"].append(long)
        mp4v = os.path.join(work, f"mp4v_{k}.mp4")
        if not os.path.isfile(mp4v):
            encode_mp4v(long, mp4v)
        fmts["mp4v"].append(mp4v)
        for g in gops:
            short = os.path.join(work, f"gop{g}_{k}.mp4")
            n, why = pk.reencode_video((long, short, g, None, 23, "veryfast"))
            if not n:
                sys.exit(f"re-encode failed: {why}")
            fmts[f"h264 short-GOP (keyint {g})"].append(short)
        fast = os.path.join(work, f"gop{gops[-1]}fd_{k}.mp4")
        n, why = pk.reencode_video((long, fast, gops[-1], None, 23, "veryfast", True))
        if not n:
            sys.exit(f"re-encode failed: {why}")
        fmts[f"h264 short-GOP (keyint {gops[-1]}, --fast-decode)"].append(fast)
        folder = os.path.join(work, f"frames_{k}")
        n = pk.extract_frames((long, folder, 0, 95))
        fmts["frames (JPEG q95)"].append(folder)
        frame_rows.append(f"{folder} {n} 0\n")
    out = {}
    for name, paths in fmts.items():
        lst = os.path.join(work, name.split()[0] + "_" + str(abs(hash(name)) % 10**6) + ".list")
        frames = name.startswith("frames")
        with open(lst, "w") as f:
            f.writelines(frame_rows if frames else [f"{p} 0\n" for p in paths])
        out[name] = (lst, "frames" if frames else "video", paths)
    return out


def disk_bytes(paths):
    total = 0
    for p in paths:
        if os.path.isdir(p):
            total += sum(os.path.getsize(os.path.join(p, f)) for f in os.listdir(p))
        else:
            total += os.path.getsize(p)
    return total / len(paths)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--size", default="340x256", help="WxH of the clips")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gops", default="8,16", help="keyframe intervals of the short-GOP clips")
    ap.add_argument("--json", default=None)
    ap.add_argument("--workdir", default=None, help="keep the generated clips here (default: a temp dir)")
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    gops = [int(g) for g in args.gops.split(",") if g]

    load_all()  # registers the transforms (Scale, MultiScaleCrop, ...)

    tmp = None
    work = args.workdir
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="video_formats_")
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    data = make_data(work, args.clips, args.frames, width, height, gops)
    print(f"generated {args.clips} clips per format ({args.size}, {args.frames} frames) "
          f"in {time.perf_counter() - t0:.0f} s", flush=True)

    datasets, source = {}, {}
    for name, (lst, fmt, _) in data.items():
        for backend in ("decord", "pyav") if "short-GOP" in name else ("decord",):
            label = name if fmt == "frames" else f"{name}, {backend}"
            source[label] = name
            datasets[label] = KineticsDataset(lst, format=fmt, num_seg=3, mode="train", backend=backend,
                                              transforms=copy.deepcopy(TSN_TRAIN))
    videos = [n for n, (_, fmt, _) in data.items() if fmt == "video"]
    dec = {(n, m): [] for n in videos for m in ("batch", "seek")}
    rdr = {n: [] for n in datasets}
    for r in range(args.rounds + 1):          # round 0 warms the caches and is not counted
        for name in videos:
            for access in ("batch", "seek"):
                rng = np.random.default_rng(r)
                t = _timed(lambda: [decode(p, tsn_train_indices(rng, args.frames), access)
                                    for p in data[name][2]])
                if r:
                    dec[name, access].append(t)
        for name, ds in datasets.items():
            ds.set_epoch(r)
            t = _timed(lambda: [ds[i] for i in range(len(ds))])
            if r:
                rdr[name].append(t)
        print(f"round {r}/{args.rounds} done", flush=True)

    def rate(times, i):                       # clips/s from the median time (i: 0 CPU, 1 wall)
        return args.clips / statistics.median(t[i] for t in times)

    kind = report.cpu_kind()
    print(f"\nCPU: {report.cpu_record()['cpu']} ({kind}); {args.clips} clips of {args.size} x "
          f"{args.frames} frames; medians of {args.rounds} alternating rounds; clips/s per worker from "
          f"the process's CPU time (decord's decoder thread included), wall-clock in brackets\n")
    print("decode only (3 TSN train frames per clip), clips/s:")
    print("| format | get_batch (sorted) | seek per frame | seek / get_batch (CPU) |")
    print("|---|---|---|---|")
    rows_dec = []
    for name in videos:
        gb, sk = dec[name, "batch"], dec[name, "seek"]
        rows_dec.append({"format": name, "get_batch": rate(gb, 0), "seek": rate(sk, 0),
                         "get_batch_wall": rate(gb, 1), "seek_wall": rate(sk, 1)})
        print(f"| {name} | {rate(gb, 0):.1f} ({rate(gb, 1):.1f}) | {rate(sk, 0):.1f} ({rate(sk, 1):.1f}) "
              f"| {rate(sk, 0) / rate(gb, 0):.2f} |")
    base = rate(rdr["h264 long-GOP (keyint 250), decord"], 0)
    print("\nreader, TSN full recipe train transforms, one worker:")
    print("| format | clips/s per worker | x long-GOP H.264 | MB per clip | workers for 2,000 clips/s |")
    print("|---|---|---|---|---|")
    rows = []
    for name in datasets:
        v, w = rate(rdr[name], 0), rate(rdr[name], 1)
        mb = disk_bytes(data[source[name]][2]) / 1e6
        rows.append({"format": name, "clips_per_s": v, "clips_per_s_wall": w, "ratio_to_long_gop": v / base,
                     "mb_per_clip": mb, "rounds_cpu_s": [t[0] for t in rdr[name]]})
        print(f"| {name} | {v:.1f} ({w:.1f}) | {v / base:.1f} | {mb:.2f} | {int(np.ceil(2000 / v))} |")
    record = dict(report.cpu_record(), commit=report.git_commit(), clips=args.clips, frames=args.frames,
                  size=args.size, rounds=args.rounds, decode=rows_dec, reader=rows,
                  command="python benchmarks/video_formats.py " + " ".join(argv or sys.argv[1:]))
    path = args.json or os.path.join(report.results_dir(kind), "video_formats.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print(f"\nwrote {path}")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
