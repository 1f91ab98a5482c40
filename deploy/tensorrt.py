"""TensorRT for a Paddle Inference export on a GPU: what `tools/export.py --trt` records, and what the
predictor asks of paddle.inference.Config with it.

The `tensorrt` section of infer_cfg.yml (deploy/record.py checks it):
  precision          fp32 | fp16: TensorRT's precision_mode (INT8 calibration is not offered here)
  min_subgraph_size  the fewest operators a TensorRT engine takes (PaddleDetection: 3; R-CNNs 40)
  workspace_size     bytes of TensorRT's workspace
  max_batch_size     the largest batch (also the max of every batch dimension below)
  use_static         serialize the built engines to <export>/trt_cache and reuse them (the folder must
                     be writable; an engine is built for one GPU and TensorRT version)
  shapes             {program: {input: {min, opt, max}}}: TensorRT's dynamic shape ranges
                     (Config.set_trt_dynamic_shape_info(min_input_shape, max_input_shape, opt_input_shape))

The shapes are derived from each input's spec (its None dimensions). Of an input of the whole
predictor: the batch dimension (first) 1 / the example batch's / max_batch_size; the height and width
of an image (rank 4) the --trt-min-shape / --trt-opt-shape (else the example's) / --trt-max-shape
sides, PaddleDetection's names; any other varying dimension (a length) 1 / the example's / the
model's max_shape (else DEFAULT_MAX_LENGTH). An input between programs (the Transformer's cache, Mask
R-CNN's features and proposals) gets 1 / 1 / DEFAULT_MAX_LENGTH per varying dimension, a guess:
export names those inputs in one note, and `--trt-shapes FILE`
(YAML or JSON, the `shapes` layout; the program level may be left out for a one-program export)
replaces any of min/opt/max. A model may suggest `tensorrt` settings in its export_spec (Mask R-CNN:
min_subgraph_size 40, as PaddleDetection's TRT_MIN_SUBGRAPH for RCNN).

Nothing here has run with TensorRT: this machine has no GPU and its paddle no TensorRT. The tests
check the recorded section and the exact Config calls; that TensorRT builds engines within these
ranges (and for which operators) only a GPU with paddlepaddle-gpu built with TensorRT can confirm.
"""
import os

import yaml

from engine.errors import ConfigError

TRT_CACHE = "trt_cache"
PRECISIONS = ("fp32", "fp16")
DEFAULTS = {"precision": "fp32", "min_subgraph_size": 3, "workspace_size": 1 << 30, "max_batch_size": 32,
            "use_static": False}
IMAGE_SIDES = (32, 640, 1344)    # min, opt (without an example), max: 1344 holds a 1333-pixel side, padded to 32
DEFAULT_MAX_LENGTH = 512


def derive_shapes(programs, inputs, example=None, max_batch_size=32, image_sides=IMAGE_SIDES):
    """({program: {input: {min, opt, max}}}, [program.input given only defaults]) from the recorded
    `programs` ({name: {"inputs": [{name, shape, dtype}]}}), the top-level `inputs` (with max_shape)
    and the `example` batch."""
    top = {s["name"]: s for s in inputs}
    shapes, guessed = {}, []
    for program, spec in programs.items():
        shapes[program] = {}
        for s in spec["inputs"]:
            name, dims = s["name"], s["shape"]
            seen = _shape_of(example.get(name)) if example and name in example else None
            if seen is not None and len(seen) != len(dims):
                seen = None
            most = (top.get(name) or {}).get("max_shape") or [-1] * len(dims)
            image = name in top and len(dims) == 4 and dims[2] == -1 and dims[3] == -1 and "float" in s["dtype"]
            lo, opt, hi = [], [], []
            for i, d in enumerate(dims):
                if d != -1:
                    lo.append(d), opt.append(d), hi.append(d)
                    continue
                if i == 0 and name in top:
                    a, c = 1, max_batch_size
                elif image and i in (2, 3):
                    a, c = image_sides[0], image_sides[2]
                else:
                    a, c = 1, most[i] if most[i] != -1 else DEFAULT_MAX_LENGTH
                b = seen[i] if seen is not None else (image_sides[1] if image and i in (2, 3) else a)
                b = max(b, a)
                lo.append(a), opt.append(b), hi.append(max(c, b))
            if name not in top and -1 in dims:
                guessed.append(f"{program}.{name}")
            shapes[program][name] = {"min": lo, "opt": opt, "max": hi}
    return shapes, guessed


def _shape_of(value):
    shape = getattr(value, "shape", None)
    return None if shape is None else [int(d) for d in shape]


def read_overrides(path, programs):
    """{program: {input: {min?, opt?, max?}}} of a --trt-shapes file; a one-program export may leave
    out the program level."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)     # JSON is YAML
    except OSError as e:
        raise ConfigError(f"--trt-shapes {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--trt-shapes {path}: not YAML or JSON ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--trt-shapes {path}: a mapping {{program: {{input: {{min, opt, max}}}}}} is expected")
    if len(programs) == 1 and not set(data) & set(programs):
        data = {next(iter(programs)): data}
    for program, entries in data.items():
        if program not in programs:
            raise ConfigError(f"--trt-shapes {path}: no program '{program}' in this export (programs: "
                              f"{', '.join(programs)})")
        names = [s["name"] for s in programs[program]["inputs"]]
        for name, ranges in (entries or {}).items():
            if name not in names:
                raise ConfigError(f"--trt-shapes {path}: program {program} has no input '{name}' (inputs: "
                                  f"{', '.join(names)})")
            if not isinstance(ranges, dict) or set(ranges) - {"min", "opt", "max"}:
                raise ConfigError(f"--trt-shapes {path}: {program}.{name}: a mapping of min, opt, max is expected")
    return data


def section(programs, inputs, example=None, overrides=None, suggested=None, **settings):
    """The `tensorrt` section and the inputs given only defaults. `settings`: the DEFAULTS keys (None:
    the model's suggestion, else the default) and image_sides."""
    suggested = suggested or {}
    out = {k: settings.get(k) if settings.get(k) is not None else suggested.get(k, v) for k, v in DEFAULTS.items()}
    shapes, guessed = derive_shapes(programs, inputs, example, out["max_batch_size"],
                                    settings.get("image_sides") or IMAGE_SIDES)
    for source in (suggested.get("shapes") or {}, overrides or {}):
        for program, entries in source.items():
            for name, ranges in (entries or {}).items():
                shapes[program][name].update({k: list(v) for k, v in ranges.items()})
                if source is overrides and f"{program}.{name}" in guessed:
                    guessed.remove(f"{program}.{name}")
    out["shapes"] = shapes
    return out, guessed


def configure(config, trt, program, precision_mode, export_dir):
    """Ask `config` (a GPU paddle.inference.Config) for TensorRT over `program` as the section `trt` says."""
    config.enable_tensorrt_engine(workspace_size=trt["workspace_size"], max_batch_size=trt["max_batch_size"],
                                  min_subgraph_size=trt["min_subgraph_size"], precision_mode=precision_mode,
                                  use_static=trt["use_static"], use_calib_mode=False)
    ranges = trt["shapes"][program]
    config.set_trt_dynamic_shape_info(*({n: r[k] for n, r in ranges.items()} for k in ("min", "max", "opt")))
    if trt["use_static"]:
        config.set_optim_cache_dir(os.path.join(export_dir, TRT_CACHE))


def check(path, record, programs):
    """One line naming `path` and the key where the record's `tensorrt` section is not what this code reads."""
    trt = record["tensorrt"]
    where = f"{path}: tensorrt"
    if not isinstance(trt, dict):
        raise ConfigError(f"{where}: a mapping is expected, got {trt!r}")
    if record.get("format", "paddle") != "paddle":
        raise ConfigError(f"{where}: TensorRT runs a --format paddle export (Paddle Inference), this is "
                          f"--format {record['format']}")
    missing = [k for k in (*DEFAULTS, "shapes") if k not in trt]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}; export the model again with tools/export.py --trt")
    if trt["precision"] not in PRECISIONS:
        raise ConfigError(f"{where}.precision: {trt['precision']!r}, one of {', '.join(PRECISIONS)}"
                          + (" (INT8 TensorRT calibration is not offered here)" if trt["precision"] == "int8" else ""))
    for key, least in (("min_subgraph_size", 1), ("workspace_size", 1), ("max_batch_size", 1)):
        if not _is_int(trt[key]) or trt[key] < least:
            raise ConfigError(f"{where}.{key}: {trt[key]!r}, an integer >= {least} is expected")
    if not isinstance(trt["use_static"], bool):
        raise ConfigError(f"{where}.use_static: {trt['use_static']!r}, true or false")
    shapes = trt["shapes"]
    if not isinstance(shapes, dict) or set(shapes) != set(programs):
        raise ConfigError(f"{where}.shapes: one entry per program ({', '.join(programs)}) is expected, got "
                          f"{', '.join(shapes) if isinstance(shapes, dict) else repr(shapes)}")
    for program, spec in programs.items():
        entries = shapes[program] if isinstance(shapes[program], dict) else {}
        for s in spec["inputs"]:
            key = f"{where}.shapes.{program}.{s['name']}"
            ranges = entries.get(s["name"])
            if not isinstance(ranges, dict) or set(ranges) != {"min", "opt", "max"}:
                raise ConfigError(f"{key}: min, opt and max are expected, got {ranges!r}")
            for k in ("min", "opt", "max"):
                v = ranges[k]
                if not isinstance(v, list) or len(v) != len(s["shape"]) or not all(_is_int(d) and d >= 0 for d in v):
                    raise ConfigError(f"{key}.{k}: {v!r}, {len(s['shape'])} sizes >= 0 (the input's rank) are expected")
                if any(w != -1 and w != d for w, d in zip(s["shape"], v)):
                    raise ConfigError(f"{key}.{k}: {v}, but the input's fixed sizes are "
                                      f"{['?' if w == -1 else w for w in s['shape']]}")
            if not all(a <= b <= c for a, b, c in zip(ranges["min"], ranges["opt"], ranges["max"])):
                raise ConfigError(f"{key}: min {ranges['min']} <= opt {ranges['opt']} <= max {ranges['max']} "
                                  f"is expected per dimension")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)
