"""Subnormal floats: our fused kernels never write one, and the FTZ/DAZ guard (runtime.flush_denormals).

Intel cores compute on subnormal operands 70-100x slower (benchmarks/denormals.py measures it), and the
AMD ones far less, so the tests look for the values, not for time. The kernel tests run with the
guard OFF: they check the kernels themselves (an exp that clamped its argument at -87.3 used to give
every masked attention position ~1e-38). Each input is built to provoke the case: masked and long
rows, GELU far in its tails, one dominant logit over the Transformer's 33712 classes, gradients
small enough that products of normal numbers fall below 2^-126. The fused path must still agree
with the pure Paddle one (whose kernels do write subnormals there: a difference below 2^-126).
GEMMs (oneDNN's or paddle's) can only be kept from subnormal results by the guard; its tests give
subnormal inputs to a oneDNN matmul, a fused operator and paddle's matmul, on 2 OpenMP threads and
a new Python thread, with the switch on and off.
"""
import threading

import numpy as np
import paddle
import pytest

import ops
from engine import config, cpu, runtime
from engine.components import load_all
from ops import functional, library
from tests.conftest import needs_native_bf16

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

TINY = np.finfo(np.float32).tiny   # 2^-126, the smallest normal float32
RNG = np.random.default_rng(0)


def subnormals(a):
    a = np.asarray(a)
    return int(np.count_nonzero((a != 0) & (np.abs(a) < TINY)))


def _t(a, grad=True):
    t = paddle.to_tensor(np.asarray(a, np.float32))
    t.stop_gradient = not grad
    return t


def _tiny_normal(shape, low=2e-38, high=1e-36):
    """Normal floats of random sign just above the subnormal range: their products underflow."""
    mag = np.exp(RNG.uniform(np.log(low), np.log(high), shape))
    return (mag * RNG.choice([-1.0, 1.0], shape)).astype(np.float32)


@pytest.fixture(autouse=True)
def guard_off():
    """The kernels alone: FTZ/DAZ cleared on this thread and for the operators; restored after."""
    paddle.base.core.set_num_threads(2)
    library.set_threads(2)
    assert library.load(), library.state["error"]
    before = cpu.mxcsr() & (cpu.FTZ | cpu.DAZ)
    library.set_flush_denormals(False)
    cpu.flush_denormals(False)
    with functional.precision(fast_ops=True):
        yield
    library.set_flush_denormals(bool(before))
    cpu.flush_denormals(bool(before))


def _run_both(fn, inputs, upstream):
    """fn's output and input gradients (backward of sum(out * upstream)) on the fused and the pure path."""
    results = []
    for on in (True, False):
        xs = [_t(a.numpy(), grad=not a.stop_gradient) for a in inputs]
        with functional.precision(fast_ops=on):
            out = fn(*xs)
            (out * paddle.to_tensor(upstream)).sum().backward()
        results.append([out.numpy()] + [x.grad.numpy() for x in xs if not x.stop_gradient])
    return results


def _no_subnormals_and_agree(fn, inputs, upstream, tol=1e-5):
    fast, ref = _run_both(fn, inputs, upstream)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert subnormals(a) == 0, f"output {i}: {subnormals(a)} subnormal values (the pure path has {subnormals(b)})"
        scale = max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)
    return fast, ref


# ------------------------------------------------------------------------------ the kernels
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("kind", ["partly_masked", "fully_masked", "causal", "long"])
def test_masked_softmax_writes_no_subnormals(kind, p):
    """Padding (-1e4, BERT), causal (-1e9, the Transformer), a wholly masked row, and a long row whose
    scaled scores fall from 0 to -100 (probabilities through 1e-38 and below: the normalisation and the
    backward's products land in the subnormal range there; paddle's softmax clips its exponent at -64
    instead, so that row is also checked against float64). Dropout masks are the same on both
    paths only without dropout, so with p > 0 the fused path is checked alone."""
    B, H = 2, 2
    if kind == "long":
        S, T = 4, 1024
        x = np.broadcast_to(-np.linspace(0, 800, T, dtype=np.float32), (B, H, S, T)) + RNG.normal(0, 0.01, (B, H, S, T))
        mask = np.zeros((B, 1, 1, T), np.float32)
    else:
        S = T = 16
        x = RNG.standard_normal((B, H, S, T)) * 3
        if kind == "causal":
            mask = np.triu(np.full((S, T), -1e9, np.float32), 1)[None, None]
        else:
            mask = np.zeros((B, 1, 1, T), np.float32)
            mask[0, ..., 5:] = -1e4
            mask[1, ..., (0 if kind == "fully_masked" else 11):] = -1e4
    x, mask = _t(x), _t(mask, grad=False)
    upstream = RNG.standard_normal(x.shape).astype(np.float32)

    def fn(x):
        return functional.softmax_dropout(x, mask, 0.125, p, True)
    if p == 0.0:
        fast, _ = _no_subnormals_and_agree(fn, [x], upstream)
        if kind == "long":   # against float64: 0 exactly where the true value is below 2^-126, else close
            z = x.numpy().astype(np.float64) * 0.125
            exact = np.exp(z - z.max(-1, keepdims=True))
            exact /= exact.sum(-1, keepdims=True)
            assert ((exact > 1e-45) & (exact < TINY)).sum() > 1000          # the input does provoke them
            assert not fast[0][exact < 0.99 * TINY].any()
            big = exact > 1.01 * TINY
            np.testing.assert_allclose(fast[0][big], exact[big], rtol=1e-4)
    else:
        xs = _t(x.numpy())
        out = fn(xs)
        (out * paddle.to_tensor(upstream)).sum().backward()
        assert subnormals(out.numpy()) == 0 and subnormals(xs.grad.numpy()) == 0


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_gelu_tails_write_no_subnormals(scale):
    """GELU and its gradient on x in [-20, 20] (|x| > 15 and the -14..-10 band, where the gradient's
    exp(-x^2/2) term is 1e-22..1e-43), through bias_act and the fused linear; the upstream gradient
    at 1 and at 1e-3 (which moves those products below 2^-126)."""
    x = _t(np.linspace(-20, 20, 8001, dtype=np.float32).reshape(3, -1)[:, :2667])
    b = _t(np.zeros(2667))
    up = np.full((3, 2667), scale, np.float32)
    fast, ref = _no_subnormals_and_agree(lambda x, b: functional.bias_act(x, b, "gelu"), [x, b], up)
    assert subnormals(ref[1]) > 0 or scale == 1.0
    w = _t(np.eye(2667, 64) * 1.0)
    _no_subnormals_and_agree(lambda x, b: functional.linear(x, w, b[:64], act="gelu"), [x, b], up[:, :64])


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_with_a_dominant_logit_writes_no_subnormals(eps):
    """Rows over the Transformer's 33712 classes with one logit 60-100 above the others (a confident
    model): softmax probabilities of 1e-26..1e-44, times the loss gradient 1/rows."""
    V, gaps = 33712, [60, 70, 80, 84, 86, 87, 88, 90, 95, 100]
    z = RNG.standard_normal((len(gaps), V)).astype(np.float32)
    labels = RNG.integers(0, V, len(gaps))
    z[np.arange(len(gaps)), labels] = gaps
    labels = paddle.to_tensor(labels.astype(np.int64))

    def mean_loss(z):
        return functional.smooth_cross_entropy(z, labels, eps)[0].mean()
    fast, _ = _no_subnormals_and_agree(mean_loss, [_t(z)], np.float32(1.0))
    # the gradient in float64 (paddle's cross entropy clips its exponent at -64, so it is no oracle
    # here): (softmax - q) / rows, q = (1 - eps) one_hot + eps / V
    z64 = z.astype(np.float64)
    prob = np.exp(z64 - z64.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    q = np.full_like(prob, eps / V)
    q[np.arange(len(gaps)), labels.numpy()] += 1 - eps
    exact = (prob - q) / len(gaps)
    assert ((np.abs(exact) > 1e-45) & (np.abs(exact) < TINY)).sum() > (1000 if eps == 0 else -1)
    assert not fast[1][np.abs(exact) < 0.99 * TINY].any()
    big = np.abs(exact) > 1.01 * TINY
    np.testing.assert_allclose(fast[1][big], exact[big], rtol=1e-4, atol=1e-9 / V)


def test_layer_norms_write_no_subnormals():
    """LayerNorm, and residual + dropout + LayerNorm, forward with a tiny gamma and backward with a
    tiny upstream gradient (normal numbers just above 2^-126 whose products fall below it)."""
    N = 96
    x = _t(RNG.standard_normal((8, N)) * 10)
    tiny_g = _t(_tiny_normal(N))
    beta = _t(np.zeros(N))
    fast, _ = _no_subnormals_and_agree(lambda x, g: functional.layer_norm(x, g, beta), [x, tiny_g],
                                       _tiny_normal((8, N)))
    g, b, res = _t(RNG.uniform(0.5, 1.5, N)), _t(RNG.standard_normal(N)), _t(RNG.standard_normal((8, N)) * 10)
    _no_subnormals_and_agree(lambda x, g: functional.layer_norm(x, g, beta), [x, g], _tiny_normal((8, N)))
    _no_subnormals_and_agree(lambda x, b, res, g: functional.bias_dropout_residual_ln(x, b, res, g, beta),
                             [x, b, res, g], _tiny_normal((8, N)))


@pytest.mark.parametrize("residual", [False, True])
def test_batch_norm_writes_no_subnormals(residual):
    """Training BatchNorm (+ residual) + ReLU backward with a tiny upstream gradient, forward with a
    tiny gamma; also the running statistics after the update."""
    C = 6
    x = _t(RNG.standard_normal((3, C, 5, 7)) * 10)
    r = _t(RNG.standard_normal((3, C, 5, 7)))
    results = []
    for on in (True, False):
        bn = paddle.nn.BatchNorm2D(C)
        bn.weight.set_value(paddle.to_tensor(_tiny_normal(C, 1e-37, 1e-36)))
        bn._mean.set_value(paddle.to_tensor(_tiny_normal(C)))
        bn.train()
        xs, rs = _t(x.numpy()), _t(r.numpy())
        with functional.precision(fast_ops=on):
            out = functional.batch_norm_act(xs, bn, True, rs if residual else None)
            (out * paddle.to_tensor(_tiny_normal(out.shape))).sum().backward()
        results.append([out.numpy(), xs.grad.numpy(), bn.weight.grad.numpy(), bn.bias.grad.numpy(),
                        bn._mean.numpy(), bn._variance.numpy()] + ([rs.grad.numpy()] if residual else []))
    for i, (a, b) in enumerate(zip(*results)):
        assert subnormals(a) == 0, (i, subnormals(a), subnormals(b))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))


# ------------------------------------------------------------------------------- the guard
SUB = 1e-39   # subnormal: 2^-126 is 1.18e-38


def _subnormal_products():
    """A oneDNN matmul, paddle's matmul and a fused operator on subnormal inputs (256 x 256: both OpenMP
    threads work on the GEMM), and the MXCSR of the calling thread and of 2 OpenMP workers."""
    x = paddle.to_tensor(np.full((256, 256), SUB, np.float32))
    ones = paddle.to_tensor(np.full((256, 256), 1.0 / 256, np.float32))
    zero = paddle.zeros([256])
    ran = []
    with functional.precision(fast_ops=True):
        ran.append(library.state["dnnl"] and functional.active(x, ones))
        dnnl = functional.matmul(x, ones).numpy()
        fused = functional.bias_dropout_residual(x, zero, paddle.zeros_like(x)).numpy()
    return {"oneDNN matmul": dnnl, "fused op": fused, "paddle matmul": paddle.matmul(x, ones).numpy(),
            "mxcsr": [cpu.mxcsr()] + library.threads_mxcsr(2), "dnnl ran": ran}


def _set_by_config(on):
    cfg = config.load("configs/video/attention_lstm/attention_lstm_demo.yaml",
                      [f"runtime.flush_denormals={'true' if on else 'false'}", "runtime.num_threads=2"],
                      validate_config=False)
    runtime.setup(cfg.runtime)


@pytest.mark.parametrize("on", [True, False])
def test_the_guard_zeroes_subnormal_inputs_on_every_thread_and_only_when_on(on):
    """runtime.flush_denormals (set through runtime.setup, as the tools do): on, every thread that
    computes (this one, the OpenMP workers, a thread started afterwards) has FTZ and DAZ and the
    products of subnormal inputs are exact zeros; off, the same calls return the subnormal results."""
    _set_by_config(on)
    got = {"main": _subnormal_products()}
    worker = threading.Thread(target=lambda: got.__setitem__("thread", _subnormal_products()))
    worker.start()
    worker.join()
    bits = cpu.FTZ | cpu.DAZ
    for where, r in got.items():
        assert r["dnnl ran"] == [True]
        assert len(r["mxcsr"]) == 3 and all((v & bits) == (bits if on else 0) for v in r["mxcsr"]), \
            (where, [hex(v) for v in r["mxcsr"]])
        for name in ("oneDNN matmul", "fused op", "paddle matmul"):
            values = r[name]
            if on:
                assert not values.any(), (where, name)
            else:
                assert subnormals(values) == values.size, (where, name, subnormals(values))


def test_the_switch_is_a_runtime_key_on_by_default():
    load_all()
    cfg = config.load("configs/video/attention_lstm/attention_lstm_demo.yaml", validate_config=False)
    assert cfg.runtime.flush_denormals is True
    with pytest.raises(Exception, match="flush_denormals"):
        config.load("configs/video/attention_lstm/attention_lstm_demo.yaml", ["runtime.flush_denormals=3"])


@needs_native_bf16
def test_bf16_products_write_no_subnormals_even_with_the_guard_off():
    """Under bf16 (ops.precision(bf16=True)) the matmul's operands are rounded with subnormals to zero and its
    products of normal bf16 values below 2^-126 come out as zeros (the bf16 dot-product instructions
    flush regardless of MXCSR); the fp32 operator on the same values, guard off, writes subnormals."""
    _set_by_config(False)
    try:
        x = paddle.to_tensor(np.full((256, 256), 1e-20, np.float32))
        y = paddle.to_tensor(np.full((256, 256), 1e-19 / 256, np.float32))   # x @ y = 1e-39 exactly-ish
        with functional.precision(fast_ops=True):
            fp32 = functional.matmul(x, y).numpy()
            with ops.precision(bf16=True):
                bf16 = functional.matmul(x, y).numpy()
                rounded = functional.matmul(paddle.full([4, 4], SUB), paddle.ones([4, 4])).numpy()
        assert subnormals(fp32) == fp32.size
        assert subnormals(bf16) == 0 and subnormals(rounded) == 0 and not rounded.any()
    finally:
        _set_by_config(True)
