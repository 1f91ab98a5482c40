"""Config loading: inheritance, overrides, validation errors that name the file and the key."""
import os

import pytest
import yaml

from engine import config
from engine.errors import ConfigError
from engine.registry import MODELS


class Dummy:
    def __init__(self, hidden_size: int = 8, drop_rate: float = 0.5, names: list = ("a",),
                 act: str = "relu", backbone: dict = None):
        pass


class DummyBackbone:
    def __init__(self, depth: int = 18):
        pass


@pytest.fixture(autouse=True)
def dummy_models(monkeypatch):
    monkeypatch.setitem(MODELS._items, "Dummy", Dummy)
    monkeypatch.setitem(MODELS._items, "DummyBackbone", DummyBackbone)


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def recipe(tmp_path):
    write(tmp_path / "_base_" / "model.yaml", {"model": {"name": "Dummy", "hidden_size": 16, "names": ["x", "y"]},
                                               "train": {"epochs": 5, "amp": {"enable": False}}})
    return write(tmp_path / "r.yaml", {"_base_": ["_base_/model.yaml"], "model": {"drop_rate": 0.1},
                                       "train": {"epochs": 2}})


def test_base_merge_and_overrides(recipe):
    cfg = config.load(recipe, ["model.hidden_size=32", "model.names.1=z", "train.amp.level=O2",
                               "model.act=gelu"])
    assert cfg["model"] == {"name": "Dummy", "hidden_size": 32, "names": ["x", "z"], "drop_rate": 0.1, "act": "gelu"}
    assert cfg["train"] == {"epochs": 2, "amp": {"enable": False, "level": "O2"}}


def test_lists_replace_and_delete(tmp_path, recipe):
    child = write(tmp_path / "c.yaml", {"_base_": "r.yaml", "model": {"_delete_": True, "name": "Dummy", "names": ["q"]}})
    cfg = config.load(child)
    assert cfg["model"] == {"name": "Dummy", "names": ["q"]}


def test_override_values_are_yaml_not_eval(recipe):
    cfg = config.load(recipe, ["model.act=__import__('os')"])
    assert cfg["model"]["act"] == "__import__('os')"


def test_override_numbers_and_quoted_strings():
    # YAML 1.1 (pyyaml) reads 1e-3 as the string '1e-3': a number is meant; in quotes a string is meant
    assert config.parse_override("lr.base=1e-3") == ("lr.base", 0.001)
    assert config.parse_override('train.pretrained="123"') == ("train.pretrained", "123")
    assert config.parse_override("train.pretrained='1e-3'") == ("train.pretrained", "1e-3")
    assert config.parse_override("train.epochs=3") == ("train.epochs", 3)


def test_nested_component_validated(recipe):
    cfg = config.load(recipe, ["model.backbone={name: DummyBackbone, depth: 34}"])
    assert cfg["model"]["backbone"]["depth"] == 34
    with pytest.raises(ConfigError, match=r"-o: model.backbone.deph: unknown key .*did you mean 'depth'"):
        config.load(recipe, ["model.backbone={name: DummyBackbone, deph: 34}"])


def test_unknown_key_names_file_key_and_suggestion(tmp_path, recipe):
    bad = write(tmp_path / "bad.yaml", {"_base_": ["r.yaml"], "model": {"hiden_size": 3}})
    with pytest.raises(ConfigError) as e:
        config.load(bad)
    msg = str(e.value)
    assert msg.startswith(bad + ": model.hiden_size: unknown key")
    assert "did you mean 'hidden_size'" in msg


def test_unknown_key_in_base_names_the_base_file(tmp_path):
    base = write(tmp_path / "_base_" / "b.yaml", {"train": {"epoch": 3}})
    top = write(tmp_path / "t.yaml", {"_base_": ["_base_/b.yaml"], "model": {"name": "Dummy"}})
    with pytest.raises(ConfigError, match=rf"^{base}: train.epoch: unknown key .*did you mean 'epochs'"):
        config.load(top)


def test_wrong_types(recipe):
    with pytest.raises(ConfigError, match=r"model.hidden_size: expected int, got str 'big'"):
        config.load(recipe, ["model.hidden_size=big"])
    with pytest.raises(ConfigError, match=r"train.epochs: expected int, got float"):
        config.load(recipe, ["train.epochs=2.5"])
    with pytest.raises(ConfigError, match=r"model.hidden_size: expected int, got bool"):
        config.load(recipe, ["model.hidden_size=true"])
    cfg = config.load(recipe, ["model.drop_rate=0"])  # an int is a valid float
    assert cfg["model"]["drop_rate"] == 0
    with pytest.raises(ConfigError, match=r"train.amp.dtype: must be one of float16, bfloat16"):
        config.load(recipe, ["train.amp.dtype=float8"])


def test_unknown_model_and_top_level(recipe):
    with pytest.raises(ConfigError, match=r"model.name: unknown model 'Dumy' \(did you mean 'Dummy'\?\)"):
        config.load(recipe, ["model.name=Dumy"])
    with pytest.raises(ConfigError, match=r"trian: unknown top-level key \(did you mean 'train'\?\)"):
        config.load(recipe, ["trian.epochs=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        config.load(str(tmp_path / "nope.yaml"))
    p = tmp_path / "broken.yaml"
    p.write_text("model: {name: Dummy\n  x: [1,\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: invalid YAML"):
        config.load(str(p))


def test_bad_override_syntax(recipe):
    with pytest.raises(ConfigError, match="must look like a.b.c=value"):
        config.load(recipe, ["model.hidden_size"])
    with pytest.raises(ConfigError, match="index '5' out of range"):
        config.load(recipe, ["model.names.5=q"])


def test_resolved_config_round_trips(tmp_path, recipe):
    cfg = config.load(recipe, ["model.hidden_size=64"])
    out = str(tmp_path / "resolved.yaml")
    config.dump(cfg, out)
    assert config.load(out) == cfg
    assert "_base_" not in open(out).read()
