"""Region proposal network: anchors, the shared head, anchor targets and losses, proposals.

Facts from PaddleDetection 2.x (ppdet/modeling/proposal_generator/{anchor_generator,rpn_head,
proposal_generator,target}.py and configs/mask_rcnn/_base_/mask_rcnn_r50_fpn.yml):
- anchors: size 32 * 2^(l-2) at level Pl, aspect ratios h/w in [0.5, 1, 2]: w = sqrt(size^2 / r),
  h = r w, centred at (x * stride, y * stride) (offset 0); order: position-major (y, x), then ratio;
- one head shared by the levels: 3x3 conv + ReLU, 1x1 objectness (A channels) and deltas (4A,
  channel = anchor * 4 + (dx, dy, dw, dh)), weights N(0, 0.01), biases 0;
- targets: 256 anchors per image, at most half positive, IoU >= 0.7 positive (plus each ground
  truth's best anchors), < 0.3 negative; losses: sigmoid cross-entropy summed over the sampled
  anchors and L1 on the positives' deltas (weights 1), both divided by 256 x images;
- proposals: per level and image, paddle's generate_proposals (top `pre_nms_top_n` scores, decode,
  clip to the image, NMS 0.7); in training each level keeps its pre_nms_top_n survivors
  (topk_after_collect), at test post_nms_top_n; then the image keeps its post_nms_top_n best over
  all levels (train 2000 -> 1000, test 1000 -> 1000).
"""
import math

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

import ops
from models.vision.mask_rcnn import box_ops


def best_per_image(boxes, probs, nums, top_n):
    """Each image's proposals over the levels: all of them in level order when they are at most
    `top_n`, else the best `top_n` by probability, best first.

    boxes [N, 4], probs [N]: the levels concatenated, each level's rows image by image; nums: per
    level the rows per image [B]. Returns (boxes [M, 4] image by image, rows per image [B] int32).
    One stable sort by (image, key), key = -probability for an image over `top_n`, else the row's
    position, then each image's first `top_n` rows.
    """
    images = paddle.arange(nums[0].shape[0], dtype="int32")
    image_of = paddle.concat([paddle.repeat_interleave(images, n) for n in nums])
    counts = paddle.add_n(nums) if len(nums) > 1 else nums[0]
    position = paddle.arange(image_of.shape[0], dtype="float32")
    key = paddle.where(paddle.gather(counts > top_n, image_of), -probs, position)
    order = paddle.argsort(key, stable=True)
    order = paddle.gather(order, paddle.argsort(paddle.gather(image_of, order), stable=True))
    start = paddle.cumsum(counts).astype("int32") - counts
    rank = paddle.arange(order.shape[0], dtype="int32") - paddle.gather(start, paddle.gather(image_of, order))
    keep = paddle.gather(order, paddle.nonzero(rank < top_n).reshape([-1]))
    return paddle.gather(boxes, keep), paddle.minimum(counts, paddle.full_like(counts, top_n))


def cell_anchors(size, aspect_ratios):
    """[A, 4] anchors of one size centred on (0, 0), one per aspect ratio (h / w)."""
    out = []
    for r in aspect_ratios:
        w = math.sqrt(size * size / r)
        h = r * w
        out.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return np.array(out, np.float32)


def grid_anchors(height, width, stride, cell):
    """[height * width * A, 4] anchors of a feature map (position-major, then aspect ratio)."""
    ys, xs = np.meshgrid(np.arange(height, dtype=np.float32) * stride,
                         np.arange(width, dtype=np.float32) * stride, indexing="ij")
    shifts = np.stack([xs.ravel(), ys.ravel(), xs.ravel(), ys.ravel()], 1)
    return (shifts[:, None, :] + cell[None, :, :]).reshape(-1, 4)


class AnchorGenerator:
    """Anchors per FPN level, cached by feature-map size (no parameters, nothing in the state dict)."""

    def __init__(self, sizes=(32, 64, 128, 256, 512), aspect_ratios=(0.5, 1.0, 2.0),
                 strides=(4, 8, 16, 32, 64)):
        self.sizes, self.strides, self.aspect_ratios = list(sizes), list(strides), list(aspect_ratios)
        self.cells = [cell_anchors(s, aspect_ratios) for s in sizes]
        self.num_anchors = len(aspect_ratios)
        self._cache = {}

    def __call__(self, shapes):
        """numpy [H*W*A, 4] per level for feature maps of `shapes` [(H, W), ...]."""
        out = []
        for level, (h, w) in enumerate(shapes):
            key = (level, int(h), int(w))
            if key not in self._cache:
                self._cache[key] = grid_anchors(int(h), int(w), self.strides[level], self.cells[level])
            out.append(self._cache[key])
        return out

    def tensor(self, level, height, width):
        """The same anchors [H*W*A, 4] of one level as a tensor computed from the feature size,
        which may be a dynamic size of an exported program (float32 arithmetic as grid_anchors)."""
        stride = self.strides[level]
        ys = paddle.arange(height, dtype="float32") * stride
        xs = paddle.arange(width, dtype="float32") * stride
        yy, xx = paddle.meshgrid(ys, xs)
        xx, yy = xx.reshape([-1]), yy.reshape([-1])
        shifts = paddle.stack([xx, yy, xx, yy], axis=1)
        return (shifts.unsqueeze(1) + paddle.to_tensor(self.cells[level]).unsqueeze(0)).reshape([-1, 4])

    def concatenated(self, shapes):
        """All levels' anchors [sum(H W A), 4] as one tensor on the current device, cached by the
        feature-map sizes (the training targets' anchors: built there, never copied from the host)."""
        key = ("all",) + tuple((int(h), int(w)) for h, w in shapes)
        if key not in self._cache:
            self._cache[key] = paddle.concat([self.tensor(lv, h, w) for lv, (h, w) in enumerate(key[1:])])
        return self._cache[key]


@paddle.no_grad()
def generate(anchors, scores, deltas, image_size, pre, per_level, post, nms_thresh, min_size):
    """generate_proposals per level over the whole batch (each level keeps `per_level`), then each
    image's best `post` over the levels. Runs eagerly on the head's outputs, also behind an exported
    program: paddle2onnx has no converter for generate_proposals."""
    size = (image_size if isinstance(image_size, paddle.Tensor) else paddle.to_tensor(image_size)).astype("float32")
    boxes, probs, nums = [], [], []
    for level, (s, d) in enumerate(zip(scores, deltas)):
        a = anchors.tensor(level, s.shape[2], s.shape[3])
        rois, prob, num = paddle.vision.ops.generate_proposals(
            s.detach(), d.detach(), size, a, paddle.ones_like(a), pre_nms_top_n=pre, post_nms_top_n=per_level,
            nms_thresh=nms_thresh, min_size=min_size, eta=1.0, pixel_offset=False, return_rois_num=True)
        boxes.append(rois)
        probs.append(prob.reshape([-1]))
        nums.append(num.astype("int32"))
    return best_per_image(paddle.concat(boxes), paddle.concat(probs), nums, post)


def test_proposals(settings, scores, deltas, image_size):
    """`generate` with the test settings of RPN.test_settings (the exported pipeline's path)."""
    s = settings
    anchors = AnchorGenerator(s["anchor_sizes"], s["aspect_ratios"], s["strides"])
    return generate(anchors, scores, deltas, image_size, s["pre_nms_top_n"], s["post_nms_top_n"],
                    s["post_nms_top_n"], s["nms_thresh"], s["min_size"])


class RPNHead(nn.Layer):
    """The convolutions shared by every level: objectness logits [B, A, H, W], deltas [B, 4A, H, W]."""

    def __init__(self, channels, num_anchors):
        super().__init__()
        normal = lambda: paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, 0.01))  # noqa: E731
        self.conv = nn.Conv2D(channels, channels, 3, padding=1, weight_attr=normal())
        self.objectness = nn.Conv2D(channels, num_anchors, 1, weight_attr=normal())
        self.deltas = nn.Conv2D(channels, 4 * num_anchors, 1, weight_attr=normal())

    def forward(self, feats):
        scores, deltas = [], []
        with ops.precision(bf16_act=False):   # fp32 activations: paddle's ReLU and losses have no CPU bf16 kernel
            for f in feats:
                x = F.relu(ops.conv2d(f, self.conv))
                scores.append(ops.conv2d(x, self.objectness))
                deltas.append(ops.conv2d(x, self.deltas))
        return scores, deltas


class RPN(nn.Layer):
    """Head + anchors + targets + proposals. `forward(feats, image_size, targets)` returns
    (proposals [N, 4] of every image in order, proposals per image [B] int32, losses: dict, empty
    in eval)."""

    def __init__(self, channels=256, anchor_sizes=(32, 64, 128, 256, 512), aspect_ratios=(0.5, 1.0, 2.0),
                 strides=(4, 8, 16, 32, 64), batch_size_per_image=256, fg_fraction=0.5,
                 positive_overlap=0.7, negative_overlap=0.3, use_random=True,
                 train_pre_nms_top_n=2000, train_post_nms_top_n=1000, test_pre_nms_top_n=1000,
                 test_post_nms_top_n=1000, nms_thresh=0.7, min_size=0.0, crowd_ignore_iou=-1.0):
        super().__init__()
        self.anchors = AnchorGenerator(anchor_sizes, aspect_ratios, strides)
        self.head = RPNHead(channels, self.anchors.num_anchors)
        self.batch_size_per_image, self.fg_fraction = batch_size_per_image, fg_fraction
        self.positive_overlap, self.negative_overlap = positive_overlap, negative_overlap
        self.use_random, self.crowd_ignore_iou = use_random, crowd_ignore_iou
        self.train_top_n = (train_pre_nms_top_n, train_post_nms_top_n)
        self.test_top_n = (test_pre_nms_top_n, test_post_nms_top_n)
        self.nms_thresh, self.min_size = nms_thresh, min_size

    def forward(self, feats, image_size, targets=None):
        scores, deltas = self.head(feats)
        rois, rois_num = self.proposals(scores, deltas, image_size)
        if not self.training:
            return rois, rois_num, {}
        anchors = self.anchors.concatenated([f.shape[-2:] for f in feats])
        return rois, rois_num, self.loss(scores, deltas, anchors, targets)

    def proposals(self, scores, deltas, image_size):
        pre, post = self.train_top_n if self.training else self.test_top_n
        per_level = pre if self.training else post   # PaddleDetection's topk_after_collect (train)
        return generate(self.anchors, scores, deltas, image_size, pre, per_level, post, self.nms_thresh,
                        self.min_size)

    def test_settings(self):
        """What `proposals` needs at test time, as plain data: the exported pipeline's settings."""
        return {"anchor_sizes": self.anchors.sizes, "aspect_ratios": self.anchors.aspect_ratios,
                "strides": self.anchors.strides, "pre_nms_top_n": self.test_top_n[0],
                "post_nms_top_n": self.test_top_n[1], "nms_thresh": self.nms_thresh, "min_size": self.min_size}

    def match(self, anchors, gt_boxes, gt_crowd):
        """(best gt [N], labels [N] int32 in {1, 0, -1}) of one image's anchors, before sampling."""
        iou = box_ops.box_iou(gt_boxes, anchors)
        return box_ops.match(iou, self.positive_overlap, self.negative_overlap, True, gt_crowd,
                             self.crowd_ignore_iou)

    def sample(self, anchors, gt_boxes, gt_crowd):
        """(sampled positive anchors [F], negative ones [S - F], their regression targets [F, 4]) of
        one image; int64 indices into `anchors`."""
        anchors, gt_boxes = box_ops.as_tensor(anchors, "float32"), box_ops.as_tensor(gt_boxes, "float32")
        matches, match_labels = self.match(anchors, gt_boxes, gt_crowd)
        fg, bg = box_ops.subsample(match_labels, self.batch_size_per_image, self.fg_fraction, self.use_random)
        if not fg.shape[0]:
            return fg, bg, paddle.zeros([0, 4], "float32")
        target = paddle.gather(gt_boxes, paddle.gather(matches, fg))
        return fg, bg, box_ops.encode(paddle.gather(anchors, fg), target)

    def targets(self, anchors, gt_boxes, gt_crowd):
        """(labels [N] int32 in {1, 0, -1}, regression targets [N, 4], 0 off the positives) of one
        image's anchors."""
        fg, bg, deltas = self.sample(anchors, gt_boxes, gt_crowd)
        n = anchors.shape[0]
        labels = paddle.full([n], -1, "int32")
        if bg.shape[0]:
            labels = paddle.scatter(labels, bg, paddle.zeros([bg.shape[0]], "int32"))
        out = paddle.zeros([n, 4], "float32")
        if fg.shape[0]:
            labels = paddle.scatter(labels, fg, paddle.ones([fg.shape[0]], "int32"))
            out = paddle.scatter(out, fg, deltas)
        return labels, out

    def loss(self, scores, deltas, anchors, targets):
        """Sigmoid cross-entropy on the sampled anchors, L1 on the positives' deltas, both summed over
        the batch and divided by batch_size_per_image x images; only the sampled rows are gathered."""
        n = anchors.shape[0]
        # [B * sum(H W A)] logits and [B * sum(H W A), 4] deltas, image by image in the anchors' order
        logits = paddle.concat([s.transpose([0, 2, 3, 1]).reshape([s.shape[0], -1]) for s in scores], axis=1)
        pred = paddle.concat([d.transpose([0, 2, 3, 1]).reshape([d.shape[0], -1, 4]) for d in deltas], axis=1)
        flat_logits, flat_pred = logits.reshape([-1]), pred.reshape([-1, 4])
        rows, labels, pos, regs = [], [], [], []
        for i, (boxes, crowd) in enumerate(zip(targets["boxes"], targets["crowd"])):
            fg, bg, reg = self.sample(anchors, boxes, crowd)
            rows += [fg + i * n, bg + i * n]
            labels += [paddle.ones([fg.shape[0]], "float32"), paddle.zeros([bg.shape[0]], "float32")]
            pos.append(fg + i * n)
            regs.append(reg)
        norm = float(self.batch_size_per_image * len(targets["boxes"]))
        rows, pos = paddle.concat(rows), paddle.concat(pos)
        if rows.shape[0]:
            loss_cls = F.binary_cross_entropy_with_logits(paddle.gather(flat_logits, rows), paddle.concat(labels),
                                                          reduction="sum") / norm
        else:
            loss_cls = flat_logits.sum() * 0.0
        if pos.shape[0]:
            loss_reg = paddle.abs(paddle.gather(flat_pred, pos) - paddle.concat(regs)).sum() / norm
        else:
            loss_reg = flat_pred.sum() * 0.0
        return {"loss_rpn_cls": loss_cls, "loss_rpn_reg": loss_reg}
