"""From head outputs to detections: box decoding, per-class NMS, top-k, mask pasting.

Facts from PaddleDetection 2.x (ppdet/modeling/layers.py RCNNBox + MultiClassNMS, post_process.py
BBoxPostProcess / MaskPostProcess / paste_mask; configs/mask_rcnn/_base_/mask_rcnn_r50_fpn.yml):
class probabilities are the softmax without the background column; each RoI's class deltas are
decoded with weights (10, 10, 5, 5) and clipped to the input image; candidates with a score above
0.05 go through NMS at IoU 0.5 per class and the best 100 per image are kept; boxes are divided by
the resize scale and clipped to the original image (a box left empty is dropped, as
PaddleDetection's results skip it); masks: sigmoid of the class channel, pasted
into the original image by bilinear sampling at pixel centres (zero outside the 28x28 grid), then
thresholded at 0.5.
"""
import numpy as np
import paddle
import paddle.nn.functional as F

from models.vision.mask_rcnn import box_ops


def detect(logits, deltas, rois, image_size, num_classes, weights=(10.0, 10.0, 5.0, 5.0),
           score_thresh=0.05, nms_thresh=0.5, max_per_image=100):
    """One image: (boxes [K, 4] input pixels, scores [K], labels [K] int64), best first.

    logits [N, C+1], deltas [N, 4C], rois [N, 4], image_size (h, w) of the image inside the padding.
    """
    h, w = float(image_size[0]), float(image_size[1])
    probs = F.softmax(logits, axis=-1)[:, :num_classes]
    boxes = box_ops.decode(deltas, rois, weights)                          # [N, C, 4]
    boxes = paddle.stack([boxes[..., 0].clip(0, w), boxes[..., 1].clip(0, h),
                          boxes[..., 2].clip(0, w), boxes[..., 3].clip(0, h)], axis=-1)
    flat_scores = probs.reshape([-1])
    keep = paddle.nonzero(flat_scores > score_thresh).reshape([-1])
    if keep.shape[0] == 0:
        return paddle.zeros([0, 4]), paddle.zeros([0]), paddle.zeros([0], "int64")
    cand = paddle.gather(boxes.reshape([-1, 4]), keep)
    scores = paddle.gather(flat_scores, keep)
    labels = keep % num_classes
    kept = _class_nms(cand, scores, labels, num_classes, nms_thresh)[:max_per_image]
    kept = paddle.to_tensor(kept)
    return paddle.gather(cand, kept), paddle.gather(scores, kept), paddle.gather(labels, kept)


def _class_nms(boxes, scores, labels, num_classes, thresh):
    """Indices kept by per-class NMS, best score first, with the official kernel's rule for boxes of
    zero area (clipped against an image edge): their IoU with each other is 0/0 = NaN, which fails
    `IoU <= thresh`, so of touching zero-area boxes of one class only the best survives; against a
    box of positive area their IoU is 0. Boxes of positive area go through paddle's nms."""
    b = boxes.numpy()
    flat = (b[:, 2] <= b[:, 0]) | (b[:, 3] <= b[:, 1])
    solid = np.flatnonzero(~flat)
    kept = []
    if len(solid):
        idx = paddle.to_tensor(solid)
        k = paddle.vision.ops.nms(paddle.gather(boxes, idx), thresh, paddle.gather(scores, idx),
                                  paddle.gather(labels, idx), list(range(num_classes)))
        kept.append(solid[k.numpy()])
    s, lab = scores.numpy(), labels.numpy()
    thin = np.flatnonzero(flat)
    thin = thin[np.argsort(-s[thin], kind="stable")]
    kept_thin = []
    for i in thin:
        touching = [j for j in kept_thin if lab[j] == lab[i] and not (
            b[i, 0] > b[j, 2] or b[i, 2] < b[j, 0] or b[i, 1] > b[j, 3] or b[i, 3] < b[j, 1])]
        if not touching:
            kept_thin.append(i)
    kept.append(np.array(kept_thin, np.int64))
    kept = np.concatenate(kept)
    return kept[np.argsort(-s[kept], kind="stable")]


def to_original(boxes, scale_factor, orig_size):
    """Input-pixel boxes [K, 4] (numpy) -> original image pixels, clipped to it.
    scale_factor (sy, sx): original -> input; orig_size (h, w)."""
    sy, sx = float(scale_factor[0]), float(scale_factor[1])
    out = np.asarray(boxes, np.float32) / np.array([sx, sy, sx, sy], np.float32)
    out[:, 0::2] = np.clip(out[:, 0::2], 0, orig_size[1])
    out[:, 1::2] = np.clip(out[:, 1::2], 0, orig_size[0])
    return out


def _axis_weights(lo, hi, size, grid):
    """Bilinear weights [n, grid] for the pixel centres in [first, first + n) of one image axis
    sampling a `grid`-cell mask spread over [lo, hi]; zero outside the grid (grid_sample's zero
    padding, align_corners=False). Returns (first, weights)."""
    first = max(int(np.floor(lo - (hi - lo) / grid)) - 1, 0)
    last = min(int(np.ceil(hi + (hi - lo) / grid)) + 1, size)
    centres = np.arange(first, last, dtype=np.float64) + 0.5
    u = (centres - lo) / max(hi - lo, 1e-6) * grid - 0.5           # continuous mask coordinate
    i0 = np.floor(u).astype(np.int64)
    f = u - i0
    weights = np.zeros((len(centres), grid), np.float64)
    rows = np.arange(len(centres))
    for idx, wt in ((i0, 1.0 - f), (i0 + 1, f)):
        ok = (idx >= 0) & (idx < grid)
        weights[rows[ok], idx[ok]] += wt[ok]
    return first, weights


def paste_mask_probs(mask, box, height, width):
    """One mask [M, M] (probabilities) pasted into `box` of a height x width image: float [h, w].

    Bilinear interpolation with zero padding is separable, so the result is Wy @ mask @ Wx^T over
    the rows and columns near the box, the same values as paddle's grid_sample at the pixel
    centres in PaddleDetection's paste_mask.
    """
    out = np.zeros((height, width), np.float64)
    x0, y0, x1, y1 = (float(v) for v in box)
    if x1 <= x0 or y1 <= y0:
        return out
    top, wy = _axis_weights(y0, y1, height, mask.shape[0])
    left, wx = _axis_weights(x0, x1, width, mask.shape[1])
    if len(wy) and len(wx):
        out[top:top + len(wy), left:left + len(wx)] = wy @ np.asarray(mask, np.float64) @ wx.T
    return out


def paste_masks(masks, boxes, height, width, threshold=0.5):
    """Masks [K, M, M] into boxes [K, 4] of a height x width image, >= threshold: uint8 [K, h, w]."""
    out = np.zeros((len(masks), height, width), np.uint8)
    for k, (m, box) in enumerate(zip(masks, np.asarray(boxes, np.float64).reshape(-1, 4))):
        out[k] = paste_mask_probs(m, box, height, width) >= threshold
    return out
