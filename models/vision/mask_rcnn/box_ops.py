"""Box arithmetic shared by the RPN and the RoI heads: IoU, box coding, matching, sampling, FPN levels.

Target assignment (matching and sampling) runs in numpy on the host: it is index bookkeeping over a
few hundred thousand anchors, with no gradient. Its random draws are permutations from paddle's
generator (`random_permutation`), which the trainer seeds per (seed, epoch) and checkpoints, so a
resumed run draws the same samples. Boxes are x1, y1, x2, y2 in input pixels; widths are x2 - x1 (no +1), as in
PaddleDetection 2.x (`ppdet/modeling/bbox_utils.py`).
"""
import math

import numpy as np
import paddle

# PaddleDetection's clip of dw, dh before exp() when decoding (bbox_utils.delta2bbox)
DELTA_CLIP = math.log(1000.0 / 16)


def box_area(boxes):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(a, b):
    """IoU [N, M] of boxes a [N, 4] and b [M, 4] (numpy, float64 inside); 0 where the union is 0."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def encode(src, tgt, weights=(1.0, 1.0, 1.0, 1.0)):
    """Deltas (dx, dy, dw, dh) [N, 4] that move boxes `src` onto `tgt` (numpy; the targets)."""
    src = np.asarray(src, np.float64).reshape(-1, 4)
    tgt = np.asarray(tgt, np.float64).reshape(-1, 4)
    sw, sh = src[:, 2] - src[:, 0], src[:, 3] - src[:, 1]
    sx, sy = src[:, 0] + 0.5 * sw, src[:, 1] + 0.5 * sh
    tw, th = tgt[:, 2] - tgt[:, 0], tgt[:, 3] - tgt[:, 1]
    tx, ty = tgt[:, 0] + 0.5 * tw, tgt[:, 1] + 0.5 * th
    wx, wy, ww, wh = weights
    out = np.stack([wx * (tx - sx) / sw, wy * (ty - sy) / sh, ww * np.log(tw / sw), wh * np.log(th / sh)], 1)
    return out.astype(np.float32)


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


def match(iou, pos_thresh, neg_thresh, allow_low_quality, crowd=None, crowd_ignore_iou=-1.0):
    """Match each candidate (column of iou [G, N]) to a ground-truth box (row).

    Returns (matches [N] int64: the best gt per candidate, 0 when there is none;
             labels [N] int8: 1 positive (IoU >= pos_thresh), 0 negative (IoU < neg_thresh),
             -1 ignored (in between, or near a crowd region)).
    `allow_low_quality` (the RPN's rule) also makes positive every candidate that is the best match
    of some ground truth (ties included, IoU > 0). Ties between ground truths go to the lower index.
    Crowd ground truths never match (their IoU counts as -1); with crowd_ignore_iou > 0 a candidate
    overlapping a crowd region more than that is ignored. No (non-crowd) ground truth: all negative.
    This is PaddleDetection's `label_box` (ppdet/modeling/proposal_generator/target.py).
    """
    iou = np.asarray(iou, np.float64)
    g, n = iou.shape
    crowd = np.zeros(g, bool) if crowd is None else np.asarray(crowd, bool).reshape(-1)
    if g == 0 or crowd.all():
        return np.zeros(n, np.int64), np.zeros(n, np.int8)
    iou = iou.copy()
    if crowd.any():
        if crowd_ignore_iou > 0:
            near_crowd = (iou[crowd] > crowd_ignore_iou).any(axis=0)
            iou[:, near_crowd] = -1.0
        iou[crowd] = -1.0
    matches = np.argmax(iou, axis=0)           # first maximum: ties go to the lower gt index
    best = iou[matches, np.arange(n)]
    labels = np.full(n, -1, np.int8)
    labels[(best > -1) & (best < neg_thresh)] = 0
    labels[best >= pos_thresh] = 1
    if allow_low_quality:
        top = iou.max(axis=1, keepdims=True)
        labels[((iou > 0) & (iou == top)).any(axis=0)] = 1
    return matches.astype(np.int64), labels


def random_permutation(n):
    """A random permutation of range(n) (int64) from paddle's generator, which the trainer seeds per
    (seed, epoch) and checkpoints. Every sampling draw of the training targets goes through this one
    function: the tests replace it to replay PaddleDetection's draws (tests/test_mask_rcnn_training.py)."""
    return paddle.randperm(n, dtype="int64").numpy() if n else np.zeros(0, np.int64)


def subsample(positive, negative, num, fg_fraction, use_random=True):
    """(fg, bg) indices: at most int(num * fg_fraction) of `positive`, the rest (up to num) from
    `negative`; a random subset in random order, or the first ones without use_random.

    PaddleDetection's subsample_labels (ppdet/modeling/proposal_generator/target.py): nothing is
    drawn when both counts are 0; otherwise one permutation of all the negatives, then (when some
    positive is taken) one of all the positives, in that order, each cut to its count."""
    positive, negative = np.asarray(positive, np.int64), np.asarray(negative, np.int64)
    fg_num = min(len(positive), int(num * fg_fraction))
    bg_num = min(len(negative), num - fg_num)
    if fg_num == 0 and bg_num == 0:
        return positive[:0], negative[:0]
    if use_random:
        negative = negative[random_permutation(len(negative))]
        if fg_num:
            positive = positive[random_permutation(len(positive))]
    return positive[:fg_num], negative[:bg_num]


def fpn_levels(boxes, min_level=2, max_level=5, canonical_level=4, canonical_size=224):
    """FPN level of each RoI [N, 4] (paddle): clip(floor(4 + log2(sqrt(w h) / 224 + 1e-8)), 2, 5),
    the rule of the FPN paper as paddle's distribute_fpn_proposals computes it (no +1 on w, h)."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    scale = paddle.sqrt(paddle.clip(w * h, min=0.0))
    lvl = paddle.floor(canonical_level + paddle.log2(scale / canonical_size + 1e-8))
    return paddle.clip(lvl, min_level, max_level).astype("int64")
