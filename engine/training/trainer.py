"""The one training loop every recipe uses. It never names a model: models return their losses."""
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import time

import numpy as np
import paddle

from engine import config as C, distributed, runtime
from engine.builder import check_agreement, count_params
from engine.data import empty
from engine.model import unwrap
from engine.errors import ConfigError, did_you_mean
from engine.training import checkpoint
from engine.training.ema import ModelEMA
from engine.training.evaluator import evaluate
from engine.training.loggers import Loggers, check as check_loggers
from engine.training.optim import build_lr, build_optimizer, clip_grad_norm_
from engine.training.precision import decorate_o2, make_scaler

log = logging.getLogger("zoo")


# the reader share of a log interval above which the log says the reader is the bottleneck (once per run)
READER_HINT_SHARE = 0.5


class NonFiniteLoss(ConfigError):
    """A NaN/Inf loss outside fp16 loss scaling: training cannot go on meaningfully."""


class TrainStep:
    """One micro-batch of training, the same code for the trainer, tools/benchmark.py and
    tools/amp_check.py: forward under autocast, backward of the scaled loss / accum_steps, and when
    `update` (the last micro-batch of an accumulation) unscale, clip, step, scaler update, free the
    gradients and advance the LR schedule. Freed, not zeroed (PyTorch's set_to_none): zeroed buffers
    would be alive through the next forward, at the step's peak (docs/performance.md#cpu-environment).
    Under data parallel the gradients of an accumulation are all-reduced once, at its last
    micro-batch. Returns the detached losses: no host synchronisation.
    """

    def __init__(self, net, optimizer, scaler, lr=None, amp=None, accum_steps=1, clip_grad_norm=None,
                 after_forward=None):
        self.net, self.optimizer, self.scaler, self.lr = net, optimizer, scaler, lr
        self.amp = amp or C.AmpSection()
        self.accum_steps, self.clip_grad_norm = accum_steps, clip_grad_norm
        self.after_forward = after_forward   # runtime.heap_trim's: the heap's free pages back before the peak
        self.last_lr = None   # the lr of the last update (the schedule has moved on by then)

    @property
    def model(self):
        return unwrap(self.net)

    def __call__(self, batch, update=True):
        no_sync = isinstance(self.net, paddle.DataParallel) and not update
        with self.net.no_sync() if no_sync else contextlib.nullcontext():
            with runtime.autocast(self.amp):
                losses = self.net(batch)
            if self.after_forward:
                self.after_forward()
            self.scaler.scale(losses["loss"] / self.accum_steps).backward()
        if update:
            self.scaler.unscale_(self.optimizer)
            if self.clip_grad_norm:
                clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            self.last_lr = self.optimizer.get_lr()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.clear_grad(set_to_zero=False)
            if self.lr is not None:
                self.lr.step()
        return {k: v.detach() for k, v in losses.items()}


def build_train_step(cfg, model, steps_per_epoch, total_steps, world_size=1, amp=None):
    """Optimizer, LR schedule, loss scaler, AMP O2 decoration and data parallel around `model`;
    `amp` (an AmpSection) replaces the recipe's train.amp (tools/amp_check.py)."""
    amp = amp or cfg.train.amp
    lr = build_lr(cfg["lr"], steps_per_epoch, total_steps)
    optimizer = build_optimizer(cfg["optimizer"], model, lr)
    if amp.enable and amp.level == "O2":
        model, optimizer = decorate_o2(model, optimizer, amp)
    net = paddle.DataParallel(model) if world_size > 1 else model
    return TrainStep(net, optimizer, make_scaler(amp), lr, amp, cfg.train.accum_steps, cfg.train.clip_grad_norm,
                     runtime.heap_trim(cfg.runtime))


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where training is: in epoch `epoch` (from 0), `batch` batches of it done, `step` optimizer
    steps done in all. A checkpoint records it as it is; the end of an epoch is (epoch + 1, 0, step)."""
    epoch: int = 0
    batch: int = 0
    step: int = 0


class Plan:
    """How long training runs: `train.epochs`, or `train.max_steps` optimizer steps (not both)."""

    def __init__(self, train_cfg, batches_per_epoch):
        epochs, max_steps = train_cfg.epochs, train_cfg.max_steps
        if (epochs is None) == (max_steps is None):
            unset = " (unset one with -o train.epochs=null or -o train.max_steps=null)" if epochs else ""
            raise ConfigError("train: give train.epochs or train.max_steps (not both); "
                              f"got epochs={epochs}, max_steps={max_steps}{unset}")
        if not train_cfg.save_interval and not train_cfg.save_steps:
            raise ConfigError("train.save_interval and train.save_steps are both 0: no checkpoint would be "
                              "written until the end, and a killed run could not resume; set one of them >= 1")
        self.accum = train_cfg.accum_steps
        self.batches = batches_per_epoch
        self.steps_per_epoch = -(-batches_per_epoch // self.accum)  # a last partial accumulation steps too
        self.max_steps = max_steps
        self.total_steps = max_steps or self.steps_per_epoch * epochs
        self.epochs = epochs or -(-max_steps // self.steps_per_epoch)

    def epoch_range(self, start, step):
        if self.max_steps is None:
            return range(start, self.epochs)
        return itertools.count(start) if step < self.max_steps else range(0)

    def remaining_batches(self, at):
        if self.max_steps is None:
            return (self.batches - at.batch) + self.batches * (self.epochs - at.epoch - 1)
        return (self.max_steps - at.step) * self.accum

    def done(self, at):
        """Nothing left to train from `at` (a resumed finished run)."""
        return at.step >= self.total_steps if self.max_steps else at.epoch >= self.epochs

    def finished(self, at):
        """After the last batch of epoch `at.epoch`, or at max_steps."""
        return at.step == self.max_steps or (self.max_steps is None and at.epoch + 1 == self.epochs)


def dropout_seed(seed, epoch, rank):
    """paddle's global seed for an epoch of a rank: dropout masks differ between ranks (as between the
    samples of one batch), and rank 0 draws what one process draws. Augmentation needs none of this:
    it is a function of (seed, epoch, sample index) (engine/data.py), the same on any number of ranks."""
    return seed * 100003 + epoch + rank * 1000003


def fit(session, output_dir, resume=None):
    """Train the recipe of `session` (the run's one engine.session.Session, not yet set up) into
    `output_dir`; returns (model, last metrics)."""
    run = _Training(session, output_dir)
    at = run.resume(resume)
    cfg = session.cfg
    plan, loader, train_step, seed = run.plan, run.loader, run.train_step, cfg.runtime.seed
    if run.stop:
        log.info("%s stopped early (train.early_stop) at step %d; nothing to train. Its best weights are in %s",
                 output_dir, at.step, os.path.join(output_dir, "final"))
        return run.model, run.evaluation.metrics
    if plan.done(at):
        log.info("%s is finished: its checkpoint %s is at the end (epoch %d, step %d of %d); nothing to train. "
                 "Its weights are in %s; to train longer raise train.epochs or train.max_steps with --resume",
                 output_dir, run.resumed_from, at.epoch, at.step, plan.total_steps,
                 os.path.join(output_dir, "final"))
        return run.model, run.evaluation.metrics
    run.begin()
    first_epoch = at.epoch
    for epoch in plan.epoch_range(at.epoch, at.step):
        run.sampler.set_epoch(epoch, at.batch)
        run.dataset.set_epoch(epoch)
        paddle.seed(dropout_seed(seed, epoch, run.rank))  # a function of (seed, epoch, rank): resume is exact
        if at.batch:
            checkpoint.restore_rng(run.rng, run.rank, run.world_size)  # inside an epoch: as it was at that batch
        train_step.net.train()
        meter = _Meter(len(loader), warm=_Meter.WARMUP_STEPS if epoch == first_epoch else 0)
        tic, at = time.perf_counter(), Progress(epoch, at.batch, at.step)
        for i, batch in enumerate(loader, at.batch):
            meter.data_time(time.perf_counter() - tic)
            if run.skip(batch, Progress(epoch, i, at.step)):
                meter.skipped += batch["num_skipped"]
                at, tic = Progress(epoch, i + 1, at.step), time.perf_counter()
                continue
            update = (i + 1) % plan.accum == 0 or i + 1 == len(loader)
            losses = train_step(batch, update)
            inside = i + 1 < len(loader) and at.step + update != plan.max_steps
            log_now = (i + 1) % cfg.train.log_interval == 0 or not inside
            if log_now and run.device_sync:
                # the card runs the queued kernels after the loop has moved on: wait for them before the
                # clock is read, so the interval's time is the card's and the reader's share of it true
                run.device_sync()
            meter.update(losses, len(batch["index"]), batch["num_skipped"], time.perf_counter() - tic,
                         Progress(epoch, i + 1, at.step))
            at = Progress(epoch, i + 1, at.step + update)
            if log_now:
                run.reader_hint(meter.log(at, train_step, run.writer, plan.remaining_batches(at)), meter)
            if update and inside:
                for hook in run.hooks:
                    hook.after_step(at, meter)
            if at.step == plan.max_steps or run.stop:
                break
            tic = time.perf_counter()
        finished = plan.finished(at) or run.stop
        for hook in run.hooks:
            hook.after_epoch(at, meter, finished)
        if finished:
            break
        at = Progress(epoch + 1, 0, at.step)
    for hook in run.hooks:
        hook.after_train()
    return run.model, run.evaluation.metrics


def wants_sync_bn(sync_bn, rt):
    """Whether to convert BatchNorm to SyncBatchNorm. Paddle has no CPU kernel for it; one CPU process
    sees the whole batch, so plain BatchNorm computes the same statistics (PaddleSeg builds BatchNorm2D
    on a CPU too). Several CPU processes would each normalise their own share: refused."""
    if not sync_bn or rt["device"] == "gpu":
        return bool(sync_bn)
    if rt["world_size"] > 1:
        raise ConfigError(f"runtime.sync_bn: SyncBatchNorm has no CPU kernel in Paddle and {rt['world_size']} "
                          "CPU processes would each normalise their own share; set it false (or train on GPUs)")
    log.info("runtime.sync_bn: one process on the CPU: plain BatchNorm, which computes the same statistics")
    return False


class _Training:
    """Everything one training run holds, assembled in the order that fixes its random streams: the
    runtime and seeds, the model, the readers, the resolved config.yaml, the pretrained weights, the
    optimizer; and its hooks (evaluation, checkpoints, reports) called at three points of the loop."""

    def __init__(self, session, output_dir):
        cfg, t = session.cfg, session.cfg.train
        rt = session.setup()
        sync_bn = wants_sync_bn(cfg.runtime.sync_bn, rt)
        self.session, self.output_dir = session, output_dir
        self.rank, self.world_size = rt["rank"], rt["world_size"]
        # who writes the run's files (config.yaml, checkpoints, best/, final/, metrics.json): rank 0, and
        # with train.save_on_each_node the first process of every node (hosts without a shared disk)
        self.saves = rt["rank"] == 0 or (t.save_on_each_node and rt["local_rank"] == 0)
        model = session.model()
        self.loader, self.dataset, self.sampler = session.loader("train")
        self.plan = Plan(t, len(self.loader))
        check_agreement(model, self.dataset, "train")
        val, metric = None, None
        if "val" in cfg.get("reader", {}):
            val, val_set, _ = session.loader("val")
            check_agreement(model, val_set, "val")
            metric = session.metric(val_set)
        _check_best_metric(t, metric)
        # config.yaml and every checkpoint's state (num_workers: auto as resolved on this machine)
        self.workers = {"train": self.loader.num_workers, **({"val": val.num_workers} if val else {})}
        self.resolved = cfg.resolved(world_size=rt["world_size"], num_workers=self.workers)
        if t.pretrained:
            session.load_weights(model, t.pretrained, t.weights_format, strict=False, log=log.info)
        if sync_bn:
            model = runtime.convert_sync_bn(model)
        self.train_step = build_train_step(cfg, model, self.plan.steps_per_epoch, self.plan.total_steps,
                                           rt["world_size"], amp=session.train_amp)
        self.eval_amp = session.eval_amp   # resolved before training: a bad eval.amp stops the run now
        self.model = self.train_step.model
        log.info("model %s: %s trainable parameters; %d steps/epoch, %d steps, world size %d, %d threads",
                 cfg["model"]["name"], f"{count_params(self.model):,}", self.plan.steps_per_epoch,
                 self.plan.total_steps, rt["world_size"], rt["threads"])
        # with skip_bad, a rank may get a batch of unreadable samples only: every rank must then skip it,
        # or the others would wait for its gradients in the all-reduce (a hang)
        self.agree_on_skips = self.world_size > 1 and getattr(self.dataset, "skip_bad", False)
        self.faults = self.dataset.data_faults()
        if self.faults["records_lost"]:
            log.warning("reader.train: %s", self.faults["summary"])
        check_loggers(t.loggers)
        _check_early_stop(t, metric)
        self.writer = None   # begin(): a finished run resumed writes nothing
        self.stop = False    # set by a hook (EarlyStopHook): the loop ends after this step's hooks
        self.evaluation = EvaluateHook(self, val, metric)
        self.ema = EmaHook(self, t.ema) if t.ema.enable else None
        stopper = [EarlyStopHook(self, t)] if t.early_stop.patience else []
        # in this order at each point: the average moves before it is evaluated, the stop follows the
        # evaluation, and the checkpoint records all of them
        self.hooks = [ReportHook(self), *([self.ema] if self.ema else []), self.evaluation, *stopper,
                      CheckpointHook(self)]
        self.rng, self.resumed_from = None, None
        # on a GPU the clock is read after a device sync (fit); on a CPU the work is done when the step returns
        self.device_sync = runtime.clock_sync()
        self.device, self.threads, self.hinted = rt["device"], rt["threads"], False

    def reader_hint(self, share, meter):
        """Once per run, when the loop waited for the reader over half of a log interval's time. The
        epoch's first interval is left out: it holds the reader processes' start."""
        if self.hinted or share is None or share <= READER_HINT_SHARE or meter.intervals < 2 or self.rank:
            return
        self.hinted = True
        n = self.workers["train"]
        cpu = (f"; on a CPU they share the cores with runtime.num_threads (now {self.threads})"
               if self.device == "cpu" else "")
        log.warning("the reader is the bottleneck (%.0f%% of the last %d batches' time went waiting for it): "
                    "raise reader.train.num_workers (now %d)%s, or make samples cheaper to read "
                    "(docs/performance.md, Feeding the trainer)", 100 * share, meter.last_n, n, cpu)

    def begin(self):
        """The run's config.yaml and its scalars (VisualDL, scalars.jsonl), once there is something to train."""
        if self.saves:
            os.makedirs(self.output_dir, exist_ok=True)
            C.dump(self.resolved, os.path.join(self.output_dir, "config.yaml"))
        t = self.session.cfg.train
        self.writer = Loggers(self.output_dir, t.loggers, self.resolved, t.wandb) if self.rank == 0 else None

    def close(self):
        if self.writer:
            self.writer.close()

    def evaluated_weights(self):
        """The weights evaluation, best/ and final/ use: the moving average's inside the block when
        train.ema is on (as ppdet's use_ema), else the model's own."""
        return self.ema.ema.applied(self.model) if self.ema else contextlib.nullcontext(self.model)

    def skip(self, batch, at):
        """Whether this batch is skipped: it is empty (every sample unreadable), or under data parallel
        another rank's is."""
        mine = empty(batch)
        if not self.agree_on_skips:
            return mine
        anyone = distributed.any_rank(mine)
        if anyone and self.rank == 0:
            log.warning("epoch %d batch %d: %s every sample unreadable; every rank skips this batch",
                        at.epoch + 1, at.batch + 1, "this rank's batch had" if mine else "another rank's batch had")
        return anyone

    def resume(self, resume):
        """The position to start from: a checkpoint's (restoring weights, optimizer, scaler, best), or 0."""
        path = checkpoint.find_resume(resume, self.output_dir) if resume else None
        if not path:
            return Progress()
        state = checkpoint.load(path, self.model, self.train_step.optimizer, self.train_step.scaler,
                                self.session.trust_weights)
        at = Progress(state["epoch"], state.get("batch", 0), state["step"])
        self.evaluation.best, self.rng = state.get("best"), state["rng"]
        self.evaluation.metrics, self.resumed_from = state.get("metrics") or {}, path
        self.evaluation.best_metrics = state.get("best_metrics") or {}
        saved = state.get("hooks") or {}
        for hook in self.hooks:
            if hook.name:
                if hook.name not in saved:   # train.<name> was off when it was written: it starts here
                    log.info("resume: %s holds no %s state (train.%s was off): it starts at step %d",
                             path, hook.name, hook.name, at.step)
                    continue
                tensors = checkpoint.read_weights(os.path.join(path, f"{hook.name}.pdparams"), self.session.trust_weights) \
                    if os.path.isfile(os.path.join(path, f"{hook.name}.pdparams")) else None
                hook.restore(saved[hook.name], tensors)
        if not self.plan.done(at):   # fit says a finished run is finished instead
            log.info("resumed from %s (epoch %d, batch %d, step %d)", path, at.epoch + 1, at.batch, at.step)
        return at


class Hook:
    """What runs between steps. `after_step` follows an optimizer step inside an epoch (not the
    epoch's last), `after_epoch` the epoch's last batch (`finished`: training ends there),
    `after_train` the loop. A hook with a `name` has a state that checkpoints keep: `state()` ->
    (JSON-able data, tensors or None; the tensors go to `<name>.pdparams`), `restore(data, tensors)`."""
    name = None

    def __init__(self, run):
        self.run = run

    def after_step(self, at, meter):
        pass

    def after_epoch(self, at, meter, finished):
        pass

    def after_train(self):
        pass


class ReportHook(Hook):
    """Unreadable samples per epoch; the VisualDL writer closed at the end."""

    def after_epoch(self, at, meter, finished):
        faults = self.run.faults
        if meter.skipped or faults["records_lost"]:
            log.warning("epoch %d: skipped %d unreadable samples%s", at.epoch + 1, meter.skipped,
                        f"; {faults['summary']}" if faults["records_lost"] else "")

    def after_train(self):
        self.run.close()


class EvaluateHook(Hook):
    """Evaluation at train.eval_steps / train.eval_interval and at the end; best/ by train.best_metric."""

    def __init__(self, run, val, metric):
        super().__init__(run)
        self.val, self.metric, self.t = val, metric, run.session.cfg.train
        self.best, self.metrics, self.evaluated_at, self.best_metrics = None, {}, None, {}

    def after_step(self, at, meter):
        if self.t.eval_steps and at.step % self.t.eval_steps == 0:
            self.evaluate(at)

    def after_epoch(self, at, meter, finished):
        if self.val and (finished or _every(self.t.eval_interval, at.epoch + 1) or _every(self.t.eval_steps, at.step)):
            self.evaluate(at)

    def evaluate(self, at):
        if self.val is None or self.evaluated_at == at.step:
            return
        run = self.run
        with run.evaluated_weights() as model:
            self.metrics, self.evaluated_at = evaluate(model, self.val, self.metric, run.eval_amp), at.step
            log.info("eval at epoch %d, step %d%s: %s", at.epoch + 1, at.step, " (EMA weights)" if run.ema else "",
                     _fmt(self.metrics))
            if run.writer:
                run.writer.eval(at, self.metrics)
            key = self.t.best_metric
            if key and (self.best is None or _better(self.metrics[key], self.best, self.t.best_mode)):
                self.best, self.best_metrics = self.metrics[key], self.metrics
                if run.saves:
                    checkpoint.save(os.path.join(run.output_dir, "best"), model, state={
                        "epoch": at.epoch + 1, "step": at.step, "metrics": self.metrics, "config": run.resolved})

    def after_train(self):
        # stopped early: final/ holds the best weights (CheckpointHook), and these are their metrics
        metrics = self.best_metrics if self.run.stop and self.best_metrics else self.metrics
        if self.run.saves and metrics:
            write_metrics(metrics, self.run.output_dir)


class EmaHook(Hook):
    """train.ema: the moving average (engine/training/ema.py) moved after every optimizer step."""
    name = "ema"

    def __init__(self, run, ema_cfg):
        super().__init__(run)
        self.ema = ModelEMA(run.model, ema_cfg.decay, ema_cfg.decay_type, ema_cfg.cycle_epoch, ema_cfg.black_list)
        self.at_step = None   # the optimizer step the average last took

    def after_step(self, at, meter):
        self._update(at)

    def after_epoch(self, at, meter, finished):
        self._update(at)      # the epoch's last step (unless its last batches were skipped: no step then)

    def _update(self, at):
        if at.step != self.at_step and at.step > 0:
            self.ema.update(self.run.model, at.epoch)
            self.at_step = at.step

    def state(self):
        counters, tensors = self.ema.state()
        return dict(counters, at_step=self.at_step), tensors

    def restore(self, data, tensors):
        self.ema.restore(data, tensors)
        self.at_step = data["at_step"]


class EarlyStopHook(Hook):
    """train.early_stop: training ends once train.best_metric has not improved by min_delta for
    `patience` evaluations in a row; final/ then holds best/'s weights."""
    name = "early_stop"

    def __init__(self, run, t):
        super().__init__(run)
        self.key, self.mode, self.patience, self.min_delta = t.best_metric, t.best_mode, t.early_stop.patience, \
            t.early_stop.min_delta
        self.best, self.waited, self.seen = None, 0, None

    def after_step(self, at, meter):
        self._check(at)

    def after_epoch(self, at, meter, finished):
        self._check(at)

    def _check(self, at):
        ev = self.run.evaluation
        if ev.evaluated_at != at.step or self.seen == at.step:
            return
        self.seen, value = at.step, ev.metrics[self.key]
        delta = value - self.best if self.best is not None else None
        if delta is None or (delta > self.min_delta if self.mode == "max" else -delta > self.min_delta):
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            self.run.stop = True
            log.info("early stop at epoch %d, step %d: %s has not improved by more than %g for %d evaluations "
                     "(best %.4f); final/ holds the best weights", at.epoch + 1, at.step, self.key, self.min_delta,
                     self.waited, self.best)

    def state(self):
        return {"best": self.best, "waited": self.waited, "seen": self.seen, "stopped": self.run.stop}, None

    def restore(self, data, tensors):
        self.best, self.waited, self.seen = data["best"], data["waited"], data["seen"]
        self.run.stop = bool(data["stopped"])


class CheckpointHook(Hook):
    """Checkpoints at train.save_steps / train.save_interval and at the end (kept: train.keep_last),
    and final/model.pdparams."""

    def after_step(self, at, meter):
        t = self.run.session.cfg.train
        if t.save_steps and at.step % t.save_steps == 0:
            self.save(f"step_{at.step}", at, meter)

    def after_epoch(self, at, meter, finished):
        t = self.run.session.cfg.train
        if finished or _every(t.save_interval, at.epoch + 1) or _every(t.save_steps, at.step):
            if at.batch >= self.run.plan.batches:   # the whole epoch; max_steps may end training inside it
                self.save(f"epoch_{at.epoch + 1}", Progress(at.epoch + 1, 0, at.step), meter)
            else:
                self.save(f"step_{at.step}", at, meter)

    def save(self, name, at, meter):
        meter.check_finite()   # never write a checkpoint of diverged weights
        run = self.run
        rng = distributed.gather(checkpoint.rng_state())   # every rank's: dropout differs between ranks
        if run.saves:
            root = os.path.join(run.output_dir, "checkpoints")
            state = dataclasses.asdict(at)
            state.update(best=run.evaluation.best, metrics=run.evaluation.metrics, config=run.resolved,
                         best_metrics=run.evaluation.best_metrics)
            kept = {h.name: h.state() for h in run.hooks if h.name}
            state["hooks"] = {name: data for name, (data, _) in kept.items()}
            extra = {f"{name}.pdparams": tensors for name, (_, tensors) in kept.items() if tensors is not None}
            checkpoint.save(os.path.join(root, name), run.model, run.train_step.optimizer, run.train_step.scaler,
                            state, rng=rng, extra=extra)
            checkpoint.prune(root, run.session.cfg.train.keep_last)

    def after_train(self):
        run = self.run
        if not run.saves:
            return
        final = os.path.join(run.output_dir, "final", "model.pdparams")
        best = os.path.join(run.output_dir, "best", "model.pdparams")
        if run.stop and os.path.isfile(best):   # stopped early: the best weights, not the last
            checkpoint.copy_weights(best, final)
            return
        with run.evaluated_weights() as model:
            checkpoint.save_weights(final, model)


def _every(interval, n):
    return bool(interval) and n % interval == 0


def _check_best_metric(train_cfg, metric):
    key = train_cfg.best_metric
    if key is None:
        return
    if metric is None:
        raise ConfigError(f"train.best_metric is '{key}' but the recipe has no reader.val to evaluate")
    names = list(metric.names()) + ["loss"]
    if key not in names:
        raise ConfigError(f"train.best_metric '{key}' is not a metric of {type(metric).__name__}"
                          f"{did_you_mean(key, names)}; known: {', '.join(names)}")


def _check_early_stop(train_cfg, metric):
    if not train_cfg.early_stop.patience:
        return
    if metric is None or train_cfg.best_metric is None:
        raise ConfigError("train.early_stop.patience is set, but the recipe has no metric to stop on: it needs "
                          "reader.val and train.best_metric" + ("" if metric is None else
                                                                f" (one of: {', '.join(list(metric.names()) + ['loss'])})"))


def write_metrics(metrics, output_dir):
    path = os.path.join(output_dir, "metrics.json")
    with open(path + ".tmp", "w") as f:
        json.dump({k: float(v) for k, v in metrics.items()}, f, indent=1)
    os.replace(path + ".tmp", path)


def _better(a, b, mode):
    return a > b if mode == "max" else a < b


def _fmt(d):
    return " ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())


class _Meter:
    """Running averages for the log line: losses, samples/s, reader vs step time, ETA, memory.

    Losses are summed as tensors and read once per log line (one host synchronisation), which is
    also where a non-finite loss is caught (outside fp16 loss scaling, which skips such steps).
    """

    # the first steps of a process build the fused operators (once per machine), oneDNN's kernels and
    # caches: the ETA leaves them out, and says "?" until there is a step to go by
    WARMUP_STEPS = 2

    def __init__(self, batches, warm=WARMUP_STEPS):
        self.batches, self.skipped, self.warm = batches, 0, warm
        self.intervals, self.last_n = 0, 0   # log lines written, batches in the last one
        self._reset()

    def _reset(self):
        self.sums, self.n, self.samples, self.t_data, self.t_step = {}, 0, 0, 0.0, 0.0
        self.t_eta, self.n_eta = 0.0, 0   # the steps past warm-up
        self.span = None   # Progress before the first of the batches summed

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
        if self.warm and self.intervals == 0 and self.n == 1 and runtime.world()[1] == 0:
            # a newcomer's first minutes: a run that builds its operators must not look stalled
            log.info("first step done in %.1f s (the first steps build kernels and caches: slower)", step_time)
        if self.warm:
            self.warm -= 1
        else:
            self.t_eta, self.n_eta = self.t_eta + step_time, self.n_eta + 1

    def eta(self, remaining):
        """The time left for `remaining` batches at the mean step time past warm-up ("?" before one)."""
        return _duration(self.t_eta / self.n_eta * remaining) if self.n_eta else "?"

    def averages(self):
        keys = sorted(self.sums)
        if not keys:
            return {}
        values = paddle.stack([self.sums[k] for k in keys]).numpy().astype(np.float64) / self.n
        return dict(zip(keys, values.tolist()))

    def check_finite(self, avg=None, scaler=None):
        avg = self.averages() if avg is None else avg
        if (scaler is None or not scaler.is_enable()) and not all(math.isfinite(v) for v in avg.values()):
            epoch, (b0, s0), (b1, s1) = self.span.epoch + 1, (self.span.batch, self.span.step), (self.last.batch, self.last.step)
            where = f"batch {b0}" if b0 == b1 else f"one of batches {b0}-{b1}"
            steps = f"step {s0 + 1}" if s1 == s0 else f"steps {s0 + 1}-{s1 + 1}"
            raise NonFiniteLoss(f"loss is {avg.get('loss')} in epoch {epoch}, {where} (optimizer {steps}); "
                                f"lower the lr or check the data (train.log_interval: 1 names the exact batch)")

    def reader_share(self):
        """The part of the interval's time the loop waited for a batch (None before a step)."""
        return self.t_data / max(self.t_step, 1e-9) if self.n else None

    def log(self, at, train_step, writer, remaining):
        """Called on every rank: the logged losses are averaged over the ranks. Returns the interval's
        reader share (None when there was nothing to log)."""
        if not self.n:
            return None
        share = self.reader_share()
        self.intervals, self.last_n = self.intervals + 1, self.n
        avg = self.averages()
        self.check_finite(avg, train_step.scaler)
        world_size, rank = runtime.world()
        if world_size > 1:
            t = paddle.to_tensor([avg[k] for k in sorted(avg)], dtype="float64")
            paddle.distributed.all_reduce(t)
            avg = dict(zip(sorted(avg), (t / world_size).tolist()))
        lr = train_step.last_lr if train_step.last_lr is not None else train_step.optimizer.get_lr()
        if rank == 0:
            rate = self.samples / max(self.t_step, 1e-9)
            log.info("epoch %d batch %d/%d step %d %s lr %.3g | %.3g samples/s reader %.0f%% of step | "
                     "eta %s | mem %.0f MB%s", at.epoch + 1, at.batch, self.batches, at.step, _fmt(avg), lr,
                     rate, 100 * share, self.eta(remaining), runtime.peak_memory_mb(),
                     f" | skipped {self.skipped} bad samples" if self.skipped else "")
            if writer:
                writer.train(at, dict(avg, lr=lr, samples_per_s=rate, reader_share=share,
                                      peak_memory_mb=runtime.peak_memory_mb()))
        self._reset()
        return share


def _duration(seconds):
    days, rest = divmod(int(seconds), 86400)
    return (f"{days}d " if days else "") + time.strftime("%H:%M:%S", time.gmtime(rest))
