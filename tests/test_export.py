"""Export for Paddle Inference: every exportable demo model's exported program gives the dynamic
model's outputs (golden README tolerance) at another batch size and input size than any fixed one,
tools/infer.py --backend inference writes what the dynamic path writes, and bad export directories
or inputs get one clear line."""
import glob
import json
import os
import shutil

import numpy as np
import paddle
import pytest

from engine import builder, config, export
from engine.components import load_all
from engine.predictor import Predictor
from engine.registry import ConfigError
from tests.conftest import ATTENTION_LSTM_DEMO, DEEPLAB_DEMO, MASK_RCNN_DEMO, TSN_DEMO
from tests.helpers import ROOT, one_error_line, tool, tools_in_one_process

load_all()
DEMOS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"), recursive=True))


def close(ours, ref):
    """The golden README's tolerance: |ours - ref| <= 1e-4 * max(1, max|ref|) + 1e-4 * |ref|."""
    ref = np.asarray(ref, np.float64)
    return bool(np.all(np.abs(np.asarray(ours, np.float64) - ref)
                       <= 1e-4 * max(1.0, float(np.abs(ref).max(initial=0))) + 1e-4 * np.abs(ref)))


def _batches(cfg):
    """Two val batches of different sizes (and, for videos, another frame size and segment count)."""
    loader, _, _ = builder.build_loader(cfg, "val", 0, batch_size=3)
    first = next(iter(loader))
    small = {k: v[:2] if isinstance(v, paddle.Tensor) and v.ndim else v for k, v in first.items()}
    if "imgs" in first:   # [B, T, C, H, W]: another segment count and image size than the reader's
        imgs = first["imgs"][:, :2]
        small["imgs"] = paddle.nn.functional.interpolate(
            imgs.reshape([-1] + imgs.shape[2:]), size=[48, 40], mode="bilinear").reshape(
            imgs.shape[:3] + [48, 40])[:2]
    if "image" in first:  # [B, C, H, W]: smaller by 32 px (PadImages' size divisor of the detection recipes)
        h, w = first["image"].shape[2:]
        small["image"] = first["image"][:2, :, :h - 32, :w - 32]
        if "image_size" in first:
            small["image_size"] = paddle.minimum(first["image_size"][:2], paddle.to_tensor([h - 32, w - 32], "int64"))
    for key in [k for k in first if k + "_mask" in first]:   # padded features: a shorter length
        t = 3
        small[key], small[key + "_mask"] = first[key][:2, :t], first[key + "_mask"][:2, :t]
        if key + "_len" in first:
            small[key + "_len"] = paddle.minimum(first[key + "_len"][:2], paddle.to_tensor(t, "int64"))
    return [first, small]


def assert_same(got, ref, what):
    """Floats within the golden tolerance, integers equal; lists (one array per image) item by item.
    Binary masks (thresholded probabilities, which the pipeline test compares before the threshold)
    may differ in 1 pixel of 10^4: those whose probability is within float noise of the threshold."""
    if isinstance(ref, list):
        assert isinstance(got, list) and len(got) == len(ref), what
        for i, (g, r) in enumerate(zip(got, ref)):
            assert_same(g, r, f"{what}[{i}]")
        return
    ref = ref.numpy() if isinstance(ref, paddle.Tensor) else np.asarray(ref)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if np.issubdtype(ref.dtype, np.floating):
        assert close(got, ref), (what, float(np.abs(got - ref).max()))
    elif what.startswith("masks"):
        assert int((got != ref).sum()) <= ref.size // 10000, (what, int((got != ref).sum()), ref.size)
    else:
        assert np.array_equal(got, ref), (what, int((got != ref).sum()))


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: os.path.relpath(p, ROOT))
def test_exported_program_matches_the_dynamic_model(path, tmp_path, yt8m_demo, kinetics_demo, voc_demo, coco_demo):
    cfg = config.load(path)
    paddle.seed(0)
    model = builder.build_model(cfg["model"])
    model.eval()
    export.export(model, cfg, str(tmp_path))
    predictor = Predictor(str(tmp_path), mkldnn=os.environ.get("MK", "1") == "1")
    spec = export.spec_of(model)
    for batch in _batches(cfg):
        with paddle.no_grad():
            if "pipeline" in spec:   # every network call of the pipeline (e.g. before NMS), same inputs
                calls = []

                def recording(name, inputs):
                    calls.append((name, inputs, model.run_program(name, inputs)))
                    return calls[-1][2]

                ref = type(model).run_exported(recording, batch, spec["pipeline"])
                assert {name for name, *_ in calls} == set(export.programs_of(spec))
                for name, inputs, outputs in calls:
                    raw = predictor.run(name, inputs)
                    assert set(raw) == set(outputs), name
                    for key in raw:
                        assert_same(raw[key], outputs[key], f"{name}.{key}")
            else:
                ref = model(batch)
        got = predictor(batch)
        assert set(got) == set(ref) and (set(got) == set(spec["outputs"]) or "pipeline" in spec)
        for key in got:
            assert_same(got[key], ref[key], key)


def test_infer_with_the_exported_model_writes_what_the_dynamic_one_writes(tsn_demo_run, attention_lstm_run,
                                                                          yt8m_demo, kinetics_demo, tmp_path):
    videos = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    runs, outs = [], {}
    for name, cfg, run, inputs in [("tsn", TSN_DEMO, tsn_demo_run, videos),
                                   ("al", ATTENTION_LSTM_DEMO, attention_lstm_run, shard)]:
        weights = os.path.join(run, "final", "model.pdparams")
        runs.append(("export", ["-c", cfg, "--weights", weights, "--output", tmp_path / f"{name}_export"], None))
        for backend in ("dynamic", "inference"):
            out = tmp_path / f"{name}_{backend}"
            outs[(name, backend)] = out
            w = weights if backend == "dynamic" else tmp_path / f"{name}_export"
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", inputs,
                                   "--output", out], None))
    results = tools_in_one_process(runs)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results if r["code"]]
    for name in ("tsn", "al"):
        dyn, inf = (json.load(open(outs[(name, b)] / "predictions.json")) for b in ("dynamic", "inference"))
        assert len(dyn) == len(inf) > 0
        for a, b in zip(dyn, inf):
            assert a["id"] == b["id"] and [t["class_id"] for t in a["top_k"]] == [t["class_id"] for t in b["top_k"]]
            assert np.allclose([t["score"] for t in a["top_k"]], [t["score"] for t in b["top_k"]], atol=1e-4)
    assert open(outs[("al", "dynamic")] / "submission.csv").read().splitlines()[0] == \
        open(outs[("al", "inference")] / "submission.csv").read().splitlines()[0]


def test_bad_export_directories_and_inputs(tmp_path, yt8m_demo):
    cfg = config.load(ATTENTION_LSTM_DEMO)
    model = builder.build_model(cfg["model"])
    export.export(model, cfg, str(tmp_path / "al"))
    shutil.copytree(tmp_path / "al", tmp_path / "no_cfg")
    os.remove(tmp_path / "no_cfg" / "infer_cfg.yml")
    shutil.copytree(tmp_path / "al", tmp_path / "old")
    with open(tmp_path / "old" / "infer_cfg.yml") as f:
        text = f.read().replace("zoo_export_version: 1", "zoo_export_version: 0")
    with open(tmp_path / "old" / "infer_cfg.yml", "w") as f:
        f.write(text)
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    runs = [("infer", ["-c", TSN_DEMO, "--backend", "inference", "--weights", tmp_path / "al", "--input", shard,
                       "--output", tmp_path / "o1"], None),
            ("infer", ["-c", ATTENTION_LSTM_DEMO, "--backend", "inference", "--weights", tmp_path / "no_cfg",
                       "--input", shard, "--output", tmp_path / "o2"], None),
            ("infer", ["-c", ATTENTION_LSTM_DEMO, "--backend", "inference", "--weights", tmp_path / "old",
                       "--input", shard, "--output", tmp_path / "o3"], None)]
    expected = [["holds an exported AttentionLSTM", "builds TSN"], ["no infer_cfg.yml"],
                ["export format version 0", "export the model again"]]
    for result, fragments in zip(tools_in_one_process(runs), expected):
        line = one_error_line(result)
        assert line and all(f in line for f in fragments), result
    predictor = Predictor(str(tmp_path / "al"))
    with pytest.raises(ConfigError, match=r"input 'rgb' has shape \[2, 5, 7\], the exported program takes "
                                          r"\['\?', '\?', 1024\]"):
        predictor({"rgb": np.zeros((2, 5, 7), np.float32), "rgb_len": np.ones(2, np.int64),
                   "rgb_mask": np.ones((2, 5), np.float32), "audio": np.zeros((2, 5, 128), np.float32),
                   "audio_len": np.ones(2, np.int64), "audio_mask": np.ones((2, 5), np.float32)})
