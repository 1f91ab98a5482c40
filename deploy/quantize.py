"""INT8 post-training quantization of an ONNX export (tools/quantize.py), on ONNX Runtime.

The route (docs/deployment.md, "INT8"): ONNX Runtime's static quantization in the QDQ format. Its fused kernels
(VNNI, AMX) compute what its own fake-quant simulation computes, which the routes through Paddle
Inference's oneDNN INT8 did not (issue 24), and it runs every program our ONNX exports hold.

Calibration runs the fp32 export on the recipe's calibration batches and records the feeds each
program receives (`record_feeds`), so a model whose prediction is Python around several programs
(beam search, proposals) calibrates each program on what it really sees. What is quantized:
convolutions and the matrix products with a weight (per output channel), except each program's first
and last such layers; norms, softmax, activations, attention's products of two activations and
recurrent layers stay in floating point. `check_simulation` runs the quantized program twice, with
the INT8 kernels and with every QuantizeLinear/DequantizeLinear computed in float (no graph
optimization: the simulation), and the two must agree.
"""
import contextlib
import json
import logging
import os
import tempfile

import numpy as np

from engine import cpu
from engine.data import empty
from deploy import export
from deploy.predictor import Predictor
from deploy.record import FORMATS, as_numpy, programs_of, read_infer_cfg, write_infer_cfg
from engine.errors import ConfigError
from engine.training.evaluator import evaluate

OBSERVERS = ("minmax", "percentile", "entropy")
QUANTIZED_OPS = ("Conv", "MatMul", "Gemm")
# The INT8 kernels may depart from the fake-quant simulation (relative L2 of an output) by this much, or
# by up to SIMULATION_FACTOR times what the simulation departs from fp32 where that is more: they
# round in other places (requantization in integers, fused layers), so that rounding propagates as
# quantization's own does (a random BERT's near-zero logits: 0.13 against 0.10; a saturated softmax's
# near-ties), but a kernel computing something else departs by far more than quantization itself
# (issue 24: 2.1-2.8 against 0.015 for Paddle Inference's oneDNN INT8 of a paddle.quantization program)
SIMULATION_TOLERANCE, SIMULATION_FACTOR = 0.05, 2.0


class Recorder:
    """A program that keeps (up to `limit`) copies of the feeds it runs on, for calibration."""

    def __init__(self, program, limit):
        self.program, self.limit, self.feeds = program, limit, []
        self.name, self.inputs, self.outputs = program.name, program.inputs, program.outputs

    def __call__(self, feeds):
        if len(self.feeds) < self.limit:
            self.feeds.append({s["name"]: np.array(as_numpy(feeds[s["name"]]), dtype=s["dtype"]) for s in self.inputs})
        return self.program(feeds)


def record_feeds(export_dir, batches, threads=None, limit=64):
    """{program: [feeds]} of the fp32 ONNX export in `export_dir` predicting `batches`."""
    predictor = Predictor(export_dir, threads=threads, backend="onnxruntime", wrap=lambda p: Recorder(p, limit))
    for batch in batches:
        predictor(batch)
    return {name: p.feeds for name, p in predictor.programs.items()}


def quantizable(model):
    """Names of the nodes QUANTIZED_OPS quantizes: convolutions and products with a weight."""
    weights = {t.name for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type in QUANTIZED_OPS
            and (n.op_type == "Conv" or any(i in weights for i in n.input[:2]))]


def ends(model, names, first=True):
    """The nodes of `names` with no other of them downstream (the last layers) and, with `first`,
    those with none upstream (the first)."""
    names, nodes = set(names), list(model.graph.node)

    def reach(order, src, dst):
        marked, out = set(), []
        for n in order:
            hit = any(t in marked for t in src(n))
            if n.name in names and not hit:
                out.append(n.name)
            if hit or n.name in names:
                marked.update(dst(n))
        return out
    last = reach(reversed(nodes), lambda n: n.output, lambda n: n.input)
    return sorted(set(last) | set(reach(nodes, lambda n: n.input, lambda n: n.output) if first else ()))


def _choose(src, pre, keep_first, route):
    """ONNX Runtime's pre-processing of `src` into `pre` (shape inference, constant folding: a weight
    reaching a MatMul through a Concat becomes a constant), and the layers to quantize there:
    (graph, kept in float, chosen), what both routes quantize (QUANTIZED_OPS, ends)."""
    # optional: requirements-onnx.txt only
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process
    quant_pre_process(src, pre, skip_symbolic_shape=True)
    model = onnx.load(pre)
    candidates = quantizable(model)
    keep = ends(model, candidates, keep_first)
    chosen = [n for n in candidates if n not in keep]
    if not chosen:
        raise ConfigError(f"{src}: no layer {route} quantizes (convolutions and products with weights: "
                          f"{', '.join(candidates) or 'none'}) besides the first and last, which stay in float")
    return model, keep, chosen


class _Feeds:
    """onnxruntime.quantization.CalibrationDataReader over recorded feeds."""

    def __init__(self, feeds, names):
        self.items = iter([{k: v for k, v in f.items() if k in names} for f in feeds])

    def get_next(self):
        return next(self.items, None)

    def __len__(self):
        return 0


def quantize_program(src, dst, feeds, observer="minmax", per_channel=True, keep_first=True, reduce_range=False):
    """`src` (fp32 .onnx) -> `dst` (QDQ INT8), calibrated on `feeds`; returns what was kept in float:
    the last layers, and the first where the program reads the model's own inputs (`keep_first`; not a
    box head behind RoIAlign, nor a decoder step behind the beam search). `reduce_range`: 7-bit
    weights, for CPUs without VNNI (engine.cpu.has_vnni)."""
    # optional: requirements-onnx.txt only
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
    if observer not in OBSERVERS:
        raise ConfigError(f"observer '{observer}': one of {', '.join(OBSERVERS)}")
    if not feeds:
        raise ConfigError(f"{src}: no calibration feeds recorded for this program")
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "pre.onnx")
        model, keep, chosen = _choose(src, pre, keep_first, "ONNX Runtime")
        reader = type("CalibrationFeeds", (_Feeds, CalibrationDataReader), {})(
            feeds, {i.name for i in model.graph.input})
        method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
                  "entropy": CalibrationMethod.Entropy}[observer]
        try:
            quantize_static(pre, dst + ".tmp", reader, quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_quantize=chosen,
                            per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            calibrate_method=method, reduce_range=reduce_range,
                            extra_options={"MatMulConstBOnly": True})
        except ValueError as e:
            if observer != "minmax" and "inhomogeneous" in str(e):
                raise ConfigError(f"{src}: the {observer} observer (ONNX Runtime's histograms of every tensor) needs "
                                  f"calibration batches of one shape, and this program's vary; use minmax") from None
            raise
        os.replace(dst + ".tmp", dst)
    return {"quantized": len(chosen), "kept_float": keep}


def check_simulation(fp32_path, int8_path, feeds, threads=None):
    """{output: (kernels vs simulation, simulation vs fp32)}, relative L2 differences on `feeds`, worst
    over them: the INT8 kernels' outputs against the fake-quant simulation's (QuantizeLinear and
    DequantizeLinear computed in float, no graph optimization), and that simulation against fp32."""
    import onnxruntime as ort  # optional: requirements-onnx.txt only

    def session(path, level):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = level
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = int(threads), 1
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    level = ort.GraphOptimizationLevel
    fp32, fused = session(fp32_path, level.ORT_ENABLE_ALL), session(int8_path, level.ORT_ENABLE_ALL)
    simulated = session(int8_path, level.ORT_DISABLE_ALL)
    names = {i.name for i in fused.get_inputs()}
    outputs = [o.name for o in fused.get_outputs()]
    worst = {}
    for f in feeds:
        f = {k: v for k, v in f.items() if k in names}
        for name, ref, k, q in zip(outputs, fp32.run(None, f), fused.run(None, f), simulated.run(None, f)):
            if np.issubdtype(ref.dtype, np.floating) and ref.size:
                gaps = (_relative(k, q), _relative(q, ref))
                worst[name] = tuple(max(a, b) for a, b in zip(worst.get(name, (0.0, 0.0)), gaps))
    return worst


def simulation_agrees(kernels, simulation):
    """Whether kernels this far from the simulation (relative L2) compute what it computes, given how
    far the simulation is from fp32 (SIMULATION_TOLERANCE)."""
    return kernels <= max(SIMULATION_TOLERANCE, SIMULATION_FACTOR * simulation)


def _relative(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-12))


def size_on_disk(export_dir):
    record = read_infer_cfg(export_dir)
    ext = FORMATS[record.get("format", "paddle")]
    return sum(os.path.getsize(os.path.join(export_dir, p + e)) for p in programs_of(record) for e in ext)


def quantize(src_dir, dst_dir, feeds, observer="minmax", per_channel=True, threads=None, check_feeds=2):
    """The fp32 ONNX export in `src_dir` quantized into `dst_dir` (the same infer_cfg.yml, with
    `precision: int8` and a `quantization` record); returns that record."""
    record = read_infer_cfg(src_dir)
    if record.get("format") != "onnx":
        raise ConfigError(f"{src_dir}: INT8 quantization takes an export of --format onnx")
    os.makedirs(dst_dir, exist_ok=True)
    programs, gaps = {}, {}
    top = {s["name"] for s in record["inputs"]}
    # without VNNI the INT8 kernels' u8 x s8 pair sums saturate (BERT's logits off the simulation:
    # docs/performance.md#deployment-figures); 7-bit weights keep them in range, as ONNX Runtime advises (its
    # kernels read the CPU itself, not ONEDNN_MAX_CPU_ISA)
    reduce_range = not cpu.has_vnni()
    for name, spec in programs_of(record).items():
        src, dst = os.path.join(src_dir, name + ".onnx"), os.path.join(dst_dir, name + ".onnx")
        keep_first = any(s["name"] in top for s in spec["inputs"])
        programs[name] = quantize_program(src, dst, feeds.get(name), observer, per_channel, keep_first, reduce_range)
        gaps[name] = check_simulation(src, dst, feeds[name][:check_feeds], threads)
        for out, (kernels, simulation) in gaps[name].items():
            if not simulation_agrees(kernels, simulation):
                raise ConfigError(f"{dst}: ONNX Runtime's INT8 kernels give {out} {kernels:.3g} away from its own "
                                  f"fake-quant simulation (relative L2), which is {simulation:.3g} away from fp32: "
                                  f"the kernels on this CPU compute something else")
        gaps[name] = {out: {"kernels_vs_simulation": round(k, 6), "simulation_vs_fp32": round(q, 6)}
                      for out, (k, q) in gaps[name].items()}
    quant = {"route": "onnxruntime-qdq", "observer": observer, "per_channel": per_channel,
             "activations": "uint8", "weights": "int8 (7-bit range: this CPU has no VNNI)" if reduce_range else "int8",
             "simulation_gap": gaps, "programs": programs,
             "fp32_bytes": size_on_disk(src_dir),
             "int8_bytes": sum(os.path.getsize(os.path.join(dst_dir, p + ".onnx")) for p in programs)}
    write_infer_cfg(dst_dir, dict(record, precision="int8", quantization=quant))
    return quant


OV_WEIGHTED = ("Convolution", "GroupConvolution", "MatMul")   # what QUANTIZED_OPS become in OpenVINO


def quantize_program_openvino(src, dst, feeds, keep_first=True, overflow_fix=False):
    """`src` (fp32 .onnx) -> `dst` (.xml + .bin, OpenVINO's IR with NNCF's FakeQuantize), calibrated on
    `feeds`. What is quantized is what quantize_program quantizes (_choose); everything else (norms,
    softmax, additions, pooling) stays in float. `overflow_fix`: 7-bit weights where the CPU has no
    VNNI (NNCF's overflow fix)."""
    # optional: requirements-openvino.txt only
    import nncf
    import openvino as ov
    from deploy import openvino
    if not feeds:
        raise ConfigError(f"{src}: no calibration feeds recorded for this program")
    nncf.set_log_level(logging.WARNING)          # its INFO line per layer it leaves alone
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "pre.onnx")
        _, keep, chosen = _choose(src, pre, keep_first, "NNCF")
        chosen = set(chosen)
        model = openvino.read(pre)
    # constants folded in OpenVINO's graph too (an LSTM's weights sliced per direction by the repairs):
    # the CPU plugin wants its LSTM weights as constants in the saved IR, where it folds nothing itself
    from openvino._offline_transformations import apply_moc_transformations  # optional: openvino only
    apply_moc_transformations(model, cf=True)
    names = {n for p in model.inputs for n in p.get_names()}
    dataset = nncf.Dataset(feeds, lambda f: {k: v for k, v in f.items() if k in names})
    # NNCF quantizes only the chosen layers' inputs: every other operation is in its ignored scope. Left
    # to its own choices (inputs of additions, concatenations, reductions, embeddings) the demos lost
    # up to 78 BLEU (the Transformer) and 0.12 GAP (Attention Cluster) on this CPU (no VNNI)
    ops = {op.get_friendly_name() for op in model.get_ops()}
    # a Gemm (MatMul + Add fused by the pre-processing) becomes OpenVINO's MatMul "<name>/WithoutBiases"
    matched = {op.get_friendly_name() for op in model.get_ops() if op.get_type_name() in OV_WEIGHTED
               and op.get_friendly_name().removesuffix("/WithoutBiases") in chosen}
    if not matched:
        raise ConfigError(f"{src}: none of the layers to quantize ({', '.join(sorted(chosen))}) is in OpenVINO's graph")
    advanced = nncf.AdvancedQuantizationParameters(
        overflow_fix=nncf.OverflowFix.ENABLE if overflow_fix else nncf.OverflowFix.DISABLE)
    with _statistics_compiled_as_predicted():
        quantized = nncf.quantize(model, dataset, subset_size=len(feeds), target_device=nncf.TargetDevice.CPU,
                                  preset=nncf.QuantizationPreset.MIXED,
                                  ignored_scope=nncf.IgnoredScope(names=sorted(ops - matched), validate=False),
                                  advanced_parameters=advanced)
    ov.save_model(quantized, dst + ".tmp.xml", compress_to_fp16=False)
    os.replace(dst + ".tmp.bin", dst[:-len(".xml")] + ".bin")
    os.replace(dst + ".tmp.xml", dst)
    fq = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
    return {"quantized": len(matched), "kept_float": sorted(keep), "fake_quantize_ops": fq}


@contextlib.contextmanager
def _statistics_compiled_as_predicted():
    """NNCF's calibration runs the model as the Predictor does: compiled with our options
    (deploy.openvino.compile_options: f32, the shape-keyed kernel cache off) and with IEEE
    denormals. NNCF 3.4.0 compiles it in OVNativeEngine with a Core of its own and only an f32 hint,
    so OpenVINO 2026.4.1's kernel cache fault (tests/test_openvino.py) struck its statistics: from the
    Transformer decoder step's 8th feed (cache length 7) on, its attention outputs were in the hundreds
    instead of below 8, the output projections' input ranges came out +-620 and +-1180 instead of +-7
    and +-8, and the demo lost 46 BLEU."""
    # optional: requirements-openvino.txt only
    import nncf.openvino.engine as nncf_engine
    from nncf.openvino.graph.model_utils import model_has_state
    from deploy import openvino
    real = nncf_engine.OVNativeEngine

    class Engine(real):
        def __init__(self, model, use_fp32_precision=True):    # statistics in f32 always
            compiled = openvino.compile_cpu(model, openvino.compile_options())
            self.engine = nncf_engine.OVCompiledModelEngine(compiled, model_has_state(model))

        def infer(self, input_data):
            with cpu.ieee_denormals():
                return self.engine.infer(input_data)
    nncf_engine.OVNativeEngine = Engine
    try:
        yield
    finally:
        nncf_engine.OVNativeEngine = real


def output_gap(fp32, int8, feeds):
    """{output: worst relative L2 of `int8`'s outputs from `fp32`'s} over `feeds` (two programs)."""
    worst = {}
    for f in feeds:
        want, got = fp32(f), int8(f)
        for key, ref in want.items():
            if np.issubdtype(ref.dtype, np.floating) and ref.size:
                worst[key] = round(max(worst.get(key, 0.0), _relative(got[key], ref)), 6)
    return worst


def quantize_openvino(src_dir, dst_dir, feeds, threads=None, check_feeds=2):
    """The fp32 ONNX export in `src_dir` quantized by NNCF into `dst_dir` as OpenVINO IR (`format:
    openvino`, `precision: int8`, the same infer_cfg.yml otherwise); returns the quantization record."""
    from deploy import openvino  # the Predictor's backend module (deploy.predictor imports it too)
    record = read_infer_cfg(src_dir)
    if record.get("format") != "onnx" or record.get("precision", "fp32") != "fp32":
        raise ConfigError(f"{src_dir}: INT8 quantization takes an fp32 export of --format onnx")
    os.makedirs(dst_dir, exist_ok=True)
    top = {s["name"] for s in record["inputs"]}
    # as reduce_range on the ONNX Runtime route; OpenVINO's kernels are oneDNN's, within ONEDNN_MAX_CPU_ISA
    overflow_fix = not cpu.has_vnni(capped=True)
    programs = {}
    for name, spec in programs_of(record).items():
        keep_first = any(s["name"] in top for s in spec["inputs"])
        programs[name] = quantize_program_openvino(os.path.join(src_dir, name + ".onnx"),
                                                   os.path.join(dst_dir, name + ".xml"), feeds.get(name),
                                                   keep_first, overflow_fix)
    quant = {"route": "openvino-nncf", **openvino.versions(), "nncf": _nncf_version(),
             "weights": "int8 (7-bit range, NNCF's overflow fix: this CPU has no VNNI)" if overflow_fix else "int8",
             "programs": programs, "fp32_bytes": size_on_disk(src_dir),
             "int8_bytes": sum(os.path.getsize(os.path.join(dst_dir, p + e)) for p in programs for e in (".xml", ".bin"))}
    out = dict(record, format="openvino", precision="int8", openvino={"route": openvino.ROUTE, **openvino.versions()},
               quantization=quant)
    write_infer_cfg(dst_dir, out)           # the Predictor below reads it; written again with the gaps
    fp32 = Predictor(src_dir, threads=threads, backend="openvino", cache_dir=False)
    int8 = Predictor(dst_dir, threads=threads, backend="openvino", cache_dir=False)
    quant["int8_vs_fp32"] = {name: output_gap(fp32.programs[name], int8.programs[name], feeds[name][:check_feeds])
                             for name in programs}
    write_infer_cfg(dst_dir, out)
    return quant


def _nncf_version():
    import nncf  # optional: requirements-openvino.txt only
    return nncf.__version__


def check_options(observer, calib_batches):
    if observer not in OBSERVERS:
        raise ConfigError(f"--observer {observer}: one of {', '.join(OBSERVERS)}")
    if calib_batches < 1:
        raise ConfigError(f"--calib-batches must be >= 1, got {calib_batches}")


def quantize_recipe(session, model, outputs, calib_batches=8, observer="minmax", split=None, metric=None,
                    batch_size=None, threads=None):
    """tools/quantize.py: `model` exported to ONNX, calibrated on `calib_batches` batches of
    session.calibration_loader and quantized by each backend of `outputs` ({backend: folder}); fp32
    and each INT8 evaluated on `split`. One export, one recording of the calibration feeds and one fp32
    evaluation (through the first backend: the backends' fp32 scores agree to 1e-4) serve every
    backend, so comparing the two routes costs little more than running one. Returns
    {backend: what its `metrics.json` holds ({split, metric, drop, fp32, int8, fp32_backend})}."""
    split = split or session.cfg.eval_split()
    loader, dataset, _ = session.loader(split, batch_size=batch_size, sharded=False)
    names = session.metric(dataset).names()
    key = metric or session.cfg.train.best_metric or names[0]
    if key not in names:
        raise ConfigError(f"--metric {key}: not a metric of the recipe ({', '.join(names)})")
    calib, _, _ = session.calibration_loader(split, batch_size=batch_size)
    batches = _first(calib, calib_batches)
    if not batches:
        raise ConfigError(f"the calibration reader (reader.train's samples through reader.{split}'s processing) "
                          f"yielded no batches")
    for output in outputs.values():
        os.makedirs(output, exist_ok=True)
    name = session.cfg["model"]["name"]

    def score(where, backend):
        predictor = Predictor(where, threads=threads, backend=backend, model_name=name,
                              **({"cache_dir": False} if backend == "openvino" else {}))
        return {k: float(v) for k, v in evaluate(predictor, loader, session.metric(dataset)).items()}
    first = next(iter(outputs))
    with tempfile.TemporaryDirectory(prefix=".fp32-", dir=outputs[first]) as fp32:
        export.export(model, session.cfg, fp32, label_names=session.label_names(), example=batches[0], fmt="onnx")
        feeds = record_feeds(fp32, batches, threads)
        int8 = {}
        for backend, output in outputs.items():
            if backend == "openvino":
                record = quantize_openvino(fp32, output, feeds, threads=threads)
            else:
                record = quantize(fp32, output, feeds, observer, threads=threads)
            how = "NNCF" if backend == "openvino" else f"{observer} observer"
            print(f"quantized {name} to INT8 in {output} ({record['route']}, {how}, {len(batches)} calibration "
                  f"batches): {record['fp32_bytes'] / 2 ** 20:.1f} -> {record['int8_bytes'] / 2 ** 20:.1f} MB "
                  f"({100.0 * record['int8_bytes'] / record['fp32_bytes']:.0f}%)")
            int8[backend] = score(output, backend)
        fp32_scores = score(fp32, first)
    results = {}
    for backend, output in outputs.items():
        out = results[backend] = {"split": split, "metric": key, "drop": fp32_scores[key] - int8[backend][key],
                                  "fp32": fp32_scores, "int8": int8[backend], "fp32_backend": first}
        with open(os.path.join(output, "metrics.json.tmp"), "w") as f:
            json.dump(out, f, indent=1)
        os.replace(os.path.join(output, "metrics.json.tmp"), os.path.join(output, "metrics.json"))
    return results


def _first(loader, n):
    """The first `n` non-empty batches of `loader`."""
    out = []
    for batch in loader:
        if not empty(batch):
            out.append(batch)
        if len(out) == n:
            break
    return out
