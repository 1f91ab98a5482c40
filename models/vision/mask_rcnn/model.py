"""Mask R-CNN (ResNet + FPN) and its pretrained entries: PaddleDetection's MaskRCNN architecture.

The stages live beside this file: fpn.py, rpn.py (anchors, proposals, RPN targets), roi_heads.py
(RoIAlign, box and mask heads, RoI targets), postprocess.py (NMS, mask pasting), box_ops.py.

Batch (readers/coco.py with PadImages): `image` [B, 3, H, W] padded to a multiple of 32, uint8 with
`image_normalize` (Normalize's default; normalised on the device, the padding 0.0) or float32,
`image_size` int64 [B, 2] (the resized image inside the padding), `scale_factor` float32 [B, 2]
(sy, sx: original -> input), `orig_size` int64 [B, 2]; for training, ragged per image:
`gt_boxes` [N, 4] (input pixels), `gt_classes` [N] (0..C-1), `gt_crowd` [N], and the polygons
packed by the reader, `gt_poly_points` [N, V, 2] and `gt_poly_counts` [N, P] (readers/coco.py
pack_polygons; else `gt_polygons`, metadata: per image, per instance, a list of [K, 2] parts).
The train forward computes its targets in paddle operators on the device of the model's tensors
and reads nothing back (tests/test_mask_rcnn_device.py); the waits for the device left are the
samplers' paddle.nonzero (box_ops.subsample) and RoIAlign's per-level split.

Train mode returns the losses (loss_rpn_cls, loss_rpn_reg, loss_bbox_cls, loss_bbox_reg,
loss_mask and their sum `loss`). Eval mode returns, per image, `bbox_num` int64 [B], then lists of
`boxes` [K, 4] (original image pixels), `scores` [K], `labels` [K] (class index 0..C-1) and
`masks` uint8 [K, h, w] at the original image size.

Parameter names (ours; `ppdet_key_map` reaches PaddleDetection's):
    backbone.*                        the shared ResNet (models/vision/resnet.py)
    fpn.lateral_convs.{0-3}, fpn.output_convs.{0-3}
    rpn.head.{conv,objectness,deltas}
    box_head.{fc6,fc7,cls_score,bbox_pred}
    mask_head.convs.{0-3}, mask_head.deconv, mask_head.logits
"""
import numpy as np
import paddle
import paddle.nn as nn
from paddle.static import InputSpec

from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.pixels import with_float
from models.vision.mask_rcnn import postprocess, roi_heads, rpn
from models.vision.mask_rcnn.fpn import FPN
from models.vision.mask_rcnn.rpn import RPN
from models.vision.resnet import build_backbone, resnet_key_map

# PaddleDetection's ResNet for Mask R-CNN: freeze_at 0 (stem + res2, our frozen_stages 1) and
# freeze_norm (every BN's scale/shift frozen, running statistics used in training)
DEFAULT_BACKBONE = {"name": "ResNet", "depth": 50, "variant": "b", "out_indices": [0, 1, 2, 3],
                    "frozen_stages": 1, "freeze_norm": True}
RPN_DEFAULTS = dict(anchor_sizes=[32, 64, 128, 256, 512], aspect_ratios=[0.5, 1.0, 2.0],
                    strides=[4, 8, 16, 32, 64], batch_size_per_image=256, fg_fraction=0.5,
                    positive_overlap=0.7, negative_overlap=0.3, use_random=True,
                    train_pre_nms_top_n=2000, train_post_nms_top_n=1000,
                    test_pre_nms_top_n=1000, test_post_nms_top_n=1000, nms_thresh=0.7, min_size=0.0)
ROI_DEFAULTS = dict(batch_size_per_image=512, fg_fraction=0.25, fg_thresh=0.5, bg_thresh=0.5,
                    use_random=True, box_resolution=7, mask_resolution=14, sampling_ratio=0,
                    aligned=True, box_weights=[10.0, 10.0, 5.0, 5.0])
TEST_DEFAULTS = dict(score_thresh=0.05, nms_thresh=0.5, max_per_image=100, mask_thresh=0.5)
FEATURE_KEYS = ("p2", "p3", "p4", "p5")      # the pyramid levels the RoI heads read


def _settings(what, given, defaults):
    given = dict(given or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"MaskRCNN.{what}: unknown keys {unknown}; known: {', '.join(defaults)}")
    for key, value in given.items():   # a nested dict escapes the signature check: check each type here
        want = type(defaults[key])
        fits = isinstance(value, want) if want is not float else isinstance(value, (int, float))
        if not fits or (isinstance(value, bool) and want is not bool):
            raise ConfigError(f"MaskRCNN.{what}.{key}: expected {want.__name__}, got {value!r}")
    return {**defaults, **given}


@MODELS.register("MaskRCNN")
class MaskRCNN(ZooModel):
    """Args:
        num_classes: object classes (COCO: 80), without the background.
        backbone: the ResNet config (default R50, PaddleDetection's freezing; `depth: 101` for R101).
        fpn_channels: channels of the pyramid and of the RPN/RoI features (256).
        rpn: anchor, target and proposal settings (keys of RPN_DEFAULTS).
        roi: RoI sampling and pooling settings (keys of ROI_DEFAULTS); `aligned` True as the
            released weights were trained (see roi_heads.py); False for checkpoints trained with
            our earlier default.
        box_fc: width of the box head's two FC layers (1024).
        mask_convs: the 3x3 convolutions of the mask head before its upsampling (4).
        mask_channels: the width of those convolutions and of the 2x upsampling deconvolution (256).
        test: score_thresh, nms_thresh, max_per_image, mask_thresh (0.05, 0.5, 100, 0.5).
        crowd_ignore_iou: > 0 ignores anchors and RoIs overlapping a crowd region more than this
            (PaddleDetection's ignore_thresh; -1: crowd regions are only kept out of the matching).
    """

    def weights(self):   # the class layers: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"box_head\.(cls_score|bbox_pred)\.(weight|bias)",
                                  r"mask_head\.logits\.(weight|bias)"], backbone=self.backbone)

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 80, backbone: dict = None, fpn_channels: int = 256, rpn: dict = None,
                 roi: dict = None, box_fc: int = 1024, mask_convs: int = 4, mask_channels: int = 256,
                 test: dict = None, crowd_ignore_iou: float = -1.0):
        super().__init__()
        if num_classes < 1:
            raise ConfigError(f"MaskRCNN: num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes
        backbone = dict(DEFAULT_BACKBONE, **(backbone or {}))
        self.backbone = build_backbone(backbone, out_indices=[0, 1, 2, 3])
        self.fpn = FPN(self.backbone.out_channels, fpn_channels)
        rpn_cfg = _settings("rpn", rpn, RPN_DEFAULTS)
        if len(rpn_cfg["anchor_sizes"]) != 5 or len(rpn_cfg["strides"]) != 5:
            raise ConfigError("MaskRCNN.rpn: anchor_sizes and strides need one value per level P2..P6")
        self.rpn = RPN(fpn_channels, crowd_ignore_iou=crowd_ignore_iou, **rpn_cfg)
        self.roi_cfg = _settings("roi", roi, ROI_DEFAULTS)
        self.test_cfg = _settings("test", test, TEST_DEFAULTS)
        self.crowd_ignore_iou = crowd_ignore_iou
        r = self.roi_cfg
        self.box_roi = roi_heads.MultiScaleRoIAlign(r["box_resolution"], sampling_ratio=r["sampling_ratio"],
                                                    aligned=r["aligned"])
        self.mask_roi = roi_heads.MultiScaleRoIAlign(r["mask_resolution"], sampling_ratio=r["sampling_ratio"],
                                                     aligned=r["aligned"])
        self.box_head = roi_heads.BoxHead(fpn_channels, r["box_resolution"], num_classes, box_fc)
        self.mask_head = roi_heads.MaskHead(fpn_channels, num_classes, mask_channels, mask_convs)

    # ------------------------------------------------------------------------------ forward
    def features(self, image):
        return self.fpn(self.backbone(image))

    def forward(self, batch):
        batch = with_float(batch, "image")   # uint8 pixels from the reader: normalised here, on the device
        if not self.training:
            return self.run_exported(self.run_program, batch, self.pipeline_settings())
        feats = self.features(batch["image"])
        targets = self._targets(batch)
        rois, rois_num, losses = self.rpn(feats, batch["image_size"], targets)
        losses.update(self._roi_losses(feats[:4], rois, rois_num, targets))
        losses["loss"] = paddle.add_n([v for k, v in losses.items()])
        return losses

    # ------------------------------------------------------------------------------ inference
    # Inference is three networks with Python between them: "features" (backbone, FPN, the RPN head),
    # proposals (generate_proposals, which paddle2onnx cannot convert), "box" (RoIAlign and the box
    # head on the proposals), the detection NMS and top-k, "mask" (the mask head on the detected
    # boxes) and mask pasting. The eval forward runs exactly that code (`run_exported`) with the
    # networks run here; tools/export.py exports the three networks as programs and the predictor
    # runs `run_exported` around them (`exported_runner`, engine/model.py).
    PROGRAMS = {"features": "features_program", "box": "box_program", "mask": "mask_program"}
    RPN_LEVELS = ("p2", "p3", "p4", "p5", "p6")

    def run_program(self, name, inputs):
        return getattr(self, self.PROGRAMS[name])(inputs)

    def features_program(self, batch):
        """image [B, 3, H, W] -> P2..P5 and, per level P2..P6, the RPN's objectness logits
        `rpn_logits_pL` [B, A, H, W] and deltas `rpn_deltas_pL` [B, 4A, H, W]."""
        feats = self.features(batch["image"])
        scores, deltas = self.rpn.head(feats)
        out = dict(zip(FEATURE_KEYS, feats[:4]))
        out.update({f"rpn_logits_{lv}": t for lv, t in zip(self.RPN_LEVELS, scores)})
        out.update({f"rpn_deltas_{lv}": t for lv, t in zip(self.RPN_LEVELS, deltas)})
        return out

    def box_program(self, inputs):
        """P2..P5, rois [N, 4] image by image, rois_num [B] -> class logits [N, C+1], class box deltas [N, 4C]."""
        logits, deltas = self.box_head(self.box_roi([inputs[k] for k in FEATURE_KEYS], inputs["rois"],
                                                    inputs["rois_num"]))
        return {"box_logits": logits, "box_deltas": deltas}

    def mask_program(self, inputs):
        """P2..P5, boxes [K, 4] image by image, boxes_num [B], labels [K] -> mask_probs [K, 2R, 2R]
        (the sigmoid of each box's class channel)."""
        feats = [inputs[k] for k in FEATURE_KEYS]
        logits = self.mask_head(self.mask_roi(feats, inputs["boxes"], inputs["boxes_num"]))
        return {"mask_probs": paddle.nn.functional.sigmoid(roi_heads.select_class(logits, inputs["labels"]))}

    def pipeline_settings(self):
        t = self.test_cfg
        return {"num_classes": self.num_classes, "proposals": self.rpn.test_settings(),
                "box_weights": [float(w) for w in self.roi_cfg["box_weights"]],
                "score_thresh": float(t["score_thresh"]), "nms_thresh": float(t["nms_thresh"]),
                "max_per_image": int(t["max_per_image"]), "mask_thresh": float(t["mask_thresh"])}

    def export_spec(self, example=None):
        """Batch and image size may vary (images padded to a multiple of 32, as the recipes' PadImages).
        The predictor takes what `run_exported` reads and gives what the eval forward gives."""
        c, channels = self.fpn.out_channels, self.backbone.stem[0].conv._in_channels
        image = {"image": InputSpec([None, channels, None, None], "float32")}
        feats = {k: InputSpec([None, c, None, None], "float32") for k in FEATURE_KEYS}
        return {"inputs": {**image, "image_size": InputSpec([None, 2], "int64"),
                           "scale_factor": InputSpec([None, 2], "float32"), "orig_size": InputSpec([None, 2], "int64")},
                "outputs": ["bbox_num", "boxes", "scores", "labels", "masks"],
                "programs": {
                    "features": {"method": self.features_program, "inputs": image,
                                 "outputs": [*FEATURE_KEYS, *(f"rpn_{t}_{lv}" for t in ("logits", "deltas")
                                                              for lv in self.RPN_LEVELS)]},
                    "box": {"method": self.box_program,
                            "inputs": {**feats, "rois": InputSpec([None, 4], "float32"),
                                       "rois_num": InputSpec([None], "int32")},
                            "outputs": ["box_logits", "box_deltas"]},
                    "mask": {"method": self.mask_program,
                             "inputs": {**feats, "boxes": InputSpec([None, 4], "float32"),
                                        "boxes_num": InputSpec([None], "int32"), "labels": InputSpec([None], "int64")},
                             "outputs": ["mask_probs"]}},
                "settings": self.pipeline_settings(),
                "tensorrt": {"min_subgraph_size": 40}}   # PaddleDetection's TRT_MIN_SUBGRAPH for RCNN

    @staticmethod
    @paddle.no_grad()
    def run_exported(run, batch, settings):
        """The detections of a batch from its three networks: `run(name, inputs) -> {key: tensor}` runs
        "features", "box" or "mask" (this model's layers, or the exported programs). The proposals
        (rpn.test_proposals) between the first two; then per image: class scores,
        decoded boxes, per-class NMS and the best `max_per_image` (postprocess.detect), then the
        mask head on the kept boxes, boxes mapped to the original image and masks pasted there.
        Returns `bbox_num` [B] and per image `boxes`, `scores`, `labels`, `masks` (model docstring)."""
        s, C = settings, settings["num_classes"]
        batch = with_float(batch, "image")   # uint8 pixels (the reader's default): normalised on the device
        image_size = _numpy(batch["image_size"]).reshape(-1, 2)
        if len(image_size) != batch["image"].shape[0]:
            raise ConfigError(f"MaskRCNN: image_size has {len(image_size)} rows for {batch['image'].shape[0]} images")
        feats = run("features", {"image": batch["image"]})
        levels = MaskRCNN.RPN_LEVELS
        rois, rois_num = rpn.test_proposals(s["proposals"], [feats[f"rpn_logits_{lv}"] for lv in levels],
                                            [feats[f"rpn_deltas_{lv}"] for lv in levels], image_size)
        out = dict(run("box", {**{k: feats[k] for k in FEATURE_KEYS}, "rois": rois, "rois_num": rois_num}),
                   rois=rois, rois_num=rois_num)
        starts = np.cumsum([0] + out["rois_num"].numpy().tolist())
        dets = []
        for i in range(len(image_size)):
            a, b = int(starts[i]), int(starts[i + 1])
            dets.append(postprocess.detect(out["box_logits"][a:b], out["box_deltas"][a:b], out["rois"][a:b],
                                           image_size[i], C, s["box_weights"], s["score_thresh"], s["nms_thresh"],
                                           s["max_per_image"]))
        boxes_in = [d[0] for d in dets]
        if sum(b.shape[0] for b in boxes_in):
            probs = run("mask", {**{k: feats[k] for k in FEATURE_KEYS}, "boxes": paddle.concat(boxes_in),
                                 "boxes_num": paddle.to_tensor(np.array([b.shape[0] for b in boxes_in], np.int32)),
                                 "labels": paddle.concat([d[2] for d in dets])})["mask_probs"].numpy()
        else:
            probs = np.zeros((0, 1, 1), np.float32)
        scale = _numpy(batch["scale_factor"]).reshape(-1, 2) if "scale_factor" in batch \
            else np.ones((len(dets), 2), np.float32)
        orig = _numpy(batch["orig_size"]).reshape(-1, 2) if "orig_size" in batch else image_size
        result = {"bbox_num": None, "boxes": [], "scores": [], "labels": [], "masks": []}   # the docstring's order
        start = 0
        for i, (boxes, scores, labels) in enumerate(dets):
            k = boxes.shape[0]
            h, w = int(orig[i][0]), int(orig[i][1])
            boxes_orig = postprocess.to_original(boxes.numpy().reshape(-1, 4), scale[i], (h, w))
            # boxes empty after clipping are dropped, as PaddleDetection's results (label -1, skipped)
            keep = np.flatnonzero((boxes_orig[:, 2] > boxes_orig[:, 0]) & (boxes_orig[:, 3] > boxes_orig[:, 1]))
            masks = postprocess.paste_masks(probs[start:start + k][keep], boxes_orig[keep], h, w, s["mask_thresh"])
            start += k
            result["boxes"].append(paddle.to_tensor(boxes_orig[keep]))
            result["scores"].append(paddle.to_tensor(scores.numpy().reshape(-1)[keep]))
            result["labels"].append(paddle.to_tensor(labels.numpy().reshape(-1)[keep].astype(np.int64)))
            result["masks"].append(paddle.to_tensor(masks))
        result["bbox_num"] = paddle.to_tensor(np.array([b.shape[0] for b in result["boxes"]], np.int64))
        return result

    # ------------------------------------------------------------------------------ training
    def _targets(self, batch):
        """The ground truth as the device's tensors, per image. Read from the batch as it is: no
        check of the class ids (it would read them back; the engine compares the dataset's
        num_classes with the model's before the first step). Polygons come packed by the reader
        (`gt_poly_points`, `gt_poly_counts`, readers/coco.py pack_polygons), before the step."""
        for key in ("gt_boxes", "gt_classes"):
            if key not in batch:
                raise ConfigError(f"MaskRCNN: the training batch has no '{key}' (keys: {sorted(batch)}); "
                                  f"list gt_boxes, gt_classes, gt_crowd, gt_poly_points, gt_poly_counts as the "
                                  f"collate's ragged keys")
        boxes = [b.reshape([-1, 4]) for b in _per_image(batch["gt_boxes"])]
        classes = [c.reshape([-1]).astype("int64") for c in _per_image(batch["gt_classes"])]
        crowd = [c.reshape([-1]).astype("bool") for c in _per_image(batch["gt_crowd"])] if "gt_crowd" in batch \
            else [paddle.zeros([b.shape[0]], "bool") for b in boxes]
        if "gt_poly_points" not in batch or "gt_poly_counts" not in batch:
            raise ConfigError(f"MaskRCNN: the training batch has no packed polygons gt_poly_points and gt_poly_counts "
                              f"(readers/coco.py pack_polygons makes them from gt_polygons; keys: {sorted(batch)})")
        points, counts = _per_image(batch["gt_poly_points"]), _per_image(batch["gt_poly_counts"])
        return {"boxes": boxes, "classes": classes, "crowd": crowd, "points": points, "counts": counts}

    def _roi_losses(self, feats, rois, rois_num, targets):
        """Box and mask losses of the batch's proposals (rois [M, 4] image by image, rois_num [B]),
        sampled without splitting them per image on the host (roi_heads.sample_rois_batch)."""
        r, C = self.roi_cfg, self.num_classes
        s = roi_heads.sample_rois_batch(rois, rois_num, targets["boxes"], targets["classes"], targets["crowd"], C,
                                        r["batch_size_per_image"], r["fg_fraction"], r["fg_thresh"], r["bg_thresh"],
                                        r["use_random"], self.crowd_ignore_iou)
        if not s["classes"].shape[0]:
            zero = _zero_loss(self.box_head)
            return {"loss_bbox_cls": zero, "loss_bbox_reg": zero, "loss_mask": _zero_loss(self.mask_head)}
        num_rois = paddle.to_tensor(s["num_rois"], "int32")          # host-known counts: host -> device
        roi_feats = self.box_roi(feats, s["rois"], num_rois)
        logits, deltas = self.box_head(roi_feats)
        losses = roi_heads.box_loss(logits, deltas, s["rois"], s["classes"], s["target_boxes"], C, r["box_weights"])
        # mask head: the foreground RoIs (each image's first rows), targets rasterised from the
        # matched instance's polygons
        starts = [sum(s["num_rois"][:i]) for i in range(len(s["num_rois"]))]
        per_image = [paddle.arange(a, a + n, dtype="int64") for a, n in zip(starts, s["num_rois"])]
        pick = lambda key: [paddle.gather(s[key], rows) for rows in per_image]  # noqa: E731
        fg_rois, fg_classes, fg_targets, empty = roi_heads.mask_targets(
            pick("rois"), pick("classes"), pick("matched"), targets["points"], targets["counts"], C,
            2 * r["mask_resolution"], num_fg=s["num_fg"])
        if not fg_classes.shape[0]:
            losses["loss_mask"] = _zero_loss(self.mask_head)
            return losses
        fg_num = paddle.to_tensor(s["num_fg"], "int32")
        mask_logits = self.mask_head(self.mask_roi(feats, paddle.concat(fg_rois), fg_num))
        losses["loss_mask"] = roi_heads.mask_loss(mask_logits, fg_classes, fg_targets, empty)
        return losses


def _per_image(value):
    """A ragged key's per-image tensors (a stacked tensor when the collate did not list it ragged)."""
    return list(paddle.unbind(value)) if isinstance(value, paddle.Tensor) else list(value)


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _zero_loss(layer):
    """0 that still reaches every parameter of `layer`: data parallel expects a gradient for each."""
    return paddle.add_n([p.sum() for p in layer.parameters()]) * 0.0


# ------------------------------------------------------------------------------------- key maps
def ppdet_key_map(depth=None):
    """[(regex, replacement)] from PaddleDetection's MaskRCNN names to ours (every ResNet depth by
    default: the block names of R50 and R101 cannot collide)."""
    rules = resnet_key_map("ppdet", depth, "b", src_prefix=r"backbone\.", dst_prefix="backbone.")
    for k in range(4):  # res2..res5 -> level index 0..3 (res5's lateral has no "_lateral" suffix)
        lateral = "fpn_inner_res5_sum" if k == 3 else f"fpn_inner_res{k + 2}_sum_lateral"
        rules += [(rf"neck\.{lateral}\.(weight|bias)", rf"fpn.lateral_convs.{k}.\g<1>"),
                  (rf"neck\.fpn_res{k + 2}_sum\.(weight|bias)", rf"fpn.output_convs.{k}.\g<1>"),
                  (rf"mask_head\.head\.upsample\.mask_inter_feat_{k + 1}\.(weight|bias)",
                   rf"mask_head.convs.{k}.\g<1>")]
    return rules + [
        (r"rpn_head\.rpn_feat\.rpn_conv\.(weight|bias)", r"rpn.head.conv.\g<1>"),
        (r"rpn_head\.rpn_rois_score\.(weight|bias)", r"rpn.head.objectness.\g<1>"),
        (r"rpn_head\.rpn_rois_delta\.(weight|bias)", r"rpn.head.deltas.\g<1>"),
        (r"bbox_head\.head\.(fc6|fc7)\.(weight|bias)", r"box_head.\g<1>.\g<2>"),
        (r"bbox_head\.bbox_score\.(weight|bias)", r"box_head.cls_score.\g<1>"),
        (r"bbox_head\.bbox_delta\.(weight|bias)", r"box_head.bbox_pred.\g<1>"),
        (r"mask_head\.head\.upsample\.conv5_mask\.(weight|bias)", r"mask_head.deconv.\g<1>"),
        (r"mask_head\.mask_fcn_logits\.(weight|bias)", r"mask_head.logits.\g<1>")]


def ppdet_imagenet_key_map(depth=None):
    """PaddleDetection's ImageNet backbone files: the ResNet alone, keys with or without 'backbone.'."""
    return resnet_key_map("ppdet", depth, "b", src_prefix=r"(?:backbone\.)?", dst_prefix="backbone.")


# ------------------------------------------------------------------------------------ pretrained
_PPDET_SOURCE = ("PaddleDetection 2.x .pdparams (MaskRCNN: backbone.res2.res2a.branch2a.conv, neck.fpn_inner_"
                 "res2_sum_lateral, rpn_head.rpn_feat.rpn_conv, bbox_head.head.fc6, mask_head.mask_fcn_logits); "
                 "background is the last of the 81 box classes")
_MODEL_ZOO = ("PaddleDetection configs/mask_rcnn/README.md (COCO val2017; 8 GPUs x 1 image, 1x = 12 epochs, "
              "2x = 24)")
_NEW_PARTS = [r"(fpn|rpn|box_head|mask_head)\..*"]   # what an ImageNet backbone file does not hold

WEIGHTS.add(PretrainedEntry(
    name="mask_rcnn_r50_fpn_1x_coco",
    model="MaskRCNN",
    urls=["https://paddledet.bj.bcebos.com/models/mask_rcnn_r50_fpn_1x_coco.pdparams"],
    source=_PPDET_SOURCE,
    key_map=ppdet_key_map(),
    model_args={"num_classes": 80},
    metrics={"bbox_ap": 0.392, "segm_ap": 0.356},
    metrics_source=_MODEL_ZOO,
    dataset="COCO val2017",
    num_params=44120816,
    config="configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml",
    reproduced="official backbone, FPN, RPN, box head and mask head outputs matched on golden weights "
               "(RoIAlign aligned=True, as trained, and False); demo recipe trained (see its family page); not "
               "downloaded, COCO not run here",
))

WEIGHTS.add(PretrainedEntry(
    name="mask_rcnn_r50_fpn_2x_coco",
    model="MaskRCNN",
    urls=["https://paddledet.bj.bcebos.com/models/mask_rcnn_r50_fpn_2x_coco.pdparams"],
    source=_PPDET_SOURCE,
    key_map=ppdet_key_map(),
    model_args={"num_classes": 80},
    metrics={"bbox_ap": 0.405, "segm_ap": 0.367},
    metrics_source=_MODEL_ZOO,
    dataset="COCO val2017",
    num_params=44120816,
    config="configs/vision/mask_rcnn/mask_rcnn_r50_fpn_2x_coco.yaml",
    reproduced="same architecture and key map as mask_rcnn_r50_fpn_1x_coco; not downloaded, COCO not run here",
))

WEIGHTS.add(PretrainedEntry(
    name="mask_rcnn_r101_fpn_1x_coco",
    model="MaskRCNN",
    urls=["https://paddledet.bj.bcebos.com/models/mask_rcnn_r101_fpn_1x_coco.pdparams"],
    source=_PPDET_SOURCE,
    key_map=ppdet_key_map(),
    model_args={"num_classes": 80, "backbone": {"depth": 101}},
    metrics={"bbox_ap": 0.406, "segm_ap": 0.366},
    metrics_source=_MODEL_ZOO,
    dataset="COCO val2017",
    num_params=63060720,
    config="configs/vision/mask_rcnn/mask_rcnn_r101_fpn_1x_coco.yaml",
    reproduced="key map covers the R101 block names (res4b1..res4b22); not downloaded, COCO not run here",
))

WEIGHTS.add(PretrainedEntry(
    name="mask_rcnn_r50_imagenet_ppdet",
    model="MaskRCNN",
    urls=["https://paddledet.bj.bcebos.com/models/pretrained/ResNet50_cos_pretrained.pdparams"],
    source="PaddleDetection ImageNet backbone .pdparams (ResNet-50 in ppdet names: conv1.conv1.conv, "
           "res2.res2a.branch2a.conv/.norm; with or without 'backbone.')",
    key_map=ppdet_imagenet_key_map(),
    ignore_keys=[r"(?:backbone\.)?(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
    head_keys=_NEW_PARTS,
    model_args={"num_classes": 80},
    dataset="ImageNet-1k",
    num_params=44120816,
    config="configs/vision/mask_rcnn/mask_rcnn_r50_fpn_1x_coco.yaml",
    reproduced="backbone key map tested on the official MaskRCNN table; not downloaded here",
    notes="pretrain_weights of PaddleDetection's configs/mask_rcnn/_base_/mask_rcnn_r50_fpn.yml: only the "
          "backbone is loaded, the FPN and heads keep their initialisation.",
))

WEIGHTS.add(PretrainedEntry(
    name="mask_rcnn_r101_imagenet_ppdet",
    model="MaskRCNN",
    urls=["https://paddledet.bj.bcebos.com/models/pretrained/ResNet101_pretrained.pdparams"],
    source="PaddleDetection ImageNet backbone .pdparams (ResNet-101 in ppdet names; with or without 'backbone.')",
    key_map=ppdet_imagenet_key_map(),
    ignore_keys=[r"(?:backbone\.)?(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
    head_keys=_NEW_PARTS,
    model_args={"num_classes": 80, "backbone": {"depth": 101}},
    dataset="ImageNet-1k",
    num_params=63060720,
    config="configs/vision/mask_rcnn/mask_rcnn_r101_fpn_1x_coco.yaml",
    reproduced="key map only; not downloaded here",
    notes="pretrain_weights of PaddleDetection's configs/mask_rcnn/mask_rcnn_r101_fpn_1x_coco.yml.",
))
