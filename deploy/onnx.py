"""ONNX: the exported programs converted by paddle2onnx, and run by ONNX Runtime.

`tools/export.py --format onnx` saves each program as tools/export.py always does, then converts it
to `name.onnx` in a child process (`python -m deploy.onnx`): paddle2onnx aborts its process
(SIGABRT) on some programs (a mean over all axes: "Can not get input 'axis(dim)' value",
PaddlePaddle/Paddle2ONNX#1421), and the exporter must say which operator failed, not die. The child
first checks every operator against paddle2onnx's converters (through its own PIR name table), so an
operator it has none for is named with the layer it comes from; a converter that aborts is named
from paddle2onnx's verbose log of a second attempt.

The packages are pinned in requirements-onnx.txt (which `make test` installs); nothing is installed
at run time. paddle2onnx's own constant folding (polygraphy, which it lets pip-install
onnx_graphsurgeon) is not used: ONNX Runtime folds constants when it loads the model. Its graph
optimization is off during the conversion (the repairs below need tensors it prunes) and done after
them with onnxoptimizer's passes (`_tidy`): weights become initializers again.
"""
import os
import re
import subprocess
import sys

import paddle

from deploy.record import OPSET, checked_feeds
from engine.errors import ConfigError, require_packages

REQUIREMENTS = "requirements-onnx.txt"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 1800

# paddle2onnx 2.1.0 looks PIR operators up under their legacy names (its convert_pir_op_name table)
_LEGACY_NAMES = {
    "matmul": "matmul_v2", "batch_norm_": "batch_norm", "topk": "top_k_v2",
    "repeat_interleave_with_tensor_index": "repeat_interleave", "expand": "expand_v2",
    "assign_value_": "assign_value", "flatten": "flatten_contiguous_range", "unsqueeze": "unsqueeze2",
    "arange": "range", "argmax": "arg_max", "floor_divide": "elementwise_floordiv",
    "subtract": "elementwise_sub", "multiply": "elementwise_mul", "divide": "elementwise_div",
    "remainder": "elementwise_mod", "minimum": "elementwise_min", "maximum": "elementwise_max",
    "min": "reduce_min", "max": "reduce_max", "mean": "reduce_mean", "sum": "reduce_sum",
    "prod": "reduce_prod", "any": "reduce_any", "all": "reduce_all", "numel": "size",
    "hardswish": "hard_swish", "hardsigmoid": "hard_sigmoid", "add": "elementwise_add", "add_n": "sum",
    "grid_sample": "grid_sampler", "nonzero": "where_index"}
# operators every program has, which paddle2onnx handles outside its converter table
_STRUCTURAL = {"pd_op.data", "pd_op.fetch", "builtin.parameter", "builtin.shadow_output"}


def require(what):
    """The ONNX packages, or one line naming the requirements file."""
    require_packages(what, ("onnx", "onnxruntime", "paddle2onnx"), REQUIREMENTS)


def versions():
    # optional: requirements-onnx.txt only
    import onnx
    import onnxruntime
    import paddle2onnx
    return {"paddle2onnx": paddle2onnx.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def convert(prefix, onnx_path, opset=OPSET):
    """`prefix`.json + .pdiparams (a saved program) -> `onnx_path`, in a child process; a program
    paddle2onnx cannot convert is a ConfigError naming the operator."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]),
               POLYGRAPHY_AUTOINSTALL_DEPS="0", GLOG_minloglevel="2")
    cmd = [sys.executable, "-m", "deploy.onnx", prefix, onnx_path, str(opset)]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"paddle2onnx did not convert program '{os.path.basename(prefix)}' within "
                          f"{_TIMEOUT_S} s") from None
    if r.returncode == 0 and os.path.isfile(onnx_path):
        return
    found = re.findall(r"^zoo-onnx: (.*)$", r.stdout, re.M)
    program = f"cannot export program '{os.path.basename(prefix)}' to ONNX"
    if found:
        raise ConfigError(f"{program}: {found[-1]}")
    how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit code {r.returncode}"
    op, layer, error = _locate_abort(prefix, opset)
    where = f" converting {op} (in {layer})" if op else ""
    raise ConfigError(f"{program}: paddle2onnx {_p2o_version()} aborted ({how}){where}: {error or 'no message'}")


class Program:
    """One program on ONNX Runtime: `program(feeds)` with numpy feeds by input name -> {output: numpy},
    the interface of deploy.predictor.Program (paddle.Tensor feeds -> tensors, through numpy:
    ONNX Runtime runs on the CPU)."""

    def __init__(self, export_dir, name, spec, threads=None):
        import onnxruntime as ort  # optional: requirements-onnx.txt only
        self.name, self.where = name, os.path.join(export_dir, name + ".onnx")
        self.inputs, self.outputs = spec["inputs"], list(spec["outputs"])
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = int(threads), 1
        try:
            self.session = ort.InferenceSession(self.where, options, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise ConfigError(f"{self.where}: not a model ONNX Runtime can load ({_summary(e)})") from None
        names = [i.name for i in self.session.get_inputs()]
        missing = set(s["name"] for s in self.inputs) - set(names)
        if missing or len(self.session.get_outputs()) != len(self.outputs):
            raise ConfigError(f"{self.where}: inputs {names} and {len(self.session.get_outputs())} outputs, "
                              f"but infer_cfg.yml lists inputs {[s['name'] for s in self.inputs]} and outputs "
                              f"{self.outputs} (files from different exports?)")
        self.fed = set(names)            # an input the program ignores is pruned from the graph

    def __call__(self, feeds):
        values, shapes = checked_feeds(self.inputs, feeds, self.where)
        try:
            outputs = self.session.run(None, {spec["name"]: v for spec, v in values if spec["name"] in self.fed})
        except Exception as e:
            raise ConfigError(f"the exported program {self.where} cannot take inputs {', '.join(shapes)}: "
                              f"{_summary(e)}") from None
        if any(isinstance(feeds.get(s["name"]), paddle.Tensor) for s in self.inputs):   # as predictor.Program
            return {k: paddle.to_tensor(v) for k, v in zip(self.outputs, outputs)}
        return dict(zip(self.outputs, outputs))


def _summary(error):
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(error).__name__


# ---------------------------------------------------------------------------------- the child process
_LOADED = []


def _ops(prefix):
    layer = paddle.jit.load(prefix)
    _LOADED.append(layer)            # the program's operations live as long as the layer
    return list(layer.program().global_block().ops)


def _layer(op):
    try:
        return op.attrs().get("struct_name") or ""
    except Exception:
        return ""


def _unsupported(ops):
    import paddle2onnx.paddle2onnx_cpp2py_export as p2o  # optional: requirements-onnx.txt only
    known = set(p2o.get_all_supported_operators_pir())
    out = []
    for op in ops:
        name = op.name()
        if name in _STRUCTURAL:
            continue
        short = name.split(".", 1)[1] if name.startswith("pd_op.") else name.replace(".", "_", 1)
        if _LEGACY_NAMES.get(short, short) not in known and (name, _layer(op)) not in out:
            out.append((name, _layer(op)))
    return out


def _export(prefix, opset, verbose):
    """paddle2onnx's converter, without its own graph optimization: that prunes the tensors a dropped
    operand was computed into (RoIAlign's boxes_num), which the repairs below must reach. ONNX
    Runtime optimizes the graph when it loads it."""
    import paddle2onnx.paddle2onnx_cpp2py_export as p2o  # optional: requirements-onnx.txt only
    return p2o.export(prefix + ".json", prefix + ".pdiparams", opset, False, verbose, True, True, False, {},
                      "onnxruntime", "", "", False)


def _main(prefix, onnx_path, opset):
    import onnx  # optional: requirements-onnx.txt only
    ops = _ops(prefix)
    bad = _unsupported(ops)
    if bad:
        names = ", ".join(f"{n} (in {layer.strip('/') or 'the program'})" for n, layer in bad)
        print(f"zoo-onnx: paddle2onnx {_p2o_version()} has no ONNX converter for {names}", flush=True)
        return 3
    if os.environ.get("ZOO_ONNX_VERBOSE") == "1":    # the second attempt, whose log names the failing op
        for i, op in enumerate(op for op in ops if op.name() not in _STRUCTURAL):   # in paddle2onnx's order
            print(f"zoo-onnx-op: {i} {op.name()} {_layer(op).strip('/')}", flush=True)
        _export(prefix, opset, True)
        return 4
    try:
        data = _export(prefix, opset, False)
    except Exception as e:
        print(f"zoo-onnx: paddle2onnx {_p2o_version()} failed: {_summary(e)}", flush=True)
        return 3
    model = onnx.load_from_string(data)
    try:
        _restore_sequence_lengths(ops, model)
        _restore_roi_batch_indices(ops, model)
    except ValueError as e:
        print(f"zoo-onnx: {e}", flush=True)
        return 3
    model = _tidy(model)
    data = model.SerializeToString()
    onnx.checker.check_model(model)
    tmp = onnx_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, onnx_path)
    return 0


def _onnx_name(value, ops):
    """The ONNX tensor paddle2onnx made of a PIR value: p2o.<op name>.<occurrence of that op name>.<result>."""
    op = value.get_defining_op()
    same = [o.id() for o in ops if o.name() == op.name()]
    result = next(j for j, r in enumerate(op.results()) if r.is_same(value))
    return f"p2o.{op.name()}.{same.index(op.id())}.{result}"


def _restore_roi_batch_indices(ops, model):
    """paddle2onnx 2.1.0 converts pd_op.roi_align to ONNX RoiAlign with every box in image 0 (its
    batch_indices a zero Expand, boxes_num ignored) and without the `aligned` attribute (opset 16's
    default coordinate mode is half_pixel, which is aligned=True). Each RoiAlign gets the image of
    each box from boxes_num [B] (box r is in image #{b: r >= cumsum(boxes_num)[b]}) and, where
    aligned is false, output_half_pixel."""
    from onnx import TensorProto, helper  # optional: requirements-onnx.txt only
    aligns = [op for op in ops if op.name() == "pd_op.roi_align"]
    nodes = [n for n in model.graph.node if n.op_type == "RoiAlign"]
    if not aligns:
        return False
    if len(aligns) != len(nodes):
        raise ValueError(f"{len(aligns)} pd_op.roi_align in the program but {len(nodes)} ONNX RoiAlign nodes")
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    one = "zoo.roi.one"
    model.graph.initializer.extend([helper.make_tensor(one, TensorProto.INT64, [1], [1]),
                                    helper.make_tensor("zoo.roi.zero", TensorProto.INT64, [], [0]),
                                    helper.make_tensor("zoo.roi.step", TensorProto.INT64, [], [1]),
                                    helper.make_tensor("zoo.roi.axis0", TensorProto.INT64, [], [0])])
    for i, (op, node) in enumerate(zip(aligns, nodes)):
        if not op.attrs().get("aligned", True):
            node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "output_half_pixel"))
        boxes_num = op.operands_source()[2]
        if not boxes_num.initialized():
            continue                                   # one image: index 0 is right
        counts = _onnx_name(boxes_num, ops)
        if counts not in produced:
            raise ValueError(f"the boxes_num of pd_op.roi_align (in {_layer(op).strip('/')}) is not in the "
                             f"converted graph ({counts}); its boxes cannot be given their images")
        t = lambda name: f"zoo.roi.{i}.{name}"  # noqa: E731
        new = [helper.make_node("Cast", [counts], [t("counts")], to=TensorProto.INT64),
               helper.make_node("CumSum", [t("counts"), "zoo.roi.axis0"], [t("ends")]),
               helper.make_node("Shape", [node.input[1]], [t("shape")], start=0, end=1),
               helper.make_node("Squeeze", [t("shape")], [t("n")]),
               helper.make_node("Range", ["zoo.roi.zero", t("n"), "zoo.roi.step"], [t("rows")]),
               helper.make_node("Unsqueeze", [t("rows"), one], [t("rows2")]),
               helper.make_node("Unsqueeze", [t("ends"), "zoo.roi.zero1"], [t("ends2")]),
               helper.make_node("GreaterOrEqual", [t("rows2"), t("ends2")], [t("past")]),
               helper.make_node("Cast", [t("past")], [t("past64")], to=TensorProto.INT64),
               helper.make_node("ReduceSum", [t("past64"), one], [t("image")], keepdims=0)]
        at = list(model.graph.node).index(node)
        for n in reversed(new):
            model.graph.node.insert(at, n)
        node.input[2] = t("image")
    model.graph.initializer.append(helper.make_tensor("zoo.roi.zero1", TensorProto.INT64, [1], [0]))
    return True


_LENGTH_PATH = {"pd_op.cast", "pd_op.reshape", "pd_op.squeeze", "pd_op.flatten"}


def _restore_sequence_lengths(ops, model):
    """paddle2onnx 2.1.0 converts pd_op.rnn to ONNX LSTM/GRU/RNN without its sequence_length (input 4,
    sequence_lens, left empty), so a padded batch runs every direction over the padding. Each rnn's
    lengths are traced back to the program input they come from (through casts and reshapes) and
    fed to its node as int32 [B]; the k-th rnn is the k-th recurrent node. Returns whether it patched."""
    from onnx import TensorProto, helper  # optional: requirements-onnx.txt only
    rnns = [op for op in ops if op.name() == "pd_op.rnn"]
    nodes = [n for n in model.graph.node if n.op_type in ("LSTM", "GRU", "RNN")]
    if not rnns:
        return False
    if len(rnns) != len(nodes):
        raise ValueError(f"{len(rnns)} pd_op.rnn in the program but {len(nodes)} recurrent ONNX nodes")
    patched = False
    for i, (op, node) in enumerate(zip(rnns, nodes)):
        value = op.operands_source()[3]
        if not value.initialized():
            continue                             # no lengths: every sequence runs the whole time axis
        source = value.get_defining_op()
        while source.name() in _LENGTH_PATH:
            source = source.operands_source()[0].get_defining_op()
        if source.name() != "pd_op.data":
            raise ValueError(f"the sequence lengths of pd_op.rnn (in {_layer(op).strip('/')}) are computed in "
                             f"the program; paddle2onnx drops them and they cannot be traced to an input")
        name = source.attrs()["name"]
        flat, lens = f"zoo.seq_lens.{i}.flat", f"zoo.seq_lens.{i}"
        shape = f"zoo.seq_lens.{i}.shape"
        model.graph.initializer.append(helper.make_tensor(shape, TensorProto.INT64, [1], [-1]))
        at = list(model.graph.node).index(node)
        model.graph.node.insert(at, helper.make_node("Cast", [flat], [lens], to=TensorProto.INT32))
        model.graph.node.insert(at, helper.make_node("Reshape", [name, shape], [flat]))
        inputs = list(node.input) + [""] * max(0, 5 - len(node.input))
        inputs[4] = lens
        del node.input[:]
        node.input.extend(inputs)
        patched = True
    return patched


def _tidy(model):
    """After the repairs, what paddle2onnx's own optimization would have done: weights as initializers
    (it writes them as Constant nodes behind Identity chains, which quantizers and viewers skip),
    without the Identity nodes and the dead ends."""
    import onnxoptimizer  # optional: requirements-onnx.txt only
    return onnxoptimizer.optimize(model, ["extract_constant_to_initializer", "eliminate_identity",
                                          "eliminate_deadend", "eliminate_unused_initializer",
                                          "eliminate_duplicate_initializer"])


def _p2o_version():
    import paddle2onnx  # optional: requirements-onnx.txt only
    return paddle2onnx.__version__


def _locate_abort(prefix, opset):
    """Run the conversion again with paddle2onnx's verbose log; the operator it started and never
    finished is the one whose converter aborted."""
    env = dict(os.environ, ZOO_ONNX_VERBOSE="1")
    cmd = [sys.executable, "-m", "deploy.onnx", prefix, os.devnull, str(opset)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S)
    log = r.stdout + r.stderr
    started = re.findall(r"Start export (\S+), op_id: (\d+)", log)
    finished = set(re.findall(r"Finish export (\S+), op_id: (\d+)", log))
    errors = [ln.split("]")[-1].strip() for ln in log.splitlines() if "[ERROR]" in ln]
    pending = [s for s in started if s not in finished]
    if not pending:
        return None, None, errors[-1] if errors else ""
    name, k = pending[-1][0], started.index(pending[-1])
    layers = dict(re.findall(r"^zoo-onnx-op: (\d+ \S+) (.*)$", log, re.M))
    return name, layers.get(f"{k} {name}") or "the model's top level", errors[-1] if errors else ""


if __name__ == "__main__":
    src, dst, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.exit(_main(src, dst, version))
