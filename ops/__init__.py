"""The fused CPU kernels as one layer package, below models/ and engine/ (it imports neither).

- layers.py: what models call (linear + activation + dropout, attention, add & norm, convolution,
  conv + BN + act, transposed convolution, LSTM, pooling and the channel concat of bf16 activations,
  label-smoothed cross entropy, RoIAlign, polygon masks), on the models' own paddle layers; re-exported here.
- functional.py: the same operators on tensors; each picks its fused kernel or its reference, by the
  one precision context (`Precision`, `precision`, `current_precision`, `set_precision`).
- reference.py: the pure Paddle references (what exports, and what the tests compare with).
- library.py: building (`make ops`), caching and loading csrc/ops.cc and csrc/dnnl.cc.
- paddle_attrs.py: the one reader of paddle layers' private attributes.

docs/contributing.md says how a model uses it and how to add a kernel.
"""
from ops.functional import Precision, bf16_supported, current_precision, grad_norms, precision, set_precision
from ops.layers import (activation, add, add_norm, attention, concat_channels, conv2d, conv_bn_act, conv_transpose,
                        float32, layer_norm, linear, linear_add_norm, lstm, matmul, pool, rasterize_polygons, roi_align,
                        set_attention, smooth_cross_entropy)

__all__ = ["Precision", "activation", "add", "add_norm", "attention", "bf16_supported", "concat_channels", "conv2d",
           "conv_bn_act", "conv_transpose", "current_precision", "float32", "grad_norms", "layer_norm", "linear",
           "linear_add_norm", "lstm", "matmul", "pool", "precision", "rasterize_polygons", "roi_align",
           "set_attention", "set_precision", "smooth_cross_entropy"]
