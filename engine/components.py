"""The one explicit list of component modules. Add a new model, reader, transform or metric file here.

Importing a module registers what it defines; `load_all()` is called by the tools and the tests,
never at import time of the engine itself.
"""
import importlib

COMPONENT_MODULES = [
    "engine.optim",
    "readers.youtube8m",
    "metrics.youtube8m",
    "models.video.attention_lstm",
]

_loaded = False


def load_all():
    global _loaded
    if not _loaded:
        for name in COMPONENT_MODULES:
            importlib.import_module(name)
        _loaded = True
