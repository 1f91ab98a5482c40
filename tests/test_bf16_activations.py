"""bf16 activations between operators (issue 43): the fused operators that read and write bfloat16
activations, checked against numpy references computed in float64 on the bf16-rounded operands.

These kernels convert bf16 in plain integer code, so they run on every CPU: unlike the bf16
matmul / convolution tests, nothing here needs native bf16."""
import numpy as np
import paddle
import pytest

from engine import cpu
from ops import functional, library
from ops.paddle_attrs import pool2d_settings
from tests.helpers import counting_fused_ops, fused_ops_on

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

RNG = np.random.default_rng(43)
ULP = 2.0 ** -8   # bf16 keeps 8 significant bits: a correctly rounded value is within half of this, relative


@pytest.fixture(scope="module", autouse=True)
def ops():
    with fused_ops_on():
        yield


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
        with functional.precision(fast_ops=on):
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



POOLS = [   # layer, input shape, the settings it was built with (is_max, kernel, stride, padding, ceil_mode,
    # exclusive): the ResNet stem's max pool and the vd shortcut's average pool, odd sizes
    (lambda: paddle.nn.MaxPool2D(3, 2, padding=1), (2, 3, 9, 7), (True, [3, 3], [2, 2], [1, 1], False, True)),
    (lambda: paddle.nn.AvgPool2D(2, 2, padding=0, ceil_mode=True), (2, 3, 9, 7),
     (False, [2, 2], [2, 2], [0, 0], True, True)),
    (lambda: paddle.nn.AvgPool2D(3, 2, padding=1, exclusive=False), (1, 2, 6, 5),
     (False, [3, 3], [2, 2], [1, 1], False, False)),
    (lambda: paddle.nn.MaxPool2D(2, ceil_mode=True), (1, 2, 5, 5), (True, [2, 2], [2, 2], [0, 0], True, True)),
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pool2d_bf16(case):
    """Our bf16 pooling against paddle's kernel on the same bf16 values (and a bf16 upstream gradient):
    a max pool's output and gradient are exact, so they equal paddle's fp32 ones; an average is that of
    paddle's float64 kernel within a bf16 rounding (paddle's fp32 sum, in another order, can fall on the
    other side of a rounding boundary: exact equality failed on some random draws)."""
    make, shape, settings = POOLS[case]
    layer = make()
    # ops/paddle_attrs.py reads the layer's attributes: a paddle that renames one fails here
    assert tuple(pool2d_settings(layer))[:6] == settings
    x = round_bf16(RNG.standard_normal(shape).astype(np.float32))
    xf = paddle.to_tensor(x if settings[0] else x.astype(np.float64))
    xf.stop_gradient = False
    want = layer(xf)
    dy = round_bf16(RNG.standard_normal(want.shape).astype(np.float32))
    (want * paddle.to_tensor(dy.astype(want.numpy().dtype))).sum().backward()
    xs = bf16_tensor(x, grad=True)
    with counting_fused_ops() as ran:
        got = functional.pool2d(xs, layer)
    assert ran == ["zoo_pool2d_bf16"] and got.dtype == paddle.bfloat16 and got.shape == want.shape
    (got.astype("float32") * paddle.to_tensor(dy)).sum().backward()
    if settings[0]:
        np.testing.assert_array_equal(f32(got), round_bf16(want.numpy()))
        np.testing.assert_array_equal(f32(xs.grad), round_bf16(xf.grad.numpy()))
    else:
        assert_bf16_close(f32(got), want.numpy(), "y")
        assert_bf16_close(f32(xs.grad), xf.grad.numpy(), "dx")


@pytest.mark.parametrize("guard", [True, False])
def test_one_bf16_rounding_on_every_route(guard):
    """The two libraries write bf16 by one conversion (csrc/bf16.h), that of the hardware's vcvtneps2bf16
    (Intel's definition): nearest, ties to even, a subnormal to a zero of its sign, a NaN kept. dnnl.cc's
    (a 1x1 identity convolution's bf16 output) and ops.cc's (a max-pool over one cell of bf16 input) on
    the same values, against the format's rounding written here; with the FTZ/DAZ guard
    (runtime.flush_denormals) and without it, where a subnormal input reaches the conversion."""
    before = cpu.mxcsr() & (cpu.FTZ | cpu.DAZ)
    library.set_flush_denormals(guard)
    cpu.flush_denormals(guard)
    try:
        _one_rounding()
    finally:
        library.set_flush_denormals(bool(before))
        cpu.flush_denormals(bool(before))


def _one_rounding():
    tiny = np.finfo(np.float32).tiny
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -7 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20, 3.0, -0.0,
                       tiny, 0, 0, 0, np.inf, -np.inf, np.nan], np.float32)
    # 1e-39, -1e-39, 1e-45 from their bits (a conversion from a Python float is flushed under our guard)
    values.view(np.uint32)[7:10] = [0x000AE398, 0x800AE398, 0x00000001]
    want = round_bf16(values)
    want[np.abs(values) < tiny] = 0.0
    want = np.copysign(want, values)
    conv = paddle.nn.Conv2D(1, 1, 1, bias_attr=False)
    conv.weight.set_value(np.ones((1, 1, 1, 1), np.float32))
    x = paddle.to_tensor(values.reshape(1, 1, 1, -1))
    with counting_fused_ops() as ran, functional.precision(bf16_act=True):
        by_dnnl = f32(functional.conv2d(x, conv))
    # the values rounded but kept subnormal, as bf16 bits (paddle's cast flushes them under our guard)
    kept = (round_bf16(values).view(np.uint32) >> 16).astype(np.uint16)
    bf16_input = paddle.to_tensor(kept.reshape(1, 1, 1, -1), dtype="bfloat16")   # numpy uint16: the bits
    assert bf16_input.dtype == paddle.bfloat16 and np.array_equal(bf16_input.numpy().ravel(), kept)
    assert kept[7] == 0x000B and kept[8] == 0x800B           # 1e-39 and -1e-39: subnormal bf16 values
    with counting_fused_ops() as pooled:
        by_ops = f32(functional.pool2d(bf16_input, paddle.nn.MaxPool2D(1)))
    assert ran == ["zoo_conv2d_bf16act"] and pooled == ["zoo_pool2d_bf16"], (ran, pooled)
    for got in (by_dnnl.ravel(), by_ops.ravel()):
        np.testing.assert_array_equal(got, want)
    # -0.0 and -1e-39 -> -0.0 (the convolution's sum, 0 + x * 1, makes either zero positive)
    assert np.array_equal(np.signbit(by_ops.ravel()[:-1]), np.signbit(want[:-1]))


# (N, C, H, W), out channels, kernel, stride, padding, dilation, bias, input already bf16
CONVS = [((2, 5, 9, 7), 6, 3, 1, 1, 1, False, True),
         ((2, 4, 11, 10), 8, 1, 2, 0, 1, False, True),
         ((1, 3, 13, 12), 4, 7, 2, 3, 1, False, False),   # a stem: the network's fp32 input
         ((1, 4, 9, 9), 4, 3, 1, 2, 2, True, True)]       # dilated, with a bias (DeepLabV3's heads)


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv2d_bf16_activations(case):
    """A convolution inside `bf16_activations` against paddle's float64 convolution of the same
    bf16-rounded input and weight: output and input gradient bf16 (within a rounding), the weight
    gradient fp32 (fp32 accumulation). On a CPU without bf16 this checks the fp32-primitive route,
    on one with bf16 oneDNN's bf16 kernels: the same test on both."""
    shape, cout, k, stride, pad, dil, bias, x_bf16 = CONVS[case]
    conv = paddle.nn.Conv2D(shape[1], cout, k, stride=stride, padding=pad, dilation=dil,
                            bias_attr=None if bias else False)
    x = RNG.standard_normal(shape).astype(np.float32)
    xs = bf16_tensor(x, grad=True) if x_bf16 else paddle.to_tensor(x, stop_gradient=False)
    with counting_fused_ops() as ran, functional.precision(bf16_act=True):
        y = functional.conv2d(xs, conv)
    assert ran == ["zoo_conv2d_bf16act"] + ["zoo_channel_bias"] * bias and y.dtype == paddle.bfloat16
    dy = round_bf16(RNG.standard_normal(y.shape).astype(np.float32))
    (y.astype("float32") * paddle.to_tensor(dy)).sum().backward()
    assert xs.grad.dtype == xs.dtype and conv.weight.grad.dtype == paddle.float32

    x64 = paddle.to_tensor(round_bf16(x).astype(np.float64), stop_gradient=False)
    w64 = paddle.to_tensor(round_bf16(conv.weight.numpy()).astype(np.float64), stop_gradient=False)
    b64 = paddle.to_tensor(conv.bias.numpy().astype(np.float64)) if bias else None
    want = paddle.nn.functional.conv2d(x64, w64, b64, stride=stride, padding=pad, dilation=dil)
    (want * paddle.to_tensor(dy.astype(np.float64))).sum().backward()
    assert_bf16_close(f32(y), want.numpy(), "y")
    if x_bf16:
        assert_bf16_close(f32(xs.grad), x64.grad.numpy(), "dx")
    else:
        want = x64.grad.numpy()
        np.testing.assert_allclose(xs.grad.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(conv.weight.grad.numpy(), w64.grad.numpy(), rtol=1e-5,
                               atol=1e-5 * np.abs(w64.grad.numpy()).max())


def fp32_and_bf16_steps(make, step):
    """Two copies of make()'s network (the same weights), one training step each: `step(net)` in fp32,
    then inside bf16_activations. Returns the two steps' results and the fused operators the bf16 step
    ran, after checking that each of its gradients is fp32 and finite."""
    nets = [make(), make()]
    nets[1].set_state_dict(nets[0].state_dict())
    results = []
    for net, bf16 in zip(nets, (False, True)):
        net.train()
        with counting_fused_ops() as ran, functional.precision(bf16_act=bf16):
            results.append(step(net))
    for name, p in nets[1].named_parameters():
        if not p.stop_gradient:
            assert p.grad.dtype == paddle.float32 and np.isfinite(p.grad.numpy()).all(), name
    return results, ran


def test_resnet_trunk_bf16_activations():
    """A ResNet-50-vd trunk (narrow) trains a step with bf16 activations: every convolution, BN and
    pool inside runs on its bf16 kernel and writes bf16, the trunk's outputs are fp32, its first
    stage's output is the fp32 step's within bf16's precision, and every gradient is fp32 and finite.
    (Deeper features are no test: this random trunk, BN on 2 x 2 maps, moves its last stage's output
    by 31% when the fp32 input moves by 2^-9; the operators are checked one by one above.)"""
    from models.vision.resnet import ResNet   # the model package: only this test needs it
    x = np.random.default_rng(6).standard_normal((2, 3, 64, 64)).astype(np.float32)

    def step(net):
        inside = []
        hook = net.layer2[0].conv1.register_forward_post_hook(lambda layer, inp, out: inside.append(out.dtype))
        feats = net(paddle.to_tensor(x))
        feats[1].mean().backward()
        hook.remove()
        assert [f.dtype for f in feats] == [paddle.float32] * 2
        return feats[0].numpy(), inside

    paddle.seed(0)
    (fp32, bf16), ran = fp32_and_bf16_steps(
        lambda: ResNet(depth=50, variant="d", base_channels=8, out_indices=[0, 3]), step)
    assert fp32[1] == [paddle.float32] and bf16[1] == [paddle.bfloat16]
    assert {"zoo_conv2d_bf16act", "zoo_bn_act", "zoo_bn_add_act", "zoo_pool2d_bf16"} <= set(ran)
    assert "zoo_conv2d" not in ran
    err = np.linalg.norm(bf16[0] - fp32[0]) / np.linalg.norm(fp32[0])
    assert err < 0.05, err    # 2.6% measured: 13 convolutions, each output rounded to bf16


def test_concat_channels_bf16():
    """DeepLabV3's ASPP join on bf16 branches: the values are copied and the gradient split exactly."""
    parts = [round_bf16(RNG.standard_normal((2, c, 3, 4)).astype(np.float32)) for c in (3, 1, 5)]
    xs = [bf16_tensor(p, grad=True) for p in parts]
    with counting_fused_ops() as ran:
        y = functional.concat_channels(xs)
    assert ran == ["zoo_concat_channels"] and y.dtype == paddle.bfloat16
    np.testing.assert_array_equal(f32(y), np.concatenate(parts, axis=1))
    dy = round_bf16(RNG.standard_normal(y.shape).astype(np.float32))
    (y.astype("float32") * paddle.to_tensor(dy)).sum().backward()
    for x, want in zip(xs, np.split(dy, [3, 4], axis=1)):
        assert x.grad.dtype == paddle.bfloat16
        np.testing.assert_array_equal(f32(x.grad), want)


def test_deeplabv3_step_bf16_activations():
    """A DeepLabV3 training step (narrow ResNet-50-vd, OS8, ASPP with image pooling, auxiliary head)
    with bf16 activations: trunk, ASPP branches, the join and the projection run on bf16 kernels, the
    logits and losses are fp32 and the loss within 5% of the fp32 step's (0.3-1.6% measured on five
    batches; 2^-9 of noise on the fp32 input moves it by 0.3-1.5%), the gradients fp32 and finite."""
    from models.vision.deeplabv3 import DeepLabV3   # the model package: only this test needs it
    backbone = {"name": "ResNet", "depth": 50, "variant": "d", "output_stride": 8, "multi_grid": [1, 2, 4],
                "base_channels": 8}
    rng = np.random.default_rng(5)   # its own: the batch does not depend on which tests ran before
    batch = {"image": paddle.to_tensor(rng.uniform(0, 1, (2, 3, 64, 64)).astype(np.float32)),
             "label": paddle.to_tensor(rng.integers(0, 3, (2, 64, 64)).astype(np.int64))}
    paddle.seed(1)
    losses, ran = fp32_and_bf16_steps(
        lambda: DeepLabV3(num_classes=3, backbone=backbone, aspp_channels=16, aux_channels=16, aux_weight=0.4),
        lambda net: _loss_step(net, batch))
    assert {"zoo_conv2d_bf16act", "zoo_bn_act", "zoo_concat_channels", "zoo_pool2d_bf16"} <= set(ran)
    assert losses[0] != losses[1] and abs(losses[1] - losses[0]) <= 0.05 * abs(losses[0]), losses


@pytest.mark.parametrize("name", ["TSN", "StNet"])
def test_video_step_bf16_activations(name):
    """TSN (narrow ResNet-50) and StNet (narrow ResNet-18: basic blocks) train a step with bf16
    activations: the trunk on bf16 kernels, StNet's temporal blocks and both heads in fp32, the loss
    fp32, every gradient fp32 and finite. TSN's loss is the fp32 step's within 5% (0.1-1.9% measured
    on five batches). StNet's is not compared: at initialisation its fp32 loss moves by 1.6-5% when
    the input moves by 2^-9 (bf16 moved it by 2.6-15%), so closeness would test the batch, not bf16."""
    from models.video.stnet import StNet   # the model package: only this test needs it
    from models.video.tsn import TSN
    make = {"TSN": lambda: TSN(num_classes=4, backbone={"name": "ResNet", "depth": 50, "base_channels": 8},
                               drop_rate=0.0),
            "StNet": lambda: StNet(num_classes=4, seglen=2,
                                   backbone={"name": "ResNet", "depth": 18, "base_channels": 8})}[name]
    channels = 3 if name == "TSN" else 6
    rng = np.random.default_rng(4)   # its own: the batch does not depend on which tests ran before
    batch = {"imgs": paddle.to_tensor(rng.uniform(-1, 1, (2, 3, channels, 64, 64)).astype(np.float32)),
             "label": paddle.to_tensor(np.array([1, 3], np.int64))}
    paddle.seed(2)
    losses, ran = fp32_and_bf16_steps(make, lambda net: _loss_step(net, batch))
    assert {"zoo_conv2d_bf16act", "zoo_bn_act", "zoo_bn_add_act", "zoo_pool2d_bf16"} <= set(ran)
    assert losses[0] != losses[1]   # the bf16 step did compute in bf16
    if name == "TSN":
        assert abs(losses[1] - losses[0]) <= 0.05 * abs(losses[0]), losses


def _loss_step(net, batch):
    """A model's training forward and backward on `batch`; every output fp32; the loss."""
    out = net(dict(batch))
    out["loss"].backward()
    assert all(v.dtype == paddle.float32 for v in out.values())
    return float(out["loss"])


def test_mask_rcnn_step_bf16_activations():
    """Mask R-CNN trains a step inside bf16_activations: its ResNet trunk on the bf16 kernels (frozen BN
    on its running statistics included), the FPN, RPN and mask head in fp32 (paddle's adds, upsampling,
    ReLU and transposed convolution there have no CPU bf16 kernel: they crashed on a bf16 FPN lateral
    before they said so), the losses fp32 and within 5% of the fp32 step's, every gradient fp32 and
    finite."""
    # the model and reader packages: only this test needs them
    from models.vision.mask_rcnn.model import MaskRCNN
    from readers.coco import pack_polygons
    square = [np.array([[8, 8], [40, 8], [40, 40], [8, 40]], np.float32)]
    points, counts = pack_polygons([square])
    rng = np.random.default_rng(7)   # its own: the batch does not depend on which tests ran before
    batch = {"image": paddle.to_tensor(rng.uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)),
             "image_size": paddle.to_tensor(np.array([[64, 64]], np.int64)),
             "gt_boxes": [paddle.to_tensor(np.array([[8, 8, 40, 40]], np.float32))],
             "gt_classes": [paddle.to_tensor(np.array([1], np.int64))],
             "gt_poly_points": [paddle.to_tensor(points)], "gt_poly_counts": [paddle.to_tensor(counts)]}
    backbone = {"name": "ResNet", "depth": 50, "variant": "b", "out_indices": [0, 1, 2, 3], "frozen_stages": 1,
                "freeze_norm": True, "base_channels": 8}
    paddle.seed(3)
    losses, ran = fp32_and_bf16_steps(
        lambda: MaskRCNN(num_classes=3, backbone=backbone, fpn_channels=16, box_fc=32, mask_convs=1,
                         mask_channels=16),
        lambda net: _loss_step(net, batch))
    assert {"zoo_conv2d_bf16act", "zoo_bn_global_act", "zoo_bn_global_add_act", "zoo_pool2d_bf16"} <= set(ran)
    assert "zoo_conv2d" in ran   # the FPN, RPN and mask head: fp32 activations
    assert losses[0] != losses[1] and abs(losses[1] - losses[0]) <= 0.05 * abs(losses[0]), losses
