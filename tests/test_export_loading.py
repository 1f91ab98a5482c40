"""deploy/load.py: an export folder as a run, on records written by hand (no training, no tracing): the
recipe and class names an export records, and the one-line errors of a record that lacks them (an
older export) or of flags that name no recipe. The walk of the demo through export, eval and infer is
tests/test_newcomer_traps.py's."""
import argparse
import os

import pytest
import yaml

from deploy import load
from deploy.record import EXPORT_VERSION, INFER_CFG, PROGRAM, read_infer_cfg, write_infer_cfg
from engine import config
from engine.components import load_all
from engine.errors import ConfigError
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT


def _export(folder, with_config=True, with_metric=False, label_names=None):
    """A record as deploy/export.py writes one (its "config" keys), with the program's files present
    (empty: nothing here runs them)."""
    folder.mkdir(exist_ok=True)
    for ext in (".json", ".pdiparams"):
        (folder / (PROGRAM + ext)).write_bytes(b"")
    load_all()
    cfg = config.load(os.path.join(ROOT, ATTENTION_LSTM_DEMO))
    recipe = {"model": dict(cfg["model"]), "reader": {"val": dict(cfg["reader"]["val"])}, "infer": cfg.get("infer"),
              **({"metric": dict(cfg["metric"])} if with_metric else {})}
    write_infer_cfg(str(folder), {"zoo_export_version": EXPORT_VERSION, "format": "paddle", "model": "AttentionLSTM",
                                  "inputs": [], "outputs": [],
                                  **({"config": recipe} if with_config else {}), "label_names": label_names})
    return str(folder)


def _args(config_path=None, weights=None):
    return argparse.Namespace(config=config_path, weights=weights, override=[], trust_weights=False)


def test_an_export_is_the_session_of_the_recipe_it_records(tmp_path):
    folder = _export(tmp_path / "export", with_metric=True, label_names=["a", "b"])
    assert load.is_export(folder) and not load.is_export(str(tmp_path)) and not load.is_export(None)
    s = load.from_args(_args(weights=folder))   # no -c: the export's own recipe
    assert isinstance(s, load.ExportSession) and s.path == os.path.join(folder, INFER_CFG)
    assert s.cfg["model"]["name"] == "AttentionLSTM" and s.label_names() == ["a", "b"]
    assert type(load.from_args(_args(config_path=os.path.join(ROOT, ATTENTION_LSTM_DEMO), weights=folder))) \
        is not load.ExportSession   # -c wins: the recipe given


def test_a_record_without_what_the_run_needs_is_one_line(tmp_path):
    older = _export(tmp_path / "older", with_config=False)
    with pytest.raises(ConfigError, match=rf"^{os.path.join(older, INFER_CFG)} records no config \(an older "
                                          rf"export\): give the recipe with -c$"):
        load.from_export(older)
    no_metric = _export(tmp_path / "no_metric")
    s = load.from_export(no_metric)
    with pytest.raises(ConfigError, match=r"infer_cfg.yml records no metric \(an export older than evaluation "
                                          r"of exports\): give the recipe with -c$"):
        s.metric()
    assert s.label_names() is None   # neither recorded names nor a labels: file


def test_flags_that_name_no_recipe_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^-c CONFIG is needed$"):
        load.from_args(_args())
    with pytest.raises(ConfigError, match=rf"^-c CONFIG is needed: --weights {tmp_path} is not an export directory "
                                          rf"\(with infer_cfg.yml\), which records its recipe$"):
        load.from_args(_args(weights=str(tmp_path)))
    s = load.from_args(_args(config_path=os.path.join(ROOT, ATTENTION_LSTM_DEMO)))
    flags = argparse.Namespace(backend=None, no_mkldnn=False, trt=None, precision="bf16", ov_hint="LATENCY")
    with pytest.raises(ConfigError, match=r"^--precision sets how an export runs; for weights use -o eval.amp=...$"):
        load.runnable(s, str(tmp_path / "model.pdparams"), args=flags)


@pytest.mark.parametrize("damage, says", [
    (lambda r: r.pop("inputs"), "inputs is missing or not a list"),
    (lambda r: r.update(outputs="logits"), "outputs is missing or not a list"),
    (lambda r: r.update(inputs=[{"name": "x"}]), r"inputs\[0\] is not a spec with a name and a shape list"),
    (lambda r: r.update(programs=[]), "'programs' is not a mapping of program names"),
    (lambda r: r.update(programs={PROGRAM: {"inputs": [], "outputs": None}}), f"programs.{PROGRAM}.outputs is missing"),
])
def test_a_damaged_record_is_one_line_naming_the_key(tmp_path, damage, says):
    """A record edited by hand or cut short names its file and the key, where a backend would stop on a
    KeyError (the record's keys: deploy/export.py writes `inputs` specs with name and shape)."""
    folder = _export(tmp_path / "export")
    path = os.path.join(folder, INFER_CFG)
    record = yaml.safe_load(open(path))
    damage(record)
    with open(path, "w") as f:
        yaml.safe_dump(record, f)
    with pytest.raises(ConfigError, match=rf"^{path}: {says}.*export the model again with tools/export.py$"):
        read_infer_cfg(folder)
