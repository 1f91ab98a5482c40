"""Data parallel on CPU (gloo): 2 processes train like 1 with the same global batch, and evaluate exactly alike."""
import os

import numpy as np

from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import assert_one_line_error, launch, read_metrics, tool

NO_DROPOUT = ["-o", "model.drop_rate=0", "-o", "train.epochs=1", "-o", "train.log_interval=1",
              "-o", "runtime.num_threads=1"]


def _losses(output_dir):
    from visualdl import LogReader
    vdl = os.path.join(output_dir, "vdl")
    name = [f for f in os.listdir(vdl) if f.startswith("vdlrecords")][0]
    return np.array([r.value for r in LogReader(file_path=os.path.join(vdl, name)).get_data("scalar", "train/loss")])


def test_two_processes_train_like_one_with_the_same_global_batch(yt8m_demo, tmp_path):
    # per-card batch 16 on 2 processes == batch 32 on 1 (the demo's batch_size is 32)
    launch(2, "train", "-c", ATTENTION_LSTM_DEMO, *NO_DROPOUT, "-o", "reader.train.batch_size=16",
           "--output", tmp_path / "two", log_dir=tmp_path / "log")
    tool("train", "-c", ATTENTION_LSTM_DEMO, *NO_DROPOUT, "--output", tmp_path / "one")
    two, one = _losses(tmp_path / "two"), _losses(tmp_path / "one")
    assert len(two) == len(one) == 25
    assert np.abs(two - one).max() <= 1e-5, np.abs(two - one).max()
    from engine import config
    from engine.components import load_all
    load_all()
    assert config.load(str(tmp_path / "two" / "config.yaml"))["runtime"]["world_size"] == 2
    assert not os.path.exists(tmp_path / "two" / "checkpoints" / ".epoch_1.tmp")


def test_two_process_eval_equals_one_process_on_an_odd_dataset(attention_lstm_run, yt8m_demo, tmp_path):
    from readers.tfrecord import iter_records, write_records
    src = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    records = [r for _, r in zip(range(99), iter_records(src))]
    odd = tmp_path / "odd.tfrecord"
    write_records(str(odd), records)
    args = ["-c", ATTENTION_LSTM_DEMO, "-o", f"reader.val.files=[{odd}]", "-o", "reader.val.batch_size=16",
            "--weights", os.path.join(attention_lstm_run, "final")]
    tool("eval", *args, "--output", tmp_path / "one")
    launch(2, "eval", *args, "--output", tmp_path / "two", log_dir=tmp_path / "log")
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert one["num_samples"] == two["num_samples"] == 99
    for k in ("gap", "hit_at_1", "perr"):
        assert one[k] == two[k], (k, one[k], two[k])


def test_sync_bn_on_cpu_is_a_clear_error(tmp_path):
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "runtime.sync_bn=true", "--output", tmp_path, check=False)
    assert_one_line_error(proc, "sync_bn", "CPU")


def test_sync_bn_conversion_keeps_frozen_batch_norm():
    """SyncBatchNorm for the BN layers that train; the frozen stem/stage 1 and norm_eval layers keep
    their global statistics (paddle's own conversion would turn them into training layers)."""
    import paddle
    from engine import runtime
    from engine.components import load_all
    from engine.registry import MODELS
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
