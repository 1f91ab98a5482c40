"""Detection transforms: resize by the short side under a long-side cap, recording the scale factor.

Flip and normalisation are the generic RandomFlip / Normalize (readers/transforms.py), which move
boxes and polygons with the image through the declared fields.
"""
import typing

import cv2
import numpy as np

from engine.errors import ConfigError
from engine.registry import TRANSFORMS
from readers.fields import Fields, resize_field

INTERPOLATIONS = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC,
                  "area": cv2.INTER_AREA}


def keep_ratio_size(h, w, short, max_size):
    """(out_h, out_w) of PaddleDetection's Resize(keep_ratio=True): scale = min(short / short side,
    max_size / long side), each side int(scale * side + 0.5)."""
    scale = min(short / min(h, w), max_size / max(h, w))
    return int(scale * h + 0.5), int(scale * w + 0.5)


@TRANSFORMS.register("ResizeShort")
class ResizeShort:
    """Short side to one of `short_sizes`, long side at most `max_size`; multiplies `scale_factor`
    (sy, sx) by the actual size ratios. Boxes and polygons scale with the image.

    Args:
        short_sizes: the short-side lengths in pixels, one drawn at random per sample when there are
            several (PaddleDetection's RandomResize [640..800] for training; one value for evaluation).
        max_size: the cap on the long side in pixels (the scale is the smaller of the two ratios).
        interp: the image's interpolation (PaddleDetection's recipe uses cubic, its interp 2); label
            fields keep their own.
    """

    def __init__(self, short_sizes: list = [800], max_size: int = 1333,  # noqa: B006
                 interp: typing.Literal[tuple(INTERPOLATIONS)] = "linear"):
        sizes = [short_sizes] if isinstance(short_sizes, (int, float)) else list(short_sizes)
        if not sizes or min(sizes) < 1 or max_size < 1:
            raise ConfigError(f"ResizeShort: short_sizes must be >= 1 and max_size >= 1, got {short_sizes}, "
                              f"{max_size}")
        if interp not in INTERPOLATIONS:
            raise ConfigError(f"ResizeShort.interp must be one of {', '.join(INTERPOLATIONS)}, got '{interp}'")
        self.sizes, self.max_size, self.interp = [int(s) for s in sizes], int(max_size), interp

    def __call__(self, sample):
        f = Fields(sample, "ResizeShort", needs=("image",))
        short = self.sizes[int(sample["_rng"].integers(len(self.sizes)))] if len(self.sizes) > 1 else self.sizes[0]
        oh, ow = keep_ratio_size(f.h, f.w, short, self.max_size)
        if (oh, ow) != (f.h, f.w):
            for key, kind in f.items:
                if kind == "image":
                    sample[key] = cv2.resize(np.ascontiguousarray(sample[key]), (ow, oh),
                                             interpolation=INTERPOLATIONS[self.interp])
                else:
                    sample[key] = resize_field(kind, sample[key], f.h, f.w, oh, ow)
        ratio = np.array([oh / f.h, ow / f.w], np.float32)
        sample["scale_factor"] = np.asarray(sample.get("scale_factor", np.ones(2, np.float32)), np.float32) * ratio
        return sample
