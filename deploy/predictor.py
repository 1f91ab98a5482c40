"""Run a model exported by tools/export.py with Paddle Inference (or ONNX Runtime), called like an
eval-mode model.

`Predictor(export_dir)(batch)` takes the batch the recipe's reader and collate make (tensors or numpy)
and returns the predictions as numpy arrays under the model's own output names, so the task's
writer (tools/infer.py) and metric consume them exactly as they consume the dynamic model's.
oneDNN is on by default on CPU; `device="gpu"` uses the GPU where one exists.

An export of programs declared by the model (deploy/export.py `programs`) is driven by the model
class's `exported_runner(programs, settings)`: the Python part of the prediction (a beam search,
sliding windows, NMS) is the model's own code, the networks are the exported programs. Predictions
are numpy arrays, or lists of them where the model gives one per image. `backend="onnxruntime"`
runs an export of `--format onnx` (deploy/onnx.py) the same way, on the CPU, and
`backend="openvino"` that export or an INT8 IR of tools/quantize.py (deploy/openvino.py).

TensorRT (`tensorrt`): None (the default) runs it on a GPU where the export records a `tensorrt`
section (tools/export.py --trt) and not on a CPU; True requires it (one line on a CPU or without the
section); False turns it off. deploy/tensorrt.py says what only a GPU can confirm.
"""
import os

import numpy as np
import paddle
import paddle.inference as pi

from engine import cpu
from engine.runtime import selected_gpu
from engine.components import import_custom, load_all
from deploy import onnx, openvino, tensorrt
from deploy.record import BACKENDS_OF, as_numpy, check_shape, checked_feeds, programs_of, read_infer_cfg, \
    uses_runner
from engine.errors import ConfigError
from engine.registry import MODELS


_GPU_PRECISION = {"fp32": pi.PrecisionType.Float32, "fp16": pi.PrecisionType.Half,
                  "bf16": pi.PrecisionType.Bfloat16}

# Paddle 3.3.1 cannot run its oneDNN kernels of these ops in a PIR program (the interpolation's
# `scale` attribute: "ConvertPirAttribute2RuntimeAttribute not support ArrayAttribute<DoubleAttribute>",
# PaddlePaddle/Paddle#79749). Without the oneDNN placement pass they take the plain CPU kernels
# while the convolutions keep their fused oneDNN kernels.
_ONEDNN_BROKEN_OPS = ("bilinear_interp", "nearest_interp", "bicubic_interp", "linear_interp", "trilinear_interp")


class Program:
    """One exported program: `program(feeds)` with numpy feeds by input name -> {output name: numpy};
    with paddle.Tensor feeds (any one of them) -> {output name: paddle.Tensor}, without a copy through
    the host: Paddle Inference's `run(list of tensors)` shares the tensors' memory as its inputs (they
    must be on the predictor's device: moved there if not) and returns its outputs as tensors on that
    device, so a model's programs pass tensors to each other (the Transformer's cache, Mask R-CNN's
    features). Paddle 3.3.1 (checked on this CPU build): the list is in `get_input_names()` order
    (by name only when every tensor is named after an input), dtypes must match exactly (cast here),
    outputs come in `get_output_names()` order and survive the next run. On a CPU the tensor path
    gives the numpy path's numbers and took as long (within noise, Transformer decoder steps). On a
    GPU the outputs are the predictor's buffers: our runners use a program's outputs before running it
    again, in case a GPU run reuses them (not observed on the CPU; only a GPU can tell).

    bf16: Paddle 3.3.1's bf16 passes break two things we work around. Its fusion of an unsqueeze into
    the preceding operator loses the unsqueeze once the bf16 pass inserts its conversions (a 1x1 conv
    over [N, F, L, 1] gets a 3-D input), so that fusion is off; and its conversion of an empty input
    to bf16 throws (std::exception), so a call with an empty input (a decoder's first step, with no
    cache yet) runs on an fp32 predictor of the same program."""

    def __init__(self, export_dir, name, spec, mkldnn=True, threads=None, device="cpu", bf16=False,
                 gpu_precision="fp32", trt=None, trt_precision="fp32"):
        self.gpu_precision, self.trt, self.trt_precision, self.export_dir = gpu_precision, trt, trt_precision, export_dir
        self.device = device
        self.name, self.where = name, os.path.join(export_dir, name)
        self.inputs, self.outputs = spec["inputs"], list(spec["outputs"])
        self.settings, self.bf16, self._fp32 = (mkldnn, threads, device), bf16, None
        self.predictor = self._create(bf16)
        missing = set(s["name"] for s in self.inputs) - set(self.predictor.get_input_names())
        if missing:
            raise ConfigError(f"{export_dir}: the program {name} lacks inputs {sorted(missing)} that "
                              f"infer_cfg.yml lists (files from different exports?)")

    def _create(self, bf16):
        mkldnn, threads, device = self.settings
        config = pi.Config(self.where + ".json", self.where + ".pdiparams")
        config.disable_glog_info()
        if device == "gpu":   # this process's card (the launcher's FLAGS_selected_gpus), in its precision
            config.enable_use_gpu(256, selected_gpu(), _GPU_PRECISION[self.gpu_precision])
            if self.trt:
                tensorrt.configure(config, self.trt, self.name, _GPU_PRECISION[self.trt_precision], self.export_dir)
            return pi.create_predictor(config)
        config.disable_gpu()
        if threads:
            config.set_cpu_math_library_num_threads(int(threads))
        if not mkldnn:
            config.disable_mkldnn()      # Paddle 3.x enables it by default
            return pi.create_predictor(config)
        config.enable_mkldnn()
        if bf16:
            config.enable_mkldnn_bfloat16()
            config.delete_pass("operator_unsqueeze_onednn_fuse_pass")
        with open(self.where + ".json", encoding="utf-8") as f:
            text = f.read()
        if any(f'.{op}"' in text for op in _ONEDNN_BROKEN_OPS):
            config.delete_pass("onednn_placement_pass")
        return pi.create_predictor(config)

    def __call__(self, feeds):
        if any(isinstance(feeds.get(s["name"]), paddle.Tensor) for s in self.inputs):
            return self._run_tensors(feeds)
        values, shapes = checked_feeds(self.inputs, feeds, self.where)
        predictor = self._predictor(v.size for _, v in values)
        for spec, value in values:
            handle = predictor.get_input_handle(spec["name"])
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(value)
        self._guarded(predictor.run, shapes)
        outputs = [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]
        return dict(zip(self.outputs, outputs))

    def _run_tensors(self, feeds):
        """The tensor path (class docstring): tensors in, tensors out, on the predictor's device."""
        values, shapes = {}, []
        for spec in self.inputs:
            if spec["name"] not in feeds:
                raise ConfigError(f"the exported program {self.where} needs input '{spec['name']}' "
                                  f"(given: {', '.join(sorted(feeds))})")
            value = feeds[spec["name"]]
            value = value if isinstance(value, paddle.Tensor) else paddle.to_tensor(value)
            check_shape(spec, value, self.where)
            if str(value.dtype).replace("paddle.", "") != spec["dtype"]:
                value = value.astype(spec["dtype"])
            values[spec["name"]] = self._on_device(value)
            shapes.append(f"{spec['name']} {list(value.shape)}")
        predictor = self._predictor(v.size for v in values.values())
        outputs = self._guarded(lambda: predictor.run([values[n] for n in predictor.get_input_names()]), shapes)
        return dict(zip(self.outputs, outputs))

    def _on_device(self, value):
        if self.device == "gpu" and not value.place.is_gpu_place():   # only a GPU runs this line
            return value.cuda(selected_gpu())
        if self.device != "gpu" and not value.place.is_cpu_place():
            return value.cpu()
        return value

    def _predictor(self, sizes):
        """The fp32 predictor where a bf16 one cannot take an empty input (class docstring)."""
        if self.bf16 and any(n == 0 for n in sizes):
            self._fp32 = self._fp32 or self._create(False)
            return self._fp32
        return self.predictor

    def _guarded(self, run, shapes):
        try:
            return run()
        except Exception as e:   # Paddle's multi-line C++ report: its summary line
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            summary = next((ln for ln in lines if "Error" in ln or "error" in ln), lines[0] if lines else "")
            raise ConfigError(f"the exported program {self.where} cannot take inputs {', '.join(shapes)}: "
                              f"{summary}") from None


def tensorrt_version():
    """The TensorRT this paddle was compiled with, (0, 0, 0) for none."""
    return tuple(pi.get_trt_compile_version())


class Predictor:
    """`precision` (None: the export's, `precision` in infer_cfg.yml) "bf16" runs Paddle Inference's
    oneDNN bf16 kernels where the CPU has native bf16, else fp32 with one log line. `wrap(program)`,
    when given, stands in for each program (quantization records their feeds). `int8_float`: the
    precision of an OpenVINO INT8 IR's float layers, "fp32", or None: bf16 where OpenVINO has bf16 here
    (the latency table times both)."""
    BACKENDS = ("inference", "onnxruntime", "openvino")
    training = False

    def __init__(self, export_dir, mkldnn=True, threads=None, device="cpu", model_name=None, backend="inference",
                 wrap=None, precision=None, tensorrt=None, ov_hint="LATENCY", cache_dir=None, int8_float=None):
        self.export_dir, self.int8_float = export_dir, int8_float
        if backend not in self.BACKENDS:
            raise ConfigError(f"backend '{backend}': one of {', '.join(self.BACKENDS)}")
        if backend == "onnxruntime":
            onnx.require("--backend onnxruntime")
        if backend == "openvino":
            openvino.require("--backend openvino")
        self.record = read_infer_cfg(export_dir)
        fmt = self.record.get("format", "paddle")
        if backend not in BACKENDS_OF[fmt]:
            other = next(f for f, b in BACKENDS_OF.items() if backend in b)
            raise ConfigError(f"{export_dir} holds an export of --format {fmt}, which --backend "
                              f"{' or '.join(BACKENDS_OF[fmt])} runs; for --backend {backend} export with "
                              f"tools/export.py --format {other}")
        if model_name is not None and self.record["model"] != model_name:
            raise ConfigError(f"{export_dir} holds an exported {self.record['model']}, but the config "
                              f"builds {model_name}")
        self.inputs, self.backend = self.record["inputs"], backend
        self.precision = self._precision(precision or self.record.get("precision", "fp32"), backend, mkldnn, device)
        bf16 = self.precision == "bf16"
        trt = self._tensorrt(tensorrt, device, backend)
        trt_precision = precision or (trt or {}).get("precision", "fp32")
        if trt and trt_precision not in ("fp32", "fp16", "bf16"):
            raise ConfigError(f"precision {trt_precision} with TensorRT: fp32 or fp16 (INT8 TensorRT is not offered here)")
        self.tensorrt = bool(trt)
        if backend == "onnxruntime":
            make = lambda name, spec: onnx.Program(export_dir, name, spec, threads)  # noqa: E731
        elif backend == "openvino":
            make = self._openvino(fmt, threads, ov_hint, cache_dir)
        else:
            make = lambda name, spec: Program(export_dir, name, spec, mkldnn, threads, device,  # noqa: E731
                                              bf16 and device != "gpu", gpu_precision=self.precision, trt=trt,
                                              trt_precision=trt_precision)
        self.programs = {name: (wrap or (lambda p: p))(make(name, spec))
                         for name, spec in programs_of(self.record).items()}
        if uses_runner(self.record):
            load_all()
            import_custom((self.record.get("config") or {}).get("custom_imports"), f"{export_dir}: custom_imports")
            cls = MODELS.get(self.record["model"])
            self.run = cls.exported_runner(self.programs, self.record.get("settings") or {})
            if self.run is None:
                raise ConfigError(f"{export_dir}: programs {', '.join(self.programs)}, but model "
                                  f"{self.record['model']} has no exported_runner to drive them")
        else:
            self.run = next(iter(self.programs.values()))

    def _openvino(self, fmt, threads, hint, cache_dir):
        """OpenVINO's program maker: an INT8 IR's float layers in bf16 where OpenVINO has bf16 here, unless
        `int8_float` says fp32."""
        rest = self.int8_float or (
            "bf16" if self.precision == "int8" and fmt == "openvino" and openvino.has_bf16() else "fp32")
        precision = "int8" if fmt == "openvino" else self.precision
        if cache_dir is None and os.access(self.export_dir, os.W_OK):   # a second start skips compilation
            cache_dir = os.path.join(self.export_dir, "openvino_cache")
        return lambda name, spec: openvino.Program(self.export_dir, name, spec, threads, precision, hint,  # noqa: E731
                                                   cache_dir, float_precision=rest)

    def _tensorrt(self, want, device, backend):
        """The record's `tensorrt` section where TensorRT runs (the module docstring), else None."""
        have = self.record.get("tensorrt")
        if want is False or (want is None and (device != "gpu" or backend != "inference" or not have)):
            return None
        if device != "gpu":
            raise ConfigError(f"TensorRT runs on a GPU (runtime.device gpu, paddlepaddle-gpu built with TensorRT); "
                              f"this run's device is {device}")
        if not have:
            raise ConfigError(f"{self.export_dir}: TensorRT asked for, but its infer_cfg.yml has no tensorrt "
                              f"section; export the model again with tools/export.py --trt")
        if tensorrt_version() == (0, 0, 0):
            raise ConfigError("TensorRT asked for, but this paddle was built without it "
                              "(paddle.inference.get_trt_compile_version() is 0.0.0); install a paddlepaddle-gpu "
                              "with TensorRT, or run with --no-trt")
        return have

    def _precision(self, want, backend, mkldnn, device):
        """The precision this predictor runs: `want`, or fp32 where bf16 cannot run (with one line)."""
        have = self.record.get("precision", "fp32")
        if want == "int8" or have == "int8":
            if want != have:
                raise ConfigError(f"{self.export_dir} holds a {have} export; INT8 is a model tools/quantize.py wrote")
            return want
        if want not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"precision '{want}': one of fp32, bf16, fp16 (GPU)")
        if device == "gpu" and backend == "inference":   # Paddle Inference's mixed precision on the card
            return want
        if want == "fp16":
            raise ConfigError("precision fp16 runs on a GPU (Paddle Inference); on a CPU use bf16")
        if want == "bf16":
            why = ("ONNX Runtime has no bf16 CPU kernels" if backend == "onnxruntime" else
                   None if backend == "openvino" and openvino.has_bf16() else
                   "OpenVINO's CPU plugin reports no bf16 on this CPU (avx512_bf16, amx_bf16)" if backend == "openvino" else
                   "oneDNN is off" if not mkldnn else
                   None if cpu.has_bf16() else "this CPU has no native bf16 (avx512_bf16, amx_bf16)")
            if why:
                print(f"note: {self.export_dir}: bf16 asked for, but {why}: running fp32", flush=True)
                return "fp32"
        return want

    def __call__(self, batch):
        feeds = {}
        for spec in self.inputs:
            name = spec["name"]
            if name not in batch:
                raise ConfigError(f"the exported {self.record['model']} needs input '{name}', which the "
                                  f"batch lacks (batch keys: {', '.join(sorted(batch))})")
            value = as_numpy(batch[name])
            if value.dtype == np.uint8 and spec["dtype"] != "uint8" and batch.get(name + "_normalize"):
                # uint8 pixels from Normalize (in_main_process): the program takes them normalised
                value = normalize_batch(value, batch[name + "_normalize"],
                                        None if name + "_size" not in batch else as_numpy(batch[name + "_size"]))
            check_shape(spec, value, self.export_dir)
            feeds[name] = value
        if "index" in batch and "index" not in feeds:   # lets a runner name a sample in its messages
            feeds["index"] = as_numpy(batch["index"])
        outputs = self.run(feeds)
        return {k: outputs[k] for k in self.record["outputs"]}

    def eval(self):
        return self


def normalize_batch(x, norm, size=None):
    """numpy float32 of a collated uint8 batch `x` [B, ..., C, H, W] (C = 3 * frames) with its
    `<key>_normalize` metadata `norm` (one [shift, scale] per sample: readers/transforms.py Normalize): what
    `models.pixels.as_float` computes on the device. `size` [B, 2] (PadImages' `<key>_size`) sets
    the padding outside each sample's height and width to 0.0."""
    x = np.asarray(x)
    shift, scale = (np.asarray(v, np.float32) for v in norm[0])
    reps, shape = x.shape[-3] // 3, [x.shape[-3], 1, 1]
    out = (x.astype(np.float32) - np.tile(shift, reps).reshape(shape)) * np.tile(scale, reps).reshape(shape)
    if size is not None:
        for i, (h, w) in enumerate(np.asarray(size).reshape(-1, 2)):
            out[i, ..., int(h):, :] = 0.0
            out[i, ..., :, int(w):] = 0.0
    return out
