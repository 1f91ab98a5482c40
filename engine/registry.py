"""Explicit registries: components register with a decorator, and an unknown name lists the known ones.

Nothing is imported behind the user's back: `engine.components.load_all()` imports the one explicit
list of component modules, so a component that is not listed there is simply not available (and a
test fails).
"""
import difflib


class ConfigError(Exception):
    """A bad config, file or value; tools print it as one line and exit non-zero."""


class SampleError(Exception):
    """One sample cannot be read; the message names the file (and offset where it helps)."""


def did_you_mean(name, choices):
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


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
