"""Video-only crops: TSN's multi-scale crop and the multi-view test crops.

They act on the sample's `video` fields (`readers.fields`; uint8 [N, H, W, 3] RGB, all sampled
frames in the reader's order: clip, segment, frame within the segment) with one geometry for every
frame; a sample with no video field, or with a field of another kind, is an error. Multi-view crops
(`ThreeCrop`, `TenCrop`) stack their views in front, crop-major, so a video becomes [K*N, h, w, 3]
and `sample["_num_crops"]` records K for `Normalize`. The generic Scale, RandomCrop, CenterCrop,
RandomFlip and Normalize are in readers/transforms.py.

Random transforms draw from `sample["_rng"]` only, so a video's augmentation depends on
(seed, epoch, index) and not on worker state.
"""
import numpy as np

from engine.errors import ConfigError
from engine.registry import TRANSFORMS
from readers.fields import Fields, center_offset, crop_field, flip_field
from readers.transforms import check_positive


def video_fields(sample, transform):
    return Fields(sample, transform, kinds=("video",), needs=("video",))


def _stack_views(sample, f, views):
    """views(frames) -> list of K arrays; every video field becomes their concatenation."""
    count = None
    for key in f.keys("video"):
        crops = views(sample[key])
        sample[key], count = np.concatenate(crops, axis=0), len(crops)
    sample["_num_crops"] = sample.get("_num_crops", 1) * count
    return sample


def multiscale_crop_box(h, w, size, rng, scales=(1, .875, .75, .66), max_distort=1,
                        fix_crop=True, more_fix_crop=True):
    """TSN's corner/centre-cropping: (y, x, crop_h, crop_w) inside an h x w frame.

    Crop sides are scales of the short side (snapped to `size` when within 3 px), width and height
    scale indices at most `max_distort` apart; the position is one of 5 (or 13 with
    `more_fix_crop`) fixed offsets on a 4x4 grid, or uniform when `fix_crop` is off.
    """
    base = min(h, w)
    sides = [int(base * s) for s in scales]
    sides = [size if abs(s - size) < 3 else s for s in sides]
    pairs = [(sh, sw) for i, sh in enumerate(sides) for j, sw in enumerate(sides)
             if abs(i - j) <= max_distort]
    ch, cw = pairs[int(rng.integers(len(pairs)))]
    if not fix_crop:
        return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    ys, xs = (h - ch) // 4, (w - cw) // 4
    grid = [(0, 0), (0, 4), (4, 0), (4, 4), (2, 2)]
    if more_fix_crop:
        grid += [(2, 0), (2, 4), (4, 2), (0, 2), (1, 1), (1, 3), (3, 1), (3, 3)]
    gy, gx = grid[int(rng.integers(len(grid)))]
    return gy * ys, gx * xs, ch, cw


@TRANSFORMS.register("MultiScaleCrop")
class MultiScaleCrop:
    """TSN's multi-scale crop (see `multiscale_crop_box`), resized to size x size.

    Args:
        size: the side of the square output in pixels.
        scales: the crop sides as fractions of the frame's short side, in (0, 1] (default: TSN's
            1, .875, .75, .66).
        max_distort: how many scale steps a crop's width and height may differ (0: square crops).
        fix_crop: place the crop at fixed grid offsets (corners and centre) instead of uniformly.
        more_fix_crop: 13 fixed offsets on a 4x4 grid instead of 5 (with `fix_crop`).
    """

    def __init__(self, size: int = 224, scales: list = None, max_distort: int = 1,
                 fix_crop: bool = True, more_fix_crop: bool = True):
        check_positive("MultiScaleCrop", "size", size)
        self.size = size
        self.scales = tuple(scales) if scales else (1, .875, .75, .66)
        if any(not 0 < s <= 1 for s in self.scales):
            raise ConfigError(f"MultiScaleCrop.scales must be in (0, 1], got {list(self.scales)}")
        if max_distort < 0:
            raise ConfigError(f"MultiScaleCrop.max_distort must be >= 0, got {max_distort}")
        self.max_distort, self.fix_crop, self.more_fix_crop = max_distort, fix_crop, more_fix_crop

    def __call__(self, sample):
        f = video_fields(sample, "MultiScaleCrop")
        y, x, ch, cw = multiscale_crop_box(f.h, f.w, self.size, sample["_rng"], self.scales,
                                           self.max_distort, self.fix_crop, self.more_fix_crop)
        f.crop(y, x, ch, cw)
        f.resize(self.size, self.size)
        return sample


def three_crop_offsets(h, w, size):
    """Start, centre and end of the long side; the short side is centred."""
    cy, cx = center_offset(h, size), center_offset(w, size)
    if w >= h:
        return [(cy, 0), (cy, cx), (cy, w - size)]
    return [(0, cx), (cy, cx), (h - size, cx)]


def ten_crop_offsets(h, w, size):
    """Top-left, top-right, bottom-left, bottom-right, centre (their flips follow in TenCrop)."""
    return [(0, 0), (0, w - size), (h - size, 0), (h - size, w - size),
            (center_offset(h, size), center_offset(w, size))]


@TRANSFORMS.register("ThreeCrop")
class ThreeCrop:
    """Three size x size views along the long side (test time); K=3 views.

    Args:
        size: the side of each square view in pixels (at most the frame's short side).
    """

    def __init__(self, size: int = 224):
        check_positive("ThreeCrop", "size", size)
        self.size = size

    def __call__(self, sample):
        f = video_fields(sample, "ThreeCrop")
        f.check_crop(self.size)
        s = self.size
        offsets = three_crop_offsets(f.h, f.w, s)
        return _stack_views(sample, f, lambda v: [crop_field("video", v, y, x, s, s)
                                                  for y, x in offsets])


@TRANSFORMS.register("TenCrop")
class TenCrop:
    """4 corners + centre, then the same 5 flipped horizontally (test time); K=10 views.

    Args:
        size: the side of each square view in pixels (at most the frame's short side).
    """

    def __init__(self, size: int = 224):
        check_positive("TenCrop", "size", size)
        self.size = size

    def __call__(self, sample):
        f = video_fields(sample, "TenCrop")
        f.check_crop(self.size)
        s = self.size
        offsets = ten_crop_offsets(f.h, f.w, s)

        def views(v):
            crops = [crop_field("video", v, y, x, s, s) for y, x in offsets]
            return crops + [flip_field("video", c, s) for c in crops]
        return _stack_views(sample, f, views)
