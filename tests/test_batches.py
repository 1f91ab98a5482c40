"""Batches that hold more than stacked tensors: ragged per-sample arrays, metadata, per-key padding,
the same structure from the serial and the worker loaders, and the samplers chosen in the config."""
import numpy as np
import paddle
import pytest

from engine import builder, config
from engine.components import load_all
from engine.data import PadImages, PadSequences, SampleDataset, SerialLoader, Skipped, Stack, WorkerLoader, collate, \
    finalize
from engine.errors import ConfigError, SampleError
from engine.training.samplers import AspectRatioGroup, EpochBatchSampler, TokenBudget

load_all()


class Shapes(SampleDataset):
    """Images of different sizes with label maps, boxes, token lists and metadata; sample 3 is broken."""

    def __init__(self, n=10, broken=(3,)):
        super().__init__(skip_bad=True)
        self.n, self.broken = n, set(broken)

    def __len__(self):
        return self.n

    def load(self, i):
        if i in self.broken:
            raise SampleError(f"shapes sample {i} is broken")
        h, w = 20 + i, 33 - 2 * i
        rng = np.random.default_rng(i)
        return {"image": rng.standard_normal((3, h, w)).astype(np.float32),
                "label": np.full((h, w), i, np.int64),
                "boxes": rng.uniform(0, 20, (i % 3, 4)).astype(np.float32),
                "tokens": np.arange(5 + i, dtype=np.int64),
                "polygons": [[np.ones((3, 2), np.float32) * i]],
                "file": f"img_{i}.png", "size": [h, w], "info": {"id": i}, "score": 0.5 * i}


COLLATE = PadImages(keys={"image": 0, "label": 255}, size_divisor=32, ragged=["boxes", "tokens"])


def _same(a, b, where="batch"):
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, paddle.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a.numpy(), b.numpy()), where
    elif isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


def test_serial_and_worker_loaders_give_the_same_ragged_batches():
    ds = Shapes()
    sampler = EpochBatchSampler(len(ds), 4, shuffle=True, seed=1)
    serial = list(SerialLoader(ds, sampler, COLLATE))
    workers = list(WorkerLoader(ds, sampler, COLLATE, num_workers=2))
    assert len(serial) == len(workers) == 3
    for a, b in zip(serial, workers):
        _same(a, b)
    batch = next(b for b in serial if 3 in b["skipped"])
    assert batch["num_skipped"] == 1 and 3 not in batch["index"].tolist()
    idx = batch["index"].tolist()
    assert isinstance(batch["boxes"], list) and all(isinstance(t, paddle.Tensor) for t in batch["boxes"])
    assert [t.shape[0] for t in batch["boxes"]] == [i % 3 for i in idx]
    assert [t.shape[0] for t in batch["tokens"]] == [5 + i for i in idx]
    assert batch["file"] == [f"img_{i}.png" for i in idx] and batch["info"] == [{"id": i} for i in idx]
    assert batch["size"] == [[20 + i, 33 - 2 * i] for i in idx]
    assert batch["polygons"][0][0][0].dtype == np.float32     # nested metadata stays numpy
    assert batch["score"].dtype == paddle.float64               # numbers are stacked


def test_image_padding_per_key_to_a_multiple():
    samples = [Shapes()[i] for i in (0, 5)]                     # 20x33 and 25x23
    b = COLLATE(samples)
    assert b["image"].shape == (2, 3, 32, 64) and b["label"].shape == (2, 32, 64)
    assert b["image_size"].tolist() == [[20, 33], [25, 23]] == b["label_size"].tolist()
    np.testing.assert_array_equal(b["image"][1, :, :25, :23], samples[1]["image"])
    assert (b["image"][1, :, 25:] == 0).all() and (b["image"][1, :, :, 23:] == 0).all()
    assert (b["label"][0, :20, :33] == 0).all() and (b["label"][0, 20:] == 255).all() \
        and (b["label"][0, :, 33:] == 255).all()
    assert (b["label"][1, :25, :23] == 5).all() and (b["label"][1, :, 23:] == 255).all()


def test_sequence_padding_per_key():
    samples = [{"ids": np.array([5, 6, 7]), "labels": np.array([1, -1, 2]), "index": np.int64(0)},
               {"ids": np.array([8]), "labels": np.array([3]), "index": np.int64(1)}]
    b = PadSequences({"ids": 0, "labels": -100}, multiple=4)(samples)
    assert b["ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert b["labels"].tolist() == [[1, -1, 2, -100], [3, -100, -100, -100]]
    assert b["ids_len"].tolist() == [3, 1] and b["ids_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    b = PadSequences(["ids"], pad_value=9, max_len=2, ragged=["labels"])(samples)
    assert b["ids"].tolist() == [[5, 6], [8, 9]] and b["ids_len"].tolist() == [2, 1]
    assert [x.tolist() for x in b["labels"]] == [[1, -1, 2], [3]]


def test_unequal_shapes_need_padding_or_ragged():
    samples = [Shapes()[i] for i in (0, 1)]
    with pytest.raises(SampleError, match="key 'boxes' has different shapes.*ragged"):
        Stack(ragged=["tokens"])([dict(s, image=0, label=0) for s in samples])
    with pytest.raises(SampleError, match="different keys"):
        collate([{"a": 1, "index": np.int64(0)}, {"b": 1, "index": np.int64(1)}])


def test_underscore_keys_and_skipped_samples():
    b = finalize(collate([Skipped(4, "a.mp4: no video stream"), {"x": np.ones(2), "_rng": 1, "index": np.int64(2)},
                          Skipped(7)]))
    assert "_rng" not in b and b["skipped"] == [4, 7] and b["num_skipped"] == 2 and b["index"].tolist() == [2]
    assert b["skip_reasons"] == ["a.mp4: no video stream", ""]
    assert finalize(collate([Skipped(1)])) == {"num_skipped": 1, "skipped": [1], "skip_reasons": [""]}


# -------------------------------------------------------------------------------- samplers

class Lengths:
    def __init__(self, lengths, ratios=None):
        self._lengths, self._ratios = np.asarray(lengths), ratios

    def __len__(self):
        return len(self._lengths)

    def lengths(self):
        return self._lengths

    def aspect_ratios(self):
        return self._ratios


def _epoch(sampler, epoch, start=0):
    sampler.set_epoch(epoch, start)
    return [list(b) for b in sampler]


@pytest.mark.parametrize("two_columns", [False, True])
def test_token_budget_sampler(two_columns):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, (300, 2) if two_columns else 300)
    cost = lengths.max(axis=1) if two_columns else lengths
    rounded = -(-cost // 4) * 4
    sampler = TokenBudget(max_tokens=120, bucket_width=4).bind(Lengths(lengths), shuffle=True, seed=5)
    first = _epoch(sampler, 0)
    for b in first:                                       # the budget counts padding: n x longest
        assert len(b) * rounded[b].max() <= 120
    assert sorted(i for b in first for i in b) == list(range(300))
    assert _epoch(sampler, 0) == first                    # deterministic under (seed, epoch)
    second = _epoch(sampler, 1)
    assert second != first and sorted(map(tuple, second)) == sorted(map(tuple, first))  # only the order
    assert len(sampler) == len(first) == len(second)
    assert _epoch(sampler, 1, start=7) == second[7:]      # resuming inside an epoch
    # similar lengths together: a batch spans at most one bucket width... plus the packing boundary
    spans = [rounded[b].max() - rounded[b].min() for b in first]
    assert np.mean(spans) <= 4
    ranks = [TokenBudget(max_tokens=120, bucket_width=4).bind(Lengths(lengths), shuffle=True, seed=5,
                                                              num_replicas=3, rank=r) for r in range(3)]
    per_rank = [_epoch(s, 1) for s in ranks]
    assert len({len(p) for p in per_rank}) == 1
    assert {i for p in per_rank for b in p for i in b} == set(range(300))


def test_token_budget_refuses_a_sample_over_budget():
    with pytest.raises(ConfigError, match="sample 2 has 50 tokens, more than max_tokens=40"):
        TokenBudget(max_tokens=40).bind(Lengths([3, 5, 50, 7]))


def test_aspect_ratio_grouping():
    rng = np.random.default_rng(1)
    ratios = np.where(rng.random(101) < 0.3, 0.75, 1.33)
    group = (ratios >= 1.0).astype(int)
    sampler = AspectRatioGroup().bind(Lengths(np.zeros(101), ratios), batch_size=4, shuffle=True, seed=2)
    first = _epoch(sampler, 0)
    assert all(len(set(group[b])) == 1 for b in first)    # one orientation per batch
    assert sorted(i for b in first for i in b) == list(range(101))
    n0, n1 = int((group == 0).sum()), int((group == 1).sum())
    assert len(first) == -(-n0 // 4) + -(-n1 // 4)        # the same count every epoch
    assert len(_epoch(sampler, 3)) == len(first) and _epoch(sampler, 3) != first
    assert _epoch(sampler, 0, start=5) == first[5:]
    dropped = AspectRatioGroup().bind(Lengths(np.zeros(101), ratios), batch_size=4, shuffle=True,
                                      drop_last=True, seed=2)
    assert all(len(b) == 4 for b in _epoch(dropped, 0)) and len(dropped) == n0 // 4 + n1 // 4
    ranks = [AspectRatioGroup().bind(Lengths(np.zeros(101), ratios), batch_size=4, shuffle=True, seed=2,
                                     num_replicas=2, rank=r) for r in range(2)]
    assert len(_epoch(ranks[0], 0)) == len(_epoch(ranks[1], 0))


def test_sampler_is_chosen_in_the_config(tmp_path, yt8m_demo):
    cfg = config.load("configs/video/attention_lstm/attention_lstm_demo.yaml",
                      ["reader.train.sampler={name: TokenBudget, max_tokens: 4000}"])
    with pytest.raises(ConfigError, match="YouTube8M' gives no sample lengths"):
        builder.build_loader(cfg, "train")
    with pytest.raises(ConfigError, match=r"reader.train.sampler.name: unknown sampler 'Tokens'"):
        config.load("configs/video/attention_lstm/attention_lstm_demo.yaml",
                    ["reader.train.sampler={name: Tokens}"])
    with pytest.raises(ConfigError, match=r"reader.train.sampler.max_token: unknown key"):
        config.load("configs/video/attention_lstm/attention_lstm_demo.yaml",
                    ["reader.train.sampler={name: TokenBudget, max_token: 5}"])
