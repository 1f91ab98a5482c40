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
  polygons moved into the RoI, scaled to 28x28 and rasterised (pycocotools' rleFrPoly, which
  `rasterize_polygons` computes in tensor operators); loss: sigmoid cross-entropy of the
  ground-truth class's channel, mean over pixels and RoIs.
"""
import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from pycocotools import mask as mask_util

import ops
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
            parts.append(ops.roi_align(feats[k], paddle.gather(rois, idx), per_image, self.resolution,
                                       spatial_scale=scale, sampling_ratio=self.sampling_ratio, aligned=self.aligned))
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
        x = ops.linear(roi_feats.flatten(1), self.fc6, act="relu")
        return ops.linear(x, self.fc7, act="relu")

    def forward(self, roi_feats):
        x = self.features(roi_feats)
        return ops.linear(x, self.cls_score), ops.linear(x, self.bbox_pred)


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
        # fp32 activations whatever ops.Precision.bf16_act says: paddle's ReLU and pixel shuffle have no
        # CPU bf16 kernel
        with ops.precision(bf16_act=False):
            for conv in self.convs:
                x = F.relu(ops.conv2d(x, conv))
            return ops.conv2d(F.relu(ops.conv_transpose(x, self.deconv)), self.logits)


def select_class(logits, classes):
    """logits [N, C, H, W], classes [N] -> logits[i, classes[i]] [N, H, W]."""
    c = logits.shape[1]
    flat = logits.reshape([-1] + list(logits.shape[2:]))          # -1: N may be a dynamic size
    index = paddle.arange(logits.shape[0], dtype="int64") * c + classes.astype("int64").reshape([-1])
    return paddle.gather(flat, index)


# ------------------------------------------------------------------------------------- targets
# Tensor operators on the model's device, nothing read back to the host: the per-image samplers'
# paddle.nonzero (box_ops.subsample) are the only waits for the device.

def sample_rois(proposals, gt_boxes, gt_classes, gt_crowd, num_classes, batch_size_per_image=512,
                fg_fraction=0.25, fg_thresh=0.5, bg_thresh=0.5, use_random=True, crowd_ignore_iou=-1.0):
    """One image's RoIs for the heads: the proposals plus EVERY ground-truth box, crowd regions
    included, matched to the non-crowd ones and sampled (foreground first). Returns (rois [S, 4],
    classes [S] with num_classes = background, matched gt index [S], regression targets' boxes
    [S, 4]); `sample_rois_batch` with one image.

    Crowd boxes join the candidates as in PaddleDetection's generate_proposal_target
    (ppdet/modeling/proposal_generator/target.py@666f597f, line 209: `bbox = paddle.concat([rpn_roi,
    gt_bbox])`, all of gt_bbox); label_box then gives the crowd rows IoU -1 (line 108), so a crowd
    box is a candidate like a proposal (background unless it overlaps a non-crowd object) and never
    a match. (The official COCO recipe never loads crowd annotations at all: COCODataSet's
    load_crowd defaults to False, ppdet/data/source/coco.py lines 62 and 144.)"""
    proposals = box_ops.as_tensor(proposals, "float32").reshape([-1, 4])
    out = sample_rois_batch(proposals, paddle.to_tensor([proposals.shape[0]], "int32"), [gt_boxes], [gt_classes],
                            [gt_crowd], num_classes, batch_size_per_image, fg_fraction, fg_thresh, bg_thresh,
                            use_random, crowd_ignore_iou)
    return out["rois"], out["classes"], out["matched"], out["target_boxes"]


def match_rois(proposals, gt_boxes, gt_crowd, fg_thresh=0.5, bg_thresh=0.5, crowd_ignore_iou=-1.0):
    """(candidates [P + G, 4]: the proposals, then all the ground-truth boxes; their best gt; their
    labels 1/0/-1) of one image, before sampling."""
    proposals = box_ops.as_tensor(proposals, "float32").reshape([-1, 4])
    m = _match_batch(proposals, paddle.zeros([proposals.shape[0]], "int64"), [gt_boxes], [gt_crowd],
                     fg_thresh, bg_thresh, crowd_ignore_iou)
    return m["candidates"], m["matches"], m["labels"]


def _image_of(rois_num, rows):
    """Each of `rows` RoIs' image from the per-image counts [B] (a tensor: no host read)."""
    ends = paddle.cumsum(rois_num.astype("int64"))
    return (paddle.arange(rows, dtype="int64").unsqueeze(1) >= ends.unsqueeze(0)).astype("int64").sum(1)


def _match_batch(rois, roi_image, gt_boxes, gt_crowd, fg_thresh, bg_thresh, crowd_ignore_iou):
    """The candidates of a batch (every image's proposals [M, 4] with their image [M], then every
    image's gt boxes) matched within their image; matches are indices into that image's gt."""
    gts = [box_ops.as_tensor(b, "float32").reshape([-1, 4]) for b in gt_boxes]
    crowd = [box_ops.as_tensor(c, "bool").reshape([-1]) for c in gt_crowd]
    sizes = [g.shape[0] for g in gts]                             # host-known: the ragged tensors' shapes
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    gt_all = paddle.concat(gts) if sum(sizes) else paddle.zeros([0, 4], "float32")
    gt_image = paddle.concat([paddle.full([n], i, "int64") for i, n in enumerate(sizes)])
    candidates = paddle.concat([rois, gt_all])
    image = paddle.concat([roi_image.astype("int64"), gt_image])
    iou = box_ops.box_iou(gt_all, candidates)
    matches, labels = box_ops.match(iou, fg_thresh, bg_thresh, False,
                                    paddle.concat(crowd) if sum(sizes) else None, crowd_ignore_iou,
                                    same=gt_image.unsqueeze(1) == image.unsqueeze(0))
    local = matches - paddle.gather(paddle.to_tensor(starts, "int64"), image) if sum(sizes) else matches
    return {"candidates": candidates, "image": image, "matches": local, "global": matches, "labels": labels,
            "gt_all": gt_all, "sizes": sizes}


def sample_rois_batch(rois, rois_num, gt_boxes, gt_classes, gt_crowd, num_classes, batch_size_per_image=512,
                      fg_fraction=0.25, fg_thresh=0.5, bg_thresh=0.5, use_random=True, crowd_ignore_iou=-1.0):
    """Every image's sampled RoIs at once: rois [M, 4] of every image in order with rois_num [B]
    (a tensor: the proposals are never split on the host), per image gt boxes, classes and crowd
    flags. Matched in one IoU [G, M + G] of the whole batch (pairs of different images excluded),
    sampled image by image (the draws in PaddleDetection's order). Returns a dict: rois [S, 4],
    classes [S], matched [S] (index into the image's gt), target_boxes [S, 4], image [S], and the
    host-known counts num_rois, num_fg per image (each image's foreground rows come first)."""
    m = _match_batch(rois, _image_of(rois_num, rois.shape[0]), gt_boxes, gt_crowd, fg_thresh, bg_thresh,
                     crowd_ignore_iou)
    keep, num_rois, num_fg = [], [], []
    for i in range(len(gt_boxes)):
        labels = paddle.where(m["image"] == i, m["labels"], paddle.full_like(m["labels"], -1))
        fg, bg = box_ops.subsample(labels, batch_size_per_image, fg_fraction, use_random)
        keep += [fg, bg]
        num_fg.append(fg.shape[0])
        num_rois.append(fg.shape[0] + bg.shape[0])
    keep = paddle.concat(keep)
    if not keep.shape[0]:
        return {"rois": paddle.zeros([0, 4], "float32"), "classes": paddle.zeros([0], "int64"),
                "matched": keep, "target_boxes": paddle.zeros([0, 4], "float32"), "image": keep,
                "num_rois": num_rois, "num_fg": num_fg}
    fg_row = paddle.concat([paddle.arange(n, dtype="int64") < f for n, f in zip(num_rois, num_fg)])
    matched = paddle.gather(m["global"], keep)
    if sum(m["sizes"]):
        classes = paddle.gather(paddle.concat([box_ops.as_tensor(c, "int64").reshape([-1]) for c in gt_classes]),
                                matched)
        target_boxes = paddle.gather(m["gt_all"], matched)
    else:
        classes, target_boxes = paddle.zeros_like(keep), paddle.zeros([keep.shape[0], 4], "float32")
    return {"rois": paddle.gather(m["candidates"], keep),
            "classes": paddle.where(fg_row, classes, paddle.full_like(classes, num_classes)),
            "matched": paddle.gather(m["matches"], keep), "target_boxes": target_boxes,
            "image": paddle.gather(m["image"], keep), "num_rois": num_rois, "num_fg": num_fg}


def polygons_to_mask(polygons, height, width):
    """Rasterise one instance's polygons (list of [K, 2] parts, pixel coordinates) to a uint8 [h, w]
    mask, as COCO does (pycocotools frPyObjects + merge + decode): the host reference of
    `rasterize_polygons`, for readers and tests."""
    parts = [np.asarray(p, np.float64).reshape(-1) for p in polygons if len(p) >= 3]
    if not parts:
        return np.zeros((height, width), np.uint8)
    rles = mask_util.frPyObjects([p.tolist() for p in parts], height, width)
    return mask_util.decode(mask_util.merge(rles))


def rasterize_polygons(xy, counts, height, width):
    """Masks [F, height, width] (uint8) of F polygon sets, equal to pycocotools' frPyObjects + merge +
    decode (maskApi.c rleFrPoly, which PaddleDetection's targets use): ops.rasterize_polygons (its
    reference, in tensor operators, says how). xy float64 [F, V, 2]: each set's parts, vertices
    concatenated part after part (padding after); counts [F, K]: vertices of each part (0: no part;
    parts of fewer than 3 vertices are skipped, as polygons_to_mask does)."""
    return ops.rasterize_polygons(xy, counts, height, width)


def polygons_in_boxes(points, counts, boxes, resolution):
    """The resolution x resolution targets [F, R, R] uint8 of F RoIs `boxes` [F, 4]: each its
    instance's polygons (points [F, V, 2] float32, part vertex counts [F, K]) moved into the box and
    scaled to the grid (PaddleDetection's rasterize_polygons_within_box). The box size and scale are
    float32 numbers (the RoI is a float32 tensor), the moved polygons float64, as pycocotools gets
    them there: a point landing on a pixel boundary rasterises the same way."""
    boxes = boxes.astype("float32")
    x0, y0 = boxes[:, 0:1], boxes[:, 1:2]
    sx = float(resolution) / paddle.maximum(boxes[:, 2:3] - x0, paddle.full_like(x0, 0.1))
    sy = float(resolution) / paddle.maximum(boxes[:, 3:4] - y0, paddle.full_like(y0, 0.1))
    origin = paddle.concat([x0, y0], 1).astype("float64").unsqueeze(1)
    scale = paddle.concat([sx, sy], 1).astype("float64").unsqueeze(1)
    return rasterize_polygons((points.astype("float64") - origin) * scale, counts, resolution, resolution)


def mask_target(polygons, box, resolution):
    """One RoI's target (numpy [R, R]) from a list of [K, 2] parts: `polygons_in_boxes` for one box."""
    parts = [np.asarray(p, np.float32).reshape(-1, 2) for p in polygons if len(p) >= 3]
    points = np.concatenate(parts)[None] if parts else np.zeros((1, 1, 2), np.float32)
    counts = np.array([[len(p) for p in parts] or [0]], np.int32)
    t = polygons_in_boxes(paddle.to_tensor(points), paddle.to_tensor(counts),
                          paddle.to_tensor(np.asarray(box, np.float32).reshape(1, 4)), resolution)
    return t[0].numpy()


def mask_targets(rois, classes, matched, points, counts, num_classes, resolution, num_fg=None):
    """The mask head's inputs over a batch (lists per image: the sampled RoIs, their classes and
    matched gt indices, the image's packed polygons `points` [N, V, 2] and `counts` [N, P], see
    readers/coco.py pack_polygons): (foreground RoIs per image, their classes [F], targets [F, R, R] uint8,
    images without foreground). Such an image still counts one RoI in the official loss's mean
    (generate_mask_target adds a fake RoI of weight 0). `num_fg`: per image the number of foreground
    rows, which the sampler puts first (known on the host: no search for them)."""
    fg_rois, fg_classes, fg_targets, empty = [], [], [], 0
    for i in range(len(rois)):
        r, c, g = (box_ops.as_tensor(rois[i], "float32").reshape([-1, 4]),
                   box_ops.as_tensor(classes[i], "int64").reshape([-1]),
                   box_ops.as_tensor(matched[i], "int64").reshape([-1]))
        if num_fg is None:
            fg = paddle.nonzero((c >= 0) & (c < num_classes)).reshape([-1])
        else:
            fg = paddle.arange(num_fg[i], dtype="int64")
        empty += not fg.shape[0]
        if not fg.shape[0]:
            fg_rois.append(paddle.zeros([0, 4], "float32"))
            continue
        fg_rois.append(paddle.gather(r, fg))
        fg_classes.append(paddle.gather(c, fg))
        inst = paddle.gather(g, fg)
        fg_targets.append(polygons_in_boxes(paddle.gather(box_ops.as_tensor(points[i]), inst),
                                            paddle.gather(box_ops.as_tensor(counts[i]), inst), fg_rois[-1],
                                            resolution))
    if not fg_targets:
        return fg_rois, paddle.zeros([0], "int64"), paddle.zeros([0, resolution, resolution], "uint8"), empty
    return fg_rois, paddle.concat(fg_classes), paddle.concat(fg_targets), empty


# ---------------------------------------------------------------------------------------- losses

def box_loss(logits, deltas, rois, classes, target_boxes, num_classes, weights):
    """Cross-entropy over the sampled RoIs + L1 on the foreground's class deltas / sampled RoIs.
    The foreground is a mask, not a search: background rows get a zero difference."""
    classes = box_ops.as_tensor(classes, "int64").reshape([-1])
    rois, target_boxes = box_ops.as_tensor(rois, "float32"), box_ops.as_tensor(target_boxes, "float32")
    n = classes.shape[0]
    loss_cls = F.cross_entropy(logits, classes, reduction="mean")
    fg = (classes < num_classes).unsqueeze(1)
    cols = 4 * classes.clip(max=num_classes - 1).unsqueeze(1) + paddle.arange(4, dtype="int64")    # [N, 4] of 4C
    pred = paddle.take_along_axis(deltas, cols, 1)
    unit = paddle.to_tensor([[0.0, 0.0, 1.0, 1.0]], "float32")     # background rows: a finite 0 target
    target = box_ops.encode(paddle.where(fg, rois, unit), paddle.where(fg, target_boxes, unit), weights)
    loss_reg = (paddle.abs(pred - target) * fg.astype(pred.dtype)).sum() / float(n)
    return {"loss_bbox_cls": loss_cls, "loss_bbox_reg": loss_reg}


def mask_loss(logits, classes, targets, extra_rois=0):
    """Sigmoid cross-entropy of each RoI's class channel, mean over pixels and RoIs; `extra_rois`
    zero-weight RoIs join the count (PaddleDetection's fake RoI of an image without foreground)."""
    pred = select_class(logits, box_ops.as_tensor(classes, "int64"))
    targets = box_ops.as_tensor(targets).astype(pred.dtype)
    loss = F.binary_cross_entropy_with_logits(pred, targets, reduction="sum")
    return loss / float((classes.shape[0] + extra_rois) * targets.shape[1] * targets.shape[2])
