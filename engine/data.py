"""The data contract: datasets yield sample dicts, transforms map sample -> sample, collate makes batches.

Randomness is a function of (seed, epoch, sample index): a dataset puts a numpy Generator derived
from them under `sample["_rng"]` for random transforms to use, and the batch sampler's order derives
from (seed, epoch). A resumed run therefore sees the same data as an uninterrupted one, whatever the
number of workers. Keys starting with `_` never reach the batch.

A batch is a dict with three kinds of values (see `finalize`):
- stacked or padded arrays -> `paddle.Tensor` whose first axis is the batch;
- ragged keys (declared in the collate's `ragged`) -> a list of one `paddle.Tensor` per sample
  (boxes, masks, token lists of different lengths);
- metadata (strings, numbers, dicts, nested lists: image ids, sizes, reference sentences, file
  names, polygons) -> a plain Python list with one value per sample, unchanged.
Every batch also holds `index` (int64 tensor [B], the dataset indices of its readable samples),
`num_skipped` (int), `skipped` (the indices of unreadable samples, a list of ints) and `skip_reasons`
(why each was unreadable, in the same order: what an inferencer answers for it). The serial
and the worker loaders deliver exactly the same structure.
"""
import logging
import numbers
import os
import pickle

import numpy as np
import paddle

from engine.errors import ConfigError, SampleError
from engine.registry import COLLATES, TRANSFORMS

log = logging.getLogger("zoo")


class SampleDataset(paddle.io.Dataset):
    """Base of every reader. Subclasses implement `__len__` and `load(index) -> dict`.

    Args:
        transforms: the transform configs (`{name: ..., ...}`) applied in order to every loaded sample.
        seed: with the epoch and the sample index, seeds the random transforms and sampling (a resumed
            run sees the same data); filled in from `runtime.seed` when the split does not set it.
        skip_bad: a sample whose `load` raises SampleError is logged (with its file) and dropped from
            its batch instead of stopping the run; collate counts it in `batch["num_skipped"]`.

    Optional hooks other parts of the engine use when a recipe asks for them: `num_classes`,
    `vocab_size`, `max_seq_length` (checked against the model's), `lengths()` (token-budget batching), `aspect_ratios()`
    (aspect-ratio grouping), `data_faults()` (damage found while indexing), `label_names`.
    """

    # names of the classes, when the dataset knows them (inference output)
    label_names = None
    # what the engine compares with the model's data_agreement() before the first step, when the
    # dataset knows it: classes of the labels, rows of its vocabulary, the longest sequence it gives
    num_classes = None
    vocab_size = None
    labelled = True   # False: a split without ground truth (GLUE's test files), which eval cannot score
    max_seq_length = None
    # the arguments that say which samples (files, folders, split), not how they are processed:
    # INT8 calibration reads the train split's samples through the evaluation split's processing
    SOURCE_KEYS = ()

    def __init__(self, transforms=(), seed=0, skip_bad=False):
        self.transforms = [t if callable(t) else TRANSFORMS.build(t) for t in transforms or ()]
        self.seed = seed
        self.epoch = 0
        self.skip_bad = skip_bad

    def set_epoch(self, epoch):
        self.epoch = epoch

    def load(self, index):
        raise NotImplementedError

    def __getitem__(self, index):
        index = int(index)
        try:
            sample = self.load(index)
        except SampleError as e:
            if not self.skip_bad:
                if paddle.io.get_worker_info() is not None:
                    return SampleFailure(str(e))  # a worker cannot raise it usefully: carry it to the loader
                raise
            log.warning("skipped sample %d: %s", index, e)
            return Skipped(index, str(e))
        sample["index"] = np.int64(index)
        sample["_rng"] = np.random.default_rng([self.seed, self.epoch, index])
        for t in self.transforms:
            sample = t(sample)
        return sample

    def describe(self, index):
        """A human name for sample `index` (file, video id) for logs and inference output."""
        return str(index)

    def lengths(self):
        """Per-sample lengths (int [N], or [N, k] for several sequences) known without loading the
        samples; needed by the TokenBudget sampler."""
        raise ConfigError(f"reader '{type(self).__name__}' gives no sample lengths, which the "
                          f"TokenBudget sampler needs")

    def aspect_ratios(self):
        """Per-sample width / height (float [N]) known without decoding; needed by AspectRatioGroup."""
        raise ConfigError(f"reader '{type(self).__name__}' gives no aspect ratios, which the "
                          f"AspectRatioGroup sampler needs")

    def data_faults(self):
        """Records lost before any sample is loaded (e.g. damaged files found while indexing), which
        `num_skipped` cannot show: `{"records_lost": int, "summary": one line or ""}`."""
        return {"records_lost": 0, "summary": ""}

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """A dataset over raw user inputs (files, folders) for `tools/infer.py`, built from the
        recipe's test/val reader arguments `kwargs`."""
        raise ConfigError(f"reader '{cls.__name__}' cannot run inference on raw inputs")


class Skipped:
    """An unreadable sample (skip_bad), kept as a marker so that collate can name its index."""

    def __init__(self, index, reason=""):
        self.index, self.reason = index, reason


class SampleFailure:
    """An unreadable sample inside a DataLoader worker, carried to the main process as data."""

    def __init__(self, message):
        self.message = message


# ------------------------------------------------------------------------------------ collate

def _is_numeric(value):
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    return isinstance(value, (numbers.Real, np.bool_))


def collate(samples, pads=None, ragged=()):
    """The batch of `samples` (see the module docstring).

    `pads`: {key: Pad} for keys padded to the batch's largest shape; `ragged`: keys kept as per-sample
    arrays. Other numeric keys must have one shape in the batch; non-numeric values are metadata.
    """
    pads, ragged = pads or {}, set(ragged)
    good = [s for s in samples if not isinstance(s, Skipped)]
    skipped = [int(s.index) for s in samples if isinstance(s, Skipped)]
    reasons = [s.reason for s in samples if isinstance(s, Skipped)]
    batch = {"num_skipped": len(skipped), "skipped": skipped, "skip_reasons": reasons}
    if not good:
        return batch
    keys = [k for k in good[0] if not k.startswith("_")]
    for i, s in enumerate(good[1:], 1):
        if set(k for k in s if not k.startswith("_")) != set(keys):
            raise SampleError(f"samples {int(good[0]['index'])} and {int(s['index'])} of one batch "
                              f"have different keys: {sorted(keys)} vs "
                              f"{sorted(k for k in s if not k.startswith('_'))}")
    for key in keys:
        values = [s[key] for s in good]
        if key in pads:
            batch.update(pads[key](key, [np.asarray(v) for v in values]))
        elif key in ragged:
            batch[key] = [np.asarray(v) for v in values]
        elif all(_is_numeric(v) for v in values):
            arrays = [np.asarray(v) for v in values]
            shapes = {a.shape for a in arrays}
            if len(shapes) != 1:
                raise SampleError(f"key '{key}' has different shapes in one batch {sorted(shapes)}; "
                                  f"pad it (PadSequences, PadImages) or list it in the collate's ragged keys")
            batch[key] = np.stack(arrays)
        else:
            batch[key] = list(values)
    return batch


def _is_ragged(value):
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, np.ndarray) and v.dtype.kind in "biuf" for v in value)


def empty(batch):
    """A batch whose every sample was unreadable (and logged): it carries only the skip counts
    (`skipped`, `num_skipped`), no `index` and no data. Loops skip it."""
    return "index" not in batch


def finalize(batch):
    """numpy arrays -> tensors, ragged lists of arrays -> lists of tensors, metadata unchanged.

    The one place that decides what becomes a tensor, used by both loaders after collate.
    """
    out = {}
    for key, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            out[key] = paddle.to_tensor(value)
        elif _is_ragged(value):
            out[key] = [paddle.to_tensor(v) for v in value]
        else:
            out[key] = value
    return out


class Pad:
    """Pad one key to the batch's largest size along its first `ndim` axes (1: sequences) or its last
    two axes (2: images [..., H, W]), to a multiple of `multiple`, with `value`."""

    def __init__(self, value=0, ndim=1, multiple=1, max_len=None):
        if ndim not in (1, 2):
            raise ConfigError(f"padding: ndim must be 1 or 2, got {ndim}")
        if multiple < 1:
            raise ConfigError(f"padding: multiple must be >= 1, got {multiple}")
        self.value, self.ndim, self.multiple, self.max_len = value, ndim, multiple, max_len

    def _round(self, n):
        return -(-n // self.multiple) * self.multiple

    def __call__(self, key, arrays):
        dtype = np.result_type(*arrays)
        if self.ndim == 1:
            lengths = np.array([len(a) for a in arrays], dtype=np.int64)
            T = self.max_len or self._round(max(1, int(lengths.max())))
            tails = {a.shape[1:] for a in arrays}
            if len(tails) != 1:
                raise SampleError(f"key '{key}': sequences differ beyond their length {sorted(tails)}")
            out = np.full((len(arrays), T) + arrays[0].shape[1:], self.value, dtype=dtype)
            mask = np.zeros((len(arrays), T), dtype=np.float32)
            for i, a in enumerate(arrays):
                n = min(len(a), T)
                out[i, :n] = a[:n]
                mask[i, :n] = 1.0
            return {key: out, key + "_len": np.minimum(lengths, T), key + "_mask": mask}
        if any(a.ndim < 2 for a in arrays):
            raise SampleError(f"key '{key}': 2-D padding needs arrays [..., H, W], got shapes "
                              f"{sorted({a.shape for a in arrays})}")
        lead = {a.shape[:-2] for a in arrays}
        if len(lead) != 1:
            raise SampleError(f"key '{key}': images differ beyond their height and width {sorted(lead)}")
        sizes = np.array([a.shape[-2:] for a in arrays], dtype=np.int64)
        H, W = (self._round(int(m)) for m in sizes.max(axis=0))
        out = np.full((len(arrays),) + arrays[0].shape[:-2] + (H, W), self.value, dtype=dtype)
        for i, a in enumerate(arrays):
            out[i, ..., :a.shape[-2], :a.shape[-1]] = a
        return {key: out, key + "_size": sizes}


def _pad_table(keys, pad_value, **kwargs):
    """{key: pad value} from a list of keys (one pad value) or a dict (a pad value per key)."""
    if isinstance(keys, dict):
        return {k: Pad(value=v, **kwargs) for k, v in keys.items()}
    if isinstance(keys, (list, tuple)):
        return {k: Pad(value=pad_value, **kwargs) for k in keys}
    raise ConfigError(f"collate keys must be a list of keys or a mapping key -> pad value, got {keys!r}")


@COLLATES.register("Stack")
class Stack:
    """Stack equal-shape arrays; `ragged` keys stay per-sample arrays.

    Args:
        ragged: keys whose arrays differ in shape between samples (boxes, masks, token lists): they stay
            a list of one tensor per sample instead of failing to stack.
    """

    def __init__(self, ragged: list = ()):
        self.ragged = list(ragged)

    def __call__(self, samples):
        return collate(samples, ragged=self.ragged)


@COLLATES.register("PadSequences")
class PadSequences:
    """Pad variable-length arrays (axis 0) to the longest in the batch (or `max_len`), rounded up to
    a multiple of `multiple`.

    Adds `<key>_len` (int64 [B]) and `<key>_mask` (float32 [B, T], 1 on real steps) for each key.

    Args:
        keys: the keys to pad: a list (all padded with `pad_value`) or a mapping key -> pad value (the pad
            token id for ids, the ignore index for labels).
        pad_value: the fill of the keys given as a list.
        max_len: pad (and cut) every sequence to this length instead of the batch's longest.
        multiple: round the padded length up to a multiple of this (fewer distinct shapes to compile or
            cache kernels for).
        ragged: keys kept as a list of per-sample arrays, as in Stack.
    """

    def __init__(self, keys: list | dict, pad_value: float = 0.0, max_len: int = None, multiple: int = 1,
                 ragged: list = ()):
        if max_len is not None and max_len < 1:
            raise ConfigError(f"PadSequences: max_len must be >= 1, got {max_len}")
        self.pads = _pad_table(keys, pad_value, ndim=1, multiple=multiple, max_len=max_len)
        self.ragged = list(ragged)

    def __call__(self, samples):
        return collate(samples, self.pads, self.ragged)


@COLLATES.register("PadImages")
class PadImages:
    """Pad images and label maps [..., H, W] at the bottom and right to the batch's largest size,
    optionally to a multiple of `size_divisor` (32 for FPN), and record each real size under
    `<key>_size` (int64 [B, 2], height and width).

    Args:
        keys: the keys to pad: a mapping key -> pad value (0 for images, the ignore index for label
            maps), or a list padded with `pad_value`.
        pad_value: the fill of the keys given as a list.
        size_divisor: round the padded height and width up to a multiple of this (32 for an FPN, whose
            strided levels must divide the image).
        ragged: keys kept as a list of per-sample arrays, as in Stack.
    """

    def __init__(self, keys: list | dict, pad_value: float = 0.0, size_divisor: int = 1, ragged: list = ()):
        self.pads = _pad_table(keys, pad_value, ndim=2, multiple=size_divisor)
        self.ragged = list(ragged)

    def __call__(self, samples):
        return collate(samples, self.pads, self.ragged)


# ------------------------------------------------------------------------------------ loaders

# `num_workers: auto` gives one training process at most this many reader processes: each holds a copy of
# the dataset object and `prefetch` batches in shared memory (/dev/shm), and a reader that needs more is
# better told so (the training log's reader share) than handed every core of a large host
AUTO_WORKERS_MAX = 8


def auto_workers(cores, trainer_cores, procs_per_node=1, cap=AUTO_WORKERS_MAX):
    """`num_workers: auto` for one training process: the node's usable `cores` less those its
    `procs_per_node` training processes compute on (`trainer_cores` each), shared between them, at
    most `cap` each, never below 0."""
    free = cores - procs_per_node * trainer_cores
    return max(0, min(cap, free // max(1, procs_per_node)))


def resolve_workers(value, device="cpu", threads=None, procs_per_node=None):
    """reader.<split>.num_workers as a number, and how `auto` came to it (None for a number).

    A training process on a CPU computes on its `threads` (runtime.num_threads as runtime.setup
    resolved it: all usable cores by default, which leaves no core for a reader process); on a GPU it
    keeps about one core busy launching kernels. `procs_per_node`: the training processes of this node
    (paddle's launcher says it in PADDLE_LOCAL_SIZE)."""
    if value != "auto":
        return value, None
    cores = len(os.sched_getaffinity(0))
    procs = procs_per_node or int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    on_cpu = device == "cpu"
    trainer = (threads or cores) if on_cpu else 1
    n = auto_workers(cores, trainer, procs)
    each = f"{trainer} math threads (runtime.num_threads)" if on_cpu else f"1 core (on the {device.upper()})"
    how = (f"{cores} usable cores - the trainer's {each}" if procs == 1 else
           f"({cores} usable cores - {procs} trainers x {each}) / {procs} trainers")
    return n, how + (f", capped at {AUTO_WORKERS_MAX}" if n == AUTO_WORKERS_MAX else "")


class SerialLoader:
    """Batches built in the calling thread (num_workers == 0).

    paddle's DataLoader runs even zero workers in a helper thread, where a reader exception is printed
    and the run then hangs; here an error surfaces as itself, with the file it names.
    """

    num_workers = 0

    def __init__(self, dataset, batch_sampler, collate_fn):
        self.dataset, self.batch_sampler, self.collate_fn = dataset, batch_sampler, collate_fn

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        for indices in self.batch_sampler:
            yield finalize(self.collate_fn([self.dataset[i] for i in indices]))


_REST = "_zoo_rest"


def _pack(batch):
    """In a worker: arrays travel through paddle's shared memory, everything else (ragged arrays,
    metadata, the key order) pickled into one `bytes` value. paddle's DataLoader passes `bytes` with
    the batch's structure, not as a tensor: on a GPU the loader puts its tensors on the card, and
    metadata sent there would have to come back (a device sync every batch)."""
    arrays = {k: v for k, v in batch.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    rest = {k: v for k, v in batch.items() if k not in arrays}
    rest["_order"] = list(batch)
    arrays[_REST] = pickle.dumps(rest, protocol=pickle.HIGHEST_PROTOCOL)
    return arrays


def _unpack(received):
    rest = pickle.loads(received.pop(_REST))
    order = rest.pop("_order")
    tensors = dict(received)
    rest = finalize(rest)
    return {k: tensors[k] if k in tensors else rest[k] for k in order}


class WorkerLoader:
    """paddle's DataLoader with worker processes, re-raising a sample's error in the main process.

    A worker exception would otherwise only reach the main process as "Blocking queue is killed",
    without the file that caused it.
    """

    def __init__(self, dataset, batch_sampler, collate_fn, num_workers, prefetch=2):
        def guarded(samples):
            failed = [s for s in samples if isinstance(s, SampleFailure)]
            if failed:
                # an array (paddle's loader needs a tensor in every batch), read back once before raising
                return {"sample_error": np.frombuffer(failed[0].message.encode(), dtype=np.uint8).copy()}
            return _pack(collate_fn(samples))

        self.dataset, self.batch_sampler, self.num_workers = dataset, batch_sampler, num_workers
        self.loader = paddle.io.DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=guarded,
                                           num_workers=num_workers, prefetch_factor=prefetch, return_list=True,
                                           use_shared_memory=True)

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        for batch in self.loader:
            if "sample_error" in batch:
                raise SampleError(bytes(batch["sample_error"].numpy()).decode())
            yield _unpack(batch)
