"""Where a run's scalars go (`train.loggers`): VisualDL (the default), TensorBoard, W&B, behind one
interface the trainer calls, and always `scalars.jsonl` in the run folder.

Every logger gets the same things: at each log line each loss, `lr`, `samples_per_s`, `reader_share`
(the part of the interval's time the loop waited for the reader) and `peak_memory_mb` under `train/`;
each evaluation's metrics under `eval/`; and once, the resolved config (VisualDL and TensorBoard as a
YAML text, W&B as the run's config). Steps are optimizer steps. TensorBoard writes with tensorboardX
into `<output>/tensorboard/`, W&B into `<output>/wandb/` (offline by default: nothing leaves the
machine; `wandb sync` uploads such a folder later). Both are optional requirements
(requirements-loggers.txt), checked when the run is assembled: one error line names what is missing.

`scalars.jsonl`: one JSON line per log line ({"kind": "train", "step", "epoch", "batch", ...}) and per
evaluation ({"kind": "eval", ...}), appended (a resumed run adds to it: its steps after the checkpoint
come again, and the later line counts, tools/plot.py) and flushed line by line, so a killed run keeps
every line it logged.
"""
import json
import os

import yaml

from engine.errors import require_packages

REQUIREMENTS = "requirements-loggers.txt"
PACKAGES = {"tensorboard": ("tensorboardX",), "wandb": ("wandb",)}


def check(names):
    """Each logger's package importable, or one line naming it (before training starts)."""
    for name in names:
        if name in PACKAGES:
            require_packages(f"train.loggers: {name}", PACKAGES[name], REQUIREMENTS)


class _Writer:
    """A summary writer's scalars, one tag each (VisualDL's LogWriter, tensorboardX's SummaryWriter)."""
    flush = False   # tensorboardX buffers its events: flushed at each log line, so a killed run keeps them

    def scalars(self, prefix, values, step):
        for k, v in values.items():
            self.w.add_scalar(f"{prefix}/{k}", v, step)
        if self.flush:
            self.w.flush()

    def close(self):
        self.w.close()


class _VisualDL(_Writer):
    def __init__(self, output_dir, config, wandb_cfg):
        from visualdl import LogWriter  # import cost (~1 s): a run that logs to VisualDL only
        self.w = LogWriter(logdir=os.path.join(output_dir, "vdl"))
        self.w.add_text("config", yaml.safe_dump(config, sort_keys=False), 0)


class _TensorBoard(_Writer):
    flush = True

    def __init__(self, output_dir, config, wandb_cfg):
        from tensorboardX import SummaryWriter  # optional: requirements-loggers.txt
        self.w = SummaryWriter(logdir=os.path.join(output_dir, "tensorboard"))
        self.w.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)


class _WandB:
    def __init__(self, output_dir, config, wandb_cfg):
        import wandb  # optional: requirements-loggers.txt
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=wandb_cfg.project, mode=wandb_cfg.mode, dir=output_dir,
                              name=os.path.basename(os.path.normpath(output_dir)), config=config, reinit=True)

    def scalars(self, prefix, values, step):
        self.run.log({f"{prefix}/{k}": v for k, v in values.items()}, step=step)

    def close(self):
        self.run.finish()


BACKENDS = {"visualdl": _VisualDL, "tensorboard": _TensorBoard, "wandb": _WandB}


class Loggers:
    """Rank 0's loggers of one run, made when training starts (`names`: train.loggers)."""

    def __init__(self, output_dir, names, config, wandb_cfg):
        self.backends = [BACKENDS[n](output_dir, config, wandb_cfg) for n in dict.fromkeys(names)]
        self.jsonl = open(os.path.join(output_dir, "scalars.jsonl"), "a")

    def train(self, at, values):
        for b in self.backends:
            b.scalars("train", values, at.step)
        self._line("train", at, values, batch=at.batch)

    def eval(self, at, metrics):
        for b in self.backends:
            b.scalars("eval", metrics, at.step)
        self._line("eval", at, metrics)

    def _line(self, kind, at, values, **where):
        row = {"kind": kind, "step": at.step, "epoch": at.epoch + 1, **where}
        row.update((k, float(v)) for k, v in values.items())
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()

    def close(self):
        for b in self.backends:
            b.close()
        self.jsonl.close()
