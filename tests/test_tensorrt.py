"""TensorRT (issue 38, item 3) without a GPU: what tools/export.py --trt records, how record.py refuses
a bad section, and the exact paddle.inference.Config calls the predictor makes on a GPU (under
tests/test_gpu_dispatch.py's recording fake; the expected values are read from the record the test
wrote). Also the tensor path between programs, for real on the CPU: an exported Transformer decodes
without any copy_from_cpu/copy_to_cpu and without reading its memory or cache back to numpy."""
import copy
import os

import numpy as np
import paddle
import paddle.inference as pi
import pytest
import yaml

from deploy import export, predictor, tensorrt
from deploy.record import read_infer_cfg
from engine.errors import ConfigError
from tests.helpers import peaked_transformer
from tests.test_gpu_dispatch import _FakePredictor, _RecordingConfig, _fake_export


@pytest.fixture(scope="module")
def trt_transformer(tmp_path_factory):
    """A small Transformer exported with --trt (an example batch, one override file); (dir, model, src, stdout)."""
    d = tmp_path_factory.mktemp("trt_transformer")
    m, src = peaked_transformer(beam_size=4)
    shapes = d / "shapes.yaml"
    shapes.write_text(yaml.safe_dump({"decoder_step": {"ids": {"max": [160, 1]}}}))
    example = {"src_ids": paddle.to_tensor(src), "src_ids_mask": paddle.to_tensor((src != 0).astype("float32"))}
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        export.export(m, {"model": {"name": "Transformer"}}, str(d / "export"), example=example,
                      trt={"max_batch_size": 8, "use_static": True, "shapes_file": str(shapes)})
    return str(d / "export"), m, src, out.getvalue()


def test_export_trt_records_shape_ranges_from_the_specs_the_example_and_the_model(trt_transformer):
    where, m, src, stdout = trt_transformer
    trt = read_infer_cfg(where)["tensorrt"]
    assert {k: trt[k] for k in tensorrt.DEFAULTS} == {"precision": "fp32", "min_subgraph_size": 3,
                                                       "workspace_size": 1 << 30, "max_batch_size": 8,
                                                       "use_static": True}
    enc, step = trt["shapes"]["encoder"], trt["shapes"]["decoder_step"]
    # whole-predictor inputs: batch 1 / the example's 6 / max_batch_size; length 1 / the example's 7 / default 512
    assert enc == {"src_ids": {"min": [1, 1], "opt": [6, 7], "max": [8, 512]},
                   "src_ids_mask": {"min": [1, 1], "opt": [6, 7], "max": [8, 512]}}
    # between programs: guesses 1 / 1 / 512, the model's cache of no position (min 0), the override file's ids
    assert step["cache_k0"] == {"min": [1, 4, 0, 8], "opt": [1, 4, 1, 8], "max": [512, 4, 512, 8]}
    assert step["memory_bias"] == {"min": [1, 1, 1, 1], "opt": [1, 1, 1, 1], "max": [512, 1, 1, 512]}
    assert step["ids"] == {"min": [1, 1], "opt": [1, 1], "max": [160, 1]}
    note = next(line for line in stdout.splitlines() if line.startswith("note: TensorRT"))
    assert "decoder_step.cache_k0" in note and "decoder_step.memory_bias" in note and "decoder_step.ids" not in note


def _with_tensorrt(tmp_path, **changes):
    where = _fake_export(tmp_path)
    path = os.path.join(where, "infer_cfg.yml")
    record = yaml.safe_load(open(path))
    record["tensorrt"] = {"precision": "fp16", "min_subgraph_size": 5, "workspace_size": 1 << 28,
                          "max_batch_size": 16, "use_static": False,
                          "shapes": {"model": {"x": {"min": [1, 8], "opt": [4, 8], "max": [16, 8]}}}}
    record["tensorrt"].update(changes)
    with open(path, "w") as f:
        yaml.safe_dump(record, f)
    return where, record


@pytest.fixture
def gpu_config(monkeypatch):
    _RecordingConfig.calls = []
    monkeypatch.setattr(predictor.pi, "Config", _RecordingConfig)
    monkeypatch.setattr(predictor.pi, "create_predictor", lambda config: _FakePredictor(["x"]))
    monkeypatch.setattr(predictor, "tensorrt_version", lambda: (8, 6, 1))
    monkeypatch.setenv("FLAGS_selected_gpus", "2")
    monkeypatch.delenv("PADDLE_LOCAL_RANK", raising=False)
    return _RecordingConfig.calls


PRECISION = {"fp32": pi.PrecisionType.Float32, "fp16": pi.PrecisionType.Half, "bf16": pi.PrecisionType.Bfloat16}


@pytest.mark.parametrize("use_static, precision", [(False, None), (True, None), (False, "fp32")])
def test_the_gpu_predictor_asks_config_for_tensorrt_as_the_record_says(tmp_path, gpu_config, use_static, precision):
    where, record = _with_tensorrt(tmp_path, use_static=use_static)
    trt = record["tensorrt"]
    p = predictor.Predictor(where, device="gpu", precision=precision)
    assert p.tensorrt
    trt_precision = PRECISION[precision or trt["precision"]]
    ranges = trt["shapes"]["model"]
    want = [("Config", (os.path.join(where, "model.json"), os.path.join(where, "model.pdiparams"))),
            ("disable_glog_info", ()),
            ("enable_use_gpu", (256, 2, PRECISION[record["precision"] if precision is None else precision])),
            ("enable_tensorrt_engine", (), {"workspace_size": trt["workspace_size"],
                                            "max_batch_size": trt["max_batch_size"],
                                            "min_subgraph_size": trt["min_subgraph_size"],
                                            "precision_mode": trt_precision, "use_static": use_static,
                                            "use_calib_mode": False}),
            ("set_trt_dynamic_shape_info", ({n: r["min"] for n, r in ranges.items()},
                                            {n: r["max"] for n, r in ranges.items()},
                                            {n: r["opt"] for n, r in ranges.items()}))]
    if use_static:
        want.append(("set_optim_cache_dir", (os.path.join(where, "trt_cache"),)))
    assert gpu_config == want


def test_tensorrt_off_or_unavailable(tmp_path, gpu_config, monkeypatch):
    where, _ = _with_tensorrt(tmp_path)
    predictor.Predictor(where, device="gpu", tensorrt=False)
    assert [c[0] for c in gpu_config] == ["Config", "disable_glog_info", "enable_use_gpu"]
    gpu_config.clear()
    # on a CPU: off by default (the same program), one line when asked for
    assert not predictor.Predictor(where, device="cpu").tensorrt
    assert not any("tensorrt" in c[0] for c in gpu_config)
    with pytest.raises(ConfigError, match=r"^TensorRT runs on a GPU .*this run's device is cpu$"):
        predictor.Predictor(where, device="cpu", tensorrt=True)
    with pytest.raises(ConfigError, match=r"no tensorrt section; export the model again with tools/export.py --trt$"):
        (tmp_path / "plain").mkdir()
        predictor.Predictor(_fake_export(tmp_path / "plain"), device="gpu", tensorrt=True)
    monkeypatch.setattr(predictor, "tensorrt_version", lambda: (0, 0, 0))
    with pytest.raises(ConfigError, match=r"this paddle was built without it .*or run with --no-trt$"):
        predictor.Predictor(where, device="gpu")


@pytest.mark.parametrize("change, message", [
    ({"precision": "int8"}, r"tensorrt\.precision: 'int8', one of fp32, fp16 \(INT8 TensorRT calibration"),
    ({"min_subgraph_size": 0}, r"tensorrt\.min_subgraph_size: 0, an integer >= 1"),
    ({"use_static": "yes"}, r"tensorrt\.use_static: 'yes', true or false"),
    ({"shapes": {"other": {}}}, r"tensorrt\.shapes: one entry per program \(model\) is expected, got other"),
    ({"shapes": {"model": {"x": {"min": [1, 8], "opt": [4, 8]}}}}, r"tensorrt\.shapes\.model\.x: min, opt and max"),
    ({"shapes": {"model": {"x": {"min": [1, 8], "opt": [4, 8], "max": [16, 9]}}}},
     r"tensorrt\.shapes\.model\.x\.max: \[16, 9\], but the input's fixed sizes are \['\?', 8\]"),
    ({"shapes": {"model": {"x": {"min": [4, 8], "opt": [2, 8], "max": [16, 8]}}}},
     r"tensorrt\.shapes\.model\.x: min \[4, 8\] <= opt \[2, 8\] <= max \[16, 8\] is expected"),
])
def test_a_bad_tensorrt_section_is_one_line_naming_file_and_key(tmp_path, change, message):
    where, _ = _with_tensorrt(tmp_path, **change)
    with pytest.raises(ConfigError) as e:
        read_infer_cfg(where)
    line = str(e.value)
    assert "\n" not in line and line.startswith(os.path.join(where, "infer_cfg.yml") + ": "), line
    assert __import__("re").search(message, line), line


def test_export_trt_through_the_tool_and_its_one_line_refusals(tmp_path):
    from tests.helpers import tools_in_one_process, one_error_line
    from tests.conftest import ATTENTION_LSTM_DEMO
    bad = tmp_path / "bad.json"
    bad.write_text('{"nope": {"max": [4, 8]}}')
    base = ["-c", ATTENTION_LSTM_DEMO, "--output"]
    runs = [("export", [*base, tmp_path / "ok", "--trt", "--trt-precision", "fp16", "--trt-max-batch", "4",
                        "--trt-static"], {}),
            ("export", [*base, tmp_path / "a", "--trt", "--format", "onnx"], {}),
            ("export", [*base, tmp_path / "b", "--trt-precision", "fp16"], {}),
            ("export", [*base, tmp_path / "c", "--trt", "--trt-shapes", bad], {})]
    results = tools_in_one_process(runs)
    assert results[0]["code"] == 0, results[0]["stderr"][-2000:]
    assert "(paddle, fp32, TensorRT)" in results[0]["stdout"]
    record = read_infer_cfg(str(tmp_path / "ok"))
    trt = record["tensorrt"]
    assert (trt["precision"], trt["max_batch_size"], trt["use_static"], trt["min_subgraph_size"]) == ("fp16", 4, True, 3)
    for spec in record["inputs"]:   # every dimension of every input has a range, batch up to 4
        r = trt["shapes"]["model"][spec["name"]]
        assert r["min"][0] == 1 and r["max"][0] == 4 and len(r["opt"]) == len(spec["shape"]), (spec, r)
    lines = [one_error_line(r) for r in results[1:]]
    assert lines == ["error: --trt with --format onnx: TensorRT runs a --format paddle export (Paddle Inference)",
                     "error: --trt-precision needs --trt",
                     f"error: --trt-shapes {bad}: program model has no input 'nope' (inputs: "
                     + ", ".join(s["name"] for s in record["inputs"]) + ")"]


# ------------------------------------------------------------------------------ tensors between programs
class _Counting:
    """A Paddle Inference predictor that counts the handles asked of it (copy_from_cpu/copy_to_cpu go through them)."""

    def __init__(self, inner, counts):
        self.inner, self.counts = inner, counts

    def get_input_handle(self, name):
        self.counts["copy_from_cpu"] += 1
        return self.inner.get_input_handle(name)

    def get_output_handle(self, name):
        self.counts["copy_to_cpu"] += 1
        return self.inner.get_output_handle(name)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_two_program_export_passes_tensors_between_its_programs_on_the_cpu(trt_transformer, monkeypatch):
    """The exported Transformer's encoder and decoder steps run on tensors: no handle copies at all, and
    neither the memory nor the cache (4-D) is read back to numpy; the translations are the dynamic model's."""
    where, m, src, _ = trt_transformer
    p = predictor.Predictor(where)          # on this CPU: the section is recorded, TensorRT stays off
    assert not p.tensorrt
    counts = {"copy_from_cpu": 0, "copy_to_cpu": 0}
    for program in p.programs.values():
        program.predictor = _Counting(program.predictor, counts)
    reads = []
    original = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self, *a, **k: reads.append(list(self.shape)) or original(self))
    batch = {"src_ids": src, "src_ids_mask": (src != 0).astype("float32")}
    got = p(batch)
    monkeypatch.undo()
    assert counts == {"copy_from_cpu": 0, "copy_to_cpu": 0}
    assert reads and not any(len(shape) == 4 for shape in reads), reads   # logp [R, V] and top-k rows only
    with paddle.no_grad():
        ref = m({k: paddle.to_tensor(v) for k, v in batch.items()})
    assert np.array_equal(got["ids"], ref["ids"].numpy()) and np.array_equal(got["ids_len"], ref["ids_len"].numpy())
    np.testing.assert_allclose(got["scores"], ref["scores"].numpy(), rtol=1e-5, atol=1e-5)
    # a program called with numpy keeps the numpy path (handles), and gives the same numbers as with tensors
    enc = p.programs["encoder"]
    as_numpy = enc(batch)
    as_tensors = enc({k: paddle.to_tensor(v) for k, v in batch.items()})
    assert counts["copy_from_cpu"] == 2 and all(isinstance(v, paddle.Tensor) for v in as_tensors.values())
    for k, v in as_numpy.items():
        assert isinstance(v, np.ndarray) and np.array_equal(v, as_tensors[k].numpy()), k
