"""TSN and StNet on the generated Kinetics-format demo videos, through the tools as a user runs them.

Each model learns what it can see: TSN (averaged single frames) the appearance demo, StNet
(super-images of consecutive frames) the motion demo, while TSN stays near chance on motion. The TSN
run's weights then go through tools/eval.py (val and the multi-view test split) and tools/infer.py.
The full-size recipes resolve, build at their published sizes and read videos into the models'
layout.
"""
import glob
import json
import os

import paddle
import pytest

from engine import builder, config
from engine.components import load_all
from engine.registry import TRANSFORMS
from engine.weights.pretrained import WEIGHTS
from models.video.clips import as_float
from tests.conftest import TSN_DEMO
from tests.helpers import ROOT, read_metrics, tool

FULL_RECIPES = sorted(p for model in ("tsn", "stnet")
                      for p in glob.glob(os.path.join(ROOT, "configs", "video", model, "*.yaml"))
                      if not p.endswith("_demo.yaml"))
# trainable parameters at 400 classes (see tests/test_resnet_tsn_stnet.py for the breakdown)
NUM_PARAMS = {"TSN": 24327632, "StNet": 33158864}
CLASSES = {"appearance": ["red", "yellow", "green", "blue", "magenta"],
           "motion": ["static", "up", "down", "horizontal", "rotate"]}


def _components():
    load_all()


def _data_overrides(folder):
    """-o arguments pointing a recipe's train/val readers at another demo folder."""
    rel = os.path.relpath(folder, ROOT)
    keys = [f"labels={rel}/label_names.txt"]
    for split in ("train", "val"):
        keys += [f"reader.{split}.list_file={rel}/{split}.list",
                 f"reader.{split}.label_names={rel}/label_names.txt"]
    return [arg for k in keys for arg in ("-o", k)]


def test_tsn_demo_learns_appearance(tsn_demo_run):
    m = read_metrics(tsn_demo_run)
    assert m["top1"] >= 0.6, m           # chance is 0.2
    assert m["num_samples"] == 60
    assert 0.0 <= m["mean_class_acc"] <= 1.0 and m["top5"] >= m["top1"]
    assert os.path.isfile(os.path.join(tsn_demo_run, "final", "model.pdparams"))


def test_stnet_demo_learns_motion(stnet_demo_run):
    m = read_metrics(stnet_demo_run)
    assert m["top1"] >= 0.6, m           # chance is 0.2: single frames carry no class information
    assert m["num_samples"] == 60


def test_tsn_cannot_see_motion(kinetics_demo, tmp_path):
    """The same TSN recipe on the motion demo: every single frame looks alike whatever the class, and
    the consensus averages per-frame features, so it stays near chance."""
    tool("train", "-c", TSN_DEMO, *_data_overrides(kinetics_demo["motion"]), "--output", tmp_path)
    m = read_metrics(tmp_path)
    assert m["top1"] <= 0.4, m
    assert m["num_samples"] == 60


def test_eval_tool_reproduces_training_metrics(tsn_demo_run, tmp_path):
    proc = tool("eval", "-c", TSN_DEMO, "--weights", os.path.join(tsn_demo_run, "final"),
                "--split", "val", "--output", tmp_path)
    got, trained = read_metrics(tmp_path), read_metrics(tsn_demo_run)
    for k in ("top1", "top5", "mean_class_acc", "num_samples"):
        assert got[k] == pytest.approx(trained[k], abs=1e-6), k
    assert "top1=" in proc.stdout


def test_multi_view_test_split(tsn_demo_run, tmp_path):
    """`--split test`: segments x TenCrop (views averaged in the model); ThreeCrop by override.
    3 segments instead of the recipe's 8 keep it quick."""
    _components()
    cfg = config.load(os.path.join(ROOT, TSN_DEMO))
    sample = builder.build_dataset(cfg, "test")[0]
    # views (crops), segments, C, H, W
    assert sample["imgs"].shape == (10, cfg["reader"]["test"]["num_seg"], 3, 56, 56)
    weights = os.path.join(tsn_demo_run, "final", "model.pdparams")
    for crop in ("TenCrop", "ThreeCrop"):
        out = tmp_path / crop
        tool("eval", "-c", TSN_DEMO, "--weights", weights, "--split", "test", "--output", out,
             "-o", f"reader.test.transforms.1.name={crop}", "-o", "reader.test.num_seg=3")
        m = read_metrics(out)
        assert m["num_samples"] == 60, (crop, m)
        assert 0.5 <= m["top1"] <= m["top5"] <= 1.0, (crop, m)
        assert 0.0 <= m["mean_class_acc"] <= 1.0


def test_infer_prints_and_writes_top5_names(tsn_demo_run, kinetics_demo, tmp_path):
    folder = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    one = sorted(glob.glob(os.path.join(kinetics_demo["appearance"], "videos", "val", "blue", "*")))[0]
    weights = os.path.join(tsn_demo_run, "final", "model.pdparams")
    for inputs, n in (([one], 1), ([folder], len(os.listdir(folder)))):
        out = tmp_path / str(n)
        proc = tool("infer", "-c", TSN_DEMO, "--weights", weights, "--input", *inputs, "--output", out)
        with open(out / "predictions.json") as f:
            preds = json.load(f)
        assert len(preds) == n
        for p in preds:
            names = [t["label"] for t in p["top_k"]]
            scores = [t["score"] for t in p["top_k"]]
            assert sorted(names) == sorted(CLASSES["appearance"])          # all 5 classes, by name
            assert scores == sorted(scores, reverse=True) and 0.99 <= sum(scores) <= 1.01
            assert [t["class_id"] for t in p["top_k"]] == [CLASSES["appearance"].index(x) for x in names]
            assert f"{p['id']}: {names[0]} {scores[0]:.3f}" in proc.stdout
        assert "predictions.json" in proc.stdout
    # the names are the right ones: most red videos come out red
    assert sum(p["top_k"][0]["label"] == "red" for p in preds) > len(preds) / 2, preds


@pytest.mark.parametrize("path", FULL_RECIPES, ids=os.path.basename)
def test_full_recipe_resolves_and_builds(path):
    _components()
    cfg = config.load(path)
    name = cfg["model"]["name"]
    with paddle.LazyGuard():
        model = builder.build_model(cfg["model"])
    assert builder.count_params(model) == NUM_PARAMS[name]
    entry = WEIGHTS.get(cfg["train"]["pretrained"])
    assert entry.model == name and entry.dataset == "ImageNet-1k"
    assert cfg["model"]["num_classes"] == 400 and cfg["optimizer"]["name"] == "Momentum"
    for split in ("train", "val", "test"):
        reader = cfg["reader"][split]
        assert reader["list_file"].startswith("data/kinetics400/"), (split, reader["list_file"])
        for t in reader["transforms"]:
            TRANSFORMS.build(t)      # every transform's arguments are accepted by its constructor


def test_full_recipes_are_all_there():
    names = [os.path.basename(p) for p in FULL_RECIPES]
    assert names == ["stnet_r50_60e_k400.yaml", "tsn_r50_100e_k400.yaml", "tsn_r50_45e_k400.yaml",
                     "tsn_r50_8seg_100e_k400.yaml"]


# per split: the model input of one video, from the recipes' sampling and transforms
LAYOUTS = {
    "tsn_r50_45e_k400.yaml": [(3, 3, 224, 224), (3, 3, 224, 224), (7, 3, 224, 224)],
    "tsn_r50_100e_k400.yaml": [(3, 3, 224, 224), (3, 3, 224, 224), (10, 25, 3, 224, 224)],
    "tsn_r50_8seg_100e_k400.yaml": [(8, 3, 224, 224), (8, 3, 224, 224), (10, 25, 3, 224, 224)],
    "stnet_r50_60e_k400.yaml": [(7, 15, 224, 224), (7, 15, 224, 224), (25, 15, 256, 256)],
}


@pytest.mark.parametrize("path", FULL_RECIPES, ids=os.path.basename)
def test_full_recipe_readers_give_the_model_layout(path, kinetics_demo):
    """The full-size sampling and transforms, run on a demo video (scaled up to 256 by the recipe)."""
    _components()
    rel = os.path.relpath(kinetics_demo["appearance"], ROOT)
    overrides = [f"reader.{split}.{key}={rel}/{name}" for split in ("train", "val", "test")
                 for key, name in (("list_file", "val.list"), ("label_names", "label_names.txt"))]
    cfg = config.load(path, overrides)
    for split, shape in zip(("train", "val", "test"), LAYOUTS[os.path.basename(path)]):
        sample = builder.build_dataset(cfg, split)[0]
        imgs = sample["imgs"]
        assert imgs.shape == shape, (split, imgs.shape)
        if "imgs_normalize" in sample:   # Normalize(in_main_process): uint8 to the trainer, float32 into the model
            assert imgs.dtype == "uint8", split
            imgs = as_float({"imgs": paddle.to_tensor(imgs[None]), "imgs_normalize": [sample["imgs_normalize"]]})
            assert tuple(imgs.shape[1:]) == shape and imgs.dtype == paddle.float32, split
        else:
            assert imgs.dtype == "float32", split
