"""Data parallel on CPU (gloo): 2 processes train like 1 with the same global batch, and evaluate exactly alike."""
import json
import os

import numpy as np
import paddle
import pytest

from engine import config, runtime
from engine.components import load_all
from engine.errors import ConfigError
from engine.registry import MODELS
from engine.training.trainer import wants_sync_bn
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import launch, logged_losses, read_metrics, tool

# Why 1e-5: 2 ranks average two half-batch gradients where 1 process averages one batch, so the sums
# run in another order; in float32 that moves a loss of ~4 by a few 1e-7 (measured: at most 4.8e-7 over
# the 50 steps, on an AMD EPYC Zen 4). A wrong gradient scale or a rank training on the wrong samples
# moves the losses by 1e-3 and more within a few steps.
LOSS_TOLERANCE = 1e-5


def test_two_processes_train_like_one_with_the_same_global_batch(two_process_run, one_process_run):
    # per-card batch 16 on 2 processes == batch 32 on 1 (the demo's batch_size is 32)
    two, one = logged_losses(two_process_run), logged_losses(one_process_run)
    assert len(two) == len(one) == 50
    assert np.abs(two - one).max() <= LOSS_TOLERANCE, np.abs(two - one).max()
    load_all()
    assert config.load(str(two_process_run / "config.yaml"))["runtime"]["world_size"] == 2
    assert not os.path.exists(two_process_run / "checkpoints" / ".epoch_2.tmp")


def test_two_processes_keep_the_moving_average_of_one(two_process_run, one_process_run):
    """train.ema under data parallel: rank 0's average (the one saved) is the one-process average, in the
    last checkpoint's ema.pdparams and in final/ (the average's weights), to the losses' agreement."""
    for name in ("checkpoints/epoch_2/ema.pdparams", "final/model.pdparams"):
        two, one = (paddle.load(str(run / name), return_numpy=True) for run in (two_process_run, one_process_run))
        assert two.keys() == one.keys() and len(two) > 10, name
        diff = max(float(np.abs(two[k] - one[k]).max()) for k in two)
        assert diff <= 1e-5, (name, diff)
    with open(two_process_run / "checkpoints" / "epoch_2" / "state.json") as f:
        assert json.load(f)["hooks"]["ema"]["step"] == 50


def test_two_process_eval_equals_one_process_on_an_odd_dataset(odd_eval, tmp_path):
    args, one = odd_eval
    launch(2, "eval", *args, "--output", tmp_path / "two", log_dir=tmp_path / "log")
    two = read_metrics(tmp_path / "two")
    assert one["num_samples"] == two["num_samples"] == 99
    for k in ("gap", "hit_at_1", "perr"):
        assert one[k] == two[k], (k, one[k], two[k])


def test_sync_bn_on_several_cpu_processes_is_a_clear_error():
    """One CPU process: plain BatchNorm (the same statistics); several: each would normalise its own
    share, refused; a GPU run converts."""
    cpu = {"device": "cpu", "world_size": 1}
    assert wants_sync_bn(True, cpu) is False and wants_sync_bn(False, cpu) is False
    assert wants_sync_bn(True, {"device": "gpu", "world_size": 1}) is True
    assert wants_sync_bn(True, {"device": "gpu", "world_size": 4}) is True
    with pytest.raises(ConfigError, match=r"runtime.sync_bn: .*no CPU kernel.* 2 CPU processes"):
        wants_sync_bn(True, {"device": "cpu", "world_size": 2})


def test_sync_bn_conversion_keeps_frozen_batch_norm():
    """SyncBatchNorm for the BN layers that train; the frozen stem/stage 1 and norm_eval layers keep
    their global statistics (paddle's own conversion would turn them into training layers)."""
    load_all()
    model = MODELS.build({"name": "ResNet", "depth": 18, "frozen_stages": 1})
    frozen = {name for name, layer in model.named_sublayers()
              if isinstance(layer, paddle.nn.BatchNorm2D) and layer._use_global_stats}
    # the stem's BN, stage 1's two blocks x 2 and its projection shortcut (the kits' ResNet-18 has one)
    assert len(frozen) == 1 + 4 + 1
    runtime.convert_sync_bn(model)
    kinds = {name: type(layer).__name__ for name, layer in model.named_sublayers()
             if isinstance(layer, paddle.nn.layer.norm._BatchNormBase)}
    assert {n for n, k in kinds.items() if k == "BatchNorm2D"} == frozen
    assert sum(k == "SyncBatchNorm" for k in kinds.values()) == 21 - 6   # 1 + 8 x 2 + 4 shortcuts
    everything = MODELS.build({"name": "ResNet", "depth": 18, "norm_eval": True})
    runtime.convert_sync_bn(everything)
    assert not any(isinstance(layer, paddle.nn.SyncBatchNorm) for layer in everything.sublayers())
