"""bf16 mixed precision on the CPU (issue 22): matmul and convolution compute in bf16 on oneDNN with
fp32 accumulation, forward and both gradients; the rest stays fp32.

The expected values are not our operators' own: they are the fp32 (float64 for matmul) products of
operands rounded to bf16 here, in numpy, by the format's definition (the top 16 bits of the float32
pattern, rounded to nearest, ties to even). Our kernels must agree with that to fp32 accumulation
error (1e-5), which fails if they round differently (truncate, round twice, skip the gradient
operands) or keep an operand in fp32.
"""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import pytest

import ops
from engine import config, runtime
from engine.components import load_all
from engine.cpu import has_bf16
from engine.errors import ConfigError
from engine.session import Session
from ops import functional
from tests.conftest import ATTENTION_LSTM_DEMO, BERT_PRETRAIN_DEMO, NATIVE_BF16, TSN_DEMO, needs_native_bf16
from tests.helpers import ENV, ROOT, counting_fused_ops, fused_ops_on, nsp_majority, read_metrics, tool

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

RNG = np.random.default_rng(22)
BF16 = ["-o", "train.amp.enable=true", "-o", "train.amp.dtype=bfloat16"]


@pytest.fixture(scope="module", autouse=True)
def fused():
    with fused_ops_on():
        # our AMD Zen 4 and Intel Xeon kinds compute bf16 natively (AVX512_BF16; AMX on Intel)
        assert ops.bf16_supported() == NATIVE_BF16, "oneDNN and the CPU's flags disagree on native bf16"
        yield


def bf16(a):
    """float32 -> nearest bf16 (ties to even) -> float32, from the bit pattern; subnormals -> 0."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    out = rounded.view(np.float32).copy()
    out[np.abs(np.asarray(a, np.float32)) < np.finfo(np.float32).tiny] = 0.0
    return out


def _close(a, b, tol=1e-5):
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


def _t(a, grad=True):
    t = paddle.to_tensor(np.asarray(a, np.float32))
    t.stop_gradient = not grad
    return t


@needs_native_bf16
def test_rounding_is_to_nearest_even_with_subnormals_flushed():
    """The operands' rounding, on both code paths of the conversion (16-lane vectors, the scalar tail)."""
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 1e-40, -1e-40, np.inf, -0.0, 3.0,
                       2 ** -126, -(1 + 2 ** -7 + 2 ** -8)], np.float32)
    expected = [1.0, 1 + 2 ** -6, 1 + 2 ** -7, 0.0, -0.0, np.inf, -0.0, 3.0, 2 ** -126, -(1 + 2 ** -6)]
    for n in (1, 3):   # 10 values (scalar tail only), 30 (one vector of 16, then the tail)
        x = paddle.to_tensor(np.tile(values, n)[None, :])
        _, xb, _ = functional._run("zoo_matmul_bf16", x, paddle.ones([x.shape[1], 1]), False, False)
        assert xb.dtype == paddle.bfloat16
        got = xb.astype("float32").numpy()[0]
        np.testing.assert_array_equal(got, np.tile(expected, n))
        assert np.array_equal(np.signbit(got), np.signbit(np.tile(expected, n)))
        np.testing.assert_array_equal(got, bf16(np.tile(values, n)))   # the test's own rounding agrees
    nan = functional._run("zoo_matmul_bf16", paddle.to_tensor([[np.nan] * 17], "float32"), paddle.ones([17, 1]),
                          False, False)[1]
    assert np.isnan(nan.astype("float32").numpy()).all()


FORMS = [   # every form our layers use (tests/test_fast_ops.py MATMUL_FORMS), with sizes past a vector
    ((5, 37), (37, 19), False, False), ((37, 5), (37, 19), True, False), ((5, 37), (19, 37), False, True),
    ((37, 5), (19, 37), True, True), ((2, 5, 33), (33, 17), False, False), ((3, 4, 29), (21, 29), False, True),
    ((2, 3, 5, 23), (2, 3, 23, 4), False, False), ((2, 3, 5, 23), (2, 3, 4, 23), False, True),
    ((2, 3, 23, 5), (2, 3, 23, 4), True, False),
]


def _mm(a, b, tx, ty):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.matmul(np.swapaxes(a, -1, -2) if tx else a, np.swapaxes(b, -1, -2) if ty else b)


@needs_native_bf16
@pytest.mark.parametrize("xs, ys, tx, ty", FORMS)
def test_matmul_computes_on_bf16_operands(xs, ys, tx, ty):
    """out = r(x) r(y); with upstream gradient g: dx = r(g) r(y)^T, dy = r(x)^T r(g) (in the forms'
    layouts), r the bf16 rounding; results and gradients fp32."""
    xn, yn = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ys).astype(np.float32)
    x, y = _t(xn), _t(yn)
    with ops.precision(bf16=True), counting_fused_ops() as ran:
        out = functional.matmul(x, y, tx, ty)
    # a 2-D y (a weight) is rounded again in the backward; batched operands keep both rounded copies
    assert ran == ["zoo_linear_bf16" if len(ys) == 2 else "zoo_matmul_bf16"] and out.dtype == paddle.float32
    g = RNG.standard_normal(out.shape).astype(np.float32)
    (out * _t(g, grad=False)).sum().backward()
    assert x.grad.dtype == paddle.float32 and y.grad.dtype == paddle.float32
    rx, ry, rg = bf16(xn), bf16(yn), bf16(g)
    _close(out.numpy(), _mm(rx, ry, tx, ty))
    # d/dx of sum(g * op(x) op(y)): the gradient of op(x) is g op(y)^T, transposed back when tx
    dop_x = _mm(rg, ry, False, not ty)
    dop_y = _mm(rx, rg, not tx, False)
    if len(ys) == 2 and len(xs) > 2:
        dop_y = dop_y.reshape(-1, *dop_y.shape[-2:]).sum(0)   # a 2-D y is shared by the folded rows
    _close(x.grad.numpy(), np.swapaxes(dop_x, -1, -2) if tx else dop_x)
    _close(y.grad.numpy(), np.swapaxes(dop_y, -1, -2) if ty else dop_y)
    # and it is not fp32: the exact fp32 product differs from it by bf16's rounding, far above 1e-5
    rel = np.linalg.norm(out.numpy() - _mm(xn, yn, tx, ty)) / np.linalg.norm(_mm(xn, yn, tx, ty))
    assert 5e-4 < rel < 1e-2, rel


@needs_native_bf16
@pytest.mark.parametrize("stride, padding, dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 0, 1)])
def test_convolution_computes_on_bf16_operands(stride, padding, dilation, monkeypatch):
    """y = conv(r(x), r(w)); dx and dw those of paddle's fp32 convolution on r(x), r(w) with upstream
    gradient r(g): the rounding happens inside our layout reorders, so the fp32 convolution of the
    rounded operands is the reference. (oneDNN's, whatever work space it needs: see test_fast_ops.)"""
    monkeypatch.setattr(functional, "_columns_per_thread", lambda *a: False)
    conv = nn.Conv2D(19, 21, 3, stride=stride, padding=padding, dilation=dilation, bias_attr=False)
    xn = RNG.standard_normal((2, 19, 13, 11)).astype(np.float32)
    x = _t(xn)
    with ops.precision(bf16=True), counting_fused_ops() as ran:
        out = functional.conv2d(x, conv)
    assert ran == ["zoo_conv2d_bf16"] and out.dtype == paddle.float32
    g = RNG.standard_normal(out.shape).astype(np.float32)
    (out * _t(g, grad=False)).sum().backward()
    rx, rw = _t(bf16(xn)), _t(bf16(conv.weight.numpy()))
    with functional.precision(fast_ops=False):
        ref = F.conv2d(rx, rw, stride=stride, padding=padding, dilation=dilation)
    (ref * _t(bf16(g), grad=False)).sum().backward()
    _close(out.numpy(), ref.numpy())
    _close(x.grad.numpy(), rx.grad.numpy())
    _close(conv.weight.grad.numpy(), rw.grad.numpy())
    assert conv.weight.grad.dtype == paddle.float32


def _lstm_bf16_reference(x, w_ih, w_hh, b, dy):
    """One direction of an LSTM from zero states in float64, on bf16 operands where oneDNN's bf16 LSTM
    has them: x, the weights and the recurrent h are rounded (each step's h as the next GEMM reads it),
    the cell state and the gates are not; y is each step's h rounded. The gradients by backpropagation
    through time, the roundings passed through as the identity. Returns y, dx, dw_ih, dw_hh, db."""
    def sig(v):
        return 1 / (1 + np.exp(-v))
    xr, wi, wh = (bf16(a).astype(np.float64) for a in (x, w_ih, w_hh))
    T, N = x.shape[:2]
    H = w_hh.shape[1]
    h, c = np.zeros((N, H)), np.zeros((N, H))
    ys, saved = [], []
    for t in range(T):
        hr = bf16(h.astype(np.float32)).astype(np.float64)
        i, f, g, o = np.split(xr[t] @ wi.T + hr @ wh.T + b, 4, axis=1)
        i, f, g, o = sig(i), sig(f), np.tanh(g), sig(o)
        saved.append((hr, c, i, f, g, o))
        c = f * c + i * g
        h = o * np.tanh(c)
        ys.append(bf16(h.astype(np.float32)))
    dx, dwi, dwh, db = np.zeros(x.shape), np.zeros(w_ih.shape), np.zeros(w_hh.shape), np.zeros(b.shape)
    dh_next, dc_next = np.zeros((N, H)), np.zeros((N, H))
    for t in reversed(range(T)):
        hr, c_prev, i, f, g, o = saved[t]
        c = f * c_prev + i * g
        dh = dy[t] + dh_next
        dc = dh * o * (1 - np.tanh(c) ** 2) + dc_next
        dz = np.concatenate([dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g ** 2),
                             dh * np.tanh(c) * o * (1 - o)], axis=1)
        dwi += dz.T @ xr[t]
        dwh += dz.T @ hr
        db += dz.sum(0)
        dx[t] = dz @ wi
        dh_next, dc_next = dz @ wh, dc * f
    return np.stack(ys), dx, dwi, dwh, db


@needs_native_bf16
def test_lstm_computes_on_bf16_operands():
    """Under autocast the LSTM runs oneDNN's bf16 LSTM (zoo_lstm_bf16; AttentionLSTM's LSTMs were its
    fp32 part). Its output equals the float64 reference on bf16 x, weights and recurrent h
    (_lstm_bf16_reference: fp32 accumulation and oneDNN's activation functions, then one rounding of
    h to bf16, leave no difference on these values), in training and in evaluation; its gradients are
    the reference's to bf16's precision (oneDNN rounds the gates' gradients to bf16 for its GEMMs)."""
    T, N, C, H = 9, 5, 24, 16
    x = RNG.standard_normal((T, N, C)).astype(np.float32)
    w_ih, w_hh = (RNG.standard_normal((4 * H, k)).astype(np.float32) * 0.3 for k in (C, H))
    b = RNG.standard_normal(4 * H).astype(np.float32) * 0.1
    dy = RNG.standard_normal((T, N, H)).astype(np.float32)
    y_ref, *grads_ref = _lstm_bf16_reference(x, w_ih, w_hh, b, dy)
    args = [_t(x), _t(w_ih), _t(w_hh), _t(b)]
    y = functional._run("zoo_lstm_bf16", *args, False)[0]
    (y * _t(dy, grad=False)).sum().backward()
    with paddle.no_grad():
        y_eval = functional._run("zoo_lstm_bf16_infer", *args, False)[0]
    _close(y.numpy(), y_ref, 1e-6)
    _close(y_eval.numpy(), y_ref, 1e-6)
    for got, want in zip([a.grad.numpy() for a in args], grads_ref):
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-2, rel
    # and through the layer package: autocast picks it, both directions, per-sample lengths
    rnn = nn.LSTM(C, H, direction="bidirectional")
    with ops.precision(bf16=True), counting_fused_ops() as ran:
        functional.lstm(_t(x.transpose(1, 0, 2)), rnn, paddle.to_tensor([9, 3, 1, 7, 0], dtype="int32"))
    assert ran == ["zoo_lstm_bf16", "zoo_lstm_bf16"], ran


@needs_native_bf16
def test_outside_autocast_and_off_the_fused_path_nothing_is_bf16():
    x, y = _t(RNG.standard_normal((4, 8))), _t(RNG.standard_normal((8, 3)))
    with counting_fused_ops() as ran:
        functional.matmul(x, y)
        with ops.precision(bf16=False):
            functional.matmul(x, y)
        with ops.precision(bf16=True), functional.precision(fast_ops=False):
            functional.matmul(x, y)
    assert ran == ["zoo_matmul", "zoo_matmul"]
    assert not ops.current_precision().bf16


@needs_native_bf16
def test_layers_keep_norms_softmax_and_losses_in_fp32():
    """A BERT-style block under autocast: only the two GEMM kinds change name; the norm, softmax and
    cross-entropy kernels are the fp32 ones, and every output and parameter gradient is fp32."""
    d, heads = 32, 4
    lin, out_proj, norm = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)
    x = _t(RNG.standard_normal((2, 5, d)))
    mask = paddle.zeros([2, 1, 1, 5])
    with ops.precision(bf16=True), counting_fused_ops() as ran:
        q, k, v = ops.linear(x, lin).reshape([2, 5, 3, heads, d // heads]).transpose([2, 0, 3, 1, 4]).unbind(0)
        ctx = ops.attention(q, k, v, mask).transpose([0, 2, 1, 3]).reshape([2, 5, d])
        h = ops.linear_add_norm(ctx, out_proj, x, norm)
        loss, _ = ops.smooth_cross_entropy(h, paddle.zeros([2, 5], "int64"), 0.1)
        loss.mean().backward()
    assert set(ran) == {"zoo_linear_bf16", "zoo_matmul_bf16", "zoo_bias_dropout", "zoo_softmax_dropout", "zoo_bias_dropout_residual_ln",
                        "zoo_smooth_cross_entropy"}, sorted(set(ran))
    assert all(t.dtype == paddle.float32 for t in (h, loss, lin.weight.grad, norm.weight.grad, out_proj.bias.grad))


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(ENV, **env))


CAPABILITY = """
import logging, sys
sys.path.insert(0, "tools"); import _bootstrap
import ops
from engine import config, runtime
from engine.cpu import has_bf16
ops.set_precision(fast_ops=True)
runtime.setup_logging()
amp = config.AmpSection(enable=True, dtype="bfloat16")
runs = [runtime.resolve_amp(amp), runtime.resolve_amp(amp)]
print("bf16_supported", ops.bf16_supported(), "enable", [r.enable for r in runs])
"""


@pytest.mark.parametrize("isa, native", [("AVX512_CORE", False), ("AVX512_CORE_BF16", True), (None, True)])
def test_a_cpu_without_bf16_gets_one_line_and_fp32(isa, native):
    """ONEDNN_MAX_CPU_ISA caps what oneDNN may use: below AVX512_CORE_BF16 there is no native bf16, so
    the AMP setting resolves to fp32 with one log line (said once, however often it is resolved);
    at AVX512_CORE_BF16 (on Intel: bf16 without AMX) and uncapped it runs, on a CPU that has it (a CPU
    without, e.g. AMD Zen 3, gets the line at every cap)."""
    # an explicit cap replaces the one `make test-isa` runs this under; None inherits it
    native = native and (NATIVE_BF16 if isa is None else has_bf16({}))
    env = {"ONEDNN_MAX_CPU_ISA": isa} if isa else {}
    proc = _python(CAPABILITY, **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"bf16_supported {native} enable {[native, native]}" in proc.stdout, proc.stdout
    said = [ln for ln in proc.stdout.splitlines() if "no native bf16" in ln]
    assert len(said) == (0 if native else 1), proc.stdout
    if not native:
        cap = isa or os.environ.get("ONEDNN_MAX_CPU_ISA") or "unset"
        assert "AVX512_BF16 or AMX" in said[0] and "computing in fp32" in said[0] and f"={cap}" in said[0]


def test_float16_on_a_cpu_is_one_error_line(yt8m_demo, tmp_path):
    """(yt8m_demo: the recipe's data exists, so the error is the dtype's whatever ran before.)"""
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "train.amp.enable=true", "--output", tmp_path,
                check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: train.amp.dtype: float16 needs a GPU (paddle has no CPU float16 kernels); on a "
                      "CPU use train.amp.dtype=bfloat16"], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_eval_amp_follows_train_amp_unless_given():
    load_all()
    cfg = config.load(ATTENTION_LSTM_DEMO, ["train.amp.enable=true", "train.amp.dtype=bfloat16"])
    assert cfg.eval_amp == cfg.train.amp and cfg.eval_amp.enable
    cfg = config.load(ATTENTION_LSTM_DEMO, ["train.amp.enable=true", "train.amp.dtype=bfloat16",
                                            "eval.amp.enable=false"])
    assert not cfg.eval_amp.enable and cfg.eval_amp.dtype == "bfloat16" and cfg.train.amp.enable
    cfg = config.load(ATTENTION_LSTM_DEMO, ["eval.amp.enable=true", "eval.amp.dtype=bfloat16"])
    assert cfg.eval_amp.enable and not cfg.train.amp.enable
    with pytest.raises(ConfigError, match=r"eval\.amp\.dtyp: unknown key.*did you mean 'dtype'"):
        config.load(ATTENTION_LSTM_DEMO, ["eval.amp.dtyp=bfloat16"])
    with pytest.raises(ConfigError, match=r"eval\.amp\.dtype.*float16, bfloat16"):
        config.load(ATTENTION_LSTM_DEMO, ["eval.amp.dtype=bf16"])


def test_an_export_of_a_gpu_fp16_recipe_is_not_refused_on_a_cpu():
    """Only what computes reads the AMP settings: setting up (as tools/export.py does) passes, training
    and evaluation stop with the error line's message; eval.amp names itself."""
    load_all()
    s = Session.from_file(ATTENTION_LSTM_DEMO, ["train.amp.enable=true", "train.amp.dtype=float16"])
    s.setup(device="cpu")
    with pytest.raises(ConfigError, match=r"^train\.amp\.dtype: float16 needs a GPU"):
        s.train_amp
    with pytest.raises(ConfigError, match=r"^eval\.amp\.dtype: float16 needs a GPU.*use eval\.amp\.dtype=bfloat16"):
        s.eval_amp


@needs_native_bf16
def test_level_o2_on_a_cpu_keeps_fp32_weights():
    """paddle.amp.decorate(O2) would cast the weights to bf16, which paddle's CPU kernels cannot run:
    on a CPU O2 resolves to O1 (fp32 master weights, bf16 GEMMs)."""
    amp = runtime.resolve_amp(config.AmpSection(enable=True, dtype="bfloat16", level="O2"))
    assert amp.enable and amp.level == "O1"
    with pytest.raises(Exception, match="float16 needs a GPU"):
        runtime.resolve_amp(config.AmpSection(enable=True, dtype="float16", level="O1"), "eval.amp")


# ------------------------------------------------------------------------------- the demos in bf16
@needs_native_bf16
def test_bert_pretraining_demo_learns_in_bf16(bert_demo, tmp_path):
    """tests/test_bert_demos.py's two thresholds, trained and evaluated in bf16."""
    tool("train", "-c", BERT_PRETRAIN_DEMO, "--output", tmp_path, *BF16)
    log = open(tmp_path / "train.log").read()
    assert "train.amp: bfloat16 matmul and convolution on oneDNN" in log
    with open(os.path.join(bert_demo, "stats.json")) as f:
        rate = json.load(f)["most_frequent_token_rate"]
    metrics = read_metrics(tmp_path)
    assert metrics["mlm_acc"] >= 2 * rate, (metrics, rate)
    majority, pairs = nsp_majority(tmp_path)
    assert metrics["num_samples"] == pairs and metrics["nsp_acc"] > majority + 0.1, (metrics, majority)


@needs_native_bf16
def test_tsn_demo_learns_in_bf16(kinetics_demo, tmp_path):
    """tests/test_video_demos.py's threshold (top-1 >= 0.6, chance 0.2), trained and evaluated in bf16;
    eval.amp=false evaluates the same weights in fp32 to within a sample or two."""
    tool("train", "-c", TSN_DEMO, "--output", tmp_path, *BF16)
    assert "train.amp: bfloat16 matmul and convolution on oneDNN" in open(tmp_path / "train.log").read()
    m = read_metrics(tmp_path)
    assert m["top1"] >= 0.6 and m["num_samples"] == 60, m
    out = tmp_path / "fp32_eval"
    tool("eval", "-c", TSN_DEMO, "--weights", tmp_path / "final", "--split", "val", "--output", out,
         *BF16, "-o", "eval.amp.enable=false")
    assert abs(read_metrics(out)["top1"] - m["top1"]) <= 2 / 60 + 1e-9
