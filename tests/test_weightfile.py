"""Weight files are data: a `.pdparams` whose pickle would run code is refused wherever weights enter
(--weights, train.pretrained, --resume, a pretrained entry's cache), before anything runs; with
--trust-weights it loads and the log says so. What paddle.save writes loads unchanged, and our own
checkpoints hold no pickle beyond the allow-list (scaler and RNG state are JSON). Trust is a flag of
the command only: no recipe, base or override can switch the guard off."""
import glob
import json
import os
import pickle
import shutil

import numpy as np
import paddle
import pytest

from engine.components import load_all
from engine.errors import SampleError
from engine.training import checkpoint
from engine.weights.weightfile import UnsafeWeights, read_state
from readers.youtube8m import YouTube8M
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT, one_error_line, tool, tools_in_one_process

SMALL = ["-o", "model.lstm_size=8", "-o", "model.embedding_size=8", "-o", "model.fc_sizes=[8, 8]"]


class _CreatesAFile:
    """Unpickles to a valid bias (zeros), creating `path` on the way: numpy.memmap opens it for writing."""

    def __init__(self, path, shape):
        self.path, self.shape = path, shape

    def __reduce__(self):
        return (np.memmap, (str(self.path), "float32", "w+", 0, self.shape))


def _evil_copy(src, dst, marker):
    """A real state dict with one tensor replaced by the file-creating record."""
    state = read_state(src)
    key = sorted(k for k in state if k.endswith("bias"))[0]
    state[key] = _CreatesAFile(marker, state[key].shape)
    with open(dst, "wb") as f:
        pickle.dump(state, f, protocol=4)


def test_code_in_a_weight_file_is_refused_everywhere_weights_enter(yt8m_demo, tmp_path):
    # a real run gives real weights and a checkpoint to tamper with (3 steps of a small model)
    run = tmp_path / "run"
    tool("train", "-c", ATTENTION_LSTM_DEMO, *SMALL, "-o", "train.epochs=null", "-o", "train.max_steps=3",
         "-o", "train.save_steps=2", "--output", run)
    good = run / "final" / "model.pdparams"
    refused = ("weights", "pretrained", "resume", "entry", "export", "infer")
    markers = {name: tmp_path / f"created_by_{name}" for name in refused + ("trusted",)}
    evil = {}
    for name, marker in markers.items():
        evil[name] = tmp_path / f"{name}.pdparams"
        _evil_copy(good, evil[name], marker)
    resume = tmp_path / "resume_run"
    shutil.copytree(run, resume)
    ckpt = resume / "checkpoints" / "step_3"
    shutil.copy(evil["resume"], ckpt / "model.pdparams")
    home = tmp_path / "zoo_home"                                     # AttentionLSTM_yt8 records no hash
    (home / "weights" / "AttentionLSTM_yt8").mkdir(parents=True)
    shutil.copy(evil["entry"], home / "weights" / "AttentionLSTM_yt8" / "AttentionLSTM_yt8.pdparams")
    al = ["-c", ATTENTION_LSTM_DEMO, *SMALL]
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    results = tools_in_one_process([
        ("eval", al + ["--weights", evil["weights"], "--output", tmp_path / "e1"], None),
        ("train", al + ["-o", f"train.pretrained={evil['pretrained']}", "--output", tmp_path / "t1"], None),
        ("train", al + ["-o", "train.epochs=null", "-o", "train.max_steps=4", "-o", "train.save_steps=2",
                        "--resume", ckpt, "--output", resume], None),
        ("eval", ["-c", ATTENTION_LSTM_DEMO, "--weights", "AttentionLSTM_yt8", "--output", tmp_path / "e2"],
         {"PADDLE_ZOO_HOME": str(home)}),
        ("export", al + ["--weights", evil["export"], "--output", tmp_path / "x1"], None),
        ("infer", al + ["--weights", evil["infer"], "--input", shard, "--output", tmp_path / "i1"], None),
        ("eval", al + ["--weights", evil["trusted"], "--trust-weights", "--output", tmp_path / "e3"], None),
    ])
    for name, result in zip(refused, results):
        line = one_error_line(result)
        assert line and "refused to unpickle" in line and "numpy.memmap" in line and "--trust-weights" in line, \
            (name, result)
        assert not markers[name].exists(), name                      # refused before anything ran
    trusted = results[-1]
    assert trusted["code"] == 0, trusted["stderr"][-2000:]
    assert "was fully unpickled (--trust-weights)" in trusted["stdout"] + trusted["stderr"]
    assert markers["trusted"].exists()
    assert read_state(good).keys() == checkpoint.read_weights(str(run / "checkpoints" / "step_3")).keys()


def test_paddle_save_state_dicts_load_unchanged(tmp_path):
    net = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.LayerNorm(4))
    opt = paddle.optimizer.AdamW(parameters=net.parameters(),
                                 learning_rate=paddle.optimizer.lr.StepDecay(0.1, step_size=2))
    net(paddle.randn([2, 3])).sum().backward()
    opt.step()
    mixed = {"f32": paddle.randn([2, 3]), "f16": paddle.randn([4]).astype("float16"),
             "bf16": paddle.randn([5]).astype("bfloat16"), "i64": paddle.to_tensor([1, 2, 3], dtype="int64"),
             "nested": {"x": paddle.ones([2])}}
    bf16_layer = paddle.nn.Linear(2, 2)
    bf16_layer.to(dtype="bfloat16")
    for name, obj in [("params", net.state_dict()), ("opt", opt.state_dict()), ("mixed", mixed),
                      ("bf16", bf16_layer.state_dict())]:
        path = str(tmp_path / f"{name}.pdparams")
        paddle.save(obj, path)
        ours, theirs = read_state(path), paddle.load(path, return_numpy=True)
        _assert_same(ours, theirs, name)
    assert read_state(str(tmp_path / "mixed.pdparams"))["bf16"].dtype == np.uint16   # bf16 bits, as paddle
    assert read_state(str(tmp_path / "opt.pdparams"))["LR_Scheduler"] == {"last_epoch": 0, "last_lr": 0.1}


def _assert_same(a, b, where):
    if isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), where
        for k in b:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("table", sorted(glob.glob(os.path.join(ROOT, "tests", "data", "keys_*.json"))),
                         ids=os.path.basename)
def test_state_dicts_of_the_official_tables_load(tmp_path, table):
    with open(table) as f:
        params = json.load(f)["params"]
    state = {key: np.zeros(shape, dtype=dtype) for key, shape, dtype, *_ in params}   # [key, shape, dtype, trainable]
    path = str(tmp_path / "official.pdparams")
    paddle.save(state, path)
    got = read_state(path)
    assert got.keys() == state.keys()
    assert all(got[k].shape == state[k].shape and got[k].dtype == state[k].dtype for k in state)


def test_a_checkpoint_in_the_older_pickled_layout_still_loads(tmp_path):
    """Checkpoints written before scaler.json/rng.json held pickled scaler and RNG records."""
    net = paddle.nn.Linear(2, 2)
    ckpt = tmp_path / "epoch_1"
    checkpoint.save(str(ckpt), net, state={"epoch": 1, "step": 5})
    os.remove(ckpt / "rng.json")
    paddle.seed(7)
    np.random.seed(7)
    with open(ckpt / "rng.pdstate", "wb") as f:               # what the older trainer wrote
        pickle.dump({"paddle": paddle.get_rng_state(), "numpy": np.random.get_state()}, f)
    expected = (paddle.rand([3]).numpy(), np.random.rand(3))
    paddle.seed(0)
    np.random.seed(0)
    state = checkpoint.load(str(ckpt), net)
    checkpoint.restore_rng(state["rng"])
    assert np.array_equal(paddle.rand([3]).numpy(), expected[0]) and np.array_equal(np.random.rand(3), expected[1])
    assert state["step"] == 5


def test_a_refused_global_is_named_in_one_line(tmp_path):
    path = tmp_path / "os.pdparams"
    with open(path, "wb") as f:
        pickle.dump({"w": _Calls(os.getcwd)}, f)
    with pytest.raises(UnsafeWeights, match=r"os.pdparams: refused to unpickle: it asks for posix.getcwd"):
        read_state(str(path))


class _Calls:
    def __init__(self, fn):
        self.fn = fn

    def __reduce__(self):
        return (self.fn, ())


def test_youtube8m_pkl_features_are_read_as_data_too(tmp_path):
    load_all()
    marker = tmp_path / "created"
    video = {"video": "v0", "feature": np.zeros((3, 4), np.uint8), "audio": np.zeros((3, 2), np.uint8),
             "label": [1], "nframes": 3}
    good, bad = tmp_path / "good.pkl", tmp_path / "bad.pkl"
    with open(good, "wb") as f:
        pickle.dump([video], f, protocol=2)                   # Fluid's tf2pkl wrote protocol-2 lists
    with open(bad, "wb") as f:
        pickle.dump([dict(video, feature=_CreatesAFile(marker, (3, 4)))], f)
    assert YouTube8M(files=[str(good)], num_classes=4)[0]["labels"].tolist() == [0, 1, 0, 0]
    with pytest.raises(SampleError, match=r"bad.pkl.*refused to unpickle: it asks for numpy.memmap"):
        YouTube8M(files=[str(bad)], num_classes=4)
    assert not marker.exists()


def test_trust_comes_from_the_command_never_from_a_config(yt8m_demo, tmp_path):
    """A shared recipe plus a crafted file must not run code: runtime.trust_weights in a file, in a
    _base_ or in -o is refused naming where it came from; a --trust-weights run's config.yaml does not
    carry it and reruns as is."""
    base = tmp_path / "base.yaml"
    base.write_text(f"_base_: {os.path.join(ROOT, ATTENTION_LSTM_DEMO)}\nruntime:\n  trust_weights: true\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"_base_: {base}\ntrain:\n  epochs: 1\n")
    direct = tmp_path / "direct.yaml"
    direct.write_text(f"_base_: {os.path.join(ROOT, ATTENTION_LSTM_DEMO)}\nruntime:\n  trust_weights: false\n")
    run = tmp_path / "run"
    results = tools_in_one_process([
        ("train", ["-c", child, "--output", tmp_path / "t1"], None),
        ("train", ["-c", direct, "--output", tmp_path / "t2"], None),
        ("eval", ["-c", ATTENTION_LSTM_DEMO, "-o", "runtime.trust_weights=true", "--weights", "x.pdparams"], None),
        ("train", ["-c", ATTENTION_LSTM_DEMO, *SMALL, "-o", "train.epochs=null", "-o", "train.max_steps=2",
                   "--trust-weights", "--output", run], None),
    ])
    for result, origin in zip(results[:3], [str(base), str(direct), "-o"]):
        line = one_error_line(result)
        assert line and line.startswith(f"error: {origin}: runtime.trust_weights: not a config key") \
            and "--trust-weights" in line, result
    assert results[3]["code"] == 0, results[3]["stderr"][-2000:]
    resolved = (run / "config.yaml").read_text()
    assert "trust" not in resolved
    rerun = tool("train", "-c", run / "config.yaml", "--output", tmp_path / "rerun", check=False)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
