"""Two small Kinetics-format demo datasets of real video files (mp4v .mp4 and MJPG .avi).

`kinetics_appearance` (for TSN): the class is the colour of an object (red, yellow, green, blue,
magenta) whose shape, size, position and background are random. Each frame alone is unreliable:
in 30% of the frames the object is hidden behind a gray noise patch, in 30% half of it is, and
every frame is noisy. An ideal single-frame classifier reaches 0.7 + 0.3/5 = 0.76, one that
averages three segments 1 - 0.3^3 * 0.8 = 0.98. Version 2: in version 1 the object was hidden in
45% of the frames (ideal 0.64 / 0.93), and the TSN demo's top-1 went from 0.70 to 0.90 with the
seed (now 0.93-1.00 over seeds 0-2).

`kinetics_motion` (for StNet): the class is how a sprite moves: static, up, down, horizontal
(left or right) or rotating (either way). Sprite, colour, orientation and the position on a
wrap-around canvas are drawn from the same distribution for every class, so each single frame has
the same distribution whatever the class: per-frame accuracy cannot beat chance (0.2). A few
consecutive frames (StNet's super-image) show the motion. The classes are closed under a
horizontal flip, so `RandomFlip` is a valid augmentation. The sprite is dark or light on a
flattened background, so it differs from it in luminance and not only in colour (version 2; in
version 1 a fifth of the sprites were nearly isoluminant with their background, and the StNet
demo got about half of those wrong).

Layout of each dataset: `videos/<split>/<class>/<split>_<n>.{mp4,avi}`, `train.list` and
`val.list` ("relpath label"), `label_names.txt`, and a `DONE` marker holding the parameters
(a second `make` with the same parameters does nothing).

    python data/demo_kinetics.py --root data/demo
"""
import argparse
import json
import os
import shutil
import time

import cv2
import numpy as np

W, H, FPS = 80, 64, 25
APPEARANCE_CLASSES = ["red", "yellow", "green", "blue", "magenta"]
APPEARANCE_HUES = [0, 30, 60, 118, 150]  # OpenCV hue (0-180)
SHAPES = ["disc", "square", "triangle", "cross", "ring"]
HIDDEN, HALF_HIDDEN = 0.3, 0.3  # per-frame occlusion probabilities in the appearance demo
MOTION_CLASSES = ["static", "up", "down", "horizontal", "rotate"]
DEMOS = {"appearance": "kinetics_appearance", "motion": "kinetics_motion"}
VERSIONS = {"appearance": 2, "motion": 2}  # bumped when a demo's videos change: the old ones are rewritten


def _background(rng):
    """A smooth, low-contrast, nearly gray field: objects stand out, its blobs do not look like them."""
    gray = rng.uniform(70, 180, size=(3, 4, 1))
    tint = rng.uniform(-15, 15, size=(3, 4, 3))
    coarse = np.clip(gray + tint, 0, 255).astype(np.float32)
    return cv2.resize(coarse, (W, H), interpolation=cv2.INTER_CUBIC)


def _colour(rng, hue=None):
    """A saturated RGB colour; hue in OpenCV units (0-180), random when None."""
    hue = rng.integers(0, 180) if hue is None else hue
    hsv = np.uint8([[[hue % 180, rng.integers(170, 256), rng.integers(150, 256)]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)


def _shape_mask(kind, cx, cy, r, angle=0.0):
    """uint8 mask (H, W) of a shape of radius ~r centred at (cx, cy), rotated by `angle` degrees."""
    mask = np.zeros((H, W), np.uint8)
    c = (int(round(cx)), int(round(cy)))
    if kind == "disc":
        cv2.circle(mask, c, r, 255, -1, cv2.LINE_AA)
    elif kind == "ring":
        cv2.circle(mask, c, r, 255, max(3, r // 3), cv2.LINE_AA)
    else:
        if kind == "square":
            pts = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
            s = 0.8
        elif kind == "triangle":
            pts = [(0, -1.1), (1, 0.8), (-1, 0.8)]
            s = 1.0
        elif kind == "cross":
            t = 0.33
            pts = [(-t, -1), (t, -1), (t, -t), (1, -t), (1, t), (t, t), (t, 1), (-t, 1),
                   (-t, t), (-1, t), (-1, -t), (-t, -t)]
            s = 1.0
        elif kind == "bar":
            pts = [(-1, -0.3), (1, -0.3), (1, 0.3), (-1, 0.3)]
            s = 1.0
        elif kind == "ell":
            pts = [(-1, -1), (-0.4, -1), (-0.4, 0.5), (0.8, 0.5), (0.8, 1), (-1, 1)]
            s = 0.9
        elif kind == "tee":
            pts = [(-1, -1), (1, -1), (1, -0.45), (0.25, -0.45), (0.25, 1), (-0.25, 1),
                   (-0.25, -0.45), (-1, -0.45)]
            s = 0.9
        else:
            raise ValueError(kind)
        a = np.deg2rad(angle)
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        p = (np.array(pts, np.float64) * r * s) @ rot.T + (cx, cy)
        cv2.fillPoly(mask, [np.round(p * 16).astype(np.int32)], 255, cv2.LINE_AA, shift=4)
    return mask.astype(np.float32) / 255.0


def _finish(img, rng, sigma):
    img = img + rng.normal(0, sigma, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def appearance_video(label, rng, num_frames=16):
    """Frames [T, H, W, 3] uint8 RGB of one appearance-demo video."""
    hue = APPEARANCE_HUES[label] + int(rng.integers(-6, 7))
    col = _colour(rng, hue)
    bg = _background(rng)
    kind = str(rng.choice(SHAPES))
    r = int(rng.integers(10, 15))
    cx, cy = rng.uniform(r + 4, W - r - 4), rng.uniform(r + 4, H - r - 4)
    frames = []
    for _ in range(num_frames):
        cx = float(np.clip(cx + rng.normal(0, 1.0), r + 2, W - r - 2))
        cy = float(np.clip(cy + rng.normal(0, 1.0), r + 2, H - r - 2))
        m = _shape_mask(kind, cx, cy, r)[..., None]
        img = bg * (1 - m) + col * m
        x0, x1, y0, y1 = int(cx - r - 3), int(cx + r + 4), int(cy - r - 3), int(cy + r + 4)
        u = rng.random()
        if u < HIDDEN:  # the object is hidden in this frame
            pass
        elif u < HIDDEN + HALF_HIDDEN:  # half of it is
            side = rng.integers(4)
            if side == 0:
                x1 = int(cx)
            elif side == 1:
                x0 = int(cx)
            elif side == 2:
                y1 = int(cy)
            else:
                y0 = int(cy)
        else:
            x1 = x0
        x0, y0 = max(x0, 0), max(y0, 0)
        if x1 > x0 and y1 > y0:  # a gray noise patch in front
            shape = img[y0:y1, x0:x1].shape
            img[y0:y1, x0:x1] = rng.uniform(60, 200) + rng.normal(0, 30, size=shape[:2] + (1,))
        frames.append(_finish(img, rng, 12.0))
    return np.stack(frames)


def motion_video(label, rng, num_frames=24):
    """Frames of one motion-demo video: the sprite moves on a torus, so its position in any one
    frame is uniform whatever the class."""
    kind = MOTION_CLASSES[label]
    # a flattened background and a dark or light sprite: the sprite's edges show in luminance, not
    # only in colour, which the codecs' 4:2:0 chroma blurs (colour-only sprites were the ones the
    # StNet demo missed most)
    bg, col = 128 + (_background(rng) - 128) * 0.4, _colour(rng)
    if rng.random() < 0.5:  # dark and light sprites alike, so brightness says nothing
        col = col * 0.3
    else:
        col = 255 - (255 - col) * 0.3
    sprite = str(rng.choice(["bar", "triangle", "ell", "tee"]))
    r = int(rng.integers(10, 15))
    angle = rng.uniform(0, 360)
    x0, y0 = int(rng.integers(W)), int(rng.integers(H))
    speed = int(rng.integers(3, 6))
    sign = 1 if rng.random() < 0.5 else -1
    vx, vy, spin = {"static": (0, 0, 0), "up": (0, -speed, 0), "down": (0, speed, 0),
                    "horizontal": (sign * speed, 0, 0),
                    "rotate": (0, 0, sign * rng.uniform(15, 25))}[kind]
    frames = []
    for t in range(num_frames):
        m = _shape_mask(sprite, W / 2, H / 2, r, angle + spin * t)
        m = np.roll(m, (y0 + vy * t - H // 2, x0 + vx * t - W // 2), axis=(0, 1))[..., None]
        frames.append(_finish(bg * (1 - m) + col * m, rng, 8.0))
    return np.stack(frames)


def write_video(path, frames, fourcc):
    """frames: [T, H, W, 3] uint8 RGB."""
    h, w = frames.shape[1:3]
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*fourcc), FPS, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"cv2 cannot write {fourcc} video {path}")
    for f in frames:
        writer.write(np.ascontiguousarray(f[:, :, ::-1]))
    writer.release()


def _make_one(out, demo, seed, num_train, num_val, avi_fraction):
    classes, render = ((APPEARANCE_CLASSES, appearance_video) if demo == "appearance"
                       else (MOTION_CLASSES, motion_video))
    for split, n, split_id in (("train", num_train, 0), ("val", num_val, 1)):
        lines = []
        for i in range(n):
            label = i % len(classes)
            rng = np.random.default_rng([seed, 0 if demo == "appearance" else 1, split_id, i])
            frames = render(label, rng)
            # the container is drawn independently of the class, so it carries no signal
            ext, fourcc = (".avi", "MJPG") if rng.random() < avi_fraction else (".mp4", "mp4v")
            rel = os.path.join("videos", split, classes[label], f"{split}_{i:04d}{ext}")
            os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
            write_video(os.path.join(out, rel), frames, fourcc)
            lines.append(f"{rel} {label}\n")
        with open(os.path.join(out, f"{split}.list"), "w") as f:
            f.writelines(lines)
    with open(os.path.join(out, "label_names.txt"), "w") as f:
        f.writelines(c + "\n" for c in classes)


def make(root, seed=0, num_train=200, num_val=60, avi_fraction=0.2, demos=("appearance", "motion")):
    """Write the demo datasets under `root`; returns {demo: folder}. Idempotent per parameters."""
    out = {}
    for demo in demos:
        params = {"seed": seed, "num_train": num_train, "num_val": num_val,
                  "avi_fraction": avi_fraction, "size": [H, W], "version": VERSIONS[demo]}
        folder = os.path.join(root, DEMOS[demo])
        done = os.path.join(folder, "DONE")
        out[demo] = folder
        if os.path.isfile(done):
            with open(done) as f:
                if json.load(f) == params:
                    continue
        tmp = folder + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        _make_one(tmp, demo, seed, num_train, num_val, avi_fraction)
        with open(os.path.join(tmp, "DONE"), "w") as f:
            json.dump(params, f)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="data/demo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-train", type=int, default=200)
    ap.add_argument("--num-val", type=int, default=60)
    ap.add_argument("--demos", nargs="+", default=list(DEMOS), choices=list(DEMOS))
    args = ap.parse_args(argv)
    t0 = time.time()
    out = make(args.root, args.seed, args.num_train, args.num_val, demos=tuple(args.demos))
    for demo, folder in out.items():
        print(f"{demo}: {folder}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
