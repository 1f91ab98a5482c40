"""The skeleton end to end on the AttentionLSTM demo: train, eval, infer, resume after kill -9, logs."""
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from engine import config
from engine.components import load_all
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ENV, ROOT, assert_one_line_error, max_weight_difference, read_metrics, tool


def test_demo_learns(attention_lstm_run):
    m = read_metrics(attention_lstm_run)
    assert m["gap"] >= 0.6, m
    assert m["hit_at_1"] >= 0.6 and m["perr"] >= 0.5, m
    assert m["num_samples"] == 200
    for path in ["config.yaml", "train.log", "final/model.pdparams", "checkpoints/epoch_6/model.pdparams",
                 "checkpoints/epoch_6/model.pdopt", "checkpoints/epoch_6/state.json"]:
        assert os.path.isfile(os.path.join(attention_lstm_run, path)), path
    # keep_last 3: older epochs were pruned
    assert sorted(os.listdir(os.path.join(attention_lstm_run, "checkpoints"))) == ["epoch_4", "epoch_5", "epoch_6"]


def test_ignoring_the_mask_scores_lower(attention_lstm_run, tmp_path):
    tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "model.use_mask=false", "--output", tmp_path)
    assert read_metrics(tmp_path)["gap"] < read_metrics(attention_lstm_run)["gap"] - 0.03


def test_resolved_config_reproduces_the_run(attention_lstm_run):
    load_all()
    resolved = config.load(os.path.join(attention_lstm_run, "config.yaml"))
    original = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO))
    assert resolved["runtime"]["world_size"] == 1
    resolved["runtime"].pop("world_size")
    assert resolved == original


def test_eval_tool_matches_training_metrics(attention_lstm_run, tmp_path):
    proc = tool("eval", "-c", ATTENTION_LSTM_DEMO, "--weights", os.path.join(attention_lstm_run, "final"),
                "--output", tmp_path)
    got, trained = read_metrics(tmp_path), read_metrics(attention_lstm_run)
    for k in ("gap", "hit_at_1", "perr", "num_samples"):
        assert got[k] == pytest.approx(trained[k], abs=1e-6), k
    assert "gap=" in proc.stdout


def test_infer_writes_topk_json_and_kaggle_csv(attention_lstm_run, yt8m_demo, tmp_path):
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    tool("infer", "-c", ATTENTION_LSTM_DEMO, "--weights", os.path.join(attention_lstm_run, "final", "model.pdparams"),
         "--input", shard, "-o", "infer.top_k=3", "--output", tmp_path)
    with open(tmp_path / "predictions.json") as f:
        preds = json.load(f)
    assert len(preds) == 100
    names = open(os.path.join(yt8m_demo, "label_names.txt")).read().split()
    for p in preds:
        assert len(p["top_k"]) == 3 and p["top_k"][0]["label"] in names
        scores = [t["score"] for t in p["top_k"]]
        assert scores == sorted(scores, reverse=True)
    with open(tmp_path / "submission.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["VideoId", "LabelConfidencePairs"]
    assert len(rows) == 101 and {r[0] for r in rows[1:]} == {p["id"] for p in preds}
    pairs = rows[1][1].split()
    assert len(pairs) == 2 * 8 and all(0 <= int(c) < 8 for c in pairs[0::2])


def test_resume_after_kill9_gives_the_same_weights(attention_lstm_run, tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train.py"), "-c", ATTENTION_LSTM_DEMO, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "checkpoints" / "epoch_1" / "state.json"
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert first.exists(), "no checkpoint appeared"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "final").exists(), "the run finished before it was killed"
    tool("train", "-c", ATTENTION_LSTM_DEMO, "--output", tmp_path, "--resume", "auto")
    diff = max_weight_difference(tmp_path, attention_lstm_run)
    assert diff <= 1e-6, diff


def test_visualdl_scalars_read_back(attention_lstm_run):
    from visualdl import LogReader
    vdl = os.path.join(attention_lstm_run, "vdl")
    files = [f for f in os.listdir(vdl) if f.startswith("vdlrecords")]
    assert files
    reader = LogReader(file_path=os.path.join(vdl, files[0]))
    tags = reader.get_tags()["scalar"]
    assert {"train/loss", "train/lr", "eval/gap"} <= set(tags), tags
    gaps = [r.value for r in reader.get_data("scalar", "eval/gap")]
    assert len(gaps) == 6 and gaps[-1] == pytest.approx(read_metrics(attention_lstm_run)["gap"], abs=1e-5)
    lrs = [r.value for r in reader.get_data("scalar", "train/lr")]
    assert max(lrs) == pytest.approx(2e-3) and min(lrs) == pytest.approx(2e-4)


# ------------------------------------------------------------------ bad input: one line, non-zero exit
def test_unknown_config_key():
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "model.embeding_size=3", check=False)
    assert_one_line_error(proc, "model.embeding_size", "unknown key", "did you mean 'embedding_size'")


def test_unknown_key_in_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"_base_: [{os.path.join(ROOT, ATTENTION_LSTM_DEMO)}]\ntrain: {{epocs: 3}}\n")
    proc = tool("train", "-c", bad, check=False)
    assert_one_line_error(proc, str(bad), "train.epocs", "did you mean 'epochs'")


def test_wrong_type():
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "reader.train.batch_size=many", check=False)
    assert_one_line_error(proc, "reader.train.batch_size", "expected int", "'many'")


def test_missing_config_file():
    proc = tool("train", "-c", "configs/nope.yaml", check=False)
    assert_one_line_error(proc, "config file not found", "configs/nope.yaml")


def test_missing_data_file(tmp_path):
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "reader.train.files=[data/none/x.tfrecord]",
                "--output", tmp_path, check=False)
    assert_one_line_error(proc, "data/none/x.tfrecord")


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_tfrecord_names_file_and_offset(yt8m_demo, tmp_path, workers):
    src = os.path.join(yt8m_demo, "tfrecord", "train0000.tfrecord")
    data = bytearray(open(src, "rb").read())
    data[5000] ^= 0xFF  # inside the payload of an early record: its data CRC fails
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", f"reader.train.files=[{bad}]",
                "-o", "reader.train.skip_bad=false", "-o", f"reader.train.num_workers={workers}",
                "--output", tmp_path / "out", check=False)
    line = assert_one_line_error(proc, str(bad), "offset")
    assert "CRC" in line or "crc" in line


def test_checkpoint_of_another_shape(attention_lstm_run, tmp_path):
    proc = tool("eval", "-c", ATTENTION_LSTM_DEMO, "-o", "model.lstm_size=32",
                "--weights", os.path.join(attention_lstm_run, "final"), "--output", tmp_path, check=False)
    assert_one_line_error(proc, "model.pdparams", "shape")


def test_nan_loss_stops_naming_the_step(tmp_path):
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", "lr.values=[1.0e+30, 1.0e+30]",
                "-o", "train.epochs=1", "--output", tmp_path, check=False)
    assert_one_line_error(proc, "loss is", "step")


def test_corrupt_record_skipped_and_counted_when_allowed(yt8m_demo, tmp_path):
    src = os.path.join(yt8m_demo, "tfrecord", "train0000.tfrecord")
    data = bytearray(open(src, "rb").read())
    data[5000] ^= 0xFF
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", f"reader.train.files=[{bad}]", "-o", "train.epochs=1",
                "-o", "reader.train.num_workers=2", "--output", tmp_path / "out")
    assert "skipped 1 bad samples" in proc.stdout
    assert "skipped sample 0" in proc.stdout + proc.stderr and str(bad) in proc.stdout + proc.stderr


def test_damaged_validation_data_is_skipped_counted_and_reported(yt8m_demo, tmp_path):
    """A corrupt validation record no longer stops the run after a whole training epoch: it is skipped
    and counted in metrics.json (num_skipped); a validation shard cut short reports the records lost."""
    src = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    data = bytearray(open(src, "rb").read())
    data[5000] ^= 0xFF                                  # record 0's payload: its data CRC fails on load
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(open(os.path.join(yt8m_demo, "tfrecord", "validate0001.tfrecord"), "rb").read()[:20000])
    tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", f"reader.val.files=[{bad}, {cut}]", "-o", "train.epochs=1",
         "-o", "model.lstm_size=16", "-o", "model.embedding_size=16", "--output", tmp_path / "out")
    m = read_metrics(tmp_path / "out")
    assert m["num_skipped"] == 2                        # the bad record and the cut file's broken tail
    assert m["records_lost"] >= 2                       # the tail held more than one record
    with open(os.path.join(tmp_path / "out", "train.log")) as f:
        assert "damaged file" in f.read()
