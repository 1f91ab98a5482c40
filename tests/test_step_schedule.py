"""Step-based schedules: train.max_steps, eval_steps/save_steps beside the epoch intervals, step
checkpoints, and a run killed with `kill -9` inside an epoch resuming to the same weights.

The recipe: the AttentionLSTM demo made small (30k parameters, dropout on), 16 videos a batch and
2 micro-batches per optimizer step, so an epoch of 800 videos is 50 batches = 25 optimizer steps,
and max_steps 60 ends inside the third epoch (at its batch 20).
"""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import paddle

from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ENV, ROOT, read_metrics, tool

SMALL = ["model.embedding_size=16", "model.lstm_size=16", "model.fc_sizes=[32, 16]",
         "reader.train.batch_size=16", "train.accum_steps=2", "train.epochs=null", "train.max_steps=60",
         "train.save_steps=5", "train.eval_steps=20", "train.log_interval=5", "train.keep_last=0"]


EMA = ["train.ema.enable=true", "train.ema.decay=0.99"]


def _args(output, *extra):
    args = ["-c", ATTENTION_LSTM_DEMO, "--output", str(output)]
    for o in SMALL + list(extra):
        args += ["-o", o]
    return args


def _weights(path):
    return paddle.load(str(path), return_numpy=True)


def test_max_steps_with_step_and_epoch_intervals(yt8m_demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("steps")
    tool("train", *_args(out))
    # saves: every 5 steps inside epochs, at the ends of epochs 1 and 2 (steps 25, 50; epoch-end
    # checkpoints there), and at step 60 where max_steps stops inside epoch 3
    expected = [f"step_{s}" for s in range(5, 61, 5) if s not in (25, 50)] + ["epoch_1", "epoch_2"]
    assert sorted(os.listdir(out / "checkpoints")) == sorted(expected)
    import json
    with open(out / "checkpoints" / "step_60" / "state.json") as f:
        state = json.load(f)
    assert (state["epoch"], state["batch"], state["step"]) == (2, 20, 60)   # 0-based epoch, 20 batches in
    with open(out / "checkpoints" / "step_35" / "state.json") as f:
        state = json.load(f)
    assert (state["epoch"], state["batch"], state["step"]) == (1, 20, 35)
    # evaluations: eval_steps 20 (steps 20, 40), every epoch end (25, 50) and at the end (60)
    with open(out / "train.log") as f:
        evals = [int(s) for s in re.findall(r"eval at epoch \d+, step (\d+)", f.read())]
    assert evals == [20, 25, 40, 50, 60]
    assert read_metrics(out)["num_samples"] == 200


def test_kill9_at_random_moments_inside_epochs_resumes_to_the_same_weights(yt8m_demo, tmp_path):
    """With train.ema on (issue 63): the moving average too comes out the same, bit for bit, so final/ (the
    average) and the last checkpoint's trained weights and ema.pdparams equal the uninterrupted run's."""
    ref = tmp_path / "ref"
    tool("train", *_args(ref, *EMA))
    run = tmp_path / "killed"
    rng = np.random.default_rng(int(time.time()))
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train.py"), *_args(run, *EMA)]
    kills = []
    for target in sorted(rng.choice([10, 15, 20, 30, 35, 40, 45], 3, replace=False)):
        proc = subprocess.Popen(cmd + ["--resume", "auto"], cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mark = run / "checkpoints" / f"step_{target}" / "state.json"
        deadline = time.time() + 300
        while not mark.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(float(rng.uniform(0.0, 0.3)))         # somewhere in the next few batches
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills.append(target)
        assert not (run / "final").exists(), f"the run finished before the kill after step {target}"
    tool("train", *_args(run, *EMA), "--resume", "auto")
    for name in ("final/model.pdparams", "checkpoints/step_60/model.pdparams", "checkpoints/step_60/ema.pdparams"):
        a, b = _weights(run / name), _weights(ref / name)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name} {k} (kills after steps {kills})")
    assert read_metrics(run) == read_metrics(ref)
