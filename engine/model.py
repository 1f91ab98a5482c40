"""The model contract: what the engine may ask of a model, with a written default for each question.

Every registered model (and BERT's bare encoder) derives from `ZooModel` and overrides only what it
has; the engine calls these methods and never probes a model for attributes, so a misspelt hook is
an error in the model's own file rather than an ability silently missing.
"""
import dataclasses

import numpy as np
import paddle

from engine.errors import ConfigError


@dataclasses.dataclass
class Weights:
    """How files in other layouts load into the model (engine/weights/pretrained.py). Key patterns are
    regexes of OUR parameter names."""
    head_keys: list = ()      # a file may lack them or hold another shape (a head for another num_classes);
                              # an entry's own head_keys take precedence
    foreign_keys: list = ()   # another task's head in a file (pretraining heads when fine-tuning): dropped, logged
    layout_models: list = ()  # registry names whose entries are layouts of this model too
    layouts: list = ()        # unregistered `PretrainedEntry` objects used as layouts only (another framework's names)
    backbone: object = None   # a registered ZooModel under `backbone.`: its entries load into that part


@dataclasses.dataclass
class DataAgreement:
    """What must agree with the reader before the first step (engine.builder.check_agreement), so a
    mismatch is one line instead of an error inside the loss; None: nothing to check."""
    num_classes: int = None
    num_classes_key: str = "num_classes"   # the config key a mismatch names (a vocabulary: trg_vocab_size)
    vocab_size: int = None                 # rows of the embedding table
    max_seq_length: int = None             # positions of the position table: the reader's may not exceed it


class ZooModel(paddle.nn.Layer):
    """A registered model is called as `model(batch) -> dict`: the losses (total under `loss`) in
    train mode, the predictions in eval mode. A method left alone keeps the default written here."""

    def weights(self):
        """Default: only native files, every key required."""
        return Weights()

    def weights_hint(self, missing, unexpected):
        """What to change when a file fails to load with only these differences (our names of the
        model's keys the file lacks, and the file's keys the model lacks, after the layout's key map),
        e.g. an option of the model that drops layers such a file has not: one short sentence, which
        replaces the `--weights-format` hint in the error. Default: None (no idea)."""
        return None

    def data_agreement(self):
        """Default: nothing to compare with the reader."""
        return DataAgreement()

    def check_weights_config(self, config, vocab_rows, folder):
        """Called when the weights are a Hugging Face folder (config.json or model.safetensors in it)
        with what the engine read there (engine.weights.pretrained.read_folder_config): `config` the parsed
        config.json (None: the folder has none), `vocab_rows` the lines of its vocab.txt (None: no
        vocab.txt); `folder` only names the files in a message. Raise a ConfigError where they
        disagree with the model (BERT: config.json against the recipe). Default: no check."""

    def export_spec(self, example=None):
        """{"inputs": {batch key: InputSpec}, "outputs": [keys], optional "max_shape", "programs",
        "settings"} (deploy/export.py). Default: the model cannot be exported."""
        raise ConfigError(f"model {type(self).__name__} cannot be exported (it has no export_spec)")

    # A model whose prediction is Python around the networks of its "programs" (windows and scales,
    # proposals and NMS) writes that Python once, as a static method `run_exported(run, batch,
    # settings) -> predictions` over calls `run(name, inputs) -> {output: tensor}`: its eval forward
    # calls it with its own methods, and the default exported_runner with the exported programs.
    run_exported = None

    @classmethod
    def exported_runner(cls, programs, settings):
        """`run(feeds) -> predictions` (numpy) over the exported `programs` of a spec with "programs";
        `programs[name](feeds)` takes numpy or paddle.Tensor feeds and gives the same kind back (tensors
        stay on the device: deploy/predictor.Program).
        Default: `run_exported` around them (`pipeline_runner`), or None where the model has none."""
        return None if cls.run_exported is None else pipeline_runner(cls.run_exported, programs, settings)


class NormLayer(paddle.nn.Layer):
    """Base of a custom normalisation layer: its parameters are exempt from weight decay under the
    "norm" rule, as paddle's norm layers' are (engine.training.optim.split_decay)."""


def pipeline_runner(pipeline, programs, settings):
    """The predictor's runner for a model whose prediction is `pipeline(run, batch, settings)`: the
    same Python, with `run(name, inputs) -> {output: tensor}` running the exported program `name` on
    tensors (`programs[name](tensor feeds) -> {output: tensor}`: one program's outputs reach the next
    without a copy through the host). Predictions come back as numpy (a list of arrays where the
    model gives one tensor per image)."""
    def run(name, inputs):
        return programs[name]({k: v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v) for k, v in inputs.items()})

    def runner(feeds):
        with paddle.no_grad():
            preds = pipeline(run, feeds, settings)
        return {k: [_numpy(t) for t in v] if isinstance(v, list) else _numpy(v) for k, v in preds.items()}
    return runner


def _numpy(value):
    return value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value)


def recomputed(layer, *args):
    """`layer(*args)` in training whose activations are recomputed during backward instead of kept
    (activation checkpointing). paddle's non-reentrant recompute (saved-tensor hooks): the reentrant
    one fails inside DataParallel's gradient reducer. The RNG state is restored for the second run,
    so its dropout masks are the first run's and the gradients those of a plain step."""
    # paddle.distributed loads its collective machinery: only a recomputing model needs it
    from paddle.distributed.fleet.utils import recompute
    return recompute(layer, *args, use_reentrant=False)


def unwrap(model):
    """The model inside paddle.DataParallel (which keeps it as `_layers`)."""
    return model._layers if isinstance(model, paddle.DataParallel) else model
