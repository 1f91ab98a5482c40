"""Building and loading the fused operators' shared library (csrc/ops.cc, csrc/dnnl.cc).

`make ops` (python -m ops) builds it ahead of time; otherwise the first fused call builds it.
Both use the same cache and lock: the library is compiled with the machine's g++ (-O3 -march=native
-fopenmp) under `$ZOO_FAST_OPS_DIR`, else `$PADDLE_ZOO_HOME/fast_ops`, else
`~/.cache/paddle_zoo/fast_ops` (the temp folder when that is not writable), in a folder named by a
hash of the sources, the flags, the paddle build and the CPU; concurrent processes (DataLoader
workers, data-parallel ranks, test sessions) wait on a file lock and build it once. A failed build
logs one warning and every operator takes its pure Paddle reference.

csrc/dnnl.cc (matmul and convolution on the libdnnl.so.3 the paddle wheel bundles) needs oneDNN's C++
headers, which the wheel lacks: requirements.txt installs them (onednn-devel-cpu-gomp) into the
environment's include/, or `$ZOO_ONEDNN_INCLUDE` names a folder holding oneapi/dnnl/dnnl.hpp.
Without them the library is built from ops.cc alone and matmul / convolution take paddle's kernels.
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
import time

import paddle

log = logging.getLogger("zoo")

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, "csrc", name) for name in ("ops.cc", "dnnl.cc")]
HEADERS = [os.path.join(HERE, "csrc", "bf16.h")]   # included by the sources: part of the library's key
DNNL = "libdnnl.so.3"
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c++17", "-w", "-DNDEBUG",
            "-DPADDLE_WITH_CUSTOM_KERNEL", "-DPADDLE_EXTENSION_NAME=zoo_fast_ops", "-D_GLIBCXX_USE_CXX11_ABI=1"]
_AVX512_CORE, _AVX512_CORE_BF16 = 0x27, 0xe7   # oneDNN's dnnl_cpu_isa_t values
# loaded: None (not tried), True or False; dnnl: the oneDNN operators are in it; flush: the FTZ/DAZ
# mode asked for (None: leave the threads alone), applied again to a library loaded later
state = {"loaded": None, "error": None, "dnnl": False, "path": None, "flush": None, "warned": False}


def _paddle_root():
    return os.path.dirname(paddle.__file__)


def cache_dir():
    if os.environ.get("ZOO_FAST_OPS_DIR"):
        return os.environ["ZOO_FAST_OPS_DIR"]
    home = os.environ.get("PADDLE_ZOO_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "paddle_zoo")
    return os.path.join(home, "fast_ops")


def onednn_isa():
    """oneDNN's effective ISA here (dnnl_cpu_isa_t bits, within ONEDNN_MAX_CPU_ISA), asked of the libdnnl
    paddle bundles through its C API; None where paddle bundles none."""
    path = os.path.join(_paddle_root(), "libs", DNNL)
    if not os.path.isfile(path):
        return None
    return int(ctypes.CDLL(path).dnnl_get_effective_cpu_isa())


def cxxflags():
    """CXXFLAGS, and where ONEDNN_MAX_CPU_ISA keeps oneDNN below the CPU's ISA, without the instructions
    the cap excludes: our own loops then compute as on a CPU of that level, as oneDNN's kernels do
    (`make test-isa`); each cap has its own build (library_path's key)."""
    isa = onednn_isa()
    if isa is None:
        return CXXFLAGS
    if isa & _AVX512_CORE != _AVX512_CORE:
        return CXXFLAGS + ["-mno-avx512f"]
    if isa & _AVX512_CORE_BF16 != _AVX512_CORE_BF16:
        return CXXFLAGS + ["-mno-avx512bf16"]
    return CXXFLAGS


def _cpu_key():
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return "".join(lines)


def onednn_headers():
    """The folder holding oneapi/dnnl/dnnl.hpp, or None (see the module docstring)."""
    given = os.environ.get("ZOO_ONEDNN_INCLUDE")
    roots = [given] if given else [os.path.join(r, "include")
                                   for r in (sysconfig.get_paths()["data"], sys.prefix, sys.base_prefix)]
    for folder in roots:
        if os.path.isfile(os.path.join(folder, "oneapi", "dnnl", "dnnl.hpp")):
            return folder
    return None


def sources():
    """ops.cc, and dnnl.cc when the paddle build bundles oneDNN and its headers are found; without
    them, one warning."""
    bundled = os.path.isfile(os.path.join(_paddle_root(), "libs", DNNL))
    if bundled and onednn_headers():
        return SOURCES
    if not state["warned"]:
        state["warned"] = True
        log.warning("fast_ops: no oneDNN %s; matmul and convolution take paddle's kernels "
                    "(the headers: pip install onednn-devel-cpu-gomp, see requirements.txt)",
                    "headers" if bundled else "library in this paddle build")
    return SOURCES[:1]


def compile_commands(out):
    """Compile with -fopenmp, then link against paddle's own OpenMP runtime (libiomp5, which also
    serves the GOMP entry points): one thread pool for MKL, paddle's kernels and ours. Linking
    libgomp instead gives a second pool whose threads fight MKL's spinning ones for the cores (the
    fused kernels slower with 2 threads than with 1: docs/performance.md#fused-operators). oneDNN's own OpenMP calls
    resolve to the same libiomp5 (paddle loads it first; checked: no extra threads, oneDNN nthr 2)."""
    root = _paddle_root()
    inc, libs, base = os.path.join(root, "include"), os.path.join(root, "libs"), os.path.join(root, "base")
    srcs = sources()
    objs = [f"{out[:-3]}.{i}.o" for i in range(len(srcs))]
    dnnl_inc = [f"-I{onednn_headers()}"] if len(srcs) > 1 else []
    commands = [["g++", *cxxflags(), f"-I{inc}", f"-I{os.path.join(inc, 'third_party')}", *dnnl_inc,
                 f"-I{sysconfig.get_paths()['include']}", "-c", src, "-o", obj] for src, obj in zip(srcs, objs)]
    dnnl = [f"-l:{DNNL}"] if len(srcs) > 1 else []
    commands.append(["g++", "-shared", *objs, "-o", out, f"-L{libs}", f"-L{base}", f"-Wl,-rpath,{libs}",
                     f"-Wl,-rpath,{base}", "-Wl,--no-as-needed", "-l:libiomp5.so", "-l:libpaddle.so", *dnnl,
                     "-Wl,--as-needed"])
    return commands, objs


def library_path():
    """Where this source, paddle build and CPU's library lives (built or not)."""
    digest = hashlib.sha256()
    for src in sources() + HEADERS:
        with open(src, "rb") as f:
            digest.update(f.read())
    digest.update((" ".join(cxxflags()) + " link: libiomp5 libdnnl").encode())
    digest.update(f"{paddle.__version__} {_paddle_root()} {sys.version} {_cpu_key()}".encode())
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
        # the first use on a machine (or after an upgrade of paddle) compiles for ~30-60 s: say so
        log.info("fast_ops: compiling the fused C++ operators for this CPU and paddle build (once; "
                 "cached in %s)...", folder)
        tic = time.perf_counter()
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        commands, objs = compile_commands(tmp)
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
        log.info("fast_ops: compiled in %.0f s", time.perf_counter() - tic)
    return path


def load():
    """Build if needed and register the operators with paddle; True when they are usable here."""
    if state["loaded"] is None:
        try:
            # paddle-private module, inside the try: a paddle without it takes the reference path
            from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op
            path = build()
            load_op_meta_info_and_register_op(path)
            state.update(loaded=True, dnnl=len(sources()) > 1, path=path)
            if state["flush"] is not None:
                _cdll().zoo_set_fp_mode(int(state["flush"]))
            log.info("fast_ops: fused C++ operators loaded (%s)", path)
        except Exception as e:   # noqa: BLE001 - any failure means: use the reference path
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]   # paddle's loader adds advice lines
            state.update(loaded=False, error=reason)
            log.warning("fast_ops: the C++ operators are not available (%s); using the pure Paddle path", reason)
    return state["loaded"]


def _cdll():
    """The loaded library through ctypes (the same handle paddle's loader opened) for its C entries."""
    if "cdll" not in state:
        state["cdll"] = ctypes.CDLL(state["path"])
        state["cdll"].zoo_threads_mxcsr.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_int]
        if state["dnnl"]:
            state["cdll"].zoo_conv_work_space.restype = ctypes.c_longlong
            state["cdll"].zoo_conv_work_space.argtypes = ([ctypes.POINTER(ctypes.c_int64)] * 5
                                                          + [ctypes.c_int64, ctypes.c_int, ctypes.c_int])
            state["cdll"].zoo_scratchpad_bytes.restype = ctypes.c_longlong
    return state["cdll"]


def set_threads(threads):
    """The operators' OpenMP threads (csrc/ops.cc and csrc/dnnl.cc read ZOO_FAST_OPS_THREADS; unset: every
    core); a process setting, like paddle's own thread count, so an environment variable; None or 0
    leaves it."""
    if threads:
        os.environ["ZOO_FAST_OPS_THREADS"] = str(int(threads))


def set_flush_denormals(on):
    """FTZ + DAZ (on) or neither (off) on every thread that runs one of our operators or oneDNN's
    kernels inside them: each operator sets its calling thread's MXCSR, OpenMP copies it to the
    workers (csrc/ops.cc, "floating-point mode"). engine.cpu.flush_denormals sets the thread that calls
    it; runtime.setup does both."""
    state["flush"] = bool(on)
    if state["loaded"]:
        _cdll().zoo_set_fp_mode(int(bool(on)))


def _isa(key, entry):
    """oneDNN's answer (a C entry of csrc/dnnl.cc), asked once; False without the library."""
    if not (load() and state["dnnl"]):
        return False
    if key not in state:
        state[key] = bool(getattr(_cdll(), entry)())
    return state[key]


def bf16_supported():
    """oneDNN's answer for this CPU (csrc/dnnl.cc, zoo_bf16_supported); False without the library."""
    return _isa("bf16", "zoo_bf16_supported")


def avx512():
    """Whether oneDNN's kernels here are AVX-512 ones (csrc/dnnl.cc, zoo_avx512); False without the library."""
    return _isa("avx512", "zoo_avx512")


def conv_work_space(x_shape, w_shape, strides, pads, dilations, math, groups=1, prepare=False):
    """Bytes of work space oneDNN's convolution of these shapes needs (the largest of its forward and
    two backward passes, with the configured threads; csrc/dnnl.cc, zoo_conv_work_space); -1 when
    oneDNN has no convolution for them, None without the library. `prepare`: also make and cache the
    primitives a first call would make (tests/test_fast_ops.py tells their code from the work space)."""
    if not (load() and state["dnnl"]):
        return None
    arrays = [(ctypes.c_int64 * len(v))(*[int(d) for d in v]) for v in (x_shape, w_shape, strides, pads, dilations)]
    return int(_cdll().zoo_conv_work_space(*arrays, int(groups), int(math), int(bool(prepare))))


def scratchpad_bytes():
    """Bytes of the one work space buffer our oneDNN primitives share (csrc/dnnl.cc, Context::scratchpad):
    the largest any of them has asked so far; None without the library."""
    if not (load() and state["dnnl"]):
        return None
    return int(_cdll().zoo_scratchpad_bytes())


def threads_mxcsr(n):
    """The MXCSR of the calling thread as our operators set it, and of `n` OpenMP threads in one of
    their parallel regions (what the guard's tests check); None without the library."""
    if not load():
        return None
    out = (ctypes.c_uint * n)()
    seen = _cdll().zoo_threads_mxcsr(out, n)
    return list(out)[:seen]
