"""Fused C++ CPU operators for training (ops.cc), each with its pure Paddle reference beside it.

Why here: the kernels are shared by several model families (BERT, the Transformer, every ResNet), the
runtime config (`runtime.fast_ops`, engine/runtime.py) selects them, and models already depend on
engine/, never the reverse. Every function below takes the fast path only when all of these hold:
the switch is on (`set_enabled`, done by runtime.setup from the config; off until then), the graph is
dynamic (export and `to_static` always trace the reference path, so exported programs need no custom
library), the tensors are float32 on the CPU, and the library built. Otherwise it runs the
reference, which is also what the tests compare against.

`matmul` (and so `linear`) and `conv2d` run on oneDNN (dnnl.cc; the libdnnl.so.3 the paddle
wheel bundles, its headers from onednn-devel-cpu-gomp) instead of paddle's MKL 2019 GEMMs and
im2col convolutions: 1.6-2.0x faster GEMMs and ~2x faster 3x3 convolutions (forward + backward) on
our AMD EPYC (benchmarks/kernel_shapes.py). Without that library or the headers, the library is
built without those two files and `matmul` / `conv2d` take paddle's kernels.

The library is compiled on first use with the machine's g++ (-O3 -march=native -fopenmp), cached
under `$ZOO_FAST_OPS_DIR`, else `$PADDLE_ZOO_HOME/fast_ops`, else `~/.cache/paddle_zoo/fast_ops` (the
temp folder when that is not writable), in a folder named by a hash of the sources, the flags, the
paddle build and the CPU; concurrent processes (DataLoader workers, data-parallel ranks, test
sessions) wait on a file lock and build it once. A failed build logs one warning and the reference
path is used.

No operator writes a subnormal float where the exact result is below float32's normal range (ops.cc
says why); `set_flush_denormals` (runtime.flush_denormals) adds FTZ/DAZ for the threads that run the
operators and oneDNN's kernels inside them (tests/test_denormals.py).
"""
import ctypes
import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile

import paddle
import paddle.nn.functional as F

log = logging.getLogger("zoo")

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, name) for name in ("ops.cc", "dnnl.cc")]
DNNL = "libdnnl.so.3"
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c++17", "-w", "-DNDEBUG",
            "-DPADDLE_WITH_CUSTOM_KERNEL", "-DPADDLE_EXTENSION_NAME=zoo_fast_ops", "-D_GLIBCXX_USE_CXX11_ABI=1"]
_state = {"enabled": False, "loaded": None, "error": None, "dnnl": False, "path": None, "flush": None}


def set_enabled(enabled, threads=None, flush_denormals=None):
    """Turn the fast path on or off for this process; `threads` for the operators' OpenMP loops;
    `flush_denormals` (True/False; None leaves it) for the threads that run the operators."""
    _state["enabled"] = bool(enabled)
    if threads:
        os.environ["ZOO_FAST_OPS_THREADS"] = str(int(threads))
    if flush_denormals is not None:
        set_flush_denormals(flush_denormals)
    return _state["enabled"]


def set_flush_denormals(on):
    """FTZ + DAZ (on) or neither (off) on every thread that runs one of our operators or oneDNN's
    kernels inside them: each operator sets its calling thread's MXCSR, OpenMP copies it to the
    workers (ops.cc, "floating-point mode"). engine.cpu.flush_denormals sets the thread that calls
    it; runtime.setup does both. Kept for a library loaded later."""
    _state["flush"] = bool(on)
    if _state["loaded"]:
        _library().zoo_set_fp_mode(int(bool(on)))


def _library():
    """The loaded library through ctypes (the same handle paddle's loader opened) for its C entries."""
    if "cdll" not in _state:
        _state["cdll"] = ctypes.CDLL(_state["path"])
        _state["cdll"].zoo_threads_mxcsr.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
    return _state["cdll"]


def threads_mxcsr(n):
    """The MXCSR of the calling thread as our operators set it, and of `n` OpenMP threads in one of
    their parallel regions (what the guard's tests check); None without the library."""
    if not load():
        return None
    out = (ctypes.c_uint * n)()
    seen = _library().zoo_threads_mxcsr(out, n)
    return list(out)[:seen]


def is_enabled():
    return _state["enabled"]


class enabled_as:
    """Context manager: the fast path on or off inside the block (tests, comparisons)."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.before = _state["enabled"]
        _state["enabled"] = bool(self.on)

    def __exit__(self, *exc):
        _state["enabled"] = self.before


def cache_dir():
    if os.environ.get("ZOO_FAST_OPS_DIR"):
        return os.environ["ZOO_FAST_OPS_DIR"]
    home = os.environ.get("PADDLE_ZOO_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "paddle_zoo")
    return os.path.join(home, "fast_ops")


def _cpu_key():
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return "".join(lines)


def _onednn_headers():
    """The folder holding oneapi/dnnl/dnnl.hpp, or None: the paddle wheel ships oneDNN's library but not
    its headers; requirements.txt installs them (onednn-devel-cpu-gomp, into the environment's include/)."""
    for root in (sysconfig.get_paths()["data"], sys.prefix, sys.base_prefix):
        folder = os.path.join(root, "include")
        if os.path.isfile(os.path.join(folder, "oneapi", "dnnl", "dnnl.hpp")):
            return folder
    return None


def _sources():
    """ops.cc, and the oneDNN operators (dnnl.cc: matmul, convolution) when the paddle build
    bundles oneDNN and its headers are installed; without them, one warning and paddle's own kernels."""
    libs = os.path.join(os.path.dirname(paddle.__file__), "libs")
    if os.path.isfile(os.path.join(libs, DNNL)) and _onednn_headers():
        return SOURCES
    if not _state.get("warned"):
        _state["warned"] = True
        log.warning("fast_ops: no oneDNN %s; matmul and convolution take paddle's kernels "
                    "(the headers: pip install onednn-devel-cpu-gomp, see requirements.txt)",
                    "headers" if os.path.isfile(os.path.join(libs, DNNL)) else "library in this paddle build")
    return SOURCES[:1]


def _compile_commands(out):
    """Compile with -fopenmp, then link against paddle's own OpenMP runtime (libiomp5, which also
    serves the GOMP entry points): one thread pool for MKL, paddle's kernels and ours. Linking
    libgomp instead gives a second pool whose threads fight MKL's spinning ones for the cores
    (measured: the fused kernels 3-10x slower with 2 threads than with 1). oneDNN's own OpenMP calls
    resolve to the same libiomp5 (paddle loads it first; checked: no extra threads, oneDNN nthr 2)."""
    root = os.path.dirname(paddle.__file__)
    inc, libs, base = os.path.join(root, "include"), os.path.join(root, "libs"), os.path.join(root, "base")
    sources = _sources()
    objs = [f"{out[:-3]}.{i}.o" for i in range(len(sources))]
    dnnl_inc = [f"-I{_onednn_headers()}"] if len(sources) > 1 else []
    commands = [["g++", *CXXFLAGS, f"-I{inc}", f"-I{os.path.join(inc, 'third_party')}", *dnnl_inc,
                 f"-I{sysconfig.get_paths()['include']}", "-c", src, "-o", obj] for src, obj in zip(sources, objs)]
    dnnl = [f"-l:{DNNL}"] if len(sources) > 1 else []
    commands.append(["g++", "-shared", *objs, "-o", out, f"-L{libs}", f"-L{base}", f"-Wl,-rpath,{libs}",
                     f"-Wl,-rpath,{base}", "-Wl,--no-as-needed", "-l:libiomp5.so", "-l:libpaddle.so", *dnnl,
                     "-Wl,--as-needed"])
    return commands, objs


def library_path():
    """Where this source, paddle build and CPU's library lives (built or not)."""
    digest = hashlib.sha256()
    for src in _sources():
        with open(src, "rb") as f:
            digest.update(f.read())
    digest.update((" ".join(CXXFLAGS) + " link: libiomp5 libdnnl").encode())
    digest.update(f"{paddle.__version__} {os.path.dirname(paddle.__file__)} {sys.version} {_cpu_key()}".encode())
    return os.path.join(cache_dir(), digest.hexdigest()[:16], "zoo_fast_ops.so")


def build(verbose=False):
    """Compile (once, under a lock) and return the library's path; raises RuntimeError on failure."""
    path = library_path()
    if os.path.isfile(path):
        return path
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK)
    except OSError:
        writable = False
    if not writable:   # a read-only home (CI containers): build under the temp folder instead
        folder = os.path.join(tempfile.gettempdir(), f"paddle_zoo_fast_ops_{os.getuid()}",
                              os.path.basename(folder))
        path = os.path.join(folder, os.path.basename(path))
        if os.path.isfile(path):
            return path
        os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(path):                 # another process built it while we waited
            return path
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        commands, objs = _compile_commands(tmp)
        try:
            for cmd in commands:
                if verbose:
                    print(" ".join(cmd))
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except (OSError, subprocess.TimeoutExpired) as e:
                    raise RuntimeError(f"g++ could not run: {e}") from None
                if proc.returncode:
                    first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
                    raise RuntimeError(f"g++ failed ({first})")
        except RuntimeError:
            os.unlink(tmp)
            raise
        finally:
            for obj in objs:
                if os.path.exists(obj):
                    os.unlink(obj)
        os.replace(tmp, path)
    return path


def load():
    """Build if needed and register the operators; True when they are usable in this process."""
    if _state["loaded"] is None:
        try:
            from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op
            path = build()
            load_op_meta_info_and_register_op(path)
            _state["loaded"], _state["dnnl"], _state["path"] = True, len(_sources()) > 1, path
            if _state["flush"] is not None:
                _library().zoo_set_fp_mode(int(_state["flush"]))
            log.info("fast_ops: fused C++ operators loaded (%s)", path)
        except Exception as e:   # noqa: BLE001 - any failure means: use the reference path
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]   # paddle's loader adds advice lines
            _state["loaded"], _state["error"] = False, reason
            log.warning("fast_ops: the C++ operators are not available (%s); using the pure Paddle path", reason)
    return _state["loaded"]


def active(*tensors):
    """Whether the fast path applies to these tensors now (see the module docstring)."""
    if not _state["enabled"] or not paddle.in_dynamic_mode():
        return False
    for t in tensors:
        if t.dtype != paddle.float32 or not t.place.is_cpu_place():
            return False
    return load()


def _run(name, *args):
    out = paddle._C_ops._run_custom_op(name, *args)
    return out if isinstance(out, (list, tuple)) else [out]


def _seed(p, training):
    if not training or not p:
        return 0, 0.0
    a, b = paddle.randint(0, 2 ** 31 - 1, [2], dtype="int64").tolist()   # paddle's generator: paddle.seed holds
    return (a << 31) | b, float(p)


_ACTS = {None: 0, "none": 0, "relu": 1, "gelu": 2}
_REF_ACTS = {0: lambda x: x, 1: F.relu, 2: lambda x: F.gelu(x, approximate=False)}


# ------------------------------------------------------------------------------------- functions
def bias_act(x, bias, act=None, p=0.0, training=True, keep=None):
    """dropout(act(x + bias)) over the last axis; act None, 'relu' or 'gelu' (exact erf)."""
    code = _ACTS[act]
    if keep is None and active(x, bias):
        seed, p = _seed(p, training)
        return _run("zoo_bias_act", x, bias, code, seed, p)[0]
    return _dropout(_REF_ACTS[code](x + bias), p, training, keep)


def matmul(x, y, transpose_x=False, transpose_y=False):
    """paddle.matmul(x, y, transpose_x, transpose_y) on oneDNN (dnnl.cc), forward and backward, for the
    two forms our layers use: a 2-D `y` (x's leading axes fold into the rows of one GEMM, unless
    transpose_x) and batched operands with the same leading axes. Other shapes (broadcast batch axes,
    1-D operands) take paddle.matmul."""
    if active(x, y) and _state["dnnl"] and x.ndim >= 2 and (
            (y.ndim == 2 and not transpose_x) or (y.ndim == x.ndim and x.shape[:-2] == y.shape[:-2])):
        return _run("zoo_matmul", x, y, bool(transpose_x), bool(transpose_y))[0]
    return paddle.matmul(x, y, transpose_x, transpose_y)


def linear(x, weight, bias=None, act=None, p=0.0, training=True):
    """dropout(act(x @ weight + bias)): the matmul (oneDNN), then bias, activation and dropout in one
    kernel (its bias gradient is a vectorised column sum; paddle's is a slow row reduction on CPU)."""
    if bias is not None and active(x, weight, bias):
        seed, p = _seed(p, training)
        return _run("zoo_bias_act", matmul(x, weight), bias, _ACTS[act], seed, p)[0]
    y = matmul(x, weight) if bias is None else F.linear(x, weight, bias)
    return _dropout(_REF_ACTS[_ACTS[act]](y), p, training)


def bias_dropout_residual(x, bias, residual, p=0.0, training=True, keep=None):
    """residual + dropout(x + bias). `keep` (reference only): a given uint8/bool keep-mask."""
    if keep is None and active(x, bias, residual):
        seed, p = _seed(p, training)
        return _run("zoo_bias_dropout_residual", x, bias, residual, seed, p)[0]
    return residual + _dropout(x + bias, p, training, keep)


def bias_dropout_residual_ln(x, bias, residual, weight, norm_bias, p=0.0, eps=1e-5, training=True, keep=None):
    """LayerNorm(residual + dropout(x + bias)) * weight + norm_bias: a post-norm transformer's add & norm."""
    if keep is None and active(x, bias, residual, weight, norm_bias):
        seed, p = _seed(p, training)
        return _run("zoo_bias_dropout_residual_ln", x, bias, residual, weight, norm_bias, seed, p, float(eps))[0]
    h = residual + _dropout(x + bias, p, training, keep)
    return F.layer_norm(h, h.shape[-1:], weight, norm_bias, eps)


def layer_norm(x, weight, bias, eps=1e-5):
    if active(x, weight, bias):
        return _run("zoo_layer_norm", x, weight, bias, float(eps))[0]
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def softmax_dropout(scores, mask, scale=1.0, p=0.0, training=True, keep=None):
    """dropout(softmax(scores * scale + mask, axis=-1)) for scores [B, H, S, T] and an additive mask
    that broadcasts as [B or 1, 1, S or 1, T] (a [S, T] mask is taken as [1, 1, S, T])."""
    if mask is not None and mask.ndim == 2:
        mask = mask.unsqueeze([0, 1])
    if keep is None and mask is not None and scores.ndim == 4 and active(scores, mask):
        seed, p = _seed(p, training)
        return _run("zoo_softmax_dropout", scores, mask, float(scale), seed, p)[0]
    z = scores * scale if scale != 1.0 else scores
    probs = F.softmax(z + mask if mask is not None else z, axis=-1)
    return _dropout(probs, p, training, keep)


def smooth_cross_entropy(logits, labels, eps=0.0):
    """Per-row (label-smoothed loss, nll) of `logits` [..., V] and int64 `labels` [...], with
    q = (1 - eps) one_hot + eps / V: -sum_v q_v log p_v = nll + eps * (logit_label - mean_v logit_v).
    A label of -1 is ignored (0, no gradient). The fused kernel makes one pass over the logits each
    way; the reference is paddle's fused cross entropy plus a gather and a mean (no log-softmax
    tensor: paddle's CPU log_softmax is ~10x slower than its cross entropy)."""
    if (active(logits) and labels.dtype == paddle.int64 and labels.place.is_cpu_place()
            and list(labels.shape) == list(logits.shape[:-1])):
        loss, nll, _ = _run("zoo_smooth_cross_entropy", logits, labels, float(eps))
        return loss, nll
    labels = labels.unsqueeze(-1)
    nll = F.cross_entropy(logits, labels, reduction="none", ignore_index=-1).squeeze(-1)
    if not eps:
        return nll, nll
    valid = labels.squeeze(-1) >= 0
    picked = paddle.take_along_axis(logits, labels.clip(min=0), axis=-1).squeeze(-1)
    smooth = paddle.where(valid, picked - logits.mean(axis=-1), paddle.zeros_like(picked))
    return nll + eps * smooth, nll


def _dropout(x, p, training, keep=None):
    if keep is not None:
        return x * keep.detach().astype(x.dtype) / (1.0 - p) if p else x
    return F.dropout(x, p, training=training) if p and training else x


def conv2d(x, conv):
    """conv(x) for a paddle Conv2D layer, through oneDNN's direct convolution (dnnl.cc) when the layer
    is NCHW with zero padding given as numbers and one group; other layers take the layer itself."""
    pads = conv._updated_padding
    fast = (conv._data_format == "NCHW" and conv._groups == 1 and conv._padding_mode == "zeros"
            and conv._padding_algorithm == "EXPLICIT" and len(pads) == 2 and x.ndim == 4)
    if fast and active(x, conv.weight) and _state["dnnl"]:
        y = _run("zoo_conv2d", x, conv.weight, list(conv._stride), list(pads), list(conv._dilation),
                 not x.stop_gradient)[0]
        return y if conv.bias is None else y + conv.bias.reshape([1, -1, 1, 1])
    return conv(x)


def batch_norm_act(x, bn, relu=True, residual=None):
    """act(bn(x) [+ residual]) for a paddle BatchNorm layer on NCHW input. The fused kernel covers
    training with batch statistics (the running statistics are updated as paddle's kernel does);
    inference, global statistics and other layouts take the reference path."""
    fast = (bn.training and not bn._use_global_stats and bn._data_format in ("NCHW", "NCL", "NC", "NCDHW")
            and bn.weight is not None and bn.bias is not None)
    args = (x, bn.weight, bn.bias, bn._mean, bn._variance) + ((residual,) if residual is not None else ())
    if fast and active(*args):
        name = "zoo_bn_act" if residual is None else "zoo_bn_add_act"
        return _run(name, *args, float(bn._momentum), float(bn._epsilon), bool(relu))[0]
    y = bn(x)
    if residual is not None:
        y = y + residual
    return F.relu(y) if relu else y
