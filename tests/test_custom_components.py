"""A model kept outside the zoo's tree (docs/contributing.md's), registered through a recipe's
`custom_imports`, goes through every tool without a line of the zoo edited; and each tool builds
exactly one Session per run."""
import json
import os
import sys
import textwrap

import pytest

from engine import config
from engine.components import load_all
from engine.errors import ConfigError
from engine.registry import MODELS
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT, doc_blocks, logged_losses, read_metrics, tools_in_one_process

# the user's module: the model of docs/contributing.md ("The model contract"), as a user would keep it
MODULE = next(b for b in doc_blocks(os.path.join(ROOT, "docs", "contributing.md"), "python")
              if b.startswith("# my_models.py\n"))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """A folder of the user's own: their model module and a recipe that imports it."""
    folder = tmp_path_factory.mktemp("user_models")
    (folder / "my_models.py").write_text(MODULE)
    (folder / "mean_pool.yaml").write_text(textwrap.dedent(f"""\
        _base_: [{os.path.join(ROOT, ATTENTION_LSTM_DEMO)}]
        custom_imports: {{imports: [my_models]}}
        model: {{_delete_: true, name: MeanPoolMLP, num_classes: 8}}
        train: {{epochs: 3, log_interval: 1}}
        """))
    return folder


def test_a_model_outside_the_tree_trains_and_every_tool_builds_one_session(yt8m_demo, user_folder, tmp_path):
    run, export, int8 = tmp_path / "run", tmp_path / "export", tmp_path / "int8"
    video = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    weights = ["--weights", run / "final"]
    recorded = ["-c", run / "config.yaml"]   # the run's config.yaml: custom_imports travels with it
    results = tools_in_one_process([
        ("train", ["-c", user_folder / "mean_pool.yaml", "--output", run], {}),
        ("eval", [*recorded, *weights, "--output", tmp_path / "eval"], {}),
        ("export", [*recorded, *weights, "--output", export], {}),
        ("infer", [*recorded, "--weights", export, "--backend", "inference", "--input", video,
                   "--output", tmp_path / "infer"], {}),
        ("quantize", [*recorded, *weights, "--output", int8, "--split", "val", "--calib-batches", "1"], {}),
        ("benchmark", [*recorded, "--steps", "1", "--workers", "0", "--batch-size", "8"], {}),
    ], env={"PYTHONPATH": str(user_folder)})
    for tool, r in zip(["train", "eval", "export", "infer", "quantize", "benchmark"], results):
        assert r["code"] == 0, (tool, r["stderr"][-2000:])
        assert r["sessions"] == 1, (tool, r["sessions"])
    losses = logged_losses(run)   # every step's: it learns, on the zoo's reader, loop and metric
    assert losses[-3:].mean() < 0.85 * losses[:3].mean(), losses
    assert read_metrics(run)["gap"] == pytest.approx(read_metrics(tmp_path / "eval")["gap"], abs=1e-6)
    with open(tmp_path / "infer" / "predictions.json") as f:
        assert len(json.load(f)) > 10


@pytest.fixture
def user_path(user_folder, monkeypatch):
    """The user's folder on sys.path for an in-process test; afterwards the registry and sys.modules
    are as they were (the zoo's own registry tests see the zoo's models only)."""
    load_all()
    monkeypatch.syspath_prepend(str(user_folder))
    monkeypatch.setattr(MODELS, "_items", dict(MODELS._items))
    yield user_folder
    sys.modules.pop("my_models", None)


def test_custom_imports_register_before_the_recipe_is_checked(user_path):
    cfg = config.load(str(user_path / "mean_pool.yaml"), ["model.hidden=16"])
    model = MODELS.build(cfg["model"])
    assert type(model).__module__ == "my_models" and model.fc1.weight.shape == [1024, 16]
    with pytest.raises(ConfigError, match=r"model.hiden: unknown key for model 'MeanPoolMLP'"):
        config.load(str(user_path / "mean_pool.yaml"), ["model.hiden=16"])


@pytest.mark.parametrize("override, message", [
    ("custom_imports.imports=[no_such_module]",
     r"-o: custom_imports: cannot import 'no_such_module' \(ModuleNotFoundError: No module named "
     r"'no_such_module'\); it must be importable from PYTHONPATH or the current directory"),
    ("custom_imports=[my_models]", r"custom_imports: expected \{imports: \[module names\], allow_failed_imports"),
    ("custom_imports.import=[my_models]", r"custom_imports: unknown key import; known: imports, allow_failed_imports"),
])
def test_a_bad_custom_import_is_one_line_naming_it(user_path, override, message):
    with pytest.raises(ConfigError, match=message):
        config.load(str(user_path / "mean_pool.yaml"), [override])


def test_a_user_module_that_fails_is_named_with_its_own_error(user_path, capsys):
    (user_path / "broken_models.py").write_text("raise RuntimeError('boom in user code')\n")
    recipe = str(user_path / "mean_pool.yaml")
    with pytest.raises(ConfigError, match=r"^-o: custom_imports: cannot import 'broken_models' "
                                          r"\(RuntimeError: boom in user code\)$"):
        config.load(recipe, ["custom_imports.imports=[my_models, broken_models]"])
    config.load(recipe, ["custom_imports.imports=[my_models, broken_models]", "custom_imports.allow_failed_imports=true"])
    assert capsys.readouterr().err.strip() == ("warning: -o: custom_imports: cannot import 'broken_models' "
                                               "(RuntimeError: boom in user code); going on without it")
    sys.modules.pop("broken_models", None)
