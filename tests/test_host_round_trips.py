"""No host round trip inside a training step, on the path a GPU runs (issue 38).

A GPU overlaps the next batch's host work with the current step only if the step never waits for the
device: `Tensor.numpy`, `.item` and `.tolist` (and Python's float()/int()/bool() of a tensor, which
go through them or through __float__...) copy a device value back and synchronise. Here every demo
recipe trains a few steps in-process with the fused CPU operators off and `ops.reference` told its
tensors are off the CPU (the branches a GPU takes: F.linear, scaled_dot_product_attention), while
those methods are counted inside `TrainStep.__call__` (forward, backward, optimizer, LR step) and the
loop's own per-batch work (`_Training.skip`, `_Meter.update`). Logging and evaluation steps are not
counted: they read the losses on purpose. The reader's host work happens before the step, in numpy.
"""
import os
import pickle
import traceback

import numpy as np
import paddle
import pytest

from engine.components import load_all
from engine.config import load
from engine.data import _pack, _unpack
from engine.session import Session
from engine.training import trainer
from ops import reference
from tests.helpers import ROOT

load_all()
STEPS = 3          # the first step may build caches (anchors, position tables); steps 2.. are counted

DEMOS = {
    "attention_lstm": ("configs/video/attention_lstm/attention_lstm_demo.yaml", "yt8m_demo"),
    "nextvlad": ("configs/video/nextvlad/nextvlad_demo.yaml", "yt8m_demo"),
    "attention_cluster": ("configs/video/attention_cluster/attention_cluster_demo.yaml", "yt8m_demo"),
    "tsn": ("configs/video/tsn/tsn_demo.yaml", "kinetics_demo"),
    "stnet": ("configs/video/stnet/stnet_demo.yaml", "kinetics_demo"),
    "bert_pretrain": ("configs/nlp/bert/bert_pretrain_demo.yaml", "bert_demo"),
    "bert_glue": ("configs/nlp/bert/bert_glue_demo.yaml", "bert_demo"),
    "transformer": ("configs/nlp/transformer/transformer_demo.yaml", "translation_demo"),
    "deeplabv3": ("configs/vision/deeplabv3/deeplabv3_demo.yaml", "voc_demo"),
    "mask_rcnn": ("configs/vision/mask_rcnn/mask_rcnn_demo.yaml", "coco_demo"),
}


# Operators whose output shape depends on the data: the host needs the count, so on a GPU each one
# waits for the device like a read. The ones a step may call, by call site, and why they stay.
DATA_DEPENDENT_OK = {
    "models/vision/mask_rcnn/box_ops.py:nonzero":
        "subsample: the positive and negative candidates of each image, whose counts size the random "
        "permutation drawn over them (PaddleDetection's subsample_labels draws the same way)",
    "models/vision/mask_rcnn/roi_heads.py:nonzero":
        "MultiScaleRoIAlign: the RoIs of each FPN level, which roi_align takes as one tensor per level "
        "(paddle's distribute_fpn_proposals has the same data-dependent output)",
    "models/vision/mask_rcnn/rpn.py:nonzero":
        "best_per_image: each image's best post_nms_top_n proposals, after generate_proposals, whose "
        "output count depends on NMS already",
}


class HostReads:
    """Counts Tensor.numpy/item/tolist (with where they were called) while `counting` is on, and the
    data-dependent-shape operators paddle.nonzero and paddle.masked_select apart."""

    def __init__(self, monkeypatch):
        self.counting, self.calls, self.shaped = False, [], set()
        for name in ("nonzero", "masked_select"):
            original = getattr(paddle, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                if self.counting:
                    self.shaped.add(f"{_name} at {_caller()}")
                return _original(*args, **kwargs)
            monkeypatch.setattr(paddle, name, counted)
        for name in ("numpy", "item", "tolist"):
            original = getattr(paddle.Tensor, name)

            def wrapped(tensor, *args, _original=original, _name=name, **kwargs):
                if self.counting:
                    self.calls.append(f"{_name} at {_caller()}")
                return _original(tensor, *args, **kwargs)
            monkeypatch.setattr(paddle.Tensor, name, wrapped)

    def around(self, fn):
        def counted(*args, **kwargs):
            before, self.counting = self.counting, True
            try:
                return fn(*args, **kwargs)
            finally:
                self.counting = before
        return counted


def _caller():
    """file:line of the innermost frame in our code (not paddle's, not this file's)."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(ROOT + os.sep) and path != os.path.abspath(__file__) and ".venv" not in path:
            return f"{os.path.relpath(path, ROOT)}:{frame.lineno}"
    return "?"


@pytest.fixture
def gpu_branches(monkeypatch):
    """ops/: fused path off, reference path as on a GPU tensor. paddle's fused add & LayerNorm has only
    a GPU kernel: its stand-in here is the composition it replaces (the reads are what is counted)."""
    monkeypatch.setattr(reference, "on_device", lambda x: paddle.in_dynamic_mode())
    monkeypatch.setattr(reference, "on_gpu", lambda x: paddle.in_dynamic_mode())

    def add_norm(x, residual, bias=None, ln_scale=None, ln_bias=None, dropout_rate=0.5, ln_epsilon=1e-5,
                 training=True, mode="upscale_in_train"):
        h = residual + reference.dropout(x if bias is None else x + bias, dropout_rate, training)
        return paddle.nn.functional.layer_norm(h, h.shape[-1:], ln_scale, ln_bias, ln_epsilon)
    monkeypatch.setattr(reference.incubate_F, "fused_bias_dropout_residual_layer_norm", add_norm)


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_a_training_step_reads_nothing_back_from_the_device(name, request, monkeypatch, gpu_branches):
    config, data = DEMOS[name]
    request.getfixturevalue(data)
    cfg = load(os.path.join(ROOT, config), ["runtime.fast_ops=false"])
    session = Session(cfg)
    session.setup()
    loader, _, _ = session.loader("train")
    model = session.model()
    step = trainer.build_train_step(cfg, model, steps_per_epoch=len(loader), total_steps=STEPS)
    reads = HostReads(monkeypatch)
    counted_step = reads.around(step.__call__)
    meter = trainer._Meter(len(loader))
    update = reads.around(meter.update)
    skip = reads.around(trainer.empty)
    per_step = []
    batches = iter(loader)
    for i in range(STEPS):
        batch = next(batches)
        reads.calls = []
        assert not skip(batch)
        losses = counted_step(batch, True)
        update(losses, len(batch["index"]), batch["num_skipped"], 0.1, trainer.Progress(0, i + 1, i + 1))
        per_step.append(list(reads.calls))
    for i, calls in enumerate(per_step[1:], 2):
        assert not calls, f"{name}: step {i} read {len(calls)} values back to the host: {calls[:6]}"
    unlisted = {c for c in reads.shaped if c.split(" at ")[1].rsplit(":", 1)[0] + ":" + c.split(" ")[0]
                not in DATA_DEPENDENT_OK}
    assert not unlisted, f"{name}: data-dependent shapes in the step, not in DATA_DEPENDENT_OK: {sorted(unlisted)}"
    assert np.isfinite(meter.averages()["loss"])


def test_worker_batches_carry_metadata_as_bytes_not_as_a_tensor():
    """engine/data.py: what a worker sends besides arrays is `bytes`, which paddle's DataLoader passes
    with the batch's structure; a uint8 array would become a tensor on the card, read back each batch."""
    batch = {"image": np.zeros((2, 3), np.float32), "gt_boxes": [np.zeros((1, 4), np.float32)] * 2,
             "names": ["a", "b"], "index": np.arange(2)}
    packed = _pack(batch)
    rest = [v for k, v in packed.items() if k not in ("image", "index")]
    assert len(rest) == 1 and isinstance(rest[0], bytes)
    assert sorted(pickle.loads(rest[0])) == ["_order", "gt_boxes", "names"]
    received = {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in packed.items()}
    out = _unpack(received)
    assert list(out) == list(batch) and out["names"] == ["a", "b"]
    assert [t.shape for t in out["gt_boxes"]] == [[1, 4], [1, 4]]
