"""COCO instance annotations (JSON, read through pycocotools) for detection and instance segmentation.

    reader: {name: COCO, ann_file: annotations/instances_val2017.json, image_dir: val2017}

Indexing reads the JSON once. Category ids need not be contiguous (COCO's run 1..90 with gaps):
class index i is the i-th category by id, and `cat_ids[i]` maps it back for results. Annotations
that cannot be trained on are dropped and counted in one warning line: a degenerate box (width or
height <= 0), or a non-crowd instance whose segmentation has no polygon of at least 3 points (an
"empty polygon"); evaluation (`coco`, which the COCO metric reads) leaves them out too. A non-crowd RLE mask is turned into polygons (its outer contours, through the
pixel centres of the boundary pixels; see `rle_to_polygons`). Crowd regions are kept with
`gt_crowd` = 1 so that the model can keep them out of its targets, or left out with
`load_crowd: false` (PaddleDetection's COCODataSet default, which its COCO training recipes use);
COCOeval reads them from the JSON itself. An image listed in the JSON but missing on disk, or that cannot be decoded, is one
unreadable sample (SampleError naming the file; skipped and counted with `skip_bad`).

Sample: `image` uint8 [H, W, 3] RGB, `gt_boxes` float32 [N, 4] (x1, y1, x2, y2), `gt_classes`
int64 [N], `gt_crowd` int32 [N], `gt_polygons` (per instance a list of float32 [K, 2] parts),
`image_id` int64, `orig_size` int64 [2] (h, w), `scale_factor` float32 [2] (sy, sx; 1 until a
resize), all declared for the geometric transforms; after the transforms, the polygons packed into
arrays for the model's device: `gt_poly_points` float32 [N, V, 2], `gt_poly_counts` int32 [N, P]
(`pack_polygons`; list them in the collate's ragged keys).
"""
import contextlib
import io
import json
import logging
import os

import cv2
import numpy as np
from pycocotools import mask as mask_util
from pycocotools.coco import COCO

from engine.errors import ConfigError, SampleError
from engine.data import SampleDataset
from engine.registry import DATASETS
from readers.decoding import read_image
from readers.fields import declare

log = logging.getLogger("zoo")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def load_coco(ann_file):
    """pycocotools' COCO object for `ann_file`, or one ConfigError line naming what is wrong."""
    if not os.path.isfile(ann_file):
        raise ConfigError(f"COCO annotation file not found: {ann_file}")
    try:
        with open(ann_file, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{ann_file}: not a valid JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ConfigError(f"{ann_file}: not a COCO annotation file (no 'images' list)")
    if not isinstance(data.get("categories"), list) or not data["categories"]:
        raise ConfigError(f"{ann_file}: no 'categories' list")
    image_ids = set()
    for i, im in enumerate(data["images"]):
        for key in ("id", "file_name", "width", "height"):
            if key not in im:
                raise ConfigError(f"{ann_file}: images[{i}] has no '{key}'")
        image_ids.add(im["id"])
    cat_ids = {c.get("id") for c in data["categories"]}
    for i, ann in enumerate(data.get("annotations", [])):
        for key in ("id", "image_id", "category_id", "bbox"):
            if key not in ann:
                raise ConfigError(f"{ann_file}: annotations[{i}] has no '{key}'")
        if ann["category_id"] not in cat_ids:
            raise ConfigError(f"{ann_file}: annotation {ann['id']} has category_id {ann['category_id']}, "
                              f"which is not in 'categories' (ids {sorted(cat_ids)})")
        if ann["image_id"] not in image_ids:
            raise ConfigError(f"{ann_file}: annotation {ann['id']} refers to image_id {ann['image_id']}, "
                              f"which is not in 'images'")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):   # it prints "creating index..."
        coco.createIndex()
    return coco


def rle_to_polygons(rle, height, width):
    """Outer contours of an RLE mask as polygons [K, 2] through the centres of its boundary pixels.

    Rasterised again, such a polygon loses about half of each boundary pixel: a small shrink that
    only matters for the mask targets of the (rare) non-crowd RLE instances.
    """
    if isinstance(rle.get("counts"), list):
        rle = mask_util.frPyObjects(rle, height, width)
    m = mask_util.decode(rle).astype(np.uint8)
    contours, _ = cv2.findContours(m, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    return [c.reshape(-1, 2).astype(np.float32) + 0.5 for c in contours if len(c) >= 3]


def clean_polygons(segmentation):
    """The usable parts of a COCO polygon list: float32 [K, 2] with K >= 3."""
    parts = []
    for p in segmentation:
        p = np.asarray(p, np.float32).reshape(-1)
        if len(p) >= 6 and len(p) % 2 == 0 and np.isfinite(p).all():
            parts.append(p.reshape(-1, 2))
    return parts


def pack_polygons(instances):
    """One image's polygons (per instance a list of [K, 2] parts) as two arrays, which the collate
    keeps ragged and the model reads on its device (Mask R-CNN's targets): points float32 [N, V, 2],
    each instance's parts' vertices one after the other, zero padded; counts int32 [N, P], the
    vertices of each part, 0 padded. Parts of fewer than 3 vertices are left out: pycocotools
    cannot draw them (models/vision/mask_rcnn/roi_heads.py polygons_to_mask skips them too)."""
    kept = [[np.asarray(p, np.float32).reshape(-1, 2) for p in parts if len(p) >= 3] for parts in instances]
    v = max([sum(len(p) for p in parts) for parts in kept] + [1])
    k = max([len(parts) for parts in kept] + [1])
    points = np.zeros((len(kept), v, 2), np.float32)
    counts = np.zeros((len(kept), k), np.int32)
    for i, parts in enumerate(kept):
        if parts:
            flat = np.concatenate(parts)
            points[i, :len(flat)] = flat
            counts[i, :len(parts)] = [len(p) for p in parts]
    return points, counts


@DATASETS.register("COCO")
class COCODataset(SampleDataset):
    """COCO JSON + image folder (see the module docstring).

    Args:
        ann_file: the COCO annotation file (instances_*.json: images, categories, instances); required.
        image_dir: folder of the images (file_name is relative to it; default: the JSON's folder).
        skip_empty: drop images with no usable non-crowd instance (PaddleDetection's training
            default); otherwise they are kept as negatives (and always kept for evaluation).
        with_gt: put the annotations in the samples (False: images only).
        load_crowd: keep the crowd regions (gt_crowd 1); False leaves them out of the samples, as
            PaddleDetection's COCODataSet(load_crowd=False) does (ppdet/data/source/coco.py@666f597f
            lines 62 and 144: `getAnnIds(..., iscrowd=None if self.load_crowd else False)`).
    """

    SOURCE_KEYS = ("ann_file", "image_dir")
    def __init__(self, ann_file: str = None, image_dir: str = None, skip_empty: bool = False,
                 with_gt: bool = True, transforms: list = None, seed: int = 0, skip_bad: bool = False,
                 load_crowd: bool = True):
        super().__init__(transforms=transforms, seed=seed, skip_bad=skip_bad)
        self.load_crowd = load_crowd
        if not ann_file:
            raise ConfigError("COCO: ann_file is required (instances_*.json)")
        self.ann_file, self.with_gt = ann_file, with_gt
        self.image_dir = image_dir if image_dir is not None else os.path.dirname(ann_file)
        self.coco = load_coco(ann_file)
        cats = sorted(self.coco.dataset["categories"], key=lambda c: c["id"])
        self.cat_ids = [c["id"] for c in cats]
        self.label_names = [str(c.get("name", c["id"])) for c in cats]
        self.num_classes = len(cats)
        self.dropped = {"degenerate box": 0, "empty polygon": 0}
        self.items, dropped_ids = [], set()
        for image_id in sorted(self.coco.imgs):
            info = self.coco.imgs[image_id]
            anns = self._clean(self.coco.imgToAnns.get(image_id, []), info, dropped_ids)
            if skip_empty and not any(not a["iscrowd"] for a in anns):
                continue
            self.items.append((image_id, info, anns))
        lost = {k: v for k, v in self.dropped.items() if v}
        if lost:
            log.warning("%s: dropped %s", ann_file, ", ".join(f"{v} annotation{'s' * (v > 1)} with a {k}"
                                                           for k, v in lost.items()))
            # evaluation uses the same annotations (COCOeval cannot rasterise an empty polygon)
            self.coco.dataset["annotations"] = [a for a in self.coco.dataset["annotations"]
                                                if a["id"] not in dropped_ids]
            with contextlib.redirect_stdout(io.StringIO()):
                self.coco.createIndex()

    def _clean(self, anns, info, dropped_ids):
        to_class = {c: i for i, c in enumerate(self.cat_ids)}
        out = []
        for a in anns:
            try:
                x, y, w, h = (float(v) for v in a["bbox"])
            except (TypeError, ValueError):
                x = y = w = h = float("nan")
            if not (w > 1e-5 and h > 1e-5 and np.isfinite([x, y, w, h]).all()):
                self.dropped["degenerate box"] += 1
                dropped_ids.add(a["id"])
                continue
            crowd = int(bool(a.get("iscrowd", 0)))
            if crowd and not self.load_crowd:
                continue
            seg = a.get("segmentation")
            if crowd:
                polygons = []
            elif isinstance(seg, dict) and "counts" in seg:
                polygons = rle_to_polygons(seg, int(info["height"]), int(info["width"]))
            elif isinstance(seg, list):
                polygons = clean_polygons(seg)
            else:
                polygons = []
            if not crowd and not polygons:
                self.dropped["empty polygon"] += 1
                dropped_ids.add(a["id"])
                continue
            out.append({"box": [x, y, x + w, y + h], "class": to_class[a["category_id"]], "iscrowd": crowd,
                        "polygons": polygons})
        return out

    def __len__(self):
        return len(self.items)

    def describe(self, index):
        return self.image_path(index)

    def image_path(self, index):
        return os.path.join(self.image_dir, self.items[index][1]["file_name"])

    def image_ids(self):
        return [it[0] for it in self.items]

    def aspect_ratios(self):
        return np.array([float(it[1]["width"]) / float(it[1]["height"]) for it in self.items])

    def __getitem__(self, index):
        """The sample after its transforms, plus its polygons packed for the model's device
        (`gt_poly_points`, `gt_poly_counts`: see pack_polygons); `gt_polygons` stays as it is."""
        sample = super().__getitem__(index)
        if isinstance(sample, dict) and "gt_polygons" in sample:
            sample["gt_poly_points"], sample["gt_poly_counts"] = pack_polygons(sample["gt_polygons"])
        return sample

    def load(self, index):
        image_id, info, anns = self.items[index]
        path = self.image_path(index)
        img = read_image(path, f" (image id {image_id} of {self.ann_file})")
        h, w = img.shape[:2]
        if self.ann_file and (h, w) != (int(info["height"]), int(info["width"])):
            raise SampleError(f"{path}: the image is {w}x{h} but {self.ann_file} says "
                              f"{info['width']}x{info['height']} (image id {image_id})")
        sample = {"image": img, "image_id": np.int64(image_id), "orig_size": np.array([h, w], np.int64),
                  "scale_factor": np.ones(2, np.float32)}
        declare(sample, image="image")
        if not self.with_gt:
            return sample
        sample["gt_boxes"] = np.array([a["box"] for a in anns], np.float32).reshape(-1, 4)
        sample["gt_classes"] = np.array([a["class"] for a in anns], np.int64)
        sample["gt_crowd"] = np.array([a["iscrowd"] for a in anns], np.int32)
        sample["gt_polygons"] = [list(a["polygons"]) for a in anns]
        return declare(sample, gt_boxes="boxes", gt_polygons="polygons", gt_classes="instances",
                       gt_crowd="instances")

    @classmethod
    def for_inputs(cls, inputs, ann_file=None, transforms=None, seed=0, skip_bad=False, **_):
        """Images (files, or folders searched recursively) without annotations; class names come
        from the recipe's `ann_file` when it exists."""
        ds = cls.__new__(cls)
        SampleDataset.__init__(ds, transforms=transforms, seed=seed, skip_bad=skip_bad)
        ds.ann_file, ds.with_gt, ds.image_dir = None, False, ""
        ds.cat_ids, ds.label_names, ds.num_classes = None, None, None
        if ann_file and os.path.isfile(ann_file):
            cats = sorted(load_coco(ann_file).dataset["categories"], key=lambda c: c["id"])
            ds.cat_ids = [c["id"] for c in cats]
            ds.label_names = [str(c.get("name", c["id"])) for c in cats]
            ds.num_classes = len(cats)
        files = []
        for item in inputs:
            if os.path.isdir(item):
                for root, _, names in sorted(os.walk(item)):
                    files += [os.path.join(root, n) for n in sorted(names) if n.lower().endswith(IMAGE_EXTENSIONS)]
            elif os.path.isfile(item):
                files.append(item)
            else:
                raise ConfigError(f"input not found: {item}")
        if not files:
            raise ConfigError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {', '.join(map(str, inputs))}")
        ds.items = [(i, {"file_name": os.path.abspath(f)}, []) for i, f in enumerate(files)]
        return ds
