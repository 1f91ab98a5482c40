"""OpenVINO: the CPU runtime made for deployment, on our exports (`--backend openvino`).

Route: OpenVINO reads the `--format onnx` export (its ONNX frontend) and compiles each program for
its CPU plugin. Its Paddle frontend is not used: it reads only the legacy `.pdmodel` programs, not
Paddle 3's `.json` export, and paddle's legacy save fails on BERT; the ONNX route runs every model
(infer_cfg.yml records the route, `openvino: {route: onnx}`). `tools/quantize.py --backend openvino`
writes an INT8 program as OpenVINO's own IR (`name.xml` + `name.bin`, `format: openvino`).

The compiled model's options are always explicit, never OpenVINO's guess: the inference precision
(f32 for an fp32 export: OpenVINO would pick bf16 on its own on an AMX Xeon; bf16 only where its CPU
plugin reports bf16, else f32 with one line), the threads (`runtime.num_threads`), the LATENCY or
THROUGHPUT hint, and a model cache folder (`cache_dir`, OpenVINO's CACHE_DIR: a second start skips
compilation; not for a program with a recurrent layer, whose cached form computes something else).
The model's Python around its programs (beam search, windows, proposals, NMS) is the same as on the
other backends.
"""
import functools
import os
import re
import tempfile

import numpy as np
import paddle

from engine import cpu
from deploy.record import checked_feeds
from engine.errors import ConfigError, require_packages

REQUIREMENTS = "requirements-openvino.txt"
HINTS = ("LATENCY", "THROUGHPUT")
ROUTE = "onnx"
_OV_TYPE = {"fp32": "f32", "bf16": "bf16"}
# OpenVINO 2026.4.1 compiles an LSTM right, but the model it imports from its own cache (CACHE_DIR) gives
# other numbers (a forward LSTM: 0.48 off on the second start; AttentionLSTM's logits 0.05;
# tests/test_openvino.py): programs holding one are compiled each time
_RECURRENT = ("LSTMSequence", "GRUSequence", "RNNSequence", "LSTMCell", "GRUCell", "RNNCell")
# Operators whose input `port` holds coordinates (RoIs in pixels of the image). Under a bf16 hint OpenVINO's
# CPU plugin runs every layer but the graph's tail in bf16, these and the box arithmetic feeding them too;
# bf16 keeps 8 significant bits, so a coordinate past 512 px moves by up to 2 px, past 1024 by 4: Mask
# R-CNN's masks drift twice as far from f32 as Paddle Inference's bf16 do (docs/performance.md#deployment-figures).
# They keep f32 (_coordinates_in_f32); the convolutions after them stay bf16.
_COORDINATE_INPUTS = {"ROIAlign": 1, "ROIPooling": 1, "PSROIPooling": 1}
_KEPT = ".zoo_keep_f32"


def require(what, quantize=False):
    """openvino (and nncf to quantize), or one line naming the requirements file."""
    require_packages(what, ("openvino",) + (("nncf",) if quantize else ()), REQUIREMENTS)


@functools.lru_cache(maxsize=None)
def core():
    """One OpenVINO Core per process (made on first use: its plugins load then)."""
    import openvino as ov  # optional: requirements-openvino.txt only
    return ov.Core()


def has_bf16():
    """Whether OpenVINO's CPU plugin computes bf16 on this CPU (its OPTIMIZATION_CAPABILITIES): it
    silently runs f32 under a bf16 hint where it does not. Its capabilities come from the CPU itself,
    its kernels from oneDNN within ONEDNN_MAX_CPU_ISA: under a cap below bf16 it still says BF16, then
    fails to compile a bf16 model under the AVX2 cap ("object is not initialized"), so the cap counts."""
    return cpu.has_bf16() and "BF16" in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def versions():
    import openvino as ov  # optional: requirements-openvino.txt only
    return {"openvino": ov.get_version().split("-")[0]}


def compile_options(precision="fp32", threads=None, hint="LATENCY", cache_dir=None):
    """The CPU plugin's options, each set (module docstring)."""
    if hint not in HINTS:
        raise ConfigError(f"OpenVINO performance hint '{hint}': one of {', '.join(HINTS)}")
    # CPU_RUNTIME_CACHE_CAPACITY 0: OpenVINO 2026.4.1's cache of kernels by input shape hands back a wrong
    # one after a run of shapes (the Transformer's decoder step, its cache 7 long after 0..6: logits off
    # by 6; tests/test_openvino.py); without it each new shape builds its kernels again
    options = {"INFERENCE_PRECISION_HINT": _OV_TYPE[precision], "PERFORMANCE_HINT": hint,
               "CPU_RUNTIME_CACHE_CAPACITY": 0}
    if threads:
        options["INFERENCE_NUM_THREADS"] = int(threads)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        options["CACHE_DIR"] = str(cache_dir)
    return options


def read(path):
    """An ov.Model of an .onnx or .xml program; a model OpenVINO cannot convert is one line naming the
    operator and, where the file says, the layer it comes from."""
    try:
        if path.endswith(".onnx"):
            data = _repaired(path)
            if data is not None:
                return core().read_model(data, b"")
        return core().read_model(path)
    except Exception as e:
        raise ConfigError(f"{path}: OpenVINO cannot convert it ({_unsupported(path, e)})") from None


def _repaired(path):
    """The bytes of the ONNX program with what OpenVINO 2026.4.1 computes wrongly rewritten, or None
    where nothing is (each measured against ONNX Runtime and numpy in tests/test_openvino.py):
    - ReduceLogSumExp with `axes` an attribute (opset < 18) is reduced over every axis: it becomes
      max + log(sum(exp(x - max))) over its own axes;
    - LSTM ignores its sequence_lens (each sample runs over the padding; a reverse direction starts
      in it): each direction becomes an LSTM without lengths, the reverse one run forward over each
      sample's steps reversed in place (ReverseSequence, which leaves the padding where it is) and
      reversed back, and the outputs past each length are zeroed as ONNX's LSTM leaves them;
    - a scalar integer cast to float and scaled by a one-element constant of shape [1] (paddle's `scale`
      on a shape dim, NeXtVLAD's reshapes) fails the CPU plugin's compilation ("Accessing out-of-range
      dimension") once the program holds a FakeQuantize (an INT8 IR): the constant becomes a scalar and
      the product is unsqueezed to [1] (_scalar_scales; the same numbers and shapes)."""
    import onnx  # optional: requirements-onnx.txt only (an .onnx program was written with it)
    model = onnx.load(path)
    lse = [n for n in model.graph.node if n.op_type == "ReduceLogSumExp" and any(a.name == "axes" for a in n.attribute)]
    lstm = [n for n in model.graph.node if n.op_type == "LSTM" and len(n.input) > 4 and n.input[4]]
    scales = _scalar_scales(model)
    if not lse and not lstm and not scales:
        return None
    for i, node in enumerate(lse):
        _replace(model, node, _log_sum_exp(node, f"zoo.lse.{i}."))
    used = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    for i, node in enumerate(lstm):
        if any(o in used for o in node.output[1:]):
            raise ConfigError(f"{path}: OpenVINO ignores the sequence lengths of LSTM node {node.name}, whose last "
                              f"states the program reads (only its outputs can be rebuilt)")
        _replace(model, node, _lstm_without_lengths(node, f"zoo.lstm.{i}."))
    return model.SerializeToString()


def _scalar_scales(model):
    """Mul/Add of a rank-0 Cast (int -> float) by a [1] initializer rewritten as the product by a scalar
    then Unsqueeze to [1] (_repaired); returns how many it rewrote."""
    import onnx  # optional: requirements-onnx.txt only
    from onnx import TensorProto, helper, numpy_helper  # optional: as above
    graph = model.graph
    consts = {i.name: i for i in graph.initializer}
    made = {n.output[0] for n in graph.node if n.op_type == "Cast" and
            {a.name: a.i for a in n.attribute}.get("to") in (TensorProto.FLOAT, TensorProto.DOUBLE)}
    found = [n for n in graph.node if n.op_type in ("Mul", "Add") and len(n.input) == 2 and
             any(i in made for i in n.input) and any(i in consts and list(consts[i].dims) == [1] for i in n.input)]
    if not found:
        return 0      # most programs: no shape inference (a copy of the whole model, weights and all)
    typed = onnx.shape_inference.infer_shapes(model).graph
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in list(typed.value_info) + list(typed.input)
            if v.type.tensor_type.HasField("shape")}
    found = [n for n in found if any(i in made and rank.get(i) == 0 for i in n.input)]
    for k, node in enumerate(found):
        t = f"zoo.scalar.{k}."
        const = next(i for i in node.input if i in consts and list(consts[i].dims) == [1])
        graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(consts[const]).reshape(()), t + "c"))
        node.input[:] = [t + "c" if i == const else i for i in node.input]
        out, node.output[0] = node.output[0], t + "y"
        at = list(graph.node).index(node) + 1
        graph.node.insert(at, helper.make_node("Unsqueeze", [t + "y", t + "axes"], [out], name=t + "unsqueeze"))
        graph.initializer.append(helper.make_tensor(t + "axes", TensorProto.INT64, [1], [0]))
    return len(found)


def _coordinates_in_f32(model):
    """`model` with its coordinate operators (_COORDINATE_INPUTS) and every node computing their
    coordinates kept at f32 under a bf16 hint, or `model` itself where it has none. That is OpenVINO's
    `precise` attribute (DisablePrecisionConversion, which its CPU plugin honours), which Python cannot set:
    the nodes are renamed, the model saved as IR, the attribute written on the renamed layers and read back."""
    import openvino as ov  # optional: requirements-openvino.txt only
    ops = model.get_ordered_ops()
    keep = {op.get_name(): op for op in ops if op.get_type_name() in _COORDINATE_INPUTS}   # unique names
    stack = [op.input_value(_COORDINATE_INPUTS[op.get_type_name()]).get_node() for op in keep.values()]
    while stack:
        node = stack.pop()
        if node.get_type_name() not in ("Parameter", "Constant") and node.get_name() not in keep:
            keep[node.get_name()] = node
            stack += [value.get_node() for value in node.input_values()]
    if not keep:
        return model
    names = {key: node.get_friendly_name() for key, node in keep.items()}
    for key, node in keep.items():
        node.set_friendly_name(names[key] + _KEPT)
    try:
        with tempfile.TemporaryDirectory() as folder:
            xml = os.path.join(folder, "model.xml")
            ov.save_model(model, xml, compress_to_fp16=False)
            with open(xml, encoding="utf-8") as f:
                text = f.read()
            weights = np.fromfile(xml[:-4] + ".bin", np.uint8)
    finally:
        for key, node in keep.items():
            node.set_friendly_name(names[key])
    opening = r'(<layer [^>]*name="[^"]*)' + re.escape(_KEPT) + r'("[^>]*>)(\s*<data [^>]*>)?(\s*<rt_info>)?'
    text, n = re.subn(opening, _precise, text)
    if n != len(keep):
        raise RuntimeError(f"OpenVINO's IR holds {n} of the {len(keep)} layers to keep in f32")
    return core().read_model(text.encode("utf-8"), ov.Tensor(weights))


def _precise(match):
    """A renamed layer's opening of the IR (its tag, data and rt_info) with its name back and the attribute
    added to its rt_info (a new one if it had none)."""
    tag, data, rt_info = match.group(1) + match.group(2), match.group(3) or "", match.group(4)
    attribute = '<attribute name="precise" version="0" />'
    return tag + data + (rt_info + attribute if rt_info else f"<rt_info>{attribute}</rt_info>")


def _replace(model, node, new):
    at = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for n in reversed(new[0]):
        model.graph.node.insert(at, n)
    model.graph.initializer.extend(new[1])


def _log_sum_exp(node, t):
    from onnx import TensorProto, helper  # optional: requirements-onnx.txt only
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes, keep, x = list(attrs["axes"]), attrs.get("keepdims", 1), node.input[0]
    nodes = [helper.make_node("ReduceMax", [x], [t + "max"], axes=axes, keepdims=1),
             helper.make_node("Sub", [x, t + "max"], [t + "shifted"]),
             helper.make_node("Exp", [t + "shifted"], [t + "exp"]),
             helper.make_node("ReduceSum", [t + "exp", t + "axes"], [t + "sum"], keepdims=1),
             helper.make_node("Log", [t + "sum"], [t + "log"]),
             helper.make_node("Add", [t + "log", t + "max"], [node.output[0] if keep else t + "lse"])]
    if not keep:
        nodes.append(helper.make_node("Squeeze", [t + "lse", t + "axes"], [node.output[0]]))
    return nodes, [helper.make_tensor(t + "axes", TensorProto.INT64, [len(axes)], axes)]


def _lstm_without_lengths(node, t):
    """ONNX nodes computing `node`'s output Y ([T, D, B, H]) with LSTMs that take no lengths."""
    from onnx import TensorProto, helper  # optional: requirements-onnx.txt only
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    direction = attrs.pop("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    x, lens = node.input[0], node.input[4]
    ins = list(node.input) + [""] * (8 - len(node.input))
    nodes = [helper.make_node("Cast", [lens], [t + "lens"], to=TensorProto.INT64),
             helper.make_node("Shape", [x], [t + "steps"], start=0, end=1),
             helper.make_node("Squeeze", [t + "steps", t + "zero1"], [t + "n"]),
             helper.make_node("Range", [t + "zero", t + "n", t + "one"], [t + "time"]),
             helper.make_node("Unsqueeze", [t + "time", t + "one1"], [t + "time2"]),           # [T, 1]
             helper.make_node("Unsqueeze", [t + "lens", t + "zero1"], [t + "lens2"]),          # [1, B]
             helper.make_node("Less", [t + "time2", t + "lens2"], [t + "live"]),
             helper.make_node("Cast", [t + "live"], [t + "livef"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", [t + "livef", t + "mask_axes"], [t + "mask"])]    # [T, 1, B, 1]
    outs = []
    for d, reverse in enumerate({"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]):
        p = f"{t}{d}."
        lstm_in = [x if not reverse else p + "x"]
        if reverse:
            nodes.append(helper.make_node("ReverseSequence", [x, t + "lens"], [p + "x"], batch_axis=1, time_axis=0))
        for k in (1, 2, 3, 5, 6, 7):           # W, R, B, initial_h, initial_c, P: this direction's slice
            if ins[k]:
                nodes.append(helper.make_node("Slice", [ins[k], f"{t}start{d}", f"{t}end{d}", t + "zero1"],
                                              [f"{p}in{k}"]))
        lstm_in += [f"{p}in{k}" if ins[k] else "" for k in (1, 2, 3)] + [""] +                    [f"{p}in{k}" if ins[k] else "" for k in (5, 6, 7)]
        while lstm_in[-1] == "":
            lstm_in.pop()
        nodes.append(helper.make_node("LSTM", lstm_in, [p + "y"], direction="forward", **attrs))   # [T, 1, B, H]
        if reverse:
            nodes += [helper.make_node("Squeeze", [p + "y", t + "one1"], [p + "y3"]),
                      helper.make_node("ReverseSequence", [p + "y3", t + "lens"], [p + "yr"], batch_axis=1, time_axis=0),
                      helper.make_node("Unsqueeze", [p + "yr", t + "one1"], [p + "yd"])]
        outs.append(p + "yd" if reverse else p + "y")
    nodes.append(helper.make_node("Concat", outs, [t + "y"], axis=1) if len(outs) > 1 else
                 helper.make_node("Identity", outs, [t + "y"]))
    nodes.append(helper.make_node("Mul", [t + "y", t + "mask"], [node.output[0]]))
    consts = [helper.make_tensor(t + "zero", TensorProto.INT64, [], [0]),
              helper.make_tensor(t + "one", TensorProto.INT64, [], [1]),
              helper.make_tensor(t + "zero1", TensorProto.INT64, [1], [0]),
              helper.make_tensor(t + "one1", TensorProto.INT64, [1], [1]),
              helper.make_tensor(t + "mask_axes", TensorProto.INT64, [2], [1, 3])]
    for d in range(len(outs)):
        consts += [helper.make_tensor(f"{t}start{d}", TensorProto.INT64, [1], [d]),
                   helper.make_tensor(f"{t}end{d}", TensorProto.INT64, [1], [d + 1])]
    return nodes, consts


def _unsupported(path, error):
    """OpenVINO's report shortened to one line: the operators it could not convert (its summary lines
    `-- No conversion rule found for operations: Det-16, my.domain.Op` and `-- Conversion is failed for:
    X-16`) with the nodes that hold them (paddle2onnx names them after the Paddle layer) and, for a
    failed conversion, the last line of OpenVINO's reason."""
    text = str(error)
    found = re.findall(r"^-- (No conversion rule found for operations|Conversion is failed for): (.+)$", text, re.M)
    ops = [(o.strip(), kind.startswith("Conversion")) for kind, names in found for o in names.split(",") if o.strip()]
    if not ops or not path.endswith(".onnx"):
        return _summary(error)
    import onnx  # optional: requirements-onnx.txt only (an .onnx program was written with it)
    graph = onnx.load(path, load_external_data=False).graph
    where = []
    for op, failed in ops:
        domain, _, kind = re.sub(r"-\d+$", "", op).rpartition(".")     # Det-16 -> Det; my.domain.Op
        nodes = [n.name or n.output[0] for n in graph.node
                 if n.op_type == kind and (n.domain == domain or not domain and n.domain in ("", "ai.onnx"))]
        said = f"operator {domain + '.' if domain else ''}{kind}" + (f" (node {', '.join(nodes[:3])})" if nodes else "")
        reason = failed and re.search(rf"^-- {re.escape(op)} with a message:\n(.*?)\n\n", text, re.M | re.S)
        where.append(f"{said}: {reason.group(1).strip().splitlines()[-1][:200]}" if reason else
                     said if failed else "no conversion rule for " + said)
    return "; ".join(where)


def _summary(error):
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and not ln.strip().startswith("[")]
    lines = lines or [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return lines[-1][:400] if lines else type(error).__name__


def compile_cpu(model, options):
    """`model` compiled for the CPU plugin with `options` (compile_options()), as every program of ours
    is: with IEEE denormals, so the threads OpenVINO starts here run as inference does (Program.__call__),
    and under a bf16 hint with its RoI coordinates in f32 (_coordinates_in_f32)."""
    if options.get("INFERENCE_PRECISION_HINT") == "bf16":
        model = _coordinates_in_f32(model)
    with cpu.ieee_denormals():
        return core().compile_model(model, "CPU", options)


class Program:
    """One program compiled by OpenVINO: `program(feeds)` with numpy feeds by input name -> {output:
    numpy}, the interface of deploy.predictor.Program (paddle.Tensor feeds -> tensors, through
    numpy: this backend runs on the CPU). `precision`: "fp32", "bf16" (the caller checked the CPU), or
    "int8" for an IR written by tools/quantize.py, whose float layers run in `float_precision`."""

    def __init__(self, export_dir, name, spec, threads=None, precision="fp32", hint="LATENCY", cache_dir=None,
                 float_precision="fp32"):
        self.name, self.inputs, self.outputs = name, spec["inputs"], list(spec["outputs"])
        ext = ".xml" if precision == "int8" else ".onnx"
        self.where = os.path.join(export_dir, name + ext)
        model = read(self.where)
        if any(op.get_type_name() in _RECURRENT for op in model.get_ops()):
            cache_dir = None      # OpenVINO's cached blob of an LSTM computes something else (_RECURRENT)
        self.options = compile_options(float_precision if precision == "int8" else precision, threads, hint, cache_dir)
        try:
            self.compiled = compile_cpu(model, self.options)
        except Exception as e:
            raise ConfigError(f"{self.where}: OpenVINO cannot compile it ({_unsupported(self.where, e)})") from None
        names = [n for p in self.compiled.inputs for n in sorted(p.get_names())]   # a port has aliases
        missing = set(s["name"] for s in self.inputs) - set(names)
        if missing or len(self.compiled.outputs) != len(self.outputs):
            raise ConfigError(f"{self.where}: inputs {names} and {len(self.compiled.outputs)} outputs, but "
                              f"infer_cfg.yml lists inputs {[s['name'] for s in self.inputs]} and outputs "
                              f"{self.outputs} (files from different exports?)")
        self.fed = set(names)            # an input the program ignores is pruned from the graph
        self.request = self.compiled.create_infer_request()

    @property
    def inference_precision(self):
        """What the compiled model computes its float layers in: "f32" or "bf16"."""
        return self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()

    def __call__(self, feeds):
        values, shapes = checked_feeds(self.inputs, feeds, self.where)
        try:
            # OpenVINO 2026.4.1 moves int64 through Where as floats: under our flushed denormals (runtime.
            # flush_denormals) small integers read as 0 (BERT pretraining's mlm_correct; tests/test_openvino.py)
            with cpu.ieee_denormals():
                result = self.request.infer({spec["name"]: v for spec, v in values if spec["name"] in self.fed})
        except Exception as e:
            raise ConfigError(f"the exported program {self.where} cannot take inputs {', '.join(shapes)}: "
                              f"{_summary(e)}") from None
        outputs = [np.array(result[port]) for port in self.compiled.outputs]   # copies: the request reuses its buffers
        if any(isinstance(feeds.get(s["name"]), paddle.Tensor) for s in self.inputs):   # as predictor.Program
            return {k: paddle.to_tensor(v) for k, v in zip(self.outputs, outputs)}
        return dict(zip(self.outputs, outputs))
