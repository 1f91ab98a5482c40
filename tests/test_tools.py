"""The auxiliary tools run as documented: amp_check (CPU: fp32 against bf16), benchmark, list_models."""
import ast
import ctypes
import json
import os

import numpy as np
import pytest

from benchmarks import amp_check
from benchmarks import recipes as benchmark
from engine import config, cpu, runtime
from engine.components import load_all
from engine.cpu import cpu_info
from engine.session import Session
from engine.training import trainer
from tests.conftest import ATTENTION_LSTM_DEMO, TSN_DEMO, USER_MKL_DEBUG_CPU_TYPE, needs_native_bf16
from tests.helpers import tool


@pytest.mark.isa
@needs_native_bf16
def test_amp_check_cpu_mode(kinetics_demo, tmp_path):
    """On a CPU: fp32 and bf16 (the TSN demo: its convolutions run in bf16), losses compared, speed-up
    printed."""
    out = tmp_path / "amp.json"
    proc = tool("amp_check", "-c", TSN_DEMO, "--steps", 4, "--json", out, "-o", "reader.train.batch_size=4")
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["fp32", "bf16-O1"]
    assert all(r["ok"] and r["finite"] and r["ran"] for r in rows)
    assert rows[1]["losses"] != rows[0]["losses"]                  # bf16 really computed differently
    assert abs(rows[1]["relative_to_fp32"]) < 0.05 and rows[1]["speedup_vs_fp32"] > 0
    assert "modes fp32 bf16-O1" in proc.stdout and "vs fp32" in proc.stdout


def test_amp_check_fp16_on_a_cpu_is_one_error_line(kinetics_demo):
    proc = tool("amp_check", "-c", TSN_DEMO, "--steps", 2, "--modes", "fp16-O1", check=False)
    assert proc.returncode == 2 and "error: mode fp16-O1.dtype: float16 needs a GPU" in proc.stderr


def test_benchmark_writes_a_rerunnable_record(yt8m_demo, tmp_path):
    out = tmp_path / "b.json"
    proc = tool("benchmark", "-c", ATTENTION_LSTM_DEMO, "--steps", 3, "--batch-size", 8, "--workers", 0, 1,
                "--json", out)
    r = json.loads(out.read_text())
    for key in ("command", "git_commit", "paddle", "cpu", "cpu_vendor", "threads", "env", "batch_size",
                "train_samples_per_s", "eval_samples_per_s", "peak_memory_mb", "params"):
        assert key in r, key
    assert r["cpu"] == cpu_info()["model"] and r["cpu_vendor"] == cpu_info()["vendor"]
    # what the run had: the user's own export wins (README), else 5 on AMD only
    default = "5" if r["cpu_vendor"] == "AuthenticAMD" else None
    assert r["env"]["MKL_DEBUG_CPU_TYPE"] == (default if USER_MKL_DEBUG_CPU_TYPE is None else USER_MKL_DEBUG_CPU_TYPE)
    assert set(r["reader"]) == {"workers_0", "workers_1"}
    assert all(0 < v["share_of_train_step"] < 1 for v in r["reader"].values())
    assert r["train_samples_per_s"] > 0 and r["batch_size"] == 8
    assert "samples/s" in proc.stdout


def test_list_models_counts_parameters():
    proc = tool("list_models")
    assert "108,737,304" in proc.stdout and "attention_lstm_bilstm_10e_youtube8m.yaml" in proc.stdout


@pytest.mark.parametrize("vendor, preset, expected", [("AuthenticAMD", None, "5"), ("GenuineIntel", None, None),
                                                      ("GenuineIntel", "4", "4"), ("AuthenticAMD", "0", "0")])
def test_mkl_setting_is_for_amd_only(monkeypatch, vendor, preset, expected):
    """MKL_DEBUG_CPU_TYPE=5 doubles Paddle's matmul on AMD and costs ~37% on Intel (platform notes)."""
    monkeypatch.setattr(cpu, "cpu_info", lambda: {"vendor": vendor, "model": "x"})
    env = {} if preset is None else {"MKL_DEBUG_CPU_TYPE": preset}
    assert cpu.mkl_environment(env).get("MKL_DEBUG_CPU_TYPE") == expected


def test_freed_memory_is_kept_in_the_heap():
    """After keep_freed_memory a large block comes from the heap and stays there when freed (glibc's
    mallinfo2: not in the mmapped bytes while held, in the free heap bytes after), instead of being
    mapped and unmapped (and faulted in again) at every step."""


    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                          "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc < 2.33")
    libc.mallinfo2.restype = MallInfo2
    assert cpu.keep_freed_memory()
    size = 64 << 20
    mapped = libc.mallinfo2().hblkhd
    block = np.ones(size, np.uint8)
    assert libc.mallinfo2().hblkhd - mapped < size
    del block
    assert libc.mallinfo2().fordblks >= size


def test_runtime_keeps_freed_memory_only_when_the_config_says_so(monkeypatch):
    """Off by default (the ResNet and LSTM recipes); the BERT and Transformer recipes turn it on."""
    calls = []
    monkeypatch.setattr(cpu, "keep_freed_memory", lambda: calls.append(1) or True)
    for recipe, overrides, expected in (("configs/video/tsn/tsn_demo.yaml", [], []),
                                        ("configs/nlp/bert/bert_glue_demo.yaml", [], [1]),
                                        ("configs/nlp/bert/bert_glue_demo.yaml", ["runtime.keep_freed_memory=false"], [])):
        calls.clear()
        cfg = config.load(recipe, overrides + ["runtime.device=cpu"], validate_config=False)
        runtime.setup(cfg.runtime)
        assert calls == expected, overrides

def test_benchmark_and_amp_check_time_the_trainers_step(yt8m_demo, monkeypatch, tmp_path):
    """tools/benchmark.py, tools/amp_check.py and the trainer all step through engine.training.trainer.TrainStep,
    so what is benchmarked is what training runs."""
    load_all()
    calls = []
    real = trainer.TrainStep.__call__
    monkeypatch.setattr(trainer.TrainStep, "__call__", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    cfg = config.load(ATTENTION_LSTM_DEMO, ["model.lstm_size=8", "model.embedding_size=8", "model.fc_sizes=[8, 8]"])
    batches = benchmark._batches(cfg, 4, 2, 0)
    benchmark._time_model(cfg, batches, 2, True, cfg.train.amp)
    assert len(calls) == 3                    # a warm-up and two timed steps
    amp_check.run_mode(cfg, batches, "fp32", 0)   # bf16-O1 does not run where the CPU lacks native bf16
    assert len(calls) == 3 + len(batches)
    cfg = config.load(ATTENTION_LSTM_DEMO, ["model.lstm_size=8", "model.embedding_size=8", "model.fc_sizes=[8, 8]",
                                            "train.epochs=null", "train.max_steps=3", "train.accum_steps=2"])
    trainer.fit(Session(cfg), str(tmp_path))
    assert len(calls) == 3 + len(batches) + 6   # 3 optimizer steps of 2 micro-batches each

def test_the_tools_assemble_their_run_through_the_session():
    """Issue 21: train, eval, infer, export and benchmark build their run with engine.session.Session
    (config, runtime, model, weights, loaders) instead of each writing the assembly out; their main()
    stays short (about 30 lines, counted from the source)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for tool in ("train", "eval", "infer", "export", "benchmark", "quantize"):
        # tools/benchmark.py is the command line; benchmarks/recipes.py assembles the run it measures
        paths = [os.path.join(root, "tools", f"{tool}.py")] + (
            [os.path.join(root, "benchmarks", "recipes.py")] if tool == "benchmark" else [])
        source = ""
        for path in paths:
            with open(path, encoding="utf-8") as f:
                source += f.read()
        # tools/infer.py through api/inferencer.py's Inferencer, itself built on the Session (the server's too);
        # tools/eval.py through deploy/load.py's from_args (the recipe's Session, or the one an export records)
        assert ("Session." in source or (tool == "infer" and "Inferencer(" in source)
                or (tool == "eval" and "load.from_args(" in source)), tool
        for assembly in ("config.load(", "load_all(", "runtime.setup(", "load_pretrained(", "config.section("):
            assert assembly not in source, (tool, assembly)
        main = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "main")
        assert main.end_lineno - main.lineno + 1 <= 32, (tool, main.end_lineno - main.lineno + 1)
