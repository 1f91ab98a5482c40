"""Output directories written by older code still resume: a committed run of commit a5b4456 (its
resolved config.yaml, a step checkpoint inside an epoch, the final weights and metrics) is resumed by
the current tools/train.py, which must end on the old run's final weights.

The fixture (tests/data/old_run_attention_lstm_a5b4456/, see tests/data/README.md) is the AttentionLSTM
demo made tiny (5.5k parameters, dropout 0.2, the shuffling epoch sampler, centered RMSProp, the lr
dropping at epoch 2, an eval per epoch with best_metric gap) trained for 2 epochs of 13 batches on one
train and one val shard of the generated demo data; `checkpoints/step_20` is epoch 2 (0-based 1), batch 7,
written after the first evaluation (so it holds best and metrics). The old code itself resumes from it to
its own final weights exactly (max abs diff 0.0). Never regenerate it with newer code: it stands for the
output directories users already have.
"""
import hashlib
import json
import os
import shutil

import pytest
import yaml

from tests.helpers import ROOT, max_weight_difference, read_metrics, tool

OLD_RUN = os.path.join(ROOT, "tests", "data", "old_run_attention_lstm_a5b4456")
STEP = os.path.join("checkpoints", "step_20")
# the demo data the old run read (relative paths in its config.yaml, as tools/train.py resolves them
# from the repo root): the shards of `data/make_demo.py youtube8m` with its default parameters
DATA_SHA256 = {
    "data/youtube8m_demo/tfrecord/train0000.tfrecord": "a0e4b80824a116242f412bca5a4b939636f59d6df290d46032a51f7f8308eb5d",
    "data/youtube8m_demo/tfrecord/validate0001.tfrecord": "659935e68cb63d0baab17fce5410a596f85d04c781cc0e99fd4161c6583040b5",
}
TOL = 1e-6   # the suite's resume tolerance (tests/test_step_schedule.py); 0.0 where the fixture was made


@pytest.fixture()
def old_run(yt8m_demo, tmp_path):
    """A copy of the old output directory (as a user has it), after checking the data is what it read."""
    with open(os.path.join(OLD_RUN, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    assert cfg["reader"]["train"]["files"] + cfg["reader"]["val"]["files"] == list(DATA_SHA256)
    for rel, digest in DATA_SHA256.items():
        with open(os.path.join(ROOT, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, \
                f"{rel} is not the data the old run was trained on: the demo generator changed"
    out = tmp_path / "old_output"
    shutil.copytree(OLD_RUN, out)
    shutil.rmtree(out / "final")              # what the resumed run must write again
    os.remove(out / "metrics.json")
    return out


def _check_resumed_run(out, proc):
    assert proc.returncode == 0
    diff = max_weight_difference(out / "final" / "model.pdparams", os.path.join(OLD_RUN, "final", "model.pdparams"))
    assert diff <= TOL, f"resumed from the old checkpoint, the final weights differ from the old run's by {diff}"
    # the last evaluation (epoch 2) beat the checkpoint's best (epoch 1): best/ holds the final weights
    assert max_weight_difference(out / "best" / "model.pdparams", out / "final" / "model.pdparams") == 0.0
    old_metrics = read_metrics(OLD_RUN)
    assert read_metrics(out) == pytest.approx(old_metrics, abs=1e-6)


def test_old_config_and_step_checkpoint_resume_to_the_old_final_weights(old_run, tmp_path):
    """tools/train.py -c OLD/config.yaml --output NEW --resume OLD/checkpoints/step_20"""
    new = tmp_path / "new_output"
    proc = tool("train", "-c", old_run / "config.yaml", "--output", new, "--resume", old_run / STEP)
    _check_resumed_run(new, proc)
    with open(new / "config.yaml") as f:
        resolved = yaml.safe_load(f)
    assert resolved["runtime"]["world_size"] == 1
    with open(os.path.join(OLD_RUN, STEP, "state.json")) as f:
        old_state = json.load(f)
    assert (old_state["epoch"], old_state["batch"], old_state["step"]) == (1, 7, 20)  # inside epoch 2


def test_resume_auto_finds_the_old_step_checkpoint(old_run):
    """tools/train.py -c OLD/config.yaml --output OLD --resume auto (resuming in place)"""
    proc = tool("train", "-c", old_run / "config.yaml", "--output", old_run, "--resume", "auto")
    with open(old_run / "train.log") as f:
        assert "step_20" in f.read(), "the log does not name the checkpoint the run resumed from"
    _check_resumed_run(old_run, proc)
