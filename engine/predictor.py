"""Run a model exported by tools/export.py with Paddle Inference, called like an eval-mode model.

`Predictor(export_dir)(batch)` takes the batch the recipe's reader and collate make (tensors or numpy)
and returns the predictions as numpy arrays under the model's own output names, so the task's
writer (tools/infer.py) and metric consume them exactly as they consume the dynamic model's.
oneDNN is on by default on CPU; `device="gpu"` uses the GPU where one exists.

An export of several programs (engine/export.py `programs`) is driven by the model class's
`exported_runner(programs, settings)`: the Python part of the prediction (a beam search) is the
model's own code, the networks are the exported programs.
"""
import os

import numpy as np

from engine.export import programs_of, read_infer_cfg
from engine.registry import ConfigError


def _check_shape(spec, value, where):
    name, want = spec["name"], spec["shape"]
    if value.ndim != len(want) or any(w != -1 and w != g for w, g in zip(want, value.shape)):
        raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program "
                          f"takes {['?' if w == -1 else w for w in want]} ({where})")
    most = spec.get("max_shape")
    if most and any(m != -1 and g > m for m, g in zip(most, value.shape)):
        raise ConfigError(f"input '{name}' has shape {list(value.shape)}, the exported program takes at most "
                          f"{['?' if m == -1 else m for m in most]} ({spec.get('max_shape_why') or where})")


class Program:
    """One exported program: `program(feeds)` with numpy feeds by input name -> {output name: numpy}."""

    def __init__(self, export_dir, name, spec, mkldnn=True, threads=None, device="cpu"):
        import paddle.inference as pi
        self.name, self.where = name, os.path.join(export_dir, name)
        self.inputs, self.outputs = spec["inputs"], list(spec["outputs"])
        config = pi.Config(self.where + ".json", self.where + ".pdiparams")
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
        missing = set(s["name"] for s in self.inputs) - set(self.predictor.get_input_names())
        if missing:
            raise ConfigError(f"{export_dir}: the program {name} lacks inputs {sorted(missing)} that "
                              f"infer_cfg.yml lists (files from different exports?)")

    def __call__(self, feeds):
        for spec in self.inputs:
            value = np.asarray(feeds[spec["name"]])
            _check_shape(spec, value, self.where)
            handle = self.predictor.get_input_handle(spec["name"])
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(np.ascontiguousarray(value.astype(spec["dtype"], copy=False)))
        self.predictor.run()
        outputs = [self.predictor.get_output_handle(n).copy_to_cpu() for n in self.predictor.get_output_names()]
        return dict(zip(self.outputs, outputs))


class Predictor:
    def __init__(self, export_dir, mkldnn=True, threads=None, device="cpu", model_name=None):
        self.export_dir = export_dir
        self.record = read_infer_cfg(export_dir)
        if model_name is not None and self.record["model"] != model_name:
            raise ConfigError(f"{export_dir} holds an exported {self.record['model']}, but the config "
                              f"builds {model_name}")
        self.inputs = self.record["inputs"]
        self.programs = {name: Program(export_dir, name, spec, mkldnn, threads, device)
                         for name, spec in programs_of(self.record).items()}
        if "programs" in self.record and len(self.programs) > 1:
            from engine.components import load_all
            from engine.registry import MODELS
            load_all()
            cls = MODELS.get(self.record["model"])
            if not hasattr(cls, "exported_runner"):
                raise ConfigError(f"{export_dir}: {len(self.programs)} programs, but model "
                                  f"{self.record['model']} has no exported_runner to drive them")
            self.run = cls.exported_runner(self.programs, self.record.get("settings") or {})
        else:
            self.run = next(iter(self.programs.values()))

    def __call__(self, batch):
        feeds = {}
        for spec in self.inputs:
            name = spec["name"]
            if name not in batch:
                raise ConfigError(f"the exported {self.record['model']} needs input '{name}', which the "
                                  f"batch lacks (batch keys: {', '.join(sorted(batch))})")
            value = batch[name]
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            _check_shape(spec, value, self.export_dir)
            feeds[name] = value
        if "index" in batch and "index" not in feeds:   # lets a runner name a sample in its messages
            index = batch["index"]
            feeds["index"] = index.numpy() if hasattr(index, "numpy") else np.asarray(index)
        outputs = self.run(feeds)
        return {k: outputs[k] for k in self.record["outputs"]}

    def eval(self):
        return self
