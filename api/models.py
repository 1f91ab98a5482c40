"""Any of the nine models from Python, for a loop of your own: `create_model` (as timm's create_model),
and `setup_cpu`, the CPU settings our trainer applies, in one call.

    from api.models import create_model
    model = create_model("tsn_r50_100e_k400")                   # a recipe, by its file's name
    model = create_model("tsn_r50_k400_3seg", pretrained=True)  # a pretrained entry, its weights loaded
    model = create_model("configs/video/tsn/tsn_demo.yaml", num_classes=10)
    loss = model(batch)["loss"]                                 # the model contract: a dict of losses

A model built by `create_model` computes with our fused CPU operators (ops/) and the trainer's thread,
denormal and MKL settings: `setup_cpu` with the recipe's `runtime` section, applied when the model is
made (never at import). One built otherwise (`MODELS.build`, `engine.builder.build_model`) gets them from
one call of `setup_cpu()`; without it, paddle's own CPU kernels run it (docs/getting-started.md, "Your
own training loop").
"""
import glob
import json
import os

from engine import config, runtime
from engine.builder import build_model
from engine.components import load_all
from engine.errors import ConfigError, did_you_mean
from engine.weights.pretrained import WEIGHTS, load_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipes():
    """{name: path} of every recipe under configs/ (name: the file's name without .yaml)."""
    paths = glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
    return {os.path.basename(p)[:-5]: p for p in sorted(paths) if "_base_" not in p.split(os.sep)}


def setup_cpu(num_threads=None, fast_ops=True, flush_denormals=True, keep_freed_memory=False):
    """The CPU settings of a training run of ours (engine.runtime.setup_cpu: the `runtime` keys of these
    names), for models used outside the tools; returns the number of threads. A process whose paddle
    is a GPU build keeps paddle's stride kernels for its GPU tensors."""
    section = config.RuntimeSection(num_threads=num_threads, fast_ops=fast_ops, flush_denormals=flush_denormals,
                                    keep_freed_memory=keep_freed_memory)
    return runtime.setup_cpu(section, runtime.resolve_device(section.device))


def create_model(name, pretrained=False, overrides=(), cpu=True, log=print, **model_args):
    """The model of a recipe or of a pretrained entry (tools/list_models.py lists both), in train mode.

    name: a recipe file, a recipe's name (configs/**/<name>.yaml), or a pretrained entry's name (the
        recipe that trained it builds the model; an entry without one, its model and `model_args`).
    pretrained: False; True: the entry `name`'s weights; or weights to load (a path, URL or entry name).
        Missing and unexpected keys are reported through `log`, and a head of another size is left
        initialised (engine.weights.pretrained.load_pretrained).
    overrides: `-o` style "a.b=value" strings on the recipe; model_args: keys of its `model` section
        (e.g. num_classes=10).
    cpu: apply `setup_cpu` with the recipe's `runtime` section first.
    """
    load_all()
    entry = WEIGHTS.get(name) if name in WEIGHTS else None
    found = recipes()
    if entry is not None:   # its recipe where that recipe builds the entry's model (not one that fine-tunes it)
        path = os.path.join(ROOT, entry.config) if entry.config else None
        if path and config.load(path)["model"]["name"] != entry.model:
            path = None
    elif os.path.isfile(str(name)):
        path = str(name)
    elif name in found:
        path = found[name]
    else:
        known = list(found) + WEIGHTS.names()
        raise ConfigError(f"create_model: '{name}' is neither a recipe file, a recipe name nor a pretrained "
                          f"entry{did_you_mean(name, known)} (python tools/list_models.py lists them)")
    if pretrained is True:
        if entry is None:
            mine = [e.name for e in WEIGHTS.values() if e.config and os.path.join(ROOT, e.config) == os.path.abspath(path)]
            raise ConfigError(f"create_model: pretrained=True takes a pretrained entry's name, '{name}' is a recipe"
                              + (f" (its entries: {', '.join(mine)})" if mine else " (no entry was trained by it)"))
        pretrained = entry.name
    if path is None:
        if overrides:
            raise ConfigError(f"create_model: '{name}' has no recipe to apply overrides to; pass model arguments")
        model_cfg, section = {"name": entry.model, **entry.model_args, **model_args}, config.RuntimeSection()
    else:
        extra = [f"model.{key}={json.dumps(value)}" for key, value in model_args.items()]
        cfg = config.load(path, [*overrides, *extra])
        model_cfg, section = cfg["model"], cfg.runtime
    if cpu:
        runtime.setup_cpu(section, runtime.resolve_device(section.device))
    model = build_model(model_cfg)
    if pretrained:
        load_pretrained(model, pretrained, log=log)
    return model
