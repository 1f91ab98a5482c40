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
"""
import os

import paddle
import yaml

from engine.registry import ConfigError

EXPORT_VERSION = 1
PROGRAM = "model"              # model.json + model.pdiparams
INFER_CFG = "infer_cfg.yml"


class _Exported(paddle.nn.Layer):
    def __init__(self, model, outputs):
        super().__init__()
        self.model, self.outputs = model, list(outputs)

    def forward(self, batch):
        preds = self.model(batch)
        return tuple(preds[k] for k in self.outputs)


def spec_of(model, example=None):
    inner = getattr(model, "_layers", model)
    if not hasattr(inner, "export_spec"):
        raise ConfigError(f"model {type(inner).__name__} cannot be exported (it has no export_spec)")
    spec = inner.export_spec(example)
    if not spec.get("inputs") or not spec.get("outputs"):
        raise ConfigError(f"{type(inner).__name__}.export_spec() must name inputs and outputs")
    return spec


def export(model, cfg, output_dir, label_names=None, example=None):
    """Write `output_dir/model.json`, `model.pdiparams` and `infer_cfg.yml`; returns the spec."""
    spec = spec_of(model, example)
    model.eval()
    inputs = {name: paddle.static.InputSpec(s.shape, s.dtype, name) for name, s in spec["inputs"].items()}
    static = paddle.jit.to_static(_Exported(model, spec["outputs"]), input_spec=[inputs], full_graph=True)
    os.makedirs(output_dir, exist_ok=True)
    paddle.jit.save(static, os.path.join(output_dir, PROGRAM))
    reader = cfg.get("reader", {})
    record = {
        "zoo_export_version": EXPORT_VERSION,
        "paddle": paddle.__version__,
        "model": cfg["model"]["name"],
        "inputs": [{"name": n, "shape": [-1 if d is None else int(d) for d in s.shape],
                    "dtype": str(s.dtype).replace("paddle.", "")} for n, s in inputs.items()],
        "outputs": list(spec["outputs"]),
        "config": {"model": cfg["model"], "reader": {k: reader[k] for k in ("test", "val") if k in reader},
                   "infer": cfg.get("infer"), "runtime": cfg.get("runtime", {})},
        "label_names": label_names,
    }
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
    for name in ("model.json", "model.pdiparams"):
        if not os.path.isfile(os.path.join(export_dir, name)):
            raise ConfigError(f"{export_dir}: {name} is missing (an incomplete export)")
    return record
