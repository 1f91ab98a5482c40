"""A small COCO-format instance segmentation demo: coloured shapes on textured backgrounds.

Four classes with non-contiguous category ids (as COCO's): disc (id 1), square (id 3, rotated),
triangle (id 7) and star (id 12), each with its own hue range (jittered) on a noisy gradient
background. Images are 160x128, 128x160 or 144x144 (both orientations, for aspect-ratio
grouping), with 0 to 4 objects of 30-72 px that may overlap: objects are painted in order and an
instance's mask is what stays visible. An instance that is fully visible is stored as a COCO
polygon; one partly hidden by a later object is stored as an uncompressed RLE of its visible part
(so both formats occur). About 10% of the images have no object; about 10% also hold a crowd
region (a cluster of small discs annotated as one `iscrowd: 1` RLE, which COCOeval ignores).
Boxes and areas are those of the visible masks, as in COCO.

A third split, `bench` (8 images of 480x800 with larger objects, 800x1333 after the full recipe's
resize), feeds tools/benchmark.py.

Layout: `<root>/coco_demo/{train,val,bench}/*.png`, `annotations/instances_{train,val,bench}.json`,
`label_names.txt`, and a `DONE` marker holding the parameters (a second `make` with the same
parameters does nothing).

    python data/demo_coco.py --root data
"""
import argparse
import json
import os
import shutil
import time

import cv2
import numpy as np
from pycocotools import mask as mask_util

SIZES = [(128, 160), (160, 128), (144, 144)]          # (h, w)
CLASSES = [("disc", 1, 0), ("square", 3, 60), ("triangle", 7, 110), ("star", 12, 25)]  # name, id, hue
FOLDER = "coco_demo"


def shape_polygon(kind, cx, cy, r, angle):
    """[K, 2] polygon of a shape centred on (cx, cy) with circumradius r (pixel-corner coordinates)."""
    if kind == "disc":
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        rad = np.full_like(t, r)
    elif kind == "square":
        t = angle + np.arange(4) * np.pi / 2
        rad = np.full(4, r)
    elif kind == "triangle":
        t = angle + np.arange(3) * 2 * np.pi / 3
        rad = np.full(3, r)
    else:   # five-pointed star
        t = angle + np.arange(10) * np.pi / 5
        rad = np.where(np.arange(10) % 2 == 0, r, 0.45 * r)
    return np.stack([cx + rad * np.cos(t), cy + rad * np.sin(t)], 1)


def rasterize(polygon, h, w):
    rle = mask_util.frPyObjects([np.asarray(polygon, np.float64).reshape(-1).tolist()], h, w)
    return mask_util.decode(mask_util.merge(rle)).astype(bool)


def rle_counts(mask):
    """COCO uncompressed RLE (column-major runs, starting with zeros)."""
    flat = np.asarray(mask, bool).ravel(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    counts = np.diff(np.concatenate([[0], change, [flat.size]])).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def colour(rng, hue):
    hsv = np.uint8([[[int((hue + rng.integers(-8, 9)) % 180), rng.integers(150, 256), rng.integers(150, 256)]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)


def background(rng, h, w):
    base = rng.uniform(40, 140, 3)
    gy, gx = np.mgrid[0:h, 0:w] / max(h, w)
    grad = (gy[..., None] * rng.uniform(-40, 40, 3) + gx[..., None] * rng.uniform(-40, 40, 3))
    img = base + grad + rng.normal(0, 12, (h, w, 3))
    return img


def bbox_of(mask):
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())]


def make_image(rng, sizes=SIZES, scale=1.0):
    """(RGB uint8 image, [annotation dicts without ids]); `scale` multiplies the object sizes."""
    h, w = sizes[rng.integers(len(sizes))]
    img = background(rng, h, w)
    painted = []                                         # (class index, full mask, polygon)
    n = 0 if rng.random() < 0.1 else int(rng.integers(1, 5))
    crowd = np.zeros((h, w), bool)
    if n and rng.random() < 0.1:                       # a crowd: a cluster of small discs, one RLE
        cx, cy = rng.uniform(20, w - 20) * 1.0, rng.uniform(20, h - 20) * 1.0
        for _ in range(6):
            x, y = cx + rng.uniform(-14, 14) * scale, cy + rng.uniform(-14, 14) * scale
            disc = rasterize(shape_polygon("disc", x, y, rng.uniform(4, 7) * scale, 0.0), h, w)
            img[disc] = colour(rng, CLASSES[0][2])
            crowd |= disc
    for _ in range(n):
        c = int(rng.integers(len(CLASSES)))
        r = rng.uniform(15, 36) * scale
        cx, cy = rng.uniform(r * 0.6, w - r * 0.6), rng.uniform(r * 0.6, h - r * 0.6)
        poly = shape_polygon(CLASSES[c][0], cx, cy, r, rng.uniform(0, 2 * np.pi))
        poly[:, 0] = np.clip(poly[:, 0], 0, w)
        poly[:, 1] = np.clip(poly[:, 1], 0, h)
        mask = rasterize(poly, h, w)
        if mask.sum() < 50:
            continue
        img[mask] = colour(rng, CLASSES[c][2]) + rng.normal(0, 6, (int(mask.sum()), 3))
        painted.append((c, mask, poly))
    anns = []
    for i, (c, mask, poly) in enumerate(painted):
        visible = mask.copy()
        for _, later, _ in painted[i + 1:]:
            visible &= ~later
        if visible.sum() < 0.35 * mask.sum() or visible.sum() < 40:
            continue                                   # mostly hidden: not annotated (as in COCO)
        if visible.sum() == mask.sum():
            seg = [np.round(poly.reshape(-1), 2).tolist()]
        else:
            seg = rle_counts(visible)
        anns.append({"category_id": CLASSES[c][1], "segmentation": seg, "area": float(visible.sum()),
                     "bbox": bbox_of(visible), "iscrowd": 0})
    for _, m, _ in painted:                            # objects are painted over the crowd
        crowd &= ~m
    if crowd.sum() >= 20:
        anns.append({"category_id": CLASSES[0][1], "segmentation": rle_counts(crowd),
                     "area": float(crowd.sum()), "bbox": bbox_of(crowd), "iscrowd": 1})
    return np.clip(img, 0, 255).astype(np.uint8), anns


def write_split(root, split, num, rng, first_image_id, sizes=SIZES, scale=1.0):
    os.makedirs(os.path.join(root, split))
    images, annotations = [], []
    for k in range(num):
        image_id = first_image_id + k
        img, anns = make_image(rng, sizes, scale)
        name = f"{split}_{k:04d}.png"
        cv2.imwrite(os.path.join(root, split, name), img[:, :, ::-1])
        images.append({"id": image_id, "file_name": name, "height": img.shape[0], "width": img.shape[1]})
        for a in anns:
            annotations.append(dict(a, id=len(annotations) + 1 + first_image_id * 10, image_id=image_id))
    cats = [{"id": cid, "name": name, "supercategory": "shape"} for name, cid, _ in CLASSES]
    with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": cats}, f)


def make(root, seed=0, num_train=240, num_val=60, num_bench=8):
    """Write the demo under `root/coco_demo`; returns the folder. Idempotent per parameters."""
    params = {"seed": seed, "num_train": num_train, "num_val": num_val, "num_bench": num_bench, "version": 2}
    folder = os.path.join(root, FOLDER)
    done = os.path.join(folder, "DONE")
    if os.path.isfile(done):
        with open(done) as f:
            if json.load(f) == params:
                return folder
    tmp = folder + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "annotations"))
    rng = np.random.default_rng(seed)
    write_split(tmp, "train", num_train, rng, 1)
    write_split(tmp, "val", num_val, rng, 10001)
    # 480x800 images (800x1333 after the full recipe's resize) for tools/benchmark.py
    write_split(tmp, "bench", num_bench, rng, 20001, sizes=[(480, 800)], scale=4.0)
    with open(os.path.join(tmp, "label_names.txt"), "w") as f:
        f.writelines(name + "\n" for name, _, _ in CLASSES)
    with open(os.path.join(tmp, "DONE"), "w") as f:
        json.dump(params, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-train", type=int, default=240)
    ap.add_argument("--num-val", type=int, default=60)
    args = ap.parse_args(argv)
    t0 = time.time()
    print(make(args.root, args.seed, args.num_train, args.num_val), f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
