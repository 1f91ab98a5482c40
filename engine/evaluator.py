"""Evaluation over a reader: the model predicts, the metric accumulates (and gathers across ranks)."""
import logging
import time

import paddle

log = logging.getLogger("zoo")


@paddle.no_grad()
def evaluate(model, loader, metric, amp=None, log_every=50):
    """Metrics of `model` on `loader`; eval-mode `loss` (when the model returns one) is averaged too."""
    amp = amp or {"enable": False, "dtype": "float16", "level": "O1"}
    was_training = model.training
    model.eval()
    metric.reset()
    loss_sum, loss_n, tic = 0.0, 0, time.perf_counter()
    for i, batch in enumerate(loader):
        if "index" not in batch:  # every sample of the batch was unreadable and skipped
            continue
        with paddle.amp.auto_cast(enable=amp["enable"], dtype=amp["dtype"], level=amp["level"]):
            preds = model(batch)
        if "loss" in preds:
            n = int(batch["index"].shape[0])
            loss_sum += preds["loss"].item() * n
            loss_n += n
        metric.update(preds, batch)
        if log_every and (i + 1) % log_every == 0:
            log.info("eval %d/%d batches (%.1f s)", i + 1, len(loader), time.perf_counter() - tic)
    out = dict(metric.accumulate())
    if loss_n:
        out["loss"] = _mean_over_ranks(loss_sum, loss_n)
    if was_training:
        model.train()
    return out


def _mean_over_ranks(total, count):
    if paddle.distributed.get_world_size() > 1:
        t = paddle.to_tensor([total, float(count)], dtype="float64")
        paddle.distributed.all_reduce(t)
        total, count = t.tolist()
    return total / count
