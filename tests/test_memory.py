"""The memory profile (benchmarks/memory.py): its counters checked against hand arithmetic, the
profile command run on a small model, and our fused operators saving for the backward only what
their backward reads."""
import json
import subprocess
import sys

import numpy as np
import paddle
import pytest

from benchmarks import memory
from tests.helpers import ENV, ROOT


_HWM = """
import numpy as np
from benchmarks import memory
memory.reset_peak()
before, rss = memory.status_mb("VmHWM"), memory.status_mb("VmRSS")
block = np.ones(64 * 2 ** 20, np.float32)    # 64 Mi float32 = 256 MB, every page written
del block
print(before, rss, memory.status_mb("VmHWM"), memory.status_mb("VmRSS"))
"""


def test_the_high_water_mark_resets_and_sees_a_256_mb_allocation():
    # in a fresh process: this one's heap may hold freed pages that a new array reuses unseen
    proc = subprocess.run([sys.executable, "-c", _HWM], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, rss, peak, after = map(float, proc.stdout.split())
    assert abs(before - rss) < 16, "the reset leaves the mark at the resident size"
    assert peak - before >= 250 and after - rss < 16, (before, rss, peak, after)


_TRIM = """
import ctypes
from benchmarks import memory
from engine import cpu
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(64 << 10) for _ in range(3200)]   # 200 MB in 64 KB blocks: below the mmap threshold
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)                      # resident
start = memory.status_mb("VmRSS")
for b in blocks[:-1]:
    libc.free(b)   # the last block stays: the heap's top is in use, so free() cannot shrink it
freed = memory.status_mb("VmRSS")
print(start, freed, cpu.trim_heap(), memory.status_mb("VmRSS"))
"""


def test_trim_heap_gives_the_free_pages_inside_the_heap_back():
    """engine.cpu.trim_heap (the trainer's call after the forward): 200 MB of 64 KB blocks freed below
    the heap's last block stay resident after free(), and go back to the system with the trim."""
    proc = subprocess.run([sys.executable, "-c", _TRIM], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    start, freed, trimmed, after = proc.stdout.split()
    start, freed, after = float(start), float(freed), float(after)
    assert freed > start - 16, "free() alone keeps the pages"
    assert trimmed == "True" and after < freed - 180, (start, freed, after)


def test_the_trainer_trims_the_heap_between_the_forward_and_the_backward(monkeypatch):
    """With runtime.keep_freed_memory false (the default) on a CPU, TrainStep calls the trim after the
    forward, before the backward (where the peak is); with it true, glibc keeps its blocks: no trim."""
    # the engine's training modules: only this test of the module needs them
    from engine import config, cpu, runtime
    from engine.training import trainer
    events = []
    monkeypatch.setattr(cpu, "trim_heap", lambda: events.append("trim"))
    assert runtime.heap_trim(config.RuntimeSection.of({"keep_freed_memory": True})) is None

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(3, 2)

        def forward(self, batch):
            events.append("forward")
            y = self.fc(batch["x"])
            y.register_hook(lambda g: events.append("backward"))
            return {"loss": y.sum()}

    net = Net()
    step = trainer.TrainStep(net, paddle.optimizer.SGD(0.1, parameters=net.parameters()),
                             trainer.make_scaler(config.AmpSection()),
                             after_forward=runtime.heap_trim(config.RuntimeSection.of({})))
    step({"x": paddle.ones([4, 3])})
    assert events == ["forward", "trim", "backward"]


def test_saved_tensors_are_counted_once_per_buffer_and_charged_to_the_layer_that_saved_them():
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.Tanh())
    params = net.parameters()
    saved = memory.SavedForBackward(lambda t: t.data_ptr(), lambda t: int(t._numel()) * t.element_size(),
                                    {p.data_ptr() for p in params})
    hooks = [h for m in net.sublayers(include_self=True)
             for h in (m.register_forward_pre_hook(saved.enter), m.register_forward_post_hook(saved.leave))]
    x = paddle.randn([5, 4])
    x.stop_gradient = False
    with paddle.autograd.saved_tensors_hooks(saved.pack, saved.unpack):
        y = net(x) + net(x)
    y.sum().backward()
    for h in hooks:
        h.remove()
    # by hand: the matmul saves its input x (5 x 4 float32 = 80 bytes; the second call saves the same
    # buffer again) and its weight (a parameter: not counted); tanh saves its output, a new
    # 5 x 3 float32 (60 bytes) per call
    assert dict(saved.by_kind) == {"Linear": 80, "Tanh": 120}
    assert saved.stack == ["(model)"]
    np.testing.assert_allclose(x.grad.numpy(), 2 * (1 - np.tanh(x.numpy() @ params[0].numpy() + params[1].numpy()) ** 2)
                               @ params[0].numpy().T, rtol=1e-5)     # the hooks leave the gradients alone


def _profile(name, *args):
    """benchmarks/memory.py --run NAME --side ours ARGS: its JSON line."""
    proc = subprocess.run([sys.executable, "benchmarks/memory.py", "--run", name, "--side", "ours", "--threads", "2",
                           *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_profile_command_accounts_for_one_training_step():
    p = _profile("AttentionLSTM", "--batch", "2")
    # AttentionLSTM at the reference's sizes: 108,737,304 fp32 parameters (hand arithmetic in
    # tests/test_yt8m_models.py) = 414.8 MB, all trainable; centered RMSProp at momentum 0 (the recipe's)
    # keeps two tensors per parameter, mean square and mean gradient (PyTorch's RMSprop: the same two)
    params_mb = p["parameters_mb"]
    assert abs(params_mb - 108_737_304 * 4 / 2 ** 20) < 0.1, p
    assert p["gradients_mb"] == params_mb and abs(p["optimizer_state_mb"] - 2 * params_mb) < 1, p
    assert p["s_per_step"] > 0 and p["overrides"] == [] and p["precision"] == "fp32", p
    assert 0 < p["saved_for_backward_mb"] < p["peak_above_baseline_mb"], p
    assert p["baseline_mb"] < p["built_mb"] <= p["peak_mb"] and p["warm_mb"] <= p["peak_mb"] + 1, p
    parts = sum(p[k] for k in ("parameters_mb", "gradients_mb", "optimizer_state_mb", "saved_for_backward_mb",
                               "rest_mb"))
    assert abs(parts - p["peak_above_baseline_mb"]) < 1, p
    # paddle's allocator holds every tensor: at least the parameters, gradients, state and saved ones
    assert p["allocator_peak_mb"] >= parts - p["rest_mb"] - 1, p
    # charged to the innermost layer running: the head's (ops.lstm, oneDNN's LSTM, runs in its forward on
    # the LSTM layers' weights; the head's saved tensors are mostly that LSTM's work space) and Dropout's
    assert set(p["saved_by_kind_mb"]) >= {"AttentionLstmHead", "Dropout"}, p
    assert p["saved_by_kind_mb"]["AttentionLstmHead"] > p["saved_by_kind_mb"]["Dropout"], p


@pytest.mark.isa
def test_bf16_activations_halve_what_a_resnet_keeps_for_its_backward():
    """--bf16-activations (issue 43's measurement): TSN-R50's step inside ops.precision(bf16_act=True) keeps its
    convolutions' and BNs' activations in bf16, 2 bytes a value against fp32's 4, so the tensors saved
    for the backward are about half (0.52 at batch 4 on amd-zen3: the network's input and the pooled
    features stay fp32)."""
    fp32 = _profile("TSN-R50", "--batch", "1")
    bf16 = _profile("TSN-R50", "--batch", "1", "--bf16-activations")
    assert bf16["bf16_activations"] and "bf16_activations" not in fp32
    assert 0.45 < bf16["saved_for_backward_mb"] / fp32["saved_for_backward_mb"] < 0.56, (fp32, bf16)
    assert bf16["parameters_mb"] == fp32["parameters_mb"] and bf16["gradients_mb"] == fp32["gradients_mb"]


def _saved_but_unread(layer, inputs, owned=()):
    """[(shape, dtype)] of the tensors the forward of `layer` saves for its backward that the backward
    does not read: one run per saved tensor with that tensor replaced (NaN, or 0 for integers) when the
    backward asks for it; where no gradient changes, the backward did not read it. Empty tensors and
    buffers in `owned` (the layer's parameters and running statistics: saving them costs nothing)
    are not asked about."""
    def run(corrupt=None):
        saved = []

        def pack(t):
            saved.append(t)
            return len(saved) - 1, t

        def unpack(item):
            i, t = item
            if i != corrupt:
                return t
            return paddle.full_like(t, float("nan") if t.dtype in (paddle.float32, paddle.float64) else 0)
        paddle.seed(0)
        for t in [*inputs, *layer.parameters()]:
            t.clear_gradient(False)
        with paddle.autograd.saved_tensors_hooks(pack, unpack):
            out = layer(*inputs)
        out.sum().backward()
        return saved, [t.grad.numpy().copy() for t in [*inputs, *layer.parameters()] if t.grad is not None]
    saved, grads = run()
    unread = []
    for i, t in enumerate(saved):
        if int(t._numel()) == 0 or t.data_ptr() in owned:
            continue
        if all(np.array_equal(a, b) for a, b in zip(grads, run(corrupt=i)[1])):
            unread.append((tuple(t.shape), str(t.dtype)))
    return unread


class _SavesOneTooMany(paddle.autograd.PyLayer):
    """y = 2x, saving y though its backward reads nothing (what the check must catch)."""

    @staticmethod
    def forward(ctx, x):
        y = 2 * x
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class _Apply(paddle.nn.Layer):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *x):
        return self.fn(*x)


def test_fused_operators_save_only_what_their_backward_reads(op_path_fp32):
    # the layers under test, imported here as the other tests of this file need no model code
    from models.nlp.bert import EncoderLayer
    from models.nlp.transformer import EncoderLayer as PreNormEncoderLayer
    from models.vision.resnet import ConvBN
    x = paddle.randn([3])
    x.stop_gradient = False
    assert _saved_but_unread(_Apply(_SavesOneTooMany.apply), [x]) == [((3,), "paddle.float32")]  # the check can fail
    paddle.seed(0)
    x = paddle.randn([2, 8, 16, 16])
    residual = paddle.randn([2, 16, 16, 16])
    h = paddle.randn([2, 10, 64])
    for t in (x, residual, h):
        t.stop_gradient = False
    block = ConvBN(8, 16, 3)
    encoder = EncoderLayer(64, 4, 256, "gelu", 0.1, 0.1, 1e-12)
    pre_norm = PreNormEncoderLayer(64, 4, 256, 0.1, 0.1, 0.1, normalize_before=True)   # the Transformer's
    for name, layer, inputs in (("conv+BN+ReLU", block, [x]), ("conv+BN+residual+ReLU", block, [x, residual]),
                                ("BERT encoder layer", encoder, [h, paddle.zeros([2, 1, 1, 10])]),
                                ("pre-norm Transformer encoder layer", pre_norm, [h, paddle.zeros([2, 1, 1, 10])])):
        layer.train()
        owned = {t.data_ptr() for t in [*layer.parameters(), *layer.buffers()]}
        unread = _saved_but_unread(layer, inputs, owned)
        assert not unread, f"{name} saves {unread} for a backward that does not read them"
    op_path_fp32.check("zoo_conv2d", "zoo_bn_act", "zoo_bn_add_act", "zoo_matmul", "zoo_bias_act", "zoo_bias_dropout",
                       "zoo_bias_dropout_residual_ln", "zoo_bias_dropout_residual", "zoo_softmax_dropout")
