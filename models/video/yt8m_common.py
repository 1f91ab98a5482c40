"""The helpers the three YouTube-8M models (AttentionLSTM, NeXtVLAD, Attention Cluster) share: the
constructor checks, reading a modality with its lengths/mask from the batch, the sigmoid
cross-entropy, the export inputs of padded batches and the train/eval output dicts.
"""
import typing

import paddle
import paddle.nn.functional as F
from paddle.static import InputSpec

from engine.errors import ConfigError


def check_features(model, feature_names, feature_dims):
    """Constructor check: one dim per feature name."""
    if len(feature_names) != len(feature_dims) or not feature_names:
        raise ConfigError(f"{model}: feature_names {list(feature_names)} and feature_dims "
                          f"{list(feature_dims)} must be non-empty lists of the same length")


def _tensor(value):
    return value if isinstance(value, paddle.Tensor) else paddle.to_tensor(value)


def feature_input(batch, name, dim, model):
    """(x [B,T,D] float, lengths [B] int64, mask [B,T] float) for one modality.

    The mask may also come as [B,T,D] (PaddleVideo's FeatureDecoder layout); it is reduced to [B,T].
    Missing lengths/mask mean every frame is real.
    """
    if name not in batch:
        raise ConfigError(f"{model}: the batch has no '{name}' (feature_names); batch keys: "
                          f"{', '.join(sorted(k for k in batch if not k.startswith('_')))}")
    x = _tensor(batch[name])
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ConfigError(f"{model}: batch '{name}' has shape {list(x.shape)}, expected "
                          f"[batch, frames, {dim}] (feature_dims)")
    if not paddle.is_floating_point(x):
        x = x.astype("float32")
    mask = batch.get(name + "_mask")
    lengths = batch.get(name + "_len")
    if mask is not None:
        mask = _tensor(mask).astype(x.dtype)
        if mask.ndim == 3:
            mask = mask.mean(axis=2)
    if lengths is not None:
        lengths = _tensor(lengths).astype("int64").reshape([-1])
    if mask is None and lengths is not None:
        mask = (paddle.arange(x.shape[1], dtype="int64").unsqueeze(0) < lengths.unsqueeze(1)).astype(x.dtype)
    if mask is None:
        mask = paddle.ones(x.shape[:2], dtype=x.dtype)
    if lengths is None:
        lengths = mask.sum(axis=1).round().astype("int64")
    return x, lengths, mask


def sigmoid_ce(logits, labels, reduction="mean"):
    """Sigmoid cross-entropy summed over classes; 'mean' averages over the batch, 'sum' adds it up."""
    per_video = F.binary_cross_entropy_with_logits(
        logits.astype("float32"), labels.astype("float32"), reduction="none").sum(axis=-1)
    return per_video.sum() if reduction == "sum" else per_video.mean()


def padded_feature_spec(names, dims, lengths=True):
    """Export inputs of the PadSequences batches: features [B, T, D], masks [B, T] and (for models
    that use them) lengths [B]."""
    spec = {}
    for name, dim in zip(names, dims):
        spec[name] = InputSpec([None, None, dim], "float32")
        if lengths:
            spec[name + "_len"] = InputSpec([None], "int64")
        spec[name + "_mask"] = InputSpec([None, None], "float32")
    return spec


def multilabel_outputs(layer, logits, batch, reduction="mean"):
    """Train mode: {'loss'}; eval mode: {'logits', 'probs'} (+ 'loss' when the batch has labels)."""
    labels = batch.get("labels")
    if layer.training:
        if labels is None:
            raise ConfigError(f"{type(layer).__name__}: training needs 'labels' (multi-hot [B, C]) "
                              f"in the batch")
        return {"loss": sigmoid_ce(logits, _tensor(labels), reduction)}
    out = {"logits": logits, "probs": F.sigmoid(logits)}
    if labels is not None:
        out["loss"] = sigmoid_ce(logits, _tensor(labels), reduction)
    return out


# how the models' loss sums over the batch (`loss_reduction`): averaged, or summed as PaddleVideo's
# BCEWithLogitsLoss(sum), whose learning rates assume it
Reduction = typing.Literal["mean", "sum"]


def check_reduction(model, reduction):
    if reduction not in typing.get_args(Reduction):
        raise ConfigError(f"{model}: loss_reduction must be 'mean' or 'sum', got '{reduction}'")
