"""ResNet backbone shared by TSN, StNet, DeepLabV3 and Mask R-CNN.

One implementation covers the layouts of the Paddle kits whose weights we load:
- variant "b" (ResNet-B / torchvision: stride in the 3x3 conv, 7x7 stem): PaddleVideo, PaddleDetection,
  the Fluid 1.x video models;
- variant "d" (ResNet-vd: 3x3-3x3-3x3 stem 32/32/64, 2x2 average pool before the 1x1 projection when a
  block downsamples): PaddleClas / PaddleSeg.
Like all Paddle kits, the first block of every stage has a projection shortcut (also for 18/34, where
torchvision has none in stage 1), so the released files load without gaps.

Our parameter names (kit names are reached through `resnet_key_map`):
    stem.{0|0,1,2}.conv.weight / .bn.{weight,bias,_mean,_variance}
    layer{1..4}.{block}.{conv0,conv1,conv2,short}.conv.weight / .bn.*     (basic blocks: conv0, conv1)
    fc.weight [in, out], fc.bias                                            (only with num_classes > 0)
"""
import typing

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

import ops
from ops.paddle_attrs import batch_norm_settings
from engine.model import Weights, ZooModel, recomputed
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry

# depth -> (block type, blocks per stage)
DEPTHS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
          50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3]),
          152: ("bottleneck", [3, 8, 36, 3])}
# base dilation per stage for each output stride (PaddleSeg: OS8 -> {stage3: 2, stage4: 4})
STAGE_DILATIONS = {32: [1, 1, 1, 1], 16: [1, 1, 1, 2], 8: [1, 1, 2, 4]}


class ConvBN(nn.Layer):
    """Conv (no bias) + BN (+ ReLU); `avg_down` puts the vd 2x2 average pool in front of the conv.

    `global_stats` makes BN use (and keep) its running statistics in training too: frozen stages and
    `norm_eval`, as the kits' frozen BN (`use_global_stats=True`).
    """

    def __init__(self, cin, cout, kernel, stride=1, dilation=1, act=True, avg_down=False,
                 global_stats=False):
        super().__init__()
        self.pool = nn.AvgPool2D(2, 2, padding=0, ceil_mode=True) if avg_down else None
        self.conv = nn.Conv2D(cin, cout, kernel, stride=stride, padding=dilation * (kernel - 1) // 2,
                              dilation=dilation, bias_attr=False,
                              weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingNormal()))
        self.bn = nn.BatchNorm2D(cout, use_global_stats=True if global_stats else None)
        self.act = act

    def forward(self, x, residual=None):
        """conv, BN, then ReLU(+ residual first, when given): one block of the layer package (ops)."""
        if self.pool is not None:
            x = ops.pool(x, self.pool)
        return ops.conv_bn_act(x, self.conv, self.bn, relu=self.act or residual is not None, residual=residual)


class BasicBlock(nn.Layer):
    expansion = 1

    def __init__(self, cin, width, stride, dilation, project, avg_down, global_stats):
        super().__init__()
        self.conv0 = ConvBN(cin, width, 3, stride, dilation, global_stats=global_stats)
        self.conv1 = ConvBN(width, width, 3, 1, dilation, act=False, global_stats=global_stats)
        self.short = _shortcut(cin, width, stride, project, avg_down, global_stats)

    def forward(self, x):
        return self.conv1(self.conv0(x), x if self.short is None else self.short(x))   # relu(bn(.) + x)


class Bottleneck(nn.Layer):
    expansion = 4

    def __init__(self, cin, width, stride, dilation, project, avg_down, global_stats):
        super().__init__()
        self.conv0 = ConvBN(cin, width, 1, global_stats=global_stats)
        self.conv1 = ConvBN(width, width, 3, stride, dilation, global_stats=global_stats)
        self.conv2 = ConvBN(width, width * 4, 1, act=False, global_stats=global_stats)
        self.short = _shortcut(cin, width * 4, stride, project, avg_down, global_stats)

    def forward(self, x):
        return self.conv2(self.conv1(self.conv0(x)), x if self.short is None else self.short(x))   # relu(bn(.) + x)


def _shortcut(cin, cout, stride, project, avg_down, global_stats):
    if not project:
        return None
    if avg_down and stride != 1:  # vd: pool then a stride-1 1x1 conv, no information thrown away
        return ConvBN(cin, cout, 1, 1, act=False, avg_down=True, global_stats=global_stats)
    return ConvBN(cin, cout, 1, stride, act=False, global_stats=global_stats)


@MODELS.register("ResNet")
class ResNet(ZooModel):
    """ResNet trunk returning the features of the stages in `out_indices` (0 = res2 ... 3 = res5).

    Args:
        depth: the number of layers: basic blocks for 18 and 34, bottlenecks from 50 on.
        variant: `b` (7x7 stem, stride in the 3x3 conv) or `d` (vd: deep stem, avg-pool shortcut).
        in_channels: input channels (StNet stacks 5 RGB frames: 15).
        output_stride: the input size over the last feature map's; 16 and 8 replace the last strides
            by dilation (PaddleSeg rule: the first block of a dilated stage already uses the stage's
            dilation), for dense prediction.
        multi_grid: per-block multipliers of the last stage's dilation (PaddleSeg uses [1, 2, 4]).
        out_indices: which stages to return, e.g. [3] (TSN) or [0, 1, 2, 3] (DeepLabV3, FPN).
        frozen_stages: -1 trains everything; 0 freezes the stem; k also freezes stages 1..k (their
            parameters stop training and their BN uses running stats). PaddleDetection's
            `freeze_at: 0` is our `frozen_stages: 1`.
        norm_eval: every BN uses its running statistics (and does not update them) in training.
        freeze_norm: BN scale/shift do not train either (implies norm_eval; PaddleDetection default).
        num_classes: > 0 adds global pooling + fc, and forward returns logits [N, num_classes]
            instead of the feature list (ImageNet classification).
        base_channels: width of the stem and of stage 1 (64 in every kit; the stages double it);
            smaller values make narrow trunks for demos and tests (no pretrained file fits them).
        recompute: in training, keep only each stage's input and output and recompute the stage's
            inside during backward (less activation memory, one more forward of the trunk); the
            gradients and the BN running statistics are those of a plain step (`recompute_stage`).
    """

    def weights(self):   # the ImageNet classifier, if any: replaced when fine-tuning
        return Weights(head_keys=[r"fc\.(weight|bias)"])

    def __init__(self, depth: typing.Literal[tuple(DEPTHS)] = 50, variant: typing.Literal["b", "d"] = "b",
                 in_channels: int = 3, output_stride: typing.Literal[tuple(STAGE_DILATIONS)] = 32,
                 multi_grid: list = None, out_indices: list[typing.Literal[0, 1, 2, 3]] = None,
                 frozen_stages: typing.Literal[-1, 0, 1, 2, 3, 4] = -1, norm_eval: bool = False,
                 freeze_norm: bool = False, num_classes: int = 0, base_channels: int = 64, recompute: bool = False):
        super().__init__()
        if depth not in DEPTHS:
            raise ConfigError(f"ResNet: depth {depth} is not supported; choose one of {sorted(DEPTHS)}")
        if variant not in ("b", "d"):
            raise ConfigError(f"ResNet: variant '{variant}' is not supported; choose 'b' or 'd'")
        if output_stride not in STAGE_DILATIONS:
            raise ConfigError(f"ResNet: output_stride {output_stride} is not supported; choose 8, 16 or 32")
        kind, blocks = DEPTHS[depth]
        multi_grid = list(multi_grid) if multi_grid else [1] * blocks[3]
        if len(multi_grid) != blocks[3]:
            raise ConfigError(f"ResNet: multi_grid {multi_grid} needs {blocks[3]} values "
                              f"(one per block of the last stage)")
        out_indices = [3] if out_indices is None else list(out_indices)
        if not out_indices or any(i not in (0, 1, 2, 3) for i in out_indices):
            raise ConfigError(f"ResNet: out_indices {out_indices} must be stage indices in 0..3")
        if frozen_stages not in (-1, 0, 1, 2, 3, 4):
            raise ConfigError(f"ResNet: frozen_stages {frozen_stages} must be in -1..4")
        if base_channels < 8 or base_channels % 8:
            raise ConfigError(f"ResNet: base_channels must be a multiple of 8, got {base_channels}")
        widths = [base_channels * m for m in (1, 2, 4, 8)]
        stem_w = [base_channels // 2, base_channels // 2, base_channels]   # vd: 32, 32, 64 at 64
        self.depth, self.variant, self.out_indices = depth, variant, out_indices
        self.output_stride, self.recompute = output_stride, recompute
        block_cls = Bottleneck if kind == "bottleneck" else BasicBlock
        norm_eval = norm_eval or freeze_norm

        stem_frozen = frozen_stages >= 0
        gs = norm_eval or stem_frozen
        if variant == "b":
            stem = [ConvBN(in_channels, base_channels, 7, 2, global_stats=gs)]
        else:
            stem = [ConvBN(in_channels, stem_w[0], 3, 2, global_stats=gs),
                    ConvBN(stem_w[0], stem_w[1], 3, 1, global_stats=gs),
                    ConvBN(stem_w[1], stem_w[2], 3, 1, global_stats=gs)]
        self.stem = nn.Sequential(*stem)
        self.maxpool = nn.MaxPool2D(3, 2, padding=1)

        self.stage_channels = [w * block_cls.expansion for w in widths]
        self.out_channels = [self.stage_channels[i] for i in out_indices]
        cin = base_channels
        for s, (n, width, base) in enumerate(zip(blocks, widths, STAGE_DILATIONS[output_stride])):
            gs = norm_eval or frozen_stages >= s + 1
            layers = []
            for i in range(n):
                dilation = base * (multi_grid[i] if s == 3 else 1)
                stride = 2 if (i == 0 and s > 0 and base == 1) else 1
                layers.append(block_cls(cin, width, stride, dilation, project=(i == 0),
                                        avg_down=(variant == "d"), global_stats=gs))
                cin = width * block_cls.expansion
            self.add_sublayer(f"layer{s + 1}", nn.Sequential(*layers))
        self.fc = nn.Linear(cin, num_classes) if num_classes > 0 else None

        frozen = ([self.stem] + self.stages[:frozen_stages]) if stem_frozen else []
        for layer in frozen:
            for p in layer.parameters():
                p.stop_gradient = True
        if freeze_norm:
            for layer in self.sublayers():
                if isinstance(layer, nn.BatchNorm2D):
                    layer.weight.stop_gradient = True
                    layer.bias.stop_gradient = True

    @property
    def stages(self):
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def forward_stem(self, x):
        return ops.pool(self.stem(x), self.maxpool)

    def forward(self, x):
        x = self.forward_stem(x)
        feats = []
        remat = self.recompute and self.training and paddle.is_grad_enabled()
        for stage in self.stages:
            x = recompute_stage(stage, x) if remat else stage(x)
            feats.append(x)
        if self.fc is not None:   # the trunk's outputs are fp32 whatever its activations (ops.Precision.bf16_act)
            return self.fc(F.adaptive_avg_pool2d(ops.float32(x), 1).flatten(1))
        return [ops.float32(feats[i]) for i in self.out_indices]


def recompute_stage(stage, x):
    """`stage(x)` whose inner activations are recomputed during backward instead of kept.

    engine.model.recomputed runs the stage again inside backward; its BN layers would then fold the
    batch into their running statistics twice, so every run after the first puts them back.
    """
    runs = []

    def run(inp):
        runs.append(1)
        if len(runs) == 1:                 # the forward pass proper
            return stage(inp)
        norms = [m for m in stage.sublayers() if isinstance(m, nn.layer.norm._BatchNormBase)]
        stats = [batch_norm_settings(m) for m in norms]
        kept = [(s.mean.clone(), s.variance.clone()) for s in stats]
        out = stage(inp)
        for s, (mean, var) in zip(stats, kept):
            s.mean.set_value(mean)
            s.variance.set_value(var)
        return out

    return recomputed(run, x)


def build_backbone(cfg, **forced):
    """Build a backbone from its config dict `{name: ResNet, ...}`; `forced` are arguments the calling
    model dictates (e.g. StNet's in_channels) and may not be contradicted by the config."""
    if not isinstance(cfg, dict) or "name" not in cfg:
        raise ConfigError(f"backbone: expected a mapping with 'name:' (e.g. {{name: ResNet, depth: 50}}), "
                          f"got {cfg!r}")
    cfg = dict(cfg)
    for key, value in forced.items():
        if key in cfg and cfg[key] != value:
            raise ConfigError(f"backbone.{key}: {cfg[key]!r} contradicts the model, which needs {value!r}")
        cfg[key] = value
    return MODELS.build(cfg)


# ------------------------------------------------------------------------------------------ key maps
def kit_block_name(depth, stage, index):
    """The kits' block names: res2a, res2b, ...; for 101/152 the third stage counts res4a, res4b1, ..."""
    if depth in (101, 152) and stage == 2:
        return f"res4{'a' if index == 0 else 'b' + str(index)}"
    return f"res{stage + 2}{chr(97 + index)}"


_BN = "(weight|bias|_mean|_variance)"


def resnet_key_map(layout, depth=50, variant="b", src_prefix="", dst_prefix=""):
    """[(regex, replacement)] from a kit's ResNet names to ours (first match wins, see map_keys).

    depth=None covers every depth at once (the union of their block names: res4b1..res4b35 of 101/152
    beside res4b..res4f of 18-50 cannot collide), so one entry loads a kit file of any depth; whether
    the file fits the model is then decided by the model's own keys.

    layout: "paddlevideo" (PaddleVideo 2.x: conv / res2a.conv0._conv / ._batch_norm),
            "paddleseg" (PaddleSeg/PaddleClas vd: conv1_1..3 / bb_0_0.conv0._conv / ._batch_norm),
            "ppdet" (PaddleDetection: conv1.conv1 / res2.res2a.branch2a.conv / .norm),
            "fluid" (Fluid 1.x static names: conv1_weights, bn_conv1_scale, res2a_branch2a_weights, ...).
    src_prefix is a regex fragment (e.g. r"(?:backbone\\.)?"), dst_prefix a plain string.
    """
    if depth is None:
        rules = {}  # insertion-ordered, duplicates dropped
        for d in DEPTHS:
            rules.update(dict.fromkeys(resnet_key_map(layout, d, variant, src_prefix, dst_prefix)))
        return list(rules)
    kind, blocks = DEPTHS[depth]
    n_units = 2 if kind == "basic" else 3
    units = [f"conv{u}" for u in range(n_units)] + ["short"]
    src, dst, rules = src_prefix, dst_prefix, []
    stem_ours = [f"{dst}stem.{i}" for i in range(1 if variant == "b" else 3)]
    if layout in ("paddlevideo", "paddleseg"):
        if (layout, variant) not in (("paddlevideo", "b"), ("paddleseg", "d")):
            raise ValueError(f"no {layout} ResNet layout for variant '{variant}'")
        stem_src = ["conv"] if variant == "b" else ["conv1_1", "conv1_2", "conv1_3"]
        for theirs, ours in zip(stem_src, stem_ours):
            rules += [(rf"{src}{theirs}\._conv\.weight", f"{ours}.conv.weight"),
                      (rf"{src}{theirs}\._batch_norm\.{_BN}", f"{ours}.bn.\\g<1>")]
        alt = "conv0|conv1|conv2|short"  # every depth's units: one rule per block for basic and bottleneck
        for s, n in enumerate(blocks):
            if layout == "paddleseg":  # bb_<stage>_<block>: one rule per stage
                pairs = [(rf"bb_{s}_(\d+)", f"layer{s + 1}.\\g<1>", 1)]
            else:
                pairs = [(kit_block_name(depth, s, i), f"layer{s + 1}.{i}", 0) for i in range(n)]
            for theirs, ours, g in pairs:  # g: groups taken by the block pattern
                unit, bn = f"\\g<{g + 1}>", f"\\g<{g + 2}>"
                rules += [(rf"{src}{theirs}\.({alt})\._conv\.weight", f"{dst}{ours}.{unit}.conv.weight"),
                          (rf"{src}{theirs}\.({alt})\._batch_norm\.{_BN}", f"{dst}{ours}.{unit}.bn.{bn}")]
        return rules
    if layout == "ppdet":
        stem_src = ["conv1"] if variant == "b" else ["conv1_1", "conv1_2", "conv1_3"]
        for theirs, ours in zip(stem_src, stem_ours):
            rules += [(rf"{src}conv1\.{theirs}\.conv\.weight", f"{ours}.conv.weight"),
                      (rf"{src}conv1\.{theirs}\.norm\.{_BN}", f"{ours}.bn.\\g<1>")]
        theirs_units = ["branch2a", "branch2b", "branch2c"][:n_units] + ["short"]
        for s, n in enumerate(blocks):
            for i in range(n):
                block = f"res{s + 2}\\.{kit_block_name(depth, s, i)}"
                for theirs, ours in zip(theirs_units, units if i == 0 else units[:-1]):
                    where = f"{dst}layer{s + 1}.{i}.{ours}"
                    rules += [(rf"{src}{block}\.{theirs}\.conv\.weight", f"{where}.conv.weight"),
                              (rf"{src}{block}\.{theirs}\.norm\.{_BN}", f"{where}.bn.\\g<1>")]
        return rules
    if layout == "fluid":
        if variant != "b":
            raise ValueError("the Fluid layout exists for variant 'b' only")
        suffix = {"scale": "weight", "offset": "bias", "mean": "_mean", "variance": "_variance"}
        rules.append((rf"{src}conv1_weights", f"{dst}stem.0.conv.weight"))
        rules += [(rf"{src}bn_conv1_{k}", f"{dst}stem.0.bn.{v}") for k, v in suffix.items()]
        theirs_units = ["branch2a", "branch2b", "branch2c"][:n_units] + ["branch1"]
        for s, n in enumerate(blocks):
            for i in range(n):
                name = kit_block_name(depth, s, i)
                for theirs, ours in zip(theirs_units, units if i == 0 else units[:-1]):
                    where = f"{dst}layer{s + 1}.{i}.{ours}"
                    rules.append((rf"{src}{name}_{theirs}_weights", f"{where}.conv.weight"))
                    rules += [(rf"{src}bn{name[3:]}_{theirs}_{k}", f"{where}.bn.{v}")
                              for k, v in suffix.items()]
        return rules
    raise ValueError(f"unknown ResNet key layout '{layout}'")


# ---------------------------------------------------------------------------------- pretrained
WEIGHTS.add(PretrainedEntry(
    name="resnet50_imagenet_paddlevideo",
    reproduced="PaddleVideo ResNet-50 outputs matched on golden weights (inside TSN); not downloaded here",
    model="ResNet",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo/PretrainModel/ResNet50_pretrain.pdparams"],
    source="PaddleVideo 2.x .pdparams (ImageNet-1k ResNet-50 in PaddleVideo's backbone names; "
           "keys with or without 'backbone.')",
    key_map=resnet_key_map("paddlevideo", None, "b", src_prefix=r"(?:backbone\.)?"),
    ignore_keys=[r"(?:head\.)?(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
    model_args={"depth": 50, "variant": "b"},
    dataset="ImageNet-1k",
    num_params=23508032,
    notes="The backbone initialisation of PaddleVideo's TSN/TSM recipes (docs/*/model_zoo/recognition/"
          "tsn.md). A classifier, if the file has one, is dropped.",
))

# The ImageNet initialisations of PaddleSeg's DeepLabV3 R50 and R101 recipes, loaded into DeepLabV3
# under `backbone.` (the engine's backbone layouts).
_PADDLESEG_VD = [
    # (name, depth, archive file, a block name quoted in `source`, parameters, reproduced, notes)
    ("resnet50_vd_ssld_v2_paddleseg", 50, "resnet50_vd_ssld_v2", "bb_0_0", 23527264,
     "PaddleSeg ResNet50_vd OS8 outputs matched on golden weights; not downloaded here",
     "The backbone initialisation of PaddleSeg's DeepLabV3 R50 recipes. PaddleSeg reads "
     "<top folder>/model.pdparams out of the archive (paddleseg/utils/utils.py)."),
    ("resnet101_vd_ssld_paddleseg", 101, "resnet101_vd_ssld", "bb_2_22", 42519392,
     "key map tested on PaddleSeg ResNet_vd names (R50 table and golden outputs); not downloaded here",
     "The backbone initialisation of PaddleSeg's DeepLabV3 R101 recipes "
     "(configs/deeplabv3/deeplabv3_resnet101_os8_*.yml)."),
]
for _name, _depth, _archive, _block, _params, _reproduced, _notes in _PADDLESEG_VD:
    WEIGHTS.add(PretrainedEntry(
        name=_name,
        reproduced=_reproduced,
        model="ResNet",
        urls=[f"https://bj.bcebos.com/paddleseg/dygraph/{_archive}.tar.gz"],
        archive_member="model.pdparams",
        source=f"PaddleSeg dygraph backbone archive (ResNet{_depth}_vd names: conv1_1._conv, "
               f"{_block}.conv0._batch_norm)",
        key_map=resnet_key_map("paddleseg", _depth, "d", src_prefix=r"(?:backbone\.)?"),
        ignore_keys=[r"(?:fc|out)(?:_0)?\.(?:weight|bias|w_0|b_0)"],
        model_args={"depth": _depth, "variant": "d", "output_stride": 8, "multi_grid": [1, 2, 4],
                    "out_indices": [0, 1, 2, 3]},
        dataset="ImageNet-1k (SSLD distillation)",
        num_params=_params,
        notes=_notes,
    ))
