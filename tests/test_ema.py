"""train.ema: the moving average of the weights against PaddleDetection's ModelEMA formula, computed
here in numpy from the weights each step recorded (not from engine/training/ema.py); in a training
run, its evaluation, best/ and final/; its fp32 shadow under O2 (the GPU path simulated as
tests/test_gpu_path.py does); the one-line errors. Resume after kill -9: tests/test_step_schedule.py;
two gloo ranks: tests/test_distributed.py."""
import json
import logging
import math
import os
import re

import numpy as np
import paddle
import pytest

from engine import config
from engine.components import load_all
from engine.config import AmpSection
from engine.registry import MODELS
from engine.session import Session
from engine.training import ema as ema_module, trainer
from engine.training.ema import ModelEMA
from engine.training.evaluator import evaluate
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT, assert_one_line_error, tool
from tests.test_gpu_path import paddle_on_a_gpu  # noqa: F401  (the fixture)

SMALL = ["model.embedding_size=16", "model.lstm_size=16", "model.fc_sizes=[32, 16]", "train.epochs=null",
         "train.max_steps=12", "train.eval_steps=6", "train.save_steps=6", "train.log_interval=4",
         "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]", "train.best_metric=gap"]


def _kits_decay(kind, decay, t):
    """ppdet/optimizer/ema.py ModelEMA.update, step t from 0."""
    if kind == "threshold":
        return min(decay, (1 + t) / (10 + t))
    if kind == "exponential":
        return decay * (1 - math.exp(-(t + 1) / 2000))
    return decay


def _kits_average(states, kind, decay):
    """The shadow of ModelEMA over `states` (the weights after each step), then its `apply`: zeros at the
    start, d s + (1 - d) w each step in float32, divided by 1 - d_T^T (the last step's d) unless
    exponential."""
    shadow = {k: np.zeros_like(v, np.float32) for k, v in states[0].items()}
    for t, w in enumerate(states):
        d = _kits_decay(kind, decay, t)
        shadow = {k: np.float32(d) * s + np.float32(1 - d) * w[k].astype(np.float32) for k, s in shadow.items()}
    if kind != "exponential":
        shadow = {k: s / np.float32(1 - d ** len(states)) for k, s in shadow.items()}
    return shadow


class _Tiny(paddle.nn.Layer):
    """A linear layer and a BatchNorm (whose running statistics are buffers, averaged too, as ppdet's)."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3)

    def forward(self, x):
        return self.bn(self.fc(x))


@pytest.mark.parametrize("kind, decay", [("threshold", 0.9998), ("threshold", 0.5), ("exponential", 0.9998),
                                         ("normal", 0.9)])
def test_the_average_is_ppdets_over_the_recorded_weights(kind, decay):
    paddle.seed(0)
    model, rng = _Tiny(), np.random.default_rng(0)
    opt = paddle.optimizer.Momentum(0.1, parameters=model.parameters())
    ema = ModelEMA(model, decay, kind)
    assert {str(v.dtype) for v in ema.shadow.values()} == {"paddle.float32"}
    assert {"bn._mean", "bn._variance"} <= set(ema.shadow)        # BN statistics averaged as ppdet does
    states = []
    for _ in range(7):
        model(paddle.to_tensor(rng.standard_normal((8, 4)).astype("float32"))).square().mean().backward()
        opt.step()
        opt.clear_grad()
        ema.update(model)
        states.append({k: v.numpy().copy() for k, v in model.state_dict().items()})
    want = _kits_average(states, kind, decay)
    got = ema.averaged(model)
    for k, v in want.items():
        np.testing.assert_allclose(got[k].numpy(), v, rtol=2e-6, atol=1e-7, err_msg=k)
    # the model's own weights are untouched, and `applied` puts them back after the block
    with ema.applied(model):
        np.testing.assert_array_equal(model.fc.weight.numpy(), got["fc.weight"].numpy())
    np.testing.assert_array_equal(model.fc.weight.numpy(), states[-1]["fc.weight"])


def test_black_list_and_cycle_epoch():
    paddle.seed(0)
    model = _Tiny()
    ema = ModelEMA(model, 0.9, "normal", cycle_epoch=2, black_list=["bn."])
    assert set(ema.shadow) == {"fc.weight", "fc.bias"}
    for epoch in (0, 0, 1, 1):
        ema.update(model, epoch)
    assert ema.step == 4
    ema.update(model, 2)      # epoch 2: two epochs since the start, the average starts again (ppdet's reset)
    assert ema.step == 1 and ema.since == 2
    np.testing.assert_allclose(ema.averaged(model)["fc.weight"].numpy(), model.fc.weight.numpy(), rtol=1e-6)
    assert ema.averaged(model)["bn._mean"] is model.state_dict()["bn._mean"]   # kept as trained


def test_a_run_evaluates_and_saves_the_average_of_its_steps(yt8m_demo, tmp_path, monkeypatch, caplog):
    """In a training run the average moves once per optimizer step (2 micro-batches each here), its
    weights are what is evaluated and what best/ and final/ hold; checkpoints keep the trained weights
    beside ema.pdparams."""
    load_all()
    recorded, update = [], ema_module.ModelEMA.update

    def recording(self, model, epoch=0):
        recorded.append({k: v.numpy().copy() for k, v in model.state_dict().items()})
        return update(self, model, epoch)
    monkeypatch.setattr(ema_module.ModelEMA, "update", recording)
    overrides = SMALL + ["train.ema.enable=true", "train.ema.decay=0.9", "train.accum_steps=2"]
    session = Session.from_file(os.path.join(ROOT, ATTENTION_LSTM_DEMO), overrides)
    caplog.set_level(logging.INFO, logger="zoo")
    trainer.fit(session, str(tmp_path))
    assert len(recorded) == 12                                       # one per optimizer step, not per batch
    final = paddle.load(str(tmp_path / "final" / "model.pdparams"), return_numpy=True)
    want = _kits_average(recorded, "threshold", 0.9)
    for k in want:
        np.testing.assert_allclose(final[k], want[k], rtol=2e-6, atol=1e-7, err_msg=k)
    ckpt = tmp_path / "checkpoints" / "step_12"
    trained = paddle.load(str(ckpt / "model.pdparams"), return_numpy=True)
    for k, v in trained.items():
        np.testing.assert_array_equal(v, recorded[-1][k], err_msg=k)   # the trained weights, not the average
    shadow = paddle.load(str(ckpt / "ema.pdparams"), return_numpy=True)
    assert set(shadow) == set(want)
    with open(ckpt / "state.json") as f:
        assert json.load(f)["hooks"]["ema"]["step"] == 12
    # the logged evaluations are of the average: the last equals metrics.json, computed again from final/
    log = caplog.text
    assert len(re.findall(r"eval at epoch \d+, step \d+ \(EMA weights\)", log)) == 2, log[-2000:]
    model = MODELS.build(session.cfg["model"])
    model.set_state_dict(final)
    loader, dataset, _ = session.loader("val")
    metrics = evaluate(model, loader, session.metric(dataset), AmpSection())
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["gap"] == pytest.approx(metrics["gap"], abs=1e-6)


def test_the_shadow_stays_fp32_under_o2_and_evaluates_like_the_fp32_run(yt8m_demo, paddle_on_a_gpu):
    """O2 (simulated: paddle's cast believes it is on a GPU) keeps fp16 weights; the shadow is fp32 and
    the averaged weights, put into the O2 model, evaluate as the fp32 model's average does (to fp16's
    rounding of the averaged weights). PaddleDetection PR #8305: an fp16 shadow evaluated to about 0."""
    from tests.test_gpu_path import VAL, _o2_train_step
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO), [VAL])
    s, step = _o2_train_step(cfg, "float16")
    o2, fp32 = step.model, MODELS.build(cfg["model"])
    rng = np.random.default_rng(1)
    emas = [ModelEMA(o2, 0.999), ModelEMA(fp32, 0.999)]
    assert all(str(v.dtype) == "paddle.float32" for e in emas for v in e.shadow.values())
    for _ in range(4):   # the same weights in both (fp16-representable), as an O2 step and its fp32 twin see them
        own = o2.state_dict(use_hook=False)
        values = {k: (v.astype("float32").numpy() * (1 + 0.01 * rng.standard_normal(v.shape))).astype(np.float16)
                  for k, v in own.items() if v.dtype in (paddle.float16, paddle.float32)}
        o2.set_state_dict({k: paddle.to_tensor(v).astype(own[k].dtype) for k, v in values.items()})
        fp32.set_state_dict({k: paddle.to_tensor(v.astype(np.float32)) for k, v in values.items()})
        for e, m in zip(emas, (o2, fp32)):
            e.update(m)
    loader, dataset, _ = s.loader("val")
    got = []
    for e, m in zip(emas, (o2, fp32)):
        with e.applied(m):
            got.append(evaluate(m, loader, s.metric(dataset), AmpSection()))
    assert got[0]["gap"] == pytest.approx(got[1]["gap"], abs=0.01) and got[1]["gap"] > 0.0, got
    assert {p.dtype for p in o2.parameters()} >= {paddle.float16}   # the O2 model keeps its dtypes after


@pytest.mark.parametrize("override, message", [
    ("train.ema.decay=1.0", "error: -o: train.ema.decay: must be in (0, 1), got 1.0"),
    ("train.ema.decay=0", "error: -o: train.ema.decay: must be in (0, 1), got 0"),
    ("train.ema.decay_type=cosine", "error: -o: train.ema.decay_type: must be one of threshold, exponential, normal"),
])
def test_bad_ema_settings_are_one_line(yt8m_demo, tmp_path, override, message):
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "--output", tmp_path, "-o", override, check=False)
    assert_one_line_error(proc, message)
