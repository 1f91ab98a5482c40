"""The float input of the image and video models: uint8 pixels (Normalize with `in_main_process`,
the default: readers/transforms.py) normalised after collation, on the batch's device.

A batch crosses the DataLoader's process boundary as uint8 (a quarter of float32's bytes) with
`<key>_normalize` = [shift, scale] per RGB channel per sample; `as_float` computes
(x - shift) * scale there, channel = 3 * frame + rgb, on axis -3 (images [B, 3, H, W], clips
[B, T, C, H, W] or [B, V, T, C, H, W]). Where PadImages padded the batch (`<key>_size`, each
sample's height and width), the padding comes out 0.0, as when float32 pixels were padded with 0.
The exported-model predictor does the same on the host (deploy/predictor.py, normalize_batch).
"""
import numpy as np
import paddle

from engine.errors import ConfigError


def as_float(batch, key):
    """batch[key] as float32, normalised when it is uint8; a float tensor passes untouched."""
    x = batch[key]
    if x.dtype != paddle.uint8:
        return x
    norm = batch.get(key + "_normalize")
    if not norm:
        raise ConfigError(f"{key} is uint8 but the batch has no '{key}_normalize': end the reader's "
                          f"transforms with Normalize")
    shift, scale = (np.asarray(v, np.float32) for v in norm[0])
    reps = x.shape[-3] // 3
    shape = [x.shape[-3], 1, 1]
    out = (x.astype("float32") - paddle.to_tensor(np.tile(shift, reps).reshape(shape))) * \
        paddle.to_tensor(np.tile(scale, reps).reshape(shape))
    size = batch.get(key + "_size")
    if size is not None and out.ndim == 4:
        size = size if isinstance(size, paddle.Tensor) else paddle.to_tensor(np.asarray(size))
        size = size.reshape([-1, 2]).astype("int64")
        rows = paddle.arange(out.shape[2], dtype="int64").unsqueeze(0) < size[:, :1]   # [B, H]
        cols = paddle.arange(out.shape[3], dtype="int64").unsqueeze(0) < size[:, 1:]   # [B, W]
        inside = paddle.logical_and(rows.unsqueeze([1, 3]), cols.unsqueeze([1, 2]))    # [B, 1, H, W]
        out = paddle.where(inside, out, paddle.zeros_like(out))
    return out


def with_float(batch, key):
    """A shallow copy of `batch` whose `key` is `as_float`'s."""
    if not (isinstance(batch[key], paddle.Tensor) and batch[key].dtype == paddle.uint8):
        return batch
    return {**batch, key: as_float(batch, key)}
