"""Attention Cluster for YouTube-8M frame features, after the Fluid 1.x PaddleCV/video implementation
(models v1.3-v1.8; not carried over to PaddleVideo 2.x).

The reader samples `seg_num` frames per video (one random frame per equal stride, `SampleFrames`).
Per modality a shifting-attention module with `n_att` units: a 1x1 conv gives n_att scores per frame,
softmax over the frames, and each unit's weighted frame sum is shifted by a learnt scalar pair
(w_i * sum + b_i), L2-normalised and divided by sqrt(n_att). Units and modalities are concatenated
-> dropout -> fc 1024 tanh -> fc 4096 tanh -> logistic fc (multi-label, sigmoid).

A `<name>_mask` in the batch is honoured (masked frames get zero attention), so padded input works too.
"""
import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.nn.initializer import KaimingNormal, KaimingUniform, Normal
from paddle.static import InputSpec

import ops
from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.video.yt8m_common import Reduction, check_features, check_reduction, feature_input, multilabel_outputs


def _msra_normal():
    """Fluid MSRA(uniform=False): N(0, sqrt(2 / fan_in))."""
    return paddle.ParamAttr(initializer=KaimingNormal())


def _msra_uniform():
    """Fluid MSRA() on a bias: U(+-sqrt(6 / n)), a 1-D tensor's fan_in being its length."""
    return paddle.ParamAttr(initializer=KaimingUniform())


class ShiftingAttention(nn.Layer):
    def __init__(self, input_dim, n_att):
        super().__init__()
        self.n_att = n_att
        # the original's conv2d over [N, F, L, 1]; weight [n_att, F, 1, 1] like the Fluid parameter
        self.conv = nn.Conv2D(input_dim, n_att, 1, weight_attr=_msra_normal(), bias_attr=_msra_uniform())
        std = math.sqrt(1.0 / math.sqrt(n_att))
        self.shift_w = self.create_parameter([n_att], default_initializer=Normal(0.0, std))
        self.shift_b = self.create_parameter([n_att], default_initializer=Normal(0.0, std))

    def forward(self, x, mask=None):
        """x [N, L, F] -> [N, n_att * F] (unit-major, as the original concatenates)."""
        scores = self.conv(x.transpose([0, 2, 1]).unsqueeze(-1)).squeeze(-1)  # [N, n_att, L]
        if mask is not None:
            scores = paddle.where(mask.unsqueeze(1) > 0, scores, paddle.full_like(scores, -1e4))
        weights = F.softmax(scores, axis=-1)
        pooled = paddle.bmm(weights, x)                                         # [N, n_att, F]
        shifted = pooled * self.shift_w.unsqueeze(-1) + self.shift_b.unsqueeze(-1)
        out = F.normalize(shifted, axis=-1) / math.sqrt(self.n_att)
        return out.reshape([x.shape[0], -1])


@MODELS.register("AttentionCluster")
class AttentionCluster(ZooModel):
    """Attention Cluster video classifier.

    Initialisation as in the original: MSRA normal for every weight (conv, fc1, fc2, logistic),
    MSRA uniform for the conv/fc1/fc2 biases, MSRA normal for the logistic bias, shift w/b
    N(0, sqrt(1/sqrt(n_att))). Loss: sigmoid cross-entropy summed over classes, averaged over the
    batch. Dropout is paddle's upscale-in-train; Fluid 1.x scaled at inference instead.

    Args:
        num_classes: the outputs of the logistic layer (3862: YouTube-8M 2018's vocabulary); checked
            against the reader's.
        feature_names: the batch's feature arrays, one attention cluster each (rgb, audio).
        feature_dims: the width of each feature (1024 rgb, 128 audio), in `feature_names`' order.
        seg_num: the frames per video: what the reader's SampleFrames must deliver (checked against the
            batch).
        cluster_nums: the attention units (n_att) of each feature's shifting-attention module.
        drop_rate: the dropout on the concatenated attention outputs.
        fc_sizes: the widths of the two tanh layers before the logistic layer.
        loss_reduction: `mean` averages the per-video loss (summed over classes) over the batch;
            `sum` adds it up (PaddleVideo's BCEWithLogitsLoss(sum), whose learning rates assume it).
    """

    def weights(self):   # the head: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"logistic\.(weight|bias)"])

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 3862, feature_names: list = ["rgb", "audio"],
                 feature_dims: list = [1024, 128], seg_num: int = 100, cluster_nums: list = [32, 32],
                 drop_rate: float = 0.5, fc_sizes: list = [1024, 4096], loss_reduction: Reduction = "mean"):
        super().__init__()
        self.num_classes = num_classes
        check_features("AttentionCluster", feature_names, feature_dims)
        check_reduction("AttentionCluster", loss_reduction)
        if len(cluster_nums) != len(feature_dims):
            raise ConfigError(f"AttentionCluster: cluster_nums {list(cluster_nums)} needs one entry per "
                              f"feature {list(feature_names)}")
        if len(fc_sizes) != 2:
            raise ConfigError(f"AttentionCluster: fc_sizes must hold two sizes, got {list(fc_sizes)}")
        self.feature_names, self.feature_dims = list(feature_names), [int(d) for d in feature_dims]
        self.seg_num, self.loss_reduction = seg_num, loss_reduction
        for i, (dim, n_att) in enumerate(zip(self.feature_dims, cluster_nums)):
            self.add_sublayer(f"satt{i}", ShiftingAttention(dim, int(n_att)))
        total = sum(d * int(n) for d, n in zip(self.feature_dims, cluster_nums))
        self.dropout = nn.Dropout(drop_rate)
        self.fc1 = nn.Linear(total, fc_sizes[0], _msra_normal(), _msra_uniform())
        self.fc2 = nn.Linear(fc_sizes[0], fc_sizes[1], _msra_normal(), _msra_uniform())
        self.logistic = nn.Linear(fc_sizes[1], num_classes, _msra_normal(), _msra_normal())

    def export_spec(self, example=None):
        """The frames are sampled to seg_num in the reader (SampleFrames + Stack): only the batch varies."""
        return {"inputs": {n: InputSpec([None, self.seg_num, d], "float32")
                           for n, d in zip(self.feature_names, self.feature_dims)},
                "outputs": ["logits", "probs"]}

    def forward(self, batch):
        outs = []
        for i, (name, dim) in enumerate(zip(self.feature_names, self.feature_dims)):
            x, _, mask = feature_input(batch, name, dim, "AttentionCluster")
            if x.shape[1] != self.seg_num:
                raise ConfigError(f"AttentionCluster: batch '{name}' has {x.shape[1]} frames, the model "
                                  f"expects seg_num={self.seg_num} (sample them in the reader)")
            has_mask = name + "_mask" in batch or name + "_len" in batch
            outs.append(getattr(self, f"satt{i}")(x, mask if has_mask else None))
        h = self.dropout(paddle.concat(outs, axis=1))
        h = paddle.tanh(ops.linear(paddle.tanh(ops.linear(h, self.fc1)), self.fc2))
        return multilabel_outputs(self, ops.linear(h, self.logistic), batch, self.loss_reduction)


WEIGHTS.add(PretrainedEntry(
    name="AttentionCluster_yt8m",
    model="AttentionCluster",
    urls=[],
    source="none: no dygraph release exists",
    model_args={"num_classes": 3862, "feature_names": ["rgb", "audio"], "feature_dims": [1024, 128],
                "seg_num": 100, "cluster_nums": [32, 32]},
    metrics={"hit_at_1": 0.87, "perr": 0.78, "gap": 0.84},
    metrics_source="PaddlePaddle/models v1.3 fluid/PaddleCV/video/models/attention_cluster/README.md "
                   "(cluster_nums 32, seg_num 100, batch 2048)",
    dataset="YouTube-8M (2018) validate",
    num_params=57_807_830,
    config="configs/video/attention_cluster/attention_cluster_att32_5e_youtube8m.yaml",
    notes="Reference numbers only. The released weights are Fluid 1.x static-graph files "
          "(attention_cluster_youtube8m.tar.gz persistables, v1.6/1.8 AttentionCluster.pdparams); "
          "PaddleVideo 2.x has no dygraph port and there is no converter here.",
    reproduced="demo recipe trained (see its family page); the full recipe needs YouTube-8M (not run)",
))
