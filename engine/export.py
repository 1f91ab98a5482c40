"""Export a model's eval forward as a static program for Paddle Inference, beside an infer_cfg.yml.

A model opts in with `export_spec(example=None)`: {"inputs": {batch key: paddle.static.InputSpec},
"outputs": [prediction keys]}. Dimensions that may vary (batch, frames, image size, length) are None
in the specs, so one export serves other batch and input sizes. `example` is a batch of the split
inference reads (test, else val), when its data is at hand: a model whose input layout depends on
the reader (several views per video or not) takes it from there. The program takes the batch as a dict of
those inputs and returns the outputs in that order; `infer_cfg.yml` records everything the
predictor needs besides the program: the model's name, the inputs and outputs, and the recipe's
reader (transforms: sizes, mean/std), `infer` writer and class names, so `tools/infer.py --backend
inference` pre- and post-processes exactly as the dynamic path does.

A model whose inference is more than one network call (windows and scales of a segmenter, the
NMS between a detector's box and mask heads) exports its networks and keeps the Python between
them: `export_spec` adds "pipeline" (plain settings, recorded in infer_cfg.yml) and, for more than
one network, "programs" ({name: {"inputs", "outputs"}} beside the main program "model"). Such a
model has `run_program(name, inputs) -> {output: tensor}` (the traced networks) and a static
`run_exported(run, batch, settings)`, the Python around them; its eval forward is
`run_exported(self.run_program, batch, settings)` and the predictor calls the same function with
`run` running the exported programs, so both paths share every step outside the networks.
"""
import os

import paddle
import yaml

from engine.registry import ConfigError

EXPORT_VERSION = 1
PROGRAM = "model"              # model.json + model.pdiparams
INFER_CFG = "infer_cfg.yml"


class _Exported(paddle.nn.Layer):
    """The traced call: the model's eval forward, or its network `program` (run_program)."""

    def __init__(self, model, outputs, program=None):
        super().__init__()
        self.model, self.outputs, self.program = model, list(outputs), program

    def forward(self, batch):
        preds = self.model(batch) if self.program is None else self.model.run_program(self.program, batch)
        return tuple(preds[k] for k in self.outputs)


def spec_of(model, example=None):
    inner = getattr(model, "_layers", model)
    name = type(inner).__name__
    if not hasattr(inner, "export_spec"):
        raise ConfigError(f"model {name} cannot be exported (it has no export_spec)")
    spec = inner.export_spec(example)
    if not spec.get("inputs") or not spec.get("outputs"):
        raise ConfigError(f"{name}.export_spec() must name inputs and outputs")
    extra = spec.get("programs") or {}
    if PROGRAM in extra or any(not p.get("inputs") or not p.get("outputs") for p in extra.values()):
        raise ConfigError(f"{name}.export_spec(): every program needs inputs and outputs, and "
                          f"'{PROGRAM}' is the main one")
    if (extra or "pipeline" in spec) and not all(hasattr(inner, f) for f in ("run_program", "run_exported")):
        raise ConfigError(f"{name}.export_spec() declares a pipeline, so {name} needs run_program and run_exported")
    return spec


def programs_of(spec):
    """{program name: {"inputs", "outputs"}}, the main program first."""
    return {PROGRAM: spec, **(spec.get("programs") or {})}


def _record_inputs(inputs):
    return [{"name": n, "shape": [-1 if d is None else int(d) for d in s.shape],
             "dtype": str(s.dtype).replace("paddle.", "")} for n, s in inputs.items()]


def export(model, cfg, output_dir, label_names=None, example=None):
    """Write `output_dir/model.json`, `model.pdiparams` (and one pair per further program) and
    `infer_cfg.yml`; returns the spec."""
    spec = spec_of(model, example)
    model.eval()
    inner = getattr(model, "_layers", model)
    pipeline = "pipeline" in spec
    os.makedirs(output_dir, exist_ok=True)
    recorded = {}
    for name, prog in programs_of(spec).items():
        inputs = {n: paddle.static.InputSpec(s.shape, s.dtype, n) for n, s in prog["inputs"].items()}
        layer = _Exported(inner, prog["outputs"], name if pipeline else None)
        static = paddle.jit.to_static(layer, input_spec=[inputs], full_graph=True)
        paddle.jit.save(static, os.path.join(output_dir, name))
        recorded[name] = {"inputs": _record_inputs(inputs), "outputs": list(prog["outputs"])}
    reader = cfg.get("reader", {})
    record = {
        "zoo_export_version": EXPORT_VERSION,
        "paddle": paddle.__version__,
        "model": cfg["model"]["name"],
        **recorded.pop(PROGRAM),
        "config": {"model": cfg["model"], "reader": {k: reader[k] for k in ("test", "val") if k in reader},
                   "infer": cfg.get("infer"), "runtime": cfg.get("runtime", {})},
        "label_names": label_names,
    }
    if recorded:
        record["programs"] = recorded
    if pipeline:
        record["pipeline"] = spec["pipeline"]
    with open(os.path.join(output_dir, INFER_CFG + ".tmp"), "w") as f:
        yaml.safe_dump(record, f, sort_keys=False)
    os.replace(os.path.join(output_dir, INFER_CFG + ".tmp"), os.path.join(output_dir, INFER_CFG))
    return spec


def read_infer_cfg(export_dir):
    path = os.path.join(export_dir, INFER_CFG)
    if not os.path.isdir(export_dir):
        raise ConfigError(f"export directory not found: {export_dir}")
    if not os.path.isfile(path):
        raise ConfigError(f"{export_dir}: no {INFER_CFG} (not a directory written by tools/export.py)")
    with open(path, encoding="utf-8") as f:
        record = yaml.safe_load(f) or {}
    version = record.get("zoo_export_version")
    if version != EXPORT_VERSION:
        raise ConfigError(f"{path}: export format version {version!r}, this code reads version "
                          f"{EXPORT_VERSION}; export the model again with tools/export.py")
    for program in [PROGRAM, *(record.get("programs") or {})]:
        for name in (program + ".json", program + ".pdiparams"):
            if not os.path.isfile(os.path.join(export_dir, name)):
                raise ConfigError(f"{export_dir}: {name} is missing (an incomplete export)")
    return record
