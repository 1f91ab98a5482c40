"""TSN: a 2D ResNet on sparsely sampled frames, consensus by averaging the pooled features.

Segments share the backbone; the consensus is the mean of the pooled features (Fluid 1.x and
PaddleVideo 2.x alike), then dropout (2.x: 0.4; Fluid 1.x had none: `drop_rate: 0`) and fc.

Views (test-time crops/clips): `imgs` may be [B, V, T, C, H, W]; or [B, V*T, C, H, W] with `num_views`
set (eval only), grouped view-major (all T segments of view 0, then of view 1, ...), as
models/video/clips.py (shared with StNet) reads them.
`view_average: prob` averages the softmax scores of the views (MMAction2's `average_clips='prob'`);
`feature` averages the pooled features of all views and segments together, which is what
PaddleVideo 2.x does for its TenCrop x 25-segment test (the 250 crops enter the consensus as segments).
"""
import typing

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.static import InputSpec

from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.video.clips import as_float, classify, split_views
from models.vision.resnet import build_backbone, resnet_key_map

DEFAULT_BACKBONE = {"name": "ResNet", "depth": 50}


@MODELS.register("TSN")
class TSN(ZooModel):
    """Args:
        num_classes: the outputs of the fc: the dataset's classes (400 for Kinetics-400); checked against
            the reader's.
        backbone: backbone config, default {name: ResNet, depth: 50} (its last `out_indices` is used).
        drop_rate: dropout before the fc (PaddleVideo 2.x TSNHead 0.4; 0 = Fluid 1.x).
        fc_std: std of the normal fc weight init (TSNHead 0.01); bias starts at 0.
        num_views: the views (crops x clips) per video in a 5-D eval batch [B, V*T, C, H, W],
            grouped view-major (see module docstring).
        view_average: how the views of a video are combined: `prob` averages their softmax scores
            (MMAction2's average_clips='prob'); `feature` averages the pooled features of all views
            and segments together (PaddleVideo 2.x's TenCrop x 25-segment test).
    """

    def weights(self):   # the head: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"fc\.(weight|bias)"], backbone=self.backbone)

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 400, backbone: dict = None, drop_rate: float = 0.4,
                 fc_std: float = 0.01, num_views: int = 1,
                 view_average: typing.Literal["prob", "feature"] = "prob"):
        super().__init__()
        self.num_classes = num_classes
        if view_average not in ("prob", "feature"):
            raise ConfigError(f"TSN: view_average '{view_average}' must be 'prob' or 'feature'")
        if num_views < 1:
            raise ConfigError(f"TSN: num_views must be >= 1, got {num_views}")
        self.num_views, self.view_average = num_views, view_average
        self.backbone = build_backbone(backbone or DEFAULT_BACKBONE)
        self.dropout = nn.Dropout(drop_rate) if drop_rate > 0 else None
        self.fc = nn.Linear(self.backbone.out_channels[-1], num_classes,
                            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, fc_std)),
                            bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)))

    def segment_features(self, imgs):
        """[B, V, T, C, H, W] -> pooled features [B, V, T, D], one per segment."""
        b, v, t = imgs.shape[:3]
        feat = self.backbone(imgs.reshape([-1] + list(imgs.shape[3:])))[-1]
        return F.adaptive_avg_pool2d(feat, 1).reshape([b, v, t, -1])

    def head(self, feat):
        return self.fc(self.dropout(feat) if self.dropout is not None else feat)

    def export_spec(self, example=None):
        """Batch, views, segments and image size may vary; the layout (views as their own axis or
        not) is the example batch's, by default [B, T, C, H, W]."""
        ch = self.backbone.stem[0].conv._in_channels
        views = [None] if example is not None and example["imgs"].ndim == 6 else []
        return {"inputs": {"imgs": InputSpec([None] + views + [None, ch, None, None], "float32")},
                "outputs": ["logits", "probs"]}

    def forward(self, batch):
        imgs = split_views(as_float(batch), self.num_views, self.training, "TSN")
        feat = self.segment_features(imgs)
        if self.view_average == "feature":
            view_logits = self.head(feat.mean(axis=[1, 2])).unsqueeze(1)
        else:
            view_logits = self.head(feat.mean(axis=2))
        return classify(view_logits, batch.get("label"), self.training)


# ---------------------------------------------------------------------------------- pretrained
# depth=None: the block names of every depth (res4b1..res4b22 of ResNet-101 too), so a PaddleVideo file
# of any depth loads into TSN(backbone={depth: N}) through these entries or by layout detection
_PV_BACKBONE = resnet_key_map("paddlevideo", None, "b", src_prefix=r"(?:backbone\.)?", dst_prefix="backbone.")
_PV_TSN = _PV_BACKBONE + [(r"head\.fc\.(weight|bias)", r"fc.\g<1>")]
_TSN_ARGS = {"num_classes": 400, "backbone": {"name": "ResNet", "depth": 50}, "drop_rate": 0.4}
_TSN_NOTE = ("PaddleVideo tests with 25 segments x TenCrop and averages the features of all 250 crops "
             "(our view_average: feature).")

WEIGHTS.add(PretrainedEntry(
    name="tsn_r50_k400_3seg",
    config="configs/video/tsn/tsn_r50_100e_k400.yaml",
    reproduced="official outputs matched on golden weights (TSN-R50); demo recipe trained (see its family page); the full recipe needs Kinetics-400 (not run)",
    model="TSN",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo-release2.2/TSN_k400.pdparams"],
    source="PaddleVideo 2.x .pdparams (Recognizer2D: backbone.conv._conv, backbone.res2a.conv0, head.fc)",
    key_map=_PV_TSN,
    head_keys=[r"fc\.(weight|bias)"],
    model_args=_TSN_ARGS,
    metrics={"top1": 0.6981},
    metrics_source="PaddleVideo docs/en/model_zoo/recognition/tsn.md (trained with 3 segments; "
                   "test 25 segments x TenCrop, 224)",
    dataset="Kinetics-400 val",
    num_params=24327632,
    notes=_TSN_NOTE,
))

WEIGHTS.add(PretrainedEntry(
    name="tsn_r50_k400_8seg",
    config="configs/video/tsn/tsn_r50_8seg_100e_k400.yaml",
    reproduced="key map tested on the official parameter table; demo recipe trained (see its family page); not run on Kinetics-400",
    model="TSN",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo-release2.2/TSN_k400_8.pdparams"],
    source="PaddleVideo 2.x .pdparams (Recognizer2D: backbone.conv._conv, backbone.res2a.conv0, head.fc)",
    key_map=_PV_TSN,
    head_keys=[r"fc\.(weight|bias)"],
    model_args=_TSN_ARGS,
    metrics={"top1": 0.7170},
    metrics_source="PaddleVideo docs/en/model_zoo/recognition/tsn.md (trained with 8 segments; "
                   "test 25 segments x TenCrop, 224)",
    dataset="Kinetics-400 val",
    num_params=24327632,
    notes=_TSN_NOTE,
))

WEIGHTS.add(PretrainedEntry(
    name="tsn_r50_imagenet_init",
    config="configs/video/tsn/tsn_r50_45e_k400.yaml",
    reproduced="key map tested on the official TSN table (backbone part); not downloaded here",
    model="TSN",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo/PretrainModel/ResNet50_pretrain.pdparams"],
    source="PaddleVideo 2.x .pdparams (ImageNet ResNet-50 in PaddleVideo's backbone names)",
    key_map=_PV_BACKBONE,
    ignore_keys=[r"(?:head\.)?(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
    head_keys=[r"fc\.(weight|bias)"],
    model_args=_TSN_ARGS,
    dataset="ImageNet-1k",
    num_params=24327632,
    notes="Starting point of the TSN recipe: the backbone only; fc.weight/fc.bias are reported "
          "missing and keep their N(0, 0.01) init.",
))
