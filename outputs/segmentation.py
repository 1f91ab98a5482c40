"""Semantic segmentation: the inference output (label PNG + overlay).

`LabelMap` writes, per image, `<name>.png`: the class ids as a palette PNG (the Pascal VOC colour
map, so viewers show colours and `PIL.Image.open(...)` gives the ids back), and
`<name>_overlay.png`: the image blended with the class colours. Predictions are preds['label_map']
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
    """Label PNG + overlay per image (see the module docstring); `alpha` is the colour's weight."""

    def __init__(self, alpha: float = 0.5):
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"infer LabelMap: alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha
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
            if image is not None:
                colour = self.palette[label]
                blend = (image.astype(np.float32) * (1 - self.alpha) + colour * self.alpha).astype(np.uint8)
                over = os.path.join(self.output_dir, stem + "_overlay.png")
                cv2.imwrite(over, blend[:, :, ::-1])
                self.paths.append(over)
            present = ", ".join(self.label(int(c)) for c in np.unique(label))
            lines.append(f"{meta['id'][i]}: {path} ({present})")
        return lines

    def close(self):
        return list(self.paths)
