"""Process set-up: threads, device, seeds, the data-parallel environment, mixed precision, logging."""
import contextlib
import dataclasses
import logging
import os
import random
import resource
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import ops
from engine import cpu, distributed
from engine.errors import ConfigError

log = logging.getLogger("zoo")


def world():
    """(world_size, rank) of this process; 1, 0 outside `paddle.distributed.launch`."""
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1")), int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def local_rank():
    """This process's rank among those of its node (the launcher's PADDLE_LOCAL_RANK); 0 outside it."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", "0"))


def setup(runtime_cfg):
    """Threads, device and (when launched on several processes) the parallel environment, from a
    RuntimeSection (`config.RuntimeSection()`: the defaults)."""
    device = resolve_device(runtime_cfg.device)
    threads = setup_cpu(runtime_cfg, device)
    if device == "gpu" and not paddle.device.is_compiled_with_cuda():
        raise ConfigError("runtime.device: gpu asked for, but this paddle build has no CUDA "
                          "(install paddlepaddle-gpu: docs/getting-started.md)")
    world_size, rank = world()
    if world_size > 1:
        paddle.set_device(f"gpu:{selected_gpu()}" if device == "gpu" else "cpu")
        bound = distributed.socket_interface(device)
        log.info("data parallel: %d processes on %d hosts%s", world_size, len(set(distributed.endpoint_hosts())),
                 "; %s=%s (%s)" % bound if bound else "")
        dist.init_parallel_env()
    else:
        paddle.set_device(device)
    return {"device": device, "threads": threads, "world_size": world_size, "rank": rank, "local_rank": local_rank()}


def resolve_device(device):
    """runtime.device with `auto` resolved: a GPU where this paddle build has CUDA and sees one, else the CPU."""
    if device == "auto":
        return "gpu" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() else "cpu"
    return device


def setup_cpu(runtime_cfg, device="cpu"):
    """What the trainer sets for the CPU's kernels, paddle's and ours (ops/), from a RuntimeSection; the
    number of threads. Also for a model used outside our tools (api.create_model, api.setup_cpu): without
    it a model runs paddle's own CPU kernels (TSN-R50's plain training loop 0.75x PyTorch's on an Intel
    Xeon, against 1.15x through the trainer). MKL reads MKL_DEBUG_CPU_TYPE at its first call, so setting it
    here still counts in a process that has imported paddle (a call of MKL's before it is not redone)."""
    cpu.mkl_cpu_type()
    threads = runtime_cfg.num_threads or len(os.sched_getaffinity(0))
    paddle.base.core.set_num_threads(threads)
    flush = runtime_cfg.flush_denormals
    cpu.flush_denormals(flush)      # this thread (paddle's kernels; threads and processes started later)
    ops.library.set_threads(threads)
    ops.library.set_flush_denormals(flush)
    # the base of this thread's precision: the fused path or not, fp32 (train.amp / eval.amp enter bf16 in
    # blocks: autocast); a fresh value, so a second setup in one process leaves nothing of the first
    ops.set_precision(ops.Precision(fast_ops=runtime_cfg.fast_ops))
    if device == "cpu" and runtime_cfg.keep_freed_memory:
        cpu.keep_freed_memory()
    if device == "cpu" and "FLAGS_use_stride_kernel" not in os.environ:
        paddle.set_flags({"FLAGS_use_stride_kernel": False})   # a GPU build on a CPU (engine/cpu.py: why)
    return threads


def selected_gpu(env=os.environ):
    """This process's card: paddle's launcher gives each process its own FLAGS_selected_gpus ("3");
    a list ("0,1", set by hand for every process) is indexed by the local rank."""
    ids = [x.strip() for x in env.get("FLAGS_selected_gpus", "0").split(",") if x.strip()] or ["0"]
    rank = int(env.get("PADDLE_LOCAL_RANK", "0"))
    if len(ids) > 1 and rank >= len(ids):
        raise ConfigError(f"FLAGS_selected_gpus={env['FLAGS_selected_gpus']} names {len(ids)} cards, "
                          f"but this process has local rank {rank}")
    return int(ids[rank] if len(ids) > 1 else ids[0])


_said = set()


def _once(message, *args):
    if message not in _said:
        _said.add(message)
        log.info(message, *args)


def heap_trim(runtime_cfg):
    """What the trainer calls after each forward (engine.cpu.trim_heap) on a CPU whose run gives freed
    memory back (`runtime.keep_freed_memory` false); None otherwise."""
    return cpu.trim_heap if _on_cpu() and not runtime_cfg.keep_freed_memory else None


def _on_cpu():
    return paddle.get_device().startswith("cpu")


def clock_sync():
    """What to call before reading a clock that times device work: on a GPU (any accelerator), whose
    kernels run after the Python call that queued them has returned, paddle.device.synchronize; on a
    CPU None, the work being done when the call returns."""
    return None if _on_cpu() else paddle.device.synchronize


def resolve_amp(amp, where="train.amp"):
    """The AmpSection this process can run, after runtime.setup. On a GPU: `amp` (paddle.amp).
    On a CPU, where paddle's AMP does nothing: bf16 runs on the fused oneDNN operators (Precision.bf16),
    so float16 is an error; without native bf16 (AVX512_BF16 or AMX) or with runtime.fast_ops off,
    one log line and fp32; level O2 keeps fp32 master weights (one log line: it runs as O1)."""
    if not amp.enable or not _on_cpu():
        return amp
    if amp.dtype == "float16":
        raise ConfigError(f"{where}.dtype: float16 needs a GPU (paddle has no CPU float16 kernels); "
                          f"on a CPU use {where}.dtype=bfloat16")
    if not ops.current_precision().fast_ops:
        _once("%s: bfloat16 on a CPU runs on the fused operators, and runtime.fast_ops is false: computing in fp32",
              where)
        return dataclasses.replace(amp, enable=False)
    if not ops.bf16_supported():
        _once("%s: this CPU has no native bf16 for oneDNN (AVX512_BF16 or AMX; ONEDNN_MAX_CPU_ISA=%s): "
              "computing in fp32", where, os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"))
        return dataclasses.replace(amp, enable=False)
    if amp.level == "O2":
        _once("%s.level O2 on a CPU: the weights stay fp32 and matmul / convolution compute in bf16 (as O1)", where)
        return dataclasses.replace(amp, level="O1")
    _once("%s: bfloat16 matmul and convolution on oneDNN (norms, softmax, losses and weights in fp32; activations "
          "in %s)", where, amp.activations)
    return amp


def autocast(amp, base=None):
    """Mixed precision for a resolved AmpSection (`resolve_amp`), one context: paddle.amp on a GPU; on
    a CPU ops.precision, the precision in effect (or `base`, an ops.Precision: what a thread other than
    the one set up computes with, api/inferencer.py) with bf16 matmul and convolution, and bf16
    activations where `amp.activations` says so."""
    if not amp.enable:
        return contextlib.nullcontext() if base is None else ops.precision(base)
    if _on_cpu():
        bf16 = ops.bf16_supported()
        return ops.precision(base, bf16=bf16, bf16_act=bf16 and amp.activations == "bfloat16")
    return paddle.amp.auto_cast(enable=True, dtype=amp.dtype, level=amp.level,
                                custom_white_list=set(amp.custom_white_list or ()) or None,
                                custom_black_list=set(amp.custom_black_list or ()) or None)


def convert_sync_bn(layer):
    """SyncBatchNorm for the BN layers that compute batch statistics.

    BN layers on global statistics (frozen stages, `norm_eval`: `use_global_stats=True`) stay as
    they are: paddle's `convert_sync_batchnorm` would replace them with layers that train.
    """
    for name, child in list(layer.named_children()):
        norm = paddle.nn.layer.norm
        if isinstance(child, norm._BatchNormBase) and not isinstance(child, paddle.nn.SyncBatchNorm):
            if not child._use_global_stats:
                layer._sub_layers[name] = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(child)
        else:
            convert_sync_bn(child)
    return layer


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    paddle.seed(seed)


def peak_memory_mb():
    """Peak memory: ru_maxrss on CPU, the allocator's peak on GPU."""
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count():
        return paddle.device.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup_logging(output_dir=None, rank=0):
    """Console (and train.log on rank 0); called by the tools, never at import."""
    logger = logging.getLogger("zoo")
    logger.handlers.clear()
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if output_dir and rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        fh = logging.FileHandler(os.path.join(output_dir, "train.log"))
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    logger.propagate = False
    return logger
