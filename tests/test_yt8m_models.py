"""The three YouTube-8M feature models: sizes, the official AttentionLSTM golden output, masks, training."""
import importlib.util
import json
import math
import os

import numpy as np
import paddle
import pytest

from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, load_entry_state
from models.video.attention_cluster import AttentionCluster
from models.video.attention_lstm import AttentionLSTM
from models.video.nextvlad import NeXtVLAD
from tests.helpers import golden_close

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _golden_weights():
    spec = importlib.util.spec_from_file_location("golden_weights", os.path.join(DATA, "golden_weights.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def n_trainable(model):
    """Unique trainable elements (a tied tensor counts once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if not p.stop_gradient and id(p) not in seen:
            seen.add(id(p))
            total += int(np.prod(p.shape))
    return total


def make_batch(lengths, dims=(16, 8), num_classes=6, T=None, seed=0, pad_value=0.0, names=("rgb", "audio")):
    """A padded batch as PadSequences builds it (features [B,T,D], `_len`, `_mask` [B,T], labels)."""
    rng = np.random.default_rng(seed)
    T = T or max(lengths)
    batch = {}
    for name, dim in zip(names, dims):
        x = np.full((len(lengths), T, dim), pad_value, dtype="float32")
        mask = np.zeros((len(lengths), T), dtype="float32")
        for b, n in enumerate(lengths):
            x[b, :n] = rng.standard_normal((n, dim))
            mask[b, :n] = 1
        batch[name], batch[name + "_len"], batch[name + "_mask"] = x, np.array(lengths, "int64"), mask
    labels = (rng.random((len(lengths), num_classes)) < 0.3).astype("float32")
    labels[:, 0] = 1  # at least one label per video
    batch["labels"] = labels
    return batch


def with_garbage(batch, names=("rgb", "audio"), T=None, seed=1):
    """Same videos, padded to T frames with random values instead of zeros."""
    rng = np.random.default_rng(seed)
    out = dict(batch)
    for name in names:
        x, lens = batch[name], batch[name + "_len"]
        T_new = T or x.shape[1]
        y = rng.standard_normal((x.shape[0], T_new, x.shape[2])).astype("float32") * 5
        m = np.zeros((x.shape[0], T_new), "float32")
        for b, n in enumerate(lens):
            y[b, :n] = x[b, :n]
            m[b, :n] = 1
        out[name], out[name + "_mask"] = y, m
    return out


def run(model, batch):
    with paddle.no_grad():
        return {k: v.numpy() for k, v in model(batch).items()}


def train_losses(model, batch, steps, lr=1e-2):
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=model.parameters())
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(batch)["loss"]
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(loss.item())
    return losses


def test_registered():
    for name in ("AttentionLSTM", "NeXtVLAD", "AttentionCluster"):
        assert name in MODELS
    assert WEIGHTS.get("NeXtVLAD_yt8m").urls == [] and WEIGHTS.get("AttentionCluster_yt8m").urls == []


# ---------------------------------------------------------------- AttentionLSTM
def test_attention_lstm_param_count():
    E, H, C = 512, 1024, 3862
    per_modality = lambda D: (D * E + E) + 2 * (4 * H * E + 4 * H * H + 4 * H + 4 * H) + (2 * H + 1)
    head = (2 * 2 * H * 8192 + 8192) + (8192 * 4096 + 4096) + (4096 * C + C)
    expected = per_modality(1024) + per_modality(128) + head
    assert expected == 108_737_304
    with paddle.LazyGuard():
        model = AttentionLSTM()
    assert n_trainable(model) == expected == WEIGHTS.get("AttentionLSTM_yt8").num_params
    table = json.load(open(os.path.join(DATA, "keys_paddlevideo_attention_lstm_youtube8m.json")))
    assert table["num_params"] == expected


@pytest.fixture(scope="module")
def golden_lstm():
    """The full-size model filled with the golden weights of the official key table."""
    gw = _golden_weights()
    table = json.load(open(os.path.join(DATA, "keys_paddlevideo_attention_lstm_youtube8m.json")))
    state = gw.golden_state_dict(table["params"])  # table order: canonical key before its alias
    model = AttentionLSTM()
    model.eval()
    report = load_entry_state(model, state, WEIGHTS.get("AttentionLSTM_yt8"), log=lambda m: None)
    ref = np.load(os.path.join(DATA, "paddlevideo_attention_lstm.npz"))
    return model, report, table, ref, gw


def test_attention_lstm_official_keys_load(golden_lstm):
    model, report, table, _, gw = golden_lstm
    assert report["missing"] == [] and report["unexpected"] == [] and report["dropped_head"] == []
    assert sorted(report["aliases_skipped"]) == sorted(table["aliases"])
    assert report["loaded"] == len(table["params"]) - len(table["aliases"])
    # tied tensors hold the canonical key's value (the golden README's convention)
    own = model.state_dict()
    for alias, canonical in table["aliases"].items():
        expected = gw.golden_array(canonical, own[canonical].shape)
        np.testing.assert_array_equal(own[alias].numpy(), expected)


def test_attention_lstm_matches_official_golden(golden_lstm, op_path):
    model, _, _, ref, _ = golden_lstm
    batch = {k: ref[k] for k in ("rgb", "rgb_len", "rgb_mask", "audio", "audio_len", "audio_mask")}
    assert batch["rgb_mask"].ndim == 3  # FeatureDecoder's [B,T,D] mask layout is accepted
    out = run(model, batch)
    # the FC layers through the layer package (oneDNN's GEMM, bias + activation in one kernel), the
    # LSTMs on oneDNN's inference LSTM (no gradients here; tests/test_fast_ops.py checks the training one)
    op_path.check("zoo_matmul", "zoo_bias_act", "zoo_bias_dropout", "zoo_lstm_infer")
    for key in ("logits", "probs"):
        golden_close(out[key], ref[key])
    # our collate's [B,T] mask, and lengths alone, give the same answer
    flat = dict(batch, rgb_mask=ref["rgb_mask"][..., 0], audio_mask=ref["audio_mask"][..., 0])
    np.testing.assert_allclose(run(model, flat)["logits"], out["logits"], atol=1e-6)
    lens_only = {k: batch[k] for k in ("rgb", "rgb_len", "audio", "audio_len")}
    np.testing.assert_allclose(run(model, lens_only)["logits"], out["logits"], atol=1e-6)
    # padded frames are ignored: garbage in them, or more of them, changes nothing (in bf16 the GEMMs
    # over more rows may block, and so round, differently: its tolerance)
    garbage = run(model, with_garbage(flat, T=12))["logits"]
    if op_path.bf16:
        golden_close(garbage, out["logits"])
    else:
        np.testing.assert_allclose(garbage, out["logits"], atol=2e-6)


SMALL_LSTM = dict(num_classes=6, feature_dims=[16, 8], embedding_size=8, lstm_size=6, fc_sizes=[12, 10])


def test_attention_lstm_masks_and_use_mask_false():
    paddle.seed(0)
    model = AttentionLSTM(**SMALL_LSTM)
    model.eval()
    batch = make_batch([5, 2, 3])
    out = run(model, batch)
    np.testing.assert_allclose(run(model, with_garbage(batch, T=9))["probs"], out["probs"], atol=1e-6)
    for b, n in enumerate([5, 2, 3]):  # each video alone, unpadded
        alone = {k: v[b:b + 1, :n] for k, v in batch.items() if k in ("rgb", "audio")}
        np.testing.assert_allclose(run(model, alone)["logits"], out["logits"][b:b + 1], atol=1e-5)
    # the ablation flag really ignores the masks: padding then changes the output
    unmasked = AttentionLSTM(**SMALL_LSTM, use_mask=False)
    unmasked.set_state_dict(model.state_dict())
    unmasked.eval()
    assert np.abs(run(unmasked, with_garbage(batch, T=9))["logits"] - out["logits"]).max() > 1e-3
    full = make_batch([4, 4])
    np.testing.assert_allclose(run(unmasked, full)["logits"], run(model, full)["logits"], atol=1e-5)


def test_attention_lstm_loss_and_train_step():
    paddle.seed(0)
    model = AttentionLSTM(**SMALL_LSTM)
    batch = make_batch([5, 2, 3])
    model.eval()
    out = run(model, batch)
    z, y = out["logits"].astype("float64"), batch["labels"]
    bce = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    assert abs(out["loss"] - bce.sum()) < 1e-4 * bce.sum()  # PaddleVideo: sum over classes and batch
    mean_model = AttentionLSTM(**SMALL_LSTM, loss_reduction="mean")
    mean_model.set_state_dict(model.state_dict())
    mean_model.eval()
    assert abs(run(mean_model, batch)["loss"] - bce.sum(1).mean()) < 1e-5 * bce.sum()
    model.train()
    loss = model(batch)["loss"]
    assert set(model(batch)) == {"loss"} and loss.shape == [] and math.isfinite(loss.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and np.isfinite(p.grad.numpy()).all(), name
        if not name.startswith("head.att_fc") or not name.endswith("bias"):  # softmax ignores a shift
            assert np.abs(p.grad.numpy()).max() > 0, name
    with pytest.raises(ConfigError, match="labels"):
        model({k: v for k, v in batch.items() if k != "labels"})


def test_attention_lstm_other_head_dropped():
    src = AttentionLSTM(**dict(SMALL_LSTM, num_classes=5))
    dst = AttentionLSTM(**SMALL_LSTM)
    messages = []
    report = load_entry_state(dst, src.state_dict(), WEIGHTS.get("AttentionLSTM_yt8"), log=messages.append)
    assert sorted(report["dropped_head"]) == ["head.fc_logit.bias", "head.fc_logit.weight"]
    assert report["missing"] == [] and report["unexpected"] == []
    assert any("dropped head keys" in m and "head.fc_logit.weight" in m for m in messages)
    for key, value in src.state_dict().items():
        if "fc_logit" not in key:
            np.testing.assert_array_equal(dst.state_dict()[key].numpy(), value.numpy())


def test_bad_config_and_batch():
    with pytest.raises(ConfigError, match="feature_dims"):
        AttentionLSTM(feature_names=["rgb"], feature_dims=[1024, 128])
    with pytest.raises(ConfigError, match="loss_reduction"):
        NeXtVLAD(loss_reduction="avg")
    model = AttentionLSTM(**SMALL_LSTM)
    batch = make_batch([3, 2], dims=(16, 7))
    with pytest.raises(ConfigError, match="audio"):
        model(batch)
    with pytest.raises(ConfigError, match="no 'audio'"):
        model({k: v for k, v in batch.items() if not k.startswith("audio")})


# ---------------------------------------------------------------- NeXtVLAD
def test_nextvlad_param_count():
    K, G, lam, hidden, C = 128, 8, 2, 2048, 3862

    def layer(F):
        Fe, Fg = lam * F, lam * F // G
        return ((F * Fe + Fe)          # fc_expansion (with bias)
                + (Fe * G + G)         # group attention fc (with bias)
                + Fe * G * K           # cluster_weights (no bias)
                + 2 * G * K            # BN scale/shift on the cluster activation
                + K * Fg               # cluster_weights2
                + 2 * K * Fg)          # BN scale/shift on the flattened VLAD

    assert layer(1024) == 4_313_096 and layer(128) == 311_560
    vlad_out = K * (lam * 1024 // G) + K * (lam * 128 // G)  # 32768 + 4096
    head = (vlad_out * hidden + 2 * hidden                     # hidden fc (no bias) + BN
            + hidden * (hidden // 8) + 2 * (hidden // 8)       # gating fc1 (no bias) + BN
            + (hidden // 8) * hidden                           # gating fc2 (no bias)
            + hidden * C + C)                                  # logistic fc
    expected = layer(1024) + layer(128) + head
    assert expected == 89_088_550
    with paddle.LazyGuard():
        model = NeXtVLAD()
    assert n_trainable(model) == expected == WEIGHTS.get("NeXtVLAD_yt8m").num_params
    reg = model.logits_clf.weight.regularizer
    assert isinstance(reg, paddle.regularizer.L2Decay) and model.logits_clf.bias.regularizer is not None
    assert model.hidden1_fc.bias is None and model.gating_fc1.bias is None


SMALL_VLAD = dict(num_classes=6, feature_dims=[16, 8], cluster_size=4, hidden_size=16, groups=2,
                  expansion=2, gating_reduction=4)


def _np_nextvlad_layer(layer, x):
    """The LoD original on one unpadded video, in numpy (eval-mode BN)."""
    p = {k: v.numpy().astype("float64") for k, v in layer.state_dict().items()}
    G, K, Fg = layer.groups, layer.cluster_size, layer.group_size

    def bn(v, n):
        return (v - p[n + "._mean"]) / np.sqrt(p[n + "._variance"] + 1e-5) * p[n + ".weight"] + p[n + ".bias"]

    h = x @ p["fc_expansion.weight"] + p["fc_expansion.bias"]                  # [T, lam*F]
    att = 1 / (1 + np.exp(-(h @ p["fc_group_attention.weight"] + p["fc_group_attention.bias"])))
    act = bn(h @ p["cluster_weights"], "cluster_bn").reshape(-1, G, K)
    act = np.exp(act - act.max(-1, keepdims=True))
    act = act / act.sum(-1, keepdims=True) * att[:, :, None]
    a = act.sum((0, 1))[:, None] * p["cluster_weights2"]                        # [K, Fg]
    vlad = np.einsum("tgk,tgf->kf", act, h.reshape(-1, G, Fg)) - a
    vlad = vlad / np.linalg.norm(vlad, axis=1, keepdims=True)
    return bn(vlad.T.reshape(-1), "vlad_bn")                                    # [Fg, K] flattened


def test_nextvlad_shapes_semantics_and_masks():
    paddle.seed(0)
    model = NeXtVLAD(**SMALL_VLAD)
    rng = np.random.default_rng(3)
    for name, v in model.state_dict().items():  # non-trivial BN statistics and affine
        if name.endswith(("_mean", "bias")):
            v.set_value(rng.normal(0, 0.1, v.shape).astype("float32"))
        if name.endswith(("_variance", "bn.weight")):
            v.set_value(rng.uniform(0.5, 1.5, v.shape).astype("float32"))
    model.eval()
    batch = make_batch([5, 2, 3])
    out = run(model, batch)
    assert out["logits"].shape == (3, 6) and out["probs"].shape == (3, 6) and out["loss"].shape == ()
    with paddle.no_grad():
        x = paddle.to_tensor(batch["rgb"])
        ours = model.vlad[0](x, paddle.to_tensor(batch["rgb_mask"])).numpy()
    for b, n in enumerate([5, 2, 3]):
        ref = _np_nextvlad_layer(model.vlad[0], batch["rgb"][b, :n].astype("float64"))
        np.testing.assert_allclose(ours[b], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(model, with_garbage(batch, T=8))["probs"], out["probs"], atol=1e-6)

    # training: the batch statistics come from real frames only, so padding changes nothing either
    train_model = NeXtVLAD(**dict(SMALL_VLAD, drop_rate=0.0))
    twin = NeXtVLAD(**dict(SMALL_VLAD, drop_rate=0.0))
    twin.set_state_dict(train_model.state_dict())
    train_model.train(), twin.train()
    loss_a = train_model(batch)["loss"]
    loss_b = twin(with_garbage(batch, T=8))["loss"]
    np.testing.assert_allclose(loss_a.item(), loss_b.item(), rtol=1e-5)
    np.testing.assert_allclose(train_model.vlad[0].cluster_bn._mean.numpy(),
                               twin.vlad[0].cluster_bn._mean.numpy(), atol=1e-6)
    loss_a.backward()
    for name, p in train_model.named_parameters():
        if not p.stop_gradient:
            assert p.grad is not None and list(p.grad.shape) == list(p.shape), name


def test_nextvlad_train_decreases_loss():
    paddle.seed(1)
    model = NeXtVLAD(**dict(SMALL_VLAD, drop_rate=0.0))
    losses = train_losses(model, make_batch([5, 2, 3, 4], seed=2), steps=6)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.8 * losses[0], losses


# ---------------------------------------------------------------- Attention Cluster
def test_attention_cluster_param_count():
    n_att, C = 32, 3862
    per_modality = lambda F: (F * n_att + n_att) + 2 * n_att   # 1x1 conv (with bias) + shift w, b
    concat = n_att * 1024 + n_att * 128                         # 36864
    head = (concat * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * C + C)
    expected = per_modality(1024) + per_modality(128) + head
    assert expected == 57_807_830
    with paddle.LazyGuard():
        model = AttentionCluster()
    assert n_trainable(model) == expected == WEIGHTS.get("AttentionCluster_yt8m").num_params


SMALL_AC = dict(num_classes=6, feature_dims=[16, 8], seg_num=5, cluster_nums=[4, 3], fc_sizes=[12, 10])


def test_attention_cluster_shapes_semantics_and_masks():
    paddle.seed(0)
    model = AttentionCluster(**SMALL_AC)
    model.eval()
    batch = make_batch([5, 5, 5])
    out = run(model, batch)
    assert out["logits"].shape == (3, 6) and out["probs"].shape == (3, 6)
    # shifting attention against numpy: softmax over frames, w_i*sum+b_i, L2 norm, / sqrt(n_att)
    satt = model.satt0
    p = {k: v.numpy().astype("float64") for k, v in satt.state_dict().items()}
    x = batch["rgb"].astype("float64")
    scores = np.einsum("btf,af->bat", x, p["conv.weight"][:, :, 0, 0]) + p["conv.bias"][None, :, None]
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    shifted = np.einsum("bat,btf->baf", w, x) * p["shift_w"][None, :, None] + p["shift_b"][None, :, None]
    expected = (shifted / np.linalg.norm(shifted, axis=-1, keepdims=True) / 2.0).reshape(3, -1)
    with paddle.no_grad():
        ours = satt(paddle.to_tensor(batch["rgb"])).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    # a mask is honoured: masked frames' values do not matter
    short = make_batch([5, 3, 4])
    np.testing.assert_allclose(run(model, with_garbage(short))["probs"], run(model, short)["probs"],
                               atol=1e-6)
    with pytest.raises(ConfigError, match="seg_num=5"):
        model(make_batch([7, 7]))
    model.train()
    loss = model(batch)["loss"]
    loss.backward()
    for name, prm in model.named_parameters():
        if not prm.stop_gradient:
            assert prm.grad is not None and list(prm.grad.shape) == list(prm.shape), name


def test_attention_cluster_train_decreases_loss():
    paddle.seed(1)
    model = AttentionCluster(**dict(SMALL_AC, drop_rate=0.0))
    losses = train_losses(model, make_batch([5, 5, 5, 5], seed=2), steps=6)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.8 * losses[0], losses


def test_nextvlad_training_bn_equals_paddles_bn_over_the_real_frames_alone():
    """The masked statistics (fixed shapes, no device sync) against paddle's own BatchNorm1D run on
    the gathered real frames: outputs, running averages and input gradients."""
    from models.video.nextvlad import NeXtVLADLayer
    paddle.seed(3)
    layer = NeXtVLADLayer(16, 4, 2, 2)
    layer.train()
    bn = layer.cluster_bn
    bn.weight.set_value(paddle.rand(bn.weight.shape) + 0.5)
    bn.bias.set_value(paddle.rand(bn.bias.shape))
    ref_bn = paddle.nn.BatchNorm1D(bn.weight.shape[0])
    ref_bn.set_state_dict(bn.state_dict())
    ref_bn.train()
    act = paddle.randn([3, 7, bn.weight.shape[0]])
    mask = paddle.to_tensor(np.array([[1] * 7, [1] * 2 + [0] * 5, [1] * 4 + [0] * 3], np.float32))
    a1, a2 = act.clone(), act.clone()
    a1.stop_gradient = a2.stop_gradient = False
    ours = layer._cluster_bn(a1, mask)
    flat = a2.reshape([21, -1])
    idx = paddle.to_tensor(np.flatnonzero(mask.numpy().reshape(-1)))
    ref = paddle.scatter(paddle.zeros_like(flat), idx, ref_bn(paddle.gather(flat, idx))).reshape(act.shape)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=2e-6)
    np.testing.assert_allclose(bn._mean.numpy(), ref_bn._mean.numpy(), atol=1e-7)
    np.testing.assert_allclose(bn._variance.numpy(), ref_bn._variance.numpy(), atol=1e-6)
    weights = paddle.randn(act.shape)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    np.testing.assert_allclose(a1.grad.numpy(), a2.grad.numpy(), atol=1e-5)
