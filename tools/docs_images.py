"""Make the pictures of docs/images/ from demo runs: python tools/docs_images.py [--runs DIR] [--retrain]

- curves.png: the TSN demo's loss, lr and val top-1 against the step (tools/plot.py)
- confusion.png: the TSN demo's val confusion matrix (tools/eval.py --report)
- overlay.png: DeepLabV3 demo overlays of val images, with their legends (tools/infer.py)
- detection.png: Mask R-CNN demo pictures of val images, class names and scores at the boxes (tools/infer.py)

The demo data is generated (data/make_demo.py) and the three demo recipes trained into --runs
(default output/docs_images/<name>; a run with final/ is reused unless --retrain): ~10 minutes on 2
CPU cores. Each picture is downscaled until it is below --max-kb.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMOS = {"tsn": "configs/video/tsn/tsn_demo.yaml", "deeplabv3": "configs/vision/deeplabv3/deeplabv3_demo.yaml",
         "mask_rcnn": "configs/vision/mask_rcnn/mask_rcnn_demo.yaml"}
VOC_ROOT = "data/voc_demo/VOCdevkit/VOC2012"
COCO_VAL = "data/coco_demo/val"


def run(*cmd):
    print("+ " + " ".join(map(str, cmd)), flush=True)
    subprocess.run([sys.executable, *map(str, cmd)], cwd=ROOT, check=True, env=dict(os.environ, GLOG_minloglevel="2"))


def train(runs, retrain):
    run("data/make_demo.py", "kinetics", "segmentation", "coco")
    for name, cfg in DEMOS.items():
        out = os.path.join(runs, name)
        if retrain or not os.path.isfile(os.path.join(out, "final", "model.pdparams")):
            shutil.rmtree(out, ignore_errors=True)
            run("tools/train.py", "-c", cfg, "--output", out)


def voc_images(n):
    """The n demo val images showing the most shape classes (ties: file order): label PNGs read back."""
    root = os.path.join(ROOT, VOC_ROOT)
    stems = open(os.path.join(root, "ImageSets", "Segmentation", "val.txt")).read().split()
    count = {s: len(set(np.unique(np.asarray(Image.open(os.path.join(root, "SegmentationClass", s + ".png")))))
                    - {0, 255}) for s in stems}
    return [os.path.join(VOC_ROOT, "JPEGImages", s + ".jpg") for s in sorted(stems, key=lambda s: -count[s])[:n]]


def coco_images(n):
    """The n demo val images with the most objects (ties: file order)."""
    ann = json.load(open(os.path.join(ROOT, "data", "coco_demo", "annotations", "instances_val.json")))
    count = {}
    for a in ann["annotations"]:
        if not a.get("iscrowd"):
            count[a["image_id"]] = count.get(a["image_id"], 0) + 1
    images = sorted(ann["images"], key=lambda i: (-count.get(i["id"], 0), i["file_name"]))
    return [os.path.join(COCO_VAL, i["file_name"]) for i in images[:n]]


def montage(paths, gap=8):
    """The pictures side by side on white, top-aligned."""
    images = [cv2.imread(p) for p in paths]
    h = max(i.shape[0] for i in images)
    canvas = np.full((h, sum(i.shape[1] for i in images) + gap * (len(images) - 1), 3), 255, np.uint8)
    x = 0
    for i in images:
        canvas[:i.shape[0], x:x + i.shape[1]] = i
        x += i.shape[1] + gap
    return canvas


def save_small(image, path, max_kb, upscale=1):
    """Write `image` (BGR, or a PNG path) as a 256-colour PNG, scaled by the integer `upscale` (nearest:
    small demo pictures stay crisp), then shrunk by 0.8 until the file is below max_kb."""
    image = cv2.imread(image) if isinstance(image, str) else image
    scale = upscale
    while True:
        size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
        small = cv2.resize(image, size, interpolation=cv2.INTER_NEAREST if scale >= 1 else cv2.INTER_AREA)
        Image.fromarray(small[:, :, ::-1]).quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)
        kb = os.path.getsize(path) / 1024
        if kb <= max_kb or scale < 0.2:
            print(f"wrote {path} ({small.shape[1]}x{small.shape[0]}, {kb:.0f} KB)")
            return
        scale = (scale if scale <= 1 else 1) * 0.8


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="output/docs_images", help="where the demo runs are trained (reused)")
    p.add_argument("--out", default="docs/images", help="where the pictures go")
    p.add_argument("--retrain", action="store_true", help="train the demos again even where a run is finished")
    p.add_argument("--max-kb", type=float, default=150)
    args = p.parse_args()
    runs, out = (os.path.join(ROOT, d) if not os.path.isabs(d) else d for d in (args.runs, args.out))
    os.makedirs(out, exist_ok=True)
    train(runs, args.retrain)
    tsn, seg, det = (os.path.join(runs, n) for n in DEMOS)

    run("tools/plot.py", tsn, "--keys", "loss", "lr", "top1", "--output", os.path.join(tsn, "curves.png"))
    save_small(os.path.join(tsn, "curves.png"), os.path.join(out, "curves.png"), args.max_kb)

    run("tools/eval.py", "-c", DEMOS["tsn"], "--weights", os.path.join(tsn, "final"), "--split", "val", "--report",
        "--output", os.path.join(tsn, "eval"))
    save_small(os.path.join(tsn, "eval", "confusion.png"), os.path.join(out, "confusion.png"), args.max_kb)

    images = voc_images(3)
    run("tools/infer.py", "-c", DEMOS["deeplabv3"], "--weights", os.path.join(seg, "final"), "--input", *images,
        "--output", os.path.join(seg, "infer"))
    overlays = [os.path.join(seg, "infer", os.path.splitext(os.path.basename(i))[0] + "_overlay.png") for i in images]
    save_small(montage(overlays), os.path.join(out, "overlay.png"), args.max_kb, upscale=2)

    images = coco_images(3)
    run("tools/infer.py", "-c", DEMOS["mask_rcnn"], "--weights", os.path.join(det, "final"), "--input", *images,
        "--output", os.path.join(det, "infer"))
    drawn = [os.path.join(det, "infer", os.path.splitext(os.path.basename(i))[0] + "_det.png") for i in images]
    save_small(montage(drawn), os.path.join(out, "detection.png"), args.max_kb, upscale=2)


if __name__ == "__main__":
    main()
