"""The fused operators on tensors, each choosing its fused kernel or its reference (ops/reference.py).

A function takes the fused path only when all of these hold: the precision in effect (`Precision`,
below) has `fast_ops` on (engine/runtime.py sets it from `runtime.fast_ops`; off until then), the graph
is dynamic (export and `to_static` trace the reference, so exported programs need no custom library),
the tensors are float32 on the CPU (the activations of the operators that also take bf16 ones,
`Precision.bf16_act`: float32 or all bfloat16), and the library is built (ops/library.py). This is the
one place that decides.

Precision is one immutable value read by every operator at its call, held in a ContextVar as
torch.autocast holds its state: `with precision(...)` puts a value in effect for a block, derived from
the one in effect (`with precision(bf16_act=False):` changes that field alone), and puts the previous
one back on exit, exception included. A ContextVar rather than a module global because a value is then
its thread's (and asyncio task's) own: a block entered on one thread changes nothing another thread
computes, and a thread starts from the default, the fused path off (a thread that runs a model enters
the value it needs, as api/inferencer.py does).

`matmul` (and so `linear`) and `conv2d` run on oneDNN (csrc/dnnl.cc) instead of paddle's MKL 2019
GEMMs and im2col convolutions, the faster on our AMD EPYC (benchmarks/kernel_shapes.py;
docs/performance.md#fused-operators). The rest (csrc/ops.cc) are fused
element-wise and row kernels with their own backward.

bf16 (`Precision.bf16`, entered by `autocast` in engine/runtime.py for `amp: {enable: true, dtype: bfloat16}`
on a CPU): inside the block, matmul (so linear and attention's two products) and conv2d compute in
bf16 with fp32 accumulation on oneDNN's native kernels, forward and both gradients; their results, the weights,
gradients and everything else (norms, softmax, losses, the optimizer) stay fp32, as PyTorch's CPU
autocast lists do. Route "operands" (default) rounds the operands to bf16 at the operator (a linear
layer keeps its input's rounded copy for the backward, batched products both); route "fpmath" asks oneDNN to compute fp32 operands in bf16
(kept for measuring: benchmarks/kernel_shapes.py). A CPU without native bf16 (`bf16_supported`) stays fp32.

No operator writes a subnormal float where the exact result is below float32's normal range
(csrc/ops.cc says why); `library.set_flush_denormals` (runtime.flush_denormals) adds FTZ/DAZ for
the threads that run the operators (tests/test_denormals.py).
"""
import contextvars
import dataclasses
import functools
import os

import paddle
import paddle.nn.functional as F

from ops import library, reference
from ops.paddle_attrs import (batch_norm_settings, conv2d_settings, conv_transpose_settings, lstm_settings,
                               pool2d_settings)

BF16_ROUTES = ("operands", "fpmath")
_ACTS = {None: 0, "none": 0, "relu": 1, "gelu": 2}   # the activation codes the kernels know


@dataclasses.dataclass(frozen=True)
class Precision:
    """How the fused operators compute where this value is in effect (`precision`, `current_precision`).

    fast_ops: the fused kernels at all (`runtime.fast_ops`); off, every function runs its reference.
    bf16: matmul (so linear and attention's two products), conv2d and the LSTM compute in bf16 with fp32
        accumulation (the module docstring); the caller checks `bf16_supported()` first.
    route: how bf16 reaches oneDNN, one of BF16_ROUTES.
    bf16_act: a convolution writes its output in bf16, and the operators after it (BatchNorm + residual
        + ReLU, pooling, the channel concat) read and write bf16, so the activations a ResNet keeps for
        its backward take half the bytes; the statistics, the parameters, their gradients and the
        trunk's outputs (`float32`) stay fp32 (`train.amp.activations: bfloat16`; a part that cannot
        take bf16 enters `precision(bf16_act=False)`). Where oneDNN has no bf16 the convolution
        computes in fp32 on bf16-rounded operands (csrc/dnnl.cc), the same arithmetic: the tests run
        it on every CPU.
    """
    fast_ops: bool = False
    bf16: bool = False
    route: str = "operands"
    bf16_act: bool = False

    def __post_init__(self):
        if self.route not in BF16_ROUTES:
            raise ValueError(f"bf16 route {self.route!r}: one of {', '.join(BF16_ROUTES)}")
        for name in ("fast_ops", "bf16", "bf16_act"):   # a numpy bool or 1 from a caller is the same value
            object.__setattr__(self, name, bool(getattr(self, name)))

    @property
    def bf16_operands(self):
        """bf16 on the "operands" route: the `_bf16` kernels, which round the operands themselves."""
        return self.bf16 and self.route == "operands"


# The one precision state of the package (module docstring: why a ContextVar).
_PRECISION = contextvars.ContextVar("ops.precision", default=Precision())
_FIELDS = frozenset(f.name for f in dataclasses.fields(Precision))


def current_precision():
    """The Precision in effect here."""
    return _PRECISION.get()


def _derived(value, changes):
    unknown = set(changes) - _FIELDS
    if unknown:
        raise TypeError(f"precision: unknown field {', '.join(sorted(unknown))} (fields: {', '.join(sorted(_FIELDS))})")
    if value is not None and not isinstance(value, Precision):
        raise TypeError(f"precision: a Precision or fields, not {type(value).__name__}")
    return dataclasses.replace(_PRECISION.get() if value is None else value, **changes)


class precision:
    """Context manager: inside the block, `value` (a Precision) or the precision in effect with
    `changes` (fields of Precision: `with precision(bf16_act=False):`); the one before it again on
    exit, exception included. The value is derived when the block is entered, so a manager made
    early nests in what is in effect then. `with precision(...) as p` gives the value."""

    def __init__(self, value=None, /, **changes):
        _derived(value, changes)   # a wrong field or route fails where it is written, not at entry
        self.value, self.changes, self._tokens = value, changes, []

    def __enter__(self):
        value = _derived(self.value, self.changes)
        self._tokens.append(_PRECISION.set(value))
        return value

    def __exit__(self, *exc):
        _PRECISION.reset(self._tokens.pop())


def set_precision(value=None, /, **changes):
    """Put `value` (or the precision in effect with `changes`) in effect on this thread from here on,
    outside any block: what `setup_cpu` in engine/runtime.py does once for `runtime.fast_ops`, so that a
    user's own loop after api.setup_cpu runs the fused kernels. An enclosing `precision` block still
    restores its own value on exit. Returns the value."""
    value = _derived(value, changes)
    _PRECISION.set(value)
    return value


def bf16_supported():
    """Whether this CPU computes bf16 natively in oneDNN (AVX512_BF16 or AMX, within
    ONEDNN_MAX_CPU_ISA) and the oneDNN operators are built."""
    return bool(library.load() and library.state["dnnl"] and library.bf16_supported())


def float32(x):
    """x as float32: where bf16 activations end (a model's outputs, a head whose operators are fp32)."""
    return x.astype("float32") if x.dtype == paddle.bfloat16 else x


def active(*tensors, activations=()):
    """Whether the fused path applies to these tensors now (see the module docstring). `activations`:
    those of an operator whose kernels also take bf16 activations (float32 or all bfloat16)."""
    if not _PRECISION.get().fast_ops or not paddle.in_dynamic_mode():
        return False
    for t in tensors:
        if t.dtype != paddle.float32 or not t.place.is_cpu_place():
            return False
    for t in activations:
        if t.dtype not in (paddle.float32, paddle.bfloat16) or t.dtype != activations[0].dtype:
            return False
        if not t.place.is_cpu_place():
            return False
    return library.load()


def _run(name, *args):
    out = paddle._C_ops._run_custom_op(name, *args)
    return out if isinstance(out, (list, tuple)) else [out]


def _seed(p, training):
    if not training or not p:
        return 0, 0.0
    a, b = paddle.randint(0, 2 ** 31 - 1, [2], dtype="int64").tolist()   # paddle's generator: paddle.seed holds
    return (a << 31) | b, float(p)


def _given(*tensors):
    return [t for t in tensors if t is not None]


# ------------------------------------------------------------------------------------- functions
def bias_act(x, bias, act=None, p=0.0, training=True, keep=None):
    """dropout(act(x + bias)) over the last axis; act None, 'relu' or 'gelu' (exact erf).
    `keep` (reference only, tests): a given uint8/bool keep-mask."""
    if keep is None and act in _ACTS and active(x, bias):
        seed, p = _seed(p, training)
        return _bias_act(x, bias, _ACTS[act], seed, p)
    return reference.bias_act(x, bias, act, p, training, keep)


def _bias_act(x, bias, act, seed, p):
    # without an activation, the operator whose backward keeps neither x nor the bias (nor, at p = 0,
    # a mask): less saved for BERT-base's q/k/v projections (docs/performance.md#fused-operators)
    if act == 0:
        return _run("zoo_bias_dropout", x, bias, seed, p)[0]
    return _run("zoo_bias_act", x, bias, act, seed, p)[0]


def matmul(x, y, transpose_x=False, transpose_y=False):
    """paddle.matmul(x, y, transpose_x, transpose_y) on oneDNN (csrc/dnnl.cc), forward and backward,
    for the two forms our layers use: a 2-D `y` (x's leading axes fold into the rows of one GEMM,
    unless transpose_x) and batched operands with the same leading axes. Other shapes (broadcast
    batch axes, 1-D operands) take paddle.matmul."""
    # read before the branch: paddle.jit.to_static rewrites this function for an export, and a name
    # bound inside the branch is undefined where its rewritten `return` flags are set up
    p = _PRECISION.get()
    if active(x, y) and library.state["dnnl"] and x.ndim >= 2 and (
            (y.ndim == 2 and not transpose_x) or (y.ndim == x.ndim and x.shape[:-2] == y.shape[:-2])):
        if p.bf16_operands:
            # a 2-D y is a weight: alive anyway, it is rounded again in the backward rather than kept
            # as a bf16 copy, faster and smaller (docs/performance.md#fused-operators)
            op = "zoo_linear_bf16" if y.ndim == 2 else "zoo_matmul_bf16"
            return _run(op, x, y, bool(transpose_x), bool(transpose_y))[0]
        return _run("zoo_matmul", x, y, bool(transpose_x), bool(transpose_y), p.bf16)[0]
    return paddle.matmul(x, y, transpose_x, transpose_y)


def linear(x, weight, bias=None, act=None, p=0.0, training=True):
    """dropout(act(x @ weight + bias)): the matmul (oneDNN), then bias, activation and dropout in one
    kernel (its bias gradient is a vectorised column sum; paddle's is a slow row reduction on CPU)."""
    if bias is not None and act in _ACTS and active(x, weight, bias):
        seed, p = _seed(p, training)
        return _bias_act(matmul(x, weight), bias, _ACTS[act], seed, p)
    y = matmul(x, weight) if bias is None else reference.linear(x, weight, bias)
    return reference.dropout(reference.ACTIVATIONS[act](y), p, training)


def bias_dropout_residual(x, bias, residual, p=0.0, training=True, keep=None):
    """residual + dropout(x + bias); `bias` may be None."""
    if keep is None and active(x, residual, *_given(bias)):
        bias = paddle.zeros(x.shape[-1:], x.dtype) if bias is None else bias
        seed, p = _seed(p, training)
        return _run("zoo_bias_dropout_residual", x, bias, residual, seed, p)[0]
    return reference.bias_dropout_residual(x, bias, residual, p, training, keep)


def bias_dropout_residual_ln(x, bias, residual, weight, norm_bias, p=0.0, eps=1e-5, training=True, keep=None):
    """LayerNorm(residual + dropout(x + bias)) * weight + norm_bias: a post-norm transformer's add &
    norm; `bias` may be None."""
    if keep is None and active(x, residual, weight, norm_bias, *_given(bias)):
        bias = paddle.zeros(x.shape[-1:], x.dtype) if bias is None else bias
        seed, p = _seed(p, training)
        return _run("zoo_bias_dropout_residual_ln", x, bias, residual, weight, norm_bias, seed, p, float(eps))[0]
    return reference.bias_dropout_residual_ln(x, bias, residual, weight, norm_bias, p, eps, training, keep)


def layer_norm(x, weight, bias, eps=1e-5):
    if active(x, weight, bias):
        return _run("zoo_layer_norm", x, weight, bias, float(eps))[0]
    return reference.layer_norm(x, weight, bias, eps)


def softmax_dropout(scores, mask, scale=1.0, p=0.0, training=True, keep=None):
    """dropout(softmax(scores * scale + mask, axis=-1)) for scores [B, H, S, T] and an additive mask
    that broadcasts as [B or 1, 1, S or 1, T] (a [S, T] mask is taken as [1, 1, S, T])."""
    if mask is not None and mask.ndim == 2:
        mask = mask.unsqueeze([0, 1])
    if keep is None and mask is not None and scores.ndim == 4 and active(scores, mask):
        seed, p = _seed(p, training)
        return _run("zoo_softmax_dropout", scores, mask, float(scale), seed, p)[0]
    return reference.softmax_dropout(scores, mask, scale, p, training, keep)


def smooth_cross_entropy(logits, labels, eps=0.0):
    """Per-row (label-smoothed loss, nll) of `logits` [..., V] and int64 `labels` [...], with
    q = (1 - eps) one_hot + eps / V: -sum_v q_v log p_v = nll + eps * (logit_label - mean_v logit_v).
    A label of -1 is ignored (0, no gradient). The fused kernel makes one pass over the logits each way."""
    if (active(logits) and labels.dtype == paddle.int64 and labels.place.is_cpu_place()
            and list(labels.shape) == list(logits.shape[:-1])):
        loss, nll, _ = _run("zoo_smooth_cross_entropy", logits, labels, float(eps))
        return loss, nll
    return reference.smooth_cross_entropy(logits, labels, eps)


def conv2d(x, conv):
    """conv(x) for a paddle Conv2D layer, through oneDNN's direct convolution (csrc/dnnl.cc; grouped and
    depthwise ones too: paddle's CPU depthwise kernel is slow, docs/performance.md#fused-operators),
    or one GEMM over the batch for a small output map (_one_gemm), when the
    layer is NCHW with zero padding given as numbers; other layers, and those oneDNN would run with a
    column buffer per thread (_columns_per_thread), take the layer itself."""
    s = conv2d_settings(conv)
    fast = s.data_format == "NCHW" and s.padding_mode == "zeros" and s.padding is not None and x.ndim == 4
    to_bf16 = _PRECISION.get().bf16_act or x.dtype == paddle.bfloat16   # a bf16 input gives a bf16 output
    if fast and active(conv.weight, *_given(conv.bias), activations=(x,)) and library.state["dnnl"]:
        gemm = _one_gemm(x, conv.weight.shape, s.stride, s.padding, s.dilation, s.groups)
        if gemm or not _paddle_computes(x, conv, s):
            y = _onednn_conv(x, conv.weight, s.stride, s.padding, s.dilation, to_bf16, s.groups, gemm)
            # the bias in one pass each way (paddle's broadcast add and its gradient are slow on CPU); on a
            # bf16 output it is added in fp32 and the sum rounded once
            return y if conv.bias is None else _run("zoo_channel_bias", y, conv.bias)[0]
    if to_bf16:   # paddle's CPU build has no bf16 convolution: fp32, rounded after
        return conv(float32(x)).astype("bfloat16")
    return conv(x)


def conv_transpose(x, deconv):
    """deconv(x) for a paddle Conv2DTranspose whose square kernel equals its stride, without padding
    (Mask R-CNN's 2x2 stride-2 upsampling): the output windows do not overlap, so it is a 1x1
    convolution to C_out x k x k channels on oneDNN, a pixel shuffle, and the bias in one pass. paddle's
    CPU transposed convolution and its broadcast bias add are slow (docs/performance.md#fused-operators).
    Other layers take the layer; fp32 activations (as the layer: no CPU bf16 pixel shuffle)."""
    t = conv_transpose_settings(deconv)
    s, k = t.conv, t.kernel
    simple = (s.data_format == "NCHW" and s.groups == 1 and s.padding == [0, 0] and s.dilation == [1, 1]
              and list(s.stride) == k and k[0] == k[1] and not any(t.output_padding) and x.ndim == 4)
    if not (simple and active(x, deconv.weight, *_given(deconv.bias)) and library.state["dnnl"]):
        return deconv(x)
    w = deconv.weight                                    # [C_in, C_out, k, k] -> [C_out k k, C_in, 1, 1]
    w = w.transpose([1, 2, 3, 0]).reshape([-1, w.shape[0], 1, 1])
    one = ([1, 1], [0, 0], [1, 1])
    y = F.pixel_shuffle(_onednn_conv(x, w, *one, False, 1, _one_gemm(x, w.shape, *one, 1)), k[0])
    return y if deconv.bias is None else _run("zoo_channel_bias", y, deconv.bias)[0]


def _onednn_conv(x, w, stride, padding, dilation, to_bf16, groups, gemm):
    """`gemm`: _one_gemm's answer for this convolution."""
    args, p = (x, w, list(stride), list(padding), list(dilation)), _PRECISION.get()
    if gemm:
        return _run("zoo_conv2d_gemm", *args, not x.stop_gradient, p.bf16)[0]
    args += (int(groups), not x.stop_gradient)
    if to_bf16:
        return _run("zoo_conv2d_bf16act", *args)[0]
    if p.bf16_operands:
        return _run("zoo_conv2d_bf16", *args)[0]
    return _run("zoo_conv2d", *args, p.bf16)[0]


WORK_SPACE_FLOOR = 32 << 20   # bytes (_columns_per_thread)
# output pixels (_one_gemm), by oneDNN's kernels: where one GEMM beat the direct kernels in
# benchmarks/kernel_shapes.py --conv-routes (docs/performance.md#small-maps-as-one-gemm-depthwise-convolutions-gradient-norms-and-l2-decay)
GEMM_MAP = {"avx2": 4, "avx512": 1}


def _gemm_map():
    return GEMM_MAP["avx512" if library.avx512() else "avx2"]


def _one_gemm(x, w_shape, stride, padding, dilation, groups):
    """Whether a float32 convolution runs as im2col over the batch and one GEMM per pass
    (zoo_conv2d_gemm): an output map of at most GEMM_MAP pixels, columns within WORK_SPACE_FLOOR. There
    the weights outweigh the activations, and oneDNN's direct kernels reorder them in every pass. Under
    AVX2 the GEMM wins up to 2x2 maps, under AVX-512, whose direct kernels are faster, 1x1 maps only
    (GEMM_MAP; docs/performance.md#fused-operators). Grouped
    convolutions, bf16 operands and activations keep the direct kernels."""
    p = _PRECISION.get()
    if groups != 1 or p.bf16_act or x.dtype != paddle.float32 or p.bf16_operands:
        return False
    oh, ow = _output_size(tuple(x.shape), tuple(w_shape), stride, padding, dilation)
    columns = x.shape[0] * oh * ow * w_shape[1] * w_shape[2] * w_shape[3] * 4
    return oh * ow <= _gemm_map() and columns <= WORK_SPACE_FLOOR


def _output_size(x_shape, w_shape, strides, pads, dilations):
    return [(x_shape[2 + i] + 2 * pads[i] - dilations[i] * (w_shape[2 + i] - 1) - 1) // strides[i] + 1 for i in (0, 1)]


def _paddle_computes(x, conv, s):
    """Whether paddle's convolution takes this one (_columns_per_thread) rather than oneDNN's direct
    kernels; dynamic mode only."""
    p = _PRECISION.get()
    if p.bf16_act or x.dtype == paddle.bfloat16:
        math = 3
    else:
        math = 2 if p.bf16_operands else int(p.bf16)
    return _columns_per_thread(tuple(x.shape), tuple(conv.weight.shape), tuple(s.stride), tuple(s.padding),
                               tuple(s.dilation), int(s.groups), math, os.environ.get("ZOO_FAST_OPS_THREADS"))


@functools.lru_cache(maxsize=1024)
def _columns_per_thread(x_shape, w_shape, strides, pads, dilations, groups, math, threads):
    """Whether oneDNN needs more work space for this convolution than one sample's im2col columns, and
    over WORK_SPACE_FLOOR (below it the work space is small beside a step's activations and oneDNN's
    kernel is the faster, as for a ResNet stem). Where it has no direct kernel for a pass (on AVX2: the
    dilated 3x3 convolutions of DeepLabV3's ASPP and last stages) it runs im2col + GEMM with a column
    buffer per thread, which grows the peak with every thread. paddle's own convolution is im2col +
    GEMM with one buffer, so it takes those, for less memory at about the same step
    (docs/performance.md#fused-operators). `threads`: the operators' thread setting, part of the cache
    key (the work space grows with it).
    A 1x1 convolution has no columns on either route, so it stays oneDNN's: its work space there is
    the bf16 kernels' transposition buffer, in the scratchpad oneDNN shares among its primitives.
    Counted as columns, it sent half of DeepLabV3-R50's bf16 1x1 convolutions to paddle's fp32 kernel,
    most of its step."""
    if w_shape[2] == w_shape[3] == 1:
        return False
    oh, ow = _output_size(x_shape, w_shape, strides, pads, dilations)
    columns = w_shape[1] * w_shape[2] * w_shape[3] * oh * ow * 4
    work_space = library.conv_work_space(x_shape, w_shape, strides, pads, dilations, math, groups) or 0
    return work_space > max(columns, WORK_SPACE_FLOOR)


def batch_norm_act(x, bn, relu=True, residual=None):
    """act(bn(x) [+ residual]) for a paddle BatchNorm layer on channels-first input, in one kernel: in
    training with batch statistics (the running statistics updated as paddle's kernel does), and with
    the running statistics (evaluation, or a frozen BN: use_global_stats), where paddle's batch_norm,
    add and relu took three passes. Other layouts take the reference path. x and residual may be
    bfloat16 (both): y is then bfloat16, the statistics and the parameters' gradients float32."""
    s = batch_norm_settings(bn)
    # paddle's rule: use_global_stats True or False holds in both modes, None follows training
    global_stats = s.use_global_stats if s.use_global_stats is not None else not bn.training
    fast = (s.data_format in ("NCHW", "NCL", "NC", "NCDHW") and bn.weight is not None and bn.bias is not None
            and x.ndim >= 2)
    args = (x, bn.weight, bn.bias, s.mean, s.variance) + ((residual,) if residual is not None else ())
    if fast and active(*args[1:5], activations=(x,) + args[5:]):
        if global_stats:
            name = "zoo_bn_global_act" if residual is None else "zoo_bn_global_add_act"
            return _run(name, *args, float(s.epsilon), bool(relu))[0]
        if bn.training:   # (batch statistics outside training, use_global_stats=False: paddle's kernel)
            name = "zoo_bn_act" if residual is None else "zoo_bn_add_act"
            return _run(name, *args, float(s.momentum), float(s.epsilon), bool(relu))[0]
    return reference.batch_norm_act(x, bn, relu, residual)


def pool2d(x, pool):
    """pool(x) for a paddle MaxPool2D or AvgPool2D layer; bf16 activations (NCHW, numbers for the
    padding, no divisor override, no mask) run on our kernel, as paddle's CPU build has none. Other
    bf16 cases pool in fp32 and round after; fp32 input is the layer's own."""
    if x.dtype != paddle.bfloat16:
        return pool(x)
    s = pool2d_settings(pool)
    fast = s.data_format == "NCHW" and s.padding is not None and s.divisor is None and x.ndim == 4 and not s.return_mask
    if fast and active(activations=(x,)):
        return _run("zoo_pool2d_bf16", x, s.kernel, s.stride, s.padding, s.ceil_mode, s.is_max, s.exclusive)[0]
    return pool(float32(x)).astype("bfloat16")


def grad_norms(tensors):
    """The L2 norm of each tensor, a float32 tensor [len(tensors)], each taken in float32 or better:
    float32 CPU tensors in one parallel pass over all of them (double sums; paddle's p_norm, one call
    per gradient, was a fifth of the TSN demo's step: docs/performance.md#fused-operators), others through paddle's norm in float32."""
    if active(*tensors):
        return _run("zoo_l2_norms", list(tensors))[0]
    fp32 = paddle.float32
    return paddle.stack([paddle.linalg.norm(t if t.dtype == fp32 else t.astype(fp32)) for t in tensors])


def concat_channels(xs):
    """paddle.concat(xs, axis=1); bf16 activations on our kernel (paddle's CPU build has no bf16
    concat_grad), other dtypes paddle's."""
    if xs[0].dtype == paddle.bfloat16 and active(activations=tuple(xs)):
        return _run("zoo_concat_channels", list(xs))[0]
    if xs[0].dtype == paddle.bfloat16:   # fp32 for the gradient, rounded after
        return paddle.concat([float32(x) for x in xs], axis=1).astype("bfloat16")
    return paddle.concat(xs, axis=1)


def roi_align(x, boxes, boxes_num, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True):
    """paddle.vision.ops.roi_align (x [N, C, H, W], boxes [R, 4] of the images in order, boxes_num [B]
    RoIs per image), on our kernel for float32 CPU tensors: its positions and weights computed once per
    RoI for every channel, both passes over 2 threads where paddle's run one (csrc/ops.cc)."""
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    # active() first: a program being traced (export) has no place to ask
    if active(x, boxes) and x.ndim == 4 and boxes_num is not None and boxes_num.place.is_cpu_place():
        return _run("zoo_roi_align", x, boxes, boxes_num.astype("int32"), int(size[0]), int(size[1]),
                    float(spatial_scale), int(sampling_ratio), bool(aligned))[0]
    return reference.roi_align(x, boxes, boxes_num, output_size, spatial_scale, sampling_ratio, aligned)


def rasterize_polygons(xy, counts, height, width):
    """reference.rasterize_polygons (pycocotools' polygon masks); on a CPU our kernel walks the edges as
    rleFrPoly does, one set per thread (csrc/ops.cc), where the tensor version's ~60 operators per call
    were a fifth of the Mask R-CNN demo's step (docs/performance.md#fused-operators)."""
    if active() and xy.dtype == paddle.float64 and xy.place.is_cpu_place():
        return _run("zoo_rasterize_polygons", xy, counts.astype("int32"), int(height), int(width))[0]
    return reference.rasterize_polygons(xy, counts, height, width)


def lstm(x, rnn, lengths=None):
    """rnn(x, sequence_length=lengths)[0] for a paddle.nn.LSTM `rnn`: the outputs [N, T, directions x H]
    from zero initial states (the final states are not returned). A single-layer, batch-first LSTM
    without projection runs on oneDNN's LSTM (csrc/dnnl.cc), one call per direction, time-major; others
    take the layer. With `lengths` [N], a sample's steps from its length on are padding, as in paddle's
    kernel: their outputs are 0 and nothing there reaches a real step. The backward direction then runs
    left to right over each sample's real steps reversed (oneDNN's right-to-left pass would start in the
    padding), and its outputs are put back in order."""
    s = lstm_settings(rnn)
    weights = [w for direction in s.weights for w in direction if w is not None]
    if (s.mode == "LSTM" and s.num_layers == 1 and not s.time_major and not s.proj_size and x.ndim == 3
            and active(x, *weights) and library.state["dnnl"]):
        return _lstm(x, s.weights, lengths)
    return rnn(x, sequence_length=lengths)[0]


def _lstm(x, weights, lengths):
    def direction(inputs, w, reverse):
        w_ih, w_hh, *biases = w
        biases = [b for b in biases if b is not None]   # a layer built without one (paddle's kernel crashes)
        b = paddle.add_n(biases) if biases else paddle.zeros(w_hh.shape[:1], w_hh.dtype)
        # without gradients: oneDNN's inference LSTM, which keeps no work space (as fast here: csrc/dnnl.cc)
        grads = paddle.is_grad_enabled() and not all(v.stop_gradient for v in (inputs, w_ih, w_hh, b))
        return _run(name + ("" if grads else "_infer"), inputs, w_ih, w_hh, b, reverse)[0]

    # under bf16, oneDNN's bf16 LSTM where the CPU has it (x, weights and h in bf16; c and gradients fp32)
    name = "zoo_lstm_bf16" if _PRECISION.get().bf16 and library.bf16_supported() else "zoo_lstm"

    n, t = x.shape[0], x.shape[1]
    time_major = x.transpose([1, 0, 2])   # [T, N, C], the operator's layout
    if lengths is None:
        outs = [direction(time_major, w, reverse) for w, reverse in zip(weights, (False, True))]
        return paddle.concat(outs, axis=-1).transpose([1, 0, 2])
    # Moving rows by index (gathers) rather than by index tensors of the data's shape: what the
    # backward keeps of a move is its [N x T] index alone.
    steps = paddle.arange(t, dtype="int64").unsqueeze(0)
    ends, batch = lengths.astype("int64").unsqueeze(1), paddle.arange(n, dtype="int64").unsqueeze(1)
    real = steps < ends                                             # [N, T]
    back = paddle.where(real, ends - 1 - steps, steps)             # each sample's real steps reversed

    def batch_first(y, step):
        """y [T, N, H] to [N, T, H]: position (b, s) takes y[step[b, s], b], or 0 on padding."""
        rows = paddle.concat([y.reshape([t * n, -1]), paddle.zeros([1, y.shape[-1]], y.dtype)])
        return paddle.gather(rows, paddle.where(real, step * n + batch, t * n).reshape([-1])).reshape([n, t, -1])
    outs = [batch_first(direction(time_major, weights[0], False), steps.expand([n, t]))]
    if len(weights) == 2:
        reversed_x = paddle.gather(x.reshape([n * t, -1]), (back + batch * t).transpose([1, 0]).reshape([-1]))
        outs.append(batch_first(direction(reversed_x.reshape([t, n, -1]), weights[1], False), back))
    return outs[0] if len(outs) == 1 else paddle.concat(outs, axis=-1)
