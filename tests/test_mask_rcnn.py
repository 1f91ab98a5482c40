"""Mask R-CNN parts by hand arithmetic, the official model's outputs on golden weights, sizes, key maps."""
import json
import math
import os
import sys

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from engine import config
from engine.builder import count_params
from engine.components import load_all
from engine.errors import ConfigError
from engine.weights.pretrained import WEIGHTS, detect_layout, load_entry_state, map_keys, model_layouts
from models.vision.mask_rcnn import box_ops, postprocess, roi_heads
from models.vision.mask_rcnn.model import MaskRCNN
from models.vision.mask_rcnn.rpn import RPN, cell_anchors, grid_anchors
from ops import functional, library
from readers.coco import pack_polygons
from tests.helpers import BF16_OPS, golden_close as close, golden_stats_close as stats_close, ROOT, counting_fused_ops

load_all()
DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402

TABLE = "keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json"


def table(name=TABLE):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------- anchors
def test_anchors_by_hand():
    cell = cell_anchors(32, [0.5, 1.0, 2.0])
    w = math.sqrt(32 * 32 / 0.5)                              # 45.2548..., h = 0.5 w
    np.testing.assert_allclose(cell, [[-w / 2, -w / 4, w / 2, w / 4], [-16, -16, 16, 16],
                                      [-w / 4, -w / 2, w / 4, w / 2]], rtol=1e-6)
    a = grid_anchors(2, 3, 4, cell)                           # 2 rows x 3 columns, stride 4
    assert a.shape == (2 * 3 * 3, 4)
    np.testing.assert_allclose(a[3 + 1], [4 - 16, 0 - 16, 4 + 16, 0 + 16])     # (y 0, x 1), ratio 1
    np.testing.assert_allclose(a[3 * 3 + 1], [0 - 16, 4 - 16, 0 + 16, 4 + 16])  # (y 1, x 0), ratio 1
    rpn = RPN(8)
    levels = rpn.anchors([(2, 2), (1, 1), (1, 1), (1, 1), (1, 1)])
    assert [lv.shape[0] for lv in levels] == [12, 3, 3, 3, 3]
    np.testing.assert_allclose(levels[4][1], [-256, -256, 256, 256])          # P6: size 512


# ------------------------------------------------------------------------------------ box coding
def test_encode_by_hand_and_round_trip():
    d = box_ops.encode([[0, 0, 10, 10]], [[5, 5, 15, 25]], (10, 10, 5, 5))
    # centres (5, 5) -> (10, 15), sizes 10x10 -> 10x20
    np.testing.assert_allclose(d, [[10 * 5 / 10, 10 * 10 / 10, 0.0, 5 * math.log(2)]], rtol=1e-6)
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.uniform(0, 50, (20, 2)), rng.uniform(60, 120, (20, 2))], 1)
    tgt = np.concatenate([rng.uniform(0, 50, (20, 2)), rng.uniform(60, 120, (20, 2))], 1)
    for weights in ((1, 1, 1, 1), (10, 10, 5, 5)):
        deltas = box_ops.encode(src, tgt, weights)
        back = box_ops.decode(deltas, paddle.to_tensor(src.astype("float32")), weights)   # encode gives a tensor
        np.testing.assert_allclose(back.numpy()[:, 0], tgt, atol=1e-3)
    # class-specific: 2 classes per row decode against the same box
    two = box_ops.decode(paddle.to_tensor(np.concatenate([d, np.zeros((1, 4), "float32")], 1)),
                         paddle.to_tensor(np.array([[0, 0, 10, 10]], "float32")), (10, 10, 5, 5)).numpy()
    np.testing.assert_allclose(two[0], [[5, 5, 15, 25], [0, 0, 10, 10]], atol=1e-4)
    huge = box_ops.decode(paddle.to_tensor(np.array([[0, 0, 100, 100]], "float32")),
                          paddle.to_tensor(np.array([[0, 0, 10, 10]], "float32"))).numpy()
    np.testing.assert_allclose(huge[0, 0, 2] - huge[0, 0, 0], 10 * 1000 / 16, rtol=1e-5)  # dw clipped


def test_iou_by_hand():
    iou = box_ops.box_iou([[0, 0, 10, 10]], [[5, 0, 15, 10], [0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 0, 0]])
    np.testing.assert_allclose(iou, [[50 / 150, 1.0, 0.0, 0.0]])


# -------------------------------------------------------------------------------------- matcher
def test_matcher_without_ground_truth_is_all_negative():
    matches, labels = box_ops.match(np.zeros((0, 5)), 0.7, 0.3, True)
    assert labels.tolist() == [0] * 5 and matches.tolist() == [0] * 5


def test_matcher_thresholds_ties_and_low_quality():
    iou = np.array([[0.70, 0.30, 0.29, 0.50, 0.40, 0.00],
                    [0.10, 0.30, 0.00, 0.50, 0.60, 0.00]])
    matches, labels = box_ops.match(iou, 0.7, 0.3, False)
    # 0.70 positive (>=), 0.30 ignored (negatives need < 0.3), 0.29 negative, tie 0.5/0.5 -> gt 0
    assert labels.tolist() == [1, -1, 0, -1, -1, 0]
    assert matches.tolist()[:5] == [0, 0, 0, 0, 1]
    _, labels = box_ops.match(iou, 0.7, 0.3, True)
    # gt 1's best anchor (0.60) becomes positive; gt 0's best is already
    assert labels.tolist() == [1, -1, 0, -1, 1, 0]
    tie = np.array([[0.5, 0.5, 0.1]])
    assert box_ops.match(tie, 0.7, 0.3, True)[1].tolist() == [1, 1, 0]   # every best of a gt, ties too
    assert box_ops.match(np.zeros((1, 2)), 0.7, 0.3, True)[1].tolist() == [0, 0]  # IoU 0 is no best match


def test_matcher_keeps_crowd_regions_out():
    iou = np.array([[0.9, 0.1, 0.0],      # a crowd region
                    [0.2, 0.8, 0.0]])
    matches, labels = box_ops.match(iou, 0.7, 0.3, False, crowd=[1, 0])
    assert labels.tolist() == [0, 1, 0] and matches.tolist() == [1, 1, 1]
    _, labels = box_ops.match(iou, 0.7, 0.3, False, crowd=[1, 0], crowd_ignore_iou=0.5)
    assert labels.tolist() == [-1, 1, 0]          # near the crowd: neither positive nor negative
    _, labels = box_ops.match(iou[:1], 0.7, 0.3, True, crowd=[1])
    assert labels.tolist() == [0, 0, 0]           # only crowd ground truth: all negative


def test_subsample_caps_positives():
    labels = np.concatenate([np.ones(10), np.zeros(290), -np.ones(5)]).astype("int32")   # 1 fg, 0 bg, -1 ignored
    fg, bg = box_ops.subsample(labels, 256, 0.5, use_random=False)
    assert fg.numpy().tolist() == list(range(10)) and bg.numpy().tolist() == list(range(10, 256))
    paddle.seed(3)
    fg, bg = box_ops.subsample(np.repeat(np.array([1, 0], "int32"), 200), 256, 0.5)
    fg, bg = fg.numpy().tolist(), bg.numpy().tolist()
    assert len(set(fg)) == 128 and set(fg) <= set(range(200)) and len(set(bg)) == 128 and set(bg) <= set(range(200, 400))


# ---------------------------------------------------------------------------------- FPN levels
def test_fpn_level_assignment():
    sides = [224, 112, 111.9, 448, 447.9, 1000, 10, 56, 0]
    boxes = paddle.to_tensor(np.array([[0, 0, s, s] for s in sides], "float32"))
    assert box_ops.fpn_levels(boxes).numpy().tolist() == [4, 3, 2, 5, 4, 5, 2, 2, 2]
    wide = paddle.to_tensor(np.array([[0, 0, 448, 112]], "float32"))   # sqrt(448 * 112) = 224
    assert box_ops.fpn_levels(wide).numpy().tolist() == [4]


def test_multiscale_roi_align_routes_each_roi_to_its_level():
    """Each level holds a constant equal to its number: the pooled value names the level used."""
    feats = [paddle.full([2, 1, 64 // 2 ** k, 64 // 2 ** k], float(k + 2)) for k in range(4)]
    pool = roi_heads.MultiScaleRoIAlign(2)
    rois = [paddle.to_tensor(np.array([[0, 0, 224, 224], [0, 0, 20, 20]], "float32")),
            paddle.to_tensor(np.array([[0, 0, 120, 120]], "float32"))]
    out = pool(feats, rois).numpy()
    assert out.shape == (3, 1, 2, 2)
    assert out[:, 0, 0, 0].tolist() == [4.0, 2.0, 3.0]
    empty = pool(feats, [paddle.zeros([0, 4]), paddle.zeros([0, 4])])
    assert empty.shape == [0, 1, 2, 2]


# --------------------------------------------------------------------------------- mask pasting
def test_paste_masks_by_hand():
    ones = np.ones((1, 28, 28), np.float32)
    out = postprocess.paste_masks(ones, [[10, 20, 38, 48]], 60, 60)
    expected = np.zeros((60, 60), np.uint8)
    expected[20:48, 10:38] = 1                     # a 28-px box: pixel centres hit the grid cells
    np.testing.assert_array_equal(out[0], expected)
    half = np.zeros((1, 28, 28), np.float32)
    half[:, :, 14:] = 1.0                          # right half of the mask
    out = postprocess.paste_masks(half, [[0, 0, 56, 28]], 28, 56)[0]
    assert out[:, 28:].all() and not out[:, :28].any()
    assert not postprocess.paste_masks(ones, [[5, 5, 5, 9]], 10, 10).any()   # empty box
    clipped = postprocess.paste_masks(ones, [[-10, -10, 5, 5]], 10, 10)[0]
    assert clipped[:5, :5].all() and clipped.sum() == 25


def test_paste_masks_equals_grid_sample():
    """The official paste (ppdet post_process.paste_mask): grid_sample at pixel centres, zero padding."""
    rng = np.random.default_rng(1)
    masks = rng.uniform(0, 1, (3, 28, 28)).astype("float32")
    boxes = np.array([[3.3, 4.1, 40.7, 30.2], [-5, 10, 20, 63], [30.5, 2.25, 31.5, 60]], "float32")
    h, w = 50, 45
    ys = (np.arange(h) + 0.5)[None, :]
    xs = (np.arange(w) + 0.5)[None, :]
    gy = (ys - boxes[:, 1:2]) / (boxes[:, 3:4] - boxes[:, 1:2]) * 2 - 1
    gx = (xs - boxes[:, 0:1]) / (boxes[:, 2:3] - boxes[:, 0:1]) * 2 - 1
    grid = np.stack([np.broadcast_to(gx[:, None, :], (3, h, w)), np.broadcast_to(gy[:, :, None], (3, h, w))], 3)
    ref = F.grid_sample(paddle.to_tensor(masks[:, None]), paddle.to_tensor(grid.astype("float32")),
                        align_corners=False).numpy()[:, 0]
    for k in range(3):
        ours = postprocess.paste_mask_probs(masks[k], boxes[k], h, w)
        np.testing.assert_allclose(ours, ref[k], atol=1e-5)
    np.testing.assert_array_equal(postprocess.paste_masks(masks, boxes, h, w), (ref >= 0.5).astype(np.uint8))


# ------------------------------------------------------------------------------ post-processing
def test_detect_nms_per_class_threshold_and_top_k():
    C = 2
    rois = paddle.to_tensor(np.array([[0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10], [50, 50, 60, 60]], "float32"))
    p = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.04, 0.7, 0.26], [0.05, 0.05, 0.9]])
    logits = paddle.to_tensor(np.log(p).astype("float32"))
    deltas = paddle.zeros([4, 4 * C])
    boxes, scores, labels = postprocess.detect(logits, deltas, rois, (100, 100), C, score_thresh=0.05)
    # class 0: roi 1 (0.8) is suppressed by roi 0 (0.9, IoU 9/11); class 1: roi 2 (0.7) and roi 1 (0.1)
    # overlap (IoU 9/11): 0.1 goes; 0.05 scores are not above the threshold; roi 3 stays background
    np.testing.assert_allclose(scores.numpy(), [0.9, 0.7], rtol=1e-5)
    assert labels.numpy().tolist() == [0, 1]
    np.testing.assert_allclose(boxes.numpy(), [[0, 0, 10, 10], [0, 0, 10, 10]])
    _, scores, _ = postprocess.detect(logits, deltas, rois, (100, 100), C, score_thresh=0.05, max_per_image=1)
    assert scores.shape == [1]
    out = postprocess.detect(logits, deltas, rois, (100, 100), C, score_thresh=0.95)
    assert [t.shape[0] for t in out] == [0, 0, 0]
    big = paddle.to_tensor(np.array([[-20, -20, 150, 150]], "float32"))
    b, _, _ = postprocess.detect(paddle.to_tensor(np.log([[0.9, 0.1]]).astype("float32")), paddle.zeros([1, 4]),
                                 big, (40, 80), 1)
    np.testing.assert_allclose(b.numpy(), [[0, 0, 80, 40]])                  # clipped to the image
    # zero-area boxes (clipped against an edge): the official kernel's IoU of two of them is 0/0 = NaN,
    # which suppresses the weaker of two touching ones of one class; against a real box it is 0
    rois = paddle.to_tensor(np.array([[0, -9, 10, -1], [5, -9, 15, -1], [20, -9, 30, -1], [0, 0, 10, 10],
                                      [0, -9, 10, -1]], "float32"))
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4], [0.1, 0.9]])
    b, s, lab = postprocess.detect(paddle.to_tensor(np.log(p).astype("float32")), paddle.zeros([5, 4]), rois,
                                   (100, 100), 1, score_thresh=0.05)
    # 0.8 and 0.1 touch 0.9 (both zero-area): suppressed; 0.7 touches none; 0.6 is a real box
    np.testing.assert_allclose(s.numpy(), [0.9, 0.7, 0.6], rtol=1e-5)
    np.testing.assert_allclose(b.numpy()[:, 3], [0, 0, 10])
    np.testing.assert_allclose(postprocess.to_original(np.array([[10, 20, 30, 40]]), (2.0, 0.5), (15, 100)),
                               [[20, 10, 60, 15]])                           # (sy, sx) = (2, 0.5), clipped


# ----------------------------------------------------------------------------------- targets
def test_mask_target_rasterises_the_polygon_in_the_box():
    square = [np.array([[10, 10], [30, 10], [30, 30], [10, 30]], "float32")]
    t = roi_heads.mask_target(square, [10, 10, 30, 30], 28)
    assert t.shape == (28, 28) and t.all()
    t = roi_heads.mask_target(square, [0, 10, 40, 30], 28)          # the square fills the middle half
    assert t[:, 7:21].all() and not t[:, :6].any() and not t[:, 22:].any()


def test_sample_rois_adds_ground_truth_and_marks_background():
    gt = np.array([[0, 0, 10, 10], [50, 50, 70, 70]], "float32")
    props = np.array([[0, 0, 10, 9], [100, 100, 110, 110]], "float32")
    rois, classes, matched, targets = roi_heads.sample_rois(props, gt, [2, 0], [0, 0], num_classes=3,
                                                            use_random=False)
    # candidates: 2 proposals + 2 gt boxes; IoU 0.9 -> fg class 2, the gt boxes themselves fg
    assert sorted(classes.tolist()) == [0, 2, 2, 3]
    fg = classes < 3
    np.testing.assert_array_equal(targets[fg], gt[matched[fg]])
    rois, classes, _, _ = roi_heads.sample_rois(props, np.zeros((0, 4)), [], [], num_classes=3)
    assert classes.tolist() == [3, 3] and len(rois) == 2           # no ground truth: all background
    rois, classes, _, _ = roi_heads.sample_rois(props, gt[:1], [1], [1], num_classes=3)
    # only a crowd region: it joins the candidates (as PaddleDetection does), all background
    assert classes.tolist() == [3, 3, 3] and sorted(rois[:, 0].tolist()) == [0, 0, 100]


# ------------------------------------------------------------------------- official model, sizes
def test_parameter_counts_match_the_official_table():
    tab = table()
    with paddle.LazyGuard():
        model = MaskRCNN(num_classes=80)
    assert count_params(model) == tab["num_params"] == 44120816
    total = sum(int(np.prod(p.shape)) for n, p in model.named_parameters() if not n.endswith(("_mean", "_variance")))
    assert total == 44396336
    with paddle.LazyGuard():
        r101 = MaskRCNN(num_classes=80, backbone={"depth": 101})
    # ResNet-101 has 17 more res4 bottlenecks (their BN frozen): 1x1 1024->256, 3x3 256->256, 1x1 256->1024
    assert count_params(r101) - count_params(model) == 17 * (1024 * 256 + 256 * 256 * 9 + 256 * 1024)


# Golden outputs: PaddleDetection's own model on the golden weights (tests/data/README.md says how each
# file was made). ppdet_mask_rcnn_r50_fpn.npz ran its RoIAlign with aligned=False (the code's NPU
# workaround), ..._aligned.npz with aligned=True (the config and the released weights); backbone, FPN
# and RPN, which RoIAlign does not reach, are stored in the first file only. Every check runs with our
# fused CPU operators off and on (ops/; on: the ResNet convolutions run through oneDNN).
GOLDEN = {True: "ppdet_mask_rcnn_r50_fpn_aligned.npz", False: "ppdet_mask_rcnn_r50_fpn.npz"}


@pytest.fixture(scope="module")
def golden_models():
    """{aligned: the R50-FPN model with the golden weights, in eval mode}: built once per RoIAlign
    setting for the module, under LazyGuard (no random initialisation: every tensor is loaded; 1.3 s
    less per model), the golden state dict generated once."""
    state = golden_state_dict(table()["params"])
    models = {}
    for aligned in (True, False):
        with paddle.LazyGuard():
            model = MaskRCNN(num_classes=80, roi={"aligned": aligned})
        report = load_entry_state(model, state, WEIGHTS.get("mask_rcnn_r50_fpn_1x_coco"), strict=True,
                                  log=lambda *_: None)
        assert report["missing"] == [] and report["unexpected"] == [] and report["loaded"] == 307
        model.eval()
        models[aligned] = model
    return models


@pytest.fixture(scope="module")
def golden_features(golden_models):
    """run(fast, bf16, bf16_act) -> (backbone outputs, P2..P6, the fused operators the backbone and the
    FPN ran), once per path (the op_path fixtures set the path and the operators' threads; the flags say
    which one to cache); both models hold the same weights and RoIAlign does not reach these layers."""
    image = paddle.to_tensor(np.load(os.path.join(DATA, GOLDEN[False]))["image"])
    model, cache = golden_models[True], {}

    def run(fast, bf16=False, bf16_act=False):
        if (fast, bf16, bf16_act) not in cache:
            with functional.precision(fast_ops=fast), paddle.no_grad():
                assert not fast or library.load(), library.state["error"]
                with counting_fused_ops() as in_backbone:
                    body = model.backbone(image)
                with counting_fused_ops() as in_fpn:
                    feats = model.fpn(body)
            cache[fast, bf16, bf16_act] = body, feats, {"backbone": set(in_backbone), "fpn": set(in_fpn)}
        return cache[fast, bf16, bf16_act]
    return run


def test_golden_backbone_fpn_rpn(golden_models, golden_features, op_path_conv):
    """Backbone, FPN and RPN head (objectness, deltas, anchors): stored in the aligned=False file only,
    since RoIAlign does not reach them (the aligned=True run gave them bit for bit)."""
    fast = op_path_conv.fused
    ref = np.load(os.path.join(DATA, GOLDEN[False]))
    body, feats, ran = golden_features(fast, op_path_conv.bf16, op_path_conv.bf16_act)
    # on the fused path the convolutions of the backbone, the FPN and the RPN head run through oneDNN (in
    # bf16 on the bf16 path), the frozen BN with its ReLU and residual in one kernel, the biases in another;
    # with bf16 activations the trunk's activations are bf16 and the FPN's and RPN's fp32
    conv = "zoo_conv2d_bf16" if op_path_conv.bf16 else "zoo_conv2d"
    backbone, fpn = {conv, "zoo_bn_global_act", "zoo_bn_global_add_act"}, {conv, "zoo_channel_bias"}
    if op_path_conv.bf16_act:
        backbone = {"zoo_conv2d_bf16act", "zoo_bn_global_act", "zoo_bn_global_add_act", "zoo_pool2d_bf16"}
    assert ran == ({"backbone": backbone, "fpn": fpn} if fast else {"backbone": set(), "fpn": set()})
    for i, f in enumerate(body):
        close(f.numpy()[:, :8, :8, :8], ref[f"backbone.res{i + 2}.slice"])
        stats_close(f.numpy(), ref[f"backbone.res{i + 2}.stats"])
    for i, f in enumerate(feats):
        close(f.numpy()[:, :8, :8, :8], ref[f"fpn.P{i + 2}.slice"])
        stats_close(f.numpy(), ref[f"fpn.P{i + 2}.stats"])
    model = golden_models[True]
    with paddle.no_grad(), counting_fused_ops() as in_rpn:
        scores, deltas = model.rpn.head(feats)
    assert set(in_rpn) == ({conv, "zoo_channel_bias"} if fast else set())
    anchors = model.rpn.anchors([f.shape[-2:] for f in feats])
    for i in range(5):
        close(scores[i].numpy(), ref[f"rpn.P{i + 2}.objectness"])
        close(deltas[i].numpy()[:, :, :8, :8], ref[f"rpn.P{i + 2}.deltas.slice"])
        stats_close(deltas[i].numpy(), ref[f"rpn.P{i + 2}.deltas.stats"])
        close(anchors[i][:48], ref[f"rpn.P{i + 2}.anchors.first48"])


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "not_aligned"])
def test_golden_roi_features_box_and_mask_heads(golden_models, golden_features, aligned, op_path):
    """RoI features, box head (fc7, logits, probabilities, deltas) and mask head (logits, the selected
    class's logits and probabilities) of the model built with `aligned` against PaddleDetection's with
    the same setting. On the fused path RoIAlign and the heads' linear layers, convolutions and
    deconvolution run on our operators (asserted), in bf16 on the bf16 path."""
    model = golden_models[aligned]
    assert model.box_roi.aligned is aligned and model.mask_roi.aligned is aligned
    ref = np.load(os.path.join(DATA, GOLDEN[aligned]))
    feats = golden_features(op_path.fused, op_path.bf16)[1][:4]
    rois = paddle.to_tensor(ref["box.rois"])
    assert box_ops.fpn_levels(rois).numpy().tolist() == ref["box.levels"].tolist()
    with paddle.no_grad(), counting_fused_ops() as ran:
        roi_feat = model.box_roi(feats, [rois])
        fc7 = model.box_head.features(roi_feat)
        logits, box_deltas = model.box_head(roi_feat)
        mask_feat = model.mask_roi(feats, [paddle.to_tensor(ref["mask.rois"])])
        mask_logits = model.mask_head(mask_feat)
        # the other RoIAlign setting: the two golden files must tell them apart (4.1 apart measured)
        other = roi_heads.MultiScaleRoIAlign(7, aligned=not aligned)(feats, [rois])
    fused = {"zoo_roi_align", "zoo_conv2d", "zoo_channel_bias", "zoo_matmul", "zoo_bias_act", "zoo_bias_dropout"}
    assert set(ran) == ({BF16_OPS.get(n, n) for n in fused} if op_path.bf16 else fused) if op_path.fused else not ran
    close(roi_feat.numpy()[:, :8], ref["box.roi_feat.slice"])
    stats_close(roi_feat.numpy(), ref["box.roi_feat.stats"])
    close(fc7.numpy(), ref["box.fc7"])
    close(logits.numpy(), ref["box.scores"])
    close(F.softmax(logits, axis=-1).numpy(), ref["box.probs"])
    close(box_deltas.numpy(), ref["box.deltas"])
    close(mask_feat.numpy()[:, :4], ref["mask.roi_feat.slice"])
    stats_close(mask_feat.numpy(), ref["mask.roi_feat.stats"])
    selected = roi_heads.select_class(mask_logits, paddle.to_tensor(ref["mask.classes"].astype("int64")))
    close(selected.numpy(), ref["mask.logits_selected"])
    close(F.sigmoid(selected).numpy(), ref["mask.probs"])
    close(mask_logits.numpy()[:, :8], ref["mask.logits_all.first8cls"])
    stats_close(mask_logits.numpy(), ref["mask.logits_all.stats"])
    assert np.abs(other.numpy()[:, :8] - ref["box.roi_feat.slice"]).max() > 1.0


def test_roi_align_is_aligned_by_default_and_in_every_recipe():
    """The released weights were trained with aligned RoIAlign; checkpoints of our earlier default set
    `model.roi.aligned=false` (README)."""
    import glob
    with paddle.LazyGuard():
        model = MaskRCNN(num_classes=2)
    assert model.box_roi.aligned is True and model.mask_roi.aligned is True
    recipes = sorted(glob.glob(os.path.join(ROOT, "configs", "vision", "mask_rcnn", "*.yaml")))
    assert len(recipes) == 4
    for path in recipes:
        assert config.load(path)["model"]["roi"]["aligned"] is True, path
    cfg = config.load(recipes[0], ["model.roi.aligned=false"])
    assert cfg["model"]["roi"]["aligned"] is False


def test_key_maps_cover_the_official_tables():
    tab = table()
    state = {k: np.zeros(shape, "float32") for k, shape, *_ in tab["params"]}
    mapped, ignored = map_keys(state, WEIGHTS.get("mask_rcnn_r50_fpn_1x_coco"))
    with paddle.LazyGuard():
        model = MaskRCNN(num_classes=80)
    own = model.state_dict()
    assert not ignored and set(mapped) == set(own)
    assert all(tuple(own[k].shape) == v.shape for k, v in mapped.items())
    # the ImageNet backbone file: the trunk alone, with or without 'backbone.'; the rest is new
    trunk = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    trunk["fc_0.w_0"] = np.zeros((2048, 1000), "float32")
    model = MaskRCNN(num_classes=80)
    report = load_entry_state(model, trunk, WEIGHTS.get("mask_rcnn_r50_imagenet_ppdet"), log=lambda *_: None)
    assert report["loaded"] == 265 and report["ignored"] == ["fc_0.w_0"]
    assert all(k.split(".")[0] in ("fpn", "rpn", "box_head", "mask_head") for k in report["missing"])


def test_a_bare_paddledetection_file_is_recognised_by_its_keys():
    tab = table()
    state = {k: np.zeros(shape, "float32") for k, shape, *_ in tab["params"]}
    with paddle.LazyGuard():
        model = MaskRCNN(num_classes=80)
    layout, mapped, _, (found, total) = detect_layout(model, state, model_layouts(model))
    assert layout.name == "mask_rcnn_r50_fpn_1x_coco" and found == total == 307


def test_fine_tuning_to_other_classes_drops_only_the_class_layers():
    tab = table()
    model = MaskRCNN(num_classes=4, backbone={"depth": 50})
    logs = []
    report = load_entry_state(model, golden_state_dict(tab["params"]), WEIGHTS.get("mask_rcnn_r50_fpn_1x_coco"),
                              log=logs.append)
    assert sorted(report["dropped_head"]) == ["box_head.bbox_pred.bias", "box_head.bbox_pred.weight",
                                              "box_head.cls_score.bias", "box_head.cls_score.weight",
                                              "mask_head.logits.bias", "mask_head.logits.weight"]


def test_bad_model_settings_fail_in_one_line():
    with pytest.raises(ConfigError, match="MaskRCNN.rpn: unknown keys \\['anchor_size'\\]"):
        MaskRCNN(num_classes=2, rpn={"anchor_size": [32]})
    with pytest.raises(ConfigError, match="MaskRCNN.roi.aligned: expected bool, got 'maybe'"):
        MaskRCNN(num_classes=2, roi={"aligned": "maybe"})          # -o model.roi.aligned=maybe
    with pytest.raises(ConfigError, match="MaskRCNN.rpn.train_post_nms_top_n: expected int, got 1000.5"):
        MaskRCNN(num_classes=2, rpn={"train_post_nms_top_n": 1000.5})
    MaskRCNN(num_classes=2, rpn={"min_size": 0}, roi={"aligned": False})    # an int where a float is asked: fine
    with pytest.raises(ConfigError, match="num_classes must be >= 1"):
        MaskRCNN(num_classes=0)


# --------------------------------------------------------------------------- a step by hand
def _tiny():
    paddle.seed(0)
    return MaskRCNN(num_classes=3, backbone={"depth": 18, "base_channels": 8, "frozen_stages": -1,
                                             "freeze_norm": False},
                    fpn_channels=16, box_fc=32, mask_convs=1, mask_channels=16,
                    rpn={"batch_size_per_image": 32, "train_pre_nms_top_n": 50, "train_post_nms_top_n": 20,
                         "test_pre_nms_top_n": 30, "test_post_nms_top_n": 20},
                    roi={"batch_size_per_image": 16}, test={"max_per_image": 5})


def _batch(with_objects=True):
    rng = np.random.default_rng(0)
    square = [np.array([[8, 8], [40, 8], [40, 40], [8, 40]], "float32")]
    boxes = np.array([[8, 8, 40, 40]], "float32") if with_objects else np.zeros((0, 4), "float32")
    return {"image": paddle.to_tensor(rng.normal(size=(2, 3, 64, 64)).astype("float32")),
            "image_size": paddle.to_tensor(np.array([[64, 64], [48, 64]], "int64")),
            "scale_factor": paddle.to_tensor(np.array([[1, 1], [0.5, 0.5]], "float32")),
            "orig_size": paddle.to_tensor(np.array([[64, 64], [96, 128]], "int64")),
            "gt_boxes": [paddle.to_tensor(boxes), paddle.to_tensor(np.zeros((0, 4), "float32"))],
            "gt_classes": [paddle.to_tensor(np.array([2] * len(boxes), "int64")), paddle.to_tensor(np.zeros(0, "int64"))],
            "gt_crowd": [paddle.to_tensor(np.zeros(len(boxes), "int32")), paddle.to_tensor(np.zeros(0, "int32"))],
            "gt_polygons": [[square] if with_objects else [], []],
            **{key: [paddle.to_tensor(pack_polygons(p)[i]) for p in ([[square]] if with_objects else [[]]) + [[]]]
               for i, key in enumerate(("gt_poly_points", "gt_poly_counts"))}}


@pytest.mark.parametrize("with_objects", [True, False])
def test_train_step_with_and_without_objects(with_objects):
    model = _tiny()
    model.train()
    losses = model(_batch(with_objects))
    assert set(losses) == {"loss", "loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg", "loss_mask"}
    assert all(np.isfinite(v.item()) for v in losses.values())
    losses["loss"].backward()
    grads = [p.grad for p in model.parameters() if not p.stop_gradient and p.grad is not None]
    assert grads and all(np.isfinite(g.numpy()).all() for g in grads)
    if not with_objects:
        assert losses["loss_mask"].item() == 0.0 and losses["loss_rpn_reg"].item() == 0.0


def test_eval_outputs_are_per_image_at_the_original_size():
    model = _tiny()
    model.eval()
    with paddle.no_grad():
        out = model(_batch())
    assert list(out)[0] == "bbox_num"
    n = out["bbox_num"].numpy().tolist()
    assert [b.shape[0] for b in out["boxes"]] == n and all(k <= 5 for k in n)
    assert [tuple(m.shape[1:]) for m in out["masks"]] == [(64, 64), (96, 128)]
    for b in out["boxes"][1:]:
        assert (b.numpy()[:, 2] <= 128).all() and (b.numpy()[:, 3] <= 96).all()
