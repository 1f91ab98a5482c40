"""The training loop's flags, in process on a 100-video slice of the demo data."""
import os

import numpy as np
import paddle

from engine import builder, config, runtime
from engine.components import load_all
from engine.session import Session
from engine.training import trainer
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT

SLICE = ["train.epochs=1", "model.drop_rate=0",
         "reader.train.files=[data/youtube8m_demo/tfrecord/validate0000.tfrecord]",
         "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]", "reader.train.shuffle=false"]


def _fit(tmp_path, name, overrides):
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO), SLICE + overrides)
    model, metrics = trainer.fit(Session(cfg), str(tmp_path / name))
    return {k: v.numpy() for k, v in model.state_dict().items()}, metrics


def test_accumulation_equals_the_larger_batch(yt8m_demo, tmp_path):
    """2 micro-batches of 10 with accum_steps 2 take the same steps as batches of 20 (mean loss)."""
    big, _ = _fit(tmp_path, "big", ["reader.train.batch_size=20"])
    acc, _ = _fit(tmp_path, "acc", ["reader.train.batch_size=10", "train.accum_steps=2"])
    diff = max(float(np.abs(big[k] - acc[k]).max()) for k in big)
    assert diff <= 1e-5, diff


def test_clipping_bounds_the_update(yt8m_demo, tmp_path):
    """With a tiny clip norm the weights move much less than without clipping (SGD, lr 1)."""
    sgd = ["optimizer={name: SGD}", "lr={name: Constant, learning_rate: 1.0}", "reader.train.batch_size=50"]
    paddle.seed(0)
    free, _ = _fit(tmp_path, "free", sgd)
    clipped, _ = _fit(tmp_path, "clip", sgd + ["train.clip_grad_norm=1.0e-3"])
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO), SLICE + sgd)
    runtime.seed_all(0)
    init = {k: v.numpy() for k, v in builder.build_model(cfg["model"]).state_dict().items()}
    unique = [k for k in init if ".cell_" not in k]  # the LSTM tensors also appear under alias keys
    moved = lambda w: np.sqrt(sum(float(((w[k] - init[k]) ** 2).sum()) for k in unique))  # noqa: E731
    assert moved(clipped) <= 2 * 1e-3 + 1e-6  # 2 steps of lr 1 x norm 1e-3 (plus weight decay)
    assert moved(free) > 10 * moved(clipped)
