"""An exponential moving average of the weights (`train.ema`), with PaddleDetection's ModelEMA rules.

After every optimizer step t (from 0) each float entry of the model's state_dict, parameters and
buffers alike (BatchNorm's running statistics too, as ppdet averages them), moves its shadow:

    d_t = min(decay, (1 + t) / (10 + t))          threshold (ppdet's default; a short memory early on)
    d_t = decay * (1 - exp(-(t + 1) / 2000))      exponential
    d_t = decay                                   normal
    shadow = d_t * shadow + (1 - d_t) * w_t,      shadow starting at 0

and the weights evaluated and saved are shadow / (1 - d_T ** T) after T steps (ppdet's bias correction,
with the last step's d; not for `exponential`, whose warm-up has none to correct). The shadow is fp32
whatever the weights' dtype: ppdet's PR #8305 found an fp16 shadow under O2 evaluating to about 0.
Entries named by `black_list` fragments, and the integer buffers, are taken as trained. `cycle_epoch`
restarts the average every that many epochs (ppdet's regularising reset, made once an epoch's
evaluation and checkpoint have used it: here at the next epoch's first update).

Under data parallel every rank updates its own shadow from the same all-reduced weights, so the
shadows agree (BatchNorm statistics are each rank's own, as they are in the model; rank 0's are saved).
"""
import contextlib
import math

import paddle

FLOATS = (paddle.float32, paddle.float16, paddle.bfloat16, paddle.float64)


def _state(model):
    """The model's own tensors: under O2 (paddle.amp.decorate's save_dtype) a plain state_dict() hands
    back fp32 copies, which cost a copy per step and cannot be set back into fp16 weights."""
    return model.state_dict(use_hook=False)


class ModelEMA:
    def __init__(self, model, decay=0.9998, decay_type="threshold", cycle_epoch=-1, black_list=None):
        self.decay, self.decay_type, self.cycle_epoch = float(decay), decay_type, cycle_epoch
        state = _state(model)
        fragments = list(black_list or [])
        self.kept = {k for k, v in state.items() if v.dtype not in FLOATS or any(f in k for f in fragments)}
        self.shadow = {k: paddle.zeros(v.shape, "float32") for k, v in state.items() if k not in self.kept}
        self.step, self.last_decay = 0, None
        self.since = 0   # the epoch this average started in (cycle_epoch)

    def decay_at(self, t):
        if self.decay_type == "threshold":
            return min(self.decay, (1 + t) / (10 + t))
        if self.decay_type == "exponential":
            return self.decay * (1 - math.exp(-(t + 1) / 2000))
        return self.decay

    @paddle.no_grad()
    def update(self, model, epoch=0):
        """One optimizer step's weights into the shadow; `epoch` (from 0) the one it was made in."""
        if self.cycle_epoch > 0 and epoch - self.since >= self.cycle_epoch:
            for s in self.shadow.values():
                s.zero_()
            self.step, self.last_decay, self.since = 0, None, epoch
        d = self.decay_at(self.step)
        state = _state(model)
        for k, s in self.shadow.items():
            s.scale_(d)
            s.add_(state[k].astype("float32").scale(1.0 - d))
        self.step, self.last_decay = self.step + 1, d

    @paddle.no_grad()
    def averaged(self, model):
        """The weights to evaluate and save: the bias-corrected shadow in the model's own dtypes (the
        model's values where nothing was averaged yet, and for the entries kept as trained)."""
        state = _state(model)
        if self.step == 0:
            return dict(state)
        correct = self.decay_type != "exponential"
        scale = 1.0 / (1.0 - self.last_decay ** self.step) if correct else 1.0
        out = {k: v for k, v in state.items() if k in self.kept}
        for k, s in self.shadow.items():
            out[k] = (s.scale(scale) if correct else s).astype(state[k].dtype)
        return out

    @contextlib.contextmanager
    def applied(self, model):
        """The averaged weights in `model` inside the block, the trained ones back after it (copied into
        the same parameter objects, so the optimizer keeps them)."""
        trained = {k: v.clone() for k, v in _state(model).items()}
        model.set_state_dict(self.averaged(model))
        try:
            yield model
        finally:
            model.set_state_dict(trained)

    # ------------------------------------------------------------------ checkpoints
    def state(self):
        """(JSON-able counters, the shadow tensors) for a checkpoint."""
        return {"step": self.step, "since": self.since, "last_decay": self.last_decay}, dict(self.shadow)

    def restore(self, counters, tensors):
        self.step, self.since, self.last_decay = counters["step"], counters["since"], counters["last_decay"]
        for k, s in self.shadow.items():
            s.set_value(paddle.to_tensor(tensors[k], dtype="float32"))
