"""Pretrained entries, key maps and loading with a report of what did not match.

An entry lives in its model's own file (`WEIGHTS.add(PretrainedEntry(...))`); this module only knows
how to turn a source state dict into ours and load it. Download, cache and hash checks: see
`engine.download`.
"""
import dataclasses
import re
import warnings

import numpy as np

from engine.registry import ConfigError, Registry


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
