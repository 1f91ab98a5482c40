"""Batch samplers: which samples form a batch, chosen per split with `reader.<split>.sampler`.

Every sampler's batches are a function of (seed, epoch) only, so a run resumed in the middle of an
epoch (`set_epoch(epoch, start=k)`: skip the first k batches) sees exactly the batches the
uninterrupted run saw, and every rank gets the same number of batches (lists are padded by
repetition, as paddle's DistributedBatchSampler does; evaluation drops the repeats by index).

    sampler: {name: Epoch}                                  # default: shuffled fixed-size batches
    sampler: {name: TokenBudget, max_tokens: 4096}          # text: at most 4096 tokens per card
    sampler: {name: AspectRatioGroup, boundaries: [1.0]}    # detection: portrait / landscape batches

A sampler is configured by its keys and then bound to the dataset and the loader's settings
(`bind`), like an optimizer is configured and then given the model.
"""
import numpy as np
import paddle

from engine.errors import ConfigError
from engine.registry import SAMPLERS


class _BatchSampler(paddle.io.BatchSampler):
    def __init__(self):  # paddle's constructor wants a dataset or sampler; ours binds later
        self.epoch, self.start, self._cache = 0, 0, None

    def bind(self, dataset, batch_size=1, shuffle=False, drop_last=False, seed=0, num_replicas=1, rank=0):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples = len(dataset)
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.num_replicas, self.rank = num_replicas, rank
        self.prepare(dataset)
        return self

    def prepare(self, dataset):
        pass

    def set_epoch(self, epoch, start=0):
        """Batches of `epoch`; iteration begins at batch `start` (resuming inside an epoch)."""
        self.epoch, self.start = epoch, start

    def rank_batches(self):
        """This rank's batches of the current epoch (index lists), cached per epoch."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.make_batches())
        return self._cache[1]

    def make_batches(self):
        raise NotImplementedError

    def split(self, batches):
        """Global batches -> this rank's share, padded by repetition to the same count on every rank."""
        per_rank = -(-len(batches) // self.num_replicas)
        batches = batches + batches[: per_rank * self.num_replicas - len(batches)]
        return batches[self.rank:: self.num_replicas]

    def rng(self):
        return np.random.default_rng([self.seed, self.epoch])

    def __iter__(self):
        for batch in self.rank_batches()[self.start:]:
            yield [int(i) for i in batch]

    def __len__(self):
        """Batches of a whole epoch on this rank (a resumed epoch yields `len - start` of them)."""
        return len(self.rank_batches())


@SAMPLERS.register("Epoch")
class Epoch(_BatchSampler):
    """Fixed-size batches of a (seed, epoch) permutation; samples split across ranks.

    As paddle's DistributedBatchSampler: the index list is padded by repetition to a multiple of the
    world size and rank r takes every r-th index, then cuts it into batches.
    """

    def __init__(self):
        super().__init__()

    def make_batches(self):
        order = self.rng().permutation(self.num_samples) if self.shuffle else np.arange(self.num_samples)
        per_rank = -(-self.num_samples // self.num_replicas)
        total = per_rank * self.num_replicas
        if total > len(order):
            order = np.concatenate([order, order[: total - len(order)]])
        idx = order[self.rank: total: self.num_replicas]
        stop = len(idx) - len(idx) % self.batch_size if self.drop_last else len(idx)
        return [idx[s: s + self.batch_size] for s in range(0, stop, self.batch_size)]


def EpochBatchSampler(num_samples, batch_size, shuffle, drop_last=False, seed=0, num_replicas=1, rank=0):
    """The default sampler over `num_samples` indices (a shorthand for tests and tools)."""
    return Epoch().bind(range(num_samples), batch_size, shuffle, drop_last, seed, num_replicas, rank)


@SAMPLERS.register("TokenBudget")
class TokenBudget(_BatchSampler):
    """Batches of similar-length samples holding at most `max_tokens` tokens each, padding included.

    The dataset's `lengths()` (int [N], or [N, k] for source and target: a sample costs its longest)
    are rounded up to a multiple of `bucket_width` (use the collate's padding multiple, so the budget
    counts what the model gets), sorted (ties by index) and packed greedily once: a batch costs
    (samples x its longest rounded length). Only the order of these fixed batches is shuffled per
    (seed, epoch), so every epoch has the same number of batches for the LR schedule and the ETA.
    `batch_size` is not used.

    Args:
        max_tokens: the most tokens a batch may hold on one card, padding included (samples x the
            batch's longest rounded length); a sample longer than it stops the run naming it.
        max_samples: the most samples per batch, whatever their length (0: no limit).
        bucket_width: lengths are rounded up to a multiple of this before packing; set it to the
            collate's padding `multiple` so the budget counts what the model gets.
    """

    def __init__(self, max_tokens: int, max_samples: int = 0, bucket_width: int = 1):
        super().__init__()
        if max_tokens < 1 or max_samples < 0 or bucket_width < 1:
            raise ConfigError(f"TokenBudget: max_tokens >= 1, max_samples >= 0 and bucket_width >= 1 "
                              f"needed, got {max_tokens}, {max_samples}, {bucket_width}")
        self.max_tokens, self.max_samples, self.bucket_width = max_tokens, max_samples, bucket_width

    def prepare(self, dataset):
        lengths = np.asarray(dataset.lengths(), dtype=np.int64)
        if lengths.shape[:1] != (self.num_samples,) or lengths.ndim > 2:
            raise ConfigError(f"TokenBudget: the reader gave lengths of shape {list(lengths.shape)} "
                              f"for {self.num_samples} samples")
        cols = lengths.reshape(self.num_samples, -1)
        w = self.bucket_width
        cost = -(-cols.max(axis=1) // w) * w
        too_long = np.nonzero(cost > self.max_tokens)[0]
        if len(too_long):
            i = int(too_long[0])
            raise ConfigError(f"TokenBudget: sample {i} has {int(cost[i])} tokens, more than max_tokens="
                              f"{self.max_tokens} ({len(too_long)} such samples); raise max_tokens or "
                              f"filter long samples in the reader")
        keys = [np.arange(self.num_samples)] + [cols[:, j] for j in range(cols.shape[1] - 1, -1, -1)] + [cost]
        order = np.lexsort(keys)   # by cost, then each length, then index
        self.packed, batch, longest = [], [], 0
        for i in order.tolist():
            longest_with = max(longest, int(cost[i]))
            full = self.max_samples and len(batch) == self.max_samples
            if batch and (full or (len(batch) + 1) * longest_with > self.max_tokens):
                self.packed.append(np.array(batch, dtype=np.int64))
                batch, longest_with = [], int(cost[i])
            batch.append(i)
            longest = longest_with
        if batch:
            self.packed.append(np.array(batch, dtype=np.int64))

    def make_batches(self):
        order = self.rng().permutation(len(self.packed)) if self.shuffle else range(len(self.packed))
        return self.split([self.packed[i] for i in order])


@SAMPLERS.register("AspectRatioGroup")
class AspectRatioGroup(_BatchSampler):
    """Batches whose images share an aspect-ratio group, so padding to the batch's largest image
    wastes little (the grouping of Detectron / torchvision's detection references).

    Groups are the intervals of width/height cut at `boundaries` ([1.0]: portrait and landscape).
    Per (seed, epoch) the samples are permuted and dealt into their group's batch, which is emitted
    when it holds `batch_size` samples; the partial batches left at the end follow (dropped with
    `drop_last`). The number of batches is therefore the same every epoch.

    Args:
        boundaries: increasing width/height ratios cutting the groups (`[1.0]`: portrait and
            landscape).
    """

    def __init__(self, boundaries: list = [1.0]):  # noqa: B006 (never mutated; the validator reads it)
        super().__init__()
        if list(boundaries) != sorted(boundaries):
            raise ConfigError(f"AspectRatioGroup: boundaries must be increasing, got {boundaries}")
        self.boundaries = [float(b) for b in boundaries]

    def prepare(self, dataset):
        ratios = np.asarray(dataset.aspect_ratios(), dtype=np.float64)
        if ratios.shape != (self.num_samples,):
            raise ConfigError(f"AspectRatioGroup: the reader gave {ratios.shape} aspect ratios for "
                              f"{self.num_samples} samples")
        self.groups = np.digitize(ratios, self.boundaries)

    def make_batches(self):
        order = self.rng().permutation(self.num_samples) if self.shuffle else np.arange(self.num_samples)
        batches, pending = [], {}
        for i in order.tolist():
            buf = pending.setdefault(int(self.groups[i]), [])
            buf.append(i)
            if len(buf) == self.batch_size:
                batches.append(np.array(buf, dtype=np.int64))
                buf.clear()
        if not self.drop_last:
            batches += [np.array(buf, dtype=np.int64) for _, buf in sorted(pending.items()) if buf]
        return self.split(batches)
