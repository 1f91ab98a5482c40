"""Sample kinds and their shared geometry: how each kind of field is flipped, cropped and resized.

A reader declares what its keys hold under `sample["_fields"] = {key: kind}` (use `declare`), so
that one geometric transform can act on an image, its label map, boxes, polygons and masks at once
(MMDetection 2.x keeps bbox_fields/mask_fields/seg_fields for the same reason). The kinds:

    video      uint8 [N, H, W, 3] RGB frames (before Normalize)
    image      uint8 [H, W, 3] RGB (before Normalize; float32 [3, H, W] after it)
    label      integer [H, W] segmentation label map (resized with nearest neighbour)
    boxes      float32 [N, 4] x1, y1, x2, y2 in pixels
    polygons   per instance, a list of float32 [K, 2] (x, y) parts
    masks      uint8 [N, H, W] per-instance bitmaps
    instances  any per-instance array [N, ...] (class ids, is_crowd)

Coordinates are continuous: pixel (row i, column j) covers [j, j+1] x [i, i+1], the image spans
[0, W] x [0, H]; a horizontal flip maps x to W - x, a crop at (y0, x0) subtracts (x0, y0), a resize
multiplies by the size ratios. Every pixel field of a sample shares its H, W. A crop drops each
instance it empties from every per-instance field (boxes, polygons, masks, instances), so they
stay aligned.
"""
import cv2
import numpy as np

from engine.errors import ConfigError, SampleError

KINDS = ("video", "image", "label", "boxes", "polygons", "masks", "instances")
PIXEL_KINDS = ("video", "image", "label", "masks")          # arrays that share the sample's H, W
INSTANCE_KINDS = ("boxes", "polygons", "masks", "instances")  # one entry per instance
_LAYOUTS = {"video": "[N, H, W, 3]", "image": "[H, W, 3]", "label": "[H, W]", "masks": "[N, H, W]",
            "boxes": "[N, 4]"}


def declare(sample, **kinds):
    """Declare `key=kind` for fields of `sample` (added to those already declared); returns it."""
    unknown = {k: v for k, v in kinds.items() if v not in KINDS}
    if unknown:
        raise ValueError(f"unknown field kinds {unknown}; known: {', '.join(KINDS)}")
    sample["_fields"] = {**sample.get("_fields", {}), **kinds}
    return sample


def declared(sample):
    """The sample's {key: kind} declaration ({} when it has none)."""
    return dict(sample.get("_fields") or {})


def center_offset(full, size):
    return int(round((full - size) / 2.0))


class Fields:
    """The declared fields of one sample as one transform sees them: checked, then moved together.

    `kinds` are those the transform can handle (another kind is an error), `needs` the kinds that
    may define the geometry: the first declared field of one of them gives (h, w).
    """

    def __init__(self, sample, transform, kinds=KINDS, needs=("image", "video")):
        self.sample, self.name = sample, transform
        decl = declared(sample)
        if not decl:
            raise ConfigError(f"{transform}: the sample declares no fields (no sample['_fields']; "
                              f"keys: {self._keys()}); its reader must declare them, "
                              f"e.g. {{'imgs': 'video'}}")
        geometry = [k for k, kind in decl.items() if kind in needs]
        if not geometry:
            raise ConfigError(f"{transform}: the sample declares no {' or '.join(needs)} field "
                              f"(fields: {decl}; keys: {self._keys()})")
        for key, kind in decl.items():
            if kind not in kinds:
                raise ConfigError(f"{transform} cannot handle the {kind} field '{key}': it handles "
                                  f"{' and '.join(kinds)} fields only (fields: {decl})")
            if key not in sample:
                raise ConfigError(f"{transform}: the sample declares the {kind} field '{key}' but has "
                                  f"no such key (keys: {self._keys()})")
        self.items = list(decl.items())
        self.h, self.w = self._check_shapes(geometry[0])
        self.ref_kind = decl[geometry[0]]

    def _keys(self):
        return ", ".join(self.sample)

    def _where(self):
        return f" (sample {self.sample['index']})" if "index" in self.sample else ""

    def _check_shapes(self, ref):
        """(h, w) of field `ref`; every pixel field must share it, every instance field one N."""
        sizes, counts = {}, {}
        for key, kind in self.items:
            value = self.sample[key]
            if kind == "video" and not isinstance(value, np.ndarray):
                value = self.sample[key] = np.stack([np.asarray(f) for f in value])
            if kind in _LAYOUTS:
                value = np.asarray(value)
                ndim = {"video": 4, "image": 3, "label": 2, "masks": 3, "boxes": 2}[kind]
                channels = {"video": 3, "image": 3, "boxes": 4}.get(kind)
                if value.ndim != ndim or (channels and value.shape[-1] != channels):
                    before = " before Normalize" if kind in ("video", "image") else ""
                    raise ConfigError(f"{self.name}: the {kind} field '{key}' must be "
                                      f"{_LAYOUTS[kind]}{before}, got {value.dtype} {value.shape}")
            if kind in ("video", "image"):
                sizes[key] = value.shape[-3:-1]
            elif kind in ("label", "masks"):
                sizes[key] = value.shape[-2:]
            if kind in INSTANCE_KINDS:
                counts[key] = len(value)
        h, w = sizes[ref]
        odd = {k: s for k, s in sizes.items() if tuple(s) != (h, w)}
        if odd:
            raise SampleError(f"{self.name}: pixel fields of different sizes{self._where()}: "
                              + ", ".join(f"'{k}' {s[0]}x{s[1]}" for k, s in sizes.items()))
        if len(set(counts.values())) > 1:
            raise SampleError(f"{self.name}: per-instance fields of different lengths{self._where()}: "
                              + ", ".join(f"'{k}' {n}" for k, n in counts.items()))
        return int(h), int(w)

    def keys(self, *kinds):
        return [k for k, kind in self.items if kind in kinds]

    def check_crop(self, size):
        if size > self.h or size > self.w:
            what = "frames" if self.ref_kind == "video" else "image"
            raise ConfigError(f"{self.name}: crop size {size} is larger than the {what} "
                              f"({self.h}x{self.w}); scale first (Scale short_size >= {size})")

    def flip(self):
        """Horizontal flip of every field."""
        for key, kind in self.items:
            self.sample[key] = flip_field(kind, self.sample[key], self.w)

    def crop(self, y, x, h, w):
        """The window rows [y, y+h), columns [x, x+w) of every field; drops emptied instances."""
        for key, kind in self.items:
            self.sample[key] = crop_field(kind, self.sample[key], y, x, h, w)
        self.h, self.w = h, w
        self._drop_empty_instances()

    def resize(self, oh, ow):
        """Every field to oh x ow (a no-op when the size does not change)."""
        if (oh, ow) == (self.h, self.w):
            return
        for key, kind in self.items:
            self.sample[key] = resize_field(kind, self.sample[key], self.h, self.w, oh, ow)
        self.h, self.w = oh, ow

    def _drop_empty_instances(self):
        """Boxes decide which instances survive (zero width or height: dropped); without boxes,
        polygons (any part left), without those, masks (any pixel left)."""
        s = self.sample
        if self.keys("boxes"):
            keep = np.logical_and.reduce([(s[k][:, 2] > s[k][:, 0]) & (s[k][:, 3] > s[k][:, 1])
                                          for k in self.keys("boxes")])
        elif self.keys("polygons"):
            keep = np.array([len(parts) > 0 for parts in s[self.keys("polygons")[0]]], bool)
        elif self.keys("masks"):
            m = s[self.keys("masks")[0]]
            keep = m.reshape(len(m), -1).any(1)
        else:
            return
        if keep.all():
            return
        for key in self.keys(*INSTANCE_KINDS):
            value = s[key]
            if isinstance(value, list):
                s[key] = [v for v, k in zip(value, keep) if k]
            else:
                s[key] = np.asarray(value)[keep]


# ------------------------------------------------------------------ one field of a given kind

def flip_field(kind, value, width):
    if kind in ("video", "masks"):
        return value[:, :, ::-1]
    if kind in ("image", "label"):
        return value[:, ::-1]
    if kind == "boxes":
        v = np.asarray(value, np.float32)
        out = v.copy()
        out[:, 0], out[:, 2] = width - v[:, 2], width - v[:, 0]
        return out
    if kind == "polygons":
        return [[_affine(p, -1.0, width, 1.0, 0.0) for p in parts] for parts in value]
    return value


def crop_field(kind, value, y, x, h, w):
    if kind in ("video", "masks"):
        return value[:, y:y + h, x:x + w]
    if kind in ("image", "label"):
        return value[y:y + h, x:x + w]
    if kind == "boxes":
        out = np.asarray(value, np.float32) - np.array([x, y, x, y], np.float32)
        out[:, 0::2] = np.clip(out[:, 0::2], 0, w)
        out[:, 1::2] = np.clip(out[:, 1::2], 0, h)
        return out
    if kind == "polygons":
        clipped = [[clip_polygon(p, x, y, x + w, y + h) for p in parts] for parts in value]
        return [[_affine(p, 1.0, -x, 1.0, -y) for p in parts if len(p)] for parts in clipped]
    return value


def resize_field(kind, value, h, w, oh, ow):
    sx, sy = ow / w, oh / h
    if kind == "video":
        return np.stack([cv2.resize(np.ascontiguousarray(f), (ow, oh), interpolation=cv2.INTER_LINEAR)
                         for f in value])
    if kind == "image":
        return cv2.resize(np.ascontiguousarray(value), (ow, oh), interpolation=cv2.INTER_LINEAR)
    if kind in ("label", "masks"):
        return resize_nearest(value, oh, ow)
    if kind == "boxes":
        return np.asarray(value, np.float32) * np.array([sx, sy, sx, sy], np.float32)
    if kind == "polygons":
        return [[_affine(p, sx, 0.0, sy, 0.0) for p in parts] for parts in value]
    return value


def resize_nearest(value, oh, ow):
    """Nearest neighbour on the last two axes, sampling at output pixel centres (any dtype)."""
    h, w = value.shape[-2:]
    rows = np.minimum(((np.arange(oh) + 0.5) * (h / oh)).astype(np.int64), h - 1)
    cols = np.minimum(((np.arange(ow) + 0.5) * (w / ow)).astype(np.int64), w - 1)
    return value.take(rows, axis=-2).take(cols, axis=-1)


def _affine(points, ax, bx, ay, by):
    """(x, y) -> (ax*x + bx, ay*y + by) on a [K, 2] polygon, as float32."""
    p = np.asarray(points, np.float32)
    return np.stack([ax * p[:, 0] + bx, ay * p[:, 1] + by], 1).astype(np.float32)


def clip_polygon(points, x0, y0, x1, y1):
    """Sutherland-Hodgman: the part of polygon [K, 2] inside [x0, x1] x [y0, y1], float32 [M, 2].

    M is 0 when nothing of positive area is left. A concave polygon cut into several pieces stays
    one polygon whose pieces are joined by zero-area edges along the window's border (the method's
    known property; they add no pixels to a rasterised mask).
    """
    p = np.asarray(points, np.float64).reshape(-1, 2)
    for axis, bound, sign in ((0, x0, 1), (0, x1, -1), (1, y0, 1), (1, y1, -1)):
        if len(p) == 0:
            break
        p = _clip_edge(p, axis, bound, sign)
    if len(p):
        p = p[np.any(p != np.roll(p, 1, axis=0), axis=1)]  # repeated vertices (one on the border)
    if len(p) < 3:
        return np.zeros((0, 2), np.float32)
    area = 0.5 * abs(np.dot(p[:, 0], np.roll(p[:, 1], -1)) - np.dot(p[:, 1], np.roll(p[:, 0], -1)))
    return p.astype(np.float32) if area > 1e-9 else np.zeros((0, 2), np.float32)


def _clip_edge(p, axis, bound, sign):
    """Keep the side sign * (coordinate - bound) >= 0: for each edge prev -> cur, emit the crossing
    point when the edge crosses the line, then cur when cur is inside."""
    inside = sign * (p[:, axis] - bound) >= 0
    if inside.all():
        return p
    prev = np.roll(p, 1, axis=0)
    cross = inside != np.roll(inside, 1)
    step = np.where(cross, p[:, axis] - prev[:, axis], 1.0)  # nonzero on a crossing edge
    t = np.where(cross, (bound - prev[:, axis]) / step, 0.0)
    crossing = prev + t[:, None] * (p - prev)
    crossing[:, axis] = bound
    return np.stack([crossing, p], 1)[np.stack([cross, inside], 1)]
