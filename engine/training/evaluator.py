"""Evaluation over a reader: the model predicts, the metric accumulates (and gathers across ranks)."""
import contextlib
import logging
import time

import paddle

from engine import distributed
from engine.config import AmpSection
from engine.data import empty
from engine.runtime import autocast
from engine.training.precision import float32_weights, has_low_precision_weights

log = logging.getLogger("zoo")


@paddle.no_grad()
def evaluate(model, loader, metric, amp=None, log_every=50):
    """Metrics of `model` on `loader`; eval-mode `loss` (when the model returns one) is averaged too.

    Unreadable samples (readers with `skip_bad`) are skipped and counted: `num_skipped` is the number
    of distinct dataset indices skipped on any rank, so it is the same for any number of ranks;
    `records_lost` (only when there are) counts what damaged files lost before indexing could see it.
    """
    amp = amp or AmpSection()
    # an O2 model's weights are fp16/bf16: evaluating without AMP computes in fp32, on fp32 weights
    # (`model` may also be an exported program's runner, tools/quantize.py's: no layer, nothing cast)
    fp32 = not amp.enable and isinstance(model, paddle.nn.Layer) and has_low_precision_weights(model)
    with float32_weights(model) if fp32 else contextlib.nullcontext():
        return _evaluate(model, loader, metric, amp, log_every)


def _evaluate(model, loader, metric, amp, log_every):
    was_training = model.training
    model.eval()
    metric.reset()
    loss_sum, loss_n, skipped, tic = 0.0, 0, set(), time.perf_counter()
    for i, batch in enumerate(loader):
        skipped.update(batch["skipped"])
        if empty(batch):
            continue
        with autocast(amp):
            preds = model(batch)
        if "loss" in preds:
            n = len(batch["index"])
            loss_sum += preds["loss"].item() * n
            loss_n += n
        metric.update(preds, batch)
        if log_every and (i + 1) % log_every == 0:
            log.info("eval %d/%d batches (%.1f s)", i + 1, len(loader), time.perf_counter() - tic)
    out = dict(metric.accumulate())
    if loss_n:
        out["loss"] = _mean_over_ranks(loss_sum, loss_n)
    out["num_skipped"] = _union_size(skipped)
    faults = loader.dataset.data_faults()
    if faults["records_lost"]:
        out["records_lost"] = faults["records_lost"]
    if out["num_skipped"] or faults["records_lost"]:
        log.warning("evaluation skipped %d unreadable samples (metrics are over the others)%s",
                    out["num_skipped"], f"; {faults['summary']}" if faults["records_lost"] else "")
    if was_training:
        model.train()
    return out


def _mean_over_ranks(total, count):
    if paddle.distributed.get_world_size() > 1:
        t = paddle.to_tensor([total, float(count)], dtype="float64")
        paddle.distributed.all_reduce(t)
        total, count = t.tolist()
    return total / count


def _union_size(indices):
    return len({i for part in distributed.gather(sorted(indices)) for i in part})
