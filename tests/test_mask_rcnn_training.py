"""Mask R-CNN's training side against PaddleDetection's, stage by stage, on golden weights.

tests/data/ppdet_mask_rcnn_r50_fpn_train.npz (made by tests/data/make_golden/ppdet_mask_rcnn_train.py,
see tests/data/README.md) holds the official model's train-mode intermediates and losses for a batch
of three images: one with three objects and a crowd region, one with a single object, one with only
a crowd region (no foreground anchor or RoI).

Random sampling: the generator replaced paddle.randperm (the official sampler's only draw) by
stored permutations `draw.<k>`; here `box_ops.random_permutation` (our sampler's only draw) is
replaced by `Replay`, which hands out the same permutations in the same order and checks each
length, so both sides take the same samples.

Each stage is fed the REFERENCE output of the stage before it, so a failure names the first stage
that differs; `test_losses` then runs our whole train forward from the images and ground truth.
"""
import json
import os
import sys

import numpy as np
import paddle
import pytest

from engine.components import load_all
from engine.config import load
from engine.weights.pretrained import WEIGHTS, load_entry_state
from models.vision.mask_rcnn import box_ops, roi_heads
from models.vision.mask_rcnn.model import MaskRCNN
from ops import functional
from readers.coco import COCODataset, pack_polygons

load_all()
DATA = os.path.join(os.path.dirname(__file__), "data")
sys.path.insert(0, DATA)
from golden_weights import golden_state_dict  # noqa: E402

NUM_CLASSES = 80
IMAGES = 3


def host(x):
    """A stage's tensor output as numpy, for the comparisons (the stages themselves stay on the device)."""
    return x.numpy() if isinstance(x, paddle.Tensor) else np.asarray(x)


def assert_close(ours, ref, what, rtol=1e-5):
    """1e-5 relative: |ours - ref| <= 1e-5 * (max(1, max|ref|) + |ref|) elementwise."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != official {ref.shape}"
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    diff = np.abs(ours - ref)
    ok = diff <= rtol * (scale + np.abs(ref))
    assert ok.all(), f"{what}: {int((~ok).sum())} of {ref.size} values differ, max abs diff {diff.max():.3g}"


def assert_equal(ours, ref, what):
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != official {ref.shape}"
    bad = np.flatnonzero(ours.reshape(-1) != ref.reshape(-1))
    assert not len(bad), f"{what}: {len(bad)} of {ref.size} differ, first at {bad[:5].tolist()}: " \
                         f"ours {ours.reshape(-1)[bad[:5]].tolist()}, official {ref.reshape(-1)[bad[:5]].tolist()}"


class Replay:
    """Stands in for box_ops.random_permutation: the official draws, in their order."""

    def __init__(self, ref, start=0):
        self.draws = [ref[f"draw.{k}"] for k in range(sum(k.startswith("draw.") for k in ref.files))]
        self.next = start

    def __call__(self, n):
        assert self.next < len(self.draws), f"draw {self.next}: the official sampler drew only {len(self.draws)}"
        p = self.draws[self.next]
        assert len(p) == n, f"draw {self.next}: ours permutes {n} candidates, the official sampler {len(p)}"
        self.next += 1
        return p


@pytest.fixture(scope="module")
def ref():
    return np.load(os.path.join(DATA, "ppdet_mask_rcnn_r50_fpn_train.npz"))


@pytest.fixture(scope="module")
def sidecar():
    with open(os.path.join(DATA, "ppdet_mask_rcnn_r50_fpn_train.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def model():
    """The official recipe's settings (RPN_DEFAULTS, ROI_DEFAULTS are its config's), aligned RoIAlign
    as the released model was trained, golden weights; train mode (BN frozen: global statistics)."""
    with open(os.path.join(DATA, "keys_ppdet_mask_rcnn_r50_fpn_1x_coco.json")) as f:
        table = json.load(f)
    m = MaskRCNN(num_classes=NUM_CLASSES, roi={"aligned": True})
    load_entry_state(m, golden_state_dict(table["params"]), WEIGHTS.get("mask_rcnn_r50_fpn_1x_coco"),
                     strict=True, log=lambda *_: None)
    m.train()
    return m


def test_golden_file_is_the_one_its_sidecar_describes(sidecar):
    import hashlib
    with open(os.path.join(DATA, sidecar["npz"]), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == sidecar["npz_sha256"]


def ground_truth(ref, sidecar):
    """Per image: boxes, classes, crowd flags and our polygons (lists of [K, 2] parts; none for crowd)."""
    out = []
    for i, objs in enumerate(sidecar["inputs"]["objects"]):
        polys = [[] if o["crowd"] else [np.asarray(p, np.float32).reshape(-1, 2) for p in o["polygons"]]
                 for o in objs]
        out.append((ref[f"gt.{i}.boxes"], ref[f"gt.{i}.classes"].astype(np.int64),
                    ref[f"gt.{i}.crowd"].astype(bool), polys))
    return out


@pytest.fixture(scope="module")
def heads(model, ref):
    """Our RPN outputs on the stored images (no gradient needed for the comparisons)."""
    with paddle.no_grad():
        feats = model.features(paddle.to_tensor(ref["image"]))
        scores, deltas = model.rpn.head(feats)
    anchors = model.rpn.anchors.concatenated([f.shape[-2:] for f in feats])
    return feats, scores, deltas, anchors


def test_rpn_anchor_matching(model, ref, sidecar, heads):
    anchors = heads[3]
    for i, (boxes, _, crowd, _) in enumerate(ground_truth(ref, sidecar)):
        matches, labels = map(host, model.rpn.match(anchors, paddle.to_tensor(boxes), paddle.to_tensor(crowd)))
        assert_equal(labels, ref[f"rpn.{i}.match_labels"], f"image {i}: RPN anchor labels before sampling")
        pos = labels == 1
        assert_equal(matches[pos], ref[f"rpn.{i}.matches"][pos], f"image {i}: RPN positives' matched gt")


def test_rpn_sampling_and_targets(model, ref, sidecar, heads, monkeypatch):
    anchors = heads[3]
    monkeypatch.setattr(box_ops, "random_permutation", Replay(ref))
    for i, (boxes, _, crowd, _) in enumerate(ground_truth(ref, sidecar)):
        labels, deltas = map(host, model.rpn.targets(anchors, paddle.to_tensor(boxes), paddle.to_tensor(crowd)))
        assert_equal(labels, ref[f"rpn.{i}.labels"], f"image {i}: sampled RPN anchors (labels 1/0/-1)")
        assert_close(deltas[labels == 1], ref[f"rpn.{i}.pos_deltas"], f"image {i}: RPN regression targets")


def assert_same_proposals(ours, ref_boxes, ref_scores, what):
    """The official boxes in the official order; rows whose official scores are within 1e-4 (float32
    noise of the heads: ~1e-5) may come in either order. Coordinates to 2e-5 relative to the largest
    anchor (512): a box is its anchor scaled by exp(delta), so the heads' float32 noise (~1e-5 in the
    deltas; MKL's code path moves it) reaches the box times the anchor's size. Measured over the 1,007
    training proposals of the three images: median 3.5e-7, 99th percentile 5.2e-6, worst 1.12e-5 on an
    Intel Xeon (AMX) and 1.09e-5 on the CI's; a wrong decode is off by pixels, ~1e-3."""
    ours, ref_boxes = np.asarray(ours, np.float64), np.asarray(ref_boxes, np.float64)
    assert ours.shape == ref_boxes.shape, f"{what}: {len(ours)} proposals, the official {len(ref_boxes)}"
    tol = 2e-5 * (512.0 + np.abs(ref_boxes))
    same = (np.abs(ours[:, None, :] - ref_boxes[None, :, :]) <= tol[None]).all(2)        # [ours, ref]
    swapped, used = 0, np.zeros(len(ours), bool)
    for i in range(len(ours)):
        if same[i, i] and not used[i]:
            used[i] = True
            continue
        tie = np.flatnonzero(same[i] & ~used & (np.abs(ref_scores - ref_scores[i]) <= 1e-4 * max(1, abs(ref_scores[i]))))
        assert len(tie), f"{what}: our row {i} {ours[i].round(3).tolist()} is not the official " \
                         f"{ref_boxes[i].round(3).tolist()} nor a tied one"
        used[tie[0]] = True
        swapped += 1
    assert swapped <= 4, f"{what}: {swapped} rows out of order (ties only expected)"


def test_training_proposals(model, ref, heads):
    """Train settings (2000 per level after NMS, the image's best 1000 over the levels), per image."""
    _, scores, deltas, _ = heads
    assert model.rpn.train_top_n == (2000, 1000)
    size = paddle.to_tensor(ref["im_shape"].astype(np.int64))
    rois, rois_num = model.rpn.proposals(scores, deltas, size)
    per_image = np.split(rois.numpy(), np.cumsum(rois_num.numpy())[:-1])
    for i in range(IMAGES):
        assert_same_proposals(per_image[i], ref[f"proposals.{i}"], ref[f"proposals.{i}.probs"],
                              f"image {i}: training proposals")


def test_training_proposals_collected_per_image(model, ref, heads, monkeypatch):
    """Top-k settings at which an image has more candidates than it keeps (1000 per level, 100 in all):
    the best 100 of each image over its levels, best first."""
    _, scores, deltas, _ = heads
    monkeypatch.setattr(model.rpn, "train_top_n", (1000, 100))
    rois, rois_num = model.rpn.proposals(scores, deltas, paddle.to_tensor(ref["im_shape"].astype(np.int64)))
    per_image = np.split(rois.numpy(), np.cumsum(rois_num.numpy())[:-1])
    for i in range(IMAGES):
        assert_same_proposals(per_image[i], ref[f"proposals_small.{i}"], ref[f"proposals_small.{i}.probs"],
                              f"image {i}: proposals with top-k 1000/100")


def test_roi_matching(model, ref, sidecar):
    r = model.roi_cfg
    for i, (boxes, _, crowd, _) in enumerate(ground_truth(ref, sidecar)):
        candidates, matches, labels = map(host, roi_heads.match_rois(
            paddle.to_tensor(ref[f"proposals.{i}"]), paddle.to_tensor(boxes), paddle.to_tensor(crowd),
            r["fg_thresh"], r["bg_thresh"], model.crowd_ignore_iou))
        assert_close(candidates[-len(boxes):], boxes, f"image {i}: every gt box (crowd too) joins the candidates")
        assert_equal(labels, ref[f"roi.{i}.match_labels"], f"image {i}: RoI candidates' labels before sampling")
        fg = labels == 1
        assert_equal(matches[fg], ref[f"roi.{i}.matches"][fg], f"image {i}: foreground candidates' matched gt")


def _rpn_draws(ref):
    """Index of the first RoI-sampling draw: the RPN's take one (bg) or two (bg, fg) per image."""
    return sum(1 + bool((ref[f"rpn.{i}.labels"] == 1).any()) for i in range(IMAGES))


def test_roi_sampling_and_box_targets(model, ref, sidecar, monkeypatch):
    r = model.roi_cfg
    monkeypatch.setattr(box_ops, "random_permutation", Replay(ref, start=_rpn_draws(ref)))
    for i, (boxes, classes, crowd, _) in enumerate(ground_truth(ref, sidecar)):
        rois, labels, matched, target_boxes = map(host, roi_heads.sample_rois(
            paddle.to_tensor(ref[f"proposals.{i}"]), paddle.to_tensor(boxes), paddle.to_tensor(classes),
            paddle.to_tensor(crowd), NUM_CLASSES, r["batch_size_per_image"], r["fg_fraction"], r["fg_thresh"],
            r["bg_thresh"], r["use_random"], model.crowd_ignore_iou))
        assert_close(rois, ref[f"roi.{i}.rois"], f"image {i}: sampled RoIs (fg first, then bg)")
        assert_equal(labels, ref[f"roi.{i}.labels"], f"image {i}: sampled RoIs' classes (80 = background)")
        fg = labels < NUM_CLASSES
        assert_equal(matched[fg], ref[f"roi.{i}.gt_inds"][fg], f"image {i}: foreground RoIs' matched gt")
        assert_close(target_boxes[fg], ref[f"roi.{i}.gt_boxes"][fg], f"image {i}: foreground RoIs' target boxes")


def test_mask_targets(ref, sidecar):
    gts = ground_truth(ref, sidecar)
    rois = [ref[f"roi.{i}.rois"] for i in range(IMAGES)]
    labels = [ref[f"roi.{i}.labels"] for i in range(IMAGES)]
    matched = [ref[f"roi.{i}.gt_inds"] for i in range(IMAGES)]
    packed = [pack_polygons(g[3]) for g in gts]
    fg_rois, classes, targets, empty = roi_heads.mask_targets(
        [paddle.to_tensor(x) for x in rois], [paddle.to_tensor(x) for x in labels],
        [paddle.to_tensor(x) for x in matched], [paddle.to_tensor(p) for p, _ in packed],
        [paddle.to_tensor(c) for _, c in packed], NUM_CLASSES, 28)
    fg_rois, classes, targets = [host(x) for x in fg_rois], host(classes), host(targets)
    # the official list also holds a fake RoI of weight 0 for each image without foreground (image 2)
    real = ref["mask.weights"] > 0
    per_image = np.split(real, np.cumsum(ref["mask.rois_num"])[:-1])
    assert empty == (~real).sum() == 1, f"images without foreground: ours {empty}, official {(~real).sum()}"
    assert_equal([len(x) for x in fg_rois], [int(r.sum()) for r in per_image], "foreground RoIs per image")
    assert_close(np.concatenate(fg_rois), ref["mask.rois"][real], "mask RoIs")
    assert_equal(classes, ref["mask.classes"][real], "mask classes")
    assert_equal(targets, ref["mask.targets"][real], "28x28 mask targets")


def _batch(ref, sidecar):
    gts = ground_truth(ref, sidecar)
    return {"image": paddle.to_tensor(ref["image"]),
            "image_size": paddle.to_tensor(ref["im_shape"].astype(np.int64)),
            "gt_boxes": [paddle.to_tensor(g[0]) for g in gts],
            "gt_classes": [paddle.to_tensor(g[1]) for g in gts],
            "gt_crowd": [paddle.to_tensor(g[2].astype(np.int32)) for g in gts],
            "gt_polygons": [g[3] for g in gts],
            "gt_poly_points": [paddle.to_tensor(pack_polygons(g[3])[0]) for g in gts],
            "gt_poly_counts": [paddle.to_tensor(pack_polygons(g[3])[1]) for g in gts]}


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_losses(model, ref, sidecar, monkeypatch, fused):
    """The whole train forward: our draws are the official ones, every loss within 1e-5 relative, on
    paddle's kernels (what PaddleDetection runs) and on our fused operators (oneDNN's convolutions
    and GEMMs, the FPN, RPN and heads included). One exception on the fused path, the mask loss: its
    RoIs are the RPN's proposals, which move with the convolutions' rounding, and the mask head's
    input moves by 3e-5 of its scale (the FPN's outputs by 3e-6); 7.6e-5 relative measured, 2e-4
    allowed. The path is set here: the state earlier tests leave must not choose it."""
    replay = Replay(ref)
    monkeypatch.setattr(box_ops, "random_permutation", replay)
    with functional.precision(fast_ops=fused), paddle.no_grad():
        losses = model(_batch(ref, sidecar))
    assert replay.next == len(replay.draws), f"ours drew {replay.next} permutations, the official {len(replay.draws)}"
    for name in ("loss_rpn_cls", "loss_rpn_reg", "loss_bbox_cls", "loss_bbox_reg", "loss_mask", "loss"):
        rtol = 2e-4 if fused and name in ("loss_mask", "loss") else 1e-5
        assert_close(losses[name].item(), ref[f"loss.{name}"], name, rtol)


def test_mask_loss_counts_the_official_fake_roi_of_an_image_without_foreground():
    """PaddleDetection's generate_mask_target gives an image without foreground one RoI of weight 0,
    which the loss's mean still counts: loss = sum over the real RoIs / ((F + empty images) R R)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 4, 4)).astype(np.float32)
    targets = (rng.uniform(size=(2, 4, 4)) > 0.5).astype(np.uint8)
    classes = np.array([1, 2])
    x, t = logits[[0, 1], classes], targets.astype(np.float64)
    bce = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
    for empty in (0, 1):
        ours = roi_heads.mask_loss(paddle.to_tensor(logits), paddle.to_tensor(classes), paddle.to_tensor(targets),
                                   extra_rois=empty).item()
        assert abs(ours - bce.sum() / ((2 + empty) * 16)) < 1e-6, f"{empty} image(s) without foreground"
    rois = [np.array([[0, 0, 8, 8]], np.float32), np.array([[0, 0, 4, 4], [1, 1, 5, 5]], np.float32)]
    square = [np.array([[0, 0], [8, 0], [8, 8], [0, 8]], np.float32)]
    packed = [pack_polygons([square]), pack_polygons([])]
    fg_rois, fg_classes, fg_targets, empty = roi_heads.mask_targets(
        rois, [np.array([2]), np.array([3, 3])], [np.array([0]), np.array([0, 0])], [p for p, _ in packed],
        [c for _, c in packed], 3, 28)
    assert empty == 1 and fg_classes.tolist() == [2] and fg_targets.shape == [1, 28, 28] and fg_targets.numpy().all()


def test_coco_reader_leaves_crowd_regions_out_with_load_crowd_false(tmp_path):
    """The official COCO recipes train without crowd regions (COCODataSet load_crowd=False)."""
    import cv2
    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((20, 30, 3), np.uint8))
    ann = {"images": [{"id": 1, "file_name": "a.png", "width": 30, "height": 20}],
           "categories": [{"id": 3, "name": "c"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 8, 8], "area": 64, "iscrowd": 0,
                            "segmentation": [[1, 1, 9, 1, 9, 9, 1, 9]]},
                           {"id": 2, "image_id": 1, "category_id": 3, "bbox": [10, 2, 15, 10], "area": 150,
                            "iscrowd": 1, "segmentation": {"counts": [40, 10], "size": [20, 30]}}]}
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(ann))
    kept = COCODataset(str(path)).load(0)
    assert kept["gt_crowd"].tolist() == [0, 1]
    left = COCODataset(str(path), load_crowd=False).load(0)
    assert left["gt_crowd"].tolist() == [0] and left["gt_boxes"].tolist() == [[1, 1, 9, 9]]
    cfg = load(os.path.join(os.path.dirname(__file__), "..", "configs", "vision", "mask_rcnn",
                            "mask_rcnn_r50_fpn_1x_coco.yaml"))
    assert cfg["reader"]["train"]["load_crowd"] is False and "load_crowd" not in cfg["reader"]["val"]
