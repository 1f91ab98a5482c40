"""The data contract: datasets yield sample dicts, transforms map sample -> sample, collate makes batches.

Randomness is a function of (seed, epoch, sample index): a dataset puts a numpy Generator derived
from them under `sample["_rng"]` for random transforms to use, and the sampler's order derives from
(seed, epoch). A resumed run therefore sees the same data as an uninterrupted one, whatever the
number of workers. Keys starting with `_` never reach the batch.
"""
import logging

import numpy as np
import paddle

from engine.registry import COLLATES, ConfigError, TRANSFORMS

log = logging.getLogger("zoo")


class SampleError(Exception):
    """One sample cannot be read; the message names the file (and offset where it helps)."""


class SampleDataset(paddle.io.Dataset):
    """Base of every reader. Subclasses implement `__len__` and `load(index) -> dict`.

    `skip_bad`: a sample whose `load` raises SampleError is logged (with its file) and dropped from
    its batch instead of stopping the run; collate counts it in `batch["num_skipped"]`.
    """

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
            return None
        sample["index"] = np.int64(index)
        sample["_rng"] = np.random.default_rng([self.seed, self.epoch, index])
        for t in self.transforms:
            sample = t(sample)
        return sample

    def describe(self, index):
        """A human name for sample `index` (file, video id) for logs and inference output."""
        return str(index)

    def data_faults(self):
        """Records lost before any sample is loaded (e.g. damaged files found while indexing), which
        `num_skipped` cannot show: `{"records_lost": int, "summary": one line or ""}`."""
        return {"records_lost": 0, "summary": ""}

    # names of the classes, when the dataset knows them (inference output)
    label_names = None

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """A dataset over raw user inputs (files, folders) for `tools/infer.py`, built from the
        recipe's test/val reader arguments `kwargs`."""
        raise ConfigError(f"reader '{cls.__name__}' cannot run inference on raw inputs")

    def write_predictions(self, output_dir, ids, probs):
        """Extra, format-specific prediction files (e.g. a competition CSV); returns their paths."""
        return []


class SampleFailure:
    """An unreadable sample inside a DataLoader worker, carried to the main process as data."""

    def __init__(self, message):
        self.message = message


def stack(samples):
    """Stack equal-shape numpy values key by key; drop `_` keys; count skipped (None) samples."""
    good = [s for s in samples if s is not None]
    batch = {"num_skipped": np.int64(len(samples) - len(good))}
    if not good:
        return batch
    for key in good[0]:
        if key.startswith("_"):
            continue
        values = [np.asarray(s[key]) for s in good]
        shapes = {v.shape for v in values}
        if len(shapes) != 1:
            raise SampleError(f"key '{key}' has different shapes in one batch {sorted(shapes)}; "
                              f"use a padding collate")
        batch[key] = np.stack(values)
    return batch


@COLLATES.register("Stack")
class Stack:
    def __call__(self, samples):
        return stack(samples)


@COLLATES.register("PadSequences")
class PadSequences:
    """Pad variable-length arrays (axis 0) to the longest in the batch (or `max_len`).

    Adds `<key>_len` (int64 [B]) and `<key>_mask` (float32 [B, T], 1 on real steps) for each key.
    """

    def __init__(self, keys, pad_value=0.0, max_len=None):
        self.keys = list(keys)
        self.pad_value = pad_value
        self.max_len = max_len

    def __call__(self, samples):
        good = [s for s in samples if s is not None]
        padded = {}
        for key in self.keys:
            seqs = [np.asarray(s.pop(key)) for s in good]
            if not seqs:
                continue
            lengths = np.array([len(x) for x in seqs], dtype=np.int64)
            T = self.max_len or max(1, int(lengths.max()))
            out = np.full((len(seqs), T) + seqs[0].shape[1:], self.pad_value, dtype=seqs[0].dtype)
            mask = np.zeros((len(seqs), T), dtype=np.float32)
            for i, x in enumerate(seqs):
                n = min(len(x), T)
                out[i, :n] = x[:n]
                mask[i, :n] = 1.0
            padded[key], padded[key + "_len"], padded[key + "_mask"] = out, np.minimum(lengths, T), mask
        batch = stack(samples)
        batch.update(padded)
        return batch


class EpochBatchSampler(paddle.io.BatchSampler):
    """Batches of indices whose order depends only on (seed, epoch); split across ranks.

    Like paddle's DistributedBatchSampler, the index list is padded by repetition so every rank gets
    the same number of batches; evaluators drop the repeats by sample index.
    """

    def __init__(self, num_samples, batch_size, shuffle, drop_last=False, seed=0, num_replicas=1, rank=0):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _indices(self):
        order = np.arange(self.num_samples)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
        per_rank = -(-self.num_samples // self.num_replicas)
        total = per_rank * self.num_replicas
        if total > len(order):
            order = np.concatenate([order, order[: total - len(order)]])
        return order[self.rank: total: self.num_replicas]

    def __iter__(self):
        idx = self._indices()
        for start in range(0, len(idx), self.batch_size):
            chunk = idx[start: start + self.batch_size]
            if self.drop_last and len(chunk) < self.batch_size:
                return
            yield chunk.tolist()

    def __len__(self):
        n = len(self._indices())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class SerialLoader:
    """Batches built in the calling thread (num_workers == 0).

    paddle's DataLoader runs even zero workers in a helper thread, where a reader exception is printed
    and the run then hangs; here an error surfaces as itself, with the file it names.
    """

    def __init__(self, dataset, batch_sampler, collate_fn):
        self.dataset, self.batch_sampler, self.collate_fn = dataset, batch_sampler, collate_fn

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        for indices in self.batch_sampler:
            batch = self.collate_fn([self.dataset[i] for i in indices])
            yield {k: paddle.to_tensor(v) for k, v in batch.items()}


class WorkerLoader:
    """paddle's DataLoader with worker processes, re-raising a sample's error in the main process.

    A worker exception would otherwise only reach the main process as "Blocking queue is killed",
    without the file that caused it.
    """

    def __init__(self, dataset, batch_sampler, collate_fn, num_workers):
        def guarded(samples):
            failed = [s for s in samples if isinstance(s, SampleFailure)]
            if failed:
                return {"sample_error": np.frombuffer(failed[0].message.encode(), dtype=np.uint8).copy()}
            return collate_fn(samples)

        self.batch_sampler = batch_sampler
        self.loader = paddle.io.DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=guarded,
                                           num_workers=num_workers, return_list=True, use_shared_memory=True)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if "sample_error" in batch:
                raise SampleError(bytes(batch["sample_error"].numpy()).decode())
            yield batch
