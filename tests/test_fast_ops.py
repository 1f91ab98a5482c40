"""The fused C++ CPU operators (ops/) against their pure Paddle references.

Each operator: outputs and gradients equal to the reference to 1e-5 (dropout with the operator's own
keep-mask given to the reference), the backward against central finite differences in float32
(1e-2), odd shapes and masks; the layers that use them (BERT, Transformer, ResNet) against their
reference forward; the fallback when the operators are switched off or cannot be built. The library
compiles once per machine (cached; the first test pays ~20 s).
"""
import json
import logging
import os
import re

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import pytest

from engine import config, runtime
from engine.components import load_all
from models.nlp.bert import BertModel
from models.nlp.transformer import DecoderLayer, EncoderLayer, Transformer
from models.vision.deeplabv3 import DeepLabV3
from models.vision.resnet import Bottleneck, ResNet
from ops import functional, library, reference
from ops.paddle_attrs import (batch_norm_settings, conv2d_settings, conv_transpose_settings, layer_norm_epsilon,
                              lstm_settings)
from tests.conftest import BERT_PRETRAIN_DEMO
from tests.helpers import ROOT, counting_fused_ops as _counting, fused_ops_on, nsp_majority, read_metrics, tool

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa


@pytest.fixture(scope="module", autouse=True)
def ops():
    with fused_ops_on():
        yield


def _t(a, grad=True):
    t = paddle.to_tensor(np.asarray(a, np.float32))
    t.stop_gradient = not grad
    return t


def _grads(fn, inputs, weight):
    """fn(*inputs) and the gradients of sum(fn * weight) w.r.t. the inputs that need them."""
    xs = [_t(a.numpy(), grad=not a.stop_gradient) for a in inputs]
    out = fn(*xs)
    (out * weight).sum().backward()
    return out.numpy(), [x.grad.numpy() if not x.stop_gradient else None for x in xs]


def _close(a, b, tol=1e-5):
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


def _compare(fast, ref, inputs, tol=1e-5):
    weight = paddle.to_tensor(np.random.default_rng(1).standard_normal(fast(*inputs).shape).astype(np.float32))
    out_f, g_f = _grads(fast, inputs, weight)
    out_r, g_r = _grads(ref, inputs, weight)
    _close(out_f, out_r, tol)
    for a, b in zip(g_f, g_r):
        if b is not None:
            _close(a, b, tol)


def _finite_differences(fn, inputs, eps=1e-2, tol=1e-2):
    """<grad, v> against (f(x + eps v) - f(x - eps v)) / 2 eps for a random direction v per input."""
    rng = np.random.default_rng(2)
    weight = paddle.to_tensor(rng.standard_normal(fn(*inputs).shape).astype(np.float32))
    _, grads = _grads(fn, inputs, weight)
    for i, (x, g) in enumerate(zip(inputs, grads)):
        if g is None:
            continue
        v = rng.standard_normal(x.shape).astype(np.float32)
        f = []
        for sign in (1, -1):
            moved = [_t(a.numpy() + sign * eps * v if j == i else a.numpy(), grad=False) for j, a in enumerate(inputs)]
            f.append(float((fn(*moved).astype("float64") * weight.astype("float64")).sum().item()))
        numeric = (f[0] - f[1]) / (2 * eps)
        analytic = float((g.astype(np.float64) * v).sum())
        assert abs(numeric - analytic) <= tol * max(1.0, abs(analytic)), (i, numeric, analytic)


def _run(name, *args):
    return functional._run(name, *args)


RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------------------ operators
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bias_act(act, p):
    x, b = _t(RNG.standard_normal((5, 3, 37)) * 2), _t(RNG.standard_normal(37))
    code = functional._ACTS[act]
    keep = _run("zoo_bias_act", x, b, code, 1234, p)[1]

    def fast(x, b):
        return _run("zoo_bias_act", x, b, code, 1234, p)[0]

    def ref(x, b):
        return reference.bias_act(x, b, act, p, True, keep)
    _compare(fast, ref, [x, b])
    if act != "relu":   # relu's kink breaks finite differences where x + b is near 0
        _finite_differences(fast, [x, b])


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bias_dropout(p):
    """bias_act without an activation, the operator whose backward reads only the mask (none at p = 0)."""
    x, b = _t(RNG.standard_normal((5, 3, 37)) * 2), _t(RNG.standard_normal(37))
    y, keep = _run("zoo_bias_dropout", x, b, 1234, p)
    assert keep.shape == ([0] if p == 0 else [5, 3, 37])

    def fast(x, b):
        return _run("zoo_bias_dropout", x, b, 1234, p)[0]

    def ref(x, b):
        return reference.bias_act(x, b, None, p, True, keep if p else None)
    _compare(fast, ref, [x, b])
    _finite_differences(fast, [x, b])


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_bias_dropout_residual(p):
    x, b, r = _t(RNG.standard_normal((7, 45))), _t(RNG.standard_normal(45)), _t(RNG.standard_normal((7, 45)))
    keep = _run("zoo_bias_dropout_residual", x, b, r, 99, p)[1]

    def fast(x, b, r):
        return _run("zoo_bias_dropout_residual", x, b, r, 99, p)[0]

    def ref(x, b, r):
        return functional.bias_dropout_residual(x, b, r, p, True, keep=keep)
    _compare(fast, ref, [x, b, r])
    _finite_differences(fast, [x, b, r])


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_bias_dropout_residual_layer_norm(p):
    shape = (3, 11, 67)
    x, r = _t(RNG.standard_normal(shape)), _t(RNG.standard_normal(shape) * 3 + 1)
    b, g, be = _t(RNG.standard_normal(67)), _t(1 + 0.1 * RNG.standard_normal(67)), _t(RNG.standard_normal(67))
    keep = _run("zoo_bias_dropout_residual_ln", x, b, r, g, be, 5, p, 1e-12)[1]

    def fast(x, b, r, g, be):
        return _run("zoo_bias_dropout_residual_ln", x, b, r, g, be, 5, p, 1e-12)[0]

    def ref(x, b, r, g, be):
        return functional.bias_dropout_residual_ln(x, b, r, g, be, p, 1e-12, True, keep=keep)
    _compare(fast, ref, [x, b, r, g, be])
    _finite_differences(fast, [x, b, r, g, be])


def test_layer_norm():
    x, g, b = _t(RNG.standard_normal((4, 5, 33)) * 2 + 3), _t(RNG.standard_normal(33)), _t(RNG.standard_normal(33))
    _compare(lambda *a: functional.layer_norm(*a, 1e-5),
             lambda x, g, b: F.layer_norm(x, x.shape[-1:], g, b, 1e-5), [x, g, b])
    _finite_differences(lambda *a: functional.layer_norm(*a, 1e-5), [x, g, b])


# matmul on oneDNN: 1e-5 of max(1, |reference|) as everywhere here: both sides sum K float32 products
# in different orders (blocking, AVX-512 vs AVX2 FMA), a relative difference of ~1e-7 * sqrt(K)
MATMUL_FORMS = [   # x shape, y shape, transpose_x, transpose_y: every form our layers use, odd sizes
    ((5, 7), (7, 3), False, False), ((7, 5), (7, 3), True, False), ((5, 7), (3, 7), False, True),
    ((7, 5), (3, 7), True, True),
    ((2, 5, 13), (13, 3), False, False),          # Linear: leading axes fold into the rows
    ((3, 4, 9), (11, 9), False, True),            # tied output projection: h @ E^T
    ((2, 3, 5, 7), (2, 3, 7, 4), False, False),   # attention: weights @ v
    ((2, 3, 5, 7), (2, 3, 4, 7), False, True),    # q @ k^T
    ((2, 3, 7, 5), (2, 3, 7, 4), True, False), ((3, 7, 5), (3, 4, 7), True, True),
]


@pytest.mark.parametrize("xs, ys, tx, ty", MATMUL_FORMS)
def test_matmul(xs, ys, tx, ty):
    x, y = _t(RNG.standard_normal(xs)), _t(RNG.standard_normal(ys))

    def fast(x, y):
        return functional.matmul(x, y, tx, ty)
    with _counting() as ran:
        fast(x, y)
    assert ran == ["zoo_matmul"]
    _compare(fast, lambda x, y: paddle.matmul(x, y, tx, ty), [x, y])
    _finite_differences(fast, [x, y])


def test_matmul_empty_sizes_other_forms_and_many_shapes():
    """Zero-sized axes; shapes the operator does not take (broadcast batch axes, a transposed x with a
    2-D y, 1-D operands) run paddle.matmul; more problems than the primitive cache holds (1024,
    least recently used evicted) stay right."""
    for xs, ys in (((3, 0, 7), (7, 4)), ((3, 5, 0), (0, 4)), ((2, 5, 7), (2, 7, 0))):
        x, y = _t(RNG.standard_normal(xs), grad=False), _t(RNG.standard_normal(ys), grad=False)
        with _counting() as ran:
            out = functional.matmul(x, y)
        assert ran == ["zoo_matmul"] and out.shape == paddle.matmul(x, y).shape
        np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, y).numpy())   # empty, or zeros (K = 0)
    for xs, ys, tx in (((2, 3, 5, 7), (3, 7, 4), False), ((2, 7, 5), (7, 4), True), ((7,), (7, 4), False)):
        x, y = _t(RNG.standard_normal(xs), grad=False), _t(RNG.standard_normal(ys), grad=False)
        with _counting() as ran:
            out = functional.matmul(x, y, tx)
        assert ran == []
        np.testing.assert_array_equal(out.numpy(), paddle.matmul(x, y, tx).numpy())
    y = _t(RNG.standard_normal((3, 2)), grad=False)
    xs = [_t(RNG.standard_normal((m, 3)), grad=False) for m in range(1, 1100)]
    outs = [functional.matmul(x, y) for x in xs]
    for x, out in zip(xs[:3] + xs[-3:], outs[:3] + outs[-3:]):
        _close(out.numpy(), x.numpy() @ y.numpy())
    _close(functional.matmul(xs[0], y).numpy(), xs[0].numpy() @ y.numpy())   # evicted, built again


def test_matmul_of_strided_views():
    """With paddle's stride kernels on, a transpose or slice is a view: the operator copies it first."""
    before = paddle.get_flags(["FLAGS_use_stride_kernel"])
    paddle.set_flags({"FLAGS_use_stride_kernel": True})
    try:
        b = _t(RNG.standard_normal((2, 3, 5, 8)), grad=False)
        q, k = b[:, :, :, :4], b[:, :, :, 4:]
        x, y = _t(RNG.standard_normal((7, 5))), _t(RNG.standard_normal((7, 3)))
        with _counting() as ran:
            _close(functional.matmul(q, k, transpose_y=True).numpy(), paddle.matmul(q, k, transpose_y=True).numpy())
            _compare(lambda x, y: functional.matmul(x.transpose([1, 0]), y),
                     lambda x, y: paddle.matmul(x.transpose([1, 0]), y), [x, y])
        assert len(ran) >= 2
    finally:
        paddle.set_flags(before)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_smooth_cross_entropy(eps):
    """Loss and nll against the reference (cross entropy + gather + mean) over a vocabulary of 1037 (the
    sums run in blocks of 1024) and of 5; a label -1 row is ignored; gradients through both outputs,
    through the loss alone (nll unused: its gradient never arrives), and finite differences."""
    for shape, V in (((3, 4), 1037), ((5,), 5)):
        z = _t(RNG.standard_normal(shape + (V,)) * 3)
        labels = RNG.integers(0, V, shape)
        labels.reshape(-1)[1] = -1
        labels = paddle.to_tensor(labels.astype(np.int64))
        w = paddle.to_tensor(RNG.standard_normal(shape).astype(np.float32))

        def both(z):
            loss, nll = functional.smooth_cross_entropy(z, labels, eps)
            return loss * w + nll * 0.7

        def loss_only(z):
            return functional.smooth_cross_entropy(z, labels, eps)[0]

        for fn in (both, loss_only):
            with functional.precision(fast_ops=False):
                ref = _grads(fn, [z], 1.0)
            with _counting() as ran:
                fast = _grads(fn, [z], 1.0)
            assert ran == ["zoo_smooth_cross_entropy"]
            _close(fast[0], ref[0])
            _close(fast[1][0], ref[1][0])
            assert fast[0].reshape(-1)[1] == 0 and not fast[1][0].reshape(-1, V)[1].any()
        _finite_differences(both, [z])


def test_transformer_loss_and_gradients_fast_equal_reference():
    """A whole tiny Transformer training step (tied output projection, label-smoothed loss)."""
    paddle.seed(0)
    model = Transformer(src_vocab_size=41, trg_vocab_size=41, d_model=16, d_inner_hid=24, n_head=2,
                        num_encoder_layers=1, num_decoder_layers=1, dropout=0.0, max_length=16)
    model.train()
    ids = RNG.integers(3, 41, (3, 2, 6))
    mask = (np.arange(6)[None] < np.array([[6], [4]])).astype(np.float32)
    batch = {"src_ids": ids[0] * mask, "tgt_in": ids[1] * mask, "tgt_out": ids[2] * mask}
    batch = {k: paddle.to_tensor(v.astype(np.int64)) for k, v in batch.items()}
    results = []
    for on in (True, False):
        model.clear_gradients()
        with functional.precision(fast_ops=on), _counting() as ran:
            out = model(batch)
        assert ("zoo_matmul" in ran and "zoo_smooth_cross_entropy" in ran) == on
        out["loss"].backward()
        results.append([out["loss"].numpy(), out["nll"].numpy()] + [p.grad.numpy() for p in model.parameters()
                                                                    if p.grad is not None])
    assert len(results[0]) == len(results[1]) > 10
    for a, b in zip(*results):
        _close(a, b)


def _padding_mask(B, T, lengths):
    m = np.zeros((B, 1, 1, T), np.float32)
    for i, n in enumerate(lengths):
        m[i, ..., n:] = -1e4
    return _t(m, grad=False)


@pytest.mark.parametrize("kind", ["padding", "causal", "batch_causal"])
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_softmax_dropout(kind, p):
    B, H, S, T = 3, 2, 5, 7 if kind == "padding" else 5
    x = _t(RNG.standard_normal((B, H, S, T)) * 3)
    if kind == "padding":
        mask = _padding_mask(B, T, [7, 4, 1])
    else:
        causal = np.triu(np.full((S, T), -1e9, np.float32), 1)
        mask = _t(causal if kind == "causal" else np.broadcast_to(causal, (B, 1, S, T)).copy(), grad=False)
    m4 = mask if mask.ndim == 4 else mask.unsqueeze([0, 1])
    keep = _run("zoo_softmax_dropout", x, m4, 0.7, 3, p)[2]

    def fast(x):
        return _run("zoo_softmax_dropout", x, m4, 0.7, 3, p)[0]

    def ref(x):
        return functional.softmax_dropout(x, mask, 0.7, p, True, keep=keep)
    _compare(fast, ref, [x])
    _finite_differences(fast, [x])
    assert np.allclose(functional.softmax_dropout(x, mask, 0.7, 0.0).numpy().sum(-1), 1.0, atol=1e-5)


def _bn(C, momentum=0.9):
    bn = nn.BatchNorm2D(C, momentum=momentum)
    bn.weight.set_value(paddle.to_tensor(RNG.uniform(0.5, 1.5, C).astype(np.float32)))
    bn.bias.set_value(paddle.to_tensor(RNG.standard_normal(C).astype(np.float32)))
    bn.train()
    return bn


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [False, True])
def test_batch_norm_act(relu, residual):
    x = _t(RNG.standard_normal((3, 6, 5, 7)) * 2 + 1)
    r = _t(RNG.standard_normal((3, 6, 5, 7)))
    bn_fast, bn_ref = _bn(6), _bn(6)
    bn_ref.set_state_dict(bn_fast.state_dict())

    def grads(bn, on):
        xs = [_t(x.numpy()), _t(r.numpy(), grad=residual)]
        with functional.precision(fast_ops=on):
            y = functional.batch_norm_act(xs[0], bn, relu, xs[1] if residual else None)
        (y * weight).sum().backward()
        out = [y.numpy(), xs[0].grad.numpy(), bn.weight.grad.numpy(), bn.bias.grad.numpy()]
        return out + ([xs[1].grad.numpy()] if residual else [])

    weight = _t(RNG.standard_normal(x.shape), grad=False)
    for a, b in zip(grads(bn_fast, True), grads(bn_ref, False)):
        _close(a, b)
    # running statistics: updated once each, as paddle's kernel does (momentum 0.9)
    _close(bn_fast._mean.numpy(), bn_ref._mean.numpy())
    _close(bn_fast._variance.numpy(), bn_ref._variance.numpy())
    assert not np.allclose(bn_fast._variance.numpy(), 1.0)

    bn_fd = _bn(6)

    def fd(x, g, be, r):
        return functional._run("zoo_bn_add_act" if residual else "zoo_bn_act", x, g, be, bn_fd._mean, bn_fd._variance,
                             *([r] if residual else []), 0.9, 1e-5, relu)[0]
    if not relu:
        _finite_differences(fd, [x, _t(bn_fd.weight.numpy()), _t(bn_fd.bias.numpy()), _t(r.numpy(), grad=residual)])


@pytest.mark.parametrize("mode", ["eval", "frozen", "global_stats_trained"])
@pytest.mark.parametrize("relu,residual", [(True, False), (True, True), (False, False)])
def test_batch_norm_act_with_global_statistics(mode, relu, residual):
    """BN on its running statistics in one kernel (zoo_bn_global_act / zoo_bn_global_add_act) against
    paddle's batch_norm + add + relu: evaluation (use_global_stats None, eval mode), a frozen BN as the
    detection and segmentation kits freeze it (use_global_stats True in training, scale and shift not
    trained) and global statistics with a trained scale and shift. Outputs, the input's and residual's
    gradients, the parameters' where they train; the running statistics stay as they are."""
    x = _t(RNG.standard_normal((3, 6, 5, 7)) * 2 + 1)
    r = _t(RNG.standard_normal((3, 6, 5, 7)))
    weight = _t(RNG.standard_normal(x.shape), grad=False)
    mean, var = RNG.standard_normal(6).astype(np.float32), RNG.uniform(0.5, 2.0, 6).astype(np.float32)
    bns = []
    for _ in range(2):
        bn = nn.BatchNorm2D(6, use_global_stats=None if mode == "eval" else True)
        bn.set_state_dict(bns[0].state_dict() if bns else _bn(6).state_dict())
        bn._mean.set_value(_t(mean, grad=False))
        bn._variance.set_value(_t(var, grad=False))
        bn.eval() if mode == "eval" else bn.train()
        for p in (bn.weight, bn.bias):
            p.stop_gradient = mode == "frozen"
        bns.append(bn)

    def grads(bn, on):
        xs = [_t(x.numpy()), _t(r.numpy(), grad=residual)]
        with functional.precision(fast_ops=on), _counting() as ran:
            y = functional.batch_norm_act(xs[0], bn, relu, xs[1] if residual else None)
        (y * weight).sum().backward()
        assert ran == ([("zoo_bn_global_add_act" if residual else "zoo_bn_global_act")] if on else []), ran
        out = [y.numpy(), xs[0].grad.numpy()] + ([xs[1].grad.numpy()] if residual else [])
        if mode == "frozen":
            assert bn.weight.grad is None and bn.bias.grad is None
            return out
        return out + [bn.weight.grad.numpy(), bn.bias.grad.numpy()]

    for a, b in zip(grads(bns[0], True), grads(bns[1], False)):
        _close(a, b)
    for bn in bns:
        np.testing.assert_array_equal(bn._mean.numpy(), mean)
        np.testing.assert_array_equal(bn._variance.numpy(), var)


# (N, C, H, W), out channels, kernel, stride, padding, dilation, groups, bias, input needs a gradient, the
# operator: oneDNN's direct kernels, or one GEMM where the output map has at most 4 pixels (GEMM_MAP's AVX2
# answer, set here on every CPU so that both routes are checked everywhere)
CONVS = [((2, 3, 11, 9), 5, 3, 1, 1, 1, 1, False, True, "direct"),
         ((3, 4, 13, 10), 6, (3, 1), 1, (1, 0), 1, 1, False, True, "direct"),   # StNet-style temporal kernel
         ((2, 5, 15, 12), 7, 3, 2, 1, 1, 1, True, True, "direct"),              # strided, odd sizes, bias
         ((1, 6, 17, 14), 4, 3, 1, 2, 2, 1, False, True, "direct"),             # dilated (DeepLabV3 OS8)
         ((2, 3, 23, 21), 8, 7, 2, 3, 1, 1, False, False, "direct"),            # a stem: no input gradient
         ((2, 6, 9, 9), 3, 1, 2, 0, 1, 1, False, True, "direct"),               # 1x1 strided projection
         ((4, 6, 5, 1), 6, (3, 1), 1, (1, 0), 1, 6, True, True, "direct"),      # depthwise (StNet's Xception)
         ((2, 6, 7, 5), 4, 3, 2, 1, 1, 2, False, True, "direct"),               # two groups, strided
         ((3, 8, 2, 2), 5, 3, 1, 1, 1, 1, True, True, "gemm"),                  # a last stage at 2 x 2
         ((3, 8, 4, 3), 5, 3, 2, 1, 1, 1, False, True, "gemm"),                 # strided down to 2 x 2
         ((2, 5, 2, 2), 3, 3, 1, 2, 2, 1, False, False, "gemm"),                # dilated, no input gradient
         ((5, 7, 1, 1), 4, 1, 1, 0, 1, 1, True, True, "gemm"),                  # ASPP's pooled branch
         ((2, 4, 3, 1), 6, (3, 1), 1, (1, 0), 1, 1, False, True, "gemm")]       # 3 x 1 map, 3 x 1 kernel


@pytest.mark.parametrize("shape,cout,kernel,stride,padding,dilation,groups,bias,x_grad,route", CONVS)
def test_conv2d(shape, cout, kernel, stride, padding, dilation, groups, bias, x_grad, route, monkeypatch):
    """Our convolution against paddle's own (conv2d and its two gradients), whatever work space oneDNN
    needs for it (below: which of the two runs a convolution), and the operator's gradients against
    finite differences."""
    monkeypatch.setattr(functional, "_columns_per_thread", lambda *a: False)
    monkeypatch.setattr(functional, "_gemm_map", lambda: functional.GEMM_MAP["avx2"])
    paddle.seed(0)
    conv = nn.Conv2D(shape[1], cout, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups,
                     bias_attr=None if bias else False)
    x = _t(RNG.standard_normal(shape), grad=x_grad)
    with _counting() as ran:
        fast = _layer_grads(lambda x: functional.conv2d(x, conv), [x], True, conv)
    ref = _layer_grads(lambda x: functional.conv2d(x, conv), [x], False, conv)
    op = "zoo_conv2d_gemm" if route == "gemm" else "zoo_conv2d"
    assert sorted(ran) == sorted([op] + ["zoo_channel_bias"] * bias)
    assert len(fast) == len(ref) == 1 + x_grad + 1 + bias
    for a, b in zip(fast, ref):
        _close(a, b)

    s = [stride] * 2
    p, d = (list(padding) if isinstance(padding, tuple) else [padding] * 2), [dilation] * 2
    args = (s, p, d, True, False) if route == "gemm" else (s, p, d, groups, True, False)
    _finite_differences(lambda x, w: _run(op, x, w, *args)[0], [_t(x.numpy()), _t(conv.weight.numpy())])


def test_linear_to_one_output():
    """A linear layer to one output (AttentionLSTM's attention scores): its input gradient is a GEMM with
    K = 1, where oneDNN 3.6's avx512_core matmul wrote NaN at 1200 x 1 x 256 on amd-zen4 and the
    AttentionLSTM demo stopped learning; such products are outer products of ours. Against paddle's."""
    for m, k in ((1200, 256), (37, 2048), (5, 3)):
        fc = nn.Linear(k, 1)
        x = RNG.standard_normal((m, k)).astype(np.float32)
        fast, ref = (_layer_grads(lambda x: functional.linear(x, fc.weight, fc.bias), [_t(x)], on, fc)
                     for on in (True, False))
        for a, b in zip(fast, ref):
            assert np.isfinite(a).all()
            _close(a, b)


def test_the_gemm_route_takes_the_maps_it_wins_on_this_kind(monkeypatch):
    """GEMM_MAP by oneDNN's kernels (benchmarks/kernel_shapes.py --conv-routes): 2 x 2 maps take the GEMM
    under AVX2 (amd-zen3), where it won 0.91-2.03x, but not under AVX-512 (amd-zen4: 0.45-1.06x, 0.82x
    summed); 1 x 1 maps take it on both."""
    x2, x1 = _t(RNG.standard_normal((3, 8, 2, 2))), _t(RNG.standard_normal((5, 7, 1, 1)))
    for avx512, takes_2x2 in ((False, True), (True, False)):
        monkeypatch.setattr(library, "avx512", lambda v=avx512: v)
        assert functional._one_gemm(x2, (5, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1) is takes_2x2
        assert functional._one_gemm(x1, (4, 7, 1, 1), (1, 1), (0, 0), (1, 1), 1) is True


def test_grad_norms_in_one_pass():
    """zoo_l2_norms against float64 numpy: tensors within one chunk of 2^15 values and across several
    (100003 values: 4 chunks, the last partial), a scalar, an empty one; the fallback (a bf16 tensor
    among them) gives the same norms through paddle's."""
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s).astype(np.float32) * 10.0 ** rng.integers(-3, 3)
              for s in [(3, 4), (100003,), (), (0, 5), (512, 64, 3, 3)]]
    expected = [np.sqrt((a.astype(np.float64) ** 2).sum()) for a in arrays]
    tensors = [_t(a, grad=False) for a in arrays]
    with functional.precision(fast_ops=True), _counting() as ran:
        norms = functional.grad_norms(tensors)
    assert ran == ["zoo_l2_norms"] and norms.dtype == paddle.float32 and list(norms.shape) == [5]
    np.testing.assert_allclose(norms.numpy(), expected, rtol=1e-6)
    with functional.precision(fast_ops=True), _counting() as ran:
        mixed = functional.grad_norms(tensors[:2] + [tensors[4].astype("bfloat16")])
    assert not ran
    np.testing.assert_allclose(mixed.numpy()[:2], expected[:2], rtol=1e-5)


# an empty batch too: Mask R-CNN's mask head on an image without a foreground RoI
@pytest.mark.parametrize("shape,frozen", [((3, 5, 7, 6), False), ((2, 4, 1, 1), False), ((4, 3, 5, 9), True),
                                          ((0, 4, 5, 5), False)])
def test_channel_bias(shape, frozen):
    """A convolution's bias (zoo_channel_bias) against float64 numpy: y = x + b[c], dx = dy, db[c] = the
    sum of dy over n, h and w; a frozen bias gets no gradient, the input still does."""
    xn, bn, gn = (RNG.standard_normal(s).astype(np.float32) for s in (shape, shape[1:2], shape))
    x, b = _t(xn), _t(bn, grad=not frozen)
    with functional.precision(fast_ops=True), _counting() as ran:
        y = functional._run("zoo_channel_bias", x, b)[0]
    (y * _t(gn, grad=False)).sum().backward()
    assert ran == ["zoo_channel_bias"] and list(y.shape) == list(shape)
    if xn.size:
        _close(y.numpy(), xn.astype(np.float64) + bn.astype(np.float64).reshape(1, -1, 1, 1))
    np.testing.assert_array_equal(x.grad.numpy(), gn)
    if frozen:
        assert b.grad is None
    else:
        _close(b.grad.numpy(), gn.astype(np.float64).sum(axis=(0, 2, 3)))


@pytest.mark.parametrize("kernel,bias", [(2, True), (3, False)])
def test_conv_transpose_whose_kernel_is_its_stride(kernel, bias):
    """A transposed convolution with kernel = stride (Mask R-CNN's 2x2 stride 2) as a 1x1 convolution,
    a pixel shuffle and the bias, against the layer itself: output, input, weight and bias gradients."""
    paddle.seed(3)
    d = nn.Conv2DTranspose(6, 5, kernel, stride=kernel, bias_attr=None if bias else False)
    if bias:
        d.bias.set_value(paddle.randn([5]))
    x = _t(RNG.standard_normal([3, 6, 7, 4]))
    dy = paddle.to_tensor(RNG.standard_normal([3, 5, 7 * kernel, 4 * kernel]).astype(np.float32))
    with _counting() as ran:
        fast = functional.conv_transpose(x, d)
    grads = paddle.grad(fast, [x, *d.parameters()], dy)
    with functional.precision(fast_ops=False):
        ref = d(x)
    for a, b in zip([fast, *grads], [ref, *paddle.grad(ref, [x, *d.parameters()], dy)]):
        _close(a.numpy(), b.numpy())
    assert sorted(ran) == (["zoo_channel_bias", "zoo_conv2d"] if bias else ["zoo_conv2d"])


def test_conv_transposes_with_overlapping_windows_take_the_layer():
    x = _t(RNG.standard_normal([2, 4, 5, 5]))
    for d in (nn.Conv2DTranspose(4, 3, 3, stride=2), nn.Conv2DTranspose(4, 3, 2, stride=2, padding=1),
              nn.Conv2DTranspose(4, 3, 2, stride=2, output_padding=1), nn.Conv2DTranspose(4, 4, 2, stride=2, groups=2)):
        with _counting() as ran:
            y = functional.conv_transpose(x, d)
        assert not ran and y.shape == d(x).shape


def _roi_boxes(rng, n, w, h, scale):
    """n boxes inside a w x h map's image (1 / scale larger), about a third of their far corners on its edge."""
    size = np.array([w / scale, h / scale])
    lo = rng.uniform(0, size, [n, 2])
    hi = np.minimum(lo + rng.uniform(0, 40, [n, 2]), size)
    edge = rng.uniform(size=[n, 2]) < 0.3
    hi[edge] = np.broadcast_to(size, [n, 2])[edge]
    return np.concatenate([lo, hi], 1).astype(np.float32)


@pytest.mark.parametrize("sampling_ratio,aligned", [(0, True), (2, True), (0, False), (3, False)])
def test_roi_align(sampling_ratio, aligned):
    """zoo_roi_align against paddle.vision.ops.roi_align, the op PaddleDetection calls: the output equal
    to paddle's, and the input gradient equal to the transposed Jacobian of paddle's forward, read off by
    putting a unit impulse at each pixel (one channel per pixel). Not paddle's backward: on paddle 3.3.1's
    CPU it disagrees with its own forward for boxes that reach the map's edge (19 of 60 random cases).
    Three images, the first without a RoI."""
    rng = np.random.default_rng(4)
    N, C, H, W, PH, PW, scale, counts = 3, 4, 9, 11, 7, 5, 0.25, np.array([0, 3, 2], np.int32)
    boxes = _roi_boxes(rng, 5, W, H, scale)
    xn, dyn = rng.standard_normal([N, C, H, W]).astype(np.float32), rng.standard_normal([5, C, PH, PW])
    args = ((PH, PW), scale, sampling_ratio, aligned)
    x = _t(xn)
    with _counting() as ran:
        y = functional.roi_align(x, paddle.to_tensor(boxes), paddle.to_tensor(counts), *args)
    dx = paddle.grad(y, x, paddle.to_tensor(dyn.astype(np.float32)))[0].numpy()
    assert ran == ["zoo_roi_align"]
    with functional.precision(fast_ops=False):
        _close(y.numpy(), reference.roi_align(_t(xn, False), paddle.to_tensor(boxes), paddle.to_tensor(counts),
                                              *args).numpy())
        want = np.zeros([N, C, H, W])
        pixels = np.arange(H * W)
        for n in range(N):
            impulses = np.zeros([N, H * W, H, W], np.float32)
            impulses[n, pixels, pixels // W, pixels % W] = 1
            jac = reference.roi_align(paddle.to_tensor(impulses), paddle.to_tensor(boxes), paddle.to_tensor(counts),
                                      *args).numpy().reshape(5, H * W, PH * PW)   # [RoI, pixel, bin]
            mine = slice(counts[:n].sum(), counts[:n + 1].sum())
            want[n] = np.einsum("rcb,rpb->cp", dyn[mine].reshape(-1, C, PH * PW), jac[mine]).reshape(C, H, W)
    _close(dx, want)


def test_convolutions_oneDNN_would_run_on_per_thread_columns_take_paddle(monkeypatch):
    """A convolution for which oneDNN asks more work space than one sample's im2col columns (its GEMM
    convolution, a column buffer per thread: DeepLabV3's dilated 3x3 on AVX2) and more than
    WORK_SPACE_FLOOR is paddle's own, which is im2col + GEMM with one buffer; the others are oneDNN's.
    The rule on the query's answer, for a dilated 3x3 convolution of 6 -> 4 channels over 2 x 17 x 14
    (padding 2, dilation 2: output 17 x 14): one sample's columns are 6 * 3 * 3 * 17 * 14 * 4 = 51408
    bytes (hand arithmetic); with the floor lowered to 0, then at its 32 MB."""
    conv = nn.Conv2D(6, 4, 3, padding=2, dilation=2, bias_attr=False)
    x = _t(RNG.standard_normal((2, 6, 17, 14)))
    asked = []
    for floor, work_space, runs_ours in ((0, 51408, True), (0, 51409, False), (0, 0, True),
                                         (32 << 20, 32 << 20, True), (32 << 20, (32 << 20) + 1, False)):
        monkeypatch.setattr(functional, "WORK_SPACE_FLOOR", floor)
        monkeypatch.setattr(library, "conv_work_space", lambda *a, ws=work_space: asked.append(a) or ws)
        functional._columns_per_thread.cache_clear()
        with functional.precision(fast_ops=True), _counting() as ran:
            y = functional.conv2d(x, conv)
        assert bool(ran) is runs_ours, (work_space, ran)
        with functional.precision(fast_ops=False):
            _close(y.numpy(), conv(x).numpy())
    assert asked[0] == ((2, 6, 17, 14), (4, 6, 3, 3), (1, 1), (2, 2), (2, 2), 0, 1)
    monkeypatch.undo()
    functional._columns_per_thread.cache_clear()
    # and oneDNN answers: no work space for a plain 3x3 convolution here; a positive size or none
    # (-1 would say it has no convolution) for the dilated one, whose kernel depends on the CPU
    assert library.conv_work_space((2, 64, 32, 32), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 0) >= 0
    assert library.conv_work_space((2, 6, 17, 14), (4, 6, 3, 3), (1, 1), (2, 2), (2, 2), 0) >= 0


def test_a_1x1_convolution_stays_on_onednn_whatever_its_work_space(monkeypatch):
    """A 1x1 convolution has no im2col columns on either route; oneDNN's work space there is its bf16
    kernels' transposition buffer (16-32 MB per thread on amd-zen4), which sent DeepLabV3-R50's bf16 1x1
    convolutions to paddle's fp32 kernel. Any reported size keeps it on oneDNN; a 3x3 one with the same
    answer goes to paddle (the rule above)."""
    monkeypatch.setattr(library, "conv_work_space", lambda *a: 1 << 40)
    x = _t(RNG.standard_normal((2, 6, 17, 14)))
    for k, runs_ours in ((1, True), (3, False)):
        functional._columns_per_thread.cache_clear()
        with functional.precision(fast_ops=True), _counting() as ran:
            functional.conv2d(x, nn.Conv2D(6, 4, k, padding=k // 2, bias_attr=False))
        assert bool(ran) is runs_ours, (k, ran)
    monkeypatch.undo()
    functional._columns_per_thread.cache_clear()


_SHARED_WORK_SPACE = """
import json
import numpy as np
import paddle
from ops import functional, library
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024
channels = [1024 + 16 * i for i in range(6)]
layers = [paddle.nn.Conv2D(c, 256, 1, bias_attr=False) for c in channels]
inputs = [paddle.to_tensor(np.ones((2, c, 64, 64), np.float32)).astype("bfloat16") for c in channels]
with functional.precision(fast_ops=True), functional.precision(bf16=True), functional.precision(bf16_act=True):
    functional.conv2d(paddle.ones([1, 4, 8, 8]), paddle.nn.Conv2D(4, 4, 1))   # the library's own pages
    before = rss()
    asked = [library.conv_work_space((2, c, 64, 64), (256, c, 1, 1), (1, 1), (0, 0), (1, 1), 3, prepare=True)
             for c in channels]
    prepared = rss()
    for conv, x in zip(layers, inputs):
        x.stop_gradient = False
        functional.conv2d(x, conv).astype("float32").sum().backward()
        x.clear_gradient(False)
    grads = sum(conv.weight.grad.numel().item() * 4 for conv in layers)
print("RESULT " + json.dumps({"asked": asked, "code": prepared - before, "grown": rss() - prepared, "grads": grads,
                              "buffer": library.scratchpad_bytes(), "bf16": functional.bf16_supported()}))
"""


def test_onednn_primitives_share_one_work_space():
    """Our oneDNN primitives run in user scratchpad mode on one buffer, grown to the largest work space
    asked (csrc/dnnl.cc, Context::scratchpad). In oneDNN's own mode each cached primitive of the bf16
    1x1 kernels kept its own transposition buffer: DeepLabV3-R50's bf16 step held 3.5 GB instead of 2.75
    (amd-zen4). Six DeepLabV3-sized bf16 1x1 convolutions of distinct shapes, forward and backward, in
    a child whose glibc unmaps every freed block above 64 KB, so that its resident memory is what is
    alive. Their primitives are made first (their JIT code resident before the runs are measured); the
    runs then leave alive the shared buffer and the weights' gradients: every bound comes from what
    oneDNN reports for these shapes on this CPU (its work-space query) and the shapes, not from one
    kind's figures, which differ by kernel: amd-zen4 with 2 threads asks 34-36 MB for each (44 MB grown:
    the 36 MB buffer, 6.5 MB of gradients; 275 MB with a buffer per call, 266 before the sharing); an
    Intel AMX Xeon's brgemm kernels 1.2-18 MB, where a bound of half their sum failed (31.6 MB grown
    against 27.9) because it counted the primitives' code and the gradients as work space.
    Without native bf16 they run on oneDNN's fp32 primitives (csrc/dnnl.cc, ConvActForward), whose work
    spaces the same query reports."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=ROOT, GLOG_minloglevel="2", MALLOC_MMAP_THRESHOLD_="65536",
               MALLOC_TRIM_THRESHOLD_="65536")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _SHARED_WORK_SPACE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    asked = r["asked"]
    assert min(asked) >= 0 and max(asked) <= r["buffer"] < max(asked) + 4096, r
    # Alive after the runs: the buffer and the gradients (and ~2 MB of the heap's small blocks, seen on
    # amd-zen4 with and without work spaces). Had each primitive kept its own work space, the other five
    # would add theirs: the bound lies halfway, so it fails where the sharing breaks, wherever their work
    # spaces stand out of those 2 MB (8 MB: amd-zen4 asks 173 MB for the five, AMX 40; oneDNN's fp32 1x1
    # kernels under the AVX2 and AVX512_CORE caps none, and then there is nothing to share)
    others = sum(asked) - max(asked)
    if others >= 8 << 20:
        assert r["grown"] < r["buffer"] + r["grads"] + others / 2, r


# (direction, lengths): AttentionLSTM's case (both directions over each sample's real steps; a sample
# with none, one with all nine), one direction over padded samples, and both over every step
LSTMS = [("bidirectional", [9, 3, 1, 7, 0]), ("forward", [9, 3, 1, 7, 0]), ("bidirectional", None),
         ("forward", None)]


@pytest.mark.parametrize("direction,lengths", LSTMS)
def test_lstm(direction, lengths):
    """oneDNN's LSTM (a call per direction; the backward one over each sample's real steps reversed)
    against paddle's LSTM kernel, the one PaddleVideo's AttentionLSTM runs: the outputs (0 on padding),
    the input's gradient and every weight's."""
    paddle.seed(0)
    rnn = nn.LSTM(6, 8, direction=direction)
    x = _t(RNG.standard_normal((5, 9, 6)))
    lens = None if lengths is None else paddle.to_tensor(lengths, dtype="int32")
    fast, ref = (_layer_grads(lambda x: functional.lstm(x, rnn, lens), [x], on, rnn) for on in (True, False))
    assert len(fast) == len(ref) == 2 + 4 * (1 + (direction == "bidirectional"))
    for a, b in zip(fast, ref):
        _close(a, b)
    if lengths:
        assert not fast[0][4].any() and not fast[0][1, 3:].any() and fast[0][0].all()
    # without gradients (evaluation): oneDNN's inference LSTM, which keeps no work space
    with paddle.no_grad(), functional.precision(fast_ops=True), _counting() as ran:
        y = functional.lstm(x, rnn, lens)
    assert ran == ["zoo_lstm_infer"] * (1 + (direction == "bidirectional")), ran
    _close(y.numpy(), ref[0])


def test_lstm_without_a_bias():
    """A layer built without bias_hh (paddle 3.3.1's CPU kernel crashes on it) computes what one with
    bias_hh = 0 computes on paddle's kernel."""
    paddle.seed(0)
    rnn, zero = nn.LSTM(6, 8, bias_hh_attr=False), nn.LSTM(6, 8)
    zero.set_state_dict(dict(rnn.state_dict(), bias_hh_l0=paddle.zeros([32])))
    x = _t(RNG.standard_normal((3, 4, 6)))
    with functional.precision(fast_ops=True), _counting() as ran:
        y = functional.lstm(x, rnn)
    assert ran == ["zoo_lstm"]
    _close(y.numpy(), zero(x)[0].numpy())


def test_lstms_it_does_not_cover_take_paddle():
    """Two layers, time-major input and a projection are not in the oneDNN operator, nor is a GRU:
    those run themselves."""
    x = _t(RNG.standard_normal((4, 5, 6)))
    for rnn in (nn.LSTM(6, 8, num_layers=2), nn.LSTM(6, 8, time_major=True), nn.LSTM(6, 8, proj_size=3),
                nn.GRU(6, 8)):
        with functional.precision(fast_ops=True), _counting() as ran:
            y = functional.lstm(x, rnn)
        assert not ran
        np.testing.assert_array_equal(y.numpy(), rnn(x)[0].numpy())


def test_conv2d_layers_it_does_not_cover_take_paddle():
    """"SAME" padding and NHWC are not in the oneDNN operator: those layers run themselves."""
    x = _t(RNG.standard_normal((2, 4, 9, 8)))
    for conv in (nn.Conv2D(4, 4, 3, padding="SAME"),
                 nn.Conv2D(8, 4, 3, padding=1, data_format="NHWC")):
        with functional.precision(fast_ops=True), _counting() as ran:
            y = functional.conv2d(x, conv)
        assert not ran
        np.testing.assert_array_equal(y.numpy(), conv(x).numpy())


def test_dropout_masks_are_seeded_and_unbiased():
    x, b = _t(np.ones((400, 250)), grad=False), _t(np.zeros(250), grad=False)
    k1 = _run("zoo_bias_act", x, b, 0, 7, 0.3)[1].numpy()
    k2 = _run("zoo_bias_act", x, b, 0, 7, 0.3)[1].numpy()
    k3 = _run("zoo_bias_act", x, b, 0, 8, 0.3)[1].numpy()
    assert (k1 == k2).all() and not (k1 == k3).all()
    assert abs(k1.mean() - 0.7) < 0.005                       # 100k draws: 5 sigma ~ 0.007
    paddle.seed(3)
    a = functional.bias_act(x, b, None, 0.3).numpy()
    paddle.seed(3)
    assert (functional.bias_act(x, b, None, 0.3).numpy() == a).all()   # paddle.seed decides the masks
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.7)}


# ------------------------------------------------------------------------------------- layers
def _layer_grads(layer, inputs, on, params=None):
    """The output and gradients of `layer` (a Layer, or a function of the inputs with its Layer as `params`)."""
    params = params or layer
    xs = [_t(a.numpy(), grad=not a.stop_gradient) for a in inputs]
    params.clear_gradients()
    with functional.precision(fast_ops=on), _counting() as ran:
        y = layer(*xs)
    assert bool(ran) == on, ran
    y = y[-1] if isinstance(y, list) else y
    (y * paddle.to_tensor(np.random.default_rng(4).standard_normal(y.shape).astype(np.float32))).sum().backward()
    return [y.numpy()] + [x.grad.numpy() for x in xs if not x.stop_gradient] + \
        [p.grad.numpy() for p in params.parameters() if p.grad is not None]


def _same_layer(layer, inputs, tol=1e-5):
    fast, ref = _layer_grads(layer, inputs, True), _layer_grads(layer, inputs, False)
    assert len(fast) == len(ref) and len(fast) > 3
    for a, b in zip(fast, ref):
        _close(a, b, tol)


def test_bert_layer_fast_equals_reference():
    from models.nlp.bert import EncoderLayer  # BERT's: the name is the Transformer's at the top
    paddle.seed(0)
    layer = EncoderLayer(48, 4, 96, "gelu", 0.0, 0.0, 1e-12)
    _same_layer(layer, [_t(RNG.standard_normal((3, 9, 48))), _padding_mask(3, 9, [9, 5, 2])])


def test_transformer_layers_fast_equal_reference():
    paddle.seed(0)
    for pre in (True, False):
        enc = EncoderLayer(32, 4, 64, 0.0, 0.0, 0.0, pre)
        _same_layer(enc, [_t(RNG.standard_normal((2, 7, 32))), _padding_mask(2, 7, [7, 3])])
        dec = DecoderLayer(32, 4, 64, 0.0, 0.0, 0.0, pre)
        mem = _t(RNG.standard_normal((2, 6, 32)), grad=False)
        causal = _t(np.triu(np.full((5, 5), -1e9, np.float32), 1), grad=False)

        class Wrap(nn.Layer):
            def __init__(self):
                super().__init__()
                self.dec = dec

            def forward(self, x):
                return self.dec(x, self.dec.cross_attn.project_kv(mem), causal, _padding_mask(2, 6, [6, 4]))
        _same_layer(Wrap(), [_t(RNG.standard_normal((2, 5, 32)))])


def test_resnet_fast_equals_reference_in_training():
    """A whole ResNet-18 and both kinds of bottleneck block (identity and strided projection).

    Not a whole ResNet-50: its input gradient is ill-conditioned at these tiny shapes (the reference
    path alone moves by 4e-4 of its scale when the input moves by 1e-6, and ReLU/max-pool ties flip),
    so float32 summation order, not the operators, would decide such a test."""
    paddle.seed(0)
    net = ResNet(depth=18, base_channels=8, out_indices=[3])
    cases = [(net, _t(RNG.standard_normal((2, 3, 97, 95))), 1e-4)]   # odd sizes; 4x3 at the last stage
    for stride, project in ((1, False), (2, True)):
        cases.append((Bottleneck(32, 8, stride, 1, project, False, False), _t(RNG.standard_normal((2, 32, 9, 7))),
                      1e-5))
    for layer, x, tol in cases:
        layer.train()
        state = {k: v.numpy().copy() for k, v in layer.state_dict().items()}
        fast = _layer_grads(layer, [x], True)
        stats_fast = {k: v.numpy().copy() for k, v in layer.state_dict().items() if "_mean" in k or "_variance" in k}
        layer.set_state_dict(state)
        ref = _layer_grads(layer, [x], False)
        assert len(fast) == len(ref) > 3
        for a, b in zip(fast, ref):
            _close(a, b, tol)
        for k, v in layer.state_dict().items():
            if k in stats_fast:
                _close(stats_fast[k], v.numpy(), 1e-5)
                assert not np.allclose(v.numpy(), state[k])   # the running statistics moved


def test_deeplabv3_fast_equals_reference_and_recomputes():
    """DeepLabV3's head (ConvBNReLU) and dilated trunk on the fused BN kernels; with backbone
    recompute, the stage runs twice and its BN statistics still move once (the kernel updates them in
    place, recompute_stage puts them back)."""
    load_all()
    small = {"name": "ResNet", "depth": 18, "output_stride": 16, "multi_grid": [1, 2], "base_channels": 8}
    paddle.seed(0)
    models = [DeepLabV3(num_classes=3, backbone=dict(small, recompute=r), aspp_channels=8, dropout=0.0)
              for r in (False, True, False)]
    for m in models[1:]:
        m.set_state_dict(models[0].state_dict())
    # inputs of their own: which tests ran before must not pick them. One draw seen moved gradients by
    # 1e-3 between the paths while every operator test holds 1e-5: the signature of a ReLU / max-pool
    # tie that float32 rounding (oneDNN vs paddle's GEMM) flips, as in the ResNet test above
    rng = np.random.default_rng(1)
    x, label = _t(rng.standard_normal((2, 3, 45, 53)), grad=False), paddle.to_tensor(rng.integers(0, 3, (2, 45, 53)))
    for m, on in zip(models, (True, True, False)):
        m.train()
        with functional.precision(fast_ops=on), _counting() as ran:
            m({"image": x, "label": label})["loss"].backward()
        assert ("zoo_bn_act" in ran and "zoo_bn_add_act" in ran and "zoo_conv2d" in ran) == on
    fast, remat, ref = models
    grads = {n: p.grad.numpy() for n, p in fast.named_parameters() if not p.stop_gradient}
    assert len(grads) > 60
    for other, tol in ((remat, 1e-6), (ref, 1e-4)):
        for n, p in other.named_parameters():
            if not p.stop_gradient:
                _close(p.grad.numpy(), grads[n], tol)
        for k, v in other.state_dict().items():
            _close(v.numpy(), fast.state_dict()[k].numpy(), 1e-5)


# ----------------------------------------------------------------------------------- fallback
def test_fallback_when_disabled_or_unbuildable(monkeypatch, caplog):
    x, b = _t(RNG.standard_normal((4, 8))), _t(RNG.standard_normal(8))
    calls = []
    real = functional._run
    monkeypatch.setattr(functional, "_run", lambda *a: calls.append(a[0]) or real(*a))
    with functional.precision(fast_ops=False):
        ref = functional.bias_act(x, b, "gelu").numpy()
    assert not calls
    _close(ref, F.gelu(x + b).numpy())
    with functional.precision(fast_ops=True):
        _close(functional.bias_act(x, b, "gelu").numpy(), ref)
    assert calls == ["zoo_bias_act"]
    # a machine where the library cannot be built: one warning, then the reference path
    monkeypatch.setitem(library.state, "loaded", None)
    monkeypatch.setattr(library, "build", lambda: (_ for _ in ()).throw(RuntimeError("g++ failed (test)")))
    calls.clear()
    with caplog.at_level(logging.WARNING, logger="zoo"), functional.precision(fast_ops=True):
        out = functional.bias_act(x, b, "gelu").numpy()
        functional.bias_act(x, b, "gelu")
    assert not calls and "g++ failed (test)" in caplog.text and caplog.text.count("not available") == 1
    _close(out, ref)
    monkeypatch.setitem(library.state, "loaded", True)


def test_a_corrupt_cached_library_is_one_warning_line(monkeypatch, tmp_path, caplog):
    """A cached library that no longer loads (a truncated file): one warning line naming it, then the
    reference path; paddle's loader error brings several lines of advice that are not ours to print."""
    monkeypatch.setenv("ZOO_FAST_OPS_DIR", str(tmp_path))
    path = library.library_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("garbage")
    monkeypatch.setitem(library.state, "loaded", None)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert library.load() is False
    warnings = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(warnings) == 1 and path in warnings[0] and "\n" not in warnings[0], warnings
    monkeypatch.setitem(library.state, "loaded", True)


def test_a_changed_header_builds_a_new_library(monkeypatch, tmp_path):
    """csrc/bf16.h is compiled into both sources: editing it alone must not reuse a cached build."""
    header = tmp_path / "bf16.h"
    header.write_bytes(open(library.HEADERS[0], "rb").read())
    monkeypatch.setattr(library, "HEADERS", [str(header)])
    before = library.library_path()
    header.write_text(header.read_text() + "// edited\n")
    assert library.library_path() != before


def test_without_onednn_headers_matmul_and_conv_take_paddle(monkeypatch, caplog):
    """A machine without the oneDNN headers builds ops.cc alone (one warning); matmul and conv2d then
    run paddle's kernels while the other fused operators stay on."""
    monkeypatch.setattr(library, "onednn_headers", lambda: None)
    monkeypatch.setitem(library.state, "warned", False)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert library.sources() == library.SOURCES[:1] and library.sources() == library.SOURCES[:1]
        commands, _ = library.compile_commands("/tmp/x.so")
    assert caplog.text.count("onednn-devel-cpu-gomp") == 1
    assert len(commands) == 2 and not any("dnnl" in arg for arg in commands[-1])
    monkeypatch.setitem(library.state, "dnnl", False)
    conv = nn.Conv2D(3, 4, 3, padding=1)
    x, w = _t(RNG.standard_normal((2, 3, 6, 5))), _t(RNG.standard_normal((5, 4)))
    with functional.precision(fast_ops=True), _counting() as ran:
        y = functional.conv2d(x, conv)
        z = functional.matmul(x, w)
        functional.layer_norm(z, _t(np.ones(4)), _t(np.zeros(4)))
    assert ran == ["zoo_layer_norm"]
    np.testing.assert_array_equal(y.numpy(), conv(x).numpy())
    np.testing.assert_array_equal(z.numpy(), paddle.matmul(x, w).numpy())


def test_build_runs_once_under_the_lock_and_survives_a_read_only_cache(monkeypatch, tmp_path):
    """Concurrent first uses (workers, ranks, test sessions) build once; a cache folder that cannot be
    made or written (read-only home) moves the build to the temp folder. g++ is replaced by a counter."""
    import threading
    import time
    calls = tmp_path / "calls.txt"

    def commands(out):
        script = f"echo built >> {calls}; sleep 0.3; echo lib > {out}"
        return [["sh", "-c", script]], [out[:-3] + ".o"]
    monkeypatch.setattr(library, "compile_commands", commands)
    monkeypatch.setenv("ZOO_FAST_OPS_DIR", str(tmp_path / "cache"))
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(library.build())) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert calls.read_text() == "built\n" and len(set(paths)) == 1 and paths[0].startswith(str(tmp_path / "cache"))
    assert open(paths[0]).read() == "lib\n"
    assert [n for n in os.listdir(os.path.dirname(paths[0])) if n.endswith((".so", ".o"))] == ["zoo_fast_ops.so"]

    blocked = tmp_path / "a_file"   # a cache folder below a file cannot be made, even by root
    blocked.write_text("")
    monkeypatch.setenv("ZOO_FAST_OPS_DIR", str(blocked / "cache"))
    monkeypatch.setattr(library.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    path = library.build()
    assert path.startswith(str(tmp_path / "tmp")) and open(path).read() == "lib\n"


def test_reference_path_traces_under_to_static():
    """Export traces the reference path (no custom operator inside an exported program)."""
    paddle.seed(0)
    model = BertModel(size="tiny", vocab_size=50, max_position_embeddings=16)
    model.eval()
    ids = paddle.to_tensor(RNG.integers(1, 50, (2, 8)).astype(np.int64))
    with functional.precision(fast_ops=True), _counting() as ran:
        eager = model(ids)[0].numpy()
    assert "zoo_bias_dropout_residual_ln" in ran
    with functional.precision(fast_ops=True):
        static = paddle.jit.to_static(model, full_graph=True)
        traced = static(ids)[0].numpy()
        prog = str(static.forward.concrete_program.main_program)
    assert "zoo_" not in prog
    _close(traced, eager)
    for pre in (True, False):
        layer = EncoderLayer(32, 4, 64, 0.0, 0.0, 0.0, pre)
        x, mask = _t(RNG.standard_normal((2, 7, 32)), grad=False), _padding_mask(2, 7, [7, 3])
        with functional.precision(fast_ops=True), _counting() as ran:
            eager = layer(x, mask).numpy()
        assert "zoo_softmax_dropout" in ran
        with functional.precision(fast_ops=True):
            static = paddle.jit.to_static(layer, full_graph=True)
            traced = static(x, mask).numpy()
            prog = str(static.forward.concrete_program.main_program)
        assert "zoo_" not in prog and "layer_norm" in prog
        _close(traced, eager)


def test_config_switch(tmp_path):
    cfg = config.load("configs/nlp/bert/bert_glue_demo.yaml", ["runtime.fast_ops=false"], validate_config=False)
    runtime.setup(cfg.runtime)
    assert not functional.current_precision().fast_ops
    cfg = config.load("configs/nlp/bert/bert_glue_demo.yaml", validate_config=False)
    runtime.setup(cfg.runtime)
    assert functional.current_precision().fast_ops   # on by default


# --------------------------------------------------------------------------------- a demo recipe
def _first_epoch_losses(run_dir):
    """{step: (loss, mlm_loss, nsp_loss)} of the first epoch's lines in a run's train.log."""
    found = re.findall(r"epoch 1 batch \d+/\d+ step (\d+) loss ([\d.]+) mlm_loss ([\d.]+) nsp_loss ([\d.]+)",
                       open(os.path.join(run_dir, "train.log")).read())
    return {int(s): tuple(map(float, v)) for s, *v in found}


def test_pretraining_demo_trains_alike_on_either_path(bert_demo, bert_pretrain_run, tmp_path, monkeypatch):
    """The BERT pretraining demo (session fixture: runtime.fast_ops on, the default) trained again on
    the pure Paddle path, with the same seed and dropout masks. Its first epoch's logged losses agree
    to 1e-3 relative: the same arithmetic up to rounding (measured: equal to the 4 logged decimals
    through step 80). After that, rounding differences grow as in any two runs (NSP is learnt late and
    suddenly: 0.84 against 0.89 once), so the end is held to the demo's own bars on both paths."""
    log = open(os.path.join(bert_pretrain_run, "train.log")).read()
    assert "fused C++ operators loaded" in log and "not available" not in log   # the fast path ran
    out = tmp_path / "reference"
    tool("train", "-c", BERT_PRETRAIN_DEMO, "--output", out, "-o", "runtime.fast_ops=false")
    assert "fused C++ operators" not in open(out / "train.log").read()
    fast, ref = _first_epoch_losses(bert_pretrain_run), _first_epoch_losses(out)
    assert len(ref) >= 4 and sorted(fast) == sorted(ref), (fast, ref)
    for step in ref:
        np.testing.assert_allclose(fast[step], ref[step], rtol=1e-3, err_msg=f"step {step}")
    monkeypatch.chdir(ROOT)
    majority, _ = nsp_majority(out)
    with open(os.path.join(bert_demo, "stats.json")) as f:
        frequent = json.load(f)["most_frequent_token_rate"]
    for metrics in (read_metrics(bert_pretrain_run), read_metrics(out)):   # tests/test_bert_demos.py's bars
        assert metrics["nsp_acc"] > majority + 0.1 and metrics["mlm_acc"] >= 2 * frequent, (metrics, majority)


# ------------------------------------------------------------------ machines without the tools
# Simulated for real, in a fresh process: a PATH without any C/C++ compiler, oneDNN's headers hidden
# (ZOO_ONEDNN_INCLUDE pointing at an empty folder is the only place searched). Each case then trains
# one step through the layers a model calls and reports which fused operators ran.
_PROBE = r"""
import json, logging, sys
import numpy as np, paddle, paddle.nn as nn
import ops
from ops import functional, library
from tests.helpers import counting_fused_ops
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout, force=True)
paddle.seed(0)
conv, bn, fc, norm = nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4), nn.Linear(4, 4), nn.LayerNorm(4)
x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype("float32"))
def step(on):
    with functional.precision(fast_ops=on), counting_fused_ops() as ran:
        h = ops.conv_bn_act(x, conv, bn).transpose([0, 2, 3, 1])
        y = ops.linear_add_norm(ops.linear(h, fc, act="gelu"), fc, h, norm)
        y.sum().backward()
    return y.numpy(), list(ran)
fused, ran = step(True)
ref, _ = step(False)
print("RESULT " + json.dumps({"ran": ran, "dnnl": library.state["dnnl"], "loaded": library.state["loaded"],
                              "max_diff": float(np.abs(fused - ref).max())}))
"""


def _without(tmp_path, **env):
    return dict(os.environ, PYTHONPATH=ROOT, GLOG_minloglevel="2", **env)


def _probe(env):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-W", "ignore:No ccache found", "-c", _PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    return result, [ln for ln in proc.stdout.splitlines() if not ln.startswith("RESULT ")]


def _path_without_compilers(tmp_path):
    """A bin folder with every program of $PATH but the C and C++ compilers."""
    folder = tmp_path / "bin"
    folder.mkdir()
    compiler = re.compile(r"^(.*-)?(g\+\+|gcc|c\+\+|cc|clang\+*)(-[\d.]+)?$")
    for d in os.environ["PATH"].split(os.pathsep):
        for name in os.listdir(d) if os.path.isdir(d) else []:
            if not compiler.match(name) and not (folder / name).exists():
                os.symlink(os.path.join(d, name), folder / name)
    return str(folder)


def test_without_gxx_make_ops_says_so_and_training_takes_the_reference(tmp_path):
    import shutil
    import subprocess
    import sys
    env = _without(tmp_path, PATH=_path_without_compilers(tmp_path), ZOO_FAST_OPS_DIR=str(tmp_path / "cache"))
    assert shutil.which("g++", path=env["PATH"]) is None and shutil.which("cat", path=env["PATH"])
    proc = subprocess.run([sys.executable, "-W", "ignore:No ccache found", "-m", "ops"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and lines == [lines[-1]] and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("error: the fused operators could not be built: g++ could not run"), lines
    result, log_lines = _probe(env)
    assert result["loaded"] is False and result["ran"] == [] and result["max_diff"] == 0.0, result
    warned = [ln for ln in log_lines if "not available" in ln]
    assert len(warned) == 1 and "g++ could not run" in warned[0], log_lines


def test_with_the_onednn_headers_hidden_only_matmul_and_conv_take_paddle(tmp_path):
    """A real build of ops.cc alone (cached like any other: ~20 s once per machine and source)."""
    (tmp_path / "empty").mkdir()
    result, log_lines = _probe(_without(tmp_path, ZOO_ONEDNN_INCLUDE=str(tmp_path / "empty")))
    assert result["loaded"] is True and result["dnnl"] is False, result
    assert sorted(set(result["ran"])) == ["zoo_bias_act", "zoo_bias_dropout_residual_ln", "zoo_bn_act"], result
    assert result["max_diff"] < 1e-5, result
    assert sum("onednn-devel-cpu-gomp" in ln for ln in log_lines) == 1, log_lines
    result, _ = _probe(_without(tmp_path))   # the headers found: the same step with the oneDNN operators
    assert {"zoo_conv2d", "zoo_matmul"} <= set(result["ran"]) and result["dnnl"] is True, result


# ------------------------------------------------------------------------------ the package itself
def test_paddle_private_attributes_are_read_as_the_layers_were_built():
    """ops/paddle_attrs.py against the constructor arguments: a paddle upgrade that renames one fails here."""
    c = conv2d_settings(nn.Conv2D(3, 4, 3, stride=2, padding=[1, 2], dilation=3, groups=1))
    assert (c.stride, c.padding, c.dilation, c.groups, c.data_format, c.padding_mode) == \
        ([2, 2], [1, 2], [3, 3], 1, "NCHW", "zeros")
    assert conv2d_settings(nn.Conv2D(3, 4, 3, padding="SAME")).padding is None
    assert conv2d_settings(nn.Conv2D(3, 4, 3, padding=[1, 0, 2, 1])).padding is None   # asymmetric
    assert conv2d_settings(nn.Conv2D(4, 4, 3, groups=2, padding_mode="reflect", padding=1)).padding_mode == "reflect"
    t = conv_transpose_settings(nn.Conv2DTranspose(3, 4, [2, 3], stride=[2, 1], padding=1, output_padding=[1, 0]))
    assert (t.kernel, t.output_padding, t.conv.stride, t.conv.padding) == ([2, 3], [1, 0], [2, 1], [1, 1])
    bn = nn.BatchNorm2D(5, momentum=0.8, epsilon=1e-3, use_global_stats=True)
    s = batch_norm_settings(bn)
    assert (s.momentum, s.epsilon, s.use_global_stats, s.data_format) == (0.8, 1e-3, True, "NCHW")
    state = bn.state_dict()
    assert s.mean.name == state["_mean"].name and s.variance.name == state["_variance"].name
    assert batch_norm_settings(nn.BatchNorm2D(5)).use_global_stats is None
    assert abs(layer_norm_epsilon(nn.LayerNorm(4, epsilon=1e-12)) - 1e-12) < 1e-20
    rnn = nn.LSTM(3, 4, num_layers=2, direction="bidirect", time_major=True)
    s = lstm_settings(rnn)
    assert (s.mode, s.num_layers, s.time_major, s.proj_size) == ("LSTM", 2, True, 0)
    assert [[w.shape for w in d] for d in s.weights] == [[[16, 3], [16, 4], [16], [16]]] * 2
    assert s.weights[1][1] is rnn.weight_hh_l0_reverse and s.weights[0][3] is rnn.bias_hh_l0
    assert lstm_settings(nn.LSTM(3, 4, proj_size=2)).proj_size == 2
    assert lstm_settings(nn.LSTM(3, 4, bias_hh_attr=False)).weights[0][3] is None


def test_models_use_the_layer_package_not_its_switches():
    """What ops/ may import is tests/test_layout.py's floor table (nothing of ours)."""
    for folder, _, files in os.walk(os.path.join(ROOT, "models")):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(folder, name)).read()
                assert not re.search(r"fast_ops|active\(", text), os.path.join(folder, name)
