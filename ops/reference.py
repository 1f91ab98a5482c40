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
    log_softmax is far slower than its cross entropy: docs/performance.md#fused-operators)."""
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


def roi_align(x, boxes, boxes_num, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True):
    return paddle.vision.ops.roi_align(x, boxes, boxes_num, output_size, spatial_scale=spatial_scale,
                                       sampling_ratio=sampling_ratio, aligned=aligned)


def rasterize_polygons(xy, counts, height, width):
    """Masks [F, height, width] (uint8) of F polygon sets, equal to pycocotools' frPyObjects +
    merge + decode (maskApi.c rleFrPoly, which PaddleDetection's targets use), in tensor operators.

    xy float64 [F, V, 2]: each set's parts, vertices concatenated part after part (padding after);
    counts [F, K]: vertices of each part (0: no part; parts of fewer than 3 vertices are skipped,
    as polygons_to_mask does). rleFrPoly scales the vertices by 5 and truncates
    (x = (int)(5 x + .5)), walks each edge in unit steps of its longer axis and toggles, in column
    c, the pixel row below every step between x = 5c + 2 and 5c + 3; the mask is the parity of the
    toggles up to each pixel of the column-major image. Here every (edge, column) pair solves for its
    step directly: an x-major edge has exactly one candidate step, a y-major one is found in a window
    of 4 steps around the real crossing and checked with rleFrPoly's own double-precision formula,
    so the work is [F, V, width] whatever the polygons' extent. Parts are OR-ed (merge, no intersect).
    float64 throughout: the truncations must see rleFrPoly's doubles bit for bit (small tensors:
    at most `EDGE_ROWS` x width x 5 values per chunk of sets).
    """
    step = max(1, EDGE_ROWS // max(1, xy.shape[1]))
    if xy.shape[0] > step:                                  # bounded memory: chunks of sets (host-known sizes)
        return paddle.concat([_rasterize(xy[i:i + step], counts[i:i + step], height, width)
                              for i in range(0, xy.shape[0], step)])
    return _rasterize(xy, counts, height, width)


EDGE_ROWS = 1 << 15     # sets x vertices rasterised at once


def _rasterize(xy, counts, height, width):
    f, v, _ = xy.shape
    k = counts.shape[1]
    h, w = int(height), int(width)
    if f == 0:
        return paddle.zeros([0, h, w], "uint8")
    counts = counts.astype("int64")
    ends = paddle.cumsum(counts, axis=1)
    j = paddle.arange(v, dtype="int64")
    part = (j.reshape([1, v, 1]) >= ends.unsqueeze(1)).astype("int64").sum(2)      # [F, V], K: padding
    part_c = part.clip(max=k - 1)
    end_j = paddle.take_along_axis(ends, part_c, 1)
    count_j = paddle.take_along_axis(counts, part_c, 1)
    nxt = paddle.where(j + 1 == end_j, end_j - count_j, j + 1).clip(max=v - 1)
    edge_ok = (part < k) & (count_j >= 3)
    X = paddle.trunc(5.0 * xy[:, :, 0] + 0.5)
    Y = paddle.trunc(5.0 * xy[:, :, 1] + 0.5)
    Xe, Ye = paddle.take_along_axis(X, nxt, 1), paddle.take_along_axis(Y, nxt, 1)
    dx, dy = paddle.abs(Xe - X), paddle.abs(Ye - Y)
    x_major = dx >= dy
    flip = (x_major & (X > Xe)) | (~x_major & (Y > Ye))
    xs, xe = paddle.where(flip, Xe, X), paddle.where(flip, X, Xe)
    ys, ye = paddle.where(flip, Ye, Y), paddle.where(flip, Y, Ye)
    one = paddle.ones_like(dx)
    col = paddle.arange(w, dtype="float64")                      # output columns c
    u_lo = 5.0 * col + 2.0                                       # the step from 5c + 2 to 5c + 3
    e = lambda t: t.unsqueeze(2)  # noqa: E731  [F, V] -> [F, V, 1]
    # x-major edges: u = xs + t, v = (int)(ys + s t + .5) for t = 0..dx; the step t -> t + 1 at t = 5c + 2 - xs
    s = (ye - ys) / paddle.where(dx > 0, dx, one)
    t = u_lo - e(xs)                                             # [F, V, W]
    v0 = paddle.trunc(e(ys) + e(s) * t + 0.5)
    v1 = paddle.trunc(e(ys) + e(s) * (t + 1.0) + 0.5)
    ok_a = e(edge_ok & x_major & (dx > 0)) & (t >= 0) & (t <= e(dx) - 1.0)
    row_a = paddle.minimum(v0, v1)
    # y-major edges: v = ys + t, u = (int)(xs + s t + .5) for t = 0..dy (|s| < 1, u monotone)
    s = (xe - xs) / paddle.where(dy > 0, dy, one)
    s_safe = paddle.where(s != 0, s, one)
    t0 = ((u_lo + 0.5) - e(xs)) / e(s_safe)                      # xs + s t + .5 = 5c + 3
    t0 = paddle.floor(paddle.minimum(t0.clip(min=-4.0), e(dy) + 4.0))   # NaN-free, no overflow
    T = t0.unsqueeze(3) + paddle.to_tensor([-2.0, -1.0, 0.0, 1.0], dtype="float64")   # [F, V, W, 4]
    ee = lambda t: t.unsqueeze(2).unsqueeze(3)  # noqa: E731
    u0 = paddle.trunc(ee(xs) + ee(s) * T + 0.5)
    u1 = paddle.trunc(ee(xs) + ee(s) * (T + 1.0) + 0.5)
    ok_b = (ee(edge_ok & ~x_major & (s != 0)) & (T >= 0) & (T <= ee(dy) - 1.0)
            & (paddle.minimum(u0, u1) == u_lo.reshape([1, 1, w, 1])) & (paddle.abs(u1 - u0) == 1.0))
    row_b = ee(ys) + T
    # toggle rows: ceil(clip((v + .5) / 5 - .5, 0, h)); flat column-major position c h + row
    rows = paddle.concat([row_a.unsqueeze(3), row_b], 3)
    ok = paddle.concat([ok_a.unsqueeze(3), ok_b], 3)
    rows = paddle.ceil(((rows + 0.5) / 5.0 - 0.5).clip(0.0, float(h)))
    pos = (col.reshape([1, 1, w, 1]) * h + rows).astype("int64")
    slot = (paddle.arange(f, dtype="int64").unsqueeze(1) * k + part_c).reshape([f, v, 1, 1])
    size = h * w + 1
    index = paddle.where(ok, slot * size + pos, paddle.zeros_like(pos)).reshape([-1, 1])
    hist = paddle.scatter_nd_add(paddle.zeros([f * k * size], "int32"), index, ok.astype("int32").reshape([-1]))
    inside = paddle.cumsum(hist.reshape([f, k, size]), axis=2)[:, :, :h * w] % 2
    return (inside.sum(1) > 0).astype("uint8").reshape([f, w, h]).transpose([0, 2, 1])
