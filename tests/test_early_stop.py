"""train.early_stop: training ends after `patience` evaluations without an improvement of more than
min_delta in train.best_metric; one log line says so; final/ holds best/'s weights and metrics.json
their metrics; a resume knows how many evaluations it has waited, and a stopped run stays stopped."""
import filecmp
import json
import re

import pytest

from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import assert_one_line_error, read_metrics, tool

# the AttentionLSTM demo made small, evaluated every 2 optimizer steps; min_delta 1 on GAP (a ratio):
# no evaluation after the first counts as an improvement, so with patience 2 the run stops at the third
SMALL = ["model.embedding_size=16", "model.lstm_size=16", "model.fc_sizes=[32, 16]", "train.epochs=null",
         "train.eval_steps=2", "train.save_steps=2", "train.log_interval=2", "train.keep_last=0",
         "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]", "train.best_metric=gap",
         "train.early_stop.patience=2", "train.early_stop.min_delta=1.0"]


def _train(out, *extra, flags=(), check=True):
    args = ["-c", ATTENTION_LSTM_DEMO, "--output", str(out), *flags]
    for o in SMALL + list(extra):
        args += ["-o", o]
    return tool("train", *args, check=check)


def _stops(proc):
    return re.findall(r"early stop at epoch \d+, step (\d+): gap has not improved by more than 1 for (\d+) "
                      r"evaluations \(best [\d.]+\); final/ holds the best weights", proc.stdout + proc.stderr)


def test_training_stops_and_keeps_the_best_weights(yt8m_demo, tmp_path):
    proc = _train(tmp_path, "train.max_steps=40")
    assert _stops(proc) == [("6", "2")], (proc.stdout + proc.stderr)[-3000:]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_4", "step_6"]
    assert filecmp.cmp(tmp_path / "final" / "model.pdparams", tmp_path / "best" / "model.pdparams", shallow=False)
    with open(tmp_path / "best" / "state.json") as f:
        best = json.load(f)["metrics"]
    assert read_metrics(tmp_path) == pytest.approx(best)
    # resumed, a stopped run stays stopped
    again = _train(tmp_path, "train.max_steps=40", flags=("--resume", "auto"))
    assert "stopped early (train.early_stop) at step 6; nothing to train" in again.stdout + again.stderr
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_4", "step_6"]


def test_a_resumed_run_knows_how_long_it_has_waited(yt8m_demo, tmp_path):
    """4 steps (evaluations at 2 and 4: one without improvement), then resumed to 40: the stop comes at
    step 6, one evaluation later; had the count been lost it would come at 8 (two after the resume)."""
    first = _train(tmp_path, "train.max_steps=4")
    assert not _stops(first)
    with open(tmp_path / "checkpoints" / "step_4" / "state.json") as f:
        assert json.load(f)["hooks"]["early_stop"]["waited"] == 1
    resumed = _train(tmp_path, "train.max_steps=40", flags=("--resume", "auto"))
    assert _stops(resumed) == [("6", "2")], (resumed.stdout + resumed.stderr)[-3000:]


@pytest.mark.parametrize("overrides, message", [
    (["train.best_metric=null"], "error: train.early_stop.patience is set, but the recipe has no metric to stop "
                                 "on: it needs reader.val and train.best_metric (one of: gap, hit_at_1, perr"),
    (["train.early_stop.patience=-1"], "error: -o: train.early_stop.patience: must be >= 0, got -1"),
])
def test_no_metric_to_stop_on_is_one_line(yt8m_demo, tmp_path, overrides, message):
    assert_one_line_error(_train(tmp_path, "train.max_steps=4", *overrides, check=False), message)
