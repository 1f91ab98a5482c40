"""INT8 post-training quantization (tools/quantize.py, ONNX Runtime QDQ) of every scorable demo, as
trained by the session fixtures: the quantized model scores within max(1 point, one validation
sample) of fp32 on the validation split, stores int8 weights (<= 30% of the fp32 files), its kernels
agree with its own fake-quant simulation, tools/infer.py runs it, and bad input gets one line.
(bf16 exports are compared with fp32 in tests/test_export.py, on every demo model's programs.)"""
import glob
import json
import os
import re
import shutil

import numpy as np
import paddle
import pytest
import yaml

from engine import builder, config, cpu
from engine.components import load_all
from deploy import export, quantize
from deploy.predictor import Predictor
from engine.errors import ConfigError
from tests.conftest import (ATTENTION_CLUSTER_DEMO, ATTENTION_LSTM_DEMO, BERT_GLUE_DEMO, DEEPLAB_DEMO,
                            MASK_RCNN_DEMO, NATIVE_BF16, NEXTVLAD_DEMO, STNET_DEMO, TRANSFORMER_DEMO, TSN_DEMO)
from tests.helpers import ENV, ROOT, one_error_line, openvino_bf16_without_kernels, tool, tools_in_one_process

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

# (id, config, the session fixture whose run it quantizes): every demo with a validation metric
DEMOS = [("tsn", TSN_DEMO, "tsn_demo_run"), ("stnet", STNET_DEMO, "stnet_demo_run"),
         ("attention_lstm", ATTENTION_LSTM_DEMO, "attention_lstm_run"),
         ("nextvlad", NEXTVLAD_DEMO, "nextvlad_demo_run"),
         ("attention_cluster", ATTENTION_CLUSTER_DEMO, "attention_cluster_demo_run"),
         ("bert_glue", BERT_GLUE_DEMO, "bert_glue_run"), ("deeplabv3", DEEPLAB_DEMO, "deeplab_demo_run"),
         ("mask_rcnn", MASK_RCNN_DEMO, "mask_rcnn_demo_run"), ("transformer", TRANSFORMER_DEMO, "transformer_demo_run")]
CALIB_BATCHES = "2"
BACKENDS = ("onnxruntime", "openvino")   # ONNX Runtime's QDQ route, NNCF's into OpenVINO IR


# Attention Cluster's run also carries --max-drop -1: a drop every route exceeds (INT8 a whole 1.0 above
# fp32 on a 0-1 metric would be needed), so it shows the tool's exit status 1 and its line per route
EXTRA = {"attention_cluster": ["--max-drop", "-1"]}


def _quantize(runs, out, backends=BACKENDS):
    """tools/quantize.py --split val of each (id, config, run dir), every route of `backends` in one run
    per demo (one export, one calibration, one fp32 evaluation), all demos in one process:
    {id or id-openvino: (result, dir)}."""
    argv = [("quantize", ["-c", cfg, "--weights", os.path.join(run, "final"), "--output", out / name, "--split", "val",
                          "--calib-batches", CALIB_BATCHES, "--backend", *backends, *EXTRA.get(name, [])], {})
            for name, cfg, run in runs]
    results = tools_in_one_process(argv, timeout=1800)
    return {(name if b == "onnxruntime" else f"{name}-{b}"): (r, out / name / b if len(backends) > 1 else out / name)
            for (name, _, _), r in zip(runs, results) for b in backends}


@pytest.fixture(scope="module")
def tsn_quantized(tsn_demo_run, tmp_path_factory):
    """The TSN demo quantized on both routes (what the infer and bad-input tests start from)."""
    return _quantize([("tsn", TSN_DEMO, tsn_demo_run)], tmp_path_factory.mktemp("int8_tsn"))


@pytest.fixture(scope="module")
def tsn_int8(tsn_quantized):
    return tsn_quantized["tsn"]


@pytest.fixture(scope="module")
def quantized(request, tsn_quantized, tmp_path_factory):
    """Every demo of DEMOS quantized on both routes: {id or id-openvino: (result, dir)}."""
    runs = [(name, cfg, request.getfixturevalue(fixture)) for name, cfg, fixture in DEMOS[1:]]
    return {**tsn_quantized, **_quantize(runs, tmp_path_factory.mktemp("int8"))}


# (demo, route): the one-line refusal expected where OpenVINO cannot compile the INT8 IR. Empty: NeXtVLAD's,
# refused by OpenVINO 2026.4.1 ("Accessing out-of-range dimension"), compiles since deploy/openvino.py
# repairs the scaled shape dim (_scalar_scales; tests/test_openvino.py).
OPENVINO_CANNOT_COMPILE = {}


@pytest.mark.parametrize("name,backend", [pytest.param(d[0], b, id=f"{d[0]}-{b}") for d in DEMOS for b in BACKENDS])
def test_int8_demo_scores_within_one_point_or_one_sample_of_fp32(quantized, name, backend):
    result, where = quantized[name if backend == "onnxruntime" else f"{name}-{backend}"]
    if (name, backend) in OPENVINO_CANNOT_COMPILE:
        assert re.fullmatch(OPENVINO_CANNOT_COMPILE[name, backend], one_error_line(result) or ""), result["stderr"]
        return
    assert result["code"] == (1 if name in EXTRA else 0), result["stdout"][-2000:] + result["stderr"][-2000:]
    with open(where / "metrics.json") as f:
        m = json.load(f)
    key, fp32, int8 = m["metric"], m["fp32"], m["int8"]
    # one export, one fp32 evaluation for both routes: each route's report holds the same fp32 scores
    other = quantized[f"{name}-openvino" if backend == "onnxruntime" else name][1] / "metrics.json"
    assert json.loads(other.read_text())["fp32"] == fp32 and m["fp32_backend"] == "onnxruntime"
    if name in EXTRA:       # --max-drop -1: exit 1, one line naming this route's folder
        assert (f"error: INT8 {key} is {m['drop']:.4f} below fp32 (more than --max-drop -1.0); the quantized model "
                f"is in {where}") in result["stdout"].splitlines(), result["stdout"][-2000:]
    # the bound: 1 point (0.01 on our 0-1 metrics, 1.0 on BLEU's 0-100 scale, sacrebleu's) or
    # one validation sample of an accuracy
    point = 1.0 if key.startswith("bleu") else 0.01
    bound = max(point, 1.0 / fp32["num_samples"]) if "num_samples" in fp32 else point
    assert fp32[key] - int8[key] <= bound + 1e-9, (name, key, fp32, int8)
    assert abs(m["drop"] - (fp32[key] - int8[key])) < 1e-9
    report = f"{key}: fp32 {fp32[key]:.4f}, int8 {int8[key]:.4f}, drop {m['drop']:.4f} ({backend}: {where})"
    assert report in result["stdout"], result["stdout"][-2000:]
    with open(where / "infer_cfg.yml") as f:
        record = yaml.safe_load(f)
    assert not [f for f in os.listdir(where) if f.startswith(".fp32-")], "the fp32 staging directory is left"
    if backend == "openvino":
        _check_openvino_record(record, name)
        return
    assert record["format"] == "onnx" and record["precision"] == "int8"
    q = record["quantization"]
    assert q["route"] == "onnxruntime-qdq" and q["observer"] == "minmax"
    # without VNNI (e.g. AMD Zen 3) u8 x s8 pair sums saturate unless the weights use 7 bits
    assert q["weights"] == ("int8" if cpu.has_vnni() else "int8 (7-bit range: this CPU has no VNNI)"), q["weights"]
    assert all(p["quantized"] > 0 for p in q["programs"].values()), q["programs"]
    # int8 weights: the files shrink to about a quarter (scales, zero points and the float layers stay)
    assert q["int8_bytes"] <= 0.30 * q["fp32_bytes"] or name in KEEPS_FLOAT_WEIGHTS, q
    for program, outputs in q["simulation_gap"].items():
        for out, gap in outputs.items():
            assert gap["kernels_vs_simulation"] <= max(0.05, 2 * gap["simulation_vs_fp32"]), (program, out, gap)


def _check_openvino_record(record, name):
    """NNCF's INT8 as OpenVINO IR: every program quantized (FakeQuantize in it), the first and last
    layers in float where the ONNX Runtime route keeps them, 7-bit weights without VNNI, and the
    int8 weights smaller on disk than fp32's."""
    assert record["format"] == "openvino" and record["precision"] == "int8"
    q = record["quantization"]
    assert q["route"] == "openvino-nncf" and q["openvino"] == "2026.4.1" and q["nncf"] == "3.4.0", q
    # OpenVINO's kernels are oneDNN's: VNNI as they see it, within ONEDNN_MAX_CPU_ISA (`make test-isa`)
    assert q["weights"] == ("int8" if cpu.has_vnni(capped=True)
                            else "int8 (7-bit range, NNCF's overflow fix: this CPU has no VNNI)")
    assert all(p["quantized"] > 0 and p["fake_quantize_ops"] > 0 and p["kept_float"] for p in q["programs"].values()), q
    # OpenVINO IR keeps the float layers' weights in f32 as the ONNX files do (AttentionLSTM's LSTMs: 98%)
    assert q["int8_bytes"] < (1.0 if name in KEEPS_FLOAT_WEIGHTS else 0.4) * q["fp32_bytes"], q
    assert set(q["int8_vs_fp32"]) == set(q["programs"]), q


# demos whose weights are mostly in layers the route keeps in float (measured: the INT8 files' share):
# AttentionLSTM's bidirectional LSTMs (ONNX Runtime quantizes an LSTM only dynamically), 88%;
# NeXtVLAD's first layers (one expansion per modality), 78%; the demo BERT's embedding tables (a
# lookup) and its first and last layers, 50% of its 0.5 MB; the Transformer's embedding table (a
# lookup, shared with the output projection, the last layer), 47%
KEEPS_FLOAT_WEIGHTS = {"attention_lstm", "transformer", "nextvlad", "bert_glue"}


def test_infer_runs_the_int8_model_and_writes_what_fp32_writes(tsn_int8, tsn_demo_run, kinetics_demo, tmp_path):
    """tools/infer.py --backend onnxruntime on the INT8 directory: the same files as the dynamic path,
    the same top-1 class for all but at most one video (the metric bound's one sample)."""
    videos = sorted(glob.glob(os.path.join(kinetics_demo["appearance"], "videos", "val", "*")))
    out = {}
    for name, args in (("dynamic", ["--weights", os.path.join(tsn_demo_run, "final")]),
                       ("int8", ["--weights", tsn_int8[1], "--backend", "onnxruntime"])):
        # --split val: the processing (one view per video) the model was quantized and exported with
        tool("infer", "-c", TSN_DEMO, *args, "--split", "val", "--input", *videos, "--output", tmp_path / name)
        out[name] = sorted(os.listdir(tmp_path / name))
        with open(tmp_path / name / "predictions.json") as f:
            out[name + "_pred"] = json.load(f)
    assert out["dynamic"] == out["int8"]
    a, b = out["dynamic_pred"], out["int8_pred"]
    assert len(a) == len(b) == 60
    assert [p["id"] for p in a] == [p["id"] for p in b]
    assert sum(x["top_k"][0]["class_id"] != y["top_k"][0]["class_id"] for x, y in zip(a, b)) <= 1


def test_quantize_refuses_bad_input_with_one_line(tsn_int8, tsn_demo_run, tmp_path):
    weights = os.path.join(tsn_demo_run, "final")
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    bad = tmp_path / "bad.list"
    bad.write_text(f"{tmp_path / 'bad.mp4'} 0\n{tmp_path / 'bad.mp4'} 1\n")
    good = tsn_int8[1]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    with open(corrupt / "model.onnx", "r+b") as f:
        f.truncate(1000)
    int4 = tmp_path / "int4"
    shutil.copytree(good, int4)
    text = (int4 / "infer_cfg.yml").read_text().replace("precision: int8", "precision: int4")
    (int4 / "infer_cfg.yml").write_text(text)
    videos = os.path.join(ROOT, "data", "kinetics_demo", "kinetics_appearance", "videos", "val", "red")
    base = ["-c", TSN_DEMO, "--weights", weights, "--output", tmp_path / "q", "--split", "val"]
    (tmp_path / "both").mkdir()
    (tmp_path / "both" / "openvino").write_text("a file where the OpenVINO route's folder goes")
    runs = [("quantize", base + ["--observer", "kl"], {}),
            ("quantize", base + ["--backend", "onnxruntime", "openvino", "--output", tmp_path / "both"], {}),
            ("quantize", base + ["--calib-batches", "0"], {}),
            ("quantize", base + ["--metric", "bleu"], {}),
            ("infer", ["-c", TSN_DEMO, "--weights", corrupt, "--backend", "onnxruntime", "--input", videos,
                       "--split", "val", "--output", tmp_path / "i1"], {}),
            ("infer", ["-c", TSN_DEMO, "--weights", int4, "--backend", "onnxruntime", "--input", videos,
                       "--split", "val", "--output", tmp_path / "i2"], {}),
            ("export", ["-c", TSN_DEMO, "--weights", weights, "--output", tmp_path / "e", "--format", "onnx",
                        "--precision", "bf16"], {})]
    want = [("--observer kl", "minmax"), (f"--output {tmp_path / 'both' / 'openvino'} is an existing file",),
            ("--calib-batches", "0"), ("--metric bleu",),
            ("model.onnx", "not a model ONNX Runtime can load"), ("precision 'int4'",),
            ("bf16", "ONNX Runtime")]
    runs += [("export", ["-c", TSN_DEMO, "--weights", weights, "--output", tmp_path / "bf16", "--precision", "bf16"], {}),
             ("infer", ["-c", TSN_DEMO, "--weights", tmp_path / "bf16", "--backend", "inference", "--input", videos,
                        "--output", tmp_path / "i3"], {}),
            # a calibration reader that yields nothing: every training video unreadable, skipped
            ("quantize", base + ["-o", f"reader.train.list_file={bad}", "-o", "reader.val.skip_bad=true"], {})]
    results = tools_in_one_process(runs)
    hidden = tmp_path / "no_nncf"          # an environment without NNCF: importing it fails
    (hidden / "nncf").mkdir(parents=True)
    (hidden / "nncf" / "__init__.py").write_text("raise ImportError('no module named nncf')\n")
    no_nncf = tool("quantize", *base, "--backend", "openvino", check=False, env=dict(ENV, PYTHONPATH=str(hidden)))
    assert one_error_line({"code": no_nncf.returncode, "stderr": no_nncf.stderr}) == (
        "error: tools/quantize.py --backend openvino needs nncf: pip install -r requirements-openvino.txt"), no_nncf.stderr
    nothing = results.pop()
    assert one_error_line(nothing) == ("error: the calibration reader (reader.train's samples through "
                                       "reader.val's processing) yielded no batches"), nothing
    assert nothing["stdout"].count("WARNING skipped sample") == 2 and "bad.mp4" in nothing["stdout"]  # each named
    for r, fragments in zip(results, want):
        line = one_error_line(r)
        assert line and all(f in line for f in fragments), (fragments, r["stdout"][-800:], r["stderr"][-1500:])
    # tools/export.py --precision bf16 records it, and tools/infer.py runs it: in bf16 without a note
    # where the CPU has native bf16, else in fp32 with the note saying why
    assert [r["code"] for r in results[len(want):]] == [0, 0], results[len(want):]
    assert yaml.safe_load((tmp_path / "bf16" / "infer_cfg.yml").read_text())["precision"] == "bf16"
    notes = [ln for ln in results[-1]["stdout"].splitlines() if ln.startswith("note:")]
    assert notes == ([] if NATIVE_BF16 else [f"note: {tmp_path / 'bf16'}: bf16 asked for, but this CPU has no native "
                                             f"bf16 (avx512_bf16, amx_bf16): running fp32"]), notes
    assert os.path.isfile(tmp_path / "i3" / "predictions.json")


def test_bf16_without_native_bf16_runs_fp32_and_says_so_in_one_line(tmp_path, yt8m_demo, monkeypatch, capsys):
    """A CPU without AVX512_BF16/AMX-BF16 (simulated: the flag check answers no) runs the bf16 export
    in fp32 and prints one note; with native bf16 the same export runs bf16 (tests/test_export.py)."""
    load_all()
    cfg = config.load(ATTENTION_CLUSTER_DEMO)
    paddle.seed(0)
    export.export(builder.build_model(cfg["model"]), cfg, str(tmp_path), precision="bf16")
    monkeypatch.setattr(cpu, "has_bf16", lambda: False)
    capsys.readouterr()
    assert Predictor(str(tmp_path)).precision == "fp32"
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("note:") and "no native bf16" in lines[0], lines


def test_a_model_with_nothing_to_quantize_and_kernels_that_compute_something_else_are_refused(tmp_path):
    """One product layer (first and last at once, so kept in float) leaves nothing to quantize; of
    three, the middle one is quantized, and its kernels agree with the simulation; kernels as far off
    as the issue measured for Paddle's oneDNN INT8 route would be refused."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def model(path, layers):
        nodes, inits, x = [], [], "x"
        for i in range(layers):
            inits.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"MatMul.{i}"))
            x = f"h{i}"
        nodes.append(helper.make_node("Softmax", [x], ["y"], name="Softmax.0", axis=-1))
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 16])], inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    feeds = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(2)]
    model(str(tmp_path / "one.onnx"), 1)
    with pytest.raises(ConfigError, match="no layer ONNX Runtime quantizes .* MatMul.0") as e:
        quantize.quantize_program(str(tmp_path / "one.onnx"), str(tmp_path / "one_int8.onnx"), feeds)
    assert "\n" not in str(e.value)
    model(str(tmp_path / "three.onnx"), 3)
    info = quantize.quantize_program(str(tmp_path / "three.onnx"), str(tmp_path / "three_int8.onnx"), feeds)
    assert info == {"quantized": 1, "kept_float": ["MatMul.0", "MatMul.2"]}   # the middle layer only
    gaps = quantize.check_simulation(str(tmp_path / "three.onnx"), str(tmp_path / "three_int8.onnx"), feeds)
    assert quantize.simulation_agrees(*gaps["y"]), gaps
    # the bound against the measurements (not this code's): Paddle Inference's oneDNN INT8 of a
    # paddle.quantization program, 2.1 from its own simulation, which was 0.015 from fp32: refused
    assert not quantize.simulation_agrees(2.1, 0.015)


def test_nncf_calibrates_a_growing_attention_cache_on_what_the_program_computes(tmp_path):
    """NNCF's statistics of a decoder step over cache lengths 0..11 (the Transformer's decoder_step in
    small): the output projection's input range (its FakeQuantize) lies within the min/max of that input
    as ONNX Runtime computes it on the same feeds. NNCF 3.4.0 compiles the model itself, where OpenVINO
    2026.4.1's shape-keyed kernel cache gives wrong attention from cache length 7 on (tests/test_openvino.py):
    the Transformer demo's projections got ranges of +-620 and +-1180 instead of +-7 and lost 46 BLEU."""
    import onnx
    import onnxruntime as ort
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper
    heads, dim = 2, 8
    width = heads * dim
    rng = np.random.default_rng(3)
    perm = {"perm": [0, 2, 1, 3]}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"], name="q_proj"),
             helper.make_node("Reshape", ["q0", "heads"], ["q1"], name="split"),
             helper.make_node("Transpose", ["q1"], ["q"], name="to_heads", **perm),       # [B, heads, 1, dim]
             helper.make_node("Concat", ["cache_k", "q"], ["k"], name="extend", axis=2),  # [B, heads, L + 1, dim]
             helper.make_node("Transpose", ["k"], ["kt"], name="keys_t", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "k"], ["o"], name="attend"),
             helper.make_node("Transpose", ["o"], ["o1"], name="from_heads", **perm),
             helper.make_node("Reshape", ["o1", "flat"], ["merged"], name="merge"),
             helper.make_node("MatMul", ["merged", "wo"], ["y0"], name="out_proj"),
             helper.make_node("MatMul", ["y0", "wz"], ["z"], name="logits"),
             helper.make_node("LogSoftmax", ["z"], ["logp"], name="log_softmax", axis=-1)]
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.3, w)
             for w in ("wq", "wo", "wz")]
    inits += [numpy_helper.from_array(np.array([0, 1, heads, dim], np.int64), "heads"),
              numpy_helper.from_array(np.array([0, 1, width], np.int64), "flat")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, width]),
                                           helper.make_tensor_value_info("cache_k", TensorProto.FLOAT,
                                                                         [None, heads, None, dim])],
                              [helper.make_tensor_value_info("logp", TensorProto.FLOAT, [None, 1, width]),
                               helper.make_tensor_value_info("k", TensorProto.FLOAT, [None, heads, None, dim]),
                               helper.make_tensor_value_info("merged", TensorProto.FLOAT, [None, 1, width])], inits)
    src = str(tmp_path / "step.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), src)
    session = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    feeds, lows, highs, cache = [], [], [], np.zeros((4, heads, 0, dim), np.float32)
    for _ in range(12):
        feeds.append({"x": rng.standard_normal((4, 1, width)).astype(np.float32), "cache_k": cache})
        _, cache, merged = session.run(None, feeds[-1])
        lows.append(float(merged.min()))
        highs.append(float(merged.max()))
    dst = str(tmp_path / "step.xml")
    info = quantize.quantize_program_openvino(src, dst, feeds, keep_first=False,
                                               overflow_fix=not cpu.has_vnni(capped=True))
    assert info["kept_float"] == ["logits"] and info["quantized"] == 2, info
    fq = [op for op in ov.Core().read_model(dst).get_ops() if op.get_type_name() == "FakeQuantize"
          and any(t.get_node().get_friendly_name() == "out_proj" for t in op.output(0).get_target_inputs())]
    assert len(fq) == 1, [op.get_friendly_name() for op in fq]
    low, high = (float(fq[0].input_value(i).get_node().get_data().max()) for i in (1, 2))
    # whatever statistic NNCF takes of the feeds' minima and maxima (theirs, their mean), it lies within them
    assert min(lows) - 1e-4 <= low <= max(lows) + 1e-4 and min(highs) - 1e-4 <= high <= max(highs) + 1e-4, \
        (low, high, lows, highs)


def test_openvino_int8_runs_its_float_layers_in_bf16_only_where_openvino_has_bf16(tmp_path, monkeypatch):
    """NNCF's INT8 IR compiles its float layers with the bf16 hint where OpenVINO reports bf16 (simulated:
    its capability check answers yes; this AMD Zen 2 has none), else f32; an fp32 ONNX export stays f32
    either way. Numbers: the same program against fp32 on this CPU, within the INT8 route's own gap."""
    from onnx import TensorProto, helper, numpy_helper
    import onnx
    from deploy import openvino
    from deploy.record import write_infer_cfg
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) / 4, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"MatMul.{i}"))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 16])], inits)
    src = tmp_path / "fp32"
    src.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), str(src / "model.onnx"))
    spec = {"name": "x", "shape": [-1, 16], "dtype": "float32"}
    write_infer_cfg(str(src), {"zoo_export_version": 1, "format": "onnx", "precision": "fp32", "onnx": {"opset": 16},
                               "model": "Toy", "inputs": [spec], "outputs": ["y"]})
    feeds = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    q = quantize.quantize_openvino(str(src), str(tmp_path / "int8"), {"model": feeds})
    assert q["programs"]["model"]["quantized"] == 1 and q["programs"]["model"]["kept_float"] == ["MatMul.0", "MatMul.2"]
    # one layer quantized: 7-bit weights here (no VNNI; 1/63 of a channel's range per step) and 8-bit
    # activations over 4 Gaussian batches' range, ~3% each, through two more layers: measured 0.088
    assert q["int8_vs_fp32"]["model"]["y"] < 0.15, q
    for has in (False, True):
        monkeypatch.setattr(openvino, "has_bf16", lambda: has)
        int8 = Predictor(str(tmp_path / "int8"), backend="openvino", cache_dir=False)
        fp32 = Predictor(str(src), backend="openvino", cache_dir=False)
        assert int8.precision == "int8" and fp32.precision == "fp32"
        assert int8.programs["model"].options["INFERENCE_PRECISION_HINT"] == ("bf16" if has else "f32")
        # the latency table's "OpenVINO INT8" column where OpenVINO has bf16: the float layers in f32
        int8_f32 = Predictor(str(tmp_path / "int8"), backend="openvino", cache_dir=False, int8_float="fp32")
        assert int8_f32.programs["model"].options["INFERENCE_PRECISION_HINT"] == "f32"
        assert fp32.programs["model"].options["INFERENCE_PRECISION_HINT"] == "f32"
        assert fp32.programs["model"].inference_precision == "f32"     # what OpenVINO compiled
        if not has:        # this CPU: what OpenVINO compiled (with the mock, OpenVINO still finds no bf16 here)
            assert int8.programs["model"].inference_precision == "f32"
        if has and openvino_bf16_without_kernels():   # the mock's bf16 meets kernels without it: the
            # hints above are what this case checks (its inference would fail, as on no real CPU)
            continue
        got, ref = int8.programs["model"](feeds[0])["y"], fp32.programs["model"](feeds[0])["y"]
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.15    # the bound above, on this CPU's kernels
