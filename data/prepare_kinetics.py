"""Make the Kinetics reader's list files from downloaded videos (optionally extract JPEG frames, or
re-encode the videos with a short keyframe interval).

Two layouts are understood:
  * class folders: `<dir>/<class name>/<video>.mp4` (one root split by `--val-fraction`, or
    `--train-dir` and `--val-dir`);
  * the official annotation CSVs (`label,youtube_id,time_start,time_end,split`) with videos
    anywhere under `--train-dir`/`--val-dir`, named `<youtube_id>_<start:06d>_<end:06d>.<ext>` or
    `<youtube_id>.<ext>`.

Writes to `--out`: `label_names.txt` (class names sorted alphabetically, one per line: line i is
label i), `train.list` and `val.list` ("relpath label", paths relative to --out). With `--frames`
it also extracts every frame to `<frames>/<split>/<video>/img_00001.jpg ...` with OpenCV and writes
`train_frames.list` / `val_frames.list` ("relpath num_frames label") for `format: frames`.

With `--reencode DIR` it re-encodes every video to H.264 with a keyframe every `--gop` frames
(default 4) to `<DIR>/<split>/<video>.mp4` and writes `train_reencoded.list` /
`val_reencoded.list` (same `relpath label` lines and label numbers as train.list, for
`format: video`). Downloaded Kinetics clips are H.264 with x264's default keyframe interval of 250,
i.e. often one keyframe per clip: reaching TSN's 3 frames decodes most of the clip. A seek has a
fixed cost, so a short interval alone gains little; what pays is the interval together with x264's
fastdecode tuning: every 4 frames with `--fast-decode` (the default), for several times the long-GOP
clip's disk and a fraction of JPEG frames' (benchmarks/video_formats.py; docs/tsn-stnet.md, Data, has
the table, docs/performance.md#reader-figures the ratios). Every frame is kept (same count, same
order); `--reencode-scale` resizes (`256`: short side 256, `340x256`: width x height; sizes are
rounded to even numbers, as yuv420p needs), `--crf` and `--preset` are x264's; `--fast-decode`
(default; `--no-fast-decode` turns it off) drops B-frames and sets x264's fastdecode tuning (no
CABAC, no deblocking), for ~1.6x the disk.
The encoder is PyAV (`pip install av`, in requirements-test.txt): its wheels bundle FFmpeg with
libx264, it is maintained, and it sets the keyframe interval (gop_size, keyint_min, scenecut off)
as encoder options, without a subprocess or parsing an ffmpeg command line; every frame passes
through Python, which costs little next to x264 itself. A video that cannot be decoded is
reported on one line naming it, left out of the list, and counted; the others continue.

    python data/prepare_kinetics.py --root ~/k400/videos --out data/kinetics400 --val-fraction 0.05
    python data/prepare_kinetics.py --train-dir ~/k400/train --val-dir ~/k400/val \
        --train-csv ~/k400/annotations/train.csv --val-csv ~/k400/annotations/val.csv \
        --out data/kinetics400 --frames --frame-short-side 256 --workers 8
    python data/prepare_kinetics.py --root ~/k400/videos --out data/kinetics400 --val-fraction 0.05 \
        --reencode videos_gop4 --reencode-scale 340x256 --workers 8
"""
import argparse
import csv
import os
import shutil
import sys
from multiprocessing import Pool

import cv2
import numpy as np

VIDEO_EXTS = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".flv", ".mpg", ".mpeg")


def _is_video(name):
    return name.lower().endswith(VIDEO_EXTS)


def scan_class_folders(root):
    """[(path, class name)] for `root/<class>/<video>` (videos directly in root are ignored)."""
    if not os.path.isdir(root):
        sys.exit(f"error: video folder not found: {root}")
    items = []
    for cls in sorted(os.listdir(root)):
        d = os.path.join(root, cls)
        if os.path.isdir(d):
            items += [(os.path.join(d, f), cls) for f in sorted(os.listdir(d)) if _is_video(f)]
    if not items:
        sys.exit(f"error: no videos found under {root}/<class>/ (extensions {', '.join(VIDEO_EXTS)})")
    return items


def scan_csv(csv_path, video_dir):
    """[(path, class name)] for the rows of a Kinetics CSV whose video exists under video_dir."""
    if not os.path.isfile(csv_path):
        sys.exit(f"error: annotation file not found: {csv_path}")
    by_stem = {}
    for dirpath, _, files in os.walk(video_dir):
        for f in files:
            if _is_video(f):
                by_stem.setdefault(os.path.splitext(f)[0], os.path.join(dirpath, f))
    items, missing = [], 0
    with open(csv_path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        need = {"label", "youtube_id", "time_start", "time_end"}
        if not need <= set(reader.fieldnames or ()):
            sys.exit(f"error: {csv_path} lacks columns {sorted(need - set(reader.fieldnames or ()))}")
        for row in reader:
            yid = row["youtube_id"]
            stem = f"{yid}_{int(float(row['time_start'])):06d}_{int(float(row['time_end'])):06d}"
            path = by_stem.get(stem) or by_stem.get(yid)
            if path is None:
                missing += 1
                continue
            items.append((path, row["label"].strip().strip('"')))
    print(f"{csv_path}: {len(items)} videos found, {missing} listed but missing")
    return items


def split_val(items, fraction, seed):
    """Per-class random split, so every class keeps its share in val."""
    rng = np.random.default_rng(seed)
    by_class = {}
    for it in items:
        by_class.setdefault(it[1], []).append(it)
    train, val = [], []
    for cls in sorted(by_class):
        group = by_class[cls]
        order = rng.permutation(len(group))
        n_val = int(round(fraction * len(group)))
        if fraction > 0 and n_val == 0 and len(group) > 1:
            n_val = 1
        val += [group[i] for i in sorted(order[:n_val])]
        train += [group[i] for i in sorted(order[n_val:])]
    return train, val


def extract_frames(args):
    """Decode every frame of one video to JPEGs; returns the frame count (0 if unreadable)."""
    video, folder, short_side, quality = args
    if os.path.isdir(folder):
        return sum(1 for f in os.listdir(folder) if f.startswith("img_") and f.endswith(".jpg"))
    tmp = folder + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cap = cv2.VideoCapture(video)
    n = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if short_side:
            h, w = frame.shape[:2]
            s = short_side / min(h, w)
            frame = cv2.resize(frame, (int(round(w * s)), int(round(h * s))), interpolation=cv2.INTER_AREA)
        n += 1
        cv2.imwrite(os.path.join(tmp, f"img_{n:05d}.jpg"), frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
    cap.release()
    if n == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    os.replace(tmp, folder)
    return n


def parse_scale(text):
    """'0' (keep), '256' (short side) or '340x256' (width x height) -> None, int or (w, h)."""
    text = str(text).strip().lower()
    try:
        if "x" in text:
            w, h = (int(v) for v in text.split("x"))
            if w > 0 and h > 0:
                return w, h
        elif int(text) >= 0:
            return int(text) or None
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected 0, a short side (256) or WxH (340x256), got '{text}'")


def output_size(width, height, scale):
    """(w, h) of the re-encoded video: even numbers (yuv420p), the aspect kept for a short side."""
    if scale is None:
        w, h = width, height
    elif isinstance(scale, tuple):
        w, h = scale
    else:
        s = scale / min(width, height)
        w, h = width * s, height * s
    return max(2, int(round(w / 2)) * 2), max(2, int(round(h / 2)) * 2)


def reencode_video(args):
    """Re-encode one video to H.264 with a keyframe every `gop` frames.

    Returns (frames written, None), or (0, reason) when the input cannot be decoded (nothing is
    left behind then). An existing output is kept (a re-run resumes)."""
    video, out, gop, scale, crf, preset = args[:6]
    fast_decode = len(args) > 6 and args[6]
    import av  # optional: only --reencode needs PyAV
    if os.path.isfile(out):
        try:
            with av.open(out) as c:
                n = c.streams.video[0].frames
            if n > 0:
                return n, None
        except av.error.FFmpegError:
            pass
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    tmp = out + ".partial.mp4"
    n = 0
    try:
        with av.open(video) as src:
            istream = src.streams.video[0]
            rate = istream.average_rate or istream.guessed_rate or 25
            with av.open(tmp, "w") as dst:
                ostream = None
                for frame in src.decode(istream):
                    if ostream is None:
                        w, h = output_size(frame.width, frame.height, scale)
                        # keyint = min-keyint and no scene-cut keyframes: a keyframe exactly every
                        # `gop` frames (x264 defaults: 250, 25, and extra keyframes at scene cuts)
                        # fast_decode: no B-frames (nothing to reorder after a seek) and x264's
                        # fastdecode tuning (no CABAC, no deblocking): cheaper frames, larger files
                        options = {"crf": str(crf), "preset": preset,
                                   "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"
                                                  + (":bframes=0" if fast_decode else "")}
                        if fast_decode:
                            options["tune"] = "fastdecode"
                        ostream = dst.add_stream("libx264", rate=rate, options=options)
                        ostream.width, ostream.height, ostream.pix_fmt = w, h, "yuv420p"
                        ostream.codec_context.gop_size = gop
                        ostream.codec_context.time_base = 1 / rate  # frame i at pts i
                    out_frame = frame.reformat(w, h, format="yuv420p", interpolation="AREA")
                    out_frame.pts, out_frame.time_base = n, ostream.codec_context.time_base
                    # the source's keyframes arrive as pict_type I, which x264 would keep as extra
                    # keyframes: let the encoder choose
                    out_frame.pict_type = av.video.frame.PictureType.NONE
                    for packet in ostream.encode(out_frame):
                        dst.mux(packet)
                    n += 1
                if ostream is not None:
                    for packet in ostream.encode():
                        dst.mux(packet)
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        # IndexError: no video stream; FFmpegError: the container or a packet is unreadable
        if os.path.exists(tmp):
            os.remove(tmp)
        return 0, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if n == 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        return 0, "no frame decodable"
    os.replace(tmp, out)
    return n, None


def _run_jobs(fn, jobs, workers, what, split):
    """fn over jobs, in a process pool with workers > 1; results in order, progress printed."""
    pool = Pool(workers) if workers > 1 else None
    results = pool.imap(fn, jobs, chunksize=4) if pool else map(fn, jobs)
    out = []
    try:
        for i, r in enumerate(results, 1):
            out.append(r)
            if i % 500 == 0 or i == len(jobs):
                print(f"{split}: {what} {i}/{len(jobs)} videos", flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    return out


def write_list(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(str(x) for x in row) + "\n" for row in rows)
    print(f"wrote {path} ({len(rows)} entries)")


def main(argv=None):
    # the docstring's first paragraph (one sentence over two lines); the rest is for readers of the code
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--root", help="one folder <class>/<video>, split by --val-fraction")
    ap.add_argument("--train-dir", help="training videos (class folders, or anywhere with --train-csv)")
    ap.add_argument("--val-dir", help="validation videos")
    ap.add_argument("--train-csv", help="Kinetics annotation CSV for --train-dir")
    ap.add_argument("--val-csv", help="Kinetics annotation CSV for --val-dir")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="with --root (default 0.1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder for the lists and label_names.txt")
    ap.add_argument("--frames", nargs="?", const="frames", default=None,
                    help="also extract JPEG frames to this folder (relative to --out; default 'frames')")
    ap.add_argument("--frame-short-side", type=int, default=0, help="resize frames (0 = keep)")
    ap.add_argument("--jpeg-quality", type=int, default=95)
    ap.add_argument("--reencode", default=None, metavar="DIR",
                    help="also re-encode the videos to H.264 with a short keyframe interval into this "
                         "folder (relative to --out); lists <split>_reencoded.list")
    ap.add_argument("--gop", type=int, default=4,
                    help="frames between keyframes of the re-encoded videos (default 4)")
    ap.add_argument("--reencode-scale", type=parse_scale, default=None, metavar="SIZE",
                    help="resize re-encoded videos: 256 (short side) or 340x256 (WxH); default: keep")
    ap.add_argument("--crf", type=int, default=23, help="x264 quality of --reencode (default 23)")
    ap.add_argument("--preset", default="veryfast", help="x264 preset of --reencode (default veryfast)")
    ap.add_argument("--fast-decode", action=argparse.BooleanOptionalAction, default=True,
                    help="--reencode without B-frames and with x264's fastdecode tuning (default on): "
                         "~1.6x the disk, 1.8x (decord) to 2.3x (backend pyav) faster to read at gop 4")
    ap.add_argument("--workers", type=int, default=1, help="processes for --frames / --reencode")
    args = ap.parse_args(argv)

    if args.root and (args.train_dir or args.val_dir):
        ap.error("give either --root or --train-dir/--val-dir")
    if args.root:
        if not 0 <= args.val_fraction < 1:
            ap.error(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
        splits = dict(zip(("train", "val"), split_val(scan_class_folders(args.root), args.val_fraction,
                                                      args.seed)))
    elif args.train_dir or args.val_dir:
        splits = {}
        for split, d, c in (("train", args.train_dir, args.train_csv), ("val", args.val_dir, args.val_csv)):
            if d:
                splits[split] = scan_csv(c, d) if c else scan_class_folders(d)
    else:
        ap.error("give --root or --train-dir/--val-dir")

    classes = sorted({cls for items in splits.values() for _, cls in items})
    label = {c: i for i, c in enumerate(classes)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "label_names.txt"), "w", encoding="utf-8") as f:
        f.writelines(c + "\n" for c in classes)
    print(f"{len(classes)} classes -> {os.path.join(args.out, 'label_names.txt')}")
    for split, items in splits.items():
        write_list(os.path.join(args.out, f"{split}.list"),
                   [(os.path.relpath(p, args.out), label[c]) for p, c in items])

    split_dirs = {"train": args.root or args.train_dir, "val": args.root or args.val_dir}
    if args.reencode is not None:
        if args.gop < 1:
            ap.error(f"--gop must be >= 1, got {args.gop}")
        reencode(args, splits, split_dirs, label)
    if args.frames is None:
        return
    frames_root = os.path.join(args.out, args.frames)
    for split, items in splits.items():
        # a video's frame folder mirrors its path below the split's video folder
        jobs = [(p, os.path.join(frames_root, split, os.path.splitext(os.path.relpath(p, split_dirs[split]))[0]),
                 args.frame_short_side, args.jpeg_quality) for p, _ in items]
        counts = _run_jobs(extract_frames, jobs, args.workers, "extracted", split)
        rows, bad = [], []
        for (p, c), job, n in zip(items, jobs, counts):
            if n == 0:
                bad.append(p)
            else:
                rows.append((os.path.relpath(job[1], args.out), n, label[c]))
        for p in bad:
            print(f"warning: no frame decodable in {p}; left out of {split}_frames.list")
        write_list(os.path.join(args.out, f"{split}_frames.list"), rows)


def reencode(args, splits, split_dirs, label):
    """--reencode: every split's videos re-encoded, and <split>_reencoded.list."""
    root = os.path.join(args.out, args.reencode)
    for split, items in splits.items():
        jobs = [(p, os.path.join(root, split, os.path.splitext(os.path.relpath(p, split_dirs[split]))[0] + ".mp4"),
                 args.gop, args.reencode_scale, args.crf, args.preset, args.fast_decode) for p, _ in items]
        results = _run_jobs(reencode_video, jobs, args.workers, "re-encoded", split)
        rows, bad = [], 0
        for (p, c), job, (n, why) in zip(items, jobs, results):
            if n == 0:
                bad += 1
                print(f"warning: cannot re-encode {p} ({why}); left out of {split}_reencoded.list")
            else:
                rows.append((os.path.relpath(job[1], args.out), label[c]))
        if bad:
            print(f"{split}: {bad} of {len(jobs)} videos could not be re-encoded")
        write_list(os.path.join(args.out, f"{split}_reencoded.list"), rows)


if __name__ == "__main__":
    main()
