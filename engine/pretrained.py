"""Pretrained entries, key maps and loading with a report of what did not match.

An entry lives in its model's own file (`WEIGHTS.add(PretrainedEntry(...))`); this module only knows
how to turn a source state dict into ours and load it. Download, cache and hash checks: see
`engine.download`.
"""
import dataclasses
import os
import re
import warnings

import numpy as np

from engine.download import archive_stem, cache_dir, download, extract, url_filename
from engine.registry import MODELS, ConfigError, Registry, did_you_mean


@dataclasses.dataclass
class PretrainedEntry:
    name: str                      # what users type: --weights NAME, pretrained: NAME
    model: str                     # registry name of the model it loads into
    urls: list                     # mirrors, tried in order
    sha256: str = None             # only when known from the publisher or a file we downloaded
    md5: str = None
    source: str = ""               # who published it, in which layout (e.g. "PaddleVideo 2.x .pdparams")
    key_map: list = ()             # [(regex, replacement)] on source keys, first match wins
    ignore_keys: list = ()         # regex of source keys dropped on purpose (aliases, buffers)
    head_keys: list = ()           # regex of OUR keys dropped when the shape differs (num_classes)
    convert: object = None         # optional fn(state_dict) -> state_dict, after key_map (e.g. transposes)
    model_args: dict = dataclasses.field(default_factory=dict)  # model config that matches the file
    metrics: dict = dataclasses.field(default_factory=dict)     # reference metrics, ratios in [0, 1]
    metrics_source: str = ""       # where the reference metrics were reported
    dataset: str = ""              # data the metrics are on
    num_params: int = None         # trainable parameters of the model it loads into
    config: str = ""               # the recipe that trained it (configs/...)
    archive_member: str = None     # file to take out of a .tar/.tar.gz/.zip download
    notes: str = ""
    reproduced: str = "not run"    # what was run on our machines (README "reproduced here" column)


WEIGHTS = Registry("pretrained weight")


def _add(entry):
    WEIGHTS.register(entry.name)(entry)
    return entry


WEIGHTS.add = _add


def map_keys(state, entry):
    """Apply an entry's key map; returns (mapped_state, ignored_source_keys)."""
    out, ignored = {}, []
    for key, value in state.items():
        if any(re.fullmatch(p, key) for p in entry.ignore_keys):
            ignored.append(key)
            continue
        new = key
        for pattern, repl in entry.key_map:
            if re.fullmatch(pattern, key):
                new = re.sub(pattern, repl, key)
                break
        if new in out:
            raise ConfigError(f"key map of '{entry.name}' sends two source keys to '{new}'")
        out[new] = value
    if entry.convert is not None:
        out = entry.convert(out)
    return out, ignored


def _as_numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def load_state(model, state, head_keys=(), strict=False, log=print, what="weights"):
    """Load a state dict (already in our key names) into `model`.

    Reports missing and unexpected keys and shape mismatches; a mismatch on a head key is dropped with
    a message (a head of another num_classes), any other mismatch is an error. Returns the report.
    """
    own = model.state_dict()
    # tied tensors appear under several keys (paddle.nn.LSTM does this): the first key loaded wins
    group = {k: id(v) for k, v in own.items()}
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
            if any(re.fullmatch(p, key) for p in head_keys):
                report["dropped_head"].append(key)
                continue
            raise ConfigError(f"{what}: '{key}' has shape {list(arr.shape)}, the model expects "
                              f"{list(want)}: these weights are for another model or config")
        to_load[key] = arr
        loaded_groups.add(group[key])
    report["missing"] = [k for k in own if group[k] not in loaded_groups
                         and k not in report["dropped_head"]]
    if report["dropped_head"]:
        log(f"{what}: dropped head keys of another shape (num_classes differs): "
            f"{', '.join(report['dropped_head'])}")
    if report["missing"]:
        log(f"{what}: missing keys (left at their initial values): {', '.join(report['missing'])}")
    if report["unexpected"]:
        log(f"{what}: unexpected keys (ignored): {', '.join(report['unexpected'])}")
    if strict and (report["missing"] or report["unexpected"]):
        raise ConfigError(f"{what}: {len(report['missing'])} missing and "
                          f"{len(report['unexpected'])} unexpected keys (strict loading)")
    with warnings.catch_warnings():  # paddle warns per key it was not given; reported above instead
        warnings.simplefilter("ignore")
        model.set_state_dict(to_load)
    report["loaded"] = len(to_load)
    return report


def load_entry_state(model, state, entry, strict=False, log=print):
    """Map a source state dict with `entry` and load it; returns the report (with ignored keys)."""
    mapped, ignored = map_keys(state, entry)
    report = load_state(model, mapped, entry.head_keys, strict=strict, log=log, what=entry.name)
    report["ignored"] = ignored
    return report


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

    Downloads go under `root` (default: `engine.download.cache_dir()`): an entry's files in
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


def load_weights_file(path):
    """Read a `.pdparams` (paddle.load; it unpickles, so load only files you trust) or `.npz` file
    into a dict of numpy arrays."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"weights {path} is a folder; expected a .pdparams file "
                          "(Paddle 1.x per-variable folders are not supported)")
    if not os.path.isfile(path):
        raise ConfigError(f"weights file not found: {path}")
    low = path.lower()
    try:
        if low.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
        elif low.endswith(".pdparams"):
            import paddle

            state = paddle.load(path, return_numpy=True)
        elif re.search(r"\.(zip|tar|tgz|tar\.gz|tar\.bz2|tar\.xz)$", low):
            raise ConfigError(f"weights {path} is an archive: extract it and give the .pdparams file "
                              "inside (an entry does this with archive_member)")
        else:
            raise ConfigError(f"unsupported weights file {path}: expected .pdparams or .npz")
    except ConfigError:
        raise
    except Exception as e:  # paddle.load raises ValueError, EOFError, UnpicklingError ... on bad files
        msg = " ".join(str(e).split())
        raise ConfigError(f"cannot read weights file {path} (corrupt, truncated or not a state dict): "
                          f"{type(e).__name__}{': ' + msg if msg else ''}")
    if not isinstance(state, dict):
        raise ConfigError(f"weights file {path} holds a {type(state).__name__}, not a state dict")
    return state


def load_pretrained(model, spec, strict=False, log=print, progress=True, weights_format=None):
    """Resolve `spec` (entry name, URL or path), read it and load it into `model`.

    A known entry maps the source keys with its key map first; a bare file is loaded as is. Returns
    the load report, with `path` and `entry` (name or None) added.
    """
    path, entry = resolve_weights(spec, progress=progress)
    state = load_weights_file(path)
    if entry is None:
        log(f"loading weights from {path}")
        report = load_state(model, state, strict=strict, log=log, what=os.path.basename(path))
    else:
        log(f"loading pretrained '{entry.name}' ({entry.source or 'source not recorded'}) from {path}")
        inner = getattr(model, "_layers", model)  # paddle.DataParallel wraps the model
        cls = MODELS.get(entry.model) if entry.model in MODELS else None
        if isinstance(cls, type) and not isinstance(inner, cls):
            log(f"warning: '{entry.name}' is for model {entry.model}, not {type(inner).__name__}")
        report = load_entry_state(model, state, entry, strict=strict, log=log)
    report["path"] = path
    report["entry"] = entry.name if entry else None
    return report
