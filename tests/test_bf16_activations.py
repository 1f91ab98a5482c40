"""bf16 activations between operators (issue 43): the fused operators that read and write bfloat16
activations, checked against numpy references computed in float64 on the bf16-rounded operands.

These kernels convert bf16 in plain integer code, so they run on every CPU: unlike the bf16
matmul / convolution tests, nothing here needs native bf16."""
import numpy as np
import paddle
import pytest

from ops import functional, library
from tests.helpers import counting_fused_ops

RNG = np.random.default_rng(43)
ULP = 2.0 ** -8   # bf16 keeps 8 significant bits: a correctly rounded value is within half of this, relative


@pytest.fixture(scope="module", autouse=True)
def ops():
    paddle.base.core.set_num_threads(2)
    functional.set_enabled(True, 2)
    assert library.load(), library.state["error"]
    yield
    functional.set_enabled(False)


def round_bf16(a):
    """float32 -> the nearest bf16 (ties to even), as float32; written from the format's definition
    (the upper 16 bits of a float32), not from our kernels."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def bf16_tensor(a, grad=False):
    t = paddle.to_tensor(np.asarray(a, np.float32)).astype("bfloat16")
    t.stop_gradient = not grad
    return t


def f32(t):
    return t.astype("float32").numpy()


def bn_act_reference(x, gamma, beta, dy, residual=None, relu=True, eps=1e-5):
    """BatchNorm with batch statistics (+ residual) (+ ReLU) and its gradients, float64 (textbook
    formulas: Ioffe & Szegedy 2015, section 3)."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    axes = (0, 2, 3)
    m = x.size // x.shape[1]
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    xhat = (x - mean) * inv
    g, b = gamma.reshape(1, -1, 1, 1).astype(np.float64), beta.reshape(1, -1, 1, 1).astype(np.float64)
    z = g * xhat + b + (0.0 if residual is None else residual.astype(np.float64))
    y = np.maximum(z, 0.0) if relu else z
    d = dy * (z > 0) if relu else dy
    dbeta, dgamma = d.sum(axis=axes), (d * xhat).sum(axis=axes)
    dx = g * inv * (d - dbeta.reshape(1, -1, 1, 1) / m - xhat * dgamma.reshape(1, -1, 1, 1) / m)
    return y, dx, dgamma, dbeta, d


def assert_bf16_close(got, want, what):
    """got (bf16 values) within one bf16 step of the exact float64 `want`, relative to each element
    or, where the exact value is near 0 after cancellation, to the array's scale."""
    err = np.abs(got.astype(np.float64) - want)
    bound = ULP * np.abs(want) + 1e-3 * np.abs(want).max()
    assert (err <= bound).all(), f"{what}: {int((err > bound).sum())} elements off, worst {err.max():.3g}"


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [False, True])
def test_batch_norm_act_bf16(relu, residual):
    shape = (3, 6, 5, 7)
    x = round_bf16(RNG.standard_normal(shape).astype(np.float32) * 2 + 1)
    r = round_bf16(RNG.standard_normal(shape).astype(np.float32))
    dy = round_bf16(RNG.standard_normal(shape).astype(np.float32))
    bn = paddle.nn.BatchNorm2D(6)
    bn.weight.set_value(paddle.to_tensor(RNG.uniform(0.5, 1.5, 6).astype(np.float32)))
    bn.bias.set_value(paddle.to_tensor(RNG.standard_normal(6).astype(np.float32)))
    bn.train()
    xs, rs = bf16_tensor(x, grad=True), bf16_tensor(r, grad=residual)
    with counting_fused_ops() as ran:
        y = functional.batch_norm_act(xs, bn, relu, rs if residual else None)
    assert ran == ["zoo_bn_add_act" if residual else "zoo_bn_act"]
    assert y.dtype == paddle.bfloat16
    (y.astype("float32") * paddle.to_tensor(dy)).sum().backward()
    assert xs.grad.dtype == paddle.bfloat16 and bn.weight.grad.dtype == paddle.float32

    want_y, want_dx, want_dg, want_db, want_dres = bn_act_reference(x, bn.weight.numpy(), bn.bias.numpy(), dy,
                                                                    r if residual else None, relu)
    got_y = f32(y)
    # correctly rounded: round-to-nearest of the float32 result, so nearly every element is the
    # float64 result's own rounding (truncation would match about half of them)
    exact = np.mean(got_y == round_bf16(want_y.astype(np.float32)))
    assert exact >= 0.98, exact
    assert_bf16_close(got_y, want_y, "y")
    assert_bf16_close(f32(xs.grad), want_dx, "dx")
    np.testing.assert_allclose(bn.weight.grad.numpy(), want_dg, rtol=1e-4, atol=1e-4 * np.abs(want_dg).max())
    np.testing.assert_allclose(bn.bias.grad.numpy(), want_db, rtol=1e-4, atol=1e-4 * np.abs(want_db).max())
    if residual:
        assert rs.grad.dtype == paddle.bfloat16
        assert_bf16_close(f32(rs.grad), want_dres, "d residual")
    # the running statistics (float32) took the batch's: momentum 0.9, biased variance (paddle 3's kernel)
    np.testing.assert_allclose(bn._mean.numpy(), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn._variance.numpy(), 0.9 + 0.1 * x.var(axis=(0, 2, 3)), rtol=1e-5)


def test_batch_norm_act_bf16_reference_path():
    """With the fused operators off, bf16 activations still work (paddle's CPU build has no bf16
    batch_norm: the reference computes in float32) and agree with the fused kernel."""
    x = RNG.standard_normal((2, 4, 3, 5)).astype(np.float32)
    outs = []
    for on in (True, False):
        bn = paddle.nn.BatchNorm2D(4)
        bn.train()
        xs = bf16_tensor(x, grad=True)
        with functional.enabled_as(on):
            y = functional.batch_norm_act(xs, bn, True)
        y.astype("float32").sum().backward()
        outs.append((f32(y), f32(xs.grad), bn.weight.grad.numpy()))
    for fused, ref in zip(*outs):
        np.testing.assert_allclose(fused, ref, rtol=2 * ULP, atol=2 * ULP * np.abs(ref).max())


def test_mixed_activation_dtypes_take_the_reference():
    """A bf16 input with a float32 residual is not the fused kernel's to take (it would misread one)."""
    bn = paddle.nn.BatchNorm2D(4)
    bn.train()
    x = bf16_tensor(RNG.standard_normal((2, 4, 3, 3)))
    assert not functional.active(bn.weight, activations=(x, paddle.zeros([2, 4, 3, 3])))
    assert functional.active(bn.weight, activations=(x, x))

