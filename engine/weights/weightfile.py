"""Weight files read as data: `.pdparams`/`.pdopt` unpickled with an allow-list, `.npz` without pickle.

`paddle.load` unpickles, so a weight file could run any code on the machine that loads it. A state
dict written by `paddle.save` needs nothing but numpy arrays and dtypes, plain containers and scalars,
the `(name, array)` tuples paddle writes for tensors, and, for static-graph tensors, paddle's own
`eval("data", {"data": array})`. Those, and nothing else, are allowed here: a file that asks for
anything more is refused with one line naming the file and the global it asked for, before that
global is ever called. A file the user trusts is read in full with `trust=True` (the tools'
`--trust-weights` flag; never a config key), which is said once in the log.
"""
import _compat_pickle
import logging
import os
import pickle

import numpy as np
import paddle

from engine.errors import ConfigError

log = logging.getLogger("zoo")


class UnsafeWeights(ConfigError):
    """A weight file whose pickle asks for more than a state dict needs."""


def _paddle_eval(expr, namespace):
    """paddle.save writes a static-graph tensor as eval('data', {'data': array}): allow exactly that."""
    if expr == "data" and isinstance(namespace, dict) and set(namespace) == {"data"} \
            and isinstance(namespace["data"], np.ndarray):
        return namespace["data"]
    raise pickle.UnpicklingError(f"eval({expr!r}, ...) is not paddle's tensor record")


_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
          ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
          ("numpy._core.multiarray", "scalar")}
_BUILTINS = {"tuple", "list", "dict", "set", "frozenset", "bytearray", "bytes", "int", "float", "bool",
             "str", "complex", "slice"}
_ALLOWED = _NUMPY | {("builtins", n) for n in _BUILTINS} | {
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),            # protocol-2 pickles carry bytes as _codecs.encode(text, 'latin1')
}


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, f, path, extra=(), kind="weight file", hint="pass --trust-weights"):
        super().__init__(f, encoding="latin1")   # Python 2 pickles (older kits' files) carry latin-1 str
        self.path, self.extra, self.kind, self.hint = path, dict(extra), kind, hint

    def find_class(self, module, name):
        if (module, name) in _compat_pickle.NAME_MAPPING:   # Python 2 names in protocol-2 pickles
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in self.extra:
            return self.extra[(module, name)]
        if (module, name) == ("builtins", "eval"):
            return _paddle_eval
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnsafeWeights(f"{self.path}: refused to unpickle: it asks for {module}.{name}, which a "
                            f"{self.kind} never needs (only numpy arrays and plain containers are "
                            f"allowed); if you trust this file, {self.hint}")


def unpickle(path, trust=False, extra=(), kind="weight file", hint="pass --trust-weights"):
    """The object in the pickle file `path`, through the allow-list (or in full with `trust`).

    `extra`: {(module, name): callable} further globals allowed for this file (our own RNG records).
    `kind` and `hint` word the refusal for other pickled data (YouTube-8M's .pkl features).
    """
    if trust:
        _say_trusted(path)
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    with open(path, "rb") as f:
        try:
            return _StateUnpickler(f, path, extra, kind, hint).load()
        except UnsafeWeights:
            raise
        except pickle.UnpicklingError as e:
            raise UnsafeWeights(f"{path}: refused to unpickle: {e}; if you trust this file, {hint}") from None


_trusted = set()


def _say_trusted(path):
    key = os.path.abspath(path)
    if key not in _trusted:
        _trusted.add(key)
        log.warning("%s was fully unpickled (--trust-weights): it could have run code", path)


def _plain(obj):
    """paddle.save's structures as paddle.load(return_numpy=True) gives them: (name, array) tensor
    records become arrays; the structured-name table is dropped; split big tensors are joined."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], np.ndarray):
        return obj[1]
    if isinstance(obj, dict):
        obj = dict(obj)
        obj.pop("StructuredToParameterName@@", None)
        big = obj.pop("UnpackBigParamInfor@@", None)
        if big:
            for key, info in big.items():
                parts = [obj.pop(k) for k in info["slices"]]
                obj[key] = np.concatenate([np.asarray(_plain(p)).reshape(-1) for p in parts]).reshape(
                    info["OriginShape"])
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def read_state(path, trust=False):
    """A `.pdparams`/`.pdopt` (paddle.save) or `.npz` file as a dict of numpy arrays (nested for
    optimizer state), without running code from the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"weights file not found: {path}")
    try:
        if path.lower().endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
        else:
            state = _plain(unpickle(path, trust))
    except ConfigError:
        raise
    except Exception as e:  # a truncated or foreign file raises EOFError, UnpicklingError, ValueError ...
        msg = " ".join(str(e).split())[:160]
        raise ConfigError(f"cannot read weights file {path} (corrupt, truncated or not a state dict): "
                          f"{type(e).__name__}{': ' + msg if msg else ''}") from None
    if not isinstance(state, dict):
        raise ConfigError(f"weights file {path} holds a {type(state).__name__}, not a state dict")
    return state


def to_tensors(state):
    """Nested numpy state (an optimizer's) as paddle tensors; uint16 arrays are bfloat16 (paddle's rule)."""
    if isinstance(state, dict):
        return {k: to_tensors(v) for k, v in state.items()}
    if isinstance(state, np.ndarray):
        return paddle.to_tensor(state)
    return state
