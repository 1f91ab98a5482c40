"""Run a model exported by tools/export.py with Paddle Inference, called like an eval-mode model.

`Predictor(export_dir)(batch)` takes the batch the recipe's reader and collate make (tensors or numpy)
and returns the predictions as numpy arrays under the model's own output names, so the task's
writer (tools/infer.py) and metric consume them exactly as they consume the dynamic model's.
oneDNN is on by default on CPU; `device="gpu"` uses the GPU where one exists.
"""
import os

import numpy as np

from engine.export import PROGRAM, read_infer_cfg
from engine.registry import ConfigError


class Predictor:
    def __init__(self, export_dir, mkldnn=True, threads=None, device="cpu", model_name=None):
        import paddle.inference as pi
        self.export_dir = export_dir
        self.record = read_infer_cfg(export_dir)
        if model_name is not None and self.record["model"] != model_name:
            raise ConfigError(f"{export_dir} holds an exported {self.record['model']}, but the config "
                              f"builds {model_name}")
        config = pi.Config(os.path.join(export_dir, PROGRAM + ".json"),
                           os.path.join(export_dir, PROGRAM + ".pdiparams"))
        config.disable_glog_info()
        if device == "gpu":
            config.enable_use_gpu(256, 0)
        else:
            config.disable_gpu()
            if threads:
                config.set_cpu_math_library_num_threads(int(threads))
            if mkldnn:
                config.enable_mkldnn()
        self.predictor = pi.create_predictor(config)
        self.inputs = self.record["inputs"]
        missing = set(s["name"] for s in self.inputs) - set(self.predictor.get_input_names())
        if missing:
            raise ConfigError(f"{export_dir}: the program lacks inputs {sorted(missing)} that "
                              f"infer_cfg.yml lists (files from different exports?)")

    def __call__(self, batch):
        for spec in self.inputs:
            name, want = spec["name"], spec["shape"]
            if name not in batch:
                raise ConfigError(f"the exported {self.record['model']} needs input '{name}', which the "
                                  f"batch lacks (batch keys: {', '.join(sorted(batch))})")
            value = batch[name]
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            if value.ndim != len(want) or any(w != -1 and w != g for w, g in zip(want, value.shape)):
                raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program "
                                  f"takes {['?' if w == -1 else w for w in want]} ({self.export_dir})")
            handle = self.predictor.get_input_handle(name)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(np.ascontiguousarray(value.astype(spec["dtype"], copy=False)))
        self.predictor.run()
        outputs = [self.predictor.get_output_handle(n).copy_to_cpu() for n in self.predictor.get_output_names()]
        return dict(zip(self.record["outputs"], outputs))

    def eval(self):
        return self
