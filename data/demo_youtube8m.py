"""A small YouTube-8M-style frame-feature dataset in the real formats, for the demo recipes.

Writes, under `root`:
    tfrecord/train0000.tfrecord ...      SequenceExamples (context id + labels, rgb/audio bytes)
    pkl/train0000.pkl ...                the same videos in Paddle's pkl layout
    train.list, val.list                 tfrecord shards (paths relative to root)
    train_pkl.list, val_pkl.list         pkl shards
    label_names.txt                      one class name per line
    yt8m_pca/eigenvals.npy               [1024, 1] made-up PCA eigenvalues for PCARescale (NeXtVLAD)
    DONE                                 written last: the generation parameters (JSON)

The signal: every frame is quantized uint8 noise around 128 (per-frame Gaussian plus a per-video
offset shared by all its frames). For each of a video's 1-3 labels, 2-4 frames at random positions
also carry that class's direction (a fixed random vector per class and modality, rgb and audio at
the same frames). Lengths are log-uniform in [min_frames, max_frames], so a model that averages
all frames (or the padding) sees the class evidence diluted by up to ~50x, while one that finds the
few informative frames (attention, max-pooling, an LSTM with masks) does well.

The last class ("FadeOut") has no direction: its evidence is that the video ends with blank
frames (30-60% of its frames) (quantized 127 in both modalities, which dequantizes to 0.0, exactly the value the
PadSequences collate pads with). With the mask that is easy to see; a model that ignores the mask
cannot tell these videos from the padded ones, so it scores lower on that class.
"""
import argparse
import json
import os
import pickle
import string
import sys

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from readers.tfrecord import encode_sequence_example, write_records  # noqa: E402

CLASS_NAMES = ["Game", "Vehicle", "Concert", "Cooking", "Dance", "Animal", "Football", "Guitar",
               "Cartoon", "Fishing", "Drum", "Aircraft"]  # the last class used is renamed FadeOut
DIMS = {"rgb": 1024, "audio": 128}
NOISE = 24.0        # std of the per-frame noise, in quantization steps
VIDEO_OFFSET = 0.5  # std of the per-video offset, in units of NOISE
AMPLITUDE = 12.0    # length of a class direction, in units of NOISE
BACKGROUND = 24.0   # std over dimensions of the dataset's mean frame, in quantization steps
BLANK = 127         # dequantizes to 127*4/255 + 4/512 - 2 = -3e-5: the padding value
FADE_FRACTION = (0.3, 0.6)  # share of a FadeOut video's frames that are blank, at its end


def _shards(videos, n):
    return [videos[i::n] for i in range(n)] if videos else []


def _video_ids(rng, count):
    alphabet = np.array(list(string.ascii_letters + string.digits))
    ids, seen = [], set()
    while len(ids) < count:
        vid = "".join(rng.choice(alphabet, 4))
        if vid not in seen:
            seen.add(vid)
            ids.append(vid)
    return ids


def _make_videos(rng, ids, num_classes, min_frames, max_frames, directions, background):
    videos = []
    log_lo, log_hi = np.log(min_frames), np.log(max_frames + 1)
    for vid in ids:
        k = int(rng.choice([1, 2, 3], p=[0.5, 0.3, 0.2]))
        labels = np.sort(rng.choice(num_classes, k, replace=False))
        fade = num_classes - 1 in labels
        per_label = rng.integers(2, 5, size=k) * (labels != num_classes - 1)
        n = max(min(int(np.exp(rng.uniform(log_lo, log_hi))), max_frames), 2 * int(per_label.sum()) + 2)
        n_fade = max(1, int(n * rng.uniform(*FADE_FRACTION))) if fade else 0
        positions = rng.choice(n - n_fade, int(per_label.sum()), replace=False)
        owner = np.repeat(labels, per_label)
        video = {"video": vid, "label": labels.tolist(), "nframes": min(n, 300)}
        for name, dim in DIMS.items():
            x = rng.standard_normal((n, dim), dtype=np.float32)
            x += VIDEO_OFFSET * rng.standard_normal(dim, dtype=np.float32)
            x[positions] += directions[name][owner]
            video[name] = np.clip(np.rint(128.0 + background[name] + NOISE * x), 0, 255).astype(np.uint8)
            if n_fade:
                video[name][n - n_fade:] = BLANK
        videos.append(video)
    return videos


def _example(video):
    context = {"id": video["video"].encode(), "labels": np.asarray(video["label"], np.int64)}
    lists = {name: [[row.tobytes()] for row in video[name]] for name in DIMS}
    return encode_sequence_example(context, lists)


def _pkl_item(video):
    return {"video": video["video"], "feature": video["rgb"], "audio": video["audio"],
            "label": list(video["label"]), "nframes": video["nframes"]}


def make(root: str, seed: int = 0, num_train: int = 800, num_val: int = 200, num_classes: int = 8,
         min_frames: int = 10, max_frames: int = 150, train_shards: int = 4, val_shards: int = 2):
    """Write the dataset under `root` unless a complete one with the same parameters is there."""
    params = dict(seed=seed, num_train=num_train, num_val=num_val, num_classes=num_classes,
                  min_frames=min_frames, max_frames=max_frames, train_shards=train_shards,
                  val_shards=val_shards, noise=NOISE, video_offset=VIDEO_OFFSET,
                  amplitude=AMPLITUDE, background=BACKGROUND, fade=list(FADE_FRACTION), version=2)
    done = os.path.join(root, "DONE")
    if os.path.isfile(done):
        try:
            with open(done) as f:
                if json.load(f) == params:
                    return root
        except (OSError, ValueError):
            pass
        os.remove(done)
    if not 3 <= num_classes <= 1000 or not 1 <= min_frames <= max_frames:
        raise ValueError(f"need 3 <= num_classes <= 1000 and 1 <= min_frames <= max_frames, got "
                         f"{num_classes}, {min_frames}, {max_frames}")

    rng = np.random.default_rng(seed)
    directions = {}
    for name, dim in DIMS.items():
        d = rng.standard_normal((num_classes, dim)).astype(np.float32)
        directions[name] = AMPLITUDE * d / np.linalg.norm(d, axis=1, keepdims=True)
    # real features are not centred on 0: frames share a mean away from the padding value
    background = {name: BACKGROUND * rng.standard_normal(dim).astype(np.float32) for name, dim in DIMS.items()}
    ids = _video_ids(rng, num_train + num_val)
    splits = {"train": _make_videos(rng, ids[:num_train], num_classes, min_frames, max_frames,
                                    directions, background),
              "validate": _make_videos(rng, ids[num_train:], num_classes, min_frames, max_frames,
                                       directions, background)}

    for sub in ("tfrecord", "pkl", "yt8m_pca"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    lists = {"train": [], "validate": [], "train_pkl": [], "validate_pkl": []}
    for split, videos in splits.items():
        shards = _shards(videos, train_shards if split == "train" else val_shards)
        for i, shard in enumerate(shards):
            name = f"{split}{i:04d}"
            write_records(os.path.join(root, "tfrecord", name + ".tfrecord"),
                          [_example(v) for v in shard])
            tmp = os.path.join(root, "pkl", name + ".pkl.partial")
            with open(tmp, "wb") as f:
                pickle.dump([_pkl_item(v) for v in shard], f, protocol=4)
            os.replace(tmp, os.path.join(root, "pkl", name + ".pkl"))
            lists[split].append(f"tfrecord/{name}.tfrecord")
            lists[split + "_pkl"].append(f"pkl/{name}.pkl")
    for key, list_name in [("train", "train.list"), ("validate", "val.list"),
                           ("train_pkl", "train_pkl.list"), ("validate_pkl", "val_pkl.list")]:
        with open(os.path.join(root, list_name), "w") as f:
            f.write("".join(p + "\n" for p in lists[key]))
    names = CLASS_NAMES[:num_classes] + [f"class_{i}" for i in range(len(CLASS_NAMES), num_classes)]
    names[num_classes - 1] = "FadeOut"
    with open(os.path.join(root, "label_names.txt"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    eig = (4.0 / (1.0 + np.arange(DIMS["rgb"]) / 64.0)).astype(np.float32)[:, None]
    np.save(os.path.join(root, "yt8m_pca", "eigenvals.npy"), eig)
    with open(done, "w") as f:
        json.dump(params, f)
    return root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="data/youtube8m_demo",
                        help="output folder (default: data/youtube8m_demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=800)
    parser.add_argument("--num-val", type=int, default=200)
    parser.add_argument("--num-classes", type=int, default=8)
    args = parser.parse_args(argv)
    make(args.root, seed=args.seed, num_train=args.num_train, num_val=args.num_val,
         num_classes=args.num_classes)
    print(f"YouTube-8M demo data in {args.root}")


if __name__ == "__main__":
    main()
