"""The one place that reads paddle layers' private attributes.

paddle.nn's Conv2D, BatchNorm and LayerNorm keep their settings (stride, padding, epsilon, momentum,
the running statistics...) in underscored attributes and offer no public accessors; the fused
operators need them to call their kernels on the layer's own parameters. Reading them here, behind
named tuples, keeps a paddle upgrade that renames one to a single file, and tests/test_fast_ops.py
checks every value against the arguments the layer was built with (a rename fails that test,
not a training run).
"""
from collections import namedtuple

import paddle

Conv2DSettings = namedtuple("Conv2DSettings", "stride padding dilation groups data_format padding_mode")
ConvTransposeSettings = namedtuple("ConvTransposeSettings", "conv kernel output_padding")
Pool2DSettings = namedtuple("Pool2DSettings",
                            "is_max kernel stride padding ceil_mode exclusive divisor data_format return_mask")
BatchNormSettings = namedtuple("BatchNormSettings", "momentum epsilon use_global_stats data_format mean variance")
LSTMSettings = namedtuple("LSTMSettings", "mode num_layers time_major proj_size weights")


def _read(layer, name):
    try:
        return getattr(layer, name)
    except AttributeError:
        raise RuntimeError(f"{type(layer).__name__} has no attribute {name} in paddle {paddle.__version__}: "
                           "ops/paddle_attrs.py must be taught its new name") from None


def conv2d_settings(conv):
    """`padding` is [pad_h, pad_w] when the layer pads symmetrically by given numbers, else None
    ('SAME'/'VALID' strings, asymmetric padding: only paddle's own kernel handles those)."""
    pads = _read(conv, "_updated_padding")
    explicit = _read(conv, "_padding_algorithm") == "EXPLICIT" and len(pads) == 2
    return Conv2DSettings(list(_read(conv, "_stride")), list(pads) if explicit else None,
                          list(_read(conv, "_dilation")), _read(conv, "_groups"), _read(conv, "_data_format"),
                          _read(conv, "_padding_mode"))


def _pair(v):
    return [int(v), int(v)] if isinstance(v, int) else [int(a) for a in v]


def conv_transpose_settings(deconv):
    """nn.Conv2DTranspose: its conv2d_settings, `kernel` and `output_padding` [h, w]."""
    return ConvTransposeSettings(conv2d_settings(deconv), list(_read(deconv, "_kernel_size")),
                                 _pair(_read(deconv, "output_padding")))


def batch_norm_settings(bn):
    """`mean` and `variance` are the running statistics themselves (updated in place by the kernel);
    `use_global_stats` None means paddle's default (batch statistics in training)."""
    return BatchNormSettings(_read(bn, "_momentum"), _read(bn, "_epsilon"), _read(bn, "_use_global_stats"),
                             _read(bn, "_data_format"), _read(bn, "_mean"), _read(bn, "_variance"))


def layer_norm_epsilon(norm):
    return _read(norm, "_epsilon")


def pool2d_settings(pool):
    """nn.MaxPool2D / nn.AvgPool2D as numbers: `kernel`, `stride` [h, w]; `padding` [h, w] when symmetric
    and given by numbers, else None (strings, 4 values: only paddle's kernel handles those)."""
    is_max = isinstance(pool, paddle.nn.MaxPool2D)
    pad = _read(pool, "padding")
    padding = _pair(pad) if isinstance(pad, int) or (isinstance(pad, (list, tuple)) and len(pad) == 2) else None
    stride = _read(pool, "stride")
    kernel = _pair(_read(pool, "ksize"))
    return Pool2DSettings(is_max, kernel, kernel if stride is None else _pair(stride), padding,
                          bool(_read(pool, "ceil_mode")), True if is_max else bool(_read(pool, "exclusive")),
                          None if is_max else _read(pool, "divisor"), _read(pool, "data_format"),
                          bool(_read(pool, "return_mask")) if is_max else False)


def lstm_settings(rnn):
    """paddle.nn.LSTM (RNNBase): `weights` per direction of the first layer, (weight_ih, weight_hh,
    bias_ih, bias_hh) as the layer exposes them (None for a bias it was built without)."""
    suffixes = ["", "_reverse"][:_read(rnn, "num_directions")]
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    weights = [tuple(getattr(rnn, f"{name}_l0{suffix}", None) for name in names) for suffix in suffixes]
    return LSTMSettings(_read(rnn, "mode"), _read(rnn, "num_layers"), _read(rnn, "time_major"),
                        _read(rnn, "proj_size"), weights)
