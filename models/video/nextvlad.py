"""NeXtVLAD for YouTube-8M frame features (the 2nd YouTube-8M challenge's best single model), after
the Fluid 1.x PaddleCV/video implementation (models v1.3-v1.8; no dygraph port was ever released).

Per modality a NeXtVLAD layer: fc expansion (F -> lambda*F), a sigmoid attention per group, soft
assignment of every group of every frame to `cluster_size` clusters (matmul + BN + softmax), residual
aggregation over frames and groups, intra-normalisation (L2 over the feature axis of each cluster),
flatten, BN. Head: concat -> dropout -> fc hidden (no bias) + BN -> SE context gating -> logistic fc.

Padding: the original feeds LoD sequences, so it only ever sees real frames. Here the features are
padded to [B, T, F] with a mask; padded frames are zeroed in the soft assignment (they add nothing to
the VLAD sums nor to a_sum), and in training the cluster BN computes its batch statistics over the real
frames only (the real rows are gathered, normalised, and scattered back). The result is independent of
the padded values and of T, in train and in eval mode, as with the LoD original.
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.nn.initializer import Constant, KaimingNormal

import ops
from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.video.yt8m_common import Reduction, check_features, check_reduction, feature_input, \
    multilabel_outputs, padded_feature_spec


def _msra():
    """Fluid's MSRA(uniform=False): N(0, sqrt(2 / fan_in)), fan_in = in-features."""
    return paddle.ParamAttr(initializer=KaimingNormal())


class NeXtVLADLayer(nn.Layer):
    def __init__(self, feature_size, cluster_size, expansion, groups):
        super().__init__()
        if (expansion * feature_size) % groups:
            raise ConfigError(f"NeXtVLAD: expansion*feature_size = {expansion * feature_size} is not "
                              f"divisible by groups={groups}")
        self.cluster_size, self.groups = cluster_size, groups
        self.group_size = expansion * feature_size // groups
        zero = paddle.ParamAttr(initializer=Constant(0.0))
        self.fc_expansion = nn.Linear(feature_size, expansion * feature_size, _msra(), zero)
        self.fc_group_attention = nn.Linear(expansion * feature_size, groups, _msra(), zero)
        self.cluster_weights = self.create_parameter(
            [expansion * feature_size, groups * cluster_size], default_initializer=KaimingNormal())
        self.cluster_bn = nn.BatchNorm1D(groups * cluster_size)
        self.cluster_weights2 = self.create_parameter(
            [cluster_size, self.group_size], default_initializer=KaimingNormal())
        self.vlad_bn = nn.BatchNorm1D(cluster_size * self.group_size)

    @property
    def out_size(self):
        return self.cluster_size * self.group_size

    def _cluster_bn(self, act, mask):
        """BN over frames; in training its statistics come from the real frames alone.

        Written as masked sums (fixed shapes) rather than BN over the gathered real frames: gathering
        needs their count, which on a GPU waits for the device every step. Same statistics and
        running averages as paddle's BatchNorm (biased variance, running = momentum * running +
        (1 - momentum) * batch). A SyncBatchNorm (runtime.sync_bn) keeps the gather: its statistics
        are reduced over the cards by its own kernel."""
        bn, flat = self.cluster_bn, act.reshape([-1, act.shape[-1]])
        if not self.training:
            return bn(flat).reshape(act.shape)
        real = mask.reshape([-1, 1]).astype(flat.dtype)
        if isinstance(bn, nn.SyncBatchNorm):
            idx = paddle.nonzero(real.reshape([-1]) > 0).reshape([-1])
            return paddle.scatter(paddle.zeros_like(flat), idx, bn(paddle.gather(flat, idx))).reshape(act.shape)
        count = paddle.clip(real.sum(), min=1.0)
        mean = (flat * real).sum(axis=0) / count
        centred = flat - mean
        var = (centred * centred * real).sum(axis=0) / count
        with paddle.no_grad():
            m = bn._momentum
            paddle.assign(bn._mean * m + mean * (1.0 - m), bn._mean)
            paddle.assign(bn._variance * m + var * (1.0 - m), bn._variance)
        normed = centred * paddle.rsqrt(var + bn._epsilon) * bn.weight + bn.bias
        return (normed * real).reshape(act.shape)

    def forward(self, x, mask):
        B, T = x.shape[0], x.shape[1]
        G, K, Fg = self.groups, self.cluster_size, self.group_size
        x = ops.linear(x, self.fc_expansion)                              # [B, T, lambda*F]
        attention = F.sigmoid(ops.linear(x, self.fc_group_attention))     # [B, T, G]
        act = self._cluster_bn(ops.matmul(x, self.cluster_weights), mask)  # [B, T, G*K]
        act = F.softmax(act.reshape([B, T, G, K]), axis=-1)               # soft assignment per group
        act = act * (attention * mask.unsqueeze(-1)).unsqueeze(-1)        # padded frames -> 0
        a = act.sum(axis=[1, 2]).unsqueeze(-1) * self.cluster_weights2    # [B, K, Fg]
        act = act.reshape([B, T * G, K]).transpose([0, 2, 1])             # [B, K, T*G]
        vlad = ops.matmul(act, x.reshape([B, T * G, Fg])) - a              # [B, K, Fg]
        vlad = F.normalize(vlad.transpose([0, 2, 1]), axis=1)             # [B, Fg, K], per cluster
        return self.vlad_bn(vlad.reshape([B, Fg * K]))


@MODELS.register("NeXtVLAD")
class NeXtVLAD(ZooModel):
    """NeXtVLAD video classifier.

    Initialisation as in the original: MSRA normal (N(0, sqrt(2/fan_in))) for every weight, zero
    biases, BN scale 1 / shift 0. The logistic fc carries its own L2 regulariser `l2_penalty` (1e-5)
    on weight and bias (a ParamAttr regulariser overrides the optimizer's weight decay for them).
    Loss: sigmoid cross-entropy summed over classes, averaged over the batch (`loss_reduction`).
    Dropout is paddle's upscale-in-train; Fluid 1.x scaled at inference instead (same expectation).
    The reader is expected to apply the original's PCA-eigenvalue rescaling of rgb.

    Args:
        num_classes: the outputs of the logistic layer (3862: YouTube-8M 2018's vocabulary); checked
            against the reader's.
        feature_names: the batch's feature arrays, one NeXtVLAD layer each (rgb, audio).
        feature_dims: the width of each feature (1024 rgb, 128 audio), in `feature_names`' order.
        cluster_size: the clusters each group of a frame is softly assigned to.
        hidden_size: the width of the fc + BN after the concatenated VLADs; a multiple of
            `gating_reduction`.
        groups: the groups a frame's expanded feature is split into, each with its own attention;
            expansion x feature width must divide by it.
        expansion: the factor the first fc widens each frame's feature by (lambda in the paper).
        drop_rate: the dropout on the concatenated VLADs.
        gating_reduction: the bottleneck ratio of the context gating (SE) block.
        l2_penalty: the L2 regulariser of the logistic layer's weight and bias, which overrides the
            optimizer's weight decay for them.
        loss_reduction: `mean` averages the per-video loss (summed over classes) over the batch;
            `sum` adds it up.
    """

    def weights(self):   # the head: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"logits_clf\.(weight|bias)"])

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 3862, feature_names: list = ["rgb", "audio"],
                 feature_dims: list = [1024, 128], cluster_size: int = 128, hidden_size: int = 2048,
                 groups: int = 8, expansion: int = 2, drop_rate: float = 0.5, gating_reduction: int = 8,
                 l2_penalty: float = 1e-5, loss_reduction: Reduction = "mean"):
        super().__init__()
        self.num_classes = num_classes
        check_features("NeXtVLAD", feature_names, feature_dims)
        check_reduction("NeXtVLAD", loss_reduction)
        if hidden_size % gating_reduction:
            raise ConfigError(f"NeXtVLAD: hidden_size={hidden_size} is not divisible by "
                              f"gating_reduction={gating_reduction}")
        self.feature_names, self.feature_dims = list(feature_names), [int(d) for d in feature_dims]
        self.loss_reduction = loss_reduction
        self.vlad = nn.LayerList(
            [NeXtVLADLayer(d, cluster_size, expansion, groups) for d in self.feature_dims])
        total = sum(layer.out_size for layer in self.vlad)
        self.dropout = nn.Dropout(drop_rate)
        self.hidden1_fc = nn.Linear(total, hidden_size, _msra(), bias_attr=False)
        self.hidden1_bn = nn.BatchNorm1D(hidden_size)
        self.gating_fc1 = nn.Linear(hidden_size, hidden_size // gating_reduction, _msra(), bias_attr=False)
        self.gating_bn = nn.BatchNorm1D(hidden_size // gating_reduction)
        self.gating_fc2 = nn.Linear(hidden_size // gating_reduction, hidden_size, _msra(), bias_attr=False)
        l2 = paddle.regularizer.L2Decay(l2_penalty)
        self.logits_clf = nn.Linear(
            hidden_size, num_classes,
            paddle.ParamAttr(initializer=KaimingNormal(), regularizer=l2),
            paddle.ParamAttr(initializer=Constant(0.0), regularizer=l2))

    def export_spec(self, example=None):
        return {"inputs": padded_feature_spec(self.feature_names, self.feature_dims, lengths=False),
                "outputs": ["logits", "probs"]}

    def forward(self, batch):
        vlads = []
        for layer, name, dim in zip(self.vlad, self.feature_names, self.feature_dims):
            x, _, mask = feature_input(batch, name, dim, "NeXtVLAD")
            vlads.append(layer(x, mask))
        h = self.hidden1_bn(ops.linear(self.dropout(paddle.concat(vlads, axis=1)), self.hidden1_fc))
        gates = F.relu(self.gating_bn(ops.linear(h, self.gating_fc1)))
        h = h * F.sigmoid(ops.linear(gates, self.gating_fc2))
        return multilabel_outputs(self, ops.linear(h, self.logits_clf), batch, self.loss_reduction)


WEIGHTS.add(PretrainedEntry(
    name="NeXtVLAD_yt8m",
    model="NeXtVLAD",
    urls=[],
    source="none: no dygraph release exists",
    model_args={"num_classes": 3862, "feature_names": ["rgb", "audio"], "feature_dims": [1024, 128],
                "cluster_size": 128, "hidden_size": 2048, "groups": 8, "expansion": 2,
                "gating_reduction": 8},
    metrics={"hit_at_1": 0.8960, "perr": 0.8132, "gap": 0.8709},
    metrics_source="PaddlePaddle/models v1.3 fluid/PaddleCV/video/models/nextvlad/README.md "
                   "(4x P40, total batch 160)",
    dataset="YouTube-8M (2018) validate",
    num_params=89_088_550,
    config="configs/video/nextvlad/nextvlad_k128_6e_youtube8m.yaml",
    notes="Reference numbers only. The released weights are Fluid 1.x static-graph files "
          "(nextvlad_youtube8m.tar.gz persistables, v1.6/1.8 NEXTVLAD.pdparams) with auto-generated "
          "BN names; there is no dygraph release (PaddleVideo#159) and no converter here.",
    reproduced="demo recipe trained (see its family page); the full recipe needs YouTube-8M (not run)",
))
