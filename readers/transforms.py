"""Geometric transforms for every kind of sample: video, image, label map, boxes, polygons, masks.

Each transform acts on every field the sample declares (`readers.fields`: `sample["_fields"]`),
with one geometry per sample taken from its first image or video field, so an image and its label
map, or an image and its boxes, polygons and masks, always move together. The same names serve
video recipes (frames [N, H, W, 3]) and image recipes. Video-only multi-view crops are in
readers/video_transforms.py.

Random transforms draw from `sample["_rng"]` only, so a sample's augmentation depends on
(seed, epoch, index) and not on worker state.
"""
import numpy as np

from engine.errors import ConfigError
from engine.registry import TRANSFORMS
from readers.fields import Fields, center_offset

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_positive(transform, key, value):
    if value < 1:
        raise ConfigError(f"{transform}.{key} must be >= 1, got {value}")


def scaled_size(h, w, short_size, fixed_ratio=False):
    """(out_h, out_w) of `Scale`; a sample whose short side already equals short_size is kept."""
    if min(h, w) == short_size:
        return h, w
    long_fixed = int(short_size * 4.0 / 3.0)
    if w <= h:
        return (long_fixed if fixed_ratio else int(h * short_size / w)), short_size
    return short_size, (long_fixed if fixed_ratio else int(w * short_size / h))


@TRANSFORMS.register("Scale")
class Scale:
    """Short side to `short_size`, keeping the aspect ratio (label maps and masks: nearest).

    Args:
        short_size: the short side after resizing, in pixels.
        fixed_ratio: the Fluid KineticsReader's `group_scale`: the long side is forced to
            int(4/3 * short_size) (256 -> 341) whatever the aspect ratio.
    """

    def __init__(self, short_size: int = 256, fixed_ratio: bool = False):
        check_positive("Scale", "short_size", short_size)
        self.short_size, self.fixed_ratio = short_size, fixed_ratio

    def __call__(self, sample):
        f = Fields(sample, "Scale")
        f.resize(*scaled_size(f.h, f.w, self.short_size, self.fixed_ratio))
        return sample


@TRANSFORMS.register("RandomCrop")
class RandomCrop:
    """A size x size crop at a uniformly random position (one position for all fields and frames).

    Args:
        size: the side of the square crop in pixels (at most the image's short side).
    """

    def __init__(self, size: int = 224):
        check_positive("RandomCrop", "size", size)
        self.size = size

    def __call__(self, sample):
        f = Fields(sample, "RandomCrop")
        f.check_crop(self.size)
        rng = sample["_rng"]
        y = int(rng.integers(0, f.h - self.size + 1))
        x = int(rng.integers(0, f.w - self.size + 1))
        f.crop(y, x, self.size, self.size)
        return sample


@TRANSFORMS.register("CenterCrop")
class CenterCrop:
    """A size x size crop at the centre (evaluation's counterpart of RandomCrop).

    Args:
        size: the side of the square crop in pixels (at most the image's short side).
    """

    def __init__(self, size: int = 224):
        check_positive("CenterCrop", "size", size)
        self.size = size

    def __call__(self, sample):
        f = Fields(sample, "CenterCrop")
        f.check_crop(self.size)
        f.crop(center_offset(f.h, self.size), center_offset(f.w, self.size), self.size, self.size)
        return sample


@TRANSFORMS.register("RandomFlip")
class RandomFlip:
    """Horizontal flip of the whole sample with probability p (one draw per sample, always made).

    Args:
        p: the probability of flipping, in [0, 1].
    """

    def __init__(self, p: float = 0.5):
        if not 0 <= p <= 1:
            raise ConfigError(f"RandomFlip.p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, sample):
        f = Fields(sample, "RandomFlip")
        if sample["_rng"].random() < self.p:
            f.flip()
        return sample


@TRANSFORMS.register("Normalize")
class Normalize:
    """uint8 RGB -> (x/255 - mean) / std in the models' layout, by default on the model's device; other
    kinds are kept.

    image: [H, W, 3] -> [3, H, W].
    video: [T, seglen*3, H, W] for a single view, or [V, T, seglen*3, H, W] when there are
    several views (V = crops x clips, crop-major: view v = crop * num_clips + clip). T is the
    number of segments; the seglen frames of a segment are stacked along channels (StNet's
    super-image, frame-major: channel = 3*frame + rgb). The reader records T, seglen and clips under
    `_num_seg`, `_seglen`, `_num_clips`, multi-view crops record `_num_crops`; without them each
    frame is its own segment.

    By default (`in_main_process: true`) the pixels stay uint8 in that layout and the sample gets
    `<key>_normalize` = [shift, scale] per RGB channel; the model applies them to the collated batch
    on its device (`models.pixels.as_float`), and the exported-model predictor on the host before
    the program (deploy/predictor.py). DataLoader workers then hand over a quarter of the
    bytes (one byte a value instead of four). Where PadImages padded a
    batch (`<key>_size`), the padding is 0.0 after normalising, as when padding float32 pixels
    with 0. `in_main_process: false` normalises here, to float32 (for a model of your own that
    reads float pixels and does not call `as_float`).

    Args:
        mean: the per-channel RGB mean on the 0-1 scale (default: ImageNet's).
        std: the per-channel RGB standard deviation on the 0-1 scale, > 0 (default: ImageNet's).
        in_main_process: keep uint8 pixels with their [shift, scale] and let the model normalise on
            its device (a quarter of the bytes between processes); false: float32 here.
    """

    def __init__(self, mean: list = None, std: list = None, in_main_process: bool = True):
        self.in_main_process = bool(in_main_process)
        mean = IMAGENET_MEAN if mean is None else mean
        std = IMAGENET_STD if std is None else std
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ConfigError(f"Normalize needs 3 means and 3 positive stds, got mean={list(mean)} "
                              f"std={list(std)}")
        self.scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
        self.shift = (255.0 * np.asarray(mean, np.float32)).astype(np.float32)

    def __call__(self, sample):
        f = Fields(sample, "Normalize")
        for key in f.keys("image"):
            x = self._values(sample, key)
            sample[key] = np.ascontiguousarray(x.transpose(2, 0, 1))
        for key in f.keys("video"):
            sample[key] = self._video(sample, self._values(sample, key))
        return sample

    def _values(self, sample, key):
        x = np.asarray(sample[key])
        if self.in_main_process:
            if x.dtype != np.uint8:
                raise ConfigError(f"Normalize: in_main_process needs uint8 pixels in '{key}', got {x.dtype}")
            sample[key + "_normalize"] = [self.shift.tolist(), self.scale.tolist()]
            return x
        return (x.astype(np.float32) - self.shift) * self.scale

    def _video(self, sample, imgs):
        n, h, w, _ = imgs.shape
        crops = sample.get("_num_crops", 1)
        clips = sample.get("_num_clips", 1)
        seglen = sample.get("_seglen", 1)
        segs = sample.get("_num_seg", n // (crops * clips * seglen))
        if crops * clips * segs * seglen != n:
            raise ConfigError(f"Normalize: {n} frames do not split into {crops} crops x {clips} clips "
                             f"x {segs} segments x {seglen} frames")
        x = imgs.reshape(crops * clips, segs, seglen, h, w, 3).transpose(0, 1, 2, 5, 3, 4)
        x = np.ascontiguousarray(x).reshape(crops * clips, segs, seglen * 3, h, w)
        return x[0] if crops * clips == 1 else x


