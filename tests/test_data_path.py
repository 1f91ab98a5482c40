"""Video batches leave the DataLoader workers as uint8 and are normalised in the main process
(Normalize `in_main_process: true` + models.video.clips.as_float): same numbers as normalising in the
workers, a quarter of the bytes between processes."""
import numpy as np
import paddle
import pytest

from engine.data import collate
from engine.errors import ConfigError
from models.video.clips import as_float
from models.video.stnet import StNet
from readers import transforms as T
from readers.fields import declare


def _sample(imgs, **meta):
    s = {"imgs": imgs, "label": np.int64(1), **meta}
    declare(s, imgs="video")
    return s


def test_uint8_batches_normalised_in_the_main_process_equal_worker_normalisation():
    rng = np.random.default_rng(0)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    frames = [rng.integers(0, 256, (3 * 2, 8, 10, 3), dtype=np.uint8) for _ in range(2)]  # 3 segments x seglen 2
    ref = collate([T.Normalize(mean, std)(_sample(f.copy(), _num_seg=3, _seglen=2)) for f in frames])
    late = collate([T.Normalize(mean, std, in_main_process=True)(_sample(f.copy(), _num_seg=3, _seglen=2))
                    for f in frames])
    assert late["imgs"].dtype == np.uint8 and late["imgs"].shape == ref["imgs"].shape == (2, 3, 6, 8, 10)
    assert late["imgs"].nbytes * 4 == ref["imgs"].nbytes
    batch = {"imgs": paddle.to_tensor(late["imgs"]), "imgs_normalize": late["imgs_normalize"]}
    out = as_float(batch).numpy()
    # by hand for one pixel: segment 1, frame 1 of the segment, blue (channel 3 * 1 + 2)
    px = frames[1][1 * 2 + 1, 4, 7, 2]
    assert out[1, 1, 5, 4, 7] == pytest.approx((px / 255.0 - 0.3) / 0.3, abs=1e-5)
    np.testing.assert_allclose(out, ref["imgs"], rtol=1e-6, atol=1e-6)
    f32 = paddle.to_tensor(ref["imgs"])
    assert as_float({"imgs": f32}) is f32                       # float input passes untouched


def test_stnet_trains_alike_on_uint8_and_float_batches():
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (2 * 3, 32, 32, 3), dtype=np.uint8)   # 2 segments x seglen 3
    paddle.seed(0)
    model = StNet(num_classes=5, seglen=3, backbone={"name": "ResNet", "depth": 18, "base_channels": 8})
    model.eval()
    outs = []
    for late in (False, True):
        b = collate([T.Normalize(in_main_process=late)(_sample(frames.copy(), _num_seg=2, _seglen=3))])
        batch = {"imgs": paddle.to_tensor(b["imgs"]), "label": paddle.to_tensor(b["label"])}
        if late:
            batch["imgs_normalize"] = b["imgs_normalize"]
        outs.append(model(batch)["logits"].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_bad_inputs_say_what_is_missing():
    with pytest.raises(ConfigError, match="in_main_process needs uint8 pixels in 'imgs'"):
        T.Normalize(in_main_process=True)(_sample(np.zeros((2, 4, 4, 3), np.float32)))
    with pytest.raises(ConfigError, match="imgs_normalize"):
        as_float({"imgs": paddle.zeros([1, 2, 3, 4, 4], "uint8")})
