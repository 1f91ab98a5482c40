"""Tests generated from the registries and the configs folder: nothing registered goes untested."""
import ast
import glob
import importlib
import inspect
import os
import re

import numpy as np
import paddle
import pytest

from data import make_demo
from engine import builder, config
from engine.components import ENGINE_MODULES, component_modules, load_all
from engine.registry import DATASETS, METRICS, MODELS, OUTPUTS
from engine.training.optim import build_lr, build_optimizer
from engine.weights.pretrained import WEIGHTS
from tests.helpers import ROOT

load_all()
CONFIGS = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
                 if os.sep + "_base_" + os.sep not in p)   # the folder, not names like bert_base_...
DEMOS = [p for p in CONFIGS if p.endswith("_demo.yaml")]


def rel(path):
    return os.path.relpath(path, ROOT)


def _registers(path):
    """Whether a file registers something: a `@REGISTRY.register(...)` decorator or a `WEIGHTS.add(...)` call."""
    for node in ast.walk(ast.parse(open(path).read())):
        decorators = getattr(node, "decorator_list", [])
        if any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "register"
               for d in decorators):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "WEIGHTS":
            return True
    return False


def test_every_component_file_is_listed():
    """A file anywhere in the project (tests aside) that registers a component is imported by
    load_all(): the engine's own through ENGINE_MODULES, the others through their package's COMPONENTS."""
    files = []
    for path in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True):
        if rel(path).split(os.sep)[0] in ("tests", ".venv", "output"):
            continue
        if _registers(path):
            files.append(rel(path)[:-3].replace(os.sep, "."))
    assert len(files) > 30
    missing = sorted(set(files) - set(component_modules()) - set(ENGINE_MODULES))
    assert not missing, f"not listed in their package's COMPONENTS (__init__.py): {missing}"


def test_every_config_resolves_and_names_a_registered_model():
    assert len(CONFIGS) >= 6
    for path in CONFIGS:
        cfg = config.load(path)
        assert cfg["model"]["name"] in MODELS, path
        assert cfg.get("metric", {}).get("name") in METRICS, path
        assert cfg.get("infer", {}).get("name") in OUTPUTS, path   # tools/infer.py needs a writer
        for split, reader in cfg.get("reader", {}).items():
            assert reader["name"] in DATASETS, (path, split)


def test_every_model_has_a_demo_and_a_full_recipe():
    models = {config.load(p)["model"]["name"] for p in DEMOS}
    full = {config.load(p)["model"]["name"] for p in CONFIGS if p not in DEMOS}
    task_models = {n for n in MODELS.names() if n != "ResNet"}  # backbones are parts, not recipes
    assert task_models <= models, task_models - models
    assert task_models <= full, task_models - full


@pytest.mark.parametrize("path", [p for p in CONFIGS if p not in DEMOS], ids=rel)
def test_full_size_models_build_lazily(path):
    cfg = config.load(path)
    with paddle.LazyGuard():
        model = builder.build_model(cfg["model"])
    assert builder.count_params(model) > 1_000_000


@pytest.fixture(scope="module")
def demo_data():
    make_demo.main([])


@pytest.mark.parametrize("path", DEMOS, ids=rel)
def test_demo_model_steps_and_round_trips(path, demo_data, tmp_path):
    """One optimizer step lowers nothing to NaN, and a saved state dict reloads to identical outputs."""
    cfg = config.load(path)
    paddle.seed(0)
    model = builder.build_model(cfg["model"])
    loader, _, _ = builder.build_loader(cfg, "train", 0)
    batch = next(iter(loader))
    opt = build_optimizer(cfg["optimizer"], model, build_lr(cfg["lr"], 10, 1))
    model.train()
    loss = model(batch)["loss"]
    assert np.isfinite(loss.item())
    loss.backward()
    grads = [p.grad for p in model.parameters() if not p.stop_gradient]
    assert any(g is not None and float(g.abs().sum()) > 0 for g in grads)
    opt.step()
    model.eval()
    with paddle.no_grad():
        before = {k: _arrays(v) for k, v in model(batch).items()}
    paddle.save(model.state_dict(), str(tmp_path / "m.pdparams"))
    fresh = builder.build_model(cfg["model"])
    fresh.set_state_dict(paddle.load(str(tmp_path / "m.pdparams")))
    fresh.eval()
    with paddle.no_grad():
        after = {k: _arrays(v) for k, v in fresh(batch).items()}
    assert before.keys() == after.keys()
    for k in before:
        assert len(before[k]) == len(after[k]), k
        for b, a in zip(before[k], after[k]):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def _arrays(value):
    """An eval output as a list of arrays: a tensor, or a list of per-sample tensors (detections)."""
    return [v.numpy() for v in value] if isinstance(value, list) else [value.numpy()]


@pytest.mark.parametrize("name", WEIGHTS.names())
def test_pretrained_entries_are_well_formed(name):
    e = WEIGHTS.get(name)
    assert e.name == name and e.model in MODELS
    assert all(re.match(r"^https?://\S+$", u) for u in e.urls), e.urls
    assert e.urls or e.notes, "an entry without a release says why"
    assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256)
    assert e.md5 is None or re.fullmatch(r"[0-9a-f]{32}", e.md5)
    assert all(0.0 <= v <= (100.0 if k.startswith("bleu") else 1.0) for k, v in e.metrics.items()), e.metrics  # BLEU 0-100
    if e.metrics:
        assert e.metrics_source and e.dataset
    if e.config:
        assert os.path.isfile(os.path.join(ROOT, e.config)), e.config
    for pattern, _ in e.key_map:
        re.compile(pattern)
    cls = MODELS.get(e.model)
    known = set(inspect.signature(cls).parameters)
    assert set(e.model_args) <= known, set(e.model_args) - known
    if e.num_params:
        with paddle.LazyGuard():
            model = cls(**e.model_args)
        assert builder.count_params(model) == e.num_params


def test_component_modules_import_without_side_effects():
    for name in ENGINE_MODULES + tuple(component_modules()):
        importlib.import_module(name)  # already imported: importing again must be harmless
