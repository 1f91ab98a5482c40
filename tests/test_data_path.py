"""Image and video batches leave the DataLoader workers as uint8 and are normalised in the model's
input, on its device (Normalize's default `in_main_process: true` + models.pixels.as_float): the same
numbers as normalising in the workers (today's float32 path), padding included, for one batch of each
of the TSN, StNet, DeepLabV3 and Mask R-CNN recipes, and a quarter of the bytes between processes."""
import glob
import os

import numpy as np
import paddle
import pytest

from engine import config
from engine.components import load_all
from engine.data import collate, finalize
from deploy.predictor import normalize_batch
from engine.errors import ConfigError
from engine.registry import COLLATES, TRANSFORMS
from models.pixels import as_float
from models.video.stnet import StNet
from models.vision.deeplabv3 import DeepLabV3
from readers import transforms as T
from readers.fields import declare
from tests.helpers import ROOT

load_all()


def _sample(imgs, **meta):
    s = {"imgs": imgs, "label": np.int64(1), **meta}
    declare(s, imgs="video")
    return s


# ------------------------------------------------------------------ one batch of each recipe

# recipe, pixel key, split, batch size, one sample's source pixels (video: frames [N, H, W, 3]; image:
# [H, W, 3], two aspect ratios so that Mask R-CNN's batch pads) and the reader's bookkeeping
RECIPES = {
    "tsn": ("configs/video/tsn/tsn_r50_100e_k400.yaml", "imgs", 3),
    "stnet": ("configs/video/stnet/stnet_r50_60e_k400.yaml", "imgs", 2),
    "deeplabv3": ("configs/vision/deeplabv3/deeplabv3_r50vd_os8_80k_cityscapes.yaml", "image", 2),
    "mask_rcnn": ("configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml", "image", 2),
}


def _raw(name, i, rng, full=False):
    if name == "tsn":        # 3 segments of 1 frame, 340x256 (Kinetics as prepared)
        return _sample(rng.integers(0, 256, (3, 256, 340, 3), dtype=np.uint8), _num_seg=3, _seglen=1)
    if name == "stnet":      # 7 segments x seglen 5
        return _sample(rng.integers(0, 256, (35, 256, 340, 3), dtype=np.uint8), _num_seg=7, _seglen=5)
    if name == "deeplabv3":  # the test: smaller than Cityscapes' 1024x2048 (cheaper); crops pad them
        h, w = (1024, 2048) if full else (256, 512)
        s = {"image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
             "label": rng.integers(0, 19, (h, w), dtype=np.uint8)}   # the reader's uint8
        return declare(s, image="image", label="label")
    h, w = ((480, 640), (640, 480))[i % 2] if full else ((300, 400), (400, 300))[i % 2]   # Mask R-CNN
    s = {"image": rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
         "gt_boxes": np.array([[10, 20, 100, 120]], np.float32), "gt_classes": np.array([3], np.int64),
         "gt_crowd": np.zeros(1, np.int32), "orig_size": np.array([h, w], np.int64)}
    return declare(s, image="image", gt_boxes="boxes")


def _batch(name, in_main_process, n=None, full=False):
    path, key, small = RECIPES[name]
    cfg = config.load(os.path.join(ROOT, path))
    reader = cfg["reader"]["train"]
    transforms = []
    for t in reader["transforms"]:
        t = dict(t)
        if t["name"] == "Normalize" and in_main_process is not None:
            t["in_main_process"] = in_main_process
        transforms.append(TRANSFORMS.build(t))
    samples = []
    for i in range(n or small):
        s = _raw(name, i, np.random.default_rng(i), full)
        s.update(index=np.int64(i), _rng=np.random.default_rng(100 + i))
        for t in transforms:
            s = t(s)
        samples.append(s)
    normalize = next(t for t in reader["transforms"] if t["name"] == "Normalize")
    return collate_fn(reader)(samples), key, normalize


def collate_fn(reader):
    return COLLATES.build(reader.get("collate") or {"name": "Stack"})


def nbytes(batch):
    """What a worker hands over: the bytes of the batch's arrays (metadata lists are a few hundred bytes)."""
    total = 0
    for v in batch.values():
        for a in (v if isinstance(v, list) else [v]):
            total += a.nbytes if isinstance(a, np.ndarray) else 0
    return total


def by_hand(pixels, mean, std, size=None):
    """numpy float64 (x/255 - mean) / std of uint8 [B, ..., C, H, W], channel c = 3 * frame + rgb;
    0.0 outside each image's height and width (`size`), as PadImages' 0 on float32 pixels."""
    c = np.arange(pixels.shape[-3]) % 3
    out = (pixels / 255.0 - np.asarray(mean)[c][:, None, None]) / np.asarray(std)[c][:, None, None]
    for i, (h, w) in enumerate(size if size is not None else []):
        out[i, ..., h:, :] = 0.0
        out[i, ..., :, w:] = 0.0
    return out


@pytest.mark.parametrize("name", list(RECIPES))
def test_uint8_batches_normalise_on_the_device_as_the_workers_did(name):
    old, key, norm = _batch(name, in_main_process=False)     # today's path: float32 from the workers
    new, _, _ = _batch(name, in_main_process=None)           # the recipe as is: uint8 by default
    assert old[key].dtype == np.float32 and new[key].dtype == np.uint8 and old[key].shape == new[key].shape
    assert sorted(new) == sorted(list(old) + [key + "_normalize"])
    mean, std = norm.get("mean", T.IMAGENET_MEAN), norm.get("std", T.IMAGENET_STD)
    size = new.get(key + "_size")
    hand = by_hand(new[key], mean, std, size)
    on_device = as_float(finalize(new), key).numpy()           # what the model's forward computes
    np.testing.assert_allclose(old[key], hand, rtol=0, atol=1e-6)
    np.testing.assert_allclose(on_device, hand, rtol=0, atol=1e-6)
    np.testing.assert_allclose(on_device, old[key], rtol=0, atol=1e-6)
    if name == "mask_rcnn":   # padded to a multiple of 32: 0.0 there in both paths
        assert size.tolist() != [list(new[key].shape[-2:])] * len(size)
        (h, w) = size[0]
        assert (old[key][0, :, h:, :] == 0).all() and (on_device[0, :, h:, :] == 0).all()
        assert (on_device[0, :, :, w:] == 0).all() and (old[key][0, :, :, w:] == 0).all()
    # the exported-model predictor's host path (deploy/predictor.py) agrees too
    np.testing.assert_allclose(normalize_batch(new[key], new[key + "_normalize"], size), hand, rtol=0, atol=1e-6)
    # bytes between processes: the pixels shrink from 4 bytes to 1, everything else is the same
    pixels = int(np.prod(new[key].shape))
    assert nbytes(old) - nbytes(new) == 3 * pixels
    if name == "deeplabv3":   # + label uint8 [B, H, W] (1 byte a pixel, = 1/3 of the RGB bytes) + index
        assert nbytes(new) == pixels + pixels // 3 + 16 and nbytes(old) == 4 * pixels + pixels // 3 + 16
        # before: float32 pixels and int32 labels, 4 + 4/3 bytes a pixel against 1 + 1/3 now
        assert (4 * pixels + 4 * pixels // 3 + 16) / nbytes(new) == pytest.approx(4.0, rel=1e-4)
    else:
        assert 3.9 < nbytes(old) / nbytes(new) <= 4.0


def test_bytes_per_tsn_batch_by_hand():
    """The TSN recipe's train batch of 3 clips: 3 x 3 segments x 3 x 224 x 224 pixels = 1,354,752 bytes
    as uint8, 5,419,008 as float32; besides them only `label` and `index` (int64 [3]: 24 bytes each)."""
    old, _, _ = _batch("tsn", in_main_process=False)
    new, _, _ = _batch("tsn", in_main_process=None)
    assert nbytes(new) == 1_354_752 + 48 and nbytes(old) == 5_419_008 + 48   # ratio 3.9999


def test_every_image_and_video_recipe_hands_over_uint8():
    """Every Normalize of every recipe (full and demo, train/val/test) keeps the pixels uint8, and so
    does a config of one's own that lists `{name: Normalize}`."""
    seen = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        if "_base_" in path:
            continue
        cfg = config.load(path)
        for split, reader in (cfg.get("reader") or {}).items():
            for t in reader.get("transforms") or []:
                if t["name"] == "Normalize":
                    assert TRANSFORMS.build(dict(t)).in_main_process, f"{path} reader.{split}"
                    seen += 1
    assert seen >= 25
    assert TRANSFORMS.build({"name": "Normalize"}).in_main_process


# ------------------------------------------------------------------ the models read either

def test_stnet_and_deeplabv3_predict_alike_on_uint8_and_float_batches():
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (2 * 3, 32, 32, 3), dtype=np.uint8)   # 2 segments x seglen 3
    paddle.seed(0)
    model = StNet(num_classes=5, seglen=3, backbone={"name": "ResNet", "depth": 18, "base_channels": 8})
    model.eval()
    outs = []
    for late in (False, True):
        b = collate([T.Normalize(in_main_process=late)(_sample(frames.copy(), _num_seg=2, _seglen=3))])
        outs.append(model(finalize(b))["logits"].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)

    paddle.seed(0)
    seg = DeepLabV3(num_classes=3, backbone={"name": "ResNet", "depth": 18, "output_stride": 16,
                                             "multi_grid": [1, 2]}, aspp_channels=16)
    seg.eval()
    pad = COLLATES.build({"name": "PadImages", "keys": {"image": 0, "label": 255}})
    images = [rng.integers(0, 256, (h, 40, 3), dtype=np.uint8) for h in (40, 24)]
    logits, maps = [], []
    for late in (False, True):
        b = pad([T.Normalize(in_main_process=late)(declare(
            {"image": im.copy(), "label": np.zeros(im.shape[:2], np.int64)}, image="image", label="label"))
            for im in images])
        batch = finalize(b)
        logits.append(seg.logits(as_float(batch, "image")).numpy())
        maps.append(seg(batch)["label_map"].numpy())   # the eval forward normalises uint8 itself
    assert maps[0].shape == (2, 40, 40) and (maps[1] == maps[0]).all()
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def test_bad_inputs_say_what_is_missing():
    with pytest.raises(ConfigError, match="in_main_process needs uint8 pixels in 'imgs'"):
        T.Normalize()(_sample(np.zeros((2, 4, 4, 3), np.float32)))
    with pytest.raises(ConfigError, match="imgs_normalize"):
        as_float({"imgs": paddle.zeros([1, 2, 3, 4, 4], "uint8")}, "imgs")
    f32 = paddle.zeros([1, 3, 4, 4], "float32")
    assert as_float({"image": f32}, "image") is f32                # float input passes untouched


if __name__ == "__main__":
    # The bytes of one train batch at each full recipe's batch size and input size (Kinetics 340x256,
    # Cityscapes 2048x1024, COCO 640x480): python tests/test_data_path.py
    for name in RECIPES:
        cfg = config.load(os.path.join(ROOT, RECIPES[name][0]))
        n = cfg["reader"]["train"]["batch_size"]
        old, key, _ = _batch(name, False, n, full=True)
        new, _, _ = _batch(name, None, n, full=True)
        print(f"{name:10s} batch {n:2d} {key} {list(new[key].shape)}: float32 {nbytes(old) / 1e6:8.2f} MB, "
              f"uint8 {nbytes(new) / 1e6:8.2f} MB, ratio {nbytes(old) / nbytes(new):.2f}")
