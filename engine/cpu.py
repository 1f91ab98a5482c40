"""The CPU we run on, and the environment Paddle's bundled MKL needs on it (set before paddle loads).

MKL_DEBUG_CPU_TYPE=5 makes MKL take its AVX2 path on AMD CPUs, which it otherwise treats as generic,
more than twice as fast there; on Intel it would force that same path instead of AVX-512/AMX, so it is
set on AMD only (docs/performance.md#cpu-environment).
This module imports nothing heavy: the tools and the tests call it before importing paddle.
"""
import contextlib
import ctypes
import functools
import importlib.metadata
import os
import platform
import warnings


def cpu_info():
    """{'vendor': 'AuthenticAMD' | 'GenuineIntel' | ..., 'model': 'AMD EPYC ...', 'family': 25,
    'model_id': 17} from /proc/cpuinfo (family and model number: the microarchitecture, which a
    hypervisor's model name such as plain 'AMD EPYC' hides; None where unknown)."""
    info = {"vendor": "", "model": platform.processor(), "family": None, "model_id": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "vendor_id" and not info["vendor"]:
                    info["vendor"] = value
                elif key == "cpu family" and info["family"] is None and value.isdigit():
                    info["family"] = int(value)
                elif key == "model" and info["model_id"] is None and value.isdigit():
                    info["model_id"] = int(value)
                elif key == "model name":
                    info["model"] = value
                    break
    except OSError:
        pass
    return info


def cpu_flags():
    """The instruction-set flags /proc/cpuinfo lists for the first CPU (empty where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


# oneDNN's ISA levels (dnnl_types.h, dnnl_cpu_isa_t): a level allows every level whose bits it holds.
# ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) names the highest level oneDNN may use: paddle's oneDNN, ours
# (ops/) and OpenVINO's CPU plugin all read it, so a cap makes an Intel AMX machine compute as a
# Zen 3 (AVX2) or a Zen 4 (AVX512_CORE_BF16) does. ONNX Runtime's kernels read the CPU itself.
ONEDNN_ISA = {"SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xf, "AVX2_VNNI_2": 0x1f, "AVX512_CORE": 0x27,
              "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xe7, "AVX512_CORE_FP16": 0x1ef, "AVX10_1_512": 0x1ef,
              "AVX512_CORE_AMX": 0xfef, "AVX10_1_512_AMX": 0xfef, "AVX512_CORE_AMX_FP16": 0x1fef,
              "AVX10_1_512_AMX_FP16": 0x1fef}
# the CPU flag (/proc/cpuinfo) each level needs besides the one below it
ISA_FLAGS = {"AVX2": ("avx2",), "AVX512_CORE": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
             "AVX512_CORE_VNNI": ("avx512_vnni",), "AVX512_CORE_BF16": ("avx512_bf16",),
             "AVX512_CORE_AMX": ("amx_bf16", "amx_int8", "amx_tile")}


def isa_cap(env=None):
    """The ONEDNN_MAX_CPU_ISA (else DNNL_MAX_CPU_ISA) level in `env` (default os.environ), upper-case,
    or None where none is set or oneDNN would not know the name (it then ignores it, as we do)."""
    env = os.environ if env is None else env
    name = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return name if name in ONEDNN_ISA else None


def isa_allows(level, env=None):
    """Whether oneDNN may use ISA `level` (a key of ONEDNN_ISA) under the cap in `env`."""
    cap = isa_cap(env)
    return cap is None or ONEDNN_ISA[level] & ONEDNN_ISA[cap] == ONEDNN_ISA[level]


def isa_levels():
    """The caps this CPU can stand in for, lowest first: each level from AVX2 whose flags it has (a Zen 4:
    AVX2, AVX512_CORE, AVX512_CORE_BF16; an AMX Xeon: those and AVX512_CORE_AMX). `make test-isa` runs
    the ISA-sensitive tests under each (tests/isa.py)."""
    flags, levels = cpu_flags(), []
    for level in ("AVX2", "AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX"):
        need = ISA_FLAGS[level] + (ISA_FLAGS["AVX512_CORE_VNNI"] if level == "AVX512_CORE_BF16" else ())
        if not set(need) <= flags:
            break
        levels.append(level)
    return levels


def has_bf16(env=None):
    """Native bf16 arithmetic (AVX512_BF16 or AMX-BF16) within the ONEDNN_MAX_CPU_ISA of `env` (default
    os.environ; {}: the CPU itself): what oneDNN's bf16 kernels (paddle's, ours, OpenVINO's) need."""
    flags = cpu_flags()
    return bool(("avx512_bf16" in flags and isa_allows("AVX512_CORE_BF16", env))
                or ("amx_bf16" in flags and isa_allows("AVX512_CORE_AMX", env)))


def has_vnni(capped=False):
    """Integer dot products without saturation (AVX512_VNNI, AVX_VNNI or AMX-INT8). Without them, x86's
    u8 x s8 multiply-add (vpmaddubsw) saturates its 16-bit pair sums, which INT8 kernels meet unless the
    weights use 7 bits (ONNX Runtime's `reduce_range`, NNCF's overflow fix). `capped`: as oneDNN's
    kernels see the CPU, within ONEDNN_MAX_CPU_ISA (OpenVINO's); ONNX Runtime's read the CPU itself."""
    flags = cpu_flags()
    if not capped:
        return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    return bool(("avx512_vnni" in flags and isa_allows("AVX512_CORE_VNNI"))
                or ("avx_vnni" in flags and isa_allows("AVX2_VNNI"))
                or ("amx_int8" in flags and isa_allows("AVX512_CORE_AMX")))


def mkl_environment(env=None):
    """The MKL setting for this CPU added to `env` (default: os.environ); a value the user set wins.

    Also FLAGS_use_stride_kernel=0 where paddle is a CPU build: with paddle 3's stride kernels a
    transpose or slice is a view, and the copy a later op makes of it takes a slow strided path on CPU
    (docs/performance.md#cpu-environment: the Transformer's step twice as fast without). A GPU build (paddlepaddle-gpu) keeps paddle's default, which its GPU kernels are made for;
    runtime.setup turns the flag off there when the run's device is the CPU.
    """
    env = mkl_cpu_type(env)
    if not paddle_gpu_build():
        env.setdefault("FLAGS_use_stride_kernel", "0")
    return env


def mkl_cpu_type(env=None):
    """MKL_DEBUG_CPU_TYPE=5 in `env` (default os.environ) on AMD (the module docstring), unless set."""
    env = os.environ if env is None else env
    if cpu_info()["vendor"] == "AuthenticAMD":
        env.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    return env


def paddle_gpu_build():
    """Whether the installed paddle is the CUDA build, found without importing paddle (this module
    runs before it loads): the paddlepaddle-gpu distribution."""
    try:
        importlib.metadata.version("paddlepaddle-gpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def process_environment(env=None):
    """What a process of ours sets before paddle loads (a tool, a benchmark, the children they start):
    mkl_environment's settings and paddle's C++ log level, in `env` (default: os.environ); a value
    already there wins."""
    env = mkl_environment(env)
    env.setdefault("GLOG_minloglevel", "2")
    return env


def before_paddle():
    """process_environment() for this process, and the two warnings that are not the user's business:
    paddle's build-tool hint at import and the BatchNorm notice printed on every training forward."""
    process_environment()
    warnings.filterwarnings("ignore", message="No ccache found")
    warnings.filterwarnings("ignore", message="When training, we now always track global mean")


@functools.lru_cache(maxsize=1)
def _libc():
    """glibc, loaded once (keep_freed_memory, trim_heap); None where it cannot be loaded."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep_freed_memory(limit=1 << 30):
    """Let glibc keep freed blocks (up to `limit` bytes each) in the process heap instead of unmapping
    them. Paddle's CPU allocator returns every tensor to malloc; a block above glibc's mmap threshold
    is unmapped on free and faulted in again page by page when the next step asks for it (the
    Transformer's [tokens, vocabulary] logits among them). The price is the heap's fragmentation:
    blocks of many sizes in one heap leave holes a larger request cannot use, so the heap (and the
    peak) grows past what is alive. `runtime.keep_freed_memory` (default false; the BERT and
    Transformer recipes set it) decides: each step a little faster for more peak memory, the trade
    measured per model in docs/performance.md#cpu-environment.
    False off glibc."""
    libc = _libc()
    m_trim_threshold, m_mmap_threshold = -1, -3
    try:
        return bool(libc and libc.mallopt(m_mmap_threshold, int(limit)) and libc.mallopt(m_trim_threshold, int(limit)))
    except AttributeError:
        return False


def trim_heap():
    """Give the free pages inside glibc's heaps back to the system (malloc_trim(0)). With
    `runtime.keep_freed_memory` false the trainer calls it after each forward: the blocks the forward
    freed below glibc's mmap threshold stay in the heap as holes, resident through the backward where
    the peak is; trimming them costs little of a step (docs/performance.md#cpu-environment). False off
    glibc."""
    libc = _libc()
    try:
        return bool(libc and libc.malloc_trim(0))
    except AttributeError:
        return False


# MXCSR bits: flush-to-zero (results below float32's normal range are written as 0) and
# denormals-are-zero (subnormal operands are read as 0); in glibc's x86-64 fenv_t, MXCSR is at byte 28.
FTZ, DAZ = 0x8000, 0x0040
_FENV_SIZE, _MXCSR_AT = 32, 28


def _fenv():
    """(libm, the calling thread's fenv_t buffer, its MXCSR), or None off x86-64 glibc."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        libm = ctypes.CDLL("libm.so.6")
    except OSError:
        return None
    env = ctypes.create_string_buffer(_FENV_SIZE)
    if libm.fegetenv(env):
        return None
    return libm, env, int.from_bytes(env.raw[_MXCSR_AT:_MXCSR_AT + 4], "little")


def mxcsr():
    """The calling thread's MXCSR, or None off x86-64 glibc."""
    got = _fenv()
    return got and got[2]


@contextlib.contextmanager
def ieee_denormals():
    """FTZ and DAZ off in the calling thread for the block, then as they were: for a library that moves
    integers through float instructions (OpenVINO 2026.4.1's Where on int64: small integers are
    denormal bit patterns, read as 0 under DAZ)."""
    before = mxcsr()
    if before is None or not before & (FTZ | DAZ):
        yield
        return
    flush_denormals(False)
    try:
        yield
    finally:
        flush_denormals(bool(before & FTZ))


def flush_denormals(on=True):
    """Set (or clear) FTZ and DAZ in the calling thread's MXCSR; True when done.

    Why: the Intel cores compute on subnormal floats far slower (AMD much less:
    docs/performance.md#cpu-environment), and one subnormal
    in an activation reaches every GEMM after it. `runtime.flush_denormals` (default true) decides;
    runtime.setup calls this before any math runs, so the threads started later (paddle's and
    OpenMP's workers, DataLoader processes) inherit it and ops/ (the fused kernels) applies it to the threads
    that call its operators. It changes float32 and float64 numerics for everything in the process,
    numpy included: results below 1.2e-38 (float32) / 2.2e-308 (float64) become 0, as torch's
    set_flush_denormal does. False off x86-64 glibc (nothing changed)."""
    got = _fenv()
    if got is None:
        return False
    libm, env, csr = got
    csr = csr | FTZ | DAZ if on else csr & ~(FTZ | DAZ)
    env[_MXCSR_AT:_MXCSR_AT + 4] = csr.to_bytes(4, "little")
    return libm.fesetenv(env) == 0 and mxcsr() == csr
