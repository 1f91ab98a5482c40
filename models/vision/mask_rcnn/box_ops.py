"""Box arithmetic shared by the RPN and the RoI heads: IoU, box coding, matching, sampling, FPN levels.

Target assignment (matching and sampling) runs in paddle operators on the device of the model's
tensors, nothing read back to the host: only the sampler's `paddle.nonzero` (the candidates of a
label, whose count sizes the random permutation, as in PaddleDetection) waits for the device. Its
random draws are permutations from paddle's generator (`random_permutation`), which the trainer
seeds per (seed, epoch) and checkpoints, so a resumed run draws the same samples. Boxes are x1, y1,
x2, y2 in input pixels; widths are x2 - x1 (no +1), as in PaddleDetection 2.x
(`ppdet/modeling/bbox_utils.py`).
"""
import math

import paddle

# PaddleDetection's clip of dw, dh before exp() when decoding (bbox_utils.delta2bbox)
DELTA_CLIP = math.log(1000.0 / 16)


def as_tensor(x, dtype=None):
    """`x` as a tensor (array-likes of tests and hand-made inputs: host -> device, never back)."""
    if not isinstance(x, paddle.Tensor):
        import numpy as np  # noqa: PLC0415 (array-likes only: the training path passes tensors)
        x = paddle.to_tensor(np.asarray(x, dtype))
    return x if dtype is None else x.astype(dtype)


def box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(a, b):
    """IoU [N, M] of boxes a [N, 4] and b [M, 4] (float32 tensors); 0 where there is no intersection.

    float32 and PaddleDetection's operation order (bbox_utils.bbox_overlaps): the thresholds then
    see the official values (the golden anchor and RoI labels are equal with it), and the anchor
    IoU, the one large tensor here ([G, ~200k]), stays in the fast dtype of a GPU."""
    a, b = as_tensor(a, "float32").reshape([-1, 4]), as_tensor(b, "float32").reshape([-1, 4])
    if a.shape[0] == 0 or b.shape[0] == 0:
        return paddle.zeros([a.shape[0], b.shape[0]], "float32")
    rb = paddle.minimum(a.unsqueeze(1)[:, :, 2:], b[:, 2:])
    lt = paddle.maximum(a.unsqueeze(1)[:, :, :2], b[:, :2])
    inter = (rb - lt).clip(min=0).prod(axis=2)
    union = box_area(a).unsqueeze(1) + box_area(b) - inter
    return paddle.where(inter > 0, inter / paddle.where(inter > 0, union, paddle.ones_like(union)),
                        paddle.zeros_like(inter))


def encode(src, tgt, weights=(1.0, 1.0, 1.0, 1.0)):
    """Deltas (dx, dy, dw, dh) [N, 4] float32 that move boxes `src` onto `tgt` (the regression
    targets; float32 as PaddleDetection's bbox2delta)."""
    src, tgt = as_tensor(src, "float32").reshape([-1, 4]), as_tensor(tgt, "float32").reshape([-1, 4])
    sw, sh = src[:, 2] - src[:, 0], src[:, 3] - src[:, 1]
    sx, sy = src[:, 0] + 0.5 * sw, src[:, 1] + 0.5 * sh
    tw, th = tgt[:, 2] - tgt[:, 0], tgt[:, 3] - tgt[:, 1]
    tx, ty = tgt[:, 0] + 0.5 * tw, tgt[:, 1] + 0.5 * th
    wx, wy, ww, wh = weights
    return paddle.stack([wx * (tx - sx) / sw, wy * (ty - sy) / sh, ww * paddle.log(tw / sw),
                         wh * paddle.log(th / sh)], 1)


def decode(deltas, boxes, weights=(1.0, 1.0, 1.0, 1.0)):
    """Boxes [N, K, 4] from deltas [N, 4K] (K boxes per row: one per class) applied to boxes [N, 4]
    (paddle tensors; dw, dh clipped at log(1000/16) before exp)."""
    n = deltas.shape[0]
    d = deltas.reshape([n, -1, 4])
    w = (boxes[:, 2] - boxes[:, 0]).unsqueeze(1)
    h = (boxes[:, 3] - boxes[:, 1]).unsqueeze(1)
    cx = boxes[:, 0].unsqueeze(1) + 0.5 * w
    cy = boxes[:, 1].unsqueeze(1) + 0.5 * h
    wx, wy, ww, wh = weights
    dx, dy = d[:, :, 0] / wx, d[:, :, 1] / wy
    dw = paddle.clip(d[:, :, 2] / ww, max=DELTA_CLIP)
    dh = paddle.clip(d[:, :, 3] / wh, max=DELTA_CLIP)
    px, py = dx * w + cx, dy * h + cy
    pw, ph = paddle.exp(dw) * w, paddle.exp(dh) * h
    return paddle.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], axis=-1)


def match(iou, pos_thresh, neg_thresh, allow_low_quality, crowd=None, crowd_ignore_iou=-1.0, same=None):
    """Match each candidate (column of iou [G, N]) to a ground-truth box (row).

    Returns (matches [N] int64: the best gt per candidate, 0 when there is none;
             labels [N] int32: 1 positive (IoU >= pos_thresh), 0 negative (IoU < neg_thresh),
             -1 ignored (in between, or near a crowd region)).
    `allow_low_quality` (the RPN's rule) also makes positive every candidate that is the best match
    of some ground truth (ties included, IoU > 0). Ties between ground truths go to the lower index.
    Crowd ground truths never match (their IoU counts as -1); with crowd_ignore_iou > 0 a candidate
    overlapping a crowd region more than that is ignored. No (non-crowd) ground truth: all negative.
    This is PaddleDetection's `label_box` (ppdet/modeling/proposal_generator/target.py).
    `same` [G, N] bool (several images at once): the pairs of one image; the others do not exist.
    Branch-free tensor code: the data decide nothing on the host.
    """
    iou = as_tensor(iou)
    g, n = iou.shape
    if g == 0:
        return paddle.zeros([n], "int64"), paddle.zeros([n], "int32")
    crowd = paddle.zeros([g], "bool") if crowd is None else as_tensor(crowd, "bool").reshape([-1])
    crowd_rows = crowd.unsqueeze(1)
    if same is None:
        same = paddle.ones([g, n], "bool")
    if crowd_ignore_iou > 0:
        near_crowd = paddle.any((iou > crowd_ignore_iou) & crowd_rows & same, axis=0, keepdim=True)
        iou = paddle.where(near_crowd, paddle.full_like(iou, -1.0), iou)
    iou = paddle.where(crowd_rows, paddle.full_like(iou, -1.0), iou)
    iou = paddle.where(same, iou, paddle.full_like(iou, -2.0))      # below any real pair
    best = iou.max(axis=0)
    rows = paddle.arange(g, dtype="int64").unsqueeze(1).expand([g, n])
    matches = paddle.where(iou == best, rows, paddle.full_like(rows, g)).min(axis=0)   # the lower index
    labels = paddle.full([n], -1, "int32")
    labels = paddle.where((best > -1) & (best < neg_thresh), paddle.zeros_like(labels), labels)
    labels = paddle.where(best >= pos_thresh, paddle.ones_like(labels), labels)
    if allow_low_quality:
        top = iou.max(axis=1, keepdim=True)
        labels = paddle.where(paddle.any((iou > 0) & (iou == top), axis=0), paddle.ones_like(labels), labels)
    has_gt = paddle.any(same & ~crowd_rows, axis=0)                  # an image without one: all negative
    return (paddle.where(has_gt, matches, paddle.zeros_like(matches)),
            paddle.where(has_gt, labels, paddle.zeros_like(labels)))


def random_permutation(n):
    """A random permutation of range(n) (int64) from paddle's generator, which the trainer seeds per
    (seed, epoch) and checkpoints. Every sampling draw of the training targets goes through this one
    function: the tests replace it to replay PaddleDetection's draws (tests/test_mask_rcnn_training.py)."""
    return paddle.randperm(n, dtype="int64")


def subsample(labels, num, fg_fraction, use_random=True):
    """(fg, bg) int64 indices of `labels` [N] (1 positive, 0 negative, -1 ignored): at most
    int(num * fg_fraction) positives, the rest (up to num) negatives; a random subset in random
    order, or the first ones without use_random.

    PaddleDetection's subsample_labels (ppdet/modeling/proposal_generator/target.py): nothing is
    drawn when both counts are 0; otherwise one permutation of all the negatives, then (when some
    positive is taken) one of all the positives, in that order, each cut to its count. The two
    paddle.nonzero are the step's wait for the device: the counts size the permutations."""
    labels = as_tensor(labels)
    positive = paddle.nonzero(labels == 1).reshape([-1])
    negative = paddle.nonzero(labels == 0).reshape([-1])
    fg_num = min(positive.shape[0], int(num * fg_fraction))
    bg_num = min(negative.shape[0], num - fg_num)
    if fg_num == 0 and bg_num == 0:
        return positive[:0], negative[:0]
    if use_random:
        negative = _permute(negative)
        if fg_num:
            positive = _permute(positive)
    return positive[:fg_num], negative[:bg_num]


def _permute(index):
    perm = random_permutation(index.shape[0])
    if not isinstance(perm, paddle.Tensor):            # a replayed draw (tests): host -> device
        perm = paddle.to_tensor(perm, dtype="int64", place=index.place)
    return paddle.gather(index, perm) if index.shape[0] else index


def fpn_levels(boxes, min_level=2, max_level=5, canonical_level=4, canonical_size=224):
    """FPN level of each RoI [N, 4] (paddle): clip(floor(4 + log2(sqrt(w h) / 224 + 1e-8)), 2, 5),
    the rule of the FPN paper as paddle's distribute_fpn_proposals computes it (no +1 on w, h)."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    scale = paddle.sqrt(paddle.clip(w * h, min=0.0))
    lvl = paddle.floor(canonical_level + paddle.log2(scale / canonical_size + 1e-8))
    return paddle.clip(lvl, min_level, max_level).astype("int64")
