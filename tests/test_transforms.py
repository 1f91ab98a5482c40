"""Generic transforms on every sample kind: geometry checked by hand arithmetic, errors one line."""
import numpy as np
import pytest

from engine.components import load_all
from engine.errors import ConfigError, SampleError
from engine.registry import TRANSFORMS
from readers import transforms as T, video_transforms as vt
from readers.fields import Fields, clip_polygon, declare


def coord_image(h, w):
    """Channel 0 = row, channel 1 = column, channel 2 = 7: a pixel's value tells where it came from."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([y, x, np.full_like(y, 7)], -1).astype(np.uint8)


def pattern_label(h, w):
    """A label map no symmetry can fake: value 1000 * row + column."""
    y, x = np.mgrid[0:h, 0:w]
    return (1000 * y + x).astype(np.int32)


def seg_sample(h=10, w=12, seed=0):
    return declare({"img": coord_image(h, w), "seg": pattern_label(h, w),
                    "_rng": np.random.default_rng(seed)}, img="image", seg="label")


def poly(*xy):
    return np.array(xy, np.float32).reshape(-1, 2)


def area(p):
    return 0.5 * abs(np.dot(p[:, 0], np.roll(p[:, 1], -1)) - np.dot(p[:, 1], np.roll(p[:, 0], -1)))


def box_mask(h, w, box):
    m = np.zeros((h, w), np.uint8)
    x1, y1, x2, y2 = box
    m[y1:y2, x1:x2] = 1
    return m


# a 100 x 80 (W x H) image; the 40 x 40 centre crop is the window x in [30, 70], y in [20, 60]
H, W = 80, 100
BOXES = [[20, 30, 50, 50],   # A: partly inside, cut at x = 30
         [80, 5, 95, 15],    # B: outside the window
         [40, 30, 60, 50],   # C: inside
         [30, 10, 50, 20]]   # D: touches the window's top edge only: zero height after the crop
POLYS = [[poly(20, 30, 50, 30, 50, 50)],                                          # right triangle in A
         [poly(80, 5, 95, 5, 95, 15, 80, 15)],
         [poly(40, 30, 60, 30, 60, 50, 40, 50), poly(45, 35, 50, 35, 50, 40)],     # C has two parts
         [poly(30, 10, 50, 10, 50, 20, 30, 20)]]


def det_sample(seed=0):
    s = {"image": coord_image(H, W), "gt_boxes": np.array(BOXES, np.float32),
         "gt_polys": [[p.copy() for p in parts] for parts in POLYS],
         "gt_masks": np.stack([box_mask(H, W, b) for b in BOXES]),
         "gt_class": np.array([1, 2, 3, 4], np.int64), "is_crowd": np.array([0, 1, 0, 0], np.int32),
         "_rng": np.random.default_rng(seed)}
    return declare(s, image="image", gt_boxes="boxes", gt_polys="polygons", gt_masks="masks",
                   gt_class="instances", is_crowd="instances")


# ------------------------------------------------------------------ image + label map

def test_flip_moves_label_pixels_with_image_pixels():
    s = T.RandomFlip(p=1.0)(seg_sample(10, 12))
    img, seg = s["img"], s["seg"]
    assert img.shape == (10, 12, 3) and seg.shape == (10, 12) and seg.dtype == np.int32
    assert seg[3, 0] == 3011 and seg[3, 11] == 3000        # column j <- 11 - j
    assert img[3, 0, 1] == 11 and img[3, 0, 0] == 3
    assert (seg == 1000 * img[..., 0].astype(np.int32) + img[..., 1]).all()
    kept = T.RandomFlip(p=0.0)(seg_sample(10, 12))
    assert (kept["seg"] == pattern_label(10, 12)).all()


def test_center_and_random_crop_cut_label_like_image():
    s = T.CenterCrop(6)(seg_sample(10, 12))  # offsets round((10-6)/2) = 2, round((12-6)/2) = 3
    assert s["seg"].shape == (6, 6) and s["seg"][0, 0] == 2003 and s["seg"][5, 5] == 7008
    assert tuple(s["img"][0, 0, :2]) == (2, 3)
    for seed in range(5):
        s = T.RandomCrop(5)(seg_sample(10, 12, seed))
        assert s["seg"].shape == (5, 5) and s["img"].shape == (5, 5, 3)
        assert (s["seg"] == 1000 * s["img"][..., 0].astype(np.int32) + s["img"][..., 1]).all()
        y0, x0 = divmod(int(s["seg"][0, 0]), 1000)
        assert (s["seg"] == pattern_label(10, 12)[y0:y0 + 5, x0:x0 + 5]).all()


def test_image_crop_draws_like_a_video_crop():
    """One geometry, one draw order: the same seed crops an image where it crops a video."""
    for seed in range(6):
        img = T.RandomCrop(5)(seg_sample(10, 12, seed))["img"]
        video = T.RandomCrop(5)(declare({"v": coord_image(10, 12)[None].repeat(2, 0),
                                         "_rng": np.random.default_rng(seed)}, v="video"))["v"]
        assert (video[0] == img).all() and (video[1] == img).all()


def test_scale_resizes_label_with_nearest():
    s = T.Scale(5)(seg_sample(10, 20))       # short side 10 -> 5: 5 x 10, ratio 1/2
    assert s["img"].shape == (5, 10, 3) and s["seg"].shape == (5, 10) and s["seg"].dtype == np.int32
    # output pixel (i, j) samples source pixel centre ((i + .5) * 2, (j + .5) * 2) -> (2i + 1, 2j + 1)
    assert s["seg"][0, 0] == 1001 and s["seg"][4, 9] == 9019
    assert set(np.unique(s["seg"] % 1000)) == set(range(1, 20, 2))   # never blended


def test_normalize_image_chw_and_leaves_other_kinds():
    img = np.zeros((2, 3, 3), np.uint8)
    img[0, 0] = [255, 0, 51]
    s = declare({"img": img, "seg": np.ones((2, 3), np.int64)}, img="image", seg="label")
    out = T.Normalize(mean=[0.5, 0.5, 0.2], std=[0.25, 0.5, 0.2], in_main_process=False)(s)
    x = out["img"]
    assert x.shape == (3, 2, 3) and x.dtype == np.float32 and x.flags.c_contiguous
    # (255/255 - .5)/.25 = 2; (0 - .5)/.5 = -1; (51/255 - .2)/.2 = 0; a zero pixel in red: -2
    np.testing.assert_allclose(x[:, 0, 0], [2, -1, 0], atol=1e-5)
    np.testing.assert_allclose(x[:, 1, 2], [-2, -1, -1], atol=1e-5)
    assert out["seg"].dtype == np.int64 and (out["seg"] == 1).all()


# ------------------------------------------------------------------ image + boxes + polygons + masks

def test_flip_boxes_polygons_masks():
    s = T.RandomFlip(p=1.0)(det_sample())
    b = s["gt_boxes"]
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b, [[50, 30, 80, 50], [5, 5, 20, 15], [40, 30, 60, 50], [50, 10, 70, 20]])
    np.testing.assert_array_equal(T.RandomFlip(p=1.0)(declare(
        {"i": np.zeros((5, 100, 3), np.uint8), "b": np.array([[10, 20, 30, 40]], np.float32),
         "_rng": np.random.default_rng(0)}, i="image", b="boxes"))["b"], [[70, 20, 90, 40]])
    np.testing.assert_array_equal(s["gt_polys"][0][0], [[80, 30], [50, 30], [50, 50]])  # x -> 100 - x
    np.testing.assert_array_equal(s["gt_polys"][2][1], [[55, 35], [50, 35], [50, 40]])
    assert s["gt_masks"].shape == (4, H, W)
    assert (s["gt_masks"][0] == box_mask(H, W, (50, 30, 80, 50))).all()
    assert s["gt_class"].tolist() == [1, 2, 3, 4] and s["image"][0, 0, 1] == 99


def test_crop_clips_shifts_and_drops_emptied_instances():
    s = T.CenterCrop(40)(det_sample())  # window x 30..70, y 20..60
    assert s["image"].shape == (40, 40, 3) and tuple(s["image"][0, 0, :2]) == (20, 30)
    # A: [20,30,50,50] -> [-10,10,20,30] -> clipped [0,10,20,30]; C: [10,10,30,30]; B and D dropped
    np.testing.assert_array_equal(s["gt_boxes"], [[0, 10, 20, 30], [10, 10, 30, 30]])
    assert s["gt_class"].tolist() == [1, 3] and s["is_crowd"].tolist() == [0, 0]
    assert len(s["gt_polys"]) == 2 and s["gt_masks"].shape == (2, 40, 40)
    # A's triangle (20,30) (50,30) (50,50) loses the part x < 30: the long side meets x = 30 at
    # y = 50 - 20 * (20/30) = 36.67; shifted by (-30, -20)
    a = s["gt_polys"][0]
    assert len(a) == 1
    np.testing.assert_allclose(a[0], [[0, 50 / 3], [0, 10], [20, 10], [20, 30]], atol=1e-4)
    assert area(a[0]) == pytest.approx(300 - 100 / 3, abs=1e-3)
    np.testing.assert_array_equal(s["gt_polys"][1][0], [[10, 10], [30, 10], [30, 30], [10, 30]])
    np.testing.assert_array_equal(s["gt_polys"][1][1], [[15, 15], [20, 15], [20, 20]])
    assert (s["gt_masks"][0] == box_mask(40, 40, (0, 10, 20, 30))).all()
    assert (s["gt_masks"][1] == box_mask(40, 40, (10, 10, 30, 30))).all()


def test_random_crop_keeps_instances_aligned():
    for seed in range(10):
        s = T.RandomCrop(40)(det_sample(seed))
        y0, x0 = (int(v) for v in s["image"][0, 0, :2])
        n = len(s["gt_boxes"])
        assert len(s["gt_polys"]) == len(s["gt_masks"]) == len(s["gt_class"]) == len(s["is_crowd"]) == n
        for box, cls, mask in zip(s["gt_boxes"], s["gt_class"], s["gt_masks"]):
            x1, y1, x2, y2 = BOXES[cls - 1]   # the class id names the source instance
            ref = [max(x1 - x0, 0), max(y1 - y0, 0), min(x2 - x0, 40), min(y2 - y0, 40)]
            np.testing.assert_array_equal(box, ref)
            assert mask.sum() == (ref[2] - ref[0]) * (ref[3] - ref[1])
        survivors = [c + 1 for c, (x1, y1, x2, y2) in enumerate(BOXES)
                     if min(x2 - x0, 40) > max(x1 - x0, 0) and min(y2 - y0, 40) > max(y1 - y0, 0)]
        assert s["gt_class"].tolist() == survivors


def test_scale_boxes_polygons_masks():
    s = T.Scale(40)(det_sample())   # 80 x 100 -> 40 x 50: both ratios 1/2
    assert s["image"].shape == (40, 50, 3)
    np.testing.assert_allclose(s["gt_boxes"][0], [10, 15, 25, 25])
    np.testing.assert_allclose(s["gt_polys"][0][0], [[10, 15], [25, 15], [25, 25]])
    assert (s["gt_masks"][0] == box_mask(40, 50, (10, 15, 25, 25))).all()
    assert len(s["gt_boxes"]) == 4   # scaling drops nothing


def test_clip_polygon_cases():
    window = (30, 20, 70, 60)
    big = poly(-10, -10, 110, -10, 110, 90, -10, 90)
    clipped = clip_polygon(big, *window)
    assert len(clipped) == 4 and {tuple(v) for v in clipped.tolist()} == {(30, 20), (70, 20), (70, 60), (30, 60)}
    inside = poly(40, 30, 60, 30, 50, 50)
    np.testing.assert_array_equal(clip_polygon(inside, *window), inside)
    assert clip_polygon(poly(0, 0, 10, 0, 10, 10), *window).shape == (0, 2)
    assert clip_polygon(poly(0, 20, 30, 20, 30, 40, 0, 40), *window).shape == (0, 2)  # shares an edge
    # a diamond around the window's corner (30, 20) keeps the quarter inside: area 50 of 200
    diamond = poly(30, 10, 40, 20, 30, 30, 20, 20)
    assert area(clip_polygon(diamond, *window)) == pytest.approx(50)


# ------------------------------------------------------------------ errors and video

def test_missing_or_unsupported_fields_are_one_line_errors():
    no_fields = {"img": coord_image(4, 4), "_rng": np.random.default_rng(0)}
    with pytest.raises(ConfigError, match=r"RandomFlip: the sample declares no fields .*keys: img, _rng"):
        T.RandomFlip()(no_fields)
    only_label = declare({"seg": pattern_label(4, 4), "_rng": np.random.default_rng(0)}, seg="label")
    with pytest.raises(ConfigError, match=r"RandomFlip: the sample declares no image or video field "
                                          r"\(fields: \{'seg': 'label'\}; keys: seg, _rng, _fields\)"):
        T.RandomFlip()(only_label)
    with pytest.raises(ConfigError, match="declares the image field 'img' but has no such key"):
        T.Scale(2)(declare({"image": coord_image(4, 4)}, img="image"))
    video_boxes = declare({"v": np.zeros((2, 8, 8, 3), np.uint8), "b": np.zeros((1, 4), np.float32)},
                          v="video", b="boxes")
    with pytest.raises(ConfigError, match="TenCrop cannot handle the boxes field 'b'"):
        vt.TenCrop(4)(video_boxes)
    with pytest.raises(ConfigError, match="MultiScaleCrop: the sample declares no video field"):
        vt.MultiScaleCrop(4)(seg_sample())
    with pytest.raises(SampleError, match="'img' 10x12, 'seg' 9x12"):
        T.CenterCrop(4)(declare({"img": coord_image(10, 12), "seg": pattern_label(9, 12)},
                                img="image", seg="label"))
    with pytest.raises(ConfigError, match="must be \\[H, W, 3\\] before Normalize"):
        T.Scale(4)(T.Normalize()(seg_sample()))
    with pytest.raises(ConfigError, match="larger than the image"):
        T.CenterCrop(11)(seg_sample(10, 12))
    with pytest.raises(ValueError, match="unknown field kinds"):
        declare({}, x="bbox")


@pytest.mark.parametrize("cfg", [
    {"name": "Scale", "short_size": 0}, {"name": "RandomCrop", "size": 0}, {"name": "CenterCrop", "size": -1},
    {"name": "MultiScaleCrop", "size": 0}, {"name": "ThreeCrop", "size": 0}, {"name": "TenCrop", "size": -2},
    {"name": "RandomFlip", "p": 1.5}, {"name": "RandomFlip", "p": -0.1},
    {"name": "Normalize", "std": [0.2, 0, 0.2]}, {"name": "Normalize", "mean": [0.5, 0.5]},
], ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_bad_constructor_values_fail_at_construction(cfg):
    load_all()
    with pytest.raises(ConfigError, match=cfg["name"]):
        TRANSFORMS.build(cfg)


def test_video_fields_all_move_and_views_stack_once():
    """Two video fields of one sample share the crop; TenCrop counts its views once."""
    frames = coord_image(20, 24)[None].repeat(3, 0)
    s = declare({"a": frames.copy(), "b": frames.copy(), "_rng": np.random.default_rng(3)}, a="video", b="video")
    s = vt.MultiScaleCrop(12)(s)
    assert s["a"].shape == (3, 12, 12, 3) and (s["a"] == s["b"]).all()
    s = vt.TenCrop(8)(s)
    assert s["a"].shape == (30, 8, 8, 3) and s["_num_crops"] == 10 and (s["a"] == s["b"]).all()
    assert Fields(s, "test", kinds=("video",), needs=("video",)).keys("video") == ["a", "b"]
