"""The one precision context of ops/ (ops/functional.py's docstring): an immutable ops.Precision held
by a ContextVar, entered by `ops.precision` blocks that restore what was in effect, on any exit.
The kernels' choices under each field are tested with the kernels (test_fast_ops.py, test_bf16*.py);
these tests hold the state's form: one value, no module state, per thread."""
import contextvars
import dataclasses
import threading
import types

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
