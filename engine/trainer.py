"""The one training loop every recipe uses. It never names a model: models return their losses."""
import contextlib
import json
import logging
import math
import os
import time

import paddle

from engine import checkpoint, config as C, runtime
from engine.builder import build_loader, build_metric, build_model, count_params
from engine.evaluator import evaluate
from engine.optim import build_lr, build_optimizer, clip_grad_norm_
from engine.registry import ConfigError

log = logging.getLogger("zoo")


class NonFiniteLoss(ConfigError):
    """A NaN/Inf loss outside fp16 loss scaling: training cannot go on meaningfully."""


def make_scaler(amp):
    """fp16 needs loss scaling; bf16 and fp32 do not (the scaler then passes everything through)."""
    return paddle.amp.GradScaler(enable=amp["enable"] and amp["dtype"] == "float16",
                                 init_loss_scaling=amp["init_loss_scaling"])


def fit(cfg, output_dir, resume=None, make_scaler=make_scaler):
    train_cfg = C.section(cfg, "train", C.TRAIN_KEYS)
    amp = C.section(train_cfg, "amp", C.AMP_KEYS)
    rt_cfg = C.section(cfg, "runtime", C.RUNTIME_KEYS)
    rt = runtime.setup(rt_cfg)
    cfg.setdefault("runtime", {})["world_size"] = rt["world_size"]
    seed, accum, rank0 = rt_cfg["seed"], train_cfg["accum_steps"], rt["rank"] == 0
    if rank0:
        os.makedirs(output_dir, exist_ok=True)
        C.dump(cfg, os.path.join(output_dir, "config.yaml"))

    runtime.seed_all(seed)
    model = build_model(cfg["model"])
    if train_cfg["pretrained"]:
        from engine.pretrained import load_pretrained
        load_pretrained(model, train_cfg["pretrained"], log=log.info)
    loader, dataset, sampler = build_loader(cfg, "train", seed, rt["world_size"], rt["rank"])
    val = build_loader(cfg, "val", seed, rt["world_size"], rt["rank"]) if "val" in cfg.get("reader", {}) else None
    metric = build_metric(cfg) if val else None
    steps_per_epoch = -(-len(loader) // accum)  # optimizer steps: a last partial accumulation steps too
    lr = build_lr(cfg["lr"], steps_per_epoch, train_cfg["epochs"])
    optimizer = build_optimizer(cfg["optimizer"], model, lr)
    scaler = make_scaler(amp)
    if amp["enable"] and amp["level"] == "O2":
        model, optimizer = paddle.amp.decorate(model, optimizer, level="O2", dtype=amp["dtype"])
    log.info("model %s: %s trainable parameters; %d steps/epoch, world size %d, %d threads",
             cfg["model"]["name"], f"{count_params(model):,}", steps_per_epoch, rt["world_size"], rt["threads"])
    if rt_cfg["sync_bn"]:  # GPU only: runtime.setup refuses it on CPU, where it has no kernel
        model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    net = paddle.DataParallel(model) if rt["world_size"] > 1 else model

    start_epoch, step, best = 0, 0, None
    resume_path = checkpoint.find_resume(resume, output_dir) if resume else None
    if resume_path:
        state = checkpoint.load(resume_path, model, optimizer, scaler)
        start_epoch, step, best = state["epoch"], state["step"], state.get("best")
        log.info("resumed from %s (epoch %d, step %d)", resume_path, start_epoch, step)
    writer = _visualdl(output_dir) if rank0 else None
    ckpt_root = os.path.join(output_dir, "checkpoints")
    metrics = {}

    for epoch in range(start_epoch, train_cfg["epochs"]):
        sampler.set_epoch(epoch)
        dataset.set_epoch(epoch)
        paddle.seed(seed * 100003 + epoch)  # dropout etc.: a function of (seed, epoch), so resume is exact
        net.train()
        meter = _Meter(len(loader), train_cfg["epochs"] - epoch)
        tic = time.perf_counter()
        for i, batch in enumerate(loader):
            meter.data_time(time.perf_counter() - tic)
            if "index" not in batch:  # every sample of this batch was unreadable (and logged)
                meter.skipped += int(batch["num_skipped"].item())
                continue
            update = (i + 1) % accum == 0 or i + 1 == len(loader)
            # gradients of the micro-batches of one accumulation are all-reduced once, at the last
            with net.no_sync() if rt["world_size"] > 1 and not update else contextlib.nullcontext():
                with paddle.amp.auto_cast(enable=amp["enable"], dtype=amp["dtype"], level=amp["level"]):
                    losses = net(batch)
                loss = losses["loss"]
                if not scaler.is_enable() and not math.isfinite(loss.item()):
                    raise NonFiniteLoss(f"loss is {loss.item()} at epoch {epoch + 1}, step {step + 1} "
                                        f"(batch {i + 1}); lower the lr or check the data")
                scaler.scale(loss / accum).backward()
            if update:
                scaler.unscale_(optimizer)
                if train_cfg["clip_grad_norm"]:
                    clip_grad_norm_(model.parameters(), train_cfg["clip_grad_norm"])
                scaler.step(optimizer)
                scaler.update()
                optimizer.clear_grad()
                lr.step()
                step += 1
            meter.update(losses, int(batch["index"].shape[0]), batch.get("num_skipped"),
                         time.perf_counter() - tic)
            if (i + 1) % train_cfg["log_interval"] == 0 or i + 1 == len(loader):
                meter.log(epoch, i, optimizer.get_lr(), writer, step, rt["world_size"])
            tic = time.perf_counter()

        last = epoch + 1 == train_cfg["epochs"]
        every = train_cfg["eval_interval"]
        if val and (last or (every and (epoch + 1) % every == 0)):
            metrics = evaluate(model, val[0], metric, amp)
            log.info("eval epoch %d: %s", epoch + 1, _fmt(metrics))
            if writer:
                for k, v in metrics.items():
                    writer.add_scalar(f"eval/{k}", v, step)
            key = train_cfg["best_metric"]
            if key and key in metrics and (best is None or _better(metrics[key], best, train_cfg["best_mode"])):
                best = metrics[key]
                if rank0:
                    checkpoint.save(os.path.join(output_dir, "best"), model, state={
                        "epoch": epoch + 1, "step": step, "metrics": metrics, "config": cfg})
        if rank0 and (last or (epoch + 1) % train_cfg["save_interval"] == 0):
            checkpoint.save(os.path.join(ckpt_root, f"epoch_{epoch + 1}"), model, optimizer, scaler, {
                "epoch": epoch + 1, "step": step, "best": best, "metrics": metrics, "config": cfg})
            checkpoint.prune(ckpt_root, train_cfg["keep_last"])

    if rank0:
        checkpoint.save_weights(os.path.join(output_dir, "final", "model.pdparams"), model)
        if metrics:
            write_metrics(metrics, output_dir)
        if writer:
            writer.close()
    return model, metrics


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
    """Running averages for the log line: losses, samples/s, reader vs step time, ETA, memory."""

    def __init__(self, steps, epochs_left):
        self.steps, self.epochs_left = steps, epochs_left
        self.sums, self.n, self.samples, self.skipped = {}, 0, 0, 0
        self.t_data = self.t_step = 0.0

    def data_time(self, t):
        self.t_data += t

    def update(self, losses, batch_size, skipped, step_time):
        for k, v in losses.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v.item())
        self.n += 1
        self.samples += batch_size
        self.skipped += int(skipped.item()) if skipped is not None else 0
        self.t_step += step_time

    def log(self, epoch, i, lr, writer, step, world_size):
        """Called on every rank: the logged losses are averaged over the ranks."""
        avg = {k: v / self.n for k, v in self.sums.items()}
        if world_size > 1:
            t = paddle.to_tensor([avg[k] for k in sorted(avg)], dtype="float64")
            paddle.distributed.all_reduce(t)
            avg = dict(zip(sorted(avg), (t / world_size).tolist()))
        if runtime.world()[1] != 0:
            self.sums, self.n, self.samples, self.t_data, self.t_step = {}, 0, 0, 0.0, 0.0
            return
        per_step = self.t_step / self.n
        eta = per_step * ((self.steps - i - 1) + self.steps * (self.epochs_left - 1))
        log.info("epoch %d step %d/%d %s lr %.3g | %.1f samples/s reader %.0f%% of step | eta %s | "
                 "mem %.0f MB%s", epoch + 1, i + 1, self.steps, _fmt(avg), lr,
                 self.samples / max(self.t_step, 1e-9), 100 * self.t_data / max(self.t_step, 1e-9),
                 time.strftime("%H:%M:%S", time.gmtime(eta)), runtime.peak_memory_mb(),
                 f" | skipped {self.skipped} bad samples" if self.skipped else "")
        if writer:
            for k, v in avg.items():
                writer.add_scalar(f"train/{k}", v, step)
            writer.add_scalar("train/lr", lr, step)
        self.sums, self.n, self.samples, self.t_data, self.t_step = {}, 0, 0, 0.0, 0.0
