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
from pycocotools import mask as mask_util

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
        # each RoI's image: the image ends it has passed (repeat_interleave with tensor repeats does not
        # convert to ONNX: paddle2onnx 2.1.0 emits a Tile of the wrong rank)
        ends = paddle.cumsum(rois_num.astype("int64"))
        row = paddle.arange(paddle.shape(rois)[0], dtype="int64")
        image_of = (row.unsqueeze(1) >= ends.unsqueeze(0)).astype("int32").sum(1).astype("int32")
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
    """One image's RoIs for the heads (numpy): the proposals plus EVERY ground-truth box, crowd
    regions included, matched to the non-crowd ones and sampled (foreground first). Returns (rois
    [S, 4], classes [S] with num_classes = background, matched gt index [S], regression targets'
    boxes [S, 4]).

    Crowd boxes join the candidates as in PaddleDetection's generate_proposal_target
    (ppdet/modeling/proposal_generator/target.py@666f597f, line 209: `bbox = paddle.concat([rpn_roi,
    gt_bbox])`, all of gt_bbox); label_box then gives the crowd rows IoU -1 (line 108), so a crowd
    box is a candidate like a proposal (background unless it overlaps a non-crowd object) and never
    a match. (The official COCO recipe never loads crowd annotations at all: COCODataSet's
    load_crowd defaults to False, ppdet/data/source/coco.py lines 62 and 144.)"""
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)
    candidates, matches, labels = match_rois(proposals, gt_boxes, gt_crowd, fg_thresh, bg_thresh, crowd_ignore_iou)
    fg, bg = box_ops.subsample(np.flatnonzero(labels == 1), np.flatnonzero(labels == 0),
                               batch_size_per_image, fg_fraction, use_random)
    keep = np.concatenate([fg, bg])
    classes = np.full(len(keep), num_classes, np.int64)
    if len(fg):
        classes[:len(fg)] = np.asarray(gt_classes, np.int64).reshape(-1)[matches[fg]]
    matched = matches[keep]
    targets = gt_boxes[matched] if len(gt_boxes) else np.zeros((len(keep), 4), np.float32)
    return candidates[keep], classes, matched, targets


def match_rois(proposals, gt_boxes, gt_crowd, fg_thresh=0.5, bg_thresh=0.5, crowd_ignore_iou=-1.0):
    """(candidates [P + G, 4]: the proposals, then all the ground-truth boxes; their best gt; their
    labels 1/0/-1) of one image, before sampling."""
    gt_boxes = np.asarray(gt_boxes, np.float32).reshape(-1, 4)
    candidates = np.concatenate([np.asarray(proposals, np.float32).reshape(-1, 4), gt_boxes])
    iou = box_ops.box_iou(gt_boxes, candidates)
    matches, labels = box_ops.match(iou, fg_thresh, bg_thresh, False, np.asarray(gt_crowd, bool).reshape(-1),
                                    crowd_ignore_iou)
    return candidates, matches, labels


def polygons_to_mask(polygons, height, width):
    """Rasterise one instance's polygons (list of [K, 2] parts, pixel coordinates) to a uint8 [h, w]
    mask, as COCO does (pycocotools frPyObjects + merge + decode)."""
    parts = [np.asarray(p, np.float64).reshape(-1) for p in polygons if len(p) >= 3]
    if not parts:
        return np.zeros((height, width), np.uint8)
    rles = mask_util.frPyObjects([p.tolist() for p in parts], height, width)
    return mask_util.decode(mask_util.merge(rles))


def mask_target(polygons, box, resolution):
    """The resolution x resolution target of one RoI: its instance's polygons moved into the box
    and scaled to the grid (PaddleDetection's rasterize_polygons_within_box). Its box size and scale
    are float32 numbers (the RoI comes from a float32 tensor), the polygons float64: the same here,
    so that a point landing on a pixel boundary rasterises the same way."""
    x0, y0, x1, y1 = (np.float32(v) for v in box)
    sx = np.float32(resolution) / max(x1 - x0, np.float32(0.1))
    sy = np.float32(resolution) / max(y1 - y0, np.float32(0.1))
    moved = [(np.asarray(p, np.float64) - [float(x0), float(y0)]) * [float(sx), float(sy)] for p in polygons]
    return polygons_to_mask(moved, resolution, resolution)


def mask_targets(rois, classes, matched, polygons, num_classes, resolution):
    """The mask head's inputs over a batch (lists per image of the sampled RoIs, their classes
    and matched gt indices; polygons per image, per instance): (foreground RoIs per image, their
    classes [F], targets [F, R, R] uint8, images without foreground). Such an image still counts
    one RoI in the official loss's mean (generate_mask_target adds a fake RoI of weight 0)."""
    fg_rois, fg_classes, fg_targets, empty = [], [], [], 0
    for i in range(len(rois)):
        fg = np.flatnonzero((classes[i] >= 0) & (classes[i] < num_classes))
        empty += not len(fg)
        fg_rois.append(rois[i][fg])
        fg_classes.append(classes[i][fg])
        fg_targets += [mask_target(polygons[i][g], box, resolution) for g, box in zip(matched[i][fg], rois[i][fg])]
    targets = np.stack(fg_targets) if fg_targets else np.zeros((0, resolution, resolution), np.uint8)
    return fg_rois, np.concatenate(fg_classes), targets, empty


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


def mask_loss(logits, classes, targets, extra_rois=0):
    """Sigmoid cross-entropy of each RoI's class channel, mean over pixels and RoIs; `extra_rois`
    zero-weight RoIs join the count (PaddleDetection's fake RoI of an image without foreground)."""
    pred = select_class(logits, paddle.to_tensor(classes))
    loss = F.binary_cross_entropy_with_logits(pred, paddle.to_tensor(targets.astype(np.float32)), reduction="sum")
    return loss / float((len(classes) + extra_rois) * targets.shape[1] * targets.shape[2])
