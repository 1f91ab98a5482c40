"""Segmentation training augmentations (PaddleSeg's paddleseg/transforms/transforms.py @d7975e7).

They act on the sample's declared fields (readers.fields): the image and its label map move
together, labels resized with nearest neighbour. The generic Scale / RandomCrop / RandomFlip /
Normalize (readers/transforms.py) complete a recipe. Random draws come from `sample["_rng"]`.
"""
import numpy as np
from PIL import Image, ImageEnhance

from engine.errors import ConfigError
from engine.registry import TRANSFORMS
from readers.fields import Fields


def _pair(name, key, value):
    if not isinstance(value, (list, tuple)) or len(value) != 2 or min(int(v) for v in value) < 1:
        raise ConfigError(f"{name}.{key} must be [width, height] of positive integers, got {value!r}")
    return int(value[0]), int(value[1])


@TRANSFORMS.register("ResizeStepScaling")
class ResizeStepScaling:
    """Resize by a factor drawn from min_scale_factor, min + step, ..., max_scale_factor (uniform in
    [min, max] when the step is 0); sizes are round(factor * size).

    Args:
        min_scale_factor: the smallest resize factor (> 0).
        max_scale_factor: the largest resize factor (>= min_scale_factor; equal: a fixed resize).
        scale_step_size: the spacing of the factors drawn from (0: any factor in [min, max]).
    """

    def __init__(self, min_scale_factor: float = 0.75, max_scale_factor: float = 1.25,
                 scale_step_size: float = 0.25):
        if not 0 < min_scale_factor <= max_scale_factor:
            raise ConfigError(f"ResizeStepScaling: need 0 < min_scale_factor <= max_scale_factor, got "
                              f"{min_scale_factor}, {max_scale_factor}")
        if scale_step_size < 0:
            raise ConfigError(f"ResizeStepScaling.scale_step_size must be >= 0, got {scale_step_size}")
        self.lo, self.hi, self.step = min_scale_factor, max_scale_factor, scale_step_size
        if self.step > 0 and self.hi > self.lo:
            n = int((self.hi - self.lo) / self.step + 1)
            self.factors = np.linspace(self.lo, self.hi, n)
        else:
            self.factors = None

    def factor(self, rng):
        if self.lo == self.hi:
            return self.lo
        if self.factors is None:
            return float(rng.uniform(self.lo, self.hi))
        return float(self.factors[rng.integers(len(self.factors))])

    def __call__(self, sample):
        f = Fields(sample, "ResizeStepScaling")
        s = self.factor(sample["_rng"])
        f.resize(max(1, int(round(s * f.h))), max(1, int(round(s * f.w))))
        return sample


@TRANSFORMS.register("RandomPaddingCrop")
class RandomPaddingCrop:
    """A crop_size = [width, height] window at a random position; an image smaller than the window is
    first padded at the bottom and right, the image with `im_padding_value`, the labels with
    `label_padding_value` (the ignore index). A uint8 image takes the value's integer part (127 for
    PaddleSeg's 127.5, which is what PaddleSeg's RandomDistort makes of it too).

    Args:
        crop_size: the window [width, height] in pixels.
        im_padding_value: the fill of the image's padding (a uint8 image takes its integer part).
        label_padding_value: the fill of the label map's padding: the ignore index, so padding is not
            scored.
    """

    def __init__(self, crop_size: list = (512, 512), im_padding_value: float = 127.5,
                 label_padding_value: int = 255):
        self.w, self.h = _pair("RandomPaddingCrop", "crop_size", crop_size)
        self.im_value, self.label_value = im_padding_value, label_padding_value

    def __call__(self, sample):
        f = Fields(sample, "RandomPaddingCrop", kinds=("image", "label"), needs=("image",))
        if (f.h, f.w) == (self.h, self.w):
            return sample
        ph, pw = max(self.h - f.h, 0), max(self.w - f.w, 0)
        if ph or pw:
            for key in f.keys("image", "label"):
                value = np.asarray(sample[key])
                fill = self.label_value if key in f.keys("label") else self.im_value
                if value.dtype.kind in "iu":
                    fill = int(fill)
                pad = [(0, ph), (0, pw)] + [(0, 0)] * (value.ndim - 2)
                sample[key] = np.pad(value, pad, mode="constant", constant_values=fill)
            f.h, f.w = f.h + ph, f.w + pw
        rng = sample["_rng"]
        y = int(rng.integers(0, f.h - self.h + 1))
        x = int(rng.integers(0, f.w - self.w + 1))
        f.crop(y, x, self.h, self.w)
        return sample


@TRANSFORMS.register("PhotometricDistortion")
class PhotometricDistortion:
    """PaddleSeg's RandomDistort: brightness, contrast, saturation, sharpness and hue, in a random
    order, each applied with its probability; factors uniform in [1 - range, 1 + range] (PIL
    ImageEnhance), the hue shifted by uniform [-hue_range, hue_range] on PIL's 0-255 HSV hue.
    Image fields only (uint8 RGB, before Normalize); labels are untouched.

    Args:
        brightness_range: brightness factors are drawn from [1 - range, 1 + range], range in [0, 1].
        brightness_prob: the probability of changing the brightness, in [0, 1].
        contrast_range: contrast factors are drawn from [1 - range, 1 + range].
        contrast_prob: the probability of changing the contrast.
        saturation_range: saturation factors are drawn from [1 - range, 1 + range].
        saturation_prob: the probability of changing the saturation.
        hue_range: the hue shift is drawn from [-range, range], on PIL's 0-255 hue scale (>= 0).
        hue_prob: the probability of shifting the hue.
        sharpness_range: sharpness factors are drawn from [1 - range, 1 + range].
        sharpness_prob: the probability of changing the sharpness (0: off, PaddleSeg's default).
    """

    OPS = ("brightness", "contrast", "saturation", "sharpness", "hue")

    def __init__(self, brightness_range: float = 0.5, brightness_prob: float = 0.5,
                 contrast_range: float = 0.5, contrast_prob: float = 0.5, saturation_range: float = 0.5,
                 saturation_prob: float = 0.5, hue_range: float = 18, hue_prob: float = 0.5,
                 sharpness_range: float = 0.5, sharpness_prob: float = 0.0):
        self.ranges = {"brightness": brightness_range, "contrast": contrast_range,
                       "saturation": saturation_range, "sharpness": sharpness_range, "hue": hue_range}
        self.probs = {"brightness": brightness_prob, "contrast": contrast_prob, "saturation": saturation_prob,
                      "sharpness": sharpness_prob, "hue": hue_prob}
        for k, p in self.probs.items():
            if not 0 <= p <= 1:
                raise ConfigError(f"PhotometricDistortion.{k}_prob must be in [0, 1], got {p}")
        for k, r in self.ranges.items():
            if r < 0 or (k != "hue" and r > 1):
                raise ConfigError(f"PhotometricDistortion.{k}_range must be in [0, 1] (hue: >= 0), got {r}")

    def __call__(self, sample):
        f = Fields(sample, "PhotometricDistortion", needs=("image",))
        rng = sample["_rng"]
        enhance = {"brightness": ImageEnhance.Brightness, "contrast": ImageEnhance.Contrast,
                   "saturation": ImageEnhance.Color, "sharpness": ImageEnhance.Sharpness}
        for key in f.keys("image"):
            img = np.asarray(sample[key])
            if img.dtype != np.uint8:
                raise ConfigError(f"PhotometricDistortion: image '{key}' must be uint8 RGB before Normalize, "
                                  f"got {img.dtype}")
            im = Image.fromarray(img)
            for i in rng.permutation(len(self.OPS)):
                op = self.OPS[i]
                if rng.random() >= self.probs[op]:
                    continue
                r = self.ranges[op]
                delta = rng.uniform(-r, r) if op == "hue" else rng.uniform(1 - r, 1 + r)
                if op == "hue":
                    hsv = np.array(im.convert("HSV"))
                    hsv[:, :, 0] = (hsv[:, :, 0].astype(np.float64) + delta).astype(np.int64) % 256
                    im = Image.fromarray(hsv, mode="HSV").convert("RGB")
                else:
                    im = enhance[op](im).enhance(float(delta))
            sample[key] = np.asarray(im)
        return sample
