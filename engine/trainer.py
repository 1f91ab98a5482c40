"""The one training loop every recipe uses. It never names a model: models return their losses."""
import contextlib
import itertools
import json
import logging
import math
import os
import time

import numpy as np
import paddle

from engine import checkpoint, config as C, runtime
from engine.builder import build_loader, build_metric, build_model, check_agreement, count_params
from engine.evaluator import evaluate
from engine.model import unwrap
from engine.optim import build_lr, build_optimizer, clip_grad_norm_
from engine.registry import ConfigError, did_you_mean

log = logging.getLogger("zoo")


class NonFiniteLoss(ConfigError):
    """A NaN/Inf loss outside fp16 loss scaling: training cannot go on meaningfully."""


def make_scaler(amp):
    """fp16 needs loss scaling; bf16 and fp32 do not (the scaler then passes everything through)."""
    return paddle.amp.GradScaler(enable=amp["enable"] and amp["dtype"] == "float16",
                                 init_loss_scaling=amp["init_loss_scaling"])


class TrainStep:
    """One micro-batch of training, the same code for the trainer, tools/benchmark.py and
    tools/amp_check.py: forward under autocast, backward of the scaled loss / accum_steps, and when
    `update` (the last micro-batch of an accumulation) unscale, clip, step, scaler update, clear the
    gradients and advance the LR schedule. Under data parallel the gradients of an accumulation are
    all-reduced once, at its last micro-batch. Returns the detached losses: no host synchronisation.
    """

    def __init__(self, net, optimizer, scaler, lr=None, amp=None, accum_steps=1, clip_grad_norm=None):
        self.net, self.optimizer, self.scaler, self.lr = net, optimizer, scaler, lr
        self.amp = amp or C.section({}, "amp", C.AMP_KEYS)
        self.accum_steps, self.clip_grad_norm = accum_steps, clip_grad_norm

    @property
    def model(self):
        return unwrap(self.net)

    def __call__(self, batch, update=True):
        no_sync = isinstance(self.net, paddle.DataParallel) and not update
        with self.net.no_sync() if no_sync else contextlib.nullcontext():
            with paddle.amp.auto_cast(enable=self.amp["enable"], dtype=self.amp["dtype"], level=self.amp["level"]):
                losses = self.net(batch)
            self.scaler.scale(losses["loss"] / self.accum_steps).backward()
        if update:
            self.scaler.unscale_(self.optimizer)
            if self.clip_grad_norm:
                clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.clear_grad()
            if self.lr is not None:
                self.lr.step()
        return {k: v.detach() for k, v in losses.items()}


def build_train_step(cfg, model, steps_per_epoch, total_steps, world_size=1, amp=None, make_scaler=make_scaler):
    """Optimizer, LR schedule, loss scaler, AMP O2 decoration and data parallel around `model`."""
    train_cfg = C.section(cfg, "train", C.TRAIN_KEYS)
    amp = amp or C.section(train_cfg, "amp", C.AMP_KEYS)
    lr = build_lr(cfg["lr"], steps_per_epoch, total_steps)
    optimizer = build_optimizer(cfg["optimizer"], model, lr)
    if amp["enable"] and amp["level"] == "O2":
        model, optimizer = paddle.amp.decorate(model, optimizer, level="O2", dtype=amp["dtype"])
    net = paddle.DataParallel(model) if world_size > 1 else model
    return TrainStep(net, optimizer, make_scaler(amp), lr, amp, train_cfg["accum_steps"], train_cfg["clip_grad_norm"])


class Plan:
    """How long training runs: `train.epochs`, or `train.max_steps` optimizer steps (not both)."""

    def __init__(self, train_cfg, batches_per_epoch):
        epochs, max_steps = train_cfg["epochs"], train_cfg["max_steps"]
        if (epochs is None) == (max_steps is None):
            raise ConfigError("train: give train.epochs or train.max_steps (not both); "
                              f"got epochs={epochs}, max_steps={max_steps}")
        if not train_cfg["save_interval"] and not train_cfg["save_steps"]:
            raise ConfigError("train.save_interval and train.save_steps are both 0: no checkpoint would be "
                              "written until the end, and a killed run could not resume; set one of them >= 1")
        self.accum = train_cfg["accum_steps"]
        self.batches = batches_per_epoch
        self.steps_per_epoch = -(-batches_per_epoch // self.accum)  # a last partial accumulation steps too
        self.max_steps = max_steps
        self.total_steps = max_steps or self.steps_per_epoch * epochs
        self.epochs = epochs or -(-max_steps // self.steps_per_epoch)

    def epoch_range(self, start, step):
        if self.max_steps is None:
            return range(start, self.epochs)
        return itertools.count(start) if step < self.max_steps else range(0)

    def remaining_batches(self, epoch, i, step):
        if self.max_steps is None:
            return (self.batches - i - 1) + self.batches * (self.epochs - epoch - 1)
        return (self.max_steps - step) * self.accum


def fit(cfg, output_dir, resume=None, trust_weights=False, make_scaler=make_scaler):
    train_cfg = C.section(cfg, "train", C.TRAIN_KEYS)
    rt_cfg = C.section(cfg, "runtime", C.RUNTIME_KEYS)
    rt = runtime.setup(rt_cfg)
    cfg.setdefault("runtime", {})["world_size"] = rt["world_size"]
    seed, accum, rank0 = rt_cfg["seed"], train_cfg["accum_steps"], rt["rank"] == 0
    runtime.seed_all(seed)
    model = build_model(cfg["model"])
    loader, dataset, sampler = build_loader(cfg, "train", seed, rt["world_size"], rt["rank"])
    plan = Plan(train_cfg, len(loader))
    check_agreement(model, dataset, "train")
    val, metric = None, None
    if "val" in cfg.get("reader", {}):
        val, val_set, _ = build_loader(cfg, "val", seed, rt["world_size"], rt["rank"])
        check_agreement(model, val_set, "val")
        metric = build_metric(cfg, val_set)
    _check_best_metric(train_cfg, metric)
    if rank0:
        os.makedirs(output_dir, exist_ok=True)
        C.dump(cfg, os.path.join(output_dir, "config.yaml"))
    if train_cfg["pretrained"]:
        from engine.pretrained import load_pretrained
        load_pretrained(model, train_cfg["pretrained"], log=log.info, weights_format=train_cfg["weights_format"],
                        trust=trust_weights)
    if rt_cfg["sync_bn"]:  # GPU only: runtime.setup refuses it on CPU, where it has no kernel
        model = runtime.convert_sync_bn(model)
    train_step = build_train_step(cfg, model, plan.steps_per_epoch, plan.total_steps, rt["world_size"],
                                  make_scaler=make_scaler)
    model, net = train_step.model, train_step.net
    log.info("model %s: %s trainable parameters; %d steps/epoch, %d steps, world size %d, %d threads",
             cfg["model"]["name"], f"{count_params(model):,}", plan.steps_per_epoch, plan.total_steps,
             rt["world_size"], rt["threads"])
    faults = dataset.data_faults()
    if faults["records_lost"]:
        log.warning("reader.train: %s", faults["summary"])

    start_epoch, start_batch, step, best, rng = 0, 0, 0, None, None
    resume_path = checkpoint.find_resume(resume, output_dir) if resume else None
    if resume_path:
        state = checkpoint.load(resume_path, model, train_step.optimizer, train_step.scaler, trust_weights)
        start_epoch, start_batch, step, best = state["epoch"], state.get("batch", 0), state["step"], state.get("best")
        rng = state["rng"]
        log.info("resumed from %s (epoch %d, batch %d, step %d)", resume_path, start_epoch, start_batch, step)
    run = _Run(cfg, train_cfg, output_dir, model, train_step, val, metric, rank0, best)

    for epoch in plan.epoch_range(start_epoch, step):
        sampler.set_epoch(epoch, start_batch)
        dataset.set_epoch(epoch)
        paddle.seed(seed * 100003 + epoch)  # dropout etc.: a function of (seed, epoch), so resume is exact
        if start_batch:
            checkpoint.restore_rng(rng)     # inside an epoch: the RNG as it was at that batch
        net.train()
        meter, tic, i = _Meter(len(loader)), time.perf_counter(), start_batch - 1
        for i, batch in enumerate(loader, start_batch):
            meter.data_time(time.perf_counter() - tic)
            if "index" not in batch:  # every sample of this batch was unreadable (and logged)
                meter.skipped += batch["num_skipped"]
                tic = time.perf_counter()
                continue
            update = (i + 1) % accum == 0 or i + 1 == len(loader)
            losses = train_step(batch, update)
            meter.update(losses, len(batch["index"]), batch["num_skipped"], time.perf_counter() - tic,
                         (epoch + 1, i + 1, step))
            step += update
            inside = i + 1 < len(loader) and step != plan.max_steps
            if (i + 1) % train_cfg["log_interval"] == 0 or not inside:
                meter.log(epoch, i, step, train_step, run.writer, plan.remaining_batches(epoch, i, step))
            if update and inside:
                run.step_end(epoch, i + 1, step, meter)
            if step == plan.max_steps:
                break
            tic = time.perf_counter()
        start_batch = 0
        finished = step == plan.max_steps or (plan.max_steps is None and epoch + 1 == plan.epochs)
        run.epoch_end(epoch, i + 1, len(loader), step, meter, finished, faults)
        if finished:
            break
    return model, run.finish()


class _Run:
    """What happens between steps: evaluation, best/ and checkpoints, at step or epoch intervals."""

    def __init__(self, cfg, train_cfg, output_dir, model, train_step, val, metric, rank0, best):
        self.cfg, self.t, self.output_dir, self.model, self.train_step = cfg, train_cfg, output_dir, model, train_step
        self.val, self.metric, self.rank0, self.best = val, metric, rank0, best
        self.amp = C.section(train_cfg, "amp", C.AMP_KEYS)
        self.writer = _visualdl(output_dir) if rank0 else None
        self.metrics, self.evaluated_at = {}, None

    def step_end(self, epoch, batch, step, meter):
        if self.t["eval_steps"] and step % self.t["eval_steps"] == 0:
            self.evaluate(epoch, step)
        if self.t["save_steps"] and step % self.t["save_steps"] == 0:
            self.save(f"step_{step}", {"epoch": epoch, "batch": batch, "step": step}, meter)

    def epoch_end(self, epoch, batch, batches, step, meter, finished, faults):
        every = lambda key, n: self.t[key] and n % self.t[key] == 0  # noqa: E731
        if meter.skipped or faults["records_lost"]:
            log.warning("epoch %d: skipped %d unreadable samples%s", epoch + 1, meter.skipped,
                        f"; {faults['summary']}" if faults["records_lost"] else "")
        if self.val and (finished or every("eval_interval", epoch + 1) or every("eval_steps", step)):
            self.evaluate(epoch, step)
        whole = batch >= batches   # False when max_steps ends training inside an epoch
        if finished or every("save_interval", epoch + 1) or every("save_steps", step):
            name, state = (f"epoch_{epoch + 1}", {"epoch": epoch + 1, "batch": 0, "step": step}) if whole else \
                (f"step_{step}", {"epoch": epoch, "batch": batch, "step": step})
            self.save(name, state, meter)

    def evaluate(self, epoch, step):
        if self.val is None or self.evaluated_at == step:
            return
        self.metrics, self.evaluated_at = evaluate(self.model, self.val, self.metric, self.amp), step
        log.info("eval at epoch %d, step %d: %s", epoch + 1, step, _fmt(self.metrics))
        if self.writer:
            for k, v in self.metrics.items():
                self.writer.add_scalar(f"eval/{k}", v, step)
        key = self.t["best_metric"]
        if key and (self.best is None or _better(self.metrics[key], self.best, self.t["best_mode"])):
            self.best = self.metrics[key]
            if self.rank0:
                checkpoint.save(os.path.join(self.output_dir, "best"), self.model, state={
                    "epoch": epoch + 1, "step": step, "metrics": self.metrics, "config": self.cfg})

    def save(self, name, state, meter):
        meter.check_finite()   # never write a checkpoint of diverged weights
        if self.rank0:
            root = os.path.join(self.output_dir, "checkpoints")
            state.update(best=self.best, metrics=self.metrics, config=self.cfg)
            checkpoint.save(os.path.join(root, name), self.model, self.train_step.optimizer,
                            self.train_step.scaler, state)
            checkpoint.prune(root, self.t["keep_last"])

    def finish(self):
        if self.rank0:
            checkpoint.save_weights(os.path.join(self.output_dir, "final", "model.pdparams"), self.model)
            if self.metrics:
                write_metrics(self.metrics, self.output_dir)
            if self.writer:
                self.writer.close()
        return self.metrics


def _check_best_metric(train_cfg, metric):
    key = train_cfg["best_metric"]
    if key is None:
        return
    if metric is None:
        raise ConfigError(f"train.best_metric is '{key}' but the recipe has no reader.val to evaluate")
    names = list(metric.names()) + ["loss"]
    if key not in names:
        raise ConfigError(f"train.best_metric '{key}' is not a metric of {type(metric).__name__}"
                          f"{did_you_mean(key, names)}; known: {', '.join(names)}")


def write_metrics(metrics, output_dir):
    path = os.path.join(output_dir, "metrics.json")
    with open(path + ".tmp", "w") as f:
        json.dump({k: float(v) for k, v in metrics.items()}, f, indent=1)
    os.replace(path + ".tmp", path)


def _better(a, b, mode):
    return a > b if mode == "max" else a < b


def _fmt(d):
    return " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())


def _visualdl(output_dir):
    from visualdl import LogWriter
    return LogWriter(logdir=os.path.join(output_dir, "vdl"))


class _Meter:
    """Running averages for the log line: losses, samples/s, reader vs step time, ETA, memory.

    Losses are summed as tensors and read once per log line (one host synchronisation), which is
    also where a non-finite loss is caught (outside fp16 loss scaling, which skips such steps).
    """

    def __init__(self, batches):
        self.batches, self.skipped = batches, 0
        self._reset()

    def _reset(self):
        self.sums, self.n, self.samples, self.t_data, self.t_step = {}, 0, 0, 0.0, 0.0
        self.span = None   # (epoch, first batch, first step) of the batches summed

    def data_time(self, t):
        self.t_data += t

    def update(self, losses, batch_size, skipped, step_time, where):
        self.span = self.span or where
        self.last = where
        for k, v in losses.items():
            v = v.astype("float32").reshape([])
            self.sums[k] = self.sums[k] + v if k in self.sums else v
        self.n += 1
        self.samples += batch_size
        self.skipped += skipped
        self.t_step += step_time

    def averages(self):
        keys = sorted(self.sums)
        if not keys:
            return {}
        values = paddle.stack([self.sums[k] for k in keys]).numpy().astype(np.float64) / self.n
        return dict(zip(keys, values.tolist()))

    def check_finite(self, avg=None, scaler=None):
        avg = self.averages() if avg is None else avg
        if (scaler is None or not scaler.is_enable()) and not all(math.isfinite(v) for v in avg.values()):
            (epoch, b0, s0), (_, b1, s1) = self.span, self.last
            where = f"batch {b0}" if b0 == b1 else f"one of batches {b0}-{b1}"
            steps = f"step {s0 + 1}" if s1 == s0 else f"steps {s0 + 1}-{s1 + 1}"
            raise NonFiniteLoss(f"loss is {avg.get('loss')} in epoch {epoch}, {where} (optimizer {steps}); "
                                f"lower the lr or check the data (train.log_interval: 1 names the exact batch)")

    def log(self, epoch, i, step, train_step, writer, remaining):
        """Called on every rank: the logged losses are averaged over the ranks."""
        if not self.n:
            return
        avg = self.averages()
        self.check_finite(avg, train_step.scaler)
        world_size = runtime.world()[0]
        if world_size > 1:
            t = paddle.to_tensor([avg[k] for k in sorted(avg)], dtype="float64")
            paddle.distributed.all_reduce(t)
            avg = dict(zip(sorted(avg), (t / world_size).tolist()))
        lr = train_step.optimizer.get_lr()
        if runtime.world()[1] == 0:
            eta = self.t_step / self.n * remaining
            log.info("epoch %d batch %d/%d step %d %s lr %.3g | %.1f samples/s reader %.0f%% of step | "
                     "eta %s | mem %.0f MB%s", epoch + 1, i + 1, self.batches, step, _fmt(avg), lr,
                     self.samples / max(self.t_step, 1e-9), 100 * self.t_data / max(self.t_step, 1e-9),
                     _duration(eta), runtime.peak_memory_mb(),
                     f" | skipped {self.skipped} bad samples" if self.skipped else "")
            if writer:
                for k, v in avg.items():
                    writer.add_scalar(f"train/{k}", v, step)
                writer.add_scalar("train/lr", lr, step)
        self._reset()


def _duration(seconds):
    days, rest = divmod(int(seconds), 86400)
    return (f"{days}d " if days else "") + time.strftime("%H:%M:%S", time.gmtime(rest))
