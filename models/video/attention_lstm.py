"""AttentionLSTM for YouTube-8M frame features, as PaddleVideo 2.x builds it
(Recognizer1D + AttentionLstmHead).

Per modality: fc -> tanh -> bidirectional LSTM over the real frames -> dropout -> attention fc(2H -> 1)
-> softmax over the real frames -> weighted sum. The modalities are concatenated and classified by
fc 8192 relu -> fc 4096 tanh -> fc num_classes (multi-label, sigmoid).

The layers sit under a `head` sublayer with PaddleVideo's names, so the official
`AttentionLSTM_yt8.pdparams` loads without a key map. `paddle.nn.LSTM` registers every tensor twice
(`bi_lstm0.weight_ih_l0` and `bi_lstm0.0.cell_fw.weight_ih`); `engine.weights.pretrained.load_state` loads the
first spelling of a tied group and skips the alias.

The helpers the three YouTube-8M models share are in models/video/yt8m_common.py.
"""
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

import ops
from engine.model import DataAgreement, Weights, ZooModel
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.weights.pretrained import WEIGHTS, PretrainedEntry
from models.video.yt8m_common import Reduction, check_features, check_reduction, feature_input, \
    multilabel_outputs, padded_feature_spec

try:  # internal API; only used to let nn.LSTM be built under paddle.LazyGuard
    from paddle.nn.initializer.lazy_init import lazy_init_helper
except ImportError:  # pragma: no cover - other paddle versions
    lazy_init_helper = None


# ---------------------------------------------------------------- model
class _BiLSTM(nn.LSTM):
    """paddle.nn.LSTM that can also be built under paddle.LazyGuard (to count parameters).

    nn.LSTM coalesces its weights into one buffer at construction, which fails when the parameters
    have no storage yet; a lazily built LSTM skips that and runs the (slower) per-cell loop instead.
    """

    def flatten_parameters(self):
        if lazy_init_helper is not None and lazy_init_helper().state:
            self.could_use_cudnn = False
            return
        super().flatten_parameters()


class AttentionLstmHead(nn.Layer):
    """The layers, named as in PaddleVideo's AttentionLstmHead (the released file's keys)."""

    def __init__(self, feature_dims, embedding_size, lstm_size, drop_rate, fc_sizes, num_classes):
        super().__init__()
        self.num_features = len(feature_dims)
        for i, dim in enumerate(feature_dims):
            self.add_sublayer(f"fc_feature{i}", nn.Linear(dim, embedding_size))
            self.add_sublayer(f"bi_lstm{i}", _BiLSTM(embedding_size, lstm_size, direction="bidirectional"))
            self.add_sublayer(f"att_fc{i}", nn.Linear(2 * lstm_size, 1))
        self.dropout = nn.Dropout(drop_rate)
        self.fc_out1 = nn.Linear(2 * lstm_size * self.num_features, fc_sizes[0])
        self.fc_out2 = nn.Linear(fc_sizes[0], fc_sizes[1])
        self.fc_logit = nn.Linear(fc_sizes[1], num_classes)

    def attend(self, i, x, lengths, mask, use_mask):
        """Attention pooling of one modality; padded frames get zero weight when use_mask."""
        emb = paddle.tanh(ops.linear(x, getattr(self, f"fc_feature{i}")))
        out = ops.lstm(emb, getattr(self, f"bi_lstm{i}"), lengths.astype("int32") if use_mask else None)
        out = self.dropout(out)  # PaddleVideo drops before the attention fc and uses the dropped output
        score = ops.linear(out, getattr(self, f"att_fc{i}")).squeeze(-1)  # [B, T]
        if use_mask:
            # softmax over the real frames: exp(s)*m / sum(exp(s)*m), shifted by the max real score
            real = mask > 0
            shift = paddle.where(real, score, paddle.full_like(score, float("-inf")))
            shift = shift.max(axis=1, keepdim=True)
            shift = paddle.where(paddle.isfinite(shift), shift, paddle.zeros_like(shift)).detach()
            e = paddle.exp(score - shift) * mask
            weight = e / paddle.clip(e.sum(axis=1, keepdim=True), min=1e-30)
        else:
            weight = F.softmax(score, axis=1)
        return (out * weight.unsqueeze(-1)).sum(axis=1)

    def forward(self, feats, use_mask=True):
        pooled = [self.attend(i, *f, use_mask) for i, f in enumerate(feats)]
        h = ops.linear(paddle.concat(pooled, axis=1), self.fc_out1, act="relu")
        h = paddle.tanh(ops.linear(h, self.fc_out2))
        return ops.linear(h, self.fc_logit)


@MODELS.register("AttentionLSTM")
class AttentionLSTM(ZooModel):
    """Attention-pooled bidirectional LSTM over YouTube-8M frame features (PaddleVideo 2.x).

    Initialisation is paddle's default, as in PaddleVideo (its `init_weights` is a no-op): Linear
    weights Xavier-uniform with zero bias, LSTM weights and biases U(-1/sqrt(H), 1/sqrt(H)).

    Args:
        num_classes: the outputs of the logit layer (3862: YouTube-8M 2018's vocabulary); checked
            against the reader's.
        feature_names: the batch's feature arrays, one LSTM each (rgb, audio).
        feature_dims: the width of each feature (1024 rgb, 128 audio), in `feature_names`' order.
        embedding_size: the width of the tanh projection of each feature before its LSTM.
        lstm_size: the hidden size of each direction of the bidirectional LSTMs.
        drop_rate: the dropout on the LSTM outputs, before the attention.
        fc_sizes: the widths of the relu and tanh layers before the logit layer.
        use_mask: honour the frame lengths (LSTM and attention over the real frames only); false runs
            over every padded frame, to show what the masking buys.
        loss_reduction: `sum` is PaddleVideo's BCEWithLogitsLoss(sum), summed over classes and over
            the batch (its learning rates assume it); `mean` averages over the batch instead.
    """

    def weights(self):   # the head: what fine-tuning to another num_classes replaces
        return Weights(head_keys=[r"head\.fc_logit\.(weight|bias)"])

    def data_agreement(self):
        return DataAgreement(num_classes=self.num_classes)

    def __init__(self, num_classes: int = 3862, feature_names: list = ["rgb", "audio"],
                 feature_dims: list = [1024, 128], embedding_size: int = 512, lstm_size: int = 1024,
                 drop_rate: float = 0.5, fc_sizes: list = [8192, 4096], use_mask: bool = True,
                 loss_reduction: Reduction = "sum"):
        super().__init__()
        self.num_classes = num_classes
        check_features("AttentionLSTM", feature_names, feature_dims)
        check_reduction("AttentionLSTM", loss_reduction)
        if len(fc_sizes) != 2:
            raise ConfigError(f"AttentionLSTM: fc_sizes must hold two sizes, got {list(fc_sizes)}")
        self.feature_names, self.feature_dims = list(feature_names), [int(d) for d in feature_dims]
        self.use_mask, self.loss_reduction = use_mask, loss_reduction
        self.head = AttentionLstmHead(self.feature_dims, embedding_size, lstm_size, drop_rate,
                                      [int(s) for s in fc_sizes], num_classes)

    def export_spec(self, example=None):
        return {"inputs": padded_feature_spec(self.feature_names, self.feature_dims),
                "outputs": ["logits", "probs"]}

    def forward(self, batch):
        feats = [feature_input(batch, n, d, "AttentionLSTM")
                 for n, d in zip(self.feature_names, self.feature_dims)]
        logits = self.head(feats, self.use_mask)
        return multilabel_outputs(self, logits, batch, self.loss_reduction)


WEIGHTS.add(PretrainedEntry(
    name="AttentionLSTM_yt8",
    model="AttentionLSTM",
    urls=["https://videotag.bj.bcebos.com/PaddleVideo-release2.2/AttentionLSTM_yt8.pdparams"],
    sha256=None,  # not published
    source="PaddleVideo 2.x dygraph .pdparams (Recognizer1D + AttentionLstmHead, keys 'head.*')",
    head_keys=[r"head\.fc_logit\.(weight|bias)"],
    model_args={"num_classes": 3862, "feature_names": ["rgb", "audio"], "feature_dims": [1024, 128],
                "embedding_size": 512, "lstm_size": 1024, "fc_sizes": [8192, 4096]},
    metrics={"hit_at_1": 0.8905, "perr": 0.8049, "gap": 0.8630},
    metrics_source="PaddleVideo docs/en/model_zoo/recognition/attention_lstm.md (release 2.2+ model "
                   "zoo table; GAP there is a per-batch average, not the global GAP)",
    dataset="YouTube-8M (2018) validate",
    num_params=108737304,
    config="configs/video/attention_lstm/attention_lstm_bilstm_10e_youtube8m.yaml",
    notes="The file stores each LSTM tensor under two keys (bi_lstmN.weight_ih_l0 and "
          "bi_lstmN.0.cell_fw.weight_ih); the first one loads, the alias is skipped.",
    reproduced="official outputs matched on golden weights (max abs diff 2.3e-6); demo recipe trained (see its family page); the full recipe needs YouTube-8M (not run)",
))
