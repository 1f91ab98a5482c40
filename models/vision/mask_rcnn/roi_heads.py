"""RoI heads: multi-level RoIAlign, the two-FC box head, the mask head, their targets and losses.

Facts from PaddleDetection 2.x (ppdet/modeling/heads/{roi_extractor,bbox_head,mask_head}.py,
proposal_generator/target.py, configs/mask_rcnn/_base_/mask_rcnn_r50_fpn.yml):
- RoIAlign over P2..P5 (spatial scales 1/4..1/32), level clip(floor(4 + log2(sqrt(wh)/224)), 2, 5),
  adaptive sampling (sampling_ratio 0), aligned=True (half-pixel offset) as the config says and as
  the released mask_rcnn_r50_fpn_1x_coco (39.2 box / 35.6 mask AP) was trained. PaddleDetection's
  RoIAlign.__init__ has hard-coded aligned=False since 2024 (commit abeaad7: an NPU kernel lacks
  aligned=True); that is a workaround, not the trained model, so we do not copy it. `aligned` stays
  a setting for checkpoints trained with our earlier default (False);
- box head: flatten 256x7x7 -> fc6 -> ReLU -> fc7 -> ReLU (1024), class logits for C + 1 classes
  with the background LAST, class-specific deltas 4C coded with weights (10, 10, 5, 5); init:
  fc6 XavierUniform(fan_out = 256*49), fc7 XavierUniform, logits N(0, 0.01), deltas N(0, 0.001);
- RoI targets: the proposals plus the ground-truth boxes, IoU >= 0.5 foreground, < 0.5 background,
  512 per image with at most 25% foreground; losses: softmax cross-entropy (mean over the sampled
  RoIs) and L1 on the foreground's class deltas summed, divided by the number of sampled RoIs;
- mask head: RoIAlign 14x14 on the foreground RoIs, 4 x (3x3 conv 256 + ReLU), 2x2 stride-2 deconv
  + ReLU, 1x1 conv to C logits at 28x28 (no background channel); target: the matched instance's
  polygons moved into the RoI, scaled to 28x28 and rasterised (pycocotools); loss: sigmoid
  cross-entropy of the ground-truth class's channel, mean over pixels and RoIs.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from models.vision.mask_rcnn import box_ops


class MultiScaleRoIAlign(nn.Layer):
    """RoI features [N, C, R, R] from the FPN levels P2..P5 (RoIs of every image concatenated, in order)."""

    def __init__(self, resolution, scales=(1 / 4, 1 / 8, 1 / 16, 1 / 32), sampling_ratio=0, aligned=True,
                 min_level=2, canonical_level=4, canonical_size=224):
        super().__init__()
        self.resolution, self.scales = resolution, list(scales)
        self.sampling_ratio, self.aligned = sampling_ratio, aligned
        self.min_level, self.canonical = min_level, (canonical_level, canonical_size)

    def forward(self, feats, rois, rois_num=None):
        """feats: [P2, P3, ...]; rois: [N, 4] of every image in order with rois_num [B] (int), or a
        list of [N_i, 4] per image. Tensor operations only (no host round trip), so the exported
        program runs the same code: each RoI goes to its level, the per-level results are put
        back in the RoIs' order."""
        if rois_num is None:
            rois_num = paddle.to_tensor(np.array([r.shape[0] for r in rois], np.int32))
            rois = paddle.concat(rois) if len(rois) > 1 else rois[0]
        rois_num = rois_num.astype("int32")
        images = paddle.arange(rois_num.shape[0], dtype="int32")
        image_of = paddle.repeat_interleave(images, rois_num)
        max_level = self.min_level + len(self.scales) - 1
        levels = box_ops.fpn_levels(rois, self.min_level, max_level, *self.canonical)
        parts, order = [], []
        for k, scale in enumerate(self.scales):
            idx = paddle.nonzero(levels == self.min_level + k).reshape([-1])
            # RoIs of this level per image: roi_align's batch split
            per_image = (paddle.gather(image_of, idx).unsqueeze(1) == images.unsqueeze(0)).astype("int32").sum(0)
            parts.append(paddle.vision.ops.roi_align(
                feats[k], paddle.gather(rois, idx), per_image, self.resolution, spatial_scale=scale,
                sampling_ratio=self.sampling_ratio, aligned=self.aligned))
            order.append(idx)
        return paddle.gather(paddle.concat(parts), paddle.argsort(paddle.concat(order)))


class BoxHead(nn.Layer):
    """Two FC layers, then class logits [N, C+1] (background last) and deltas [N, 4C]."""

    def __init__(self, in_channels, resolution, num_classes, fc_dim=1024):
        super().__init__()
        fan = in_channels * resolution * resolution
        self.fc6 = nn.Linear(fan, fc_dim, weight_attr=paddle.ParamAttr(
            initializer=nn.initializer.XavierUniform(fan_out=fan)))
        self.fc7 = nn.Linear(fc_dim, fc_dim, weight_attr=paddle.ParamAttr(
            initializer=nn.initializer.XavierUniform()))
        self.cls_score = nn.Linear(fc_dim, num_classes + 1, weight_attr=paddle.ParamAttr(
            initializer=nn.initializer.Normal(0.0, 0.01)))
        self.bbox_pred = nn.Linear(fc_dim, 4 * num_classes, weight_attr=paddle.ParamAttr(
            initializer=nn.initializer.Normal(0.0, 0.001)))

    def features(self, roi_feats):
        x = F.relu(self.fc6(roi_feats.flatten(1)))
        return F.relu(self.fc7(x))

    def forward(self, roi_feats):
        x = self.features(roi_feats)
        return self.cls_score(x), self.bbox_pred(x)


class MaskHead(nn.Layer):
    """num_convs x (3x3 conv + ReLU), 2x2 deconv + ReLU, 1x1 conv: logits [N, C, 2R, 2R]."""

    def __init__(self, in_channels, num_classes, channels=256, num_convs=4):
        super().__init__()
        kaiming = lambda fan: paddle.ParamAttr(initializer=nn.initializer.KaimingNormal(fan_in=fan))  # noqa: E731
        self.convs = nn.LayerList([nn.Conv2D(in_channels if i == 0 else channels, channels, 3, padding=1,
                                             weight_attr=kaiming(channels * 9)) for i in range(num_convs)])
        self.deconv = nn.Conv2DTranspose(channels if num_convs else in_channels, channels, 2, stride=2,
                                         weight_attr=kaiming(channels * 4))
        self.logits = nn.Conv2D(channels, num_classes, 1, weight_attr=kaiming(num_classes))

    def forward(self, roi_feats):
        x = roi_feats
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.logits(F.relu(self.deconv(x)))


def select_class(logits, classes):
    """logits [N, C, H, W], classes [N] -> logits[i, classes[i]] [N, H, W]."""
    c = logits.shape[1]
    flat = logits.reshape([-1] + list(logits.shape[2:]))          # -1: N may be a dynamic size
    index = paddle.arange(logits.shape[0], dtype="int64") * c + classes.astype("int64").reshape([-1])
    return paddle.gather(flat, index)


# ------------------------------------------------------------------------------------- targets

def sample_rois(proposals, gt_boxes, gt_classes, gt_crowd, num_classes, batch_size_per_image=512,
                fg_fraction=0.25, fg_thresh=0.5, bg_thresh=0.5, use_random=True, crowd_ignore_iou=-1.0):
    """One image's RoIs for the heads (numpy): the proposals plus the non-crowd ground truths,
    matched and sampled. Returns (rois [S, 4], classes [S] with num_classes = background,
    matched gt index [S], regression targets' boxes [S, 4])."""
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)
    crowd = np.asarray(gt_crowd, bool).reshape(-1)
    candidates = np.concatenate([np.asarray(proposals, np.float32).reshape(-1, 4), gt_boxes[~crowd]])
    iou = box_ops.box_iou(gt_boxes, candidates)
    matches, labels = box_ops.match(iou, fg_thresh, bg_thresh, False, crowd, crowd_ignore_iou)
    fg, bg = box_ops.subsample(np.flatnonzero(labels == 1), np.flatnonzero(labels == 0),
                               batch_size_per_image, fg_fraction, use_random)
    keep = np.concatenate([fg, bg])
    classes = np.full(len(keep), num_classes, np.int64)
    if len(fg):
        classes[:len(fg)] = np.asarray(gt_classes, np.int64).reshape(-1)[matches[fg]]
    matched = matches[keep]
    targets = gt_boxes[matched] if len(gt_boxes) else np.zeros((len(keep), 4), np.float32)
    return candidates[keep], classes, matched, targets


def polygons_to_mask(polygons, height, width):
    """Rasterise one instance's polygons (list of [K, 2] parts, pixel coordinates) to a uint8 [h, w]
    mask, as COCO does (pycocotools frPyObjects + merge + decode)."""
    from pycocotools import mask as mask_util
    parts = [np.asarray(p, np.float64).reshape(-1) for p in polygons if len(p) >= 3]
    if not parts:
        return np.zeros((height, width), np.uint8)
    rles = mask_util.frPyObjects([p.tolist() for p in parts], height, width)
    return mask_util.decode(mask_util.merge(rles))


def mask_target(polygons, box, resolution):
    """The resolution x resolution target of one RoI: its instance's polygons moved into the box
    and scaled to the grid (PaddleDetection's rasterize_polygons_within_box)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    sx = resolution / max(x1 - x0, 0.1)
    sy = resolution / max(y1 - y0, 0.1)
    moved = [(np.asarray(p, np.float64) - [x0, y0]) * [sx, sy] for p in polygons]
    return polygons_to_mask(moved, resolution, resolution)


# ---------------------------------------------------------------------------------------- losses

def box_loss(logits, deltas, rois, classes, target_boxes, num_classes, weights):
    """Cross-entropy over the sampled RoIs + L1 on the foreground's class deltas / sampled RoIs."""
    n = len(classes)
    loss_cls = F.cross_entropy(logits, paddle.to_tensor(classes), reduction="mean")
    fg = np.flatnonzero(classes < num_classes)
    if not len(fg):
        return {"loss_bbox_cls": loss_cls, "loss_bbox_reg": deltas.sum() * 0.0}
    cols = (4 * classes[fg])[:, None] + np.arange(4)                       # [F, 4] columns of 4C
    flat = (fg[:, None] * deltas.shape[1] + cols).reshape(-1)
    pred = paddle.gather(deltas.reshape([-1]), paddle.to_tensor(flat)).reshape([-1, 4])
    target = box_ops.encode(rois[fg], target_boxes[fg], weights)
    loss_reg = paddle.abs(pred - paddle.to_tensor(target)).sum() / float(n)
    return {"loss_bbox_cls": loss_cls, "loss_bbox_reg": loss_reg}


def mask_loss(logits, classes, targets):
    """Sigmoid cross-entropy of each RoI's class channel, mean over pixels and RoIs."""
    pred = select_class(logits, paddle.to_tensor(classes))
    return F.binary_cross_entropy_with_logits(pred, paddle.to_tensor(targets.astype(np.float32)),
                                              reduction="mean")
