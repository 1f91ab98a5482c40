"""AMP control flow. fp16 loss scaling needs a GPU, so its order is checked on the CPU through a
stand-in scaler that records what the trainer calls and pretends one step overflowed (under bf16
settings, which run here). bf16's arithmetic on the CPU: tests/test_bf16.py."""
import os

import numpy as np
import paddle
import pytest

from engine import config
from engine.components import load_all
from engine.errors import ConfigError
from engine.session import Session
from engine.training import trainer
from tests.conftest import ATTENTION_LSTM_DEMO

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

SMALL = ["train.epochs=1", "train.clip_grad_norm=1.0", "train.amp.enable=true", "train.amp.dtype=bfloat16",
         "reader.train.files=[data/youtube8m_demo/tfrecord/validate0000.tfrecord]",
         "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]"]


class StandInScaler:
    """Scales by 1024, and on `overflow_step` reports inf gradients, so `step` must not update."""

    def __init__(self, events, overflow_step):
        self.events, self.overflow_step, self.calls = events, overflow_step, 0
        self.found_inf = False

    def is_enable(self):
        return True

    def scale(self, loss):
        self.events.append("scale")
        scaled = loss * 1024.0
        scaled.register_hook(lambda g: self.events.append("backward"))
        return scaled

    def unscale_(self, optimizer):
        self.events.append("unscale")
        for group in optimizer._param_groups:
            for p in group["params"] if isinstance(group, dict) else [group]:
                if p.grad is not None:
                    p.grad.set_value(p.grad / 1024.0)
        self.calls += 1
        self.found_inf = self.calls == self.overflow_step

    def step(self, optimizer):
        self.events.append("step")
        params = [p for g in optimizer._param_groups for p in (g["params"] if isinstance(g, dict) else [g])]
        before = [p.numpy().copy() for p in params]
        if not self.found_inf:
            optimizer.step()
        changed = any(not np.array_equal(b, p.numpy()) for b, p in zip(before, params))
        self.events.append("updated" if changed else "skipped")

    def update(self):
        self.events.append("update")

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_scaler_order_and_overflow_skip(yt8m_demo, tmp_path, monkeypatch):
    load_all()
    events = []
    clip = trainer.clip_grad_norm_

    def recording_clip(params, max_norm):
        events.append("clip")
        return clip(params, max_norm)

    monkeypatch.setattr(trainer, "clip_grad_norm_", recording_clip)
    cfg = config.load(os.path.join(os.path.dirname(os.path.dirname(__file__)), ATTENTION_LSTM_DEMO),
                      [f"{o}" for o in SMALL])
    scaler = StandInScaler(events, overflow_step=2)
    monkeypatch.setattr(trainer, "make_scaler", lambda amp: scaler)
    trainer.fit(Session(cfg), str(tmp_path))
    steps = [events[i:i + 7] for i in range(0, len(events), 7)]
    assert len(steps) == 4  # 100 samples, batch 32
    for i, step in enumerate(steps):
        outcome = "skipped" if i == 1 else "updated"
        assert step == ["scale", "backward", "unscale", "clip", "step", outcome, "update"], (i, step)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_bf16_levels_train_on_cpu(yt8m_demo, tmp_path, level):
    """Both levels run through the same loop (O2 as O1 on a CPU: fp32 weights) and the loss stays
    finite; fp16 on a CPU stops before training with the config error."""
    load_all()
    root = os.path.dirname(os.path.dirname(__file__))
    cfg = config.load(os.path.join(root, ATTENTION_LSTM_DEMO), SMALL + [f"train.amp.level={level}"])
    model, metrics = trainer.fit(Session(cfg), str(tmp_path))
    assert np.isfinite(metrics["loss"])
    assert all(p.dtype == paddle.float32 for p in model.parameters())
    scaler = trainer.make_scaler(cfg.train.amp)
    assert isinstance(scaler, paddle.amp.GradScaler) and not scaler.is_enable()   # bf16: no loss scaling
    cfg = config.load(os.path.join(root, ATTENTION_LSTM_DEMO), SMALL + ["train.amp.dtype=float16"])
    with pytest.raises(ConfigError, match="train.amp.dtype: float16 needs a GPU"):
        trainer.fit(Session(cfg), str(tmp_path / "fp16"))


@pytest.mark.parametrize("activations", ["float32", "bfloat16", None])
def test_cpu_bf16_activations_follow_train_amp(monkeypatch, activations):
    """On a CPU with native bf16 (claimed here: this checks what train.amp enters, not the kernels,
    tests/test_bf16_activations.py does those), train.amp bf16 enters a precision with bf16 on, and
    with `activations: bfloat16` (the default, None here) bf16 activations too; both end with the
    block. Where the CPU has no native bf16, resolve_amp turns AMP off and neither is entered."""
    import ops   # loads paddle's custom-op machinery; only these tests need it
    from engine import runtime
    given = {} if activations is None else {"activations": activations}
    amp = config.AmpSection.of({"enable": True, "dtype": "bfloat16", **given})

    def bf16():
        return ops.current_precision().bf16, ops.current_precision().bf16_act

    with ops.precision(fast_ops=True):
        monkeypatch.setattr(ops, "bf16_supported", lambda: True)
        with runtime.autocast(runtime.resolve_amp(amp)):
            inside = bf16()
        assert inside == (True, activations != "float32")
        assert bf16() == (False, False)
        monkeypatch.setattr(ops, "bf16_supported", lambda: False)
        resolved = runtime.resolve_amp(amp)
        with runtime.autocast(resolved):
            assert not resolved.enable and bf16() == (False, False)
    load_all()
    with pytest.raises(ConfigError, match="train.amp.activations"):
        config.load(os.path.join(os.path.dirname(os.path.dirname(__file__)), ATTENTION_LSTM_DEMO),
                    ["train.amp.activations=float16"])
