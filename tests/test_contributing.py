"""docs/contributing.md's examples run, so the page stays true to the code: every ```python block in
page order (the one headed `# my_models.py` is written as that module, as a user keeps it, and the
others import it), every ```yaml block loaded on the recipe its `# on <recipe>` line names."""
import os
import sys

import pytest
import yaml

from engine import config, registry
from engine.components import load_all
from engine.weights.pretrained import WEIGHTS
from tests.helpers import ROOT, doc_blocks

DOC = os.path.join(ROOT, "docs", "contributing.md")
MODULE = "# my_models.py\n"


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """The page's my_models.py in a folder on sys.path; afterwards every registry and sys.modules are
    as they were (what the examples register is gone)."""
    load_all()
    for reg in [r for r in vars(registry).values() if isinstance(r, registry.Registry)] + [WEIGHTS]:
        monkeypatch.setattr(reg, "_items", dict(reg._items))
    module = [b for b in doc_blocks(DOC, "python") if b.startswith(MODULE)]
    assert len(module) == 1
    (tmp_path / "my_models.py").write_text(module[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(ROOT)   # the examples name recipes and data relative to the repository
    yield tmp_path
    sys.modules.pop("my_models", None)


def test_the_python_examples_run(yt8m_demo, user_folder):
    examples = [b for b in doc_blocks(DOC, "python") if not b.startswith(MODULE)]
    assert len(examples) >= 6
    for i, code in enumerate(examples):
        try:
            exec(compile(code, f"{DOC} python example {i + 1}", "exec"), {"__name__": f"example_{i + 1}"})
        except Exception as e:
            raise AssertionError(f"example {i + 1} of {DOC} fails: {type(e).__name__}: {e}\n{code}") from e


def _within(part, whole, where=""):
    """Each value of the mapping `part` is what `whole` holds there (an override that took effect)."""
    for key, value in part.items():
        if key == "_delete_":
            continue
        assert key in whole, f"{where}{key} missing"
        if isinstance(value, dict) and not value.get("_delete_"):
            _within(value, whole[key], f"{where}{key}.")
        else:
            expected = {k: v for k, v in value.items() if k != "_delete_"} if isinstance(value, dict) else value
            assert whole[key] == expected, f"{where}{key}: {whole[key]!r} != {expected!r}"


def test_the_yaml_examples_load_on_their_recipes(user_folder):
    examples = doc_blocks(DOC, "yaml")
    assert len(examples) >= 6
    for i, text in enumerate(examples):
        first = text.splitlines()[0]
        assert first.startswith("# on configs/"), f"yaml example {i + 1} names no recipe: {first!r}"
        recipe = os.path.join(ROOT, first[len("# on "):].strip())
        path = user_folder / f"example_{i + 1}.yaml"
        path.write_text(f"_base_: [{recipe}]\n{text}")
        cfg = config.load(str(path))
        _within(yaml.safe_load(text), cfg, f"yaml example {i + 1}: ")
