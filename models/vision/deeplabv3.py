"""DeepLabV3 (Chen et al. 2017, "Rethinking Atrous Convolution") on the shared ResNet, as PaddleSeg builds it.

PaddleSeg (paddleseg/models/deeplab.py, layers/pyramid_pool.py @d7975e7): the last backbone stage
feeds ASPP; ASPP has one branch per rate (rate 1: 1x1 conv, else 3x3 with dilation = padding = rate;
each conv with a bias, then BN + ReLU), an image-pooling branch (global average, 1x1 conv without
bias, BN, ReLU, bilinear back to the feature size), a 1x1 projection of the concatenation (bias, BN,
ReLU) and dropout 0.1; a 1x1 classifier; bilinear upsampling to the input (align_corners False).
Rates: (1, 6, 12, 18) at output stride 16, (1, 12, 24, 36) at 8 (PaddleSeg's docstring).

Options beyond PaddleSeg's DeepLabV3: an auxiliary FCN head on stage 3 (torchvision / MMSegmentation:
3x3 conv to 256, BN, ReLU, dropout 0.1, 1x1 classifier; MMSegmentation weighs its loss 0.4), OHEM
cross entropy (PaddleSeg's OhemCrossEntropyLoss), backbone recompute (`backbone.recompute`).

Evaluation (eval mode) returns `label_map` int32 [B, H, W]: the arg-max of the logits of the whole
image, or of sliding windows (`slide_crop_size`, `slide_stride`, both [w, h] as PaddleSeg's
`--crop_size/--stride`: window logits summed where they overlap, divided by the count), averaged over
`test_scales` (image resized by each scale, logits resized back, bilinear) and the horizontal flip
(`test_flip`): PaddleSeg's `infer.inference` / `aug_inference` (the mean of the logits).

Input: `image` [B, 3, H, W], uint8 with `image_normalize` (Normalize's default, normalised on the
device by models/pixels.py; padding from PadImages comes out 0.0) or float32.

Our parameter names: backbone.* (models/vision/resnet.py), aspp.branches.{i}.{conv,bn}.*,
aspp.pool.{conv,bn}.*, aspp.project.{conv,bn}.*, cls.{weight,bias}, aux.{conv,bn,cls}.*; PaddleSeg's
(`backbone.conv1_1._conv.weight`, `head.aspp.aspp_blocks.0._conv.weight`, `head.cls.weight`) load
through `paddleseg_key_map`.
"""
import math
import typing

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

import ops
from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.pixels import with_float
from models.vision.resnet import build_backbone, resnet_key_map

ASPP_RATIOS = {16: [1, 6, 12, 18], 8: [1, 12, 24, 36]}
DEFAULT_BACKBONE = {"name": "ResNet", "depth": 50, "variant": "d", "output_stride": 8, "multi_grid": [1, 2, 4]}


class ConvBNReLU(nn.Layer):
    def __init__(self, cin, cout, kernel, dilation=1, bias=True):
        super().__init__()
        self.conv = nn.Conv2D(cin, cout, kernel, padding=dilation * (kernel - 1) // 2, dilation=dilation,
                              bias_attr=None if bias else False)
        self.bn = nn.BatchNorm2D(cout)

    def forward(self, x):
        return ops.conv_bn_act(x, self.conv, self.bn)


class ASPP(nn.Layer):
    def __init__(self, cin, channels, ratios, image_pooling=True, dropout=0.1, align_corners=False):
        super().__init__()
        self.branches = nn.LayerList([ConvBNReLU(cin, channels, 1 if r == 1 else 3, dilation=r) for r in ratios])
        self.pool = ConvBNReLU(cin, channels, 1, bias=False) if image_pooling else None
        self.project = ConvBNReLU(channels * (len(ratios) + (1 if image_pooling else 0)), channels, 1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.align_corners = align_corners

    def forward(self, x):
        outs = [b(x) for b in self.branches]
        if self.pool is not None:
            pooled = self.pool(F.adaptive_avg_pool2d(x, 1))
            outs.append(F.interpolate(pooled, x.shape[2:], mode="bilinear", align_corners=self.align_corners))
        y = self.project(ops.concat_channels(outs))
        return self.dropout(y) if self.dropout is not None else y


class FCNHead(nn.Layer):
    """The auxiliary head: 3x3 conv + BN + ReLU, dropout, 1x1 classifier."""

    def __init__(self, cin, channels, num_classes, dropout=0.1):
        super().__init__()
        self.conv = ConvBNReLU(cin, channels, 3, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.cls = nn.Conv2D(channels, num_classes, 1)

    def forward(self, x):
        y = self.conv(x)
        return self.cls(ops.float32(self.dropout(y) if self.dropout is not None else y))


def segmentation_loss(logits, label, ignore_index=255, ohem_thresh=None, ohem_min_kept=0):
    """Pixel cross entropy averaged over the pixels that count (PaddleSeg's CrossEntropyLoss: the sum
    over non-ignored pixels / their number, 0 when there are none).

    With `ohem_thresh` (PaddleSeg's OhemCrossEntropyLoss): when more than `ohem_min_kept` pixels are
    valid, only pixels whose true-class probability is below a threshold count; the threshold is
    `ohem_thresh`, raised to the `ohem_min_kept`-th smallest probability when that is higher, so at
    least about `ohem_min_kept` hard pixels are kept.
    """
    label = label.astype("int64")
    valid = label != ignore_index
    safe = paddle.where(valid, label, paddle.zeros_like(label))
    logits_nhwc = logits.transpose([0, 2, 3, 1])
    loss = F.cross_entropy(logits_nhwc, safe.unsqueeze(-1), reduction="none", axis=-1).squeeze(-1)
    mask = valid.astype(loss.dtype)
    if ohem_thresh is not None:
        num_valid = int(valid.astype("int64").sum().item())
        if ohem_min_kept < num_valid:
            with paddle.no_grad():
                prob = paddle.exp(-loss.detach())       # softmax probability of the true class
                prob = paddle.where(valid, prob, paddle.full_like(prob, 2.0))
                thresh = float(ohem_thresh)
                if ohem_min_kept > 0:
                    thresh = max(thresh, paddle.kthvalue(prob.reshape([-1]), ohem_min_kept)[0].item())
                mask = mask * (prob < thresh).astype(mask.dtype)
    mask.stop_gradient = True
    return (loss * mask).mean() / (mask.mean() + 1e-8)


@MODELS.register("DeepLabV3")
class DeepLabV3(ZooModel):
    """Args:
        num_classes: classes of the classifier (19 Cityscapes, 21 VOC).
        backbone: ResNet config; default ResNet-50-vd at output stride 8 with multi-grid [1, 2, 4]
            (PaddleSeg's ResNet50_vd); `variant: b` is ResNet-v1b; `recompute: true` trades compute
            for activation memory. Its `out_indices` are set by the model.
        aspp_ratios: ASPP rates; default from the backbone's output stride (16: 1,6,12,18; 8: 1,12,24,36).
        aspp_channels: ASPP width (PaddleSeg aspp_out_channels 256).
        image_pooling: the ASPP image-level branch.
        dropout: after the ASPP projection (PaddleSeg 0.1).
        align_corners: of every bilinear resize (PaddleSeg recipes: False).
        aux_weight: > 0 adds the auxiliary FCN head on stage 3, its loss weighted by this.
        aux_channels: width of the auxiliary head.
        ignore_index: the label value the losses skip (void, borders, padding): the reader's.
        loss: `ce`: pixel cross entropy; `ohem`: only the hard pixels count (PaddleSeg's
            OhemCrossEntropyLoss).
        ohem_thresh: with `loss: ohem`, pixels whose true-class probability is below this count
            (PaddleSeg's default 0.7).
        ohem_min_kept: with `loss: ohem`, the threshold is raised so that at least about this many
            pixels per batch count (PaddleSeg's default 10000).
        slide_crop_size: the window [w, h] of sliding-window evaluation (with `slide_stride`; unset:
            the whole image at once), for images too large to infer in one piece.
        slide_stride: the step [w, h] between windows, at most the window (overlaps are averaged).
        test_scales: evaluation runs the image resized by each scale and averages the logits (resized
            back); [1.0]: one pass.
        test_flip: evaluation also runs the horizontally flipped image and averages its logits in.
    """

    head_keys = [r"cls\.(weight|bias)", r"aux\..*"]   # replaced when fine-tuning to other classes

    def weights(self):
        return Weights(head_keys=self.head_keys, backbone=self.backbone)

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 19, backbone: dict = None, aspp_ratios: list = None,
                 aspp_channels: int = 256, image_pooling: bool = True, dropout: float = 0.1,
                 align_corners: bool = False, aux_weight: float = 0.0, aux_channels: int = 256,
                 ignore_index: int = 255, loss: typing.Literal["ce", "ohem"] = "ce", ohem_thresh: float = 0.7,
                 ohem_min_kept: int = 10000, slide_crop_size: list = None, slide_stride: list = None,
                 test_scales: list = (1.0,), test_flip: bool = False):
        super().__init__()
        if num_classes < 1:
            raise ConfigError(f"DeepLabV3: num_classes must be >= 1, got {num_classes}")
        if loss not in ("ce", "ohem"):
            raise ConfigError(f"DeepLabV3: loss '{loss}' must be 'ce' or 'ohem'")
        if aux_weight < 0:
            raise ConfigError(f"DeepLabV3: aux_weight must be >= 0, got {aux_weight}")
        self.backbone = build_backbone(backbone or DEFAULT_BACKBONE, out_indices=[0, 1, 2, 3])
        if self.backbone.fc is not None:
            raise ConfigError("DeepLabV3: the backbone must not have a classifier (backbone.num_classes: 0)")
        stride = getattr(self.backbone, "output_stride", None)
        if aspp_ratios is None:
            if stride not in ASPP_RATIOS:
                raise ConfigError(f"DeepLabV3: no default ASPP rates for output stride {stride}; "
                                  f"set backbone.output_stride to 8 or 16, or give aspp_ratios")
            aspp_ratios = ASPP_RATIOS[stride]
        if not aspp_ratios or any(int(r) < 1 for r in aspp_ratios):
            raise ConfigError(f"DeepLabV3: aspp_ratios must be positive integers, got {aspp_ratios}")
        self.num_classes, self.ignore_index, self.align_corners = num_classes, ignore_index, align_corners
        self.loss_name, self.ohem_thresh, self.ohem_min_kept = loss, ohem_thresh, ohem_min_kept
        self.aux_weight = aux_weight
        chans = self.backbone.stage_channels
        self.aspp = ASPP(chans[3], aspp_channels, [int(r) for r in aspp_ratios], image_pooling, dropout,
                         align_corners)
        self.cls = nn.Conv2D(aspp_channels, num_classes, 1)
        self.aux = FCNHead(chans[2], aux_channels, num_classes) if aux_weight > 0 else None
        self.slide = self._check_slide(slide_crop_size, slide_stride)
        scales = [float(s) for s in (test_scales or [1.0])]
        if any(s <= 0 for s in scales):
            raise ConfigError(f"DeepLabV3: test_scales must be > 0, got {list(test_scales)}")
        self.test_scales, self.test_flip = scales, test_flip

    @staticmethod
    def _check_slide(crop, stride):
        if crop is None and stride is None:
            return None
        pairs = [crop, stride]
        if any(p is None or len(p) != 2 or min(int(v) for v in p) < 1 for p in pairs):
            raise ConfigError(f"DeepLabV3: slide_crop_size and slide_stride must both be [w, h] of positive "
                              f"integers, got {crop} and {stride}")
        if stride[0] > crop[0] or stride[1] > crop[1]:
            raise ConfigError(f"DeepLabV3: slide_stride {stride} larger than slide_crop_size {crop} would leave "
                              f"pixels without a window")
        return [int(v) for v in crop], [int(v) for v in stride]

    # ------------------------------------------------------------------------------ pieces
    def head_logits(self, feats):
        """Classifier logits at the feature resolution (PaddleSeg's `head(feats)[0]`)."""
        return self.cls(ops.float32(self.aspp(feats[3])))   # fp32 logits (ops.Precision.bf16_act)

    def _up(self, logits, size):
        return F.interpolate(logits, size, mode="bilinear", align_corners=self.align_corners)

    def logits(self, x):
        """Logits [B, C, H, W] at the input size (PaddleSeg's `model(x)[0]`)."""
        return self._up(self.head_logits(self.backbone(x)), x.shape[2:])

    def slide_logits(self, x):
        """Sliding-window logits of `x` (see `slide_logits` below)."""
        return slide_logits(self.logits, x, *self.slide)

    def predict_logits(self, x):
        """Evaluation logits at the input size: whole image or sliding windows, averaged over the
        test scales and flips."""
        return aggregate_logits(self.logits, x, self.test_scales, self.test_flip, self.slide, self.align_corners)

    # ------------------------------------------------------------------------------ forward
    def forward(self, batch):
        batch = with_float(batch, "image")   # uint8 pixels from the reader: normalised here, on the device
        x = batch["image"]
        if not self.training:
            return self.run_exported(self.run_program, batch, self.pipeline_settings())
        if "label" not in batch:
            raise ConfigError("DeepLabV3: the training batch has no 'label' (int [B, H, W])")
        label = batch["label"]
        if list(label.shape) != [x.shape[0]] + list(x.shape[2:]):
            raise ConfigError(f"DeepLabV3: label {list(label.shape)} does not match image {list(x.shape)}")
        feats = self.backbone(x)
        seg = self._loss(self._up(self.head_logits(feats), x.shape[2:]), label)
        if self.aux is None:
            return {"loss": seg}
        aux = self._loss(self._up(self.aux(feats[2]), x.shape[2:]), label)
        return {"loss": seg + self.aux_weight * aux, "loss_seg": seg, "loss_aux": aux}

    # ------------------------------------------------------------------------------ inference
    # The network (image -> logits at its size) is the one exported program; the windows, scales,
    # flips and the arg-max are `run_exported`, the Python the eval forward runs around this model's
    # own network and the predictor (deploy/predictor.py, `exported_runner`) around the exported one.
    PROGRAMS = {"model": "export_logits"}

    def run_program(self, name, inputs):
        return getattr(self, self.PROGRAMS[name])(inputs)

    def export_logits(self, batch):
        return {"logits": self.logits(batch["image"])}

    def pipeline_settings(self):
        return {"test_scales": [float(s) for s in self.test_scales], "test_flip": bool(self.test_flip),
                "slide": [[int(d) for d in v] for v in self.slide] if self.slide else None,
                "align_corners": bool(self.align_corners)}

    def export_spec(self, example=None):
        """Batch and image size may vary."""
        image = {"image": InputSpec([None, self.backbone.stem[0].conv._in_channels, None, None], "float32")}
        return {"inputs": image, "outputs": ["label_map"],
                "programs": {"model": {"method": self.export_logits, "inputs": image, "outputs": ["logits"]}},
                "settings": self.pipeline_settings()}

    @staticmethod
    @paddle.no_grad()
    def run_exported(run, batch, settings):
        """`label_map` int32 [B, H, W] from the network `run("model", {"image": x}) -> {"logits": ...}`
        applied to the whole image or its windows, at each test scale, flipped or not."""
        image = with_float(batch, "image")["image"]
        image = image if isinstance(image, paddle.Tensor) else paddle.to_tensor(image)
        logits = aggregate_logits(lambda x: run("model", {"image": x})["logits"], image, settings["test_scales"],
                                  settings["test_flip"], settings["slide"], settings["align_corners"])
        return {"label_map": logits.argmax(axis=1).astype("int32")}

    def _loss(self, logits, label):
        thresh = self.ohem_thresh if self.loss_name == "ohem" else None
        return segmentation_loss(logits, label, self.ignore_index, thresh, self.ohem_min_kept)


def slide_logits(run, x, crop, stride):
    """Sliding windows (PaddleSeg's rule) of `run` (image -> logits at its size): rows =
    ceil((H - h) / stride_h) + 1 (1 when H <= h), the last window of a row or column shifted back
    inside the image; the logits are summed where windows overlap and divided by the number of
    windows that cover each pixel. crop, stride: [w, h]."""
    (cw, ch), (sw, sh) = crop, stride
    H, W = x.shape[2:]
    rows = 1 if H <= ch else math.ceil((H - ch) / sh) + 1
    cols = 1 if W <= cw else math.ceil((W - cw) / sw) + 1
    total, count = 0, np.zeros([1, 1, H, W], np.float32)
    for r in range(rows):
        for c in range(cols):
            y2, x2 = min(r * sh + ch, H), min(c * sw + cw, W)
            y1, x1 = max(y2 - ch, 0), max(x2 - cw, 0)
            window = run(x[:, :, y1:y2, x1:x2])
            total = total + F.pad(window, [x1, W - x2, y1, H - y2])
            count[:, :, y1:y2, x1:x2] += 1
    return total / paddle.to_tensor(count)


def aggregate_logits(run, x, scales=(1.0,), flip=False, slide=None, align_corners=False):
    """Evaluation logits of `run` (image -> logits at its size) at the size of x: the whole image or
    sliding windows (`slide` = (crop, stride)), averaged over the scales (image resized by each,
    logits resized back, bilinear) and the horizontal flip (PaddleSeg's aug_inference)."""
    H, W = x.shape[2:]
    view = (lambda im: slide_logits(run, im, *slide)) if slide else run
    total, n = 0, 0
    for s in scales:
        size = [int(H * s + 0.5), int(W * s + 0.5)]
        xs = x if size == [H, W] else F.interpolate(x, size, mode="bilinear", align_corners=align_corners)
        for flipped in ([False, True] if flip else [False]):
            out = view(paddle.flip(xs, axis=[3]) if flipped else xs)
            out = paddle.flip(out, axis=[3]) if flipped else out
            total = total + (out if size == [H, W] else
                             F.interpolate(out, [H, W], mode="bilinear", align_corners=align_corners))
            n += 1
    return total / n if n > 1 else total


# ---------------------------------------------------------------------------------- key maps
def paddleseg_key_map(depth=None):
    """PaddleSeg DeepLabV3 names -> ours (backbone ResNet*_vd of any depth with depth=None)."""
    bn = r"(weight|bias|_mean|_variance)"
    return resnet_key_map("paddleseg", depth, "d", src_prefix=r"backbone\.", dst_prefix="backbone.") + [
        (r"head\.aspp\.aspp_blocks\.(\d+)\._conv\.(weight|bias)", r"aspp.branches.\1.conv.\2"),
        (rf"head\.aspp\.aspp_blocks\.(\d+)\._batch_norm\.{bn}", r"aspp.branches.\1.bn.\2"),
        (r"head\.aspp\.global_avg_pool\.1\._conv\.weight", "aspp.pool.conv.weight"),
        (rf"head\.aspp\.global_avg_pool\.1\._batch_norm\.{bn}", r"aspp.pool.bn.\1"),
        (r"head\.aspp\.conv_bn_relu\._conv\.(weight|bias)", r"aspp.project.conv.\1"),
        (rf"head\.aspp\.conv_bn_relu\._batch_norm\.{bn}", r"aspp.project.bn.\1"),
        (r"head\.cls\.(weight|bias)", r"cls.\1"),
    ]


# ---------------------------------------------------------------------------------- pretrained
# configs/deeplabv3/README.md of PaddleSeg @d7975e7: mIoU single-scale / flip / multi-scale + flip
_README = "PaddleSeg configs/deeplabv3/README.md"
_RELEASES = [
    # (name, depth, data, dataset text, config, mIoU ss, flip, ms+flip, url folder)
    ("deeplabv3_r50vd_os8_cityscapes_80k", 50, "cityscapes", "Cityscapes val (19 classes)",
     "configs/vision/deeplabv3/deeplabv3_r50vd_os8_80k_cityscapes.yaml", 0.7990, 0.8022, 0.8089,
     "cityscapes/deeplabv3_resnet50_os8_cityscapes_1024x512_80k"),
    ("deeplabv3_r101vd_os8_cityscapes_80k", 101, "cityscapes", "Cityscapes val (19 classes)",
     "configs/vision/deeplabv3/deeplabv3_r101vd_os8_80k_cityscapes.yaml", 0.8085, 0.8109, 0.8178,
     "cityscapes/deeplabv3_resnet101_os8_cityscapes_1024x512_80k"),
    ("deeplabv3_r50vd_os8_voc12aug_40k", 50, "voc", "Pascal VOC 2012 val (21 classes)",
     "configs/vision/deeplabv3/deeplabv3_r50vd_os8_40k_voc12aug.yaml", 0.7976, 0.8011, 0.8105,
     "pascal_voc12/deeplabv3_resnet50_os8_voc12aug_512x512_40k"),
    ("deeplabv3_r101vd_os8_voc12aug_40k", 101, "voc", "Pascal VOC 2012 val (21 classes)",
     "configs/vision/deeplabv3/deeplabv3_r101vd_os8_40k_voc12aug.yaml", 0.8062, 0.8087, 0.8159,
     "pascal_voc12/deeplabv3_resnet101_os8_voc12aug_512x512_40k"),
]
# trainable parameters: backbone + ASPP (1x1 + 3 dilated 3x3 + pooling 1x1 + projection) + classifier
_NUM_PARAMS = {(50, 19): 39068531, (101, 19): 58060659, (50, 21): 39069045, (101, 21): 58061173}

for _name, _depth, _data, _dataset, _config, _ss, _flip, _ms, _folder in _RELEASES:
    _classes = 19 if _data == "cityscapes" else 21
    WEIGHTS.add(PretrainedEntry(
        name=_name,
        config=_config,
        reproduced={50: "official PaddleSeg outputs matched on golden weights (R50-vd OS8, 19 classes); "
                        "not downloaded, not run on the dataset",
                    101: "key map of the R50 table (R101's bb_2_0..bb_2_22 follow the same rule, no "
                         "official R101 table checked); not downloaded, not run on the dataset"}[_depth],
        model="DeepLabV3",
        urls=[f"https://bj.bcebos.com/paddleseg/dygraph/{_folder}/model.pdparams"],
        source="PaddleSeg dygraph .pdparams (backbone.conv1_1._conv, backbone.bb_0_0.conv0, "
               "head.aspp.aspp_blocks.0._conv, head.cls)",
        key_map=paddleseg_key_map(_depth),
        model_args={"num_classes": _classes, "backbone": dict(DEFAULT_BACKBONE, depth=_depth)},
        metrics={"miou": _ss},
        metrics_source=f"{_README} (single scale; flip {100 * _flip:.2f}, multi-scale + flip "
                       f"{100 * _ms:.2f}; the recipe's cards are not stated, 4 implied)",
        dataset=_dataset,
        num_params=_NUM_PARAMS[(_depth, _classes)],
    ))
