"""Where the registered components come from, imported at run time (`load_all()`, called by the Session
and the tests), never when the engine itself is imported.

- The engine's own: samplers, collates, optimizers and LR schedules (ENGINE_MODULES).
- The component packages: a folder at the project's top, or inside one, whose `__init__.py` assigns
  `COMPONENTS`, a tuple of the modules it holds that register something (models, pretrained
  entries, readers, transforms, metrics, output writers) and of its sub-packages that declare their
  own, in the order they register. The declarations are read as plain data (no package is imported
  to find them); the engine imports what they list, so it names no component and no package, and
  adding a model touches only its own package.
- A recipe's `custom_imports` (MMAction2's key): modules outside the tree, imported when the config
  is loaded, before it is validated, so that their components register first (`import_custom`).

A module that registers something but is listed nowhere is simply not available; a test fails for one.
"""
import ast
import importlib
import os
import sys

from engine.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE_MODULES = ("engine.data", "engine.training.samplers", "engine.training.optim")

# custom_imports: key -> (type, default), as engine/config.py's key tables
CUSTOM_IMPORTS_KEYS = {
    "imports": (list, None),                  # dotted module names, found on sys.path or under the current directory
    "allow_failed_imports": (bool, False),    # a module that fails to import is a warning line, not an error
}

_loaded = False


def declared(folder):
    """The `COMPONENTS` tuple a package's `__init__.py` assigns, or None when it declares none."""
    path = os.path.join(folder, "__init__.py")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMPONENTS" for t in node.targets):
            value = ast.literal_eval(node.value)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: COMPONENTS must be a tuple of module names, got {value!r}")
            return tuple(value)
    return None


def component_modules(root=ROOT):
    """The dotted names of the modules the component packages under `root` list, in order: the
    top-level packages by name, each one's COMPONENTS in its own order (a sub-package in its place)."""
    out = []

    def walk(package, folder, names):
        for name in names:
            sub = os.path.join(folder, *name.split("."))
            inner = declared(sub) if os.path.isdir(sub) else None
            if os.path.isdir(sub):
                if inner is None:
                    raise ConfigError(f"{os.path.join(folder, '__init__.py')}: COMPONENTS lists the package "
                                      f"'{name}', whose __init__.py declares no COMPONENTS of its own")
                walk(f"{package}.{name}", sub, inner)
            elif os.path.isfile(sub + ".py"):
                out.append(f"{package}.{name}")
            else:
                raise ConfigError(f"{os.path.join(folder, '__init__.py')}: COMPONENTS lists '{name}', "
                                  f"which is neither a module nor a package there")

    for entry in sorted(os.listdir(root)):
        folder = os.path.join(root, entry)
        names = declared(folder) if os.path.isdir(folder) and not entry.startswith(".") else None
        if names is not None:
            walk(entry, folder, names)
    return out


def load_all():
    """Import the engine's own component modules and every declared one (once per process)."""
    global _loaded
    if not _loaded:
        for name in ENGINE_MODULES + tuple(component_modules()):
            importlib.import_module(name)
        _loaded = True


def import_custom(spec, where="custom_imports"):
    """Import the modules of a recipe's `custom_imports: {imports: [module, ...], allow_failed_imports:
    false}`: each a dotted name found on sys.path or under the current directory. A module that fails
    to import is a ConfigError naming it, or with `allow_failed_imports` a warning line."""
    if not spec:
        return
    if not isinstance(spec, dict) or not isinstance(spec.get("imports"), list) \
            or not all(isinstance(m, str) for m in spec["imports"]):
        raise ConfigError(f"{where}: expected {{imports: [module names], allow_failed_imports: false}}, got {spec!r}")
    unknown = set(spec) - set(CUSTOM_IMPORTS_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]}; known: {', '.join(CUSTOM_IMPORTS_KEYS)}")
    if os.getcwd() not in sys.path:   # as `python -m` would: a module of the user's own folder
        sys.path.append(os.getcwd())
    for name in spec["imports"]:
        try:
            importlib.import_module(name)
        except Exception as e:   # noqa: BLE001  any failure of the user's module is reported as theirs
            msg = f"{where}: cannot import '{name}' ({type(e).__name__}: {e})"
            if isinstance(e, ModuleNotFoundError) and e.name == name.split(".")[0]:
                msg += "; it must be importable from PYTHONPATH or the current directory"
            if not spec.get("allow_failed_imports"):
                raise ConfigError(msg) from None
            print(f"warning: {msg}; going on without it", file=sys.stderr)
