"""Semantic segmentation: the inference output (label PNG + overlay).

`LabelMap` writes, per image, `<name>.png`: the class ids as a palette PNG (the Pascal VOC colour
map, so viewers show colours and `PIL.Image.open(...)` gives the ids back), and
`<name>_overlay.png`: the image blended with the class colours, above a legend strip (the colour and
name of each class present in the picture; `legend: false` writes the blend alone, pixel-aligned
with the image). Predictions are preds['label_map']
(int [B, H, W] or one [H, W] per image) or preds['logits'] [B, C, H, W] (arg-max); a padded batch's
map is cut to the image's `image_size` (PadImages), and a map of another size than the image is
resized (nearest) to it. The image comes from the batch's `image_path`
metadata, else from the dataset's `describe(index)` when that is a file.
"""
import os

import cv2
import numpy as np
from PIL import Image

from engine.errors import ConfigError, SampleError
from engine.registry import OUTPUTS
from outputs.base import OutputWriter, file_stem
from outputs.palettes import voc_palette
from readers.decoding import read_image


@OUTPUTS.register("LabelMap")
class LabelMap(OutputWriter):
    """Label PNG + overlay per image (see the module docstring).

    Args:
        alpha: the weight of the class colour in the overlay's blend with the image, in [0, 1].
        legend: add the strip of class colours and names below the overlay (false: the blend alone,
            pixel-aligned with the image).
    """

    def __init__(self, alpha: float = 0.5, legend: bool = True):
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"infer LabelMap: alpha must be in [0, 1], got {alpha}")
        self.alpha, self.legend = alpha, legend
        self.palette = voc_palette()

    def open(self, output_dir, dataset, label_names=None):
        super().open(output_dir, dataset, label_names)
        self.paths = []

    def _maps(self, preds):
        if "label_map" in preds:
            return list(preds["label_map"])
        if "logits" in preds:
            return list(np.asarray(preds["logits"]).argmax(axis=1))
        raise ConfigError(f"infer LabelMap: predictions have neither 'label_map' nor 'logits' "
                          f"(keys: {sorted(preds)})")

    def _image(self, meta, i):
        """The input image (RGB) to draw on, or None: an unreadable one the reader has named."""
        path = meta["image_path"][i] if "image_path" in meta else meta["id"][i]
        try:
            return read_image(str(path))
        except SampleError:
            return None

    def write(self, preds, meta):
        lines = []
        for i, label in enumerate(self._maps(preds)):
            label = np.asarray(label)
            if label.ndim != 2:
                raise ConfigError(f"infer LabelMap: a label map must be [H, W], got {list(label.shape)}")
            if label.min() < 0 or label.max() > 255:
                raise ConfigError(f"infer LabelMap: class ids must be in [0, 255] for a PNG, got "
                                  f"{label.min()}..{label.max()}")
            if "image_size" in meta:   # a padded batch (PadImages): the image's own part
                h, w = (int(v) for v in np.asarray(meta["image_size"][i]).reshape(-1)[:2])
                label = label[:h, :w]
            image = self._image(meta, i)
            if image is not None and image.shape[:2] != label.shape:
                label = cv2.resize(label.astype(np.uint8), (image.shape[1], image.shape[0]),
                                   interpolation=cv2.INTER_NEAREST)
            label = label.astype(np.uint8)
            stem = file_stem(meta["id"][i])
            png = Image.fromarray(label, mode="P")
            png.putpalette(self.palette.reshape(-1).tolist())
            path = os.path.join(self.output_dir, stem + ".png")
            png.save(path)
            self.paths.append(path)
            files = {"label": path}
            if image is not None:
                colour = self.palette[label]
                blend = (image.astype(np.float32) * (1 - self.alpha) + colour * self.alpha).astype(np.uint8)
                if self.legend:
                    blend = with_legend(blend, [(self.label(int(c)), self.palette[c]) for c in np.unique(label)])
                over = os.path.join(self.output_dir, stem + "_overlay.png")
                cv2.imwrite(over, blend[:, :, ::-1])
                self.paths.append(over)
                files["overlay"] = over
            classes = [self.label(int(c)) for c in np.unique(label)]
            self.answers.append({"id": str(meta["id"][i]), "classes": classes, "files": files})
            present = ", ".join(classes)
            lines.append(f"{meta['id'][i]}: {path} ({present})")
        return lines

    def close(self):
        return list(self.paths)


def with_legend(image, entries):
    """`image` (RGB) above a white strip holding, for each (name, RGB colour) of `entries`, a swatch of
    the colour and the name, left to right, wrapping at the image's width (widened for one entry that
    does not fit). Sizes grow with the image: readable on a 2048 px picture too."""
    h, w = image.shape[:2]
    k = max(1, round(max(h, w) / 640))
    font, scale, thick = cv2.FONT_HERSHEY_SIMPLEX, 0.4 * k, k
    row, box, gap = 18 * k, 12 * k, 6 * k
    widths = [box + gap // 2 + cv2.getTextSize(name, font, scale, thick)[0][0] for name, _ in entries]
    width = max([w] + [x + 2 * gap for x in widths])
    places, x, y = [], gap, 0
    for item in widths:
        if x > gap and x + item + gap > width:
            x, y = gap, y + row
        places.append((x, y))
        x += item + 2 * gap
    strip = np.full((y + row + gap, width, 3), 255, np.uint8)
    for (name, colour), (x, y) in zip(entries, places):
        top = y + gap // 2 + (row - box) // 2
        strip[top:top + box, x:x + box] = colour
        cv2.putText(strip, name, (x + box + gap // 2, top + box - k), font, scale, (0, 0, 0), thick, cv2.LINE_AA)
    canvas = np.full((h + strip.shape[0], width, 3), 255, np.uint8)
    canvas[:h, :w], canvas[h:] = image, strip
    return canvas
