"""ResNet backbone, TSN and StNet: sizes, key maps against the kits' tables, golden outputs, training."""
import json
import os
import sys

import numpy as np
import paddle
import pytest

from engine.builder import count_params
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry, load_entry_state, map_keys
from models.video.stnet import StNet, inflate_conv1, stnet_fluid_key_map
from models.video.tsn import TSN
from models.vision.resnet import ResNet, build_backbone, kit_block_name, resnet_key_map
from tests.helpers import golden_close as close, golden_stats_close as stats_close, gradients_with_and_without

DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402


def table(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


def golden(name):
    return np.load(os.path.join(DATA, name))


def quiet(*_):
    pass


# ----------------------------------------------------------------------------------- sizes
def test_parameter_counts():
    with paddle.LazyGuard():
        tsn = TSN(num_classes=400)
        trunk_b = ResNet(depth=50, variant="b")
        trunk_d = ResNet(depth=50, variant="d", output_stride=8, multi_grid=[1, 2, 4])
        stnet = StNet(num_classes=400, seglen=5)
    assert count_params(tsn) == 24327632 == table("keys_paddlevideo_tsn_r50_k400.json")["num_params"]
    assert count_params(trunk_b) == 23508032
    assert count_params(tsn) == 23508032 + 2048 * 400 + 400
    # the PaddleSeg table holds the bare trunk only: vd stem (3x3 convs 3->32->32->64) replaces the 7x7
    assert count_params(trunk_d) == 23527264 == table("keys_paddleseg_resnet50_vd_backbone.json")["num_params"]
    assert 23527264 - 23508032 == (3 * 32 + 32 * 32 + 32 * 64) * 9 + 2 * (32 + 32 + 64) - (3 * 64 * 49 + 2 * 64)

    trunk15 = 23508032 + (15 - 3) * 64 * 7 * 7           # conv1 on 5 stacked RGB frames
    temporal1 = 512 * 512 * 3 + 512 + 2 * 512            # conv3d (3,1,1) + bias, BN3D scale/shift
    temporal2 = 1024 * 1024 * 3 + 1024 + 2 * 1024
    xception = (2 * 2048                                 # BN in
                + 2048 * 3 + 2048                        # depthwise (3,1) + bias
                + 2048 * 1024 + 1024                     # 1x1 -> 1024 + bias
                + 2 * 1024                               # BN + ReLU
                + 1024 * 3 + 1024                        # depthwise (3,1) + bias
                + 1024 * 1024 + 1024                     # 1x1 -> 1024 + bias
                + 2048 * 1024 + 1024                     # skip 1x1 -> 1024 + bias
                + 2 * 1024)                              # BN out
    fc = 1024 * 400 + 400                                # the fc follows the 1024-channel Xception
    assert count_params(stnet) == trunk15 + temporal1 + temporal2 + xception + fc == 33158864
    for name in ("tsn_r50_k400_3seg", "tsn_r50_k400_8seg", "tsn_r50_imagenet_init"):
        assert WEIGHTS.get(name).num_params == count_params(tsn)
    for name in ("stnet_r50_imagenet_init", "stnet_r50_k400_fluid"):
        assert WEIGHTS.get(name).num_params == count_params(stnet)


def test_depths_and_registry():
    for depth, channels in ((18, 512), (34, 512), (101, 2048), (152, 2048)):
        with paddle.LazyGuard():
            m = build_backbone({"name": "ResNet", "depth": depth, "out_indices": [0, 3]})
        assert m.out_channels == [channels // 8, channels]
    assert MODELS.get("ResNet") is ResNet and MODELS.get("TSN") is TSN and MODELS.get("StNet") is StNet
    x = paddle.randn([1, 3, 64, 64])
    feats = ResNet(depth=18, output_stride=8, out_indices=[0, 1, 2, 3])(x)
    assert [list(f.shape) for f in feats] == [[1, 64, 16, 16], [1, 128, 8, 8], [1, 256, 8, 8], [1, 512, 8, 8]]
    assert ResNet(depth=18, num_classes=7)(x).shape == [1, 7]
    assert kit_block_name(101, 2, 0) == "res4a" and kit_block_name(101, 2, 22) == "res4b22"
    assert kit_block_name(50, 2, 5) == "res4f"


def test_bad_configs_raise():
    with pytest.raises(ConfigError, match="depth 42"):
        ResNet(depth=42)
    with pytest.raises(ConfigError, match="multi_grid"):
        ResNet(depth=18, multi_grid=[1, 2, 4])
    with pytest.raises(ConfigError, match="name"):
        TSN(backbone={"depth": 18})
    with pytest.raises(ConfigError, match="in_channels"):
        StNet(seglen=5, backbone={"name": "ResNet", "depth": 18, "in_channels": 3})
    with pytest.raises(ConfigError, match="channels per segment"):
        StNet(seglen=2, backbone={"name": "ResNet", "depth": 18})({"imgs": paddle.zeros([1, 3, 3, 32, 32])})
    with pytest.raises(ConfigError, match="not a multiple"):
        m = TSN(num_classes=4, backbone={"name": "ResNet", "depth": 18}, num_views=2)
        m.eval()
        m({"imgs": paddle.zeros([1, 3, 3, 32, 32])})


# ------------------------------------------------------------------------- key tables + golden
def test_tsn_golden_paddlevideo(op_path_conv):
    params = table("keys_paddlevideo_tsn_r50_k400.json")["params"]
    with paddle.LazyGuard():     # weights come from the golden table: skip the random initialisation
        model = TSN(num_classes=400)
    report = load_entry_state(model, golden_state_dict(params), WEIGHTS.get("tsn_r50_k400_3seg"), log=quiet)
    model.eval()
    assert report["missing"] == [] and report["unexpected"] == [] and report["loaded"] == 267
    ref = golden("paddlevideo_tsn_r50.npz")
    x = paddle.to_tensor(ref["x"])  # [1, 3 segments, 3, 64, 64]
    with paddle.no_grad():
        out = model({"imgs": x})
        seg = model.segment_features(x.unsqueeze(1))[0, 0]
        feat = model.backbone(x.reshape([3, 3, 64, 64]))[-1].numpy()
    op_path_conv.check("zoo_conv2d", "zoo_bn_global_act", "zoo_bn_global_add_act")   # eval: BN on running statistics
    close(out["logits"].numpy(), ref["logits"])
    close(seg.numpy(), ref["seg_pooled_feat"])
    close(feat[:, :8], ref["backbone_feat.slice"])
    stats_close(feat, ref["backbone_feat.stats"])
    np.testing.assert_allclose(out["probs"].numpy().sum(-1), 1.0, rtol=1e-5)


def test_resnet50_vd_golden_paddleseg(op_path_conv):
    params = table("keys_paddleseg_resnet50_vd_backbone.json")["params"]
    with paddle.LazyGuard():
        model = ResNet(depth=50, variant="d", output_stride=8, multi_grid=[1, 2, 4], out_indices=[0, 1, 2, 3])
    report = load_entry_state(model, golden_state_dict(params), WEIGHTS.get("resnet50_vd_ssld_v2_paddleseg"),
                              log=quiet)
    model.eval()
    assert report["missing"] == [] and report["unexpected"] == [] and report["loaded"] == 275
    ref = golden("paddleseg_resnet50_vd_backbone.npz")
    with paddle.no_grad():
        feats = [f.numpy() for f in model(paddle.to_tensor(ref["x"]))]
    op_path_conv.check("zoo_conv2d")
    assert [f.shape[1:] for f in feats] == [(256, 16, 16), (512, 8, 8), (1024, 8, 8), (2048, 8, 8)]
    for i, f in enumerate(feats):
        close(f[:, :16, :8, :8], ref[f"feat{i}.slice"])
        close(f.mean((0, 2, 3)), ref[f"feat{i}.chan_mean"])
        stats_close(f, ref[f"feat{i}.stats"])


def test_resnet50_frozen_golden_ppdet(op_path_conv):
    """The Mask R-CNN trunk: PaddleDetection names, freeze_at 0 (= frozen_stages 1), frozen BN."""
    tab = table("keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json")
    model = ResNet(depth=50, out_indices=[0, 1, 2, 3], frozen_stages=1, freeze_norm=True)
    model.eval()
    entry = PretrainedEntry(name="ppdet-trunk", model="ResNet", urls=[],
                            key_map=resnet_key_map("ppdet", 50, "b", src_prefix=r"backbone\."),
                            ignore_keys=[r"(?!backbone\.).*"])
    report = load_entry_state(model, golden_state_dict(tab["params"]), entry, log=quiet)
    assert report["missing"] == [] and report["unexpected"] == [] and report["loaded"] == 265
    trainable = sum(int(np.prod(shape)) for key, shape, _, train in tab["params"]
                    if key.startswith("backbone.") and train)
    assert count_params(model) == trainable == 23232512
    ref = golden("ppdet_mask_rcnn_r50_fpn.npz")
    with paddle.no_grad():
        feats = [f.numpy() for f in model(paddle.to_tensor(ref["image"]))]
    op_path_conv.check("zoo_conv2d")
    for i, f in enumerate(feats):
        close(f[:, :8, :8, :8], ref[f"backbone.res{i + 2}.slice"])
        stats_close(f, ref[f"backbone.res{i + 2}.stats"])


def test_fluid_stnet_key_map_is_a_bijection():
    rules = stnet_fluid_key_map(50)
    with paddle.LazyGuard():
        own = set(StNet(num_classes=400, seglen=5).state_dict())
    # the Fluid rules are literal names: their sources are the file's expected keys
    sources = [pattern.replace("\\", "") for pattern, _ in rules]
    entry = WEIGHTS.get("stnet_r50_k400_fluid")
    mapped, ignored = map_keys({k: 0 for k in sources}, entry)
    assert not ignored and set(mapped) == own and len(sources) == len(own)
    for landmark, ours in (("conv1_weights", "backbone.stem.0.conv.weight"),
                           ("bn_conv1_scale", "backbone.stem.0.bn.weight"),
                           ("bn4a_branch1_variance", "backbone.layer3.0.short.bn._variance"),
                           ("res5c_branch2c_weights", "backbone.layer4.2.conv2.conv.weight"),
                           ("batch_norm_24.w_1", "temporal1.bn._mean"),
                           ("batch_norm_44.w_2", "temporal2.bn._variance"),
                           ("conv3d_1.b_0", "temporal2.conv.bias"),
                           ("xception_att_conv.w_0", "xception.dw1.weight"),
                           ("xception_dw.b_0", "xception.skip.bias"),
                           ("fc_0.w_0", "fc.weight")):
        assert map_keys({landmark: 0}, entry)[0] == {ours: 0}


# ----------------------------------------------------------------------------------- training
def _grads_ok(model):
    for name, p in model.named_parameters():
        if not p.stop_gradient:
            assert p.grad is not None, name
            assert np.isfinite(p.grad.numpy()).all(), name
    return True


def test_tsn_train_step_and_views():
    paddle.seed(0)
    model = TSN(num_classes=5, backbone={"name": "ResNet", "depth": 18}, num_views=2)
    model.train()
    batch = {"imgs": paddle.randn([2, 3, 3, 32, 32]), "label": paddle.to_tensor([1, 4], dtype="int64")}
    loss = model(batch)["loss"]
    assert np.isfinite(loss.item())
    loss.backward()
    assert _grads_ok(model)
    with pytest.raises(ConfigError, match="views"):
        model({"imgs": paddle.randn([1, 2, 3, 3, 32, 32]), "label": batch["label"][:1]})

    model.eval()
    views = paddle.randn([2, 2, 3, 3, 32, 32])  # [B, V, T, C, H, W]
    with paddle.no_grad():
        out6 = model({"imgs": views})
        out5 = model({"imgs": views.reshape([2, 6, 3, 32, 32])})  # num_views=2, view-major
        per_view = [model({"imgs": views[:, v:v + 1]}) for v in range(2)]
        model.view_average = "feature"
        feat_avg = model({"imgs": views})
    assert out6["logits"].shape == [2, 5] and out6["probs"].shape == [2, 5]
    np.testing.assert_allclose(out5["probs"].numpy(), out6["probs"].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out6["probs"].numpy(), (per_view[0]["probs"] + per_view[1]["probs"]).numpy() / 2,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out6["logits"].numpy(),
                               (per_view[0]["logits"] + per_view[1]["logits"]).numpy() / 2, rtol=1e-5, atol=1e-5)
    all_segments = model({"imgs": views.reshape([2, 1, 6, 3, 32, 32])})  # 6 segments, one view
    np.testing.assert_allclose(feat_avg["logits"].numpy(), all_segments["logits"].numpy(), rtol=1e-5, atol=1e-5)


def test_stnet_train_step_and_views():
    paddle.seed(0)
    model = StNet(num_classes=5, seglen=2, backbone={"name": "ResNet", "depth": 18})
    model.train()
    batch = {"imgs": paddle.randn([2, 3, 6, 32, 32]), "label": paddle.to_tensor([[0], [3]], dtype="int64")}
    loss = model(batch)["loss"]
    assert np.isfinite(loss.item())
    loss.backward()
    assert _grads_ok(model)
    model.eval()
    views = paddle.randn([2, 2, 3, 6, 32, 32])
    with paddle.no_grad():
        out = model({"imgs": views})
        one = model({"imgs": views[:, 1]})
    assert out["probs"].shape == [2, 5] and one["probs"].shape == [2, 5]
    np.testing.assert_allclose(out["probs"].numpy().sum(-1), 1.0, rtol=1e-5)


def test_stnet_recompute_gives_the_same_gradients_and_bn_statistics():
    paddle.seed(0)
    model = StNet(num_classes=5, seglen=2, backbone={"name": "ResNet", "depth": 18})
    batch = {"imgs": paddle.randn([2, 3, 6, 32, 32]), "label": paddle.to_tensor([[0], [3]], dtype="int64")}
    start = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    stats = {}

    def switch(m, on):
        if on:   # each step from the same running statistics
            stats[False] = {k: v.numpy().copy() for k, v in m.state_dict().items() if "_mean" in k or "_variance" in k}
            m.set_state_dict(start)
        m.backbone.recompute = on

    (loss_a, ga, calls_a), (loss_b, gb, calls_b) = gradients_with_and_without(model, switch, batch,
                                                                              model.backbone.stages[2])
    assert (calls_a, calls_b) == (1, 2) and loss_a == loss_b and ga.keys() == gb.keys()
    for k in ga:
        np.testing.assert_allclose(ga[k], gb[k], rtol=1e-5, atol=1e-7, err_msg=k)
    # the stage run again in backward does not fold the batch into BN's running statistics twice
    after = {k: v.numpy() for k, v in model.state_dict().items() if k in stats[False]}
    assert stats[False] and all(np.array_equal(after[k], stats[False][k]) for k in after)
    assert any(not np.array_equal(after[k], start[k]) for k in after)   # and they did move, once


def test_stnet_multi_view_output_is_the_view_average():
    """Views (crops, clips) are separate videos to the temporal blocks and the Xception; the eval output
    is their softmax averaged, whether the batch is [B, V, T, C, H, W] or [B, V*T, C, H, W] with
    num_views=V (view-major, as the reader stacks them)."""
    paddle.seed(0)
    model = StNet(num_classes=5, seglen=2, backbone={"name": "ResNet", "depth": 18}, num_views=3)
    model.eval()
    views = paddle.randn([2, 3, 4, 6, 32, 32])  # [B, V, T, 3*seglen, H, W]
    with paddle.no_grad():
        out6 = model({"imgs": views})
        out5 = model({"imgs": views.reshape([2, 12, 6, 32, 32])})
        per_view = [model({"imgs": views[:, v:v + 1]}) for v in range(3)]
    probs = np.stack([p["probs"].numpy() for p in per_view])          # [V, B, C]
    logits = np.stack([p["logits"].numpy() for p in per_view])
    assert np.abs(probs[0] - probs[1]).max() > 1e-3      # the views do differ: the average is not trivial
    assert out6["probs"].shape == [2, 5] and out6["logits"].shape == [2, 5]
    np.testing.assert_allclose(out6["probs"].numpy(), probs.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out6["logits"].numpy(), logits.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out5["probs"].numpy(), out6["probs"].numpy(), rtol=1e-5, atol=1e-6)
    # probabilities are averaged, not the logits before one softmax
    z = logits.mean(0)
    softmax_of_mean = np.exp(z - z.max(-1, keepdims=True))
    softmax_of_mean /= softmax_of_mean.sum(-1, keepdims=True)
    assert np.abs(softmax_of_mean - probs.mean(0)).max() > 1e-4


def test_stnet_temporal_block_sees_time():
    """The conv3d mixes neighbouring segments only: changing the last segment leaves the first alone."""
    paddle.seed(1)
    block = StNet(num_classes=2, seglen=1, backbone={"name": "ResNet", "depth": 18}).temporal1
    block.eval()
    x = paddle.randn([4, 128, 2, 2])  # one video, 4 segments
    y = x.clone()
    y[3] = y[3] + 1.0
    with paddle.no_grad():
        a, b = block(x, 4).numpy(), block(y, 4).numpy()
    np.testing.assert_allclose(a[:2], b[:2], rtol=1e-6)
    assert np.abs(a[2] - b[2]).max() > 1e-3


# ------------------------------------------------------------------------ conv1 inflation
def test_conv1_inflation_numerics():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 7, 7)).astype("float32")
    frame = rng.standard_normal((1, 3, 16, 16)).astype("float32")
    inflated = inflate_conv1(w, seglen=5)
    assert inflated.shape == (8, 15, 7, 7)
    conv = paddle.nn.functional.conv2d
    stacked = paddle.to_tensor(np.concatenate([frame] * 5, axis=1))  # 5 identical frames
    out15 = conv(stacked, paddle.to_tensor(inflated), padding=3).numpy()
    grey = np.repeat(frame.mean(axis=1, keepdims=True), 3, axis=1)
    out_grey = conv(paddle.to_tensor(grey), paddle.to_tensor(w), padding=3).numpy()
    np.testing.assert_allclose(out15, out_grey, rtol=1e-4, atol=1e-4)
    # a grey frame (R=G=B) is unchanged by the greying: the inflated conv equals the RGB conv itself
    out_rgb = conv(paddle.to_tensor(grey), paddle.to_tensor(w), padding=3).numpy()
    out15_grey = conv(paddle.to_tensor(np.concatenate([grey] * 5, axis=1)), paddle.to_tensor(inflated),
                      padding=3).numpy()
    np.testing.assert_allclose(out15_grey, out_rgb, rtol=1e-4, atol=1e-4)


def test_stnet_imagenet_init_loads_trunk_and_inflates():
    params = [row for row in table("keys_paddlevideo_tsn_r50_k400.json")["params"]
              if not row[0].startswith("head.")]
    source = {k[len("backbone."):]: v for k, v in golden_state_dict(params).items()}  # bare names also map
    with paddle.LazyGuard():
        model = StNet(num_classes=400, seglen=5)
    logs = []
    report = load_entry_state(model, source, WEIGHTS.get("stnet_r50_imagenet_init"), log=logs.append)
    assert report["unexpected"] == [] and report["loaded"] == 265
    assert sorted({k.split(".")[0] for k in report["missing"]}) == ["fc", "temporal1", "temporal2", "xception"]
    assert any("missing" in line for line in logs)
    stem = model.backbone.stem[0].conv.weight.numpy()
    np.testing.assert_allclose(stem, inflate_conv1(source["conv._conv.weight"], 5), rtol=1e-6)


def test_frozen_stages_and_norm_eval():
    model = ResNet(depth=18, frozen_stages=2)
    frozen = {n for n, p in model.named_parameters()
              if p.stop_gradient and not n.endswith(("_mean", "_variance"))}  # BN stats never train
    assert all(n.startswith(("stem.", "layer1.", "layer2.")) for n in frozen)
    assert {n.split(".")[0] for n in frozen} == {"stem", "layer1", "layer2"}
    model.train()
    before = model.layer2[0].conv0.bn._mean.numpy().copy(), model.layer3[0].conv0.bn._mean.numpy().copy()
    model(paddle.randn([2, 3, 32, 32]))
    assert np.array_equal(model.layer2[0].conv0.bn._mean.numpy(), before[0])  # frozen stage: running stats kept
    assert not np.array_equal(model.layer3[0].conv0.bn._mean.numpy(), before[1])
    model = ResNet(depth=18, norm_eval=True)
    model.train()
    keep = model.layer4[1].conv1.bn._variance.numpy().copy()
    model(paddle.randn([2, 3, 32, 32]))
    assert np.array_equal(model.layer4[1].conv1.bn._variance.numpy(), keep)
    assert all(not p.stop_gradient for n, p in model.named_parameters()
               if not n.endswith(("_mean", "_variance")))
