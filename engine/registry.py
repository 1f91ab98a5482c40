"""Explicit registries: components register with a decorator, and an unknown name lists the known ones.

Nothing is imported behind the user's back: `engine.components.load_all()` imports the modules each
component package lists (and a recipe's `custom_imports`), so a component whose module is not listed
is simply not available (and a test fails).
"""
from engine.errors import ConfigError, did_you_mean


class Registry:
    def __init__(self, kind):
        self.kind = kind
        self._items = {}

    def register(self, name=None):
        def deco(obj):
            key = name or obj.__name__
            if key in self._items and self._items[key] is not obj:
                raise KeyError(f"{self.kind} '{key}' registered twice")
            self._items[key] = obj
            return obj
        return deco

    def get(self, name):
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "none"
            raise ConfigError(f"unknown {self.kind} '{name}'{did_you_mean(name, self._items)}; "
                              f"known: {known}")
        return self._items[name]

    def names(self):
        return sorted(self._items)

    def values(self):
        """The registered objects in registration order."""
        return list(self._items.values())

    def name_of(self, obj):
        """The name `obj` is registered under, or None."""
        return next((name for name, item in self._items.items() if item is obj), None)

    def __contains__(self, name):
        return name in self._items

    def build(self, cfg, **extra):
        """cfg is a dict with `name` plus the component's keyword arguments."""
        cfg = dict(cfg)
        cls = self.get(cfg.pop("name"))
        return cls(**cfg, **extra)


MODELS = Registry("model")
DATASETS = Registry("reader")
TRANSFORMS = Registry("transform")
COLLATES = Registry("collate")
METRICS = Registry("metric")
OPTIMIZERS = Registry("optimizer")
LR_SCHEDULES = Registry("lr schedule")
SAMPLERS = Registry("sampler")
OUTPUTS = Registry("output writer")
