"""The GPU training path, proven on the CPU: AMP O2 files and evaluation, clipping over mixed
dtypes, the loss scaler, random state across devices, recompute and unreadable batches on several
ranks, device set-up. Paddle's O2 cast and its GradScaler do nothing off a GPU; the tests make them
believe they are on one (their place checks faked), and no forward runs after an fp16/bf16 cast
(paddle has no CPU fp16 matmul or convolution). What only a GPU can confirm: the fp16/bf16 kernels
themselves, NCCL, and speed (tools/gpu_check.py, for anyone with a GPU)."""
import contextlib
import importlib
import json
import logging
import os
import textwrap

import numpy as np
import paddle
import pytest

from engine import config, cpu, runtime
from engine.components import load_all
from engine.config import AmpSection
from engine.registry import MODELS
from engine.session import Session
from engine.training import checkpoint, trainer
from engine.training.evaluator import evaluate
from engine.training.optim import clip_grad_norm_
from engine.training.precision import LossScaler, float32_weights
from engine.weights import weightfile
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT, launch, logged_losses, tool, tools_in_one_process

VAL = "reader.val.files=[data/youtube8m_demo/tfrecord/validate0001.tfrecord]"


class _GpuPlace:
    def is_gpu_place(self):
        return True

    def is_xpu_place(self):
        return False

    def is_custom_place(self):
        return False


class _TracerOnAGpu:
    """paddle's tracer, except that it says its place is a GPU (what decorate and GradScaler check)."""

    def __init__(self, tracer):
        self._tracer, self._expected_place = tracer, _GpuPlace()

    def __getattr__(self, name):
        return getattr(self._tracer, name)


@pytest.fixture
def paddle_on_a_gpu(monkeypatch):
    """paddle.amp's decorate and GradScaler behave as on a GPU with fp16 and bf16."""
    auto_cast = importlib.import_module("paddle.amp.auto_cast")   # paddle.amp.auto_cast is the function
    grad_scaler = importlib.import_module("paddle.amp.grad_scaler")
    for module in (auto_cast, grad_scaler):
        real = module._dygraph_tracer
        monkeypatch.setattr(module, "_dygraph_tracer", lambda real=real: _TracerOnAGpu(real()))
    monkeypatch.setattr(auto_cast, "_is_gpu_float16_supported", lambda: True)
    monkeypatch.setattr(auto_cast, "_is_gpu_bfloat16_supported", lambda: True)
    state = auto_cast.amp_global_state()
    monkeypatch.setattr(state, "amp_dtype", "float16")   # what auto_cast(dtype=float16) sets on a GPU


def _o2_train_step(cfg, dtype):
    s = Session(cfg)
    s.setup()
    model = s.model()
    amp = AmpSection(enable=True, dtype=dtype, level="O2")
    return s, trainer.build_train_step(cfg, model, steps_per_epoch=4, total_steps=8, amp=amp)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_o2_files_hold_fp32_weights_that_resume_and_evaluate(yt8m_demo, tmp_path, paddle_on_a_gpu, dtype):
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO), [VAL])
    s, step = _o2_train_step(cfg, dtype)
    o2 = step.model
    low = {n for n, p in o2.named_parameters() if p.dtype == getattr(paddle, dtype)}
    assert len(low) > 10, low                                  # the cast happened (the faked GPU)
    before = {n: p.astype("float32").numpy() for n, p in o2.named_parameters()}
    ckpt = tmp_path / "checkpoints" / "step_1"
    checkpoint.save(str(ckpt), o2, step.optimizer, step.scaler, {"epoch": 0, "batch": 1, "step": 1})
    checkpoint.save_weights(str(tmp_path / "final" / "model.pdparams"), o2)
    for f in (ckpt / "model.pdparams", tmp_path / "final" / "model.pdparams"):
        dtypes = {str(v.dtype) for v in weightfile.read_state(str(f)).values()}
        assert dtypes == {"float32"}, (f, dtypes)              # the kits' save_dtype="float32"
    # resume into another O2 model: the fp32 file goes into its fp16/bf16 weights
    _, again = _o2_train_step(cfg, dtype)
    checkpoint.load(str(ckpt), again.model, again.optimizer, again.scaler)
    for n, p in again.model.named_parameters():
        assert p.dtype == o2.state_dict(use_hook=False)[n].dtype
        np.testing.assert_array_equal(p.astype("float32").numpy(), before[n], err_msg=n)
    # evaluation with AMP off on the O2 model: fp32 weights inside, its own dtypes after
    loader, dataset, _ = s.loader("val")
    metric = s.metric(dataset)
    off = evaluate(o2, loader, metric, AmpSection())
    assert {n for n, p in o2.named_parameters() if p.dtype == getattr(paddle, dtype)} == low
    for n, p in o2.named_parameters():
        np.testing.assert_array_equal(p.astype("float32").numpy(), before[n], err_msg=n)
    fresh = MODELS.build(cfg["model"])
    s.load_weights(fresh, str(ckpt), strict=True)
    assert evaluate(fresh, loader, s.metric(dataset), AmpSection()) == off


def test_o2_weights_serve_eval_export_and_pretrained_in_the_tools(yt8m_demo, tmp_path, paddle_on_a_gpu):
    """The tools, as a user runs them after O2 training, on the fp32 file an O2 model wrote; the
    export also with runtime.sync_bn on (the CPU export needs no SyncBatchNorm)."""
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO), [VAL])
    _, step = _o2_train_step(cfg, "float16")
    weights = tmp_path / "final" / "model.pdparams"
    checkpoint.save_weights(str(weights), step.model)
    recipe = ["-c", ATTENTION_LSTM_DEMO, "-o", VAL]
    results = tools_in_one_process([
        ("eval", [*recipe, "--weights", weights, "--output", tmp_path / "eval"], {}),
        ("export", [*recipe, "-o", "runtime.sync_bn=true", "--weights", weights, "--output", tmp_path / "export"], {}),
        ("train", [*recipe, "-o", f"train.pretrained={weights}", "-o", "train.epochs=null", "-o", "train.max_steps=1",
                   "-o", "train.save_steps=1", "--output", tmp_path / "ft"], {}),
    ])
    for name, r in zip(["eval", "export", "train"], results):
        assert r["code"] == 0, (name, r["stderr"][-2000:])
    assert os.path.isfile(tmp_path / "export" / "model.pdiparams")
    assert os.path.isfile(tmp_path / "ft" / "final" / "model.pdparams")


def test_a_sync_bn_recipe_trains_in_one_cpu_process(yt8m_demo, tmp_path):
    """A GPU recipe (runtime.sync_bn: true) as a CPU user runs it: plain BatchNorm, said in the log."""
    proc = tool("train", "-c", ATTENTION_LSTM_DEMO, "-o", VAL, "runtime.sync_bn=true", "train.epochs=null",
                "train.max_steps=1", "--output", tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runtime.sync_bn: one process on the CPU: plain BatchNorm" in proc.stdout + proc.stderr
    assert os.path.isfile(tmp_path / "final" / "model.pdparams")


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_o2_clipping_over_mixed_precision_gradients_gives_the_fp32_norm(low):
    """Gradients as O2 leaves them: fp16/bf16 for cast layers, fp32 for norm layers; values whose
    squares overflow fp16 (300^2 > 65504). Reference: numpy in float64 over the same values."""
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((6, 5)) * 300, rng.standard_normal(7), rng.standard_normal((3, 4)) * 2]
    dtypes = [low, "float32", low]
    params, grads = [], []
    for v, dtype in zip(values, dtypes):
        p = paddle.create_parameter(list(v.shape), dtype, default_initializer=paddle.nn.initializer.Constant(0.5))
        # the gradient of sum(p * v) is v, delivered in p's dtype (the cast's backward)
        (p.astype("float32") * paddle.to_tensor(v.astype("float32"))).sum().backward()
        assert p.grad.dtype == getattr(paddle, dtype)
        params.append(p)
        grads.append(p.grad.astype("float32").numpy().astype(np.float64))
    with pytest.raises(Exception):   # paddle's own stacks the per-gradient norms: one dtype only
        paddle.nn.utils.clip_grad_norm_([params[0], params[1]], 1e9)
    expected = np.sqrt(sum((g ** 2).sum() for g in grads))
    max_norm = 100.0
    norm = clip_grad_norm_(params, max_norm)
    assert norm.dtype == paddle.float32
    assert float(norm) == pytest.approx(expected, rel=1e-5)
    factor = max_norm / (expected + 1e-6)
    for p, g, dtype in zip(params, grads, dtypes):
        tol = 1e-6 if dtype == "float32" else (1e-3 if dtype == "float16" else 8e-3)   # one rounding to p's dtype
        np.testing.assert_allclose(p.grad.astype("float32").numpy(), g * factor, rtol=tol, atol=tol * 1e-2)


def _scaled_step(model, optimizer, scaler, x, poison=False):
    loss = (model(x) ** 2).mean()
    scaler.scale(loss).backward()
    if poison:
        model.weight.grad.set_value(paddle.full(model.weight.shape, float("inf")))
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()


def test_scaler_skips_an_overflowing_step_lowers_its_scale_and_survives_a_checkpoint(tmp_path, paddle_on_a_gpu):
    paddle.seed(0)
    model = paddle.nn.Linear(4, 3)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = LossScaler(init_loss_scaling=1024.0, incr_every_n_steps=2)
    assert scaler.is_enable()                                   # the real scaler, not a pass-through
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((5, 4)).astype("float32"))
    w = model.weight.numpy().copy()
    _scaled_step(model, optimizer, scaler, x, poison=True)
    np.testing.assert_array_equal(model.weight.numpy(), w)     # the inf step did not update
    assert scaler.scale_value() == 512.0                        # and the scale halved (no TypeError)
    _scaled_step(model, optimizer, scaler, x)
    assert not np.array_equal(model.weight.numpy(), w)
    checkpoint.save(str(tmp_path / "ck"), model, optimizer, scaler, {"epoch": 0, "step": 2})
    fresh = LossScaler(init_loss_scaling=7.0, incr_every_n_steps=2)
    checkpoint.load(str(tmp_path / "ck"), paddle.nn.Linear(4, 3), None, fresh)
    ours, theirs = fresh.state_dict(), scaler.state_dict()
    assert float(ours.pop("scale")[0]) == float(theirs.pop("scale")[0]) == 512.0 and ours == theirs
    _scaled_step(model, optimizer, fresh, x)                    # the 2nd clean step in a row: doubled
    assert fresh.scale_value() == 1024.0


def test_paddles_own_scaler_update_fails_under_numpy_2(paddle_on_a_gpu):
    """Why LossScaler exists: paddle 3.3.1's GradScaler calls float() on its shape-[1] scale when it
    lowers it, which numpy >= 2.4 refuses. If this ever passes, paddle fixed it and ours can go."""
    model = paddle.nn.Linear(4, 3)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    x = paddle.ones([2, 4])
    with pytest.raises(TypeError, match="0-dimensional"):
        _scaled_step(model, optimizer, paddle.amp.GradScaler(init_loss_scaling=1024.0), x, poison=True)


def test_scaler_resumed_from_a_run_without_fp16_starts_fresh_with_one_line(tmp_path, paddle_on_a_gpu, caplog):
    model = paddle.nn.Linear(4, 3)
    checkpoint.save(str(tmp_path / "ck"), model, None, LossScaler(enable=False), {"epoch": 0, "step": 1})
    assert json.load(open(tmp_path / "ck" / "scaler.json")) == {}
    scaler = LossScaler(init_loss_scaling=2048.0)
    with caplog.at_level(logging.INFO, logger="zoo"):
        checkpoint.load(str(tmp_path / "ck"), model, None, scaler)
    lines = [r.getMessage() for r in caplog.records if "scaler" in r.getMessage()]
    assert len(lines) == 1 and "fresh scaler at 2048" in lines[0], lines
    assert scaler.scale_value() == 2048.0


def _record(device, n):
    paddle.seed(5)
    states = [list(paddle.get_rng_state()[0].__getstate__())] * n
    return {"device": device, "paddle": states, "numpy": checkpoint.rng_state()["numpy"]}


def test_rng_of_a_two_gpu_run_resumes_on_a_cpu_with_one_line(caplog):
    rng = {"ranks": [_record("gpu:0", 2)]}
    np.random.seed(123)
    rng["ranks"][0]["numpy"] = checkpoint.rng_state()["numpy"]
    expected = np.random.random()
    np.random.seed(0)
    with caplog.at_level(logging.INFO, logger="zoo"):
        checkpoint.restore_rng(rng, rank=0, world_size=1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "gpu:0 (2 generator(s))" in lines[0] and "runs on cpu" in lines[0], lines
    assert np.random.random() == expected                         # numpy's state did carry over


class _TwoGpus:
    """paddle's RNG calls as on a machine with two visible GPUs, this process on `device`."""

    def __init__(self, device):
        self.device, self.states = device, [paddle.get_rng_state()[0]] * 2
        self.set = None

    def install(self, monkeypatch):
        monkeypatch.setattr(paddle, "get_device", lambda: self.device)
        monkeypatch.setattr(paddle, "get_rng_state", lambda: list(self.states))
        monkeypatch.setattr(paddle, "set_rng_state", self.set_rng_state)

    def set_rng_state(self, states):
        if len(states) != 2:   # paddle's own check on a GPU place
            raise ValueError("Length of gpu state list should be equal to the gpu device count")
        self.set = states


def test_rng_of_a_cpu_run_resumes_where_two_gpu_generators_are_expected(monkeypatch, caplog):
    gpus = _TwoGpus("gpu:1")
    rng = {"ranks": [_record("cpu", 1)]}
    gpus.install(monkeypatch)
    with caplog.at_level(logging.INFO, logger="zoo"):
        checkpoint.restore_rng(rng, rank=0, world_size=1)
    assert gpus.set is None and len(caplog.records) == 1 and "runs on gpu:1" in caplog.records[0].getMessage()


def test_rng_of_two_visible_gpus_resumes_with_one_visible(monkeypatch, caplog):
    saved = _record("gpu:1", 2)
    saved["paddle"][0] = saved["paddle"][0][:1] + [17] + saved["paddle"][0][2:]   # card 0's: another seed
    gpus = _TwoGpus("gpu:0")
    gpus.states = gpus.states[:1]                                   # this process sees one card
    gpus.install(monkeypatch)
    monkeypatch.setattr(paddle, "set_rng_state", lambda states: setattr(gpus, "set", states))
    with caplog.at_level(logging.INFO, logger="zoo"):
        checkpoint.restore_rng({"ranks": [saved]}, rank=0, world_size=1)
    assert len(gpus.set) == 1 and list(gpus.set[0].__getstate__()) == saved["paddle"][1]   # its own card's
    assert "restored gpu:0's from gpu:1's" in caplog.records[0].getMessage()


def test_rng_of_another_number_of_ranks_says_so(caplog):
    rng = {"ranks": [_record("cpu", 1), _record("cpu", 1)]}
    with caplog.at_level(logging.INFO, logger="zoo"):
        checkpoint.restore_rng(rng, rank=0, world_size=1)
    assert "2 rank(s), this run has 1" in caplog.records[0].getMessage()


def test_gpu_device_setup_under_mocks(monkeypatch):
    # the launcher's one card per process, and a hand-set list indexed by the local rank
    assert runtime.selected_gpu({"FLAGS_selected_gpus": "3"}) == 3
    assert runtime.selected_gpu({"FLAGS_selected_gpus": "0,1", "PADDLE_LOCAL_RANK": "1"}) == 1
    assert runtime.selected_gpu({"FLAGS_selected_gpus": "4,6", "PADDLE_LOCAL_RANK": "0"}) == 4
    # dropout seeds differ per rank; rank 0 draws what one process draws (the old seed)
    seeds = {trainer.dropout_seed(7, 2, r) for r in range(8)}
    assert len(seeds) == 8 and trainer.dropout_seed(7, 2, 0) == 7 * 100003 + 2
    # while the initial weights are the same on every rank (built after runtime.seed_all(seed))
    load_all()
    built = []
    for rank in ("0", "1"):
        monkeypatch.setenv("PADDLE_TRAINER_ID", rank)
        runtime.seed_all(7)
        built.append(MODELS.build({"name": "ResNet", "depth": 18}).state_dict())
    assert all(np.array_equal(built[0][k].numpy(), built[1][k].numpy()) for k in built[0])
    # the stride flag: set for a CPU build before paddle loads, left to paddle on a GPU build
    assert cpu.mkl_environment({})["FLAGS_use_stride_kernel"] == "0"
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "3.3.1" if name == "paddlepaddle-gpu" else real_version(name))
    assert "FLAGS_use_stride_kernel" not in cpu.mkl_environment({})
    # runtime.setup on a GPU leaves the flag alone and takes the card of FLAGS_selected_gpus
    calls = []
    monkeypatch.setattr(paddle.device, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle, "set_device", lambda d: calls.append(("device", d)))
    monkeypatch.setattr(paddle, "set_flags", lambda f: calls.append(("flags", f)))
    monkeypatch.setattr(runtime.dist, "init_parallel_env", lambda: calls.append(("init",)))
    monkeypatch.setattr(runtime.distributed, "socket_interface", lambda device: None)
    monkeypatch.setattr(runtime.distributed, "endpoint_hosts", lambda: ["127.0.0.1"])
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "1")
    monkeypatch.setenv("FLAGS_selected_gpus", "0,1")
    monkeypatch.delenv("FLAGS_use_stride_kernel", raising=False)
    rt = runtime.setup(config.RuntimeSection(device="gpu", num_threads=1, sync_bn=True))
    assert rt["device"] == "gpu" and rt["world_size"] == 2
    assert calls == [("device", "gpu:1"), ("init",)], calls
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")
    calls.clear()
    runtime.setup(config.RuntimeSection(device="cpu", num_threads=1))
    assert ("flags", {"FLAGS_use_stride_kernel": False}) in calls     # a GPU build run on the CPU


def test_float32_weights_round_trip_keeps_the_parameter_objects():
    from paddle.amp.auto_cast import amp_initialize
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.LayerNorm(3))
    amp_initialize([model], "float16", None)
    ids = [id(p) for p in model.parameters()]
    dtypes = [p.dtype for p in model.parameters()]
    with float32_weights(model):
        assert all(p.dtype == paddle.float32 for p in model.parameters())
        out = model(paddle.ones([2, 4]))
    assert out.dtype == paddle.float32
    assert [id(p) for p in model.parameters()] == ids and [p.dtype for p in model.parameters()] == dtypes


# ---------------------------------------------------------------- two gloo processes

def test_recompute_dp_bert_on_two_processes_trains_like_one(bert_demo, tmp_path):
    """BERT with recompute (non-reentrant: the reentrant kind fails in DataParallel's reducer) on 2
    ranks x 8 against 1 process x 16, dropout 0: the same losses within 1e-5 (tests/test_distributed.py
    says why 1e-5: float32 sums in another order)."""
    recipe = ["-c", "configs/nlp/bert/bert_glue_demo.yaml", "-o", "model.recompute=true", "-o", "train.epochs=2",
              "-o", "train.log_interval=1", "-o", "runtime.num_threads=1", "-o", "train.eval_interval=0",
              "-o", "train.best_metric=null"]
    launch(2, "train", *recipe, "-o", "reader.train.batch_size=8", "--output", tmp_path / "two",
           log_dir=tmp_path / "log")
    tool("train", *recipe, "--output", tmp_path / "one")
    two, one = logged_losses(tmp_path / "two"), logged_losses(tmp_path / "one")
    assert len(two) == len(one) == 14
    assert np.abs(two - one).max() <= 1e-5, np.abs(two - one).max()


HOLES = '''\
import os

from engine.errors import SampleError
from engine.registry import DATASETS
from readers.youtube8m import YouTube8M


@DATASETS.register("YouTube8MWithHoles")
class YouTube8MWithHoles(YouTube8M):
    """On rank 1 the 3rd and 4th samples read (its 2nd batch of 2) are unreadable."""
    loads = 0

    def load(self, index):
        self.loads += 1
        if os.environ.get("PADDLE_TRAINER_ID") == "1" and self.loads in (3, 4):
            raise SampleError(f"sample {index}: unreadable on purpose")
        return super().load(index)
'''


def test_skip_bad_ranks_agree_when_one_ranks_batch_is_unreadable(yt8m_demo, tmp_path):
    """Rank 1's 2nd batch is wholly unreadable: both ranks skip it (else rank 0 would wait in the
    gradient all-reduce), in bounded time; the checkpoint keeps each rank's own random state."""
    (tmp_path / "holes.py").write_text(HOLES)
    (tmp_path / "holes.yaml").write_text(textwrap.dedent(f"""\
        _base_: [{os.path.join(ROOT, ATTENTION_LSTM_DEMO)}]
        custom_imports: {{imports: [holes]}}
        reader:
          train: {{name: YouTube8MWithHoles, files: [data/youtube8m_demo/tfrecord/validate0000.tfrecord],
                   batch_size: 2, skip_bad: true, shuffle: false}}
          val: {{files: [data/youtube8m_demo/tfrecord/validate0001.tfrecord]}}
        train: {{epochs: null, max_steps: 4, save_steps: 2, save_interval: 0, log_interval: 1,
                 eval_interval: 0, best_metric: null}}
        runtime: {{num_threads: 1}}
        """))
    out = tmp_path / "out"
    launch(2, "train", "-c", tmp_path / "holes.yaml", "--output", out, log_dir=tmp_path / "log", timeout=240,
           env={"PYTHONPATH": str(tmp_path)})
    log0 = open(tmp_path / "log" / "workerlog.0").read()
    assert "batch 2: another rank's batch had every sample unreadable; every rank skips this batch" in log0, log0[-3000:]
    assert len(logged_losses(out)) == 4                            # 4 optimizer steps, batch 2 skipped
    ranks = json.load(open(out / "checkpoints" / "step_4" / "rng.json"))["ranks"]
    assert len(ranks) == 2 and ranks[0]["paddle"] != ranks[1]["paddle"]   # each rank's own dropout stream


def test_gpu_autocast_takes_the_recipes_op_lists(monkeypatch):
    """On a GPU, train.amp's op lists reach paddle.amp.auto_cast. Expected: PaddleSeg's train.py
    (custom_white_list {elementwise_add, batch_norm, sync_batch_norm}, custom_black_list
    {bilinear_interp_v2}) and PaddleVideo's trainer (custom_black_list {reduce_mean})."""
    load_all()
    seen = []
    monkeypatch.setattr(runtime, "_on_cpu", lambda: False)
    monkeypatch.setattr(paddle.amp, "auto_cast", lambda **kw: seen.append(kw) or contextlib.nullcontext())
    for recipe in ("configs/vision/deeplabv3/deeplabv3_r101vd_os8_80k_cityscapes.yaml", "configs/video/tsn/tsn_demo.yaml"):
        with runtime.autocast(config.load(os.path.join(ROOT, recipe), ["train.amp.enable=true"]).train.amp):
            pass
    assert seen == [
        dict(enable=True, dtype="float16", level="O1", custom_white_list={"elementwise_add", "batch_norm", "sync_batch_norm"},
             custom_black_list={"bilinear_interp_v2"}),
        dict(enable=True, dtype="float16", level="O1", custom_white_list=None, custom_black_list={"reduce_mean"})]
