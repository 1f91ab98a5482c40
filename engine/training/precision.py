"""Mixed precision in training, as the kits run it on a GPU: the loss scaler, the O2 cast and
what O2 means for the files and for an fp32 evaluation.

O2 casts the weights to fp16/bf16 and keeps fp32 master weights in the optimizer (PaddleSeg,
PaddleDetection and PaddleNLP: `paddle.amp.decorate(..., level="O2", save_dtype="float32")`): every
file we write (checkpoints, best/, final/) holds fp32 weights, so eval, export, infer and
`train.pretrained` read them into fp32 models. On a CPU paddle's decorate does nothing (our CPU bf16
runs O2 as O1: runtime.resolve_amp).
"""
import contextlib
import logging

import paddle

log = logging.getLogger("zoo")

LOW_PRECISION = (paddle.float16, paddle.bfloat16)


class LossScaler(paddle.amp.GradScaler):
    """paddle's GradScaler with its scale update written for numpy 2: paddle 3.3.1's `_update` calls
    `float()` on the shape-[1] scale when it lowers it, which numpy >= 2.4 refuses (TypeError), so an
    fp16 run would die at its first overflow. The update rule is paddle's (halve the scale after
    `decr_every_n_nan_or_inf` overflowing steps, double it after `incr_every_n_steps` clean ones)."""

    def _update(self):
        if not self._enable:
            return
        if self._cache_found_inf:
            self._incr_count, self._decr_count = 0, self._decr_count + 1
            if self._decr_count == self._decr_every_n_nan_or_inf:
                before = float(self._scale.reshape([]))   # a host read, only on an overflow
                self._scale = self._scale * self._decr_ratio
                self._decr_count = 0
                log.info("fp16 loss scale %g -> %g (inf/nan gradients: the step was skipped)",
                         before, before * self._decr_ratio)
        else:
            self._decr_count, self._incr_count = 0, self._incr_count + 1
            if self._incr_count == self._incr_every_n_steps:
                self._scale = self._scale * self._incr_ratio
                self._incr_count = 0

    def scale_value(self):
        return float(self._scale.reshape([])) if self._enable else 1.0


def make_scaler(amp):
    """fp16 needs loss scaling; bf16 and fp32 do not (the scaler then passes everything through)."""
    return LossScaler(enable=amp.enable and amp.dtype == "float16", init_loss_scaling=amp.init_loss_scaling)


def restore_scaler(scaler, state, where):
    """Load a checkpoint's scaler state, or say in one line why the run starts a fresh scaler: a run
    saved without fp16 has none (`{}`), and a run resumed without fp16 needs none."""
    if not scaler.is_enable():
        if state:
            log.info("%s: the checkpoint's fp16 loss scale is not used (this run has no fp16 loss scaling)", where)
        return
    if not state:
        log.info("%s: the checkpoint has no loss-scaler state (saved without fp16): a fresh scaler at %g",
                 where, scaler.scale_value())
        return
    scaler.load_state_dict(state)


def decorate_o2(model, optimizer, amp):
    """AMP level O2 on a GPU: low-precision weights, fp32 master weights in the optimizer, fp32 in
    every state_dict. paddle leaves norm layers in fp32 (their gradients stay fp32: clipping must
    take mixed dtypes, optim.clip_grad_norm_)."""
    return paddle.amp.decorate(model, optimizer, level="O2", dtype=amp.dtype, master_weight=True,
                               save_dtype="float32")


def has_low_precision_weights(model):
    return any(p.dtype in LOW_PRECISION for p in model.parameters())


@contextlib.contextmanager
def float32_weights(model):
    """The model's fp16/bf16 weights (an O2 model's) in fp32 inside the block, and back after it:
    evaluation with AMP off after O2 training feeds fp32 inputs, which fp16 weights refuse. fp16 and
    bf16 values are exact in fp32, so the round trip changes no weight; the optimizer keeps the same
    parameter objects (cast in place)."""
    cast = []
    for layer in model.sublayers(include_self=True):
        own = [t for t in list(layer._parameters.values()) + list(layer._buffers.values()) if t is not None]
        dtypes = {t.dtype for t in own if t.dtype in LOW_PRECISION}
        if dtypes:
            layer._to_impl(dtype="float32", include_sublayers=False, floating_only=True)
            cast.append((layer, dtypes.pop()))
    try:
        yield model
    finally:
        for layer, dtype in cast:
            layer._to_impl(dtype=dtype, include_sublayers=False, floating_only=True)
