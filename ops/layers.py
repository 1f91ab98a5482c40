"""What models call: the fused building blocks, on the models' own paddle layers.

Each function takes the paddle layers whose parameters it uses (nn.Linear, nn.LayerNorm, nn.Conv2D,
nn.BatchNorm2D, nn.MaxPool2D / nn.AvgPool2D, nn.LSTM), so parameter names stay the official kits' and
the weights load unchanged, and runs one fused path or its reference (ops/functional.py decides, per
call). A model calls each block once and has no branch of its own: the same call trains with the fused
kernels, and exports or runs with `runtime.fast_ops: false` on plain paddle ops.
"""
import paddle

from ops import functional as fn
from ops import reference
from ops.paddle_attrs import layer_norm_epsilon

_attention = {"fn": None}


def activation(name):
    """The activation `name` as a function (reference.ACTIVATIONS); KeyError when unknown."""
    return reference.ACTIVATIONS[name]


def linear(x, layers, act=None, p=0.0, training=False):
    """dropout(act(x @ [W_1 | W_2 ...] + [b_1 | b_2 ...])) for one nn.Linear or a list of them sharing
    the input (q, k, v): one GEMM, then bias, activation and dropout in one kernel (act None, 'relu'
    or 'gelu'; others through the reference). On a GPU too one GEMM over the joined weights: joining
    them copies 3 H^2 values a step, three GEMMs would join their outputs, tokens x 3H."""
    layers = layers if isinstance(layers, (list, tuple)) else [layers]
    w = layers[0].weight if len(layers) == 1 else paddle.concat([m.weight for m in layers], axis=1)
    biases = [m.bias for m in layers]
    b = None if biases[0] is None else biases[0] if len(biases) == 1 else paddle.concat(biases, axis=0)
    return fn.linear(x, w, b, act, p, training)


def matmul(x, y, transpose_x=False, transpose_y=False):
    """paddle.matmul on oneDNN where it applies (tied output embeddings, attention products)."""
    return fn.matmul(x, y, transpose_x, transpose_y)


def set_attention(f):
    """Make every `attention` call use `f(q, k, v, mask, dropout_p, training)` (None: ours again);
    returns the previous one. `f` scales by 1/sqrt(head dim) itself, as
    F.scaled_dot_product_attention does."""
    previous, _attention["fn"] = _attention["fn"], f
    return previous


def attention(q, k, v, mask=None, p=0.0, training=False):
    """dropout(softmax(q k^T / sqrt(d) + mask)) v over [B, heads, S, d], with an additive `mask` that
    broadcasts as [B or 1, 1, S or 1, T] (or [S, T]): the scale, mask, softmax and dropout in one
    kernel between two oneDNN matmuls."""
    if _attention["fn"] is not None:
        return _attention["fn"](q, k, v, mask, p, training)
    if mask is not None and fn.active(q, k, v):
        probs = fn.softmax_dropout(fn.matmul(q, k, transpose_y=True), mask, q.shape[-1] ** -0.5, p, training)
        return fn.matmul(probs, v)
    return reference.attention(q, k, v, mask, p, training)


def layer_norm(x, norm):
    """nn.LayerNorm `norm` over the last axis, in one kernel."""
    return fn.layer_norm(x, norm.weight, norm.bias, layer_norm_epsilon(norm))


def add(y, residual, p=0.0, training=False):
    """residual + dropout(y): a pre-norm block's residual add."""
    return fn.bias_dropout_residual(y, None, residual, p, training)


def add_norm(y, residual, norm, p=0.0, training=False):
    """norm(residual + dropout(y)) for an nn.LayerNorm `norm`: a post-norm block's add & norm."""
    return fn.bias_dropout_residual_ln(y, None, residual, norm.weight, norm.bias, p, layer_norm_epsilon(norm),
                                       training)


def linear_add_norm(x, linear_layer, residual, norm, p=0.0, training=False):
    """norm(residual + dropout(linear_layer(x))): the output projection's bias rides in the add & norm
    kernel (one pass for bias, dropout, residual and LayerNorm): ours on the CPU, paddle's fused
    kernel on a GPU (reference.bias_dropout_residual_ln)."""
    if fn.active(x, linear_layer.weight) or reference.on_gpu(x):
        return fn.bias_dropout_residual_ln(fn.matmul(x, linear_layer.weight), linear_layer.bias, residual,
                                           norm.weight, norm.bias, p, layer_norm_epsilon(norm), training)
    return norm(residual + reference.dropout(linear_layer(x), p, training))


def conv2d(x, conv):
    """conv(x) for an nn.Conv2D layer, on oneDNN where functional.conv2d takes it (bf16 under Precision.bf16)."""
    return fn.conv2d(x, conv)


def conv_transpose(x, deconv):
    """deconv(x) for an nn.Conv2DTranspose; one whose kernel equals its stride on oneDNN
    (functional.conv_transpose)."""
    return fn.conv_transpose(x, deconv)


def conv_bn_act(x, conv, bn, relu=True, residual=None):
    """act(bn(conv(x)) [+ residual]) for nn.Conv2D and nn.BatchNorm2D layers: the convolution on
    oneDNN, then BN with batch statistics, the residual add and ReLU in one kernel in training."""
    return fn.batch_norm_act(fn.conv2d(x, conv), bn, relu=relu, residual=residual)


def pool(x, layer):
    """layer(x) for nn.MaxPool2D / nn.AvgPool2D, also on bf16 activations (functional.pool2d)."""
    return fn.pool2d(x, layer)


def concat_channels(xs):
    """paddle.concat(xs, axis=1), also on bf16 activations (functional.concat_channels)."""
    return fn.concat_channels(xs)


def float32(x):
    """x as float32: where a model's bf16 activations end (Precision.bf16_act)."""
    return fn.float32(x)


def roi_align(x, boxes, boxes_num, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True):
    """paddle.vision.ops.roi_align, in parallel on the CPU (functional.roi_align)."""
    return fn.roi_align(x, boxes, boxes_num, output_size, spatial_scale, sampling_ratio, aligned)


def rasterize_polygons(xy, counts, height, width):
    """Polygon sets to masks as pycocotools does (functional.rasterize_polygons)."""
    return fn.rasterize_polygons(xy, counts, height, width)


def lstm(x, rnn, lengths=None):
    """rnn(x, sequence_length=lengths)[0] for an nn.LSTM (outputs only), on oneDNN where
    functional.lstm takes it."""
    return fn.lstm(x, rnn, lengths)


def smooth_cross_entropy(logits, labels, eps=0.0):
    """Per-token (label-smoothed loss, nll): see functional.smooth_cross_entropy."""
    return fn.smooth_cross_entropy(logits, labels, eps)
