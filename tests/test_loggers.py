"""train.loggers: VisualDL, TensorBoard and W&B (offline) get the same scalars and the resolved config,
each read back with its own reader (VisualDL's LogReader, TensorBoard's EventAccumulator, W&B's datastore
of its offline run file) and checked against scalars.jsonl; one-line errors for an unknown logger and a
missing package."""
import glob
import json
import os

import pytest
import yaml

from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ENV, assert_one_line_error, tool

SMALL = ["model.embedding_size=16", "model.lstm_size=16", "model.fc_sizes=[32, 16]", "train.epochs=null",
         "train.max_steps=4", "train.eval_steps=2", "train.log_interval=2",
         "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]"]
TRAIN_KEYS = {"loss", "lr", "samples_per_s", "reader_share", "peak_memory_mb"}


def _args(out, *extra):
    return ["-c", ATTENTION_LSTM_DEMO, "--output", str(out), *[x for o in SMALL + list(extra) for x in ("-o", o)]]


@pytest.fixture(scope="module")
def logged(yt8m_demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("loggers")
    tool("train", *_args(out, "train.loggers=[visualdl, tensorboard, wandb]"))
    rows = [json.loads(ln) for ln in (out / "scalars.jsonl").read_text().splitlines()]
    expected = {}
    for row in rows:
        for k, v in row.items():
            if k not in ("kind", "step", "epoch", "batch"):
                expected[(f"{row['kind']}/{k}", row["step"])] = v
    return out, expected


def _check(got, expected, where):
    assert set(got) == set(expected), (where, sorted(set(got) ^ set(expected)))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6), (where, key)


def test_the_jsonl_holds_every_scalar(logged):
    _, expected = logged
    assert {k for k, _ in expected if k.startswith("train/")} == {f"train/{k}" for k in TRAIN_KEYS}
    assert {"eval/gap", "eval/hit_at_1", "eval/perr"} <= {k for k, _ in expected}
    assert {s for _, s in expected} == {2, 4}


def test_tensorboard_reads_them_back(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, expected = logged
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    got = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    _check(got, expected, "tensorboard")
    texts = [t for tag in events.Tags()["tensors"] if tag.startswith("config") for t in events.Tensors(tag)]
    assert texts and b"name: AttentionLSTM" in texts[0].tensor_proto.string_val[0]


def test_visualdl_reads_them_back(logged):
    from visualdl import LogReader
    out, expected = logged
    path = glob.glob(str(out / "vdl" / "vdlrecords*"))[0]
    reader = LogReader(file_path=path)
    got = {(tag, r.id): r.value for tag in reader.get_tags()["scalar"] for r in reader.get_data("scalar", tag)}
    _check(got, expected, "visualdl")


def test_wandb_offline_run_reads_them_back(logged):
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore
    out, expected = logged
    files = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files                       # offline: a run folder, nothing sent
    store = datastore.DataStore()
    store.open_for_scan(files[0])
    got, config = {}, {}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = items.pop("_step")
            got.update(((k, step), v) for k, v in items.items() if not k.startswith("_"))
        elif kind in ("run", "config"):    # the run's config as it starts, and any update after
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({i.key: json.loads(i.value_json) for i in updates})
    _check(got, expected, "wandb")
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert {k: config[k] for k in resolved} == resolved


def test_an_unknown_logger_and_a_missing_package_are_one_line(yt8m_demo, tmp_path):
    proc = tool("train", *_args(tmp_path / "a", "train.loggers=[visualdl, tensorbord]"), check=False)
    assert_one_line_error(proc, "error: -o: train.loggers: unknown logger 'tensorbord' (did you mean "
                                "'tensorboard'?); known: visualdl, tensorboard, wandb")
    hidden = tmp_path / "no_tensorboardx"     # an environment without tensorboardX: importing it fails
    (hidden / "tensorboardX").mkdir(parents=True)
    (hidden / "tensorboardX" / "__init__.py").write_text("raise ImportError('no module named tensorboardX')\n")
    proc = tool("train", *_args(tmp_path / "b", "train.loggers=[tensorboard]"), check=False,
                env=dict(ENV, PYTHONPATH=str(hidden)))
    assert_one_line_error(proc, "error: train.loggers: tensorboard needs tensorboardX: pip install -r "
                                "requirements-loggers.txt")
    assert not os.path.exists(tmp_path / "b" / "checkpoints")    # refused before training
