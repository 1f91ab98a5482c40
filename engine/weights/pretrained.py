"""Pretrained entries, key maps and loading with a report of what did not match.

An entry lives in its model family's files (`WEIGHTS.add(PretrainedEntry(...))`); this module only
knows how to turn a source state dict into ours and load it, and reads what a weights folder says of
the model (a Hugging Face config.json and vocab.txt) for the model to compare. Download, cache and
hash checks: see `engine.weights.download`.
"""
import dataclasses
import json
import os
import re
import warnings

import numpy as np
import paddle
from safetensors.numpy import load_file

from engine.components import load_all
from engine.model import ZooModel, unwrap
from engine.errors import ConfigError, did_you_mean
from engine.registry import MODELS, Registry
from engine.weights.download import archive_stem, cache_dir, download, extract, file_hash, url_filename
from engine.weights.weightfile import read_state


@dataclasses.dataclass
class PretrainedEntry:
    name: str                      # what users type: --weights NAME, pretrained: NAME
    model: str                     # registry name of the model it loads into
    urls: list                     # mirrors, tried in order
    sha256: str = None             # only when known from the publisher or a file we downloaded
    md5: str = None
    source: str = ""               # who published it, in which layout (e.g. "PaddleVideo 2.x .pdparams")
    key_map: list = ()             # [(regex, replacement)] on source keys, first match wins
    ignore_keys: list = ()         # regex of source keys dropped on purpose (aliases, buffers, a classifier)
    head_keys: list = ()           # regex of OUR keys the file may lack, or hold in another shape (then
                                   # dropped: another num_classes); default: the model's `weights().head_keys`
    convert: object = None         # optional fn(state_dict) -> state_dict, after key_map (e.g. transposes)
    model_args: dict = dataclasses.field(default_factory=dict)  # model config that matches the file
    metrics: dict = dataclasses.field(default_factory=dict)     # reference metrics, ratios in [0, 1]
    metrics_source: str = ""       # where the reference metrics were reported
    dataset: str = ""              # data the metrics are on
    num_params: int = None         # trainable parameters of the model it loads into
    config: str = ""               # the recipe that trained it (configs/...)
    archive_member: str = None     # file to take out of a .tar/.tar.gz/.zip download
    notes: str = ""
    reproduced: str = "not run"    # what was run on our machines (the model-zoo table's "reproduced here" column)
    assets: dict = dataclasses.field(default_factory=dict)  # other files the weights need on raw input
    # (vocabulary, BPE codes): name -> {"urls": [...], "archive_member": path or None, "sha256"/"md5": of the
    # download, "member_md5": of the member}; readers take them as "ENTRY:NAME" (see `resolve_asset`)


WEIGHTS = Registry("pretrained weight")


def _add(entry):
    WEIGHTS.register(entry.name)(entry)
    return entry


WEIGHTS.add = _add


_RULES = {}   # id(entry) -> (its key_map, its ignore_keys, their compiled rules)


def _key_rules(entry):
    """An entry's (ignore patterns, [(pattern, replacement)]), compiled once per entry (a key map of
    hundreds of rules outgrows the re module's own cache)."""
    cached = _RULES.get(id(entry))
    if cached is None or cached[0] is not entry.key_map or cached[1] is not entry.ignore_keys:
        rules = ([re.compile(p) for p in entry.ignore_keys], [(re.compile(p), repl) for p, repl in entry.key_map])
        cached = _RULES[id(entry)] = (entry.key_map, entry.ignore_keys, rules)
    return cached[2]


def _map_name(key, rules):
    """A source key under an entry's rules: our name, or None for a key the entry drops on purpose."""
    ignore, renames = rules
    if any(p.fullmatch(key) for p in ignore):
        return None
    for pattern, repl in renames:
        m = pattern.fullmatch(key)
        if m:
            return m.expand(repl)
    return key


def map_keys(state, entry):
    """Apply an entry's key map; returns (mapped_state, ignored_source_keys)."""
    rules = _key_rules(entry)
    out, ignored = {}, []
    for key, value in state.items():
        new = _map_name(key, rules)
        if new is None:
            ignored.append(key)
            continue
        if new in out:
            raise ConfigError(f"key map of '{entry.name}' sends two source keys to '{new}'")
        out[new] = value
    if entry.convert is not None:
        out = entry.convert(out)
    return out, ignored


def _as_numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


_NUMPY_FLOATS = {paddle.float16: np.float16, paddle.float32: np.float32, paddle.float64: np.float64}


def _in_dtype(arr, dtype):
    """`arr` in the dtype of the tensor it is loaded into (paddle refuses another): fp32 files into an
    O2 model's fp16/bf16 weights on resume, fp16 files (saved by an O2 run without save_dtype) into
    fp32 models. Integer arrays and matching dtypes pass unchanged."""
    if arr.dtype.kind != "f" or (dtype in _NUMPY_FLOATS and arr.dtype == _NUMPY_FLOATS[dtype]):
        return arr
    if dtype in _NUMPY_FLOATS:
        return arr.astype(_NUMPY_FLOATS[dtype])
    if dtype == paddle.bfloat16:
        return paddle.to_tensor(arr.astype(np.float32)).astype(dtype)
    return arr


def _shape(value):
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def _first(keys, n=4):
    keys = list(keys)
    return ", ".join(keys[:n]) + (", ..." if len(keys) > n else "")


def load_state(model, state, head_keys=(), strict=False, log=print, what="weights", layout=None, hint="",
               source=None):
    """Load a state dict (already in our key names) into `model`, or raise one line saying why not.

    strict (eval, infer, resume): every key of the model and of the file must match, names and shapes.
    Not strict (training initialisation): keys matching `head_keys` (regexes of OUR names) may be
    absent from the file (they keep their initial values, logged) or have another shape (a head for
    another num_classes: dropped, logged); any other difference is an error too, so a file read in
    the wrong layout never lets a run start from scratch unnoticed. Nothing is loaded when it raises.
    `layout` and `hint` only go into the messages; `source` (the file's state as read, before any key
    map; default `state`) only serves to tell, when the keys do not fit, which zoo model the file is
    of (`identify_file`). Returns the report.
    """
    own = model.state_dict(use_hook=False)   # the tensors as they are (an AMP O2 model's: fp16/bf16)
    # tied tensors appear under several keys (paddle.nn.LSTM does this): the first key loaded wins
    group = {k: id(v) for k, v in own.items()}
    heads = [re.compile(p) for p in head_keys]
    is_head = lambda key: any(p.fullmatch(key) for p in heads)  # noqa: E731
    where = f"{what} (layout '{layout}')" if layout else what
    tail = f"; {hint}" if hint else ""

    def fail(message, facts):
        """`message`: what to say when the file is of the model's own kind; `facts`: the same, short,
        after the words that name the model the file looks like when it is of another."""
        raise ConfigError(_explain_mismatch(model, state if source is None else source, what, message,
                                            facts + tail))

    report = {"missing": [], "unexpected": [], "dropped_head": [], "aliases_skipped": [], "loaded": 0}
    to_load, loaded_groups = {}, set()
    for key, value in state.items():
        if key not in own:
            report["unexpected"].append(key)
            continue
        if group[key] in loaded_groups:
            report["aliases_skipped"].append(key)
            continue
        arr = _as_numpy(value)
        want = tuple(own[key].shape)
        if tuple(arr.shape) != want:
            if is_head(key) and not strict:
                report["dropped_head"].append(key)
                continue
            shapes = f"{key} has shape {list(arr.shape)}, the model expects {list(want)}"
            # the class count is the axis that differs: a Linear's last ([in, out]), a conv's first
            differ = [a for a, (n, m) in enumerate(zip(arr.shape, want)) if n != m]
            if is_head(key) and arr.ndim == len(want) and len(differ) == 1:
                fail(f"{what}: {shapes} (num_classes differs? set model.num_classes: {arr.shape[differ[0]]})",
                     shapes)
            fail(f"{where}: {shapes}: these weights are for another model or config", shapes)
        to_load[key] = arr
        loaded_groups.add(group[key])
    missing = [k for k in own if group[k] not in loaded_groups and k not in report["dropped_head"]]
    report["missing"] = missing
    bad_missing = missing if strict else [k for k in missing if not is_head(k)]
    unexpected = report["unexpected"]
    if bad_missing or unexpected:
        parts, facts = [], []
        if bad_missing:
            parts.append(f"{len(bad_missing)} of the model's {len(own)} keys missing from the file "
                         f"({_first(bad_missing)})")
            facts.append(f"none of the model's {len(own)} keys in it" if len(bad_missing) == len(own) else
                         f"{len(bad_missing)} of the model's {len(own)} keys missing ({_first(bad_missing, 3)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key{'s' if len(unexpected) > 1 else ''} in the file "
                         f"({_first(unexpected)})")
            facts.append(f"{len(unexpected)} unexpected ({_first(unexpected, 3)})")
        mode = " (strict loading: every key must match)" if strict else ""
        inner = unwrap(model)
        told = inner.weights_hint(list(bad_missing), list(unexpected)) if isinstance(inner, ZooModel) else None
        if told:   # the model knows this difference: the file is its own kind, read in the right layout
            raise ConfigError(f"{where}: {' and '.join(parts)}: {told}")
        fail(f"{where}: {' and '.join(parts)}{mode}{tail}", ", ".join(facts))
    if report["dropped_head"]:
        shapes = ", ".join(f"{k} {list(_shape(state[k]))} vs {list(own[k].shape)}" for k in report["dropped_head"])
        log(f"{what}: dropped head keys of another shape (file vs model; num_classes differs): {shapes}")
    if missing:
        log(f"{what}: missing keys left at their initial values (head_keys allow it): {', '.join(missing)}")
    to_load = {k: _in_dtype(v, own[k].dtype) for k, v in to_load.items()}
    with warnings.catch_warnings():  # paddle warns per key it was not given; reported above instead
        warnings.simplefilter("ignore")
        model.set_state_dict(to_load)
    report["loaded"] = len(to_load)
    return report


# ---------------------------------------------------------------- which zoo model a file is of (errors only)

_ZOO_KEYS = {}   # (registered model names, entry names) -> [(name, frozenset of its keys, [Layout])]


def _zoo_key_sets():
    """Every registered model built with its constructor's defaults under paddle.LazyGuard (names and
    shapes, no memory for values), as (name, its keys, the layouts of its files: native, its
    pretrained entries', its `weights().layouts`); once per process (again if a model or entry is
    registered since). A model whose defaults do not build is left out."""
    load_all()
    stamp = (tuple(MODELS.names()), tuple(WEIGHTS.names()))
    if stamp not in _ZOO_KEYS:
        out = []
        for name in MODELS.names():
            try:
                with warnings.catch_warnings(), paddle.utils.unique_name.guard(), paddle.LazyGuard():
                    warnings.simplefilter("ignore")
                    model = MODELS.get(name)()
                    keys = frozenset(model.state_dict(use_hook=False))
                    own = model.weights()
            except Exception:  # noqa: BLE001  (a model whose defaults do not build: not a candidate)
                continue
            foreign = list(own.foreign_keys)
            layouts = [Layout("native", foreign_keys=foreign)]
            layouts += [Layout(e.name, e, foreign_keys=foreign) for e in WEIGHTS.values() if e.model == name]
            layouts += [Layout(e.name, e, foreign_keys=foreign) for e in own.layouts]
            out.append((name, keys, layouts))
        _ZOO_KEYS.clear()
        _ZOO_KEYS[stamp] = out
    return _ZOO_KEYS[stamp]


def _fit(keys, own, layouts):
    """How a file's `keys` fit a model whose keys are `own`, in the best of `layouts`: (share of the
    file's keys that are the model's, share of the model's keys the file has, how many of the file's
    keys are the model's, layout). Keys a layout drops on purpose (aliases, another task's head)
    count as the model's when the layout finds any of the model's keys at all."""
    best = (0.0, 0.0, 0, None)
    for layout in layouts:
        try:
            names = layout.names(keys)
        except Exception:  # noqa: BLE001  (a key map that cannot read these names: not this layout)
            continue
        found = {n for n in names if n is not None and n in own}
        belong = sum(1 for n in names if n is not None and n in own)
        if found:
            belong += names.count(None)
        score = (belong / max(len(keys), 1), len(found) / max(len(own), 1), belong, layout)
        if score[:2] > best[:2]:
            best = score
    return best


def identify_file(model, keys):
    """Which zoo model a file with these `keys` (its names as read, before any key map) is of, for an
    error that says so: ("own", ...) when it is of `model`'s kind (the model, the models whose files
    it reads, its backbone), ("other", name, how many of its keys are that model's, layout name) when
    another registered model's keys make up most of it, ("none", ...) when no model's do. Models
    are compared by key names: `model` as it is, the others built with their defaults (a recipe's
    depth may differ, so the share of the file's keys decides, then the share of the model's)."""
    keys = list(keys)
    inner = unwrap(model)
    own = inner.weights()
    family = {MODELS.name_of(type(inner)), *own.layout_models}
    if own.backbone is not None:
        family.add(MODELS.name_of(type(own.backbone)))
    family.discard(None)
    mine = _fit(keys, frozenset(inner.state_dict(use_hook=False)), list(model_layouts(inner).values()))
    best, best_name = mine, None
    for name, model_keys, layouts in _zoo_key_sets():
        fit = _fit(keys, model_keys, layouts)
        if fit[:2] > best[:2]:
            best, best_name = fit, name
    share, _, count, layout = best
    if share > 0.5:
        if best_name is None or best_name in family:
            return ("own", None, count, layout.name)
        return ("other", best_name, count, layout.name)
    if mine[1] > 0.5:   # most of the model is in the file: its own kind in a larger config (a deeper trunk)
        return ("own", None, mine[2], mine[3].name)
    return ("none", None, 0, None)


def _article(name):
    return "an" if name[:1].upper() in "AEIOU" else "a"


def _explain_mismatch(model, source, what, message, facts):
    """The error for a file whose keys or shapes do not fit `model`: `message` when the file is of the
    model's own kind, else words that say which zoo model the file looks like (or that it is of none)
    followed by `facts`. Only on the error path: the first call builds every registered model (LazyGuard)."""
    inner = unwrap(model)
    if not isinstance(inner, ZooModel) or not source:
        return message
    try:
        verdict, other, count, layout = identify_file(inner, list(source))
    except Exception:  # noqa: BLE001  (naming the file is a courtesy: never hide the real error behind another)
        return message
    if verdict == "own":
        return message
    if verdict == "none":
        return f"{what} matches none of the zoo's models: {facts}"
    mine = MODELS.name_of(type(inner)) or type(inner).__name__
    names = f" in the names of '{layout}'" if layout != "native" else ""
    share = f"all {count} of its keys" if count == len(source) else f"{count} of its {len(source)} keys"
    return (f"{what} looks like {_article(other)} {other} checkpoint{names} ({share} are {other}'s), "
            f"not {_article(mine)} {mine}: {facts}")


def load_entry_state(model, state, entry, strict=False, log=print):
    """Map a source state dict with `entry` and load it; returns the report (with ignored keys).

    Head keys: the entry's, else the model's `weights().head_keys`; the model's `foreign_keys` are
    dropped (reported as ignored)."""
    own = unwrap(model).weights()
    mapped, ignored = Layout(entry.name, entry, foreign_keys=list(own.foreign_keys)).map(state)
    report = load_state(model, mapped, list(entry.head_keys) or list(own.head_keys),
                        strict=strict, log=log, what=entry.name, layout=entry.name, source=state)
    report["ignored"] = ignored
    return report


# ---------------------------------------------------------------- layouts: which names a file uses

@dataclasses.dataclass
class Layout:
    """One way to read a file's keys: our native names, or an entry's key map (its keys put under
    `prefix` when the entry is for the model's backbone). `foreign_keys` (regexes of OUR names,
    declared by the model as the heads of another task, e.g. a pretraining head in a file loaded
    for fine-tuning) are dropped after mapping and reported with the ignored keys."""
    name: str
    entry: PretrainedEntry = None
    prefix: str = ""
    head_keys: list = ()
    foreign_keys: list = ()

    def map(self, state):
        if self.entry is None:
            mapped, ignored = dict(state), []
        else:
            mapped, ignored = map_keys(state, self.entry)
            mapped = {self.prefix + k: v for k, v in mapped.items()}
        foreign = [re.compile(p) for p in self.foreign_keys]
        for key in [k for k in mapped if any(p.fullmatch(k) for p in foreign)]:
            del mapped[key]
            ignored.append(key)
        return mapped, ignored

    def names(self, keys):
        """What `map` makes of a file's key names, one per key: our name, or None for a key dropped
        on purpose (ignored by the entry, or foreign). The entry's `convert` is not run (it needs the
        values), so a name it would change is left as mapped."""
        rules = _key_rules(self.entry) if self.entry is not None else ((), ())
        foreign = [re.compile(p) for p in self.foreign_keys]
        out = []
        for key in keys:
            new = _map_name(key, rules)
            if new is not None and self.entry is not None:
                new = self.prefix + new
            out.append(None if new is None or any(p.fullmatch(new) for p in foreign) else new)
        return out

    def describe(self):
        if self.entry is None:
            return "our own parameter names"
        where = f", into {self.prefix[:-1]}" if self.prefix else ""
        return f"{self.entry.source or 'entry ' + self.entry.name}{where}"


def model_layouts(model):
    """The layouts a bare file may use for `model`, in order of preference (all from its
    `weights()`): native, the entries of its registry name, the entries of the registry names in
    its `layout_models` (models whose files it also reads, e.g. a fine-tuning model reading
    pretraining releases), its unregistered `layouts` (e.g. another framework's names), then the
    entries of its `backbone`'s registry name (loaded under `backbone.`). The model's
    `foreign_keys` apply to all of them."""
    inner = unwrap(model)
    own = inner.weights()
    own_heads, foreign = list(own.head_keys), list(own.foreign_keys)
    layouts = {"native": Layout("native", head_keys=own_heads, foreign_keys=foreign)}
    entries = WEIGHTS.values()  # registration order
    name = MODELS.name_of(type(inner))
    for e in entries:
        if name is not None and e.model == name:
            layouts[e.name] = Layout(e.name, e, "", list(e.head_keys) or own_heads, foreign)
    for other in own.layout_models:
        for e in entries:
            if e.model == other and other != name and e.name not in layouts:
                layouts[e.name] = Layout(e.name, e, "", own_heads, foreign)
    for e in own.layouts:
        layouts.setdefault(e.name, Layout(e.name, e, "", list(e.head_keys) or own_heads, foreign))
    backbone = own.backbone
    bb_name = MODELS.name_of(type(backbone)) if backbone is not None else None
    if bb_name is not None and bb_name != name:
        for e in entries:
            if e.model == bb_name and e.name not in layouts:
                bb_heads = list(e.head_keys) or list(backbone.weights().head_keys)
                # everything outside the backbone is the model's own, new part: the file need not have it
                heads = own_heads + [r"(?!backbone\.).*"] + [r"backbone\." + p for p in bb_heads]
                layouts[e.name] = Layout(e.name, e, "backbone.", heads)
    return layouts


def detect_layout(model, state, layouts):
    """The layout that explains `state` best: most model tensors found with their shape, then found
    at all, then fewest unexpected keys; ties go to the earlier layout (native first).
    Returns (layout, mapped_state, ignored, (found_with_shape, number_of_model_tensors))."""
    own = model.state_dict()
    group = {k: id(v) for k, v in own.items()}
    best = None
    for layout in layouts.values():
        try:
            mapped, ignored = layout.map(state)
        except Exception:  # noqa: BLE001  a key map or convert that cannot read this file: not its layout
            continue
        fit, present, unexpected = set(), set(), 0
        for key, value in mapped.items():
            if key not in own:
                unexpected += 1
                continue
            present.add(group[key])
            if _shape(value) == tuple(own[key].shape):
                fit.add(group[key])
        score = (len(fit), len(present), -unexpected)
        if best is None or score > best[0]:
            best = (score, layout, mapped, ignored)
    score, layout, mapped, ignored = best
    return layout, mapped, ignored, (score[0], len(set(group.values())))


# ---------------------------------------------------------------- resolve, read and load a weights spec

def _entry_file(entry, root, progress):
    """Download an entry's file (and take `archive_member` out of its archive) into `root/<name>/`."""
    if not entry.urls:
        why = f": {entry.notes}" if entry.notes else ""
        raise ConfigError(f"pretrained weights '{entry.name}' have no released file{why}")
    folder = os.path.join(root, entry.name)
    fname = url_filename(entry.urls[0])
    target = os.path.join(folder, fname)
    if not entry.archive_member:
        return download(entry.urls, target, sha256=entry.sha256, md5=entry.md5, progress=progress)
    out_dir = os.path.join(folder, archive_stem(fname))
    member = os.path.join(out_dir, entry.archive_member)
    if os.path.exists(member):
        return member
    download(entry.urls, target, sha256=entry.sha256, md5=entry.md5, progress=progress)
    extract(target, out_dir)
    if not os.path.exists(member):
        raise ConfigError(f"archive {target} has no member '{entry.archive_member}' "
                          f"(archive_member of '{entry.name}')")
    return member


def resolve_weights(spec, progress=True, root=None):
    """Turn an entry name, an http(s) URL or a local path into (local_path, entry_or_None).

    Downloads go under `root` (default: `engine.weights.download.cache_dir()`): an entry's files in
    `<root>/<entry name>/`, a bare URL's as `<root>/<file name>`. A URL listed by an entry is
    treated as that entry, so its hash and key map apply.
    """
    root = os.path.abspath(os.path.expanduser(os.fspath(root))) if root else cache_dir()
    if isinstance(spec, PretrainedEntry):
        return _entry_file(spec, root, progress), spec
    spec = os.fspath(spec)
    if spec in WEIGHTS:
        entry = WEIGHTS.get(spec)
        return _entry_file(entry, root, progress), entry
    if re.match(r"^https?://", spec, flags=re.I):
        for name in WEIGHTS.names():
            entry = WEIGHTS.get(name)
            if spec in entry.urls:
                return _entry_file(entry, root, progress), entry
        return download([spec], os.path.join(root, url_filename(spec)), progress=progress), None
    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.exists(path):
        return path, None
    raise ConfigError(f"weights '{spec}': no such file, nor a pretrained entry name"
                      f"{did_you_mean(spec, WEIGHTS.names())} (list them: tools/download.py --list)")


def resolve_asset(spec, progress=True, root=None):
    """'ENTRY:NAME' -> the local path of an asset that pretrained entry carries, downloaded (and taken
    out of its archive) into the cache once, shared by the entries naming the same download; any other
    `spec` is returned as it is (a path)."""
    name, _, asset = str(spec).partition(":")
    if not asset or name not in WEIGHTS or os.path.exists(spec):
        return spec
    entry = WEIGHTS.get(name)
    if asset not in entry.assets:
        raise ConfigError(f"pretrained entry '{name}' carries no asset '{asset}'{did_you_mean(asset, entry.assets)}; "
                          f"it has: {', '.join(entry.assets) or 'none'}")
    a = entry.assets[asset]
    root = os.path.abspath(os.path.expanduser(os.fspath(root))) if root else cache_dir()
    fake = PretrainedEntry(name="assets-" + archive_stem(url_filename(a["urls"][0])), model=entry.model,
                           urls=list(a["urls"]), sha256=a.get("sha256"), md5=a.get("md5"),
                           archive_member=a.get("archive_member"))
    path = _entry_file(fake, root, progress)
    want = a.get("member_md5")
    if want:
        got = file_hash(path, "md5")
        if got != want:
            raise ConfigError(f"{path} ({spec}) has md5 {got}, {entry.name} expects {want}")
    return path


FOLDER_FILES = ("model.safetensors", "model.pdparams", "model_state.pdparams")


def weights_in_folder(folder):
    """The weights file of a folder: a Hugging Face folder's model.safetensors, a checkpoint's or
    `final/`'s model.pdparams, a PaddleNLP folder's model_state.pdparams."""
    for name in FOLDER_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    names = sorted(os.listdir(folder))
    torch_files = [n for n in names if n.endswith((".bin", ".pt", ".pth"))]
    if torch_files:
        raise ConfigError(f"weights folder {folder} has only a PyTorch file ({torch_files[0]}), which is read "
                          f"with torch's unpickler: save it as model.safetensors (safetensors.torch.save_file) "
                          f"and load that")
    raise ConfigError(f"weights folder {folder} has none of {', '.join(FOLDER_FILES)}"
                      + (" (Paddle 1.x per-variable folders are not supported)" if names else " (it is empty)"))


def is_hf_folder(folder):
    """A Hugging Face folder has config.json or model.safetensors; our own (final/, checkpoints:
    model.pdparams, no config.json) have neither."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "model.safetensors"))


def read_folder_config(folder):
    """(config, vocab_rows) of a Hugging Face folder, read as data for the model's
    `check_weights_config`: its config.json parsed (None without one) and the number of lines of
    its vocab.txt (None without one)."""
    config, vocab_rows = None, None
    path = os.path.join(folder, "config.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: not a JSON config ({e})") from None
    vocab = os.path.join(folder, "vocab.txt")
    if os.path.isfile(vocab):
        with open(vocab, encoding="utf-8") as f:
            vocab_rows = sum(1 for _ in f)
    return config, vocab_rows


def load_weights_file(path, trust=False):
    """A `.pdparams`, `.npz` or `.safetensors` file (or a folder holding one) as a dict of numpy
    arrays, read as data: `.pdparams` through engine.weights.weightfile's allow-list (`trust` reads a file
    the user trusts in full); the other two formats never execute code."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = weights_in_folder(path)
    if not os.path.isfile(path):
        raise ConfigError(f"weights file not found: {path}")
    low = path.lower()
    if re.search(r"\.(zip|tar|tgz|tar\.gz|tar\.bz2|tar\.xz)$", low):
        raise ConfigError(f"weights {path} is an archive: extract it and give the .pdparams file "
                          "inside (an entry does this with archive_member)")
    if low.endswith(".safetensors"):   # a format that holds only tensors: never executes code
        try:
            return load_file(path)
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file
            raise ConfigError(f"cannot read weights file {path} (corrupt or not safetensors): "
                              f"{type(e).__name__}: {' '.join(str(e).split())[:160]}") from None
    if not low.endswith((".npz", ".pdparams")):
        raise ConfigError(f"unsupported weights file {path}: expected .pdparams, .npz or .safetensors")
    return read_state(path, trust)


def load_pretrained(model, spec, strict=False, log=print, progress=True, weights_format=None, trust=False):
    """Resolve `spec` (entry name, URL or path), read it and load it into `model`.

    An entry maps the source keys with its key map; a bare file (path or unknown URL) is read in the
    layout that explains its keys best (see `detect_layout`). `weights_format` (a layout name from
    `model_layouts`: "native" or an entry name) forces the layout. strict: see `load_state`. `trust`
    unpickles the file in full (only for files you trust; see engine.weights.weightfile).
    Returns the load report, with `path`, `entry` (name or None) and `layout` added.
    """
    inner = unwrap(model)
    if not isinstance(inner, ZooModel):
        raise ConfigError(f"cannot load weights into a {type(inner).__name__}: it is not an engine.model.ZooModel "
                          f"(the contract that says which layouts and heads its files may have; derive the model from it)")
    layouts = model_layouts(inner)
    names = list(layouts)
    hint = ("another layout? name it with --weights-format / train.weights_format ("
            + (f"{_first(names, 2)} {len(names)} in all" if len(names) > 2 else ", ".join(names)) + ")")
    if weights_format is not None and weights_format not in layouts:
        raise ConfigError(f"weights format '{weights_format}' is not a layout of {type(inner).__name__} "
                          f"weights{did_you_mean(weights_format, layouts)}; choose one of: {', '.join(layouts)}")
    path, entry = resolve_weights(spec, progress=progress)
    if os.path.isdir(path) and is_hf_folder(path):
        inner.check_weights_config(*read_folder_config(path), path)   # e.g. config.json against the recipe
    state = load_weights_file(path, trust)
    what = os.path.basename(path)
    if weights_format is not None:
        layout = layouts[weights_format]
        mapped, ignored = layout.map(state)
        log(f"loading weights from {path} in layout '{layout.name}' ({layout.describe()}; as asked)")
    elif entry is not None:
        layout = layouts.get(entry.name)
        if layout is None:  # not one of this model's layouts: the user asked for it by name, try it as is
            cls = MODELS.get(entry.model) if entry.model in MODELS else None
            if isinstance(cls, type) and not isinstance(inner, cls):
                log(f"warning: '{entry.name}' is for model {entry.model}, not {type(inner).__name__}")
            own = inner.weights()
            layout = Layout(entry.name, entry, "", list(entry.head_keys) or list(own.head_keys), list(own.foreign_keys))
        mapped, ignored = layout.map(state)
        log(f"loading pretrained '{entry.name}' ({layout.describe()}) from {path}")
    else:
        layout, mapped, ignored, (found, total) = detect_layout(inner, state, layouts)
        if found:
            log(f"loading weights from {path}: detected layout '{layout.name}' ({layout.describe()}; "
                f"{found} of the model's {total} tensors found)")
        else:
            log(f"loading weights from {path}: no layout finds any of the model's {total} tensors in it "
                f"(tried {', '.join(layouts)})")
    dropped = [k for k in ignored if any(re.fullmatch(p, k) for p in layout.foreign_keys)]
    if dropped:
        log(f"{what}: dropped {len(dropped)} keys of another task's head, which {type(inner).__name__} "
            f"declares foreign ({_first(dropped)})")
    report = load_state(model, mapped, layout.head_keys, strict=strict, log=log, what=what,
                        layout=layout.name, hint=hint, source=state)
    report["ignored"] = ignored
    report["path"] = path
    report["entry"] = entry.name if entry else None
    report["layout"] = layout.name
    return report
