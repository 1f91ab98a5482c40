"""The one precision context of ops/ (ops/functional.py's docstring): an immutable ops.Precision held
by a ContextVar, entered by `ops.precision` blocks that restore what was in effect, on any exit.
The kernels' choices under each field are tested with the kernels (test_fast_ops.py, test_bf16*.py);
these tests hold the state's form: one value, no module state, per thread."""
import contextvars
import dataclasses
import threading
import types

import numpy as np
import paddle
import pytest

import ops
from engine import config, runtime
from ops import functional

DEFAULT = ops.Precision(fast_ops=False, bf16=False, route="operands", bf16_act=False)   # the dataclass's defaults


def _module_state():
    """ops.functional's module-level values other than functions, classes and modules, as text."""
    return {k: repr(v) for k, v in vars(functional).items()
            if not k.startswith("__") and not callable(v) and not isinstance(v, types.ModuleType)}


def test_the_state_is_one_context_variable_and_no_module_value_moves():
    """Setting and entering precisions leaves every module-level value of ops.functional as it was
    (the old `_state` dict, written by set_enabled / autocast / bf16_activations, would differ), the
    one ContextVar is the state, and the old flags are gone."""
    variables = [v for v in vars(functional).values() if isinstance(v, contextvars.ContextVar)]
    assert variables == [functional._PRECISION]
    for old in ("_state", "set_enabled", "is_enabled", "enabled_as", "autocast", "bf16_active", "bf16_activations"):
        assert not hasattr(functional, old) and not hasattr(ops, old), old
    before, value = _module_state(), ops.current_precision()
    try:
        ops.set_precision(fast_ops=True)
        with ops.precision(bf16=True, route="fpmath"), ops.precision(bf16_act=True):
            inside = _module_state()
    finally:
        ops.set_precision(value)
    assert inside == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        ops.current_precision().bf16 = True


def test_a_nested_block_derives_from_the_one_in_effect_and_restores_it_on_an_exception():
    """`precision(bf16_act=False)` inside a bf16-activations block (Mask R-CNN's RPN head) changes that
    field alone; an exception out of it, and then out of the outer block, leaves the value each had
    before (ContextVar tokens: exactly the earlier value, not a default)."""
    start = ops.current_precision()
    outer = ops.Precision(fast_ops=True, bf16=True, route="fpmath", bf16_act=True)
    with pytest.raises(KeyError):
        with ops.precision(outer) as entered:
            assert entered == ops.current_precision() == outer
            with pytest.raises(RuntimeError):
                with ops.precision(bf16_act=False) as inner:
                    assert inner == dataclasses.replace(outer, bf16_act=False) == ops.current_precision()
                    raise RuntimeError("inside the RPN head")
            assert ops.current_precision() == outer
            raise KeyError("inside the trunk")
    assert ops.current_precision() == start


def test_a_manager_derives_when_entered_and_names_a_wrong_field_when_made():
    """runtime.autocast builds its block before the step enters it: the value comes from what is in
    effect at entry. A typo or an unknown route fails where the block is written, one line."""
    late = ops.precision(bf16=True)
    with ops.precision(ops.Precision(fast_ops=True)):
        with late as p:
            assert p == ops.Precision(fast_ops=True, bf16=True)
    with pytest.raises(TypeError, match="unknown field bf16act"):
        ops.precision(bf16act=True)
    with pytest.raises(ValueError, match="bf16 route 'fp': one of operands, fpmath"):
        ops.precision(route="fp")


def test_a_thread_starts_from_the_default_and_a_block_stays_on_its_thread():
    """A block changes nothing another thread computes, and a new thread starts from the default (the
    fused path off) whatever this one set up; a thread that runs a model enters the value it needs
    (runtime.autocast's `base`, as api/inferencer.py's calls do)."""
    seen = {}

    def other():
        seen["start"] = ops.current_precision()
        with runtime.autocast(config.AmpSection(), base=ops.Precision(fast_ops=True)):
            seen["based"] = ops.current_precision()
            ready.set()
            done.wait(10)

    ready, done = threading.Event(), threading.Event()
    with ops.precision(ops.Precision(fast_ops=True, bf16=True)) as mine:
        thread = threading.Thread(target=other)
        thread.start()
        assert ready.wait(10)
        here = ops.current_precision()   # while the other thread is inside its block
        done.set()
        thread.join(10)
    assert seen == {"start": DEFAULT, "based": ops.Precision(fast_ops=True)} and here == mine


def test_the_blocks_trace_for_an_export_with_the_fused_path_on(tmp_path):
    """paddle.jit.to_static rewrites ops' functions when a model is exported; a precision value read
    inside a branch once left a name undefined there (every export of a model with ops.matmul failed).
    The traced program computes what the eager layers do."""
    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = paddle.nn.Linear(8, 8), paddle.nn.LayerNorm(8)
            self.conv, self.bn = paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4)

        def forward(self, x, img):
            h = ops.add_norm(ops.linear(x, self.fc, act="gelu"), x, self.norm)
            att = ops.matmul(h, h, transpose_y=True)
            return att, ops.conv_bn_act(img, self.conv, self.bn)

    paddle.seed(0)
    net = Net()
    net.eval()
    x, img = paddle.randn([2, 5, 8]), paddle.randn([2, 3, 6, 6])
    with ops.precision(fast_ops=True):
        eager = [t.numpy() for t in net(x, img)]
        spec = [paddle.static.InputSpec([None, 5, 8], "float32"), paddle.static.InputSpec([None, 3, 6, 6], "float32")]
        static = paddle.jit.to_static(net, input_spec=spec, full_graph=True)
        paddle.jit.save(static, str(tmp_path / "net"))
    loaded = paddle.jit.load(str(tmp_path / "net"))
    for got, want in zip(loaded(x, img), eager):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
