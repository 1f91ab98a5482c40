"""The auxiliary tools run as documented: amp_check (CPU mode), benchmark, list_models."""
import json

from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import tool


def test_amp_check_cpu_mode(yt8m_demo, tmp_path):
    out = tmp_path / "amp.json"
    proc = tool("amp_check", "-c", ATTENTION_LSTM_DEMO, "--steps", 4, "--json", out)
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["fp32", "fp16-O1", "fp16-O2", "bf16-O1", "bf16-O2"]
    assert all(r["ok"] and r["finite"] for r in rows)
    assert "AMP is a no-op" in proc.stdout


def test_benchmark_writes_a_rerunnable_record(yt8m_demo, tmp_path):
    out = tmp_path / "b.json"
    proc = tool("benchmark", "-c", ATTENTION_LSTM_DEMO, "--steps", 3, "--batch-size", 8, "--workers", 0, 1,
                "--json", out)
    r = json.loads(out.read_text())
    for key in ("command", "git_commit", "paddle", "cpu", "threads", "env", "batch_size",
                "train_samples_per_s", "eval_samples_per_s", "peak_memory_mb", "params"):
        assert key in r, key
    assert r["env"]["MKL_DEBUG_CPU_TYPE"] == "5"
    assert set(r["reader"]) == {"workers_0", "workers_1"}
    assert all(0 < v["share_of_train_step"] < 1 for v in r["reader"].values())
    assert r["train_samples_per_s"] > 0 and r["batch_size"] == 8
    assert "samples/s" in proc.stdout


def test_list_models_counts_parameters():
    proc = tool("list_models")
    assert "108,737,304" in proc.stdout and "attention_lstm_bilstm_10e_youtube8m.yaml" in proc.stdout
