"""Make the Kinetics reader's list files from downloaded videos (optionally extract JPEG frames).

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

    python data/prepare_kinetics.py --root ~/k400/videos --out data/kinetics400 --val-fraction 0.05
    python data/prepare_kinetics.py --train-dir ~/k400/train --val-dir ~/k400/val \
        --train-csv ~/k400/annotations/train.csv --val-csv ~/k400/annotations/val.csv \
        --out data/kinetics400 --frames --frame-short-side 256 --workers 8
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


def write_list(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(" ".join(str(x) for x in row) + "\n" for row in rows)
    print(f"wrote {path} ({len(rows)} entries)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    ap.add_argument("--workers", type=int, default=1)
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

    if args.frames is None:
        return
    frames_root = os.path.join(args.out, args.frames)
    split_dirs = {"train": args.root or args.train_dir, "val": args.root or args.val_dir}
    for split, items in splits.items():
        # a video's frame folder mirrors its path below the split's video folder
        jobs = [(p, os.path.join(frames_root, split, os.path.splitext(os.path.relpath(p, split_dirs[split]))[0]),
                 args.frame_short_side, args.jpeg_quality) for p, _ in items]
        pool = Pool(args.workers) if args.workers > 1 else None
        results = pool.imap(extract_frames, jobs, chunksize=4) if pool else map(extract_frames, jobs)
        counts = []
        for i, n in enumerate(results, 1):
            counts.append(n)
            if i % 500 == 0 or i == len(jobs):
                print(f"{split}: extracted {i}/{len(jobs)} videos", flush=True)
        if pool:
            pool.close()
            pool.join()
        rows, bad = [], []
        for (p, c), job, n in zip(items, jobs, counts):
            if n == 0:
                bad.append(p)
            else:
                rows.append((os.path.relpath(job[1], args.out), n, label[c]))
        for p in bad:
            print(f"warning: no frame decodable in {p}; left out of {split}_frames.list")
        write_list(os.path.join(args.out, f"{split}_frames.list"), rows)


if __name__ == "__main__":
    main()
