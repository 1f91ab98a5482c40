"""DeepLabV3: official parameter table and golden outputs, sliding-window and multi-scale evaluation
by hand, losses, recompute, key layouts."""
import json
import os
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from engine.builder import count_params
from engine.components import load_all
from engine.errors import ConfigError
from engine.weights.pretrained import WEIGHTS, detect_layout, load_entry_state, load_state, model_layouts
from models.vision.deeplabv3 import DeepLabV3, segmentation_loss
import ops
from tests.helpers import golden_close as close, golden_stats_close as stats_close

load_all()
DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402

SMALL = {"name": "ResNet", "depth": 18, "output_stride": 16, "multi_grid": [1, 2]}


def table(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def quiet(*_):
    pass


def small(**kw):
    paddle.seed(0)
    m = DeepLabV3(num_classes=3, backbone=dict(SMALL), aspp_channels=16, **kw)
    m.eval()
    return m


# ------------------------------------------------------------------------------ official model
def test_parameter_count_is_the_official_table():
    with paddle.LazyGuard():
        model = DeepLabV3(num_classes=19)
    tab = table("keys_paddleseg_deeplabv3_resnet50_os8_cityscapes.json")
    assert count_params(model) == 39068531 == tab["num_params"]
    # trunk 23,527,264 + ASPP 1x1 (2048*256 + 256 bias + 512 BN) + 3 dilated 3x3 (2048*256*9 + 768 each)
    # + pooling 1x1 (no bias, 2048*256 + 512) + projection (1280*256 + 768) + classifier (256*19 + 19)
    head = (2048 * 256 + 768) + 3 * (2048 * 256 * 9 + 768) + (2048 * 256 + 512) + (1280 * 256 + 768) + 256 * 19 + 19
    assert 23527264 + head == 39068531


@pytest.fixture(scope="module")
def golden_deeplab():
    tab = table("keys_paddleseg_deeplabv3_resnet50_os8_cityscapes.json")
    with paddle.LazyGuard():     # weights come from the golden table: skip the random initialisation
        model = DeepLabV3(num_classes=19)
    report = load_entry_state(model, golden_state_dict(tab["params"]),
                              WEIGHTS.get("deeplabv3_r50vd_os8_cityscapes_80k"), strict=True, log=quiet)
    model.eval()
    return model, report


def test_golden_paddleseg_r50vd_os8(golden_deeplab, op_path_conv):
    model, report = golden_deeplab
    assert report["missing"] == [] and report["unexpected"] == [] and report["loaded"] == 312
    ref = np.load(os.path.join(DATA, "paddleseg_deeplabv3_r50vd_os8.npz"))
    x = paddle.to_tensor(ref["x"])
    with paddle.no_grad():
        feats = model.backbone(x)
        head = model.head_logits(feats)
        aspp = ops.float32(model.aspp(feats[3])).numpy()   # bf16 under bf16 activations
        logits = model.logits(x).numpy()
        label_map = model({"image": x})["label_map"].numpy()
    op_path_conv.check("zoo_conv2d", "zoo_bn_global_act", "zoo_bn_global_add_act")   # eval: BN on running statistics
    close(head.numpy(), ref["head_logit"])
    stats_close(head.numpy(), ref["head_logit.stats"])
    close(aspp[:, :8], ref["aspp_out.slice"])
    stats_close(aspp, ref["aspp_out.stats"])
    for i, f in enumerate(feats):
        close(f.numpy()[:, :8, :8, :8], ref[f"feat{i}.slice"])
        stats_close(f.numpy(), ref[f"feat{i}.stats"])
    assert logits.shape == (1, 19, 128, 128)
    close(logits[:, :8, :32, :32], ref["logits.slice"])
    close(logits[:, :, ::8, ::8], ref["logits.strided"])
    stats_close(logits, ref["logits.stats"])
    top2 = np.sort(logits[0], axis=0)[-2:]
    sure = top2[1] - top2[0] > 1e-3                  # the sidecar: 30 near-tie pixels are informational
    assert sure.sum() > 16000
    if op_path_conv.bf16 or op_path_conv.bf16_act:   # integers: not held to bf16's tolerance; 46 of 16353 flip on AMD
        assert (label_map[0][sure] == ref["logits.argmax"][sure]).mean() >= 0.99
    else:
        np.testing.assert_array_equal(label_map[0][sure], ref["logits.argmax"][sure])


def test_paddleseg_files_are_recognised_by_their_keys():
    """A bare PaddleSeg DeepLabV3 state dict is read in the DeepLabV3 layout and loads strictly; a
    bare PaddleSeg ResNet50_vd backbone file initialises the backbone of a model of any num_classes
    (what tools/train.py does with a file given by path, through engine.weights.pretrained.detect_layout)."""
    full = golden_state_dict(table("keys_paddleseg_deeplabv3_resnet50_os8_cityscapes.json")["params"])
    with paddle.LazyGuard():
        model = DeepLabV3(num_classes=19)
    layout, mapped, _, (found, total) = detect_layout(model, full, model_layouts(model))
    assert layout.name == "deeplabv3_r50vd_os8_cityscapes_80k" and found == total
    assert load_state(model, mapped, strict=True, log=quiet)["loaded"] == 312
    bb = golden_state_dict(table("keys_paddleseg_resnet50_vd_backbone.json")["params"])
    with paddle.LazyGuard():
        model = DeepLabV3(num_classes=5, aux_weight=0.4)
    layout, mapped, _, _ = detect_layout(model, bb, model_layouts(model))
    assert layout.name == "resnet50_vd_ssld_v2_paddleseg"
    rep = load_state(model, mapped, head_keys=layout.head_keys, log=quiet)
    assert rep["loaded"] == 275 and all(not k.startswith("backbone.") for k in rep["missing"])
    with pytest.raises(ConfigError, match="missing"):
        load_state(model, mapped, head_keys=layout.head_keys, strict=True, log=quiet)


def test_fine_tuning_to_other_classes_drops_the_classifier():
    src = small()
    dst = DeepLabV3(num_classes=7, backbone=dict(SMALL), aspp_channels=16, aux_weight=0.4)
    rep = load_state(dst, src.state_dict(), head_keys=DeepLabV3.head_keys, log=quiet)
    assert sorted(rep["dropped_head"]) == ["cls.bias", "cls.weight"]
    assert rep["missing"] and all(k.startswith("aux.") or k.startswith("cls.") for k in rep["missing"])


# ------------------------------------------------------------------------------ evaluation modes
def test_one_window_equals_whole_image_inference():
    x = paddle.randn([2, 3, 40, 56])
    with paddle.no_grad():
        whole = small().logits(x).numpy()
        for crop in ([56, 40], [64, 64]):          # exactly the image, and larger than it
            m = small(slide_crop_size=crop, slide_stride=[16, 16])
            np.testing.assert_array_equal(m.slide_logits(x).numpy(), whole)
            np.testing.assert_array_equal(m({"image": x})["label_map"].numpy(), whole.argmax(1))


@pytest.mark.parametrize("width, x_windows", [(56, [0, 24]), (50, [0, 18])])
def test_overlapping_windows_average_their_logits(width, x_windows):
    """Window [w, h] = [32, 32], stride 24 on a 40 x width image. Rows: ceil((40 - 32) / 24) + 1 = 2
    windows at y = 0 and (24 -> shifted back inside) 8. Columns: for width 56, x = 0 and 24; for width
    50, x = 0 and (24 -> shifted back) 18. Each pixel: the mean of the logits of the windows over it."""
    paddle.seed(3)
    x = paddle.randn([1, 3, 40, width])
    m = small(slide_crop_size=[32, 32], slide_stride=[24, 24])
    total, count = np.zeros([1, 3, 40, width]), np.zeros([40, width])
    with paddle.no_grad():
        for y0 in (0, 8):
            for x0 in x_windows:
                total[:, :, y0:y0 + 32, x0:x0 + 32] += m.logits(x[:, :, y0:y0 + 32, x0:x0 + 32]).numpy()
                count[y0:y0 + 32, x0:x0 + 32] += 1
        got = m.slide_logits(x).numpy()
    assert count.min() == 1 and count.max() == 4 and count[10, 30] == 4
    np.testing.assert_allclose(got, total / count, rtol=1e-5, atol=1e-5)


def test_multi_scale_and_flip_average_the_logits():
    paddle.seed(5)
    x = paddle.randn([1, 3, 36, 44])
    m = small(test_scales=[1.0, 0.5], test_flip=True)
    up = lambda t: F.interpolate(t, [36, 44], mode="bilinear", align_corners=False)  # noqa: E731
    flip = lambda t: paddle.flip(t, axis=[3])  # noqa: E731
    with paddle.no_grad():
        half = F.interpolate(x, [18, 22], mode="bilinear", align_corners=False)     # int(36 * 0.5 + 0.5)
        views = [m.logits(x), flip(m.logits(flip(x))), up(m.logits(half)), up(flip(m.logits(flip(half))))]
        expect = sum(v.numpy() for v in views) / 4
        got = m.predict_logits(x).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    assert np.abs(views[0].numpy() - views[1].numpy()).max() > 1e-3   # the flip is not a no-op


def test_bad_settings():
    with pytest.raises(ConfigError, match="slide_stride"):
        DeepLabV3(num_classes=3, backbone=dict(SMALL), slide_crop_size=[32, 32], slide_stride=[48, 16])
    with pytest.raises(ConfigError, match="output stride 32"):
        DeepLabV3(num_classes=3, backbone={"name": "ResNet", "depth": 18})
    with pytest.raises(ConfigError, match="loss"):
        DeepLabV3(num_classes=3, backbone=dict(SMALL), loss="dice")
    with pytest.raises(ConfigError, match="out_indices"):
        DeepLabV3(num_classes=3, backbone=dict(SMALL, out_indices=[3]))


# ------------------------------------------------------------------------------ training
def test_loss_ignores_pixels_and_ohem_keeps_the_hard_ones():
    # 3 pixels, 2 classes: logits (2, 0) label 0: p = e^2/(e^2+1); (0, 0) label 1: p = 1/2; (1, 3) ignored
    logits = paddle.to_tensor([[[[2.0, 0.0, 1.0]], [[0.0, 0.0, 3.0]]]])
    label = paddle.to_tensor([[[0, 1, 255]]])
    ce1, ce2 = np.log1p(np.exp(-2.0)), np.log(2.0)
    assert segmentation_loss(logits, label).item() == pytest.approx((ce1 + ce2) / 2, rel=1e-6)
    # OHEM, threshold 0.7, keep at least 1: only the pixel with p = 0.5 < 0.7 counts (p = 0.88 does not)
    assert segmentation_loss(logits, label, ohem_thresh=0.7, ohem_min_kept=1).item() == pytest.approx(ce2, rel=1e-6)
    # threshold 0.3 but min_kept 1: the threshold rises to the 1st smallest p (0.5); p < 0.5 is nobody
    assert segmentation_loss(logits, label, ohem_thresh=0.3, ohem_min_kept=1).item() == pytest.approx(0.0, abs=1e-7)
    assert segmentation_loss(logits, paddle.full([1, 1, 3], 255, "int64")).item() == 0.0


def test_train_step_with_aux_head():
    m = small(aux_weight=0.4)
    m.train()
    x, label = paddle.randn([2, 3, 48, 48]), paddle.randint(0, 3, [2, 48, 48])
    out = m({"image": x, "label": label})
    assert set(out) == {"loss", "loss_seg", "loss_aux"}
    assert out["loss"].item() == pytest.approx(out["loss_seg"].item() + 0.4 * out["loss_aux"].item(), rel=1e-6)
    out["loss"].backward()
    assert m.aux.cls.weight.grad is not None and m.cls.weight.grad is not None


def test_recompute_gives_the_same_gradients_and_bn_statistics():
    paddle.seed(0)
    plain = DeepLabV3(num_classes=3, backbone=dict(SMALL), aspp_channels=16, dropout=0.0)
    remat = DeepLabV3(num_classes=3, backbone=dict(SMALL, recompute=True), aspp_channels=16, dropout=0.0)
    remat.set_state_dict(plain.state_dict())
    calls = []
    remat.backbone.layer3.register_forward_pre_hook(lambda *_: calls.append(1))
    x, label = paddle.randn([2, 3, 64, 64]), paddle.randint(0, 3, [2, 64, 64])
    for m in (plain, remat):
        m.train()
        m({"image": x, "label": label})["loss"].backward()
    assert len(calls) == 2                       # forward, then again inside backward
    grads = {n: p.grad.numpy() for n, p in plain.named_parameters() if not p.stop_gradient}
    assert len(grads) > 60
    for n, p in remat.named_parameters():
        if p.stop_gradient:
            continue
        np.testing.assert_allclose(p.grad.numpy(), grads[n], rtol=1e-5, atol=1e-6, err_msg=n)
    ours, theirs = remat.state_dict(), plain.state_dict()
    for k in ours:                               # BN running statistics updated once, not twice
        np.testing.assert_array_equal(ours[k].numpy(), theirs[k].numpy(), err_msg=k)


def test_recompute_under_data_parallel(tmp_path):
    """2 processes (gloo): paddle's reentrant recompute fails inside DataParallel's gradient reducer;
    the backbone's recompute gives the gradients of a plain step, the same on both ranks."""
    import subprocess
    from tests.helpers import golden_close as close, golden_stats_close as stats_close, ENV, ROOT
    proc = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                           "--log_dir", str(tmp_path / "log"), os.path.join(ROOT, "tests", "dp_recompute_worker.py"),
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    logs = "".join(open(tmp_path / "log" / f).read()[-2000:] for f in os.listdir(tmp_path / "log")
                   if f.startswith("workerlog")) if (tmp_path / "log").is_dir() else proc.stderr
    assert proc.returncode == 0, logs
    for rank in (0, 1):
        got = json.load(open(tmp_path / f"rank{rank}.json"))
        assert got["num_grads"] == 3 + 8 * 2 * 3 + 4 * 3, got   # stem, 8 blocks x 2 conv + BN, 4 shortcuts
        assert got["ranks_agree"] and got["max_diff"] <= 1e-6, got
