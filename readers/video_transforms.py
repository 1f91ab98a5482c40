"""Video transforms: one geometry per video, applied to every sampled frame.

Until `Normalize`, `sample["imgs"]` is a uint8 array [N, H, W, 3] (RGB) of all sampled frames in
the reader's order (clip, segment, frame within the segment). Multi-crop transforms (`ThreeCrop`,
`TenCrop`) stack their crops in front, crop-major, so the array becomes [K*N, h, w, 3] and
`sample["_num_crops"]` records K; every other transform stays frame-wise and does not care.
`Normalize` converts to float32 and gives the model layout (see its docstring).

Random transforms draw from `sample["_rng"]` only, so a video's augmentation depends on
(seed, epoch, index) and not on worker state.
"""
import cv2
import numpy as np

from engine.registry import ConfigError, TRANSFORMS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _frames(sample):
    imgs = sample["imgs"]
    if not isinstance(imgs, np.ndarray):
        imgs = np.stack([np.asarray(f) for f in imgs])
    if imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"video transforms expect frames [N, H, W, 3] before Normalize, got {imgs.shape}")
    return imgs


def _check_size(name, size, h, w):
    if size > h or size > w:
        raise ConfigError(f"{name}: crop size {size} is larger than the frames ({h}x{w}); "
                          f"scale them first (Scale short_size >= {size})")


def _resize(imgs, oh, ow):
    if imgs.shape[1:3] == (oh, ow):
        return imgs
    return np.stack([cv2.resize(f, (ow, oh), interpolation=cv2.INTER_LINEAR) for f in imgs])


def _crop(imgs, y, x, h, w):
    return imgs[:, y:y + h, x:x + w]


def _stack_views(sample, views):
    sample["imgs"] = np.concatenate(views, axis=0)
    sample["_num_crops"] = sample.get("_num_crops", 1) * len(views)
    return sample


def scaled_size(h, w, short_size, fixed_ratio=False):
    """(out_h, out_w) of `Scale`; frames whose short side already equals short_size are kept."""
    if min(h, w) == short_size:
        return h, w
    long_fixed = int(short_size * 4.0 / 3.0)
    if w <= h:
        return (long_fixed if fixed_ratio else int(h * short_size / w)), short_size
    return short_size, (long_fixed if fixed_ratio else int(w * short_size / h))


@TRANSFORMS.register("Scale")
class Scale:
    """Short side to `short_size`, keeping the aspect ratio.

    `fixed_ratio=True` is the Fluid KineticsReader's `group_scale`: the long side is forced to
    int(4/3 * short_size) (256 -> 341) whatever the video's aspect ratio.
    """

    def __init__(self, short_size: int = 256, fixed_ratio: bool = False):
        if short_size < 1:
            raise ConfigError(f"Scale.short_size must be >= 1, got {short_size}")
        self.short_size, self.fixed_ratio = short_size, fixed_ratio

    def __call__(self, sample):
        imgs = _frames(sample)
        oh, ow = scaled_size(imgs.shape[1], imgs.shape[2], self.short_size, self.fixed_ratio)
        sample["imgs"] = _resize(imgs, oh, ow)
        return sample


@TRANSFORMS.register("RandomCrop")
class RandomCrop:
    """A size x size crop at a uniformly random position (the same for all frames)."""

    def __init__(self, size: int = 224):
        self.size = size

    def __call__(self, sample):
        imgs = _frames(sample)
        h, w = imgs.shape[1:3]
        _check_size("RandomCrop", self.size, h, w)
        rng = sample["_rng"]
        y = int(rng.integers(0, h - self.size + 1))
        x = int(rng.integers(0, w - self.size + 1))
        sample["imgs"] = _crop(imgs, y, x, self.size, self.size)
        return sample


def center_offset(full, size):
    return int(round((full - size) / 2.0))


@TRANSFORMS.register("CenterCrop")
class CenterCrop:
    def __init__(self, size: int = 224):
        self.size = size

    def __call__(self, sample):
        imgs = _frames(sample)
        h, w = imgs.shape[1:3]
        _check_size("CenterCrop", self.size, h, w)
        sample["imgs"] = _crop(imgs, center_offset(h, self.size), center_offset(w, self.size),
                               self.size, self.size)
        return sample


@TRANSFORMS.register("RandomFlip")
class RandomFlip:
    """Horizontal flip of the whole video with probability p."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, sample):
        imgs = _frames(sample)
        if sample["_rng"].random() < self.p:
            imgs = imgs[:, :, ::-1]
        sample["imgs"] = imgs
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
    """TSN's multi-scale crop (see `multiscale_crop_box`), resized to size x size."""

    def __init__(self, size: int = 224, scales: list = None, max_distort: int = 1,
                 fix_crop: bool = True, more_fix_crop: bool = True):
        self.size = size
        self.scales = tuple(scales) if scales else (1, .875, .75, .66)
        if any(not 0 < s <= 1 for s in self.scales):
            raise ConfigError(f"MultiScaleCrop.scales must be in (0, 1], got {list(self.scales)}")
        self.max_distort, self.fix_crop, self.more_fix_crop = max_distort, fix_crop, more_fix_crop

    def __call__(self, sample):
        imgs = _frames(sample)
        y, x, ch, cw = multiscale_crop_box(imgs.shape[1], imgs.shape[2], self.size, sample["_rng"],
                                           self.scales, self.max_distort, self.fix_crop,
                                           self.more_fix_crop)
        sample["imgs"] = _resize(np.ascontiguousarray(_crop(imgs, y, x, ch, cw)), self.size, self.size)
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
    """Three size x size views along the long side (test time); K=3 views."""

    def __init__(self, size: int = 224):
        self.size = size

    def __call__(self, sample):
        imgs = _frames(sample)
        h, w = imgs.shape[1:3]
        _check_size("ThreeCrop", self.size, h, w)
        return _stack_views(sample, [_crop(imgs, y, x, self.size, self.size)
                                     for y, x in three_crop_offsets(h, w, self.size)])


@TRANSFORMS.register("TenCrop")
class TenCrop:
    """4 corners + centre, then the same 5 flipped horizontally (test time); K=10 views."""

    def __init__(self, size: int = 224):
        self.size = size

    def __call__(self, sample):
        imgs = _frames(sample)
        h, w = imgs.shape[1:3]
        _check_size("TenCrop", self.size, h, w)
        crops = [_crop(imgs, y, x, self.size, self.size) for y, x in ten_crop_offsets(h, w, self.size)]
        return _stack_views(sample, crops + [c[:, :, ::-1] for c in crops])


@TRANSFORMS.register("Normalize")
class Normalize:
    """uint8 RGB frames -> float32 (x/255 - mean) / std in the models' layout.

    Output `imgs`: [T, seglen*3, H, W] for a single view, or [V, T, seglen*3, H, W] when there are
    several views (V = crops x clips, crop-major: view v = crop * num_clips + clip). T is the
    number of segments; the seglen frames of a segment are stacked along channels (StNet's
    super-image, frame-major: channel = 3*frame + rgb). The reader records T, seglen and clips under
    `_num_seg`, `_seglen`, `_num_clips`; without them each frame is its own segment.
    """

    def __init__(self, mean: list = None, std: list = None):
        mean = IMAGENET_MEAN if mean is None else mean
        std = IMAGENET_STD if std is None else std
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ConfigError(f"Normalize needs 3 means and 3 positive stds, got mean={list(mean)} "
                              f"std={list(std)}")
        self.scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
        self.shift = (255.0 * np.asarray(mean, np.float32)).astype(np.float32)

    def __call__(self, sample):
        imgs = _frames(sample)
        n, h, w, _ = imgs.shape
        crops = sample.get("_num_crops", 1)
        clips = sample.get("_num_clips", 1)
        seglen = sample.get("_seglen", 1)
        segs = sample.get("_num_seg", n // (crops * clips * seglen))
        if crops * clips * segs * seglen != n:
            raise ValueError(f"Normalize: {n} frames do not split into {crops} crops x {clips} clips "
                             f"x {segs} segments x {seglen} frames")
        x = (imgs.astype(np.float32) - self.shift) * self.scale
        x = x.reshape(crops * clips, segs, seglen, h, w, 3).transpose(0, 1, 2, 5, 3, 4)
        x = np.ascontiguousarray(x).reshape(crops * clips, segs, seglen * 3, h, w)
        sample["imgs"] = x[0] if crops * clips == 1 else x
        return sample
