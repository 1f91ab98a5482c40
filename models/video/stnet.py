"""StNet (Kinetics-400 2018 winner's base network): super-images + temporal blocks + temporal Xception.

Each of the T segments stacks `seglen` consecutive RGB frames in the channels (15 for seglen 5), so the
ResNet's conv1 takes 3*seglen channels. Layout after PaddlePaddle/models PaddleCV/video
`models/stnet/stnet_res_model.py`:
- temporal block after res3 and res4: x + BN(ReLU(conv3d_{3x1x1}(x) + bias)) over [B, C, T, H, W];
- global average pool -> [B, 2048, T, 1] -> temporal Xception: BN; main branch depthwise (3,1) conv ->
  1x1 conv to 1024 -> BN + ReLU -> depthwise (3,1) conv -> 1x1 conv 1024; skip branch 1x1 conv 1024 on the
  BN output; add -> BN -> ReLU (all Xception/temporal convs have a bias);
- max over T -> fc (Uniform(+-1/sqrt(2048)) init) -> softmax cross-entropy.
ImageNet init: conv1's RGB kernel is averaged over RGB, divided by seglen and repeated to 3*seglen
channels (`inflate_conv1`); the temporal blocks, Xception and fc keep their initialisation.
`backbone.recompute: true` recomputes each ResNet stage's activations during backward (the temporal
blocks between stages keep theirs), as TSN and DeepLabV3 do.
"""
import functools
import math

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
from models.video.clips import as_float, classify, split_views
from models.vision.resnet import DEPTHS, ResNet, build_backbone, recompute_stage, resnet_key_map

_MSRA = paddle.ParamAttr(initializer=nn.initializer.KaimingUniform())  # Fluid MSRAInitializer default
_ZERO = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
XCEPTION_CHANNELS = 1024


class TemporalBlock(nn.Layer):
    """Residual (3,1,1) conv3d over the segments of each video."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv3D(channels, channels, (3, 1, 1), padding=(1, 0, 0),
                              weight_attr=_MSRA, bias_attr=_ZERO)
        self.bn = nn.BatchNorm3D(channels)

    def forward(self, x, seg_num):
        n, c, h, w = x.shape
        x5 = x.reshape([-1, seg_num, c, h, w]).transpose([0, 2, 1, 3, 4])
        y = x5 + self.bn(F.relu(self.conv(x5)))
        return y.transpose([0, 2, 1, 3, 4]).reshape([-1, c, h, w])


class TemporalXception(nn.Layer):
    """Separable temporal convs on [N, C, T, 1] with a 1x1 skip branch."""

    def __init__(self, cin, cout=XCEPTION_CHANNELS):
        super().__init__()

        def conv(i, o, k, groups=1):
            return nn.Conv2D(i, o, k, padding=(1, 0) if k == (3, 1) else 0, groups=groups,
                             weight_attr=_MSRA, bias_attr=_ZERO)

        self.bn_in = nn.BatchNorm2D(cin)
        self.dw1 = conv(cin, cin, (3, 1), groups=cin)
        self.pw1 = conv(cin, cout, 1)
        self.bn_mid = nn.BatchNorm2D(cout)
        self.dw2 = conv(cout, cout, (3, 1), groups=cout)
        self.pw2 = conv(cout, cout, 1)
        self.skip = conv(cin, cout, 1)
        self.bn_out = nn.BatchNorm2D(cout)

    def forward(self, x):
        # the layer package: paddle's CPU depthwise convolution is slow on these [N, C, T, 1] maps
        # (docs/performance.md#fused-operators); fp32 activations, as the rest of the head (ops.Precision.bf16_act)
        with ops.precision(bf16_act=False):
            x = self.bn_in(x)
            y = ops.conv_bn_act(ops.conv2d(x, self.dw1), self.pw1, self.bn_mid)
            y = ops.conv2d(ops.conv2d(y, self.dw2), self.pw2)
            return F.relu(self.bn_out(y + ops.conv2d(x, self.skip)))


@MODELS.register("StNet")
class StNet(ZooModel):
    """Args:
        num_classes: the outputs of the fc: the dataset's classes (400 for Kinetics-400); checked against
            the reader's.
        seglen: frames stacked per segment (conv1 takes 3*seglen channels). The number of segments
            comes from the input: `imgs` [B, T, 3*seglen, H, W] (train 7, test 25 in the recipe).
        backbone: ResNet config, default {name: ResNet, depth: 50}; in_channels is set to 3*seglen.
        num_views: views per video in a 5-D eval batch (same convention as TSN, probs averaged).
    """

    def weights(self):   # the head: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"fc\.(weight|bias)"], backbone=self.backbone)

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 400, seglen: int = 5, backbone: dict = None,
                 num_views: int = 1):
        super().__init__()
        self.num_classes = num_classes
        if seglen < 1 or num_views < 1:
            raise ConfigError(f"StNet: seglen and num_views must be >= 1, got {seglen}, {num_views}")
        self.seglen, self.num_views = seglen, num_views
        self.backbone = build_backbone(backbone or {"name": "ResNet", "depth": 50},
                                       in_channels=3 * seglen)
        if not isinstance(self.backbone, ResNet):
            raise ConfigError("StNet: backbone must be a ResNet (the temporal blocks sit between its stages)")
        ch = self.backbone.stage_channels
        self.temporal1 = TemporalBlock(ch[1])
        self.temporal2 = TemporalBlock(ch[2])
        self.xception = TemporalXception(ch[3])
        bound = 1.0 / math.sqrt(ch[3])
        self.fc = nn.Linear(XCEPTION_CHANNELS, num_classes,
                            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound)),
                            bias_attr=_ZERO)

    def export_spec(self, example=None):
        """Batch, views, segments and image size may vary; the layout (views as their own axis or
        not) is the example batch's, by default [B, T, C, H, W]."""
        views = [None] if example is not None and example["imgs"].ndim == 6 else []
        return {"inputs": {"imgs": InputSpec([None] + views + [None, 3 * self.seglen, None, None], "float32")},
                "outputs": ["logits", "probs"]}

    def forward(self, batch):
        imgs = split_views(as_float(batch), self.num_views, self.training, "StNet")
        b, v, t, c = imgs.shape[:4]
        if c != 3 * self.seglen:
            raise ConfigError(f"StNet: imgs has {c} channels per segment, seglen={self.seglen} needs "
                              f"{3 * self.seglen}")
        x = self.backbone.forward_stem(imgs.reshape([-1] + list(imgs.shape[3:])))
        remat = self.backbone.recompute and self.training and paddle.is_grad_enabled()
        for i, stage in enumerate(self.backbone.stages):
            x = recompute_stage(stage, x) if remat else stage(x)
            if i == 1:   # the temporal blocks (3-D conv) and the head compute in fp32 (ops.Precision.bf16_act)
                x = self.temporal1(ops.float32(x), t)
            elif i == 2:
                x = self.temporal2(ops.float32(x), t)
        x = F.adaptive_avg_pool2d(ops.float32(x), 1).reshape([b * v, t, -1]).transpose([0, 2, 1]).unsqueeze(-1)
        x = self.xception(x).max(axis=[2, 3])  # temporal max pool -> [B*V, 1024]
        return classify(self.fc(x).reshape([b, v, -1]), batch.get("label"), self.training)


# ------------------------------------------------------------------------- ImageNet init (conv1)
STEM_KEY = "backbone.stem.0.conv.weight"


def inflate_conv1(weight, seglen):
    """[out, 3, k, k] RGB kernel -> [out, 3*seglen, k, k]: RGB mean / seglen, repeated.

    On a segment of seglen identical frames the inflated conv equals the RGB conv applied to the
    frame's grey version (mean over RGB) in all three channels.
    """
    w = np.asarray(weight, dtype="float32")
    return np.repeat(w.mean(axis=1, keepdims=True) / seglen, 3 * seglen, axis=1)


def inflate_stem(state, seglen=5):
    """`convert` for ImageNet files: inflate our stem conv (if it still has 3 input channels)."""
    state = dict(state)
    w = state.get(STEM_KEY)
    if w is not None and tuple(np.shape(w))[1] == 3:
        state[STEM_KEY] = inflate_conv1(w.numpy() if hasattr(w, "numpy") else w, seglen)
    return state


# ---------------------------------------------------------------- Fluid 1.x names of STNET.pdparams
def _fluid_temporal_bn_names(depth):
    """Fluid numbers unnamed layers per type in build order: every ResNet BN (conv1, then per block
    branch2a/2b/2c and branch1) takes a batch_norm_<k> slot, so the two temporal BNs get the
    indices right after res3 and res4."""
    kind, blocks = DEPTHS[depth]
    per_block = 2 if kind == "basic" else 3
    after = [1 + sum(n * per_block + 1 for n in blocks[:s + 1]) for s in range(4)]
    return f"batch_norm_{after[1]}", f"batch_norm_{after[2] + 1}"


def stnet_fluid_key_map(depth=50):
    bn1, bn2 = _fluid_temporal_bn_names(depth)
    fluid_bn = {"w_0": "weight", "b_0": "bias", "w_1": "_mean", "w_2": "_variance"}
    rules = resnet_key_map("fluid", depth, "b", dst_prefix="backbone.")
    for ours, conv, bn in (("temporal1", "conv3d_0", bn1), ("temporal2", "conv3d_1", bn2)):
        rules += [(rf"{conv}\.w_0", f"{ours}.conv.weight"), (rf"{conv}\.b_0", f"{ours}.conv.bias")]
        rules += [(rf"{bn}\.{k}", f"{ours}.bn.{v}") for k, v in fluid_bn.items()]
    for theirs, ours in (("xception_bn", "bn_in"), ("xception_bndw", "bn_mid"), ("xception_bn2", "bn_out")):
        rules += [(rf"{theirs}\.{k}", f"xception.{ours}.{v}") for k, v in fluid_bn.items()]
    for theirs, ours in (("xception_att_conv", "dw1"), ("xception_att_2", "pw1"),
                         ("xception_att1", "dw2"), ("xception_att1_2", "pw2"), ("xception_dw", "skip")):
        rules += [(rf"{theirs}\.w_0", f"xception.{ours}.weight"), (rf"{theirs}\.b_0", f"xception.{ours}.bias")]
    rules += [(r"fc_0\.w_0", "fc.weight"), (r"fc_0\.b_0", "fc.bias")]
    return rules


_STNET_ARGS = {"num_classes": 400, "seglen": 5, "backbone": {"name": "ResNet", "depth": 50}}

WEIGHTS.add(PretrainedEntry(
    name="stnet_r50_imagenet_init",
    config="configs/video/stnet/stnet_r50_60e_k400.yaml",
    reproduced="conv1 inflation tested; not downloaded here",
    model="StNet",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo/PretrainModel/ResNet50_pretrain.pdparams"],
    source="PaddleVideo 2.x .pdparams (ImageNet ResNet-50 in PaddleVideo's backbone names)",
    key_map=resnet_key_map("paddlevideo", None, "b", src_prefix=r"(?:backbone\.)?", dst_prefix="backbone."),
    ignore_keys=[r"(?:head\.)?(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
    # an ImageNet trunk: the layers StNet adds to the ResNet start from their initialisation
    head_keys=[r"fc\.(weight|bias)", r"temporal[12]\..*", r"xception\..*"],
    convert=functools.partial(inflate_stem, seglen=5),
    model_args=_STNET_ARGS,
    dataset="ImageNet-1k",
    num_params=33158864,
    notes="Starting point of the StNet recipe (seglen 5): conv1 inflated to 15 channels. temporal1/2, "
          "xception and fc are reported missing on purpose and keep their initialisation, as in the "
          "original (which excluded fc, the new batch_norm, xception and conv3d parameters). The "
          "original used the same ImageNet ResNet-50 as a Fluid persistables archive "
          "(paddlemodels.bj.bcebos.com/video_classification/ResNet50_pretrained.tar.gz).",
))

WEIGHTS.add(PretrainedEntry(
    name="stnet_r50_k400_fluid",
    config="configs/video/stnet/stnet_r50_60e_k400.yaml",
    reproduced="demo recipe trained (see its family page); the Fluid file's key names are inferred, not checked against the file",
    model="StNet",
    urls=["https://paddlemodels.bj.bcebos.com/video_classification/STNET.pdparams"],
    source="PaddlePaddle/models PaddleCV/video (Fluid 1.7/1.8 fluid.save .pdparams, Fluid parameter names)",
    key_map=stnet_fluid_key_map(50),
    head_keys=[r"fc\.(weight|bias)"],
    model_args=_STNET_ARGS,
    metrics={"top1": 0.69},
    metrics_source="PaddlePaddle/models PaddleCV/video README (seg_num 25, seglen 5, single centre crop 256)",
    dataset="Kinetics-400 val",
    num_params=33158864,
    notes="Key names follow the explicit ParamAttr names of stnet_res_model.py and Fluid's unique-name "
          "rule for the unnamed conv3d/batch_norm layers; they were not checked against the file "
          "(not downloadable here): a mismatch shows up as missing/unexpected keys when loading.",
))
