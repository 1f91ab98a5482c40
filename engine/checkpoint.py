"""Atomic checkpoints: a checkpoint directory appears complete or not at all, even after `kill -9`.

Layout: `checkpoints/epoch_<N>/` (end of epoch N) or `checkpoints/step_<K>/` (after optimizer step K,
possibly inside an epoch) with `model.pdparams`, `model.pdopt` (optimizer incl. its LR schedule),
`scaler.pdstate`, `rng.pdstate` and `state.json` (epoch, batch position, step, best, config). Files
are written into a hidden temporary directory which is then renamed into place.
"""
import json
import os
import pickle
import re
import shutil

import numpy as np
import paddle

from engine.registry import ConfigError

CKPT_DIR = re.compile(r"(epoch|step)_(\d+)$")


def _atomic_dir(final, writer):
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, "." + os.path.basename(final) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    writer(tmp)
    for name in os.listdir(tmp):  # data reaches the disk before the rename makes it visible
        with open(os.path.join(tmp, name), "rb") as f:
            os.fsync(f.fileno())
    old = final + ".old"
    if os.path.exists(final):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def save(path, model, optimizer=None, scaler=None, state=None):
    """Write one checkpoint directory atomically."""
    def writer(tmp):
        paddle.save(model.state_dict(), os.path.join(tmp, "model.pdparams"))
        if optimizer is not None:
            paddle.save(optimizer.state_dict(), os.path.join(tmp, "model.pdopt"))
        if scaler is not None:
            with open(os.path.join(tmp, "scaler.pdstate"), "wb") as f:
                pickle.dump(scaler.state_dict(), f)
        with open(os.path.join(tmp, "rng.pdstate"), "wb") as f:
            pickle.dump({"paddle": paddle.get_rng_state(), "numpy": np.random.get_state()}, f)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state or {}, f, indent=1, default=str)
    _atomic_dir(path, writer)


def save_weights(path, model):
    """A single `.pdparams` file, written to a temporary name and renamed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    paddle.save(model.state_dict(), tmp)
    os.replace(tmp, path)


def list_checkpoints(ckpt_root):
    """Complete checkpoints under `ckpt_root`, oldest first, as (step, path).

    Ordered by optimizer step; at the same step an end-of-epoch checkpoint comes after a step one
    (it was written later, after the epoch's evaluation).
    """
    if not os.path.isdir(ckpt_root):
        return []
    found = []
    for name in os.listdir(ckpt_root):
        m = CKPT_DIR.match(name)
        full = os.path.join(ckpt_root, name)
        if m and os.path.isfile(os.path.join(full, "state.json")):
            with open(os.path.join(full, "state.json")) as f:
                step = int(json.load(f).get("step", 0))
            found.append((step, m.group(1) == "epoch", int(m.group(2)), full))
    return [(f[0], f[3]) for f in sorted(found)]


def prune(ckpt_root, keep_last):
    for _, path in list_checkpoints(ckpt_root)[:-keep_last or None] if keep_last > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


def find_resume(resume, output_dir):
    """`auto` -> the newest complete checkpoint of this output dir (None if none); else a path."""
    if resume == "auto":
        found = list_checkpoints(os.path.join(output_dir, "checkpoints"))
        return found[-1][1] if found else None
    if not os.path.isfile(os.path.join(resume, "state.json")):
        raise ConfigError(f"--resume {resume}: not a checkpoint directory (no state.json)")
    return resume


def load(path, model, optimizer=None, scaler=None):
    """Restore model, optimizer and scaler from a checkpoint directory written by `save`.

    Returns its state dict (epoch, batch, step, ...) with the saved RNG state under `rng`; the
    trainer applies it with `restore_rng` once it has seeded the epoch.
    """
    from engine.pretrained import load_state
    state_file = os.path.join(path, "model.pdparams")
    weights = read_weights(state_file)
    load_state(model, weights, strict=True, what=f"checkpoint {state_file}", log=lambda *_: None)
    if optimizer is not None and os.path.isfile(os.path.join(path, "model.pdopt")):
        optimizer.set_state_dict(paddle.load(os.path.join(path, "model.pdopt")))
    if scaler is not None and os.path.isfile(os.path.join(path, "scaler.pdstate")):
        with open(os.path.join(path, "scaler.pdstate"), "rb") as f:
            scaler.load_state_dict(pickle.load(f))
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    with open(os.path.join(path, "rng.pdstate"), "rb") as f:
        state["rng"] = pickle.load(f)
    return state


def restore_rng(rng):
    paddle.set_rng_state(rng["paddle"])
    np.random.set_state(rng["numpy"])


def read_weights(path):
    """A `.pdparams` file (or a checkpoint directory holding one) as a dict of arrays."""
    if os.path.isdir(path):
        path = os.path.join(path, "model.pdparams")
    if not os.path.isfile(path):
        raise ConfigError(f"weights file not found: {path}")
    try:
        state = paddle.load(path, return_numpy=True)
    except Exception as e:  # paddle raises many types for a truncated or foreign file
        raise ConfigError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(state, dict):
        raise ConfigError(f"{path}: not a state dict (got {type(state).__name__})")
    return state
