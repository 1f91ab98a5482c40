"""The clip-classification pieces TSN and StNet share: the float input (uint8 pixels normalised after
collation), the batch's views, and the losses or predictions of the per-view logits.

Views (test-time crops/clips): `imgs` may be [B, V, T, C, H, W]; or [B, V*T, C, H, W] with `num_views`
set (eval only), grouped view-major (all T segments of view 0, then of view 1, ...). The eval
predictions average the softmax scores of the views (`probs`) and their logits (`logits`).
"""
import paddle
import paddle.nn.functional as F

from engine.errors import ConfigError
from models import pixels


def as_float(batch, key="imgs"):
    """The float32 clips (models.pixels.as_float): uint8 pixels normalised after collation."""
    return pixels.as_float(batch, key)


def split_views(imgs, num_views, training, model):
    """Return `imgs` as [B, V, T, ...] (see the module docstring for the conventions)."""
    if imgs.ndim == 6:
        out = imgs
    elif imgs.ndim == 5:
        views = 1 if training else num_views
        n = imgs.shape[1]
        if paddle.in_dynamic_mode() and n % views:   # exported programs see shapes as tensors
            raise ConfigError(f"{model}: imgs has {n} frames per video, not a multiple of "
                              f"num_views={views}")
        out = imgs.reshape([-1, views, n // views] + list(imgs.shape[2:]))
    else:
        raise ConfigError(f"{model}: imgs must be [B, T, C, H, W] or [B, V, T, C, H, W], "
                          f"got shape {list(imgs.shape)}")
    if training and out.shape[1] != 1:
        raise ConfigError(f"{model}: {out.shape[1]} views per video in training; multi-view batches "
                          f"are for evaluation")
    return out


def classify(view_logits, label, training):
    """view_logits [B, V, C] -> the train losses or the eval predictions (softmax averaged over views)."""
    if training:
        if label is None:
            raise ConfigError("the training batch has no 'label' (int64 [B]) for the cross-entropy loss")
        return {"loss": F.cross_entropy(view_logits[:, 0], label.reshape([-1]).astype("int64"))}
    return {"logits": view_logits.mean(axis=1), "probs": F.softmax(view_logits, axis=-1).mean(axis=1)}
