"""From a validated config to objects: model, readers (DataLoader), metric."""
import logging

from engine.config import split_reader
from engine.data import SerialLoader, WorkerLoader, resolve_workers
from engine.model import unwrap
from engine.errors import ConfigError
from engine.registry import COLLATES, DATASETS, METRICS, MODELS, SAMPLERS

log = logging.getLogger("zoo")


def build_model(model_cfg):
    return MODELS.build(model_cfg)


def count_params(model):
    """Trainable parameters, tied tensors counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if not p.stop_gradient and id(p) not in seen:
            seen.add(id(p))
            total += _numel(p.shape)
    return total


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def build_dataset(cfg, split, seed=0, **overrides):
    dataset_cfg, _ = split_reader(cfg, split)
    return _dataset(dataset_cfg, seed, overrides)


def _dataset(dataset_cfg, seed, overrides=None):
    return DATASETS.build({"seed": seed, **dataset_cfg, **(overrides or {})})


def build_loader(cfg, split, seed=0, world_size=1, rank=0, dataset=None, batch_size=None, reader=None, rt=None):
    """A DataLoader whose order and augmentation derive from (seed, epoch, index) only; `reader` is
    reader.<split> as config.split_reader resolved it, when the caller holds it already; `rt` (what
    runtime.setup returned: device, threads) resolves `num_workers: auto` (the loader's `num_workers`;
    without it, as for a CPU process computing on every core: 0).

    Returns (loader, dataset, sampler); call `sampler.set_epoch` and `dataset.set_epoch` each epoch.
    """
    dataset_cfg, loader_cfg = reader or split_reader(cfg, split)
    dataset = dataset if dataset is not None else _dataset(dataset_cfg, seed)
    if len(dataset) == 0:
        raise ConfigError(f"reader.{split}: the dataset is empty")
    shuffle = loader_cfg.shuffle if loader_cfg.shuffle is not None else split == "train"
    sampler = SAMPLERS.build(loader_cfg.sampler or {"name": "Epoch"}).bind(
        dataset, batch_size or loader_cfg.batch_size, shuffle=shuffle,
        drop_last=loader_cfg.drop_last and split == "train", seed=seed, num_replicas=world_size, rank=rank)
    collate = COLLATES.build(loader_cfg.collate or {"name": "Stack"})
    rt = rt or {}
    workers, how = resolve_workers(loader_cfg.num_workers, rt.get("device", "cpu"), rt.get("threads"))
    if how:
        log.info("reader.%s.num_workers: auto = %d: %s", split, workers, how)
    if workers == 0:
        return SerialLoader(dataset, sampler, collate), dataset, sampler
    return WorkerLoader(dataset, sampler, collate, workers, loader_cfg.prefetch), dataset, sampler


def build_metric(cfg, dataset=None):
    """The recipe's metric, given the evaluation dataset it will score (annotations, references)."""
    if not cfg.get("metric"):
        raise ConfigError("the config has no metric section")
    metric = METRICS.build(cfg["metric"])
    if dataset is not None:
        metric.set_dataset(dataset)
    return metric


def check_agreement(model, dataset, split="train"):
    """Catch a model/reader mismatch before the first step instead of inside the loss."""
    agree = unwrap(model).data_agreement()
    want, have = agree.num_classes, dataset.num_classes
    if want is not None and have is not None and int(want) != int(have):
        key = agree.num_classes_key   # e.g. a vocabulary size
        raise ConfigError(f"model.{key} is {want} but reader.{split} ({type(dataset).__name__}) "
                          f"has {have} classes; make them agree (e.g. -o model.{key}={have})")
    want, have = agree.vocab_size, dataset.vocab_size
    if want is not None and have is not None and int(want) != int(have):
        raise ConfigError(f"model.vocab_size is {want} but the vocabulary of reader.{split} ({type(dataset).__name__}) "
                          f"has {have} tokens: the vocab file does not match the model's (and its weights') "
                          f"embedding table")
    want, have = agree.max_seq_length, dataset.max_seq_length
    if want is not None and have is not None and int(have) > int(want):
        raise ConfigError(f"reader.{split}.max_seq_length is {have}, more than the model's {want} positions "
                          f"(its position table): lower it, or build the model with more positions")
