"""Run a model exported by tools/export.py with Paddle Inference, called like an eval-mode model.

`Predictor(export_dir)(batch)` takes the batch the recipe's reader and collate make (tensors or numpy)
and returns the predictions as numpy arrays (lists of arrays for per-image results) under the
model's own output names, so the task's writer (tools/infer.py) and metric consume them exactly as
they consume the dynamic model's. An export with a pipeline (engine/export.py) runs the model
class's own `run_exported` around its programs, the code its eval forward runs.
oneDNN is on by default on CPU; `device="gpu"` uses the GPU where one exists.
"""
import os

import numpy as np

from engine.export import PROGRAM, read_infer_cfg
from engine.registry import ConfigError

# Paddle 3.3.1 cannot run its oneDNN kernels of these ops in a PIR program (the interpolation's
# `scale` attribute: "ConvertPirAttribute2RuntimeAttribute not support ArrayAttribute<DoubleAttribute>",
# PaddlePaddle/Paddle#79749). Without the oneDNN placement pass they take the plain CPU kernels
# while the convolutions keep their fused oneDNN kernels.
_ONEDNN_BROKEN_OPS = ("bilinear_interp", "nearest_interp", "bicubic_interp", "linear_interp", "trilinear_interp")


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


class Predictor:
    def __init__(self, export_dir, mkldnn=True, threads=None, device="cpu", model_name=None):
        self.export_dir = export_dir
        self.record = read_infer_cfg(export_dir)
        if model_name is not None and self.record["model"] != model_name:
            raise ConfigError(f"{export_dir} holds an exported {self.record['model']}, but the config "
                              f"builds {model_name}")
        self.specs = {PROGRAM: {"inputs": self.record["inputs"], "outputs": self.record["outputs"]},
                      **(self.record.get("programs") or {})}
        self.predictors = {name: self._create(name, mkldnn, threads, device) for name in self.specs}
        self.pipeline = None
        if "pipeline" in self.record:
            from engine.components import load_all
            from engine.registry import MODELS
            load_all()
            self.pipeline = MODELS.get(self.record["model"]).run_exported

    def _create(self, program, mkldnn, threads, device):
        import paddle.inference as pi
        path = os.path.join(self.export_dir, program)
        config = pi.Config(path + ".json", path + ".pdiparams")
        config.disable_glog_info()
        if device == "gpu":
            config.enable_use_gpu(256, 0)
        else:
            config.disable_gpu()
            if threads:
                config.set_cpu_math_library_num_threads(int(threads))
            if mkldnn:
                config.enable_mkldnn()
                with open(path + ".json", encoding="utf-8") as f:
                    text = f.read()
                if any(f'.{op}"' in text for op in _ONEDNN_BROKEN_OPS):
                    config.delete_pass("onednn_placement_pass")
            else:
                config.disable_mkldnn()      # Paddle 3.x enables it by default
        predictor = pi.create_predictor(config)
        missing = set(s["name"] for s in self.specs[program]["inputs"]) - set(predictor.get_input_names())
        if missing:
            raise ConfigError(f"{self.export_dir}: the program {program} lacks inputs {sorted(missing)} that "
                              f"infer_cfg.yml lists (files from different exports?)")
        return predictor

    def run(self, program, inputs):
        """One exported program on a dict of inputs (tensors or numpy): {output name: numpy}."""
        predictor, spec = self.predictors[program], self.specs[program]
        shapes = []
        for s in spec["inputs"]:
            name, want = s["name"], s["shape"]
            if name not in inputs:
                raise ConfigError(f"the exported {self.record['model']} needs input '{name}', which the "
                                  f"batch lacks (batch keys: {', '.join(sorted(inputs))})")
            value = inputs[name]
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            if value.ndim != len(want) or any(w != -1 and w != g for w, g in zip(want, value.shape)):
                raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program "
                                  f"takes {['?' if w == -1 else w for w in want]} ({self.export_dir})")
            handle = predictor.get_input_handle(name)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(np.ascontiguousarray(value.astype(s["dtype"], copy=False)))
            shapes.append(f"{name} {list(value.shape)}")
        try:
            predictor.run()
        except Exception as e:   # Paddle's multi-line C++ report: its summary line
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            summary = next((ln for ln in lines if "Error" in ln or "error" in ln), lines[0] if lines else "")
            raise ConfigError(f"the exported program '{program}' ({self.export_dir}) cannot take inputs "
                              f"{', '.join(shapes)}: {summary}") from None
        outputs = [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]
        return dict(zip(spec["outputs"], outputs))

    def __call__(self, batch):
        if self.pipeline is None:
            return self.run(PROGRAM, batch)
        import paddle

        def run(program, inputs):
            return {k: paddle.to_tensor(v) for k, v in self.run(program, inputs).items()}

        with paddle.no_grad():
            preds = self.pipeline(run, batch, self.record["pipeline"])
        return {k: [_numpy(t) for t in v] if isinstance(v, list) else _numpy(v) for k, v in preds.items()}

    def eval(self):
        return self
