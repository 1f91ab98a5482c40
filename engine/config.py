"""YAML recipes: `_base_` inheritance, dotted overrides, validation against the components' signatures.

A config is plain data (a `Config`, a dict) plus its engine sections read once, typed, at load:
`cfg.train` (with `cfg.train.amp`), `cfg.eval_amp` (eval.amp over train.amp: evaluation and
inference) and `cfg.runtime` are frozen dataclasses generated from the key tables below, with the
defaults filled in (a reader split's DataLoader keys: `split_reader`). Component sections (`model`, `optimizer`, `lr`, `metric`, readers,
transforms, collates, backbones) select a class with `name:`; their other keys are the class's
keyword arguments, so the class signature is the schema: an unknown key or a value of the wrong type
is rejected with the file it came from, the dotted key and a did-you-mean.
"""
import copy
import dataclasses
import inspect
import os
import types
import typing

import yaml

from engine.components import import_custom
from engine.errors import ConfigError, did_you_mean
from engine.registry import (COLLATES, DATASETS, LR_SCHEDULES, METRICS, MODELS, OPTIMIZERS, OUTPUTS, SAMPLERS,
                             TRANSFORMS)

def at_least(n):
    return lambda v: None if v >= n else f"must be >= {n}"


def one_of(*choices):
    return lambda v: None if v in choices else f"must be one of {', '.join(map(str, choices))}"


AUTO = "auto"


class IntOrAuto:
    """The type of a key that takes a count or `auto` (a number the run works out on its machine)."""


IntOrAuto.__name__ = "int or auto"   # how messages and the config reference name it


LOGGERS = ("visualdl", "tensorboard", "wandb")


def loggers(v):
    bad = [x for x in v if x not in LOGGERS]
    return f"unknown logger {bad[0]!r}{did_you_mean(bad[0], LOGGERS)}; known: {', '.join(LOGGERS)}" if bad else None


def op_names(v):
    return None if all(isinstance(x, str) for x in v) else "must be paddle op names (strings)"


# The engine's own sections: key -> (type, default[, rule]); `None` is allowed where the default is
# None; a rule returns why a value is out of range (checked where the config is read).
TRAIN_KEYS = {
    "epochs": (int, None, at_least(1)),       # training length in epochs (train.epochs or train.max_steps, not both)
    "max_steps": (int, None, at_least(1)),    # training length in optimizer steps (iteration-based recipes)
    "log_interval": (int, 10, at_least(1)),   # micro-batches between log lines
    "eval_interval": (int, 1, at_least(0)),   # epochs between evaluations (0: only at the end)
    "eval_steps": (int, 0, at_least(0)),      # optimizer steps between evaluations (0: off)
    "save_interval": (int, 1, at_least(0)),   # epochs between checkpoints (0: off)
    "save_steps": (int, 0, at_least(0)),      # optimizer steps between checkpoints (0: off)
    "keep_last": (int, 3, at_least(0)),       # checkpoints kept besides best/ and final/ (0: all)
    "save_on_each_node": (bool, False),       # every node writes checkpoints too (no shared disk)
    "accum_steps": (int, 1, at_least(1)),     # micro-batches whose gradients add up to one optimizer step
    "clip_grad_norm": (float, None, lambda v: None if v > 0 else "must be > 0"),  # max global gradient L2 norm
    "best_metric": (str, None),               # metrics.json name used for best/ (None: no best/)
    "best_mode": (str, "max", one_of("max", "min")),  # whether a higher or a lower best_metric is better
    "pretrained": (str, None),                # loaded before training: entry name (tools/download.py --list), URL, path
    "weights_format": (str, None),            # layout of `pretrained` (default: detected)
    "amp": (dict, None),                      # mixed precision of training (the AMP_KEYS below)
    "ema": (dict, None),                      # exponential moving average of the weights (the EMA_KEYS below)
    "early_stop": (dict, None),               # stop when best_metric stops improving (the EARLY_STOP_KEYS below)
    "loggers": (list, ["visualdl"], loggers), # where the scalars go: visualdl, tensorboard, wandb (scalars.jsonl always)
    "wandb": (dict, None),                    # the W&B logger's run (the WANDB_KEYS below)
}
# PaddleDetection's ModelEMA (ema_decay, ema_decay_type, cycle_epoch, ema_black_list), ppdet's use_ema: when
# enabled, evaluation, best/, final/ and so export use the averaged weights (engine/training/ema.py)
EMA_KEYS = {
    "enable": (bool, False),                  # keep the average, and evaluate and save it
    "decay": (float, 0.9998, lambda v: None if 0 < v < 1 else "must be in (0, 1)"),   # ppdet's ema_decay
    # threshold: min(decay, (1 + t) / (10 + t)) at step t; exponential: decay (1 - exp(-(t + 1) / 2000)); normal: decay
    "decay_type": (str, "threshold", one_of("threshold", "exponential", "normal")),
    "cycle_epoch": (int, -1, lambda v: None if v == -1 or v >= 1 else "must be -1 (never) or >= 1"),  # epochs between resets of the average
    "black_list": (list, None),               # state_dict name fragments kept as trained, not averaged
}
EARLY_STOP_KEYS = {
    "patience": (int, 0, at_least(0)),        # evaluations without improvement before training stops (0: off)
    "min_delta": (float, 0.0, at_least(0)),   # the least change of best_metric that counts as improvement
}
WANDB_KEYS = {
    "project": (str, "paddle-zoo"),           # the W&B project of the run
    "mode": (str, "offline", one_of("offline", "online")),   # offline: the run folder only (wandb sync uploads it)
}
AMP_KEYS = {
    "enable": (bool, False),                  # compute in the low-precision dtype
    "dtype": (str, "float16", one_of("float16", "bfloat16")),   # float16 needs a GPU; bfloat16 on a CPU too
    "level": (str, "O1", one_of("O1", "O2")),  # O1: autocast per op; O2 (GPU): low-precision weights, fp32 master copy
    "init_loss_scaling": (float, 32768.0, lambda v: None if v > 0 else "must be > 0"),  # float16's first loss scale
    # CPU bf16: the dtype of the tensors between operators; bfloat16 is ops.Precision.bf16_act (convolutional
    # networks: half the bytes saved for the backward, docs/performance.md); ignored on a GPU (paddle.amp)
    "activations": (str, "bfloat16", one_of("float32", "bfloat16")),
    # paddle.amp op lists, e.g. PaddleSeg's (a GPU's autocast; the CPU's bf16 runs our fused operators, reads neither)
    "custom_white_list": (list, None, op_names),  # ops computed in low precision beyond paddle's defaults
    "custom_black_list": (list, None, op_names),  # ops kept in fp32 beyond paddle's defaults
}
EVAL_KEYS = {
    "amp": (dict, None),                      # eval.amp: evaluation and inference; unset keys: train.amp's
}
RUNTIME_KEYS = {
    "seed": (int, 0, at_least(0)),            # seeds init, sampling and augmentation (tools/train.py --seed sets it)
    "num_threads": (int, 0, at_least(0)),     # CPU math threads; 0 = the cores available
    "device": (str, "auto", one_of("auto", "cpu", "gpu")),  # auto: a GPU when paddle sees one, else the CPU
    "sync_bn": (bool, False),                 # BatchNorm statistics across the cards of a multi-card run
    "fast_ops": (bool, True),                 # fused C++ CPU operators (ops/), else pure Paddle
    # CPU: glibc keeps freed blocks (faster steps, a higher peak: docs/performance.md#cpu-environment); false
    # also gives the heap's free pages back after each forward (engine.cpu.trim_heap)
    "keep_freed_memory": (bool, False),
    "flush_denormals": (bool, True),          # CPU: FTZ + DAZ, subnormal floats computed as 0 (engine/cpu.py)
    "world_size": (int, 1),                   # recorded by the trainer; not an input
}
LOADER_KEYS = {
    "batch_size": (int, 1, at_least(1)),      # per card
    # reader processes (0: read in the training process; auto: the cores the trainer leaves free, at most 8 per
    # training process, logged and written to the run's config.yaml)
    "num_workers": (IntOrAuto, 0, lambda v: None if v == AUTO or v >= 0 else "must be >= 0 or auto"),
    "prefetch": (int, 2, at_least(1)),        # batches each reader process prepares ahead (paddle's prefetch_factor)
    "shuffle": (bool, None),                  # default: True for train, False otherwise
    "drop_last": (bool, False),               # drop the last partial batch (train split only)
    "sampler": (dict, None),                  # {name: Epoch} by default (engine/training/samplers.py)
    "collate": (dict, None),                  # {name: Stack} by default
}
SPLITS = (
    "train",            # read by tools/train.py
    "val",              # evaluated during training; tools/eval.py's split when there is no test
    "test",             # when present, what tools/eval.py, infer and export read instead of val
)
TOP_KEYS = (
    "model",            # the network: a registered model and its arguments
    "reader",           # the data: one reader per split, with its DataLoader keys
    "optimizer",        # a registered optimizer and its arguments
    "lr",               # a registered learning-rate schedule and its arguments
    "metric",           # a registered metric computed on the evaluation split
    "infer",            # a registered output writer for tools/infer.py
    "train",            # the trainer's own keys (length, logging, checkpoints, AMP, pretrained weights)
    "eval",             # evaluation and inference (their AMP)
    "runtime",          # seed, device, threads and CPU settings of the process
    "labels",           # a class-name file (line i = class i) for outputs and reports
    "custom_imports",   # modules outside the tree to import before validation (their components register)
)
# component keys nested inside components, and the registry that validates them
NESTED = {"transforms": TRANSFORMS, "backbone": MODELS, "collate": COLLATES, "sampler": SAMPLERS}


def _read_yaml(path):
    if os.path.isdir(path):
        raise ConfigError(_folder_message(path))
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start} is 0x{e.object[e.start]:02x}); "
                          f"save the config as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping at the top level")
    return data


def _folder_message(path, show=8):
    """-c given a folder: say so, and name the recipes in it (all of them when there are few)."""
    recipes = sorted(os.path.join(d, f) for d, dirs, files in os.walk(path)
                     if "_base_" not in os.path.relpath(d, path).split(os.sep) for f in files
                     if f.endswith((".yaml", ".yml")))
    if not recipes:
        return f"config {path} is a folder, not a YAML file, and holds no .yaml recipes"
    show = show if len(recipes) > show + 1 else len(recipes)
    listed = ", ".join(recipes[:show]) + (f", ... ({len(recipes)} in all; tools/list_models.py lists every "
                                          f"recipe)" if len(recipes) > show else "")
    return f"config {path} is a folder, not a YAML file; give one of its recipes: {listed}"


def _merge(base, over, origins, file, prefix=""):
    """Dicts merge, lists and scalars replace; `_delete_: true` replaces a dict."""
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(base.get(key), dict) and not value.get("_delete_"):
            _merge(base[key], value, origins, file, dotted + ".")
        else:
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if k != "_delete_"}
            base[key] = copy.deepcopy(value)
            _mark(value, origins, file, dotted)


def _mark(value, origins, file, dotted):
    origins[dotted] = file
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(v, origins, file, f"{dotted}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _mark(v, origins, file, f"{dotted}.{i}")


def _load_tree(path, origins, depth=0):
    if depth > 4:
        raise ConfigError(f"{path}: _base_ chain deeper than 4 levels (keep it shallow)")
    data = _read_yaml(path)
    bases = data.pop("_base_", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: _base_ must be a path or a list of paths relative to the file, "
                          f"got {bases!r}")
    merged = {}
    for base in bases:
        base_path = os.path.normpath(os.path.join(os.path.dirname(path), base))
        _merge(merged, _load_tree(base_path, origins, depth + 1), origins, base_path)
    _merge(merged, data, origins, path)
    return merged


def parse_override(text):
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like a.b.c=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    quoted = raw.strip()[:1] in ("'", '"')
    if isinstance(value, str) and not quoted:  # YAML 1.1 reads 1e-3 as a string; a number is meant
        try:
            value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            pass
    return key.strip(), value


def apply_override(cfg, key, value, origins):
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            node = _list_item(node, part, key)
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        if not isinstance(node[part], (dict, list)):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"-o {key}: {where} is {node[part]!r} ({type(node[part]).__name__}), "
                              f"not a mapping or list to set '{nxt}' in")
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        idx = int(last) if last.isdigit() else None
        if idx is None or idx > len(node):
            raise ConfigError(f"-o {key}: index '{last}' out of range for a list of {len(node)}")
        node.append(value) if idx == len(node) else node.__setitem__(idx, value)
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"-o {key}: '{'.'.join(parts[:-1])}' is not a mapping or list")
    _mark(value, origins, "-o", key)


def _one_length(cfg, origins):
    """train.epochs and train.max_steps exclude each other: one given by -o replaces the recipe's
    other (with a note), so `-o train.max_steps=50` shortens an epoch-based recipe as users expect."""
    train = cfg.get("train")
    if not isinstance(train, dict) or train.get("epochs") is None or train.get("max_steps") is None:
        return
    given = [k for k in ("epochs", "max_steps") if origins.get(f"train.{k}") == "-o"]
    if len(given) == 1:
        other = "max_steps" if given[0] == "epochs" else "epochs"
        print(f"note: -o train.{given[0]}={train[given[0]]} replaces the recipe's train.{other}: {train[other]} "
              f"(training length is one or the other)", flush=True)
        train[other] = None


def _list_item(node, part, key):
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"-o {key}: index '{part}' out of range for a list of {len(node)}")
    return node[int(part)]


def load(path, overrides=(), validate_config=True):
    """Read a recipe, merge its bases, apply `-o` overrides, import its `custom_imports` (their
    components register before they are checked) and validate. Returns a `Config`."""
    origins = {}
    return _finish(_load_tree(path, origins), origins, path, overrides, validate_config)


def from_data(data, where, overrides=()):
    """A recipe held as data (the config an export records in its infer_cfg.yml), with `-o` overrides
    and validation as `load` gives a file; `where` names it in messages."""
    origins, cfg = {}, copy.deepcopy(data)
    for key, value in cfg.items():
        _mark(value, origins, where, key)
    return _finish(cfg, origins, where, overrides, True)


def _finish(cfg, origins, path, overrides, validate_config):
    for text in overrides:
        apply_override(cfg, *parse_override(text), origins)
    _one_length(cfg, origins)
    cfg.setdefault("train", {})
    cfg.setdefault("runtime", {})
    where = origins.get("custom_imports.imports") or origins.get("custom_imports", path)
    import_custom(cfg.get("custom_imports"), f"{where}: custom_imports")
    if validate_config:
        validate(cfg, origins, path)
    return Config(cfg)


# ---------------------------------------------------------------- typed sections
def _section_class(name, keys, doc, **nested):
    """A frozen dataclass with one field per key of a table (type and default from the table);
    `nested` gives the section classes of keys holding a sub-section (train.amp)."""
    def field(key, spec):
        if key in nested:
            return dataclasses.field(default=nested[key]())
        if isinstance(spec[1], list):   # a list default (train.loggers): each section its own copy
            return dataclasses.field(default_factory=lambda: list(spec[1]))
        return dataclasses.field(default=spec[1])
    fields = [(key, nested.get(key, spec[0]), field(key, spec)) for key, spec in keys.items()]

    def of(cls, data):
        """The section of a validated mapping (unknown keys, possible only without validation, are left out)."""
        data = dict(data or {})
        for key, sub in nested.items():
            data[key] = sub.of(data.get(key))
        return cls(**{k: v for k, v in data.items() if k in keys})

    cls = dataclasses.make_dataclass(name, fields, frozen=True, namespace={"of": classmethod(of)})
    cls.__doc__ = doc
    return cls


AmpSection = _section_class("AmpSection", AMP_KEYS, "train.amp; the AMP defaults live in AMP_KEYS alone.")
# The precision modes a check runs, by name, in one table (tools/gpu_check.py and tools/amp_check.py read
# it): (train.amp.dtype, train.amp.level), None for fp32, and what the mode is. A CPU runs the
# CPU_AMP_MODES (runtime.resolve_amp: bf16 on the fused operators; O2 would run as O1, float16 not at all).
AMP_MODES = {
    "fp32": (None, "fp32 throughout"),
    "bf16-O1": (("bfloat16", "O1"), "bf16 autocast (on a CPU: our fused oneDNN operators)"),
    "bf16-O2": (("bfloat16", "O2"), "bf16 with bf16 parameters (paddle.amp O2)"),
    "fp16-O1": (("float16", "O1"), "fp16 autocast, the loss scaler with gradient clipping"),
    "fp16-O2": (("float16", "O2"), "fp16 parameters, the loss scaler with gradient clipping"),
}
CPU_AMP_MODES = ("fp32", "bf16-O1")
EmaSection = _section_class("EmaSection", EMA_KEYS, "train.ema.")
EarlyStopSection = _section_class("EarlyStopSection", EARLY_STOP_KEYS, "train.early_stop.")
WandbSection = _section_class("WandbSection", WANDB_KEYS, "train.wandb.")
TrainSection = _section_class("TrainSection", TRAIN_KEYS, "The train section.", amp=AmpSection, ema=EmaSection,
                              early_stop=EarlyStopSection, wandb=WandbSection)
RuntimeSection = _section_class("RuntimeSection", RUNTIME_KEYS, "The runtime section.")
LoaderSection = _section_class("LoaderSection", LOADER_KEYS, "A reader split's DataLoader keys.")


class Config(dict):
    """A loaded recipe: the plain data (what config.yaml holds, what components read) and its typed
    engine sections, read once here. The sections describe the recipe as loaded: change a recipe
    through `load(path, overrides)`, not by editing the dict afterwards."""

    def __init__(self, data):
        super().__init__(data)
        self.train = TrainSection.of(self.get("train"))
        self.runtime = RuntimeSection.of(self.get("runtime"))
        # evaluation (in training too) and inference compute as training does unless eval.amp says otherwise
        self.eval_amp = AmpSection.of({**((self.get("train") or {}).get("amp") or {}),
                                       **((self.get("eval") or {}).get("amp") or {})})

    def eval_split(self):
        """The split evaluation, inference and export read: test if the recipe has one, else val."""
        return "test" if "test" in (self.get("reader") or {}) else "val"

    def resolved(self, world_size, num_workers=None):
        """The plain data to write as the run's config.yaml: the recipe as loaded plus what the run
        found (`runtime.world_size`, which multi-node runs and tools read back; `num_workers`, {split:
        the reader processes its loader runs}, replaces `auto`)."""
        out = copy.deepcopy(dict(self))
        out.setdefault("runtime", {})["world_size"] = world_size
        for split, n in (num_workers or {}).items():
            out["reader"][split]["num_workers"] = n
        return out


def split_reader(cfg, split):
    """reader.<split> of a config (a Config or its plain data) as (the dataset's own arguments, a new
    dict; its DataLoader keys, a LoaderSection)."""
    reader_cfg = (cfg.get("reader") or {}).get(split)
    if reader_cfg is None:
        have = list(cfg.get("reader") or {})
        raise ConfigError(f"the config has no reader.{split} section{did_you_mean(split, have)}"
                          + (f"; it has {', '.join('reader.' + s for s in have)}" if have else ""))
    dataset = {k: v for k, v in reader_cfg.items() if k not in LOADER_KEYS}
    return dataset, LoaderSection.of({k: v for k, v in reader_cfg.items() if k in LOADER_KEYS})


# ---------------------------------------------------------------- validation
def choices(annotation):
    """(the values a `typing.Literal` annotation allows, whether they apply to each item of a list) or
    (None, False): `Literal[...]`, `Literal[...] | None` and `list[Literal[...]]`. The config reference
    shows what the validator checks, so both read the closed set here."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return args, False
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            values, per_item = choices(arg)
            if values is not None:
                return values, per_item
    if origin in (list, tuple) and len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        return typing.get_args(args[0]), True
    return None, False


def _chosen(value, allowed):
    # 1 == True in Python: a Literal of strings must not admit a number that compares equal
    return any(value == a and type(value) is type(a) for a in allowed)


def _type_ok(value, expected):
    if value is None:
        return True
    if expected in (inspect.Parameter.empty, object, None):
        return True
    if typing.get_origin(expected) is typing.Literal:
        return True   # the value itself is checked against the choices (_Checker.component)
    if typing.get_origin(expected) in (typing.Union, types.UnionType):
        return any(_type_ok(value, t) for t in typing.get_args(expected) if t is not type(None))
    if expected is IntOrAuto:
        return value == AUTO or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(expected, str):
        expected = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
                    "dict": dict, "tuple": tuple}.get(expected.split("|")[0].strip(), object)
    origin = getattr(expected, "__origin__", None)
    if origin is not None and origin not in (list, dict, tuple):
        return True  # Optional/Union/...: accept, the component checks itself
    expected = origin or expected
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _type_name(t):
    """A type as messages name it: `list` for list[...], `list or dict` for a union."""
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(t) if a is not type(None))
    return getattr(origin or t, "__name__", str(t))


class _Checker:
    def __init__(self, origins, root_file):
        self.origins, self.root = origins, root_file

    def fail(self, dotted, msg):
        file = self.origins.get(dotted)
        parent = dotted
        while file is None and "." in parent:
            parent = parent.rsplit(".", 1)[0]
            file = self.origins.get(parent)
        raise ConfigError(f"{file or self.root}: {dotted}: {msg}")

    def section(self, node, schema, prefix):
        if node is None:
            return
        if not isinstance(node, dict):
            self.fail(prefix, f"expected a mapping, got {type(node).__name__}")
        for key, value in node.items():
            dotted = f"{prefix}.{key}"
            if key not in schema:
                self.fail(dotted, f"unknown key{did_you_mean(key, schema)}; known: {', '.join(schema)}")
            self.value(dotted, value, schema[key])

    def value(self, dotted, value, spec):
        """Type, then range (rule) of one engine-section value."""
        expected, rule = spec[0], (spec[2] if len(spec) > 2 else None)
        if not _type_ok(value, expected):
            self.fail(dotted, f"expected {_type_name(expected)}, got {type(value).__name__} {value!r}")
        if rule is not None and value is not None:
            why = rule(value)
            if why:
                self.fail(dotted, f"{why}, got {value!r}")

    def component(self, node, registry, prefix, extra_keys=None):
        if not isinstance(node, dict):
            self.fail(prefix, f"expected a mapping with 'name:', got {type(node).__name__}")
        if "name" not in node:
            self.fail(prefix, f"missing 'name:' (known {registry.kind}s: {', '.join(registry.names())})")
        try:
            cls = registry.get(node["name"])
        except ConfigError as e:
            self.fail(prefix + ".name", str(e))
        params = {k: p for k, p in inspect.signature(cls).parameters.items()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())
        extra_keys = extra_keys or {}
        for key, value in node.items():
            dotted = f"{prefix}.{key}"
            if key == "name":
                continue
            if key in extra_keys:
                self.value(dotted, value, extra_keys[key])
                expected = extra_keys[key][0]
            elif key in params:
                p = params[key]
                expected = p.annotation
                if expected is inspect.Parameter.empty and p.default not in (inspect.Parameter.empty, None):
                    expected = type(p.default)
            elif takes_kwargs:
                continue
            else:
                known = list(params) + list(extra_keys)
                self.fail(dotted, f"unknown key for {registry.kind} '{node['name']}'"
                                  f"{did_you_mean(key, known)}; known: {', '.join(known)}")
            if not _type_ok(value, expected):
                self.fail(dotted, f"expected {_type_name(expected)}, got {type(value).__name__} {value!r}")
            allowed, per_item = choices(expected)
            if allowed is not None and value is not None:
                for item in (value if per_item else [value]):
                    if not _chosen(item, allowed):
                        words = isinstance(item, str) and all(isinstance(a, str) for a in allowed)
                        near = did_you_mean(item, allowed) if words else ""   # no '50' for 51, nor for "50"
                        self.fail(dotted, f"must be one of {', '.join(map(str, allowed))}, got {item!r}{near}")
            if key in NESTED and value is not None:
                items = value if isinstance(value, list) else [value]
                for i, item in enumerate(items):
                    where = f"{dotted}.{i}" if isinstance(value, list) else dotted
                    self.component(item, NESTED[key], where)
        missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty
                   and k not in node and p.kind != p.VAR_KEYWORD]
        if missing:
            self.fail(prefix, f"{registry.kind} '{node['name']}' needs: {', '.join(missing)}")


def validate(cfg, origins=None, root_file="<config>"):
    check = _Checker(origins or {}, root_file)
    for key in cfg:
        if key not in TOP_KEYS:
            check.fail(key, f"unknown top-level key{did_you_mean(key, TOP_KEYS)}; known: {', '.join(TOP_KEYS)}")
    if "model" not in cfg:
        check.fail("model", "missing (every recipe builds a model)")
    check.component(cfg["model"], MODELS, "model")
    for key, reg in (("optimizer", OPTIMIZERS), ("lr", LR_SCHEDULES), ("metric", METRICS), ("infer", OUTPUTS)):
        if cfg.get(key) is not None:
            check.component(cfg[key], reg, key)
    check.section(cfg.get("train"), TRAIN_KEYS, "train")
    check.section((cfg.get("train") or {}).get("amp"), AMP_KEYS, "train.amp")
    for key, schema in (("ema", EMA_KEYS), ("early_stop", EARLY_STOP_KEYS), ("wandb", WANDB_KEYS)):
        check.section((cfg.get("train") or {}).get(key), schema, f"train.{key}")
    check.section(cfg.get("eval"), EVAL_KEYS, "eval")
    check.section((cfg.get("eval") or {}).get("amp"), AMP_KEYS, "eval.amp")
    if "trust_weights" in (cfg.get("runtime") or {}):
        check.fail("runtime.trust_weights", "not a config key: trusting a weight file to run code is the choice "
                   "of whoever runs the command, never of a recipe; pass --trust-weights")
    check.section(cfg.get("runtime"), RUNTIME_KEYS, "runtime")
    reader = cfg.get("reader") or {}
    if not isinstance(reader, dict):
        check.fail("reader", "expected a mapping of splits (train/val/test)")
    for split, node in reader.items():
        if split not in SPLITS:
            check.fail(f"reader.{split}", f"unknown split{did_you_mean(split, SPLITS)}; known: {', '.join(SPLITS)}")
        check.component(node, DATASETS, f"reader.{split}", extra_keys=LOADER_KEYS)
    labels = cfg.get("labels")
    if labels is not None and not isinstance(labels, str):
        check.fail("labels", "expected a path to a class-name file")
    return cfg


def dump(cfg, path):
    """Write the resolved config (atomically) so the run can be reproduced from this file alone."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(_plain(cfg), f, sort_keys=False, default_flow_style=None)
    os.replace(tmp, path)


def _plain(tree):
    """Dicts (a Config too) as plain dicts, for yaml.safe_dump."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain(v) for v in tree]
    return tree
