"""A run assembled from a config once: the one place train, eval, infer, export and benchmark get
their runtime, model, weights, readers and metric from, so the tools differ only in what they do
with them. Export folders as runs (the recipe an export records, its programs on a backend) are
deploy/load.py's: training builds this Session and loads no inference backend."""
import dataclasses
import logging
import os

from engine import config, runtime
from engine.builder import build_loader, build_metric, build_model
from engine.components import load_all
from engine.errors import ConfigError
from engine.registry import DATASETS, OUTPUTS
from engine.weights.pretrained import load_pretrained

log = logging.getLogger("zoo")


class Session:
    """`Session.from_file(path, overrides)` in a tool (deploy.load.from_args where an export may stand
    for the recipe), `Session(cfg)` for a loaded config; then `setup()` once (threads, device, data
    parallel, seeds) before building anything."""

    def __init__(self, cfg, trust_weights=False, path="<config>"):
        self.cfg, self.trust_weights, self.path = cfg, trust_weights, path
        self.rt = None
        self._amp, self._readers = {}, {}

    @classmethod
    def from_file(cls, path, overrides=(), trust_weights=False):
        load_all()
        return cls(config.load(path, list(overrides)), trust_weights, path)

    def setup(self, device=None):
        """runtime.setup and the seeds; `device` overrides runtime.device (export traces on the CPU)."""
        rt_cfg = self.cfg.runtime if device is None else dataclasses.replace(self.cfg.runtime, device=device)
        self.rt = runtime.setup(rt_cfg)
        runtime.seed_all(self.cfg.runtime.seed)
        return self.rt

    @property
    def train_amp(self):
        """train.amp as this process runs it (runtime.resolve_amp, after setup)."""
        if "train" not in self._amp:
            self._amp["train"] = runtime.resolve_amp(self.cfg.train.amp, "train.amp")
        return self._amp["train"]

    @property
    def eval_amp(self):
        """eval.amp (over train.amp) as this process runs it: evaluation and inference. Read only by
        the tools that compute, so an export of a GPU fp16 recipe on a CPU is not refused."""
        if "eval" not in self._amp:
            self._amp["eval"] = runtime.resolve_amp(self.cfg.eval_amp, "eval.amp")
        return self._amp["eval"]

    def model(self, weights=None, weights_format=None, strict=True, log=print):
        """The recipe's model, with `weights` (a .pdparams file, a checkpoint or final/ directory, an
        entry name or a URL) loaded when given."""
        model = build_model(self.cfg["model"])
        if weights:
            self.load_weights(model, weights, weights_format, strict, log)
        return model

    def load_weights(self, model, weights, weights_format=None, strict=True, log=print):
        if os.path.isdir(weights) and os.path.isfile(os.path.join(weights, "model.pdparams")):
            weights = os.path.join(weights, "model.pdparams")
        return load_pretrained(model, weights, strict=strict, log=log, weights_format=weights_format,
                               trust=self.trust_weights)

    def reader(self, split):
        """reader.<split> resolved once per run: (the dataset's arguments, its LoaderSection)."""
        if split not in self._readers:
            self._readers[split] = config.split_reader(self.cfg, split)
        return self._readers[split]

    def loader(self, split, dataset=None, batch_size=None, sharded=True, workers=None):
        """(loader, dataset, sampler) of reader.<split>; `sharded` splits it over the ranks; `workers`
        replaces the split's num_workers (a server reads each request in its own process)."""
        world_size, rank = (self.rt["world_size"], self.rt["rank"]) if sharded and self.rt else (1, 0)
        reader = self.reader(split)
        if workers is not None:
            reader = (reader[0], dataclasses.replace(reader[1], num_workers=workers))
        return build_loader(self.cfg, split, self.cfg.runtime.seed, world_size, rank, dataset=dataset,
                            batch_size=batch_size, reader=reader, rt=self.rt)

    def scored_loader(self, split=None):
        """(loader, dataset) of the split evaluation scores: `split`, else the eval split, or val when
        the test split has no labels (GLUE's test files: inputs only, for the leaderboard)."""
        name = split or self.cfg.eval_split()
        loader, dataset, _ = self.loader(name)
        if dataset.labelled:
            return loader, dataset
        if split or "val" not in self.cfg["reader"]:
            raise ConfigError(f"reader.{name}: {type(dataset).__name__}'s {name} split has no labels to score; "
                              f"evaluate --split val (tools/infer.py predicts the {name} split)")
        log.info("reader.test has no labels (%s): evaluating reader.val", type(dataset).__name__)
        loader, dataset, _ = self.loader("val")
        return loader, dataset

    def calibration_loader(self, split, batch_size=None):
        """reader.<split>'s processing over reader.train's samples, in file order: what INT8
        calibration reads (the dataset's SOURCE_KEYS say which arguments name the samples)."""
        reader = self.cfg.get("reader") or {}
        for need in ("train", split):
            if need not in reader:
                raise ConfigError(f"the config has no reader.{need} section (calibration reads reader.train's "
                                  f"samples through reader.{split}'s processing)")
        train, processing = reader["train"], reader[split]
        if train.get("name") != processing.get("name"):
            raise ConfigError(f"reader.train is a {train.get('name')}, reader.{split} a {processing.get('name')}: "
                              f"calibration reads one dataset through the other's processing")
        source = DATASETS.get(processing["name"]).SOURCE_KEYS
        if not source:
            raise ConfigError(f"{processing['name']} does not declare SOURCE_KEYS (which arguments name its samples)")
        calib = {k: v for k, v in processing.items() if k not in source}
        calib.update({k: train[k] for k in source if k in train})
        cfg = {**self.cfg, "reader": {**reader, "calibration": calib}}
        try:
            return build_loader(cfg, "calibration", self.cfg.runtime.seed, batch_size=batch_size, rt=self.rt)
        except ConfigError as e:   # name the sections the user wrote, not ours
            raise ConfigError(str(e).replace("reader.calibration", f"calibration (reader.train's samples, "
                                                                   f"reader.{split}'s processing)")) from None

    def reader_class(self, split=None):
        """The dataset class of reader.<split> (default: the eval split)."""
        return DATASETS.get(self.reader(split or self.cfg.eval_split())[0]["name"])

    def input_dataset(self, inputs, split=None):
        """The eval split's (or `split`'s) reader over raw input files or folders (tools/infer.py); an
        unreadable input is named and skipped, the others predicted."""
        kwargs = dict(self.reader(split or self.cfg.eval_split())[0])
        dataset = DATASETS.get(kwargs.pop("name")).for_inputs(inputs, **kwargs)
        dataset.skip_bad = True
        return dataset

    def infer_writer(self):
        """The recipe's `infer:` writer (how predictions are written)."""
        if not self.cfg.get("infer"):
            raise ConfigError(f"{self.path}: the recipe has no infer section (how to write predictions, "
                              f"infer: {{name: WRITER}}; known writers: {', '.join(OUTPUTS.names())})")
        return OUTPUTS.build(self.cfg["infer"])

    def metric(self, dataset=None):
        return build_metric(self.cfg, dataset)

    def label_names(self, required=False):
        """The class names of the recipe's `labels:` file; None without one (or, unless `required`,
        when the file is absent: an export without data)."""
        path = self.cfg.get("labels")
        if not path or not (required or os.path.isfile(path)):
            return None
        if not os.path.isfile(path):
            raise ConfigError(f"labels file not found: {path}")
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
