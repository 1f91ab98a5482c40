"""What an export directory holds, and what its programs take: the one module that knows the format.

An export (deploy/export.py writes it, deploy/predictor.py and onnx.py run it,
deploy/quantize.py rewrites it as INT8) is a folder of programs (`name.json` + `name.pdiparams`,
`name.onnx`, or OpenVINO's `name.xml` + `name.bin`) beside `infer_cfg.yml`, the record of everything else the predictor needs: the format
and precision, the model's name, its inputs (shapes with -1 where a size may vary, and the largest
it takes) and outputs, its programs and their methods, the settings of its Python between them, and
the recipe's reader, `infer` writer and class names; with `tools/export.py --trt`, the `tensorrt`
section (deploy/tensorrt.py). A program's feeds are checked here against the
recorded inputs, whichever backend runs it.
"""
import os

import numpy as np
import yaml

from deploy import tensorrt
from engine.errors import ConfigError

EXPORT_VERSION = 1
PROGRAM = "model"              # model.json + model.pdiparams
INFER_CFG = "infer_cfg.yml"
# the files of one program, by export format; `format` in infer_cfg.yml (absent: paddle)
FORMATS = {"paddle": (".json", ".pdiparams"), "onnx": (".onnx",), "openvino": (".xml", ".bin")}
# the backends that run each format, the default first (openvino: an INT8 IR of tools/quantize.py --backend openvino)
BACKENDS_OF = {"paddle": ("inference",), "onnx": ("onnxruntime", "openvino"), "openvino": ("openvino",)}
BACKEND_OF = {fmt: backends[0] for fmt, backends in BACKENDS_OF.items()}
# `precision` in infer_cfg.yml (absent: fp32). bf16: the fp32 program, which Paddle Inference runs with
# oneDNN's bf16 kernels (its bf16 placement pass) where the CPU has them; int8: tools/quantize.py
PRECISIONS = {"paddle": ("fp32", "bf16"), "onnx": ("fp32", "int8"), "openvino": ("int8",)}
OPSET = 16            # of an onnx export: RoIAlign's half_pixel mode (Mask R-CNN's aligned RoIAlign) needs 16


def write_infer_cfg(output_dir, record):
    """`output_dir/infer_cfg.yml`, written whole or not at all (a temporary file renamed)."""
    path = os.path.join(output_dir, INFER_CFG)
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(record, f, sort_keys=False)
    os.replace(path + ".tmp", path)


def uses_runner(record):
    """Whether the predictor drives the programs by the model's exported_runner: programs declared
    by the model (each names its method), rather than the eval forward as the one program."""
    programs = programs_of(record)
    return len(programs) > 1 or any(p.get("method") for p in programs.values())


def programs_of(record):
    """{program name: {"inputs", "outputs"}}; records written before `programs` existed hold one."""
    return record.get("programs") or {PROGRAM: {"inputs": record["inputs"], "outputs": record["outputs"]}}


def read_infer_cfg(export_dir):
    """The record of `export_dir`, checked: version, format, opset, precision, tensorrt, and every program's files."""
    path = os.path.join(export_dir, INFER_CFG)
    if not os.path.isdir(export_dir):
        raise ConfigError(f"export directory not found: {export_dir}")
    if not os.path.isfile(path):
        raise ConfigError(f"{export_dir}: no {INFER_CFG} (not a directory written by tools/export.py)")
    try:
        with open(path, encoding="utf-8") as f:
            record = yaml.safe_load(f) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError(f"{where}: not a readable record ({getattr(e, 'problem', None) or e}); "
                          f"export the model again with tools/export.py") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: not a record of tools/export.py (a mapping); export the model again")
    version = record.get("zoo_export_version")
    if version != EXPORT_VERSION:
        raise ConfigError(f"{path}: export format version {version!r}, this code reads version "
                          f"{EXPORT_VERSION}; export the model again with tools/export.py")
    fmt = record.get("format", "paddle")
    if fmt not in FORMATS:
        raise ConfigError(f"{path}: export format {fmt!r}, this code reads {', '.join(FORMATS)}")
    if fmt == "onnx":
        opset = (record.get("onnx") or {}).get("opset")
        if opset != OPSET:
            raise ConfigError(f"{path}: ONNX opset {opset!r}, this code reads opset {OPSET}; export the "
                              f"model again with tools/export.py --format onnx")
    precision = record.get("precision", "fp32")
    if precision not in PRECISIONS[fmt]:
        raise ConfigError(f"{path}: precision {precision!r}, a --format {fmt} export is one of "
                          f"{', '.join(PRECISIONS[fmt])}")
    _check_programs(path, record)
    if "tensorrt" in record:
        tensorrt.check(path, record, programs_of(record))
    for program in programs_of(record):
        for name in (program + ext for ext in FORMATS[fmt]):
            if not os.path.isfile(os.path.join(export_dir, name)):
                raise ConfigError(f"{export_dir}: {name} is missing (an incomplete export)")
    return record


def _check_programs(path, record):
    """Each program's `inputs` and `outputs` as tools/export.py writes them (specs with a name and a
    shape; output names), so a damaged or hand-edited record is one line here rather than a KeyError
    in a backend."""
    programs = record.get("programs")
    if programs is not None and (not isinstance(programs, dict) or not programs):
        raise ConfigError(f"{path}: 'programs' is not a mapping of program names (a damaged record); "
                          f"export the model again with tools/export.py")
    # the top level's (the predictor's and the server's) and each program's
    for name, spec in [(None, record)] + list((programs or {}).items()):
        where = f"{path}: " + (f"programs.{name}." if name else "")
        for key in ("inputs", "outputs"):
            if not isinstance(spec, dict) or not isinstance(spec.get(key), list):
                raise ConfigError(f"{where}{key} is missing or not a list (a damaged record); export the "
                                  f"model again with tools/export.py")
        for i, inp in enumerate(spec["inputs"]):
            if not (isinstance(inp, dict) and isinstance(inp.get("name"), str) and isinstance(inp.get("shape"), list)):
                raise ConfigError(f"{where}inputs[{i}] is not a spec with a name and a shape list (a damaged "
                                  f"record); export the model again with tools/export.py")


def as_numpy(value):
    """A tensor or array-like as numpy (what a program is fed)."""
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def check_shape(spec, value, where):
    """One input `value` against its recorded spec: rank, fixed sizes, and the largest sizes it may take."""
    name, want = spec["name"], spec["shape"]
    if value.ndim != len(want) or any(w != -1 and w != g for w, g in zip(want, value.shape)):
        raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program "
                          f"takes {['?' if w == -1 else w for w in want]} ({where})")
    most = spec.get("max_shape")
    if most and any(m != -1 and g > m for m, g in zip(most, value.shape)):
        raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program takes at most "
                          f"{['?' if m == -1 else m for m in most]} ({spec.get('max_shape_why') or where})")


def checked_feeds(inputs, feeds, where):
    """[(spec, numpy value)] of a program's `inputs` specs from `feeds`, each checked against its
    spec, and "name [shape]" of each for messages: what every backend's program does first."""
    out, shapes = [], []
    for spec in inputs:
        if spec["name"] not in feeds:
            raise ConfigError(f"the exported program {where} needs input '{spec['name']}' "
                              f"(given: {', '.join(sorted(feeds))})")
        value = as_numpy(feeds[spec["name"]])
        check_shape(spec, value, where)
        out.append((spec, np.ascontiguousarray(value.astype(spec["dtype"], copy=False))))
        shapes.append(f"{spec['name']} {list(value.shape)}")
    return out, shapes
