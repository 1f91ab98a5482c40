"""Weights loaded as a user would try: official files by path (layout detection), a head of another
size, ResNet-101 TSN files, forced layouts, and the one-line errors when a file does not fit.

Official files are synthesised from the PaddleVideo naming scheme: `paddlevideo_name` below is written
from tests/data/keys_paddlevideo_tsn_r50_k400.json (and checked against it) plus the kit's block-name
rule (res4a, res4b1 ... for 101/152), never from our key maps.
"""
import json
import os
import re

import numpy as np
import paddle
import pytest

from data import demo_kinetics
from engine.training import checkpoint
from engine.weights.pretrained import (WEIGHTS, detect_layout, load_entry_state, load_pretrained, map_keys,
                               model_layouts)
from engine.errors import ConfigError
from models.video.stnet import StNet, inflate_conv1
from models.video.tsn import TSN
from models.vision.resnet import kit_block_name
from tests.helpers import assert_one_line_error, tool

DATA = os.path.join(os.path.dirname(__file__), "data")
TSN_DEMO = "configs/video/tsn/tsn_demo.yaml"
R18 = {"name": "ResNet", "depth": 18}


def quiet(*_):
    pass


def paddlevideo_name(key, depth):
    """Our TSN key -> its PaddleVideo 2.x name (Recognizer2D: backbone.conv / backbone.res2a.conv0
    ._conv / ._batch_norm, head.fc)."""
    unit = {"conv": "_conv", "bn": "_batch_norm"}
    m = re.fullmatch(r"backbone\.stem\.0\.(conv|bn)\.(\w+)", key)
    if m:
        return f"backbone.conv.{unit[m[1]]}.{m[2]}"
    m = re.fullmatch(r"backbone\.layer(\d)\.(\d+)\.(conv\d|short)\.(conv|bn)\.(\w+)", key)
    if m:
        return f"backbone.{kit_block_name(depth, int(m[1]) - 1, int(m[2]))}.{m[3]}.{unit[m[4]]}.{m[5]}"
    m = re.fullmatch(r"fc\.(weight|bias)", key)
    if m:
        return f"head.fc.{m[1]}"
    raise AssertionError(f"no PaddleVideo name for {key}")


def official_state(model, depth, seed=0):
    """A PaddleVideo-layout state dict for `model` with random values; also {official: ours}."""
    rng = np.random.default_rng(seed)
    names = {paddlevideo_name(k, depth): k for k in model.state_dict()}
    state = {theirs: rng.standard_normal(list(model.state_dict()[ours].shape)).astype("float32")
             for theirs, ours in names.items()}
    return state, names


def tsn18(num_classes=5):
    return TSN(num_classes=num_classes, backbone=R18)


def assert_loaded(model, state, names):
    own = model.state_dict()
    for theirs, ours in names.items():
        np.testing.assert_array_equal(own[ours].numpy(), state[theirs], err_msg=ours)


# --------------------------------------------------------------------------- naming scheme
def test_naming_scheme_matches_the_official_table():
    with open(os.path.join(DATA, "keys_paddlevideo_tsn_r50_k400.json")) as f:
        table = json.load(f)["params"]
    with paddle.LazyGuard():
        own = TSN(num_classes=400).state_dict()
    assert [paddlevideo_name(k, 50) for k in own] == [row[0] for row in table]
    assert [list(v.shape) for v in own.values()] == [row[1] for row in table]
    # the kit's ResNet-101 names (PaddleVideo resnet.py: "res4" + "b" + str(i) in the third stage)
    assert paddlevideo_name("backbone.layer3.22.conv2.bn._variance", 101) == \
        "backbone.res4b22.conv2._batch_norm._variance"
    assert paddlevideo_name("backbone.layer3.5.conv0.conv.weight", 50) == "backbone.res4f.conv0._conv.weight"


@pytest.mark.parametrize("depth", [18, 34, 50, 101, 152])
def test_paddlevideo_map_covers_every_depth(depth):
    with paddle.LazyGuard():
        own = list(TSN(num_classes=400, backbone={"name": "ResNet", "depth": depth}).state_dict())
    for entry in ("tsn_r50_k400_3seg", "tsn_r50_k400_8seg"):
        mapped, ignored = map_keys({paddlevideo_name(k, depth): 0 for k in own}, WEIGHTS.get(entry))
        assert sorted(mapped) == sorted(own) and not ignored
        assert all(mapped[k] == 0 for k in own)
    mapped, _ = map_keys({paddlevideo_name(k, depth): k for k in own}, WEIGHTS.get("tsn_r50_k400_3seg"))
    assert all(mapped[k] == k for k in own)  # every name lands on its own key, not just some key


# --------------------------------------------------------------------------- ResNet-101
def test_resnet101_tsn_file_loads():
    model = TSN(num_classes=400, backbone={"name": "ResNet", "depth": 101})
    own = model.state_dict()
    names = {paddlevideo_name(k, 101): k for k in own}
    assert len(names) == len(own) == 522  # stem 5 + (3+4+23+3) blocks x 15 (+15 per projection) + fc 2
    assert "backbone.res4b22.conv1._conv.weight" in names and "backbone.res4w.conv1._conv.weight" not in names
    # a distinct constant per tensor shows where each one lands, cheaply at this size
    state = {theirs: np.full(list(own[ours].shape), i, dtype="float32")
             for i, (theirs, ours) in enumerate(names.items())}
    layout, _, _, (found, total) = detect_layout(model, state, model_layouts(model))
    assert layout.name == "tsn_r50_k400_3seg" and found == total == 522
    report = load_entry_state(model, state, WEIGHTS.get("tsn_r50_k400_3seg"), strict=True, log=quiet)
    assert report["missing"] == report["unexpected"] == [] and report["loaded"] == 522
    own = model.state_dict()
    for i, (theirs, ours) in enumerate(names.items()):
        value = own[ours].numpy()
        assert value.min() == value.max() == i, (theirs, ours)
    # the same 101 file does not fit a ResNet-50 TSN: strict loading says so, naming the file's extra blocks
    with paddle.LazyGuard():
        r50 = TSN(num_classes=400)
    with pytest.raises(ConfigError, match=r"255 unexpected keys in the file \(backbone\.layer3\.6\.conv0\."):
        load_entry_state(r50, state, WEIGHTS.get("tsn_r50_k400_3seg"), strict=True, log=quiet)


def test_stnet_imagenet_init_of_another_depth():
    """A PaddleVideo ImageNet trunk (bare names, with its ImageNet classifier) of depth 18 into an
    18-layer StNet: trunk loaded, conv1 inflated, the layers StNet adds keep their initialisation."""
    model = StNet(num_classes=7, seglen=5, backbone=R18)  # the entry inflates conv1 for seglen 5
    with paddle.LazyGuard():
        trunk_keys = [k for k in tsn18().state_dict() if k.startswith("backbone.")]
    rng = np.random.default_rng(3)
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    shapes["backbone.stem.0.conv.weight"] = [64, 3, 7, 7]  # an RGB trunk
    state = {paddlevideo_name(k, 18)[len("backbone."):]: rng.standard_normal(shapes[k]).astype("float32")
             for k in trunk_keys}
    state.update({"fc_0.w_0": np.zeros([512, 1000], "float32"), "fc_0.b_0": np.zeros([1000], "float32")})
    logs = []
    layout, _, _, _ = detect_layout(model, state, model_layouts(model))
    assert layout.name == "stnet_r50_imagenet_init"
    report = load_entry_state(model, state, WEIGHTS.get("stnet_r50_imagenet_init"), log=logs.append)
    assert report["unexpected"] == [] and sorted(report["ignored"]) == ["fc_0.b_0", "fc_0.w_0"]
    assert {k.split(".")[0] for k in report["missing"]} == {"fc", "temporal1", "temporal2", "xception"}
    own = model.state_dict()
    np.testing.assert_allclose(own["backbone.stem.0.conv.weight"].numpy(),
                               inflate_conv1(state["conv._conv.weight"], 5), rtol=1e-6)
    np.testing.assert_array_equal(own["backbone.layer4.1.conv1.bn._mean"].numpy(),
                                  state["res5b.conv1._batch_norm._mean"])


# --------------------------------------------------------------------------- in-process loading
@pytest.fixture(scope="module")
def official_file(tmp_path_factory):
    """A PaddleVideo-layout TSN-R18 (5 classes) file, as the demo config's model."""
    folder = tmp_path_factory.mktemp("official")
    with paddle.LazyGuard():
        model = tsn18()
    state, names = official_state(model, 18)
    path = folder / "TSN_k400.pdparams"
    paddle.save(state, str(path))
    return path, state, names


def test_official_file_by_path_is_detected_and_loaded(official_file):
    path, state, names = official_file
    for strict in (True, False):  # eval/infer, and training initialisation (train.pretrained)
        model, logs = tsn18(), []
        report = load_pretrained(model, str(path), strict=strict, log=logs.append)
        assert report["layout"] == "tsn_r50_k400_3seg" and report["entry"] is None
        assert report["missing"] == report["unexpected"] == [] and report["loaded"] == len(names)
        assert any("detected layout 'tsn_r50_k400_3seg'" in line and "PaddleVideo" in line for line in logs), logs
        assert_loaded(model, state, names)


def test_native_file_is_detected_as_native(tmp_path):
    src = tsn18()
    path = tmp_path / "mine.pdparams"
    paddle.save(src.state_dict(), str(path))
    model, logs = tsn18(), []
    assert load_pretrained(model, str(path), strict=True, log=logs.append)["layout"] == "native"
    assert any("detected layout 'native'" in line for line in logs)
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[k].numpy(), v.numpy())


def test_forced_layout(official_file):
    path, state, names = official_file
    model = tsn18()
    report = load_pretrained(model, str(path), strict=True, log=quiet, weights_format="tsn_r50_k400_8seg")
    assert report["layout"] == "tsn_r50_k400_8seg"
    assert_loaded(model, state, names)
    with pytest.raises(ConfigError) as err:
        load_pretrained(tsn18(), str(path), strict=False, log=quiet, weights_format="native")
    msg = str(err.value)
    n = len(names)  # training: the fc may be missing (head_keys), the 105 others may not
    assert f"{n - 2} of the model's {n} keys missing" in msg and f"{n} unexpected keys" in msg
    with pytest.raises(ConfigError, match=r"'tsn_r50_k400_3sg' is not a layout of TSN weights \(did you mean "
                                          r"'tsn_r50_k400_3seg'\?\); choose one of: native, tsn_r50_k400_3seg"):
        load_pretrained(tsn18(), str(path), log=quiet, weights_format="tsn_r50_k400_3sg")


def test_other_head_size_training_drops_it(tmp_path):
    """Fine-tuning: a 101-class official file into a 400-class recipe keeps everything but the head."""
    with paddle.LazyGuard():
        src = tsn18(num_classes=101)
    state, names = official_state(src, 18, seed=1)
    path = tmp_path / "tsn_k101.pdparams"
    paddle.save(state, str(path))
    model = tsn18(num_classes=400)
    fc_before = model.fc.weight.numpy().copy()
    logs = []
    report = load_pretrained(model, str(path), strict=False, log=logs.append)
    assert report["layout"] == "tsn_r50_k400_3seg"
    assert sorted(report["dropped_head"]) == ["fc.bias", "fc.weight"] and report["missing"] == []
    assert any("dropped head keys" in line and "fc.weight [512, 101] vs [512, 400]" in line for line in logs), logs
    np.testing.assert_array_equal(model.fc.weight.numpy(), fc_before)
    assert_loaded(model, state, {k: v for k, v in names.items() if not k.startswith("head.")})
    with pytest.raises(ConfigError) as err:
        load_pretrained(tsn18(num_classes=400), str(path), strict=True, log=quiet)
    assert str(err.value) == ("tsn_k101.pdparams: fc.weight has shape [512, 101], the model expects "
                              "[512, 400] (num_classes differs? set model.num_classes: 101)")


def test_missing_non_head_keys_are_an_error_for_training(tmp_path):
    """A file without part of the trunk must not start a run half from scratch."""
    src = tsn18()
    state = {k: v for k, v in src.state_dict().items() if not k.startswith("backbone.layer4.")}
    path = tmp_path / "partial.pdparams"
    paddle.save(state, str(path))
    with pytest.raises(ConfigError) as err:
        load_pretrained(tsn18(), str(path), strict=False, log=quiet)
    msg = str(err.value)
    # TSN-R18: stem 5 + 8 basic blocks x 10 + 4 projections x 5 + fc 2 = 107 keys; layer4 2 x 10 + 5
    assert msg.startswith("partial.pdparams (layout 'native'): 25 of the model's 107 keys missing from "
                          "the file (backbone.layer4.0.conv0.conv.weight, ")
    assert "--weights-format / train.weights_format" in msg and "\n" not in msg
    # the fc alone missing (a backbone-only file) is what head_keys allow: logged, not an error
    paddle.save({k: v for k, v in src.state_dict().items() if not k.startswith("fc.")}, str(path))
    logs = []
    report = load_pretrained(tsn18(), str(path), strict=False, log=logs.append)
    assert report["missing"] == ["fc.weight", "fc.bias"]
    assert any("missing keys left at their initial values" in line for line in logs)


def test_backbone_entries_are_layouts_under_backbone(tmp_path):
    """A ResNet entry asked for by name in a TSN recipe loads into `backbone.` (not as a failure)."""
    entry = WEIGHTS.get("resnet50_imagenet_paddlevideo")
    with paddle.LazyGuard():
        model = tsn18()
    layout = model_layouts(model)[entry.name]
    assert layout.prefix == "backbone."
    mapped, _ = layout.map({"res5b.conv1._batch_norm._mean": 0, "backbone.conv._conv.weight": 1})
    assert mapped == {"backbone.layer4.1.conv1.bn._mean": 0, "backbone.stem.0.conv.weight": 1}


def test_checkpoints_still_load(tmp_path):
    paddle.seed(0)
    src = paddle.nn.Linear(3, 2)
    checkpoint.save(str(tmp_path / "epoch_1"), src, state={"epoch": 1})
    dst = paddle.nn.Linear(3, 2)
    assert checkpoint.load(str(tmp_path / "epoch_1"), dst)["epoch"] == 1
    np.testing.assert_array_equal(dst.weight.numpy(), src.weight.numpy())
    with pytest.raises(ConfigError, match=r"model\.pdparams: weight has shape \[3, 2\], the model expects \[3, 4\]"):
        checkpoint.load(str(tmp_path / "epoch_1"), paddle.nn.Linear(3, 4))


# --------------------------------------------------------------------------- the tools
@pytest.fixture(scope="module")
def tiny_videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    return demo_kinetics.make(str(root), num_train=2, num_val=2, demos=("appearance",))["appearance"]


def test_eval_tool_detects_the_official_layout(official_file, tiny_videos, tmp_path):
    path, _, _ = official_file
    proc = tool("eval", "-c", TSN_DEMO, "--weights", path, "--split", "val", "--output", tmp_path,
                "-o", f"reader.val.list_file={tiny_videos}/val.list",
                "-o", f"reader.val.label_names={tiny_videos}/label_names.txt")
    assert "detected layout 'tsn_r50_k400_3seg'" in proc.stdout
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["num_samples"] == 2


def test_eval_tool_errors(official_file, tmp_path):
    """Each fails while loading, before any data is read."""
    path, _, names = official_file
    proc = tool("eval", "-c", TSN_DEMO, "--weights", path, "--weights-format", "native", check=False)
    line = assert_one_line_error(proc, "TSN_k400.pdparams (layout 'native')",
                                 f"{len(names)} of the model's {len(names)} keys missing",
                                 "backbone.stem.0.conv.weight", f"{len(names)} unexpected keys",
                                 "backbone.conv._conv.weight", "--weights-format")
    assert "strict loading" in line

    unrelated = tmp_path / "unrelated.pdparams"
    paddle.save({"encoder.layers.0.weight": np.zeros([4, 4], "float32"),
                 "encoder.layers.0.bias": np.zeros([4], "float32")}, str(unrelated))
    proc = tool("eval", "-c", TSN_DEMO, "--weights", unrelated, check=False)
    assert_one_line_error(proc, "unrelated.pdparams matches none of the zoo's models",
                          f"none of the model's {len(names)} keys in it",
                          "2 unexpected (encoder.layers.0.weight, encoder.layers.0.bias)",
                          "train.weights_format (native, tsn_r50_k400_3seg")

    proc = tool("eval", "-c", TSN_DEMO, "--weights", path, "-o", "model.num_classes=400", check=False)
    assert_one_line_error(proc, "TSN_k400.pdparams: fc.weight has shape [512, 5], the model expects "
                                "[512, 400] (num_classes differs? set model.num_classes: 5)")

    proc = tool("eval", "-c", TSN_DEMO, "--weights", path, "--weights-format", "paddlevideo", check=False)
    assert_one_line_error(proc, "'paddlevideo' is not a layout of TSN weights",
                          "choose one of: native, tsn_r50_k400_3seg, tsn_r50_k400_8seg, tsn_r50_imagenet_init")


def test_training_with_unrelated_weights_stops(kinetics_demo, tmp_path):
    """train.pretrained of a file that does not fit: one line, exit 2, before any step."""
    unrelated = tmp_path / "unrelated.pdparams"
    paddle.save({"w": np.zeros([2], "float32")}, str(unrelated))
    proc = tool("train", "-c", TSN_DEMO, "-o", f"train.pretrained={unrelated}", "--output", tmp_path / "out",
                check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc, "unrelated.pdparams matches none of the zoo's models", "1 unexpected (w)",
                          "train.weights_format")
