"""Export a model's eval forward as a static program for Paddle Inference (or, `fmt="onnx"`, converted
to ONNX for ONNX Runtime: deploy/onnx.py), beside an infer_cfg.yml.

A model opts in by overriding `engine.model.ZooModel.export_spec(example=None)`: {"inputs": {batch
key: paddle.static.InputSpec}, "outputs": [prediction keys]}. Dimensions that may vary (batch,
frames, image size, length) are None in the specs, so one export serves other batch and input sizes.
`example` is a batch of the split inference reads (test, else val), when its data is at hand: a
model whose input layout depends on the reader (several views per video or not) takes it from there.
The program takes the batch as a dict of those inputs and returns the outputs in that order;
`infer_cfg.yml` records everything the predictor needs besides the program: the model's name, the
inputs and outputs, and the recipe's reader (transforms: sizes, mean/std), `infer` writer and class
names, so `tools/infer.py --backend inference` pre- and post-processes exactly as the dynamic path does.

Optional keys of the spec:
- `max_shape`: {input: ([max per dim, None for any], why)}: the largest input the program can take
  (a position table); the predictor rejects a larger one with one line naming `why`.
- `tensorrt`: {"min_subgraph_size": n, "shapes": {program: {input: {min?, opt?, max?}}}}: what
  `--trt` should record unless the user says otherwise (deploy/tensorrt.py).
- `programs`: {name: {"method": a bound method of the model, "inputs": {...}, "outputs": [...]}}:
  several programs instead of one (`name.json` + `name.pdiparams` each), for a model whose
  prediction is a Python loop over networks (beam search over an encoder and one decoder step).
  Each method takes a dict of its inputs and returns a dict holding its outputs; infer_cfg.yml
  records its name. The predictor then calls the model class's `exported_runner(programs,
  settings)`, which returns `run(batch) -> predictions`; `programs[name](feeds)` runs one program
  on numpy feeds. The top-level `inputs` and `outputs` stay
  what the whole predictor takes and gives. `settings` (plain data, e.g. beam size) is recorded for
  the runner. One program with a `method` is driven by the runner too: a segmenter's windows,
  scales and arg-max around its one network. A model whose eval forward is
  `run_exported(run, batch, settings)` over calls `run(name, inputs)` of its programs' methods
  declares that static method (engine/model.py): the default `exported_runner` runs the same Python
  around the exported programs, so both paths share every step outside the networks.

The files and infer_cfg.yml are deploy/record.py's format; the recipe's `custom_imports` are
recorded with it, so a model registered outside the tree runs exported as it does dynamic.
"""
import inspect
import os
import shutil
import tempfile
import warnings

import paddle

from deploy import onnx, tensorrt
from deploy.record import EXPORT_VERSION, FORMATS, INFER_CFG, OPSET, PRECISIONS, PROGRAM, write_infer_cfg
from engine.errors import ConfigError
from engine.model import unwrap

class _Exported(paddle.nn.Layer):
    def __init__(self, model, outputs, method=None):
        super().__init__()
        self.model, self.outputs, self.method = model, list(outputs), method

    def forward(self, batch):
        preds = self.model(batch) if self.method is None else self.method(batch)
        return tuple(preds[k] for k in self.outputs)


def spec_of(model, example=None):
    inner = unwrap(model)
    spec = inner.export_spec(example)
    if not spec.get("inputs") or not spec.get("outputs"):
        raise ConfigError(f"{type(inner).__name__}.export_spec() must name inputs and outputs")
    for name, prog in (spec.get("programs") or {}).items():
        method = prog.get("method")
        if not (inspect.ismethod(method) and method.__self__ is inner) or not prog.get("inputs") \
                or not prog.get("outputs"):
            raise ConfigError(f"{type(inner).__name__}.export_spec(): program '{name}' needs a method of the "
                              f"model (got {prog.get('method')!r}), inputs and outputs")
    return spec


def _describe(inputs, max_shape=None):
    out = []
    for name, s in inputs.items():
        row = {"name": name, "shape": [-1 if d is None else int(d) for d in s.shape],
               "dtype": str(s.dtype).replace("paddle.", "")}
        if max_shape and name in max_shape:
            dims, why = max_shape[name]
            row.update(max_shape=[-1 if d is None else int(d) for d in dims], max_shape_why=str(why))
        out.append(row)
    return out


def _named(inputs):
    return {name: paddle.static.InputSpec(s.shape, s.dtype, name) for name, s in inputs.items()}


def export(model, cfg, output_dir, label_names=None, example=None, fmt="paddle", precision="fp32", trt=None):
    """Write `output_dir/model.json`, `model.pdiparams` (or one pair per program; with fmt "onnx"
    `model.onnx`, converted from them by paddle2onnx) and `infer_cfg.yml`; returns the spec.
    `trt` (a dict, maybe empty: deploy/tensorrt.section's settings, and `shapes_file`, a
    --trt-shapes file) records the `tensorrt` section."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format '{fmt}': one of {', '.join(FORMATS)}")
    if trt is not None and fmt != "paddle":
        raise ConfigError(f"--trt with --format {fmt}: TensorRT runs a --format paddle export (Paddle Inference)")
    if precision not in PRECISIONS[fmt] or precision == "int8":
        raise ConfigError(f"--precision {precision} with --format {fmt}: "
                          + ("INT8 is tools/quantize.py's" if precision == "int8" else
                             "bf16 is Paddle Inference's (--format paddle); ONNX Runtime's CPU kernels have no bf16"
                             if precision == "bf16" else f"one of {', '.join(PRECISIONS[fmt])}"))
    if fmt == "onnx":
        onnx.require("--format onnx")
    spec = spec_of(model, example)
    model.eval()
    inner = unwrap(model)
    programs = spec.get("programs") or {PROGRAM: {"method": None, "inputs": spec["inputs"],
                                                  "outputs": spec["outputs"]}}
    os.makedirs(output_dir, exist_ok=True)
    saved = output_dir if fmt == "paddle" else tempfile.mkdtemp(prefix=".programs-", dir=output_dir)
    recorded = {}
    try:
        for name, prog in programs.items():
            inputs = _named(prog["inputs"])
            static = paddle.jit.to_static(_Exported(inner, prog["outputs"], prog.get("method")),
                                          input_spec=[inputs], full_graph=True)
            with warnings.catch_warnings():
                # paddle.nn.LSTM asks a traced tensor for its place: paddle's own noise, nothing of the user's
                warnings.filterwarnings("ignore", message="Tensor do not have 'place' interface", category=UserWarning)
                paddle.jit.save(static, os.path.join(saved, name))
            if fmt == "onnx":
                onnx.convert(os.path.join(saved, name), os.path.join(output_dir, name + ".onnx"))
            method = prog.get("method") and prog["method"].__name__
            recorded[name] = {"method": method, "inputs": _describe(inputs), "outputs": list(prog["outputs"])}
    finally:
        if saved != output_dir:
            shutil.rmtree(saved, ignore_errors=True)
    reader = cfg.get("reader", {})
    record = {
        "zoo_export_version": EXPORT_VERSION,
        "format": fmt,
        "precision": precision,
        # --backend openvino reads the .onnx programs (deploy/openvino.py: why not the Paddle ones)
        **({"onnx": {"opset": OPSET, **onnx.versions()}, "openvino": {"route": "onnx"}} if fmt == "onnx" else {}),
        "paddle": paddle.__version__,
        "model": cfg["model"]["name"],
        "inputs": _describe(_named(spec["inputs"]), spec.get("max_shape")),
        "outputs": list(spec["outputs"]),
        "programs": recorded,
        "settings": spec.get("settings"),
        "config": {"model": cfg["model"], "reader": {k: reader[k] for k in ("test", "val") if k in reader},
                   "infer": cfg.get("infer"), "metric": cfg.get("metric"), "runtime": cfg.get("runtime", {}),
                   **({"custom_imports": cfg["custom_imports"]} if cfg.get("custom_imports") else {})},
        "label_names": label_names,
    }
    if trt is not None:
        trt = dict(trt)
        shapes_file = trt.pop("shapes_file", None)
        overrides = tensorrt.read_overrides(shapes_file, recorded) if shapes_file else None
        record["tensorrt"], guessed = tensorrt.section(recorded, record["inputs"], example, overrides,
                                                       spec.get("tensorrt"), **trt)
        tensorrt.check(os.path.join(output_dir, INFER_CFG), record, recorded)
        if guessed:
            print(f"note: TensorRT shape ranges of {', '.join(guessed)} are guesses (1 per varying size, at most "
                  f"{tensorrt.DEFAULT_MAX_LENGTH}); check the tensorrt section of {INFER_CFG} or give --trt-shapes")
    write_infer_cfg(output_dir, record)
    return spec


