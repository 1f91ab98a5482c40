"""Object detection and instance segmentation: the inference output (JSON + drawn images).

`Detections` takes, per image, preds['boxes'] float [N, 4] (x1, y1, x2, y2 in the original image's
pixels), preds['scores'] [N], preds['labels'] int [N] (class ids) and optionally preds['masks']
[N, H, W] (binary, image size): ragged lists with one array per image, or arrays [B, N, ...] when
every image has N. It writes `detections.json` in the COCO results layout (`bbox` as x, y, w, h;
`segmentation` as uncompressed RLE), with the image's id and file, and `<name>_det.png`: the image
with the detections above `draw_threshold` drawn (boxes, masks tinted, the class name and score in a
box of the class colour at each box's corner). With a COCO reader (`cat_ids`), `category_id` is the
dataset's category id and `label` its name.
"""
import json
import os

import cv2
import numpy as np

from engine.errors import ConfigError, SampleError
from engine.registry import OUTPUTS
from outputs.base import OutputWriter, file_stem
from outputs.palettes import voc_palette
from readers.decoding import read_image


def rle_encode(mask):
    """COCO's uncompressed RLE of a binary [H, W] mask: run lengths in column-major (Fortran) order,
    starting with a run of zeros."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    change = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(c) for c in counts]}


def tag(img, text, x, y, colour):
    """`text` in a filled box of `colour` (BGR) at the box corner (x, y): above the box where there is
    room, else just inside it, moved left where it would leave the picture; black or white text,
    whichever reads better on the colour."""
    k = max(1, round(max(img.shape[:2]) / 640))
    font, scale, thick = cv2.FONT_HERSHEY_SIMPLEX, 0.4 * k, k
    (tw, th), base = cv2.getTextSize(text, font, scale, thick)
    h, w = th + base + 2 * k, tw + 4 * k
    top = y - h if y - h >= 0 else y
    x = max(0, min(x, img.shape[1] - w))   # inside the picture
    cv2.rectangle(img, (x, top), (x + w, top + h), colour, -1)
    ink = (0, 0, 0) if 0.114 * colour[0] + 0.587 * colour[1] + 0.299 * colour[2] > 140 else (255, 255, 255)
    cv2.putText(img, text, (x + 2 * k, top + h - base - k), font, scale, ink, thick, cv2.LINE_AA)


@OUTPUTS.register("Detections")
class Detections(OutputWriter):
    """detections.json + drawn images (see the module docstring).

    Args:
        draw_threshold: the least score of a detection drawn on the image, in [0, 1]; detections.json
            holds them all.
    """

    def __init__(self, draw_threshold: float = 0.5):
        if not 0.0 <= draw_threshold <= 1.0:
            raise ConfigError(f"infer Detections: draw_threshold must be in [0, 1], got {draw_threshold}")
        self.draw_threshold = draw_threshold
        self.colours = voc_palette()[1:]

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.results, self.paths = [], []

    def write(self, preds, meta):
        for key in ("boxes", "scores", "labels"):
            if key not in preds:
                raise ConfigError(f"infer Detections: predictions lack '{key}' (keys: {sorted(preds)})")
        lines = []
        for i in range(len(meta["id"])):
            first = len(self.results)
            boxes = np.asarray(preds["boxes"][i], np.float32).reshape(-1, 4)
            scores = np.asarray(preds["scores"][i], np.float32).reshape(-1)
            labels = np.asarray(preds["labels"][i]).astype(np.int64).reshape(-1)
            masks = np.asarray(preds["masks"][i]) if "masks" in preds else None
            if not len(boxes) == len(scores) == len(labels) or (masks is not None and len(masks) != len(boxes)):
                raise ConfigError(f"infer Detections: image {meta['id'][i]} has {len(boxes)} boxes, "
                                  f"{len(scores)} scores, {len(labels)} labels"
                                  + (f", {len(masks)} masks" if masks is not None else ""))
            image_id = meta["image_id"][i] if "image_id" in meta else meta["id"][i]
            image_id = image_id.item() if isinstance(image_id, np.generic) else image_id  # JSON
            for j in range(len(boxes)):
                x1, y1, x2, y2 = (float(v) for v in boxes[j])
                cat_ids = getattr(self.dataset, "cat_ids", None)
                category = int(cat_ids[labels[j]]) if cat_ids else int(labels[j])
                det = {"image_id": image_id, "file": str(meta["id"][i]), "category_id": category,
                       "label": self.label(int(labels[j])), "bbox": [x1, y1, x2 - x1, y2 - y1],
                       "score": float(scores[j])}
                if masks is not None:
                    det["segmentation"] = rle_encode(masks[j] > 0)
                self.results.append(det)
            keep = scores >= self.draw_threshold
            drawn = self._draw(meta, i, boxes[keep], scores[keep], labels[keep],
                               None if masks is None else masks[keep])
            self.answers.append({"id": str(meta["id"][i]), "detections": self.results[first:],
                                 "files": {"drawn": drawn} if drawn else {}})
            lines.append(f"{meta['id'][i]}: {int(keep.sum())} detections >= {self.draw_threshold} "
                         f"({len(boxes)} in all)" + (f", drawn in {drawn}" if drawn else ""))
        return lines

    def _draw(self, meta, i, boxes, scores, labels, masks):
        path = meta["image_path"][i] if "image_path" in meta else meta["id"][i]
        try:
            img = np.ascontiguousarray(read_image(str(path))[:, :, ::-1])   # BGR: cv2 draws and writes it
        except SampleError:     # unreadable: the reader has named it
            return None
        for j in range(len(boxes)):
            colour = tuple(int(c) for c in self.colours[labels[j] % len(self.colours)][::-1])  # BGR
            if masks is not None:
                m = masks[j] > 0
                img[m] = (0.5 * img[m] + 0.5 * np.array(colour)).astype(np.uint8)
            x1, y1, x2, y2 = (int(round(v)) for v in boxes[j])
            cv2.rectangle(img, (x1, y1), (x2, y2), colour, 2)
            tag(img, f"{self.label(int(labels[j]))} {scores[j]:.2f}", x1, y1, colour)
        out = os.path.join(self.output_dir, file_stem(meta["id"][i]) + "_det.png")
        cv2.imwrite(out, img)
        self.paths.append(out)
        return out

    def close(self):
        path = os.path.join(self.output_dir, "detections.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.results, f)
        os.replace(path + ".tmp", path)
        return [path] + self.paths
