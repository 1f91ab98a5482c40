"""The traps a new user met on the walk from the demo to export and infer (issue 37), each as the user
typed it: the line they get, the exit code, and that nothing written is lost.

The command-line cases run through the tools' own entry points in one helper process
(tests/helpers.py `tools_in_one_process`: paddle imported once), on copies of the trained demo runs
(AttentionLSTM, DeepLabV3) so the default output folders land inside the copies.
"""
import json
import logging
import os
import shutil

import cv2
import pytest

from readers.tfrecord import iter_records
from tests.conftest import ATTENTION_LSTM_DEMO
from tests.helpers import ROOT, one_error_line, read_metrics, tools_in_one_process

DEEPLAB_DEMO = "configs/vision/deeplabv3/deeplabv3_demo.yaml"


def _copy_run(src, dst, parts=("config.yaml", "final", "checkpoints")):
    os.makedirs(dst)
    for part in parts:
        (shutil.copytree if os.path.isdir(os.path.join(src, part)) else shutil.copy)(
            os.path.join(src, part), os.path.join(dst, part))
    return dst


def _snapshot(folder):
    """{relative path: bytes} of every file under `folder`."""
    out = {}
    for d, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), folder)] = fh.read()
    return out


@pytest.fixture(scope="module")
def walk(attention_lstm_run, deeplab_demo_run, yt8m_demo, voc_demo, tmp_path_factory):
    """Every command-line trap of the walk, run once: {case: result}, plus the folders they used."""
    root = tmp_path_factory.mktemp("traps")
    run = _copy_run(str(attention_lstm_run), str(root / "alstm"))
    seg = _copy_run(str(deeplab_demo_run), str(root / "deeplab"), parts=("config.yaml", "final"))
    images = os.path.join(voc_demo, "VOC2012", "JPEGImages")
    image = cv2.imread(os.path.join(images, sorted(os.listdir(images))[0]))
    cv2.imwrite(str(root / "good.jpg"), image)
    (root / "bad.jpg").write_bytes(b"not a jpeg at all")
    (root / "a_file").write_text("")
    val = os.path.join(yt8m_demo, "tfrecord", "validate0001.tfrecord")
    before = _snapshot(run)
    export = os.path.join(run, "export")
    al, dl = ["-c", ATTENTION_LSTM_DEMO], ["-c", DEEPLAB_DEMO]
    cases = {
        "infer_none_readable": ("infer", dl + ["--weights", os.path.join(seg, "final"), "--input", root / "bad.jpg"]),
        "infer_some_readable": ("infer", dl + ["--weights", os.path.join(seg, "final"),
                                               "--input", root / "bad.jpg", root / "good.jpg"]),
        "export_to_a_file": ("export", al + ["--weights", os.path.join(run, "final"), "--output", root / "a_file"]),
        "config_folder": ("train", ["-c", "configs/video/tsn"]),
        "max_steps_and_epochs_by_o": ("train", al + ["-o", "train.max_steps=1", "-o", "train.epochs=2",
                                                     "--output", root / "both"]),
        "max_steps_over_recipe_epochs": ("train", al + ["-o", "train.max_steps=3", "train.log_interval=1",
                                                        "train.save_steps=3", "--output", root / "short"]),
        "resume_finished": ("train", al + ["--resume", "auto", "--output", run]),
        "eval_default_output": ("eval", al + ["--weights", os.path.join(run, "final")]),
        "export": ("export", al + ["--weights", os.path.join(run, "final"), "--output", export]),
        "eval_export_without_c": ("eval", ["--weights", export, "--output", os.path.join(run, "eval_export")]),
        "infer_export_without_c": ("infer", ["--weights", export, "--input", val]),
        "infer_export_dynamic": ("infer", al + ["--weights", export, "--backend", "dynamic", "--input", val]),
        "infer_weights_without_c": ("infer", ["--weights", os.path.join(run, "final"), "--input", val]),
    }
    results = tools_in_one_process([(tool, argv, None) for tool, argv in cases.values()])
    return dict(zip(cases, results)), {"root": root, "run": run, "seg": seg, "before": before, "val": val}


def _err(result):
    return "\n".join(f"exit {result['code']}\n{result['stdout'][-1500:]}\n{result['stderr'][-1500:]}".splitlines())


def test_infer_with_no_readable_input_is_an_error_naming_each_file(walk):
    results, where = walk
    got = results["infer_none_readable"]
    lines = [ln for ln in got["stderr"].splitlines() if ln.strip()]
    assert got["code"] == 2 and "Traceback" not in got["stderr"], _err(got)
    assert lines[-1] == "error: the one input could not be read (it is named above); nothing written", _err(got)
    assert any("bad.jpg" in ln and "WARNING" in ln for ln in got["stdout"].splitlines()), _err(got)


def test_infer_with_some_unreadable_inputs_names_them_and_counts(walk):
    results, where = walk
    got = results["infer_some_readable"]
    assert got["code"] == 0, _err(got)
    assert got["stdout"].strip().splitlines()[-1] == "1 of 2 inputs skipped (unreadable; each is named above)"
    assert any("bad.jpg" in ln and "WARNING" in ln for ln in got["stdout"].splitlines()), _err(got)
    # the default output: infer/ of the run the weights came from, not output/<config name>/
    assert os.path.isfile(os.path.join(where["seg"], "infer", "good.png")), _err(got)


def test_an_existing_file_as_export_output_is_one_line(walk):
    results, where = walk
    line = one_error_line(results["export_to_a_file"])
    assert line and "a_file is an existing file" in line, _err(results["export_to_a_file"])
    assert (where["root"] / "a_file").read_text() == ""


def test_a_folder_as_config_says_so_and_lists_its_recipes(walk):
    line = one_error_line(walk[0]["config_folder"])
    assert line and "configs/video/tsn is a folder" in line, _err(walk[0]["config_folder"])
    recipes = sorted(f for f in os.listdir(os.path.join(ROOT, "configs", "video", "tsn")) if f.endswith(".yaml"))
    assert all(f"configs/video/tsn/{f}" in line for f in recipes), line


def test_max_steps_replaces_the_recipes_epochs_and_both_by_o_name_the_fix(walk):
    results, where = walk
    line = one_error_line(results["max_steps_and_epochs_by_o"])
    assert line and "not both" in line and "-o train.epochs=null" in line, _err(results["max_steps_and_epochs_by_o"])
    got = results["max_steps_over_recipe_epochs"]   # `-o a=1 b=2`, PaddleDetection's form, as well
    assert got["code"] == 0, _err(got)
    assert "note: -o train.max_steps=3 replaces the recipe's train.epochs: 6" in got["stdout"], _err(got)
    with open(where["root"] / "short" / "config.yaml") as f:
        text = f.read()
    assert "max_steps: 3" in text and "log_interval: 1" in text and "save_steps: 3" in text
    steps = [ln for ln in open(where["root"] / "short" / "train.log") if " step " in ln and "eta" in ln]
    assert len(steps) == 3, steps
    # the first two steps (the operators' first build, oneDNN's kernels) are left out of the ETA
    assert [ln.split("eta ")[1].split(" |")[0] for ln in steps] == ["?", "?", "00:00:00"], steps


def test_resuming_a_finished_run_says_so_and_changes_nothing(walk):
    results, where = walk
    got = results["resume_finished"]
    assert got["code"] == 0, _err(got)
    log = open(os.path.join(where["run"], "train.log")).read()
    assert "is finished: its checkpoint" in log and "nothing to train" in log
    assert "resumed from" not in log.split("is finished")[-1]
    after = _snapshot(where["run"])
    assert {k: v for k, v in after.items() if k in where["before"]} == where["before"]   # no file rewritten
    assert not any(k.startswith(("checkpoints", "final")) for k in set(after) - set(where["before"]))


def test_eval_and_infer_of_an_export_need_no_config(walk):
    results, where = walk
    run = where["run"]
    for case in ("eval_default_output", "export", "eval_export_without_c", "infer_export_without_c"):
        assert results[case]["code"] == 0, (case, _err(results[case]))
    dynamic, exported = read_metrics(os.path.join(run, "eval")), read_metrics(os.path.join(run, "eval_export"))
    assert dynamic["num_samples"] == exported["num_samples"] == 200
    assert abs(dynamic["gap"] - exported["gap"]) < 1e-4, (dynamic, exported)
    got = results["infer_export_without_c"]
    assert f"note: {os.path.join(run, 'export')} is a paddle export of AttentionLSTM: running it with --backend " \
           f"inference" in got["stdout"], _err(got)
    with open(os.path.join(run, "infer", "predictions.json")) as f:
        assert len(json.load(f)) == sum(1 for _ in iter_records(where["val"]))


def test_an_export_given_to_the_dynamic_backend_or_weights_without_config_are_one_line(walk):
    results, _ = walk
    line = one_error_line(results["infer_export_dynamic"])
    assert line and "leave --backend out" in line, _err(results["infer_export_dynamic"])
    line = one_error_line(results["infer_weights_without_c"])
    assert line and "-c CONFIG is needed" in line, _err(results["infer_weights_without_c"])


# ------------------------------------------------------------------------------ in process

def test_override_takes_several_pairs_after_one_flag_and_repeats():
    from engine import cli
    p = cli.parser("x")
    args = p.parse_args(["-c", "c.yaml", "-o", "a=1", "b=2", "-o", "c=3"])
    assert args.override == ["a=1", "b=2", "c=3"]
    assert p.parse_args(["-c", "c.yaml"]).override == []


def test_the_eta_leaves_out_the_warmup_steps():
    from engine.training.trainer import _Meter
    meter = _Meter(10, warm=2)
    assert meter.eta(100) == "?"
    for t in (30.0, 4.0, 1.0, 3.0):   # a 30 s first step (the operators' build) and a slow second one
        meter.update({}, 8, 0, t, None)
        if t == 4.0:
            assert meter.eta(100) == "?"
    assert meter.eta(100) == "00:03:20"   # (1 + 3) / 2 s x 100 batches, by hand


def test_the_first_build_of_the_fused_operators_is_announced(tmp_path, monkeypatch, caplog):
    import sys
    from ops import library
    target = tmp_path / "cache" / "abc" / "zoo_fast_ops.so"
    monkeypatch.setattr(library, "library_path", lambda: str(target))
    monkeypatch.setattr(library, "compile_commands", lambda out: (
        [[sys.executable, "-c", f"open({out!r}, 'w').write('so')"]], []))
    with caplog.at_level(logging.INFO, logger="zoo"):
        assert library.build() == str(target)
        library.build()   # cached: silent
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("fast_ops: compiling the fused C++ operators") and str(target.parent) in lines[0]
    assert lines[1].startswith("fast_ops: compiled in ")


def test_outputs_default_to_the_run_the_weights_came_from(tmp_path, monkeypatch):
    from engine import cli
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "checkpoints" / "epoch_2").mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    (run / "final" / "model.pdparams").write_bytes(b"")
    for weights in (run / "final", run / "final" / "model.pdparams", run / "checkpoints" / "epoch_2"):
        assert cli.default_output("configs/x/y_demo.yaml", str(weights), "eval") == os.path.join(run, "eval")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loose.pdparams").write_bytes(b"")
    for weights in ("loose.pdparams", "tsn_r50_k400_3seg", "https://x/y.pdparams", None):
        assert cli.default_output("configs/x/y_demo.yaml", weights, "infer") == os.path.join("output", "y_demo",
                                                                                           "infer")


def test_the_license_is_apache_2_and_the_changelog_lists_the_nine_models():
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        first = f.read().split("\n## [")[2]   # [Unreleased], then the first release
    for model in ("BERT", "Transformer", "DeepLabV3", "Mask R-CNN", "TSN", "StNet", "Attention Cluster", "NeXtVLAD",
                  "AttentionLSTM"):
        assert model in first, model


def test_a_damaged_export_record_is_one_line(tmp_path):
    from deploy.record import read_infer_cfg
    from engine.errors import ConfigError
    (tmp_path / "infer_cfg.yml").write_text("zoo_export_version: 1\nformat: paddle\nconfig: [1, 2\n")
    with pytest.raises(ConfigError, match=r"infer_cfg.yml:4: not a readable record .*export the model again"):
        read_infer_cfg(str(tmp_path))
    (tmp_path / "infer_cfg.yml").write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match=r"infer_cfg.yml: not a record of tools/export.py"):
        read_infer_cfg(str(tmp_path))
