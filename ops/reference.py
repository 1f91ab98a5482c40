"""The pure Paddle reference of every fused operator: what runs when the fused path does not apply
(switched off, exported or traced by to_static, non-float32 or non-CPU tensors, no library), and
what the tests compare the kernels with. Plain paddle ops only, so every program exports."""
import paddle
import paddle.compat.nn.functional as compat_F
import paddle.incubate.nn.functional as incubate_F
import paddle.nn.functional as F

# the activations the layers take by name; the fused kernels cover None, relu and gelu (exact erf)
ACTIVATIONS = {None: lambda x: x, "none": lambda x: x, "relu": F.relu,
               "gelu": lambda x: F.gelu(x, approximate=False), "gelu_new": lambda x: F.gelu(x, approximate=True),
               "tanh": paddle.tanh}


def dropout(x, p, training, keep=None):
    """F.dropout, or (tests) the given keep-mask scaled by 1 / (1 - p)."""
    if keep is not None:
        return x * keep.detach().astype(x.dtype) / (1.0 - p) if p else x
    return F.dropout(x, p, training=training) if p and training else x


def bias_act(x, bias, act=None, p=0.0, training=True, keep=None):
    return dropout(ACTIVATIONS[act](x + bias), p, training, keep)


def on_device(x):
    """A dynamic-graph tensor off the CPU (a GPU's, or another accelerator's). A program being traced
    (export) has no place yet: it keeps what it traced before."""
    return paddle.in_dynamic_mode() and not x.place.is_cpu_place()


def on_gpu(x):
    return paddle.in_dynamic_mode() and x.place.is_gpu_place()


def linear(x, weight, bias=None):
    """x @ weight + bias. On CPU tensors with gradients the bias rides inside the matmul (a ones column
    on the input, the bias as an extra weight row; the parameters are unchanged): paddle's CPU bias
    gradient is a slow row sum, and this halves the cost of a Linear layer's forward + backward. On a
    GPU it would cost two copies per layer and an odd K for the tensor cores: F.linear (cuBLAS's bias
    epilogue), as the kits run it."""
    if bias is None:
        return paddle.matmul(x, weight)
    if on_device(x) or not paddle.is_grad_enabled() or (x.stop_gradient and weight.stop_gradient):
        return F.linear(x, weight, bias)
    lead, d = x.shape[:-1], x.shape[-1]
    x2 = x.reshape([-1, d])
    x2 = paddle.concat([x2, paddle.ones([x2.shape[0], 1], dtype=x2.dtype)], axis=1)
    y = paddle.matmul(x2, paddle.concat([weight, bias.unsqueeze(0)], axis=0))
    return y.reshape(lead + [weight.shape[1]])


def bias_dropout_residual(x, bias, residual, p=0.0, training=True, keep=None):
    return residual + dropout(x if bias is None else x + bias, p, training, keep)


# dtypes of paddle's fused_bias_dropout_residual_layer_norm GPU kernel (paddle/phi/kernels/fusion/gpu/
# fused_bias_dropout_residual_layer_norm_kernel.cu: float, double, float16; no bfloat16)
_FUSED_LN_DTYPES = (paddle.float32, paddle.float16)


def bias_dropout_residual_ln(x, bias, residual, weight, norm_bias, p=0.0, eps=1e-5, training=True, keep=None):
    """On a GPU paddle's fused kernel (PaddleNLP's FusedBiasDropoutResidualLayerNorm), one pass for
    the add, dropout, residual and LayerNorm, where it has the dtype (not bf16: composed ops then)."""
    if keep is None and on_gpu(x) and x.dtype in _FUSED_LN_DTYPES and residual.dtype == x.dtype:
        return incubate_F.fused_bias_dropout_residual_layer_norm(
            x, residual, bias, weight, norm_bias, dropout_rate=p if training else 0.0, ln_epsilon=eps,
            training=training, mode="upscale_in_train")
    h = bias_dropout_residual(x, bias, residual, p, training, keep)
    return F.layer_norm(h, h.shape[-1:], weight, norm_bias, eps)


def layer_norm(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def softmax_dropout(scores, mask, scale=1.0, p=0.0, training=True, keep=None):
    z = scores * scale if scale != 1.0 else scores
    probs = F.softmax(z + mask if mask is not None else z, axis=-1)
    return dropout(probs, p, training, keep)


def attention(q, k, v, mask, p=0.0, training=True):
    """softmax(q k^T / sqrt(d) + mask) v over [B, heads, S, d] (`mask` additive, broadcast over heads
    and queries). On a GPU paddle's scaled_dot_product_attention (flash or memory-efficient attention
    where the GPU has them; the compat API takes this layout, and has no `training`: dropout is
    passed only when training). On our CPUs the matmuls below beat it."""
    if on_gpu(q):
        return compat_F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p if training else 0.0)
    scores = paddle.matmul(q * (q.shape[-1] ** -0.5), k, transpose_y=True)
    if mask is not None:
        scores = scores + mask
    return paddle.matmul(dropout(F.softmax(scores, axis=-1), p, training), v)


def smooth_cross_entropy(logits, labels, eps=0.0):
    """paddle's fused cross entropy plus a gather and a mean (no log-softmax tensor: paddle's CPU
    log_softmax is ~10x slower than its cross entropy)."""
    labels = labels.unsqueeze(-1)
    nll = F.cross_entropy(logits, labels, reduction="none", ignore_index=-1).squeeze(-1)
    if not eps:
        return nll, nll
    valid = labels.squeeze(-1) >= 0
    picked = paddle.take_along_axis(logits, labels.clip(min=0), axis=-1).squeeze(-1)
    smooth = paddle.where(valid, picked - logits.mean(axis=-1), paddle.zeros_like(picked))
    return nll + eps * smooth, nll


def batch_norm_act(x, bn, relu=True, residual=None):
    if x.dtype == paddle.bfloat16:   # paddle's CPU build has no bf16 batch_norm, add or relu
        r = None if residual is None else residual.astype("float32")
        return batch_norm_act(x.astype("float32"), bn, relu, r).astype("bfloat16")
    y = bn(x)
    if residual is not None:
        y = y + residual
    return F.relu(y) if relu else y
