"""Atomic checkpoints: a checkpoint directory appears complete or not at all, even after `kill -9`.

Layout: `checkpoints/epoch_<N>/` (end of epoch N) or `checkpoints/step_<K>/` (after optimizer step K,
possibly inside an epoch) with `model.pdparams`, `model.pdopt` (optimizer incl. its LR schedule),
`scaler.json`, `rng.json` and `state.json` (epoch, batch position, step, best, config, the training
hooks' counters), and `ema.pdparams` (the moving average, train.ema). Files are
written into a hidden temporary directory which is then renamed into place.

`rng.json` holds every rank's random state (dropout differs between ranks) and the device it was
drawn on: paddle keeps one generator per visible GPU. A run resumed on another device kind or number
of cards restores what carries over and says in one line what did not (dropout then continues from
the epoch's seed; data order and augmentation never depend on it).

Nothing in a checkpoint needs a full unpickle: the weights and optimizer state are read through
engine.weights.weightfile's allow-list, the scaler and RNG states are JSON. Checkpoints written before the
JSON files existed (`scaler.pdstate`, `rng.pdstate` pickles) still load: their records are plain data
and paddle's GeneratorState, which the allow-list admits for that file alone.
"""
import json
import logging
import os
import re
import shutil

import numpy as np
import paddle

from engine import distributed
from engine.errors import ConfigError
from engine.training.precision import restore_scaler
from engine.weights import weightfile
from engine.weights.pretrained import load_state

log = logging.getLogger("zoo")
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


def save(path, model, optimizer=None, scaler=None, state=None, rng=None, extra=None):
    """Write one checkpoint directory atomically; `rng`: every rank's `rng_state()` in rank order
    (default: this process's); `extra`: {file name: state dict} of what a training hook keeps (the
    moving average's `ema.pdparams`)."""
    def writer(tmp):
        paddle.save(model.state_dict(), os.path.join(tmp, "model.pdparams"))
        for name, tensors in (extra or {}).items():
            paddle.save(tensors, os.path.join(tmp, name))
        if optimizer is not None:
            paddle.save(optimizer.state_dict(), os.path.join(tmp, "model.pdopt"))
        if scaler is not None:
            with open(os.path.join(tmp, "scaler.json"), "w") as f:
                json.dump(_to_json(scaler.state_dict()), f)
        with open(os.path.join(tmp, "rng.json"), "w") as f:
            json.dump({"ranks": rng or [rng_state()]}, f)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state or {}, f, indent=1, default=str)
    _atomic_dir(path, writer)


def save_weights(path, model):
    """A single `.pdparams` file, written to a temporary name and renamed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    paddle.save(model.state_dict(), tmp)
    os.replace(tmp, path)


def copy_weights(src, path):
    """`src` (a `.pdparams` file) to `path`, through a temporary name and a rename."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    shutil.copyfile(src, path + ".tmp")
    os.replace(path + ".tmp", path)


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
    """The checkpoint to resume from, the same one on every rank. `auto`: the newest complete checkpoint
    of this output dir that every rank holds (None when no rank holds one); a path must be a
    checkpoint on every rank. Each rank looks on its own disk: nodes without a shared one hold their
    own copies (train.save_on_each_node), and a node killed while it wrote one lacks the newest."""
    if resume == "auto":
        mine = [os.path.basename(path) for _, path in list_checkpoints(os.path.join(output_dir, "checkpoints"))]
    else:
        mine = [resume] if os.path.isfile(os.path.join(resume, "state.json")) else []
    everyone = distributed.gather(mine)
    common = [name for name in everyone[0] if all(name in held for held in everyone)]
    if common:
        return os.path.join(output_dir, "checkpoints", common[-1]) if resume == "auto" else resume
    if resume != "auto":
        lacking = ", ".join(distributed.where(r) for r, held in enumerate(everyone) if not held)
        raise ConfigError(f"--resume {resume}: not a checkpoint directory (no state.json)"
                          + (f" on {lacking}" if len(everyone) > 1 else ""))
    if not any(everyone):
        return None
    held = "; ".join(f"{distributed.where(r)} has {', '.join(names) or 'none'}" for r, names in enumerate(everyone))
    raise ConfigError(f"--resume auto: no checkpoint under {os.path.join(output_dir, 'checkpoints')} is held by "
                      f"every rank ({held}); nodes without a shared disk need train.save_on_each_node: true")


def load(path, model, optimizer=None, scaler=None, trust=False):
    """Restore model, optimizer and scaler from a checkpoint directory written by `save`.

    Returns its state dict (epoch, batch, step, ...) with the saved RNG state under `rng`; the
    trainer applies it with `restore_rng` once it has seeded the epoch.
    """
    state_file = os.path.join(path, "model.pdparams")
    weights = read_weights(state_file, trust)
    load_state(model, weights, strict=True, what=f"checkpoint {state_file}", log=lambda *_: None)
    if optimizer is not None and os.path.isfile(os.path.join(path, "model.pdopt")):
        opt_state = weightfile.read_state(os.path.join(path, "model.pdopt"), trust)
        optimizer.set_state_dict(weightfile.to_tensors(opt_state))
    if scaler is not None:
        restore_scaler(scaler, _read_record(path, "scaler", trust) or {}, path)
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    state["rng"] = _read_record(path, "rng", trust)
    if state["rng"] is None:
        raise ConfigError(f"{path}: checkpoint has no rng.json (nor an older rng.pdstate)")
    return state


def _read_record(path, name, trust):
    """`<name>.json`, or the pickled `<name>.pdstate` of checkpoints written before the JSON files."""
    if os.path.isfile(os.path.join(path, name + ".json")):
        with open(os.path.join(path, name + ".json")) as f:
            return _from_json(json.load(f))
    old = os.path.join(path, name + ".pdstate")
    if not os.path.isfile(old):
        return None
    record = weightfile.unpickle(old, trust, extra={
        ("paddle.base.libpaddle", "GeneratorState"): paddle.base.core.GeneratorState})
    if name == "rng":   # the old layout held the live objects
        record = {"paddle": [list(g.__getstate__()) for g in record["paddle"]],
                  "numpy": _numpy_rng_to_json(record["numpy"])}
    return record


def rng_state():
    """This process's RNG as plain JSON data: paddle's generators of the current device (one per
    visible GPU on a GPU), the device (`cpu`, `gpu:1`) and numpy's global state."""
    return {"device": paddle.get_device(), "paddle": [list(g.__getstate__()) for g in paddle.get_rng_state()],
            "numpy": _numpy_rng_to_json(np.random.get_state())}


def _numpy_rng_to_json(state):
    kind, keys, pos, has_gauss, cached = state
    return [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def _generator(record):
    g = paddle.base.core.GeneratorState.__new__(paddle.base.core.GeneratorState)
    g.__setstate__(tuple(record))
    return g


def _kind(device):
    return device.split(":")[0]


def _index(device):
    return int(device.split(":")[1]) if ":" in device else 0


def restore_rng(rng, rank=0, world_size=1):
    """Put back the RNG `load` returned (`rng_state` of each rank) for this rank. What cannot carry
    over (another number of ranks, another device kind) is said in one line, and dropout then
    continues from the epoch's seed, which the trainer has just set."""
    ranks = rng["ranks"] if "ranks" in rng else [rng]   # checkpoints before the per-rank layout: one record
    if len(ranks) != world_size:
        log.info("resume: the checkpoint holds the random state of %d rank(s), this run has %d: dropout "
                 "continues from the epoch's seed (data order and augmentation are unaffected)", len(ranks), world_size)
        return
    record = ranks[rank]
    saved, current, here = record["paddle"], paddle.get_rng_state(), paddle.get_device()
    there = record.get("device")
    if len(saved) == len(current) and (there is None or _kind(there) == _kind(here)):
        paddle.set_rng_state([_generator(s) for s in saved])
    elif (there is not None and _kind(there) == _kind(here) and _index(there) < len(saved)
          and _index(here) < len(current)):
        # another number of visible cards: this rank's own generator is the one its dropout used
        current[_index(here)] = _generator(saved[_index(there)])
        paddle.set_rng_state(current)
        log.info("resume: the checkpoint's random state is of %d %s generators, this process has %d: "
                 "restored %s's from %s's", len(saved), _kind(here), len(current), here, there)
    else:
        log.info("resume: the checkpoint's random state was drawn on %s (%d generator(s)), this process "
                 "runs on %s: dropout continues from the epoch's seed (data order and augmentation are "
                 "unaffected)", there or "another device", len(saved), here)
    kind, keys, pos, has_gauss, cached = record["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def _to_json(obj):
    if isinstance(obj, dict):
        return {k: _to_json(v) for k, v in obj.items()}
    if isinstance(obj, (np.ndarray, np.generic)):
        return {"__ndarray__": np.asarray(obj).tolist(), "dtype": str(np.asarray(obj).dtype)}
    return obj


def _from_json(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__", "dtype"}:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: _from_json(v) for k, v in obj.items()}
    return obj


def read_weights(path, trust=False):
    """A `.pdparams` file (or a checkpoint directory holding one) as a dict of arrays."""
    if os.path.isdir(path):
        path = os.path.join(path, "model.pdparams")
    return weightfile.read_state(path, trust)
