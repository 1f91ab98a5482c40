"""What a user is told when a weights file does not fit the recipe's model (issue 37): the error's
first words name the zoo model the file looks like (or say it matches none), the key lists stay
short, and a PaddleNLP post-norm Transformer file (no final LayerNorm after its stacks) points to
`model.final_norm: false`.

Expectations come from the models' own definitions (their state dicts), not from the loader: which
keys a TSN demo model has that a DeepLabV3 demo model lacks, and which keys `final_norm` adds.
"""
import re

import numpy as np
import paddle
import pytest

from engine.components import load_all
from engine.errors import ConfigError
from engine.model import ZooModel
from engine.registry import MODELS
from engine.session import Session
from engine.weights import pretrained
from engine.weights.pretrained import load_pretrained
from models.nlp.transformer import Transformer
from tests.helpers import assert_one_line_error, tool
from tests.test_weights_loading import paddlevideo_name

load_all()

TSN_DEMO = "configs/video/tsn/tsn_demo.yaml"
DEEPLAB_DEMO = "configs/vision/deeplabv3/deeplabv3_demo.yaml"
ALSTM_DEMO = "configs/video/attention_lstm/attention_lstm_demo.yaml"
KEY = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")   # a dotted parameter name, as the messages list them


def quiet(*_):
    pass


def demo_model(config):
    return Session.from_file(config).model()


def error_of(model, path, **kwargs):
    with pytest.raises(ConfigError) as err:
        load_pretrained(model, str(path), strict=True, log=quiet, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def listed(msg, what):
    """The keys a message lists in the parentheses after `what` (e.g. "missing", "unexpected")."""
    m = re.search(re.escape(what) + r" \(([^)]*)\)", msg)
    assert m, (what, msg)
    return [k for k in m.group(1).split(", ") if k != "..."]


@pytest.fixture(scope="module")
def tsn_file(tmp_path_factory):
    """The TSN demo model's state (random init), saved as a checkpoint's final/model.pdparams would be."""
    model = demo_model(TSN_DEMO)
    path = tmp_path_factory.mktemp("tsn") / "model.pdparams"
    paddle.save(model.state_dict(), str(path))
    return path, list(model.state_dict())


# --------------------------------------------------------------------------- another model's file
def test_another_models_file_is_named_first(tsn_file):
    path, tsn_keys = tsn_file
    deeplab = demo_model(DEEPLAB_DEMO)
    own = list(deeplab.state_dict())
    missing = [k for k in own if k not in tsn_keys]       # the ASPP head, the classifier
    unexpected = [k for k in tsn_keys if k not in own]    # TSN's fc
    assert missing and unexpected and len(unexpected) < len(tsn_keys) / 2  # the trunks share names
    msg = error_of(deeplab, path)
    assert msg.startswith(f"model.pdparams looks like a TSN checkpoint (all {len(tsn_keys)} of its keys are "
                          f"TSN's), not a DeepLabV3: "), msg
    assert f"{len(missing)} of the model's {len(own)} keys missing" in msg
    assert f"{len(unexpected)} unexpected" in msg
    shown_missing, shown_unexpected = listed(msg, "missing"), listed(msg, "unexpected")
    assert 0 < len(shown_missing) <= 4 and set(shown_missing) <= set(missing)
    assert 0 < len(shown_unexpected) <= 4 and set(shown_unexpected) <= set(unexpected)
    assert len(KEY.findall(msg.split(";")[0])) <= 8 + 1   # the keys above and the file name
    assert "--weights-format" in msg and len(msg) < 420, len(msg)


def test_an_official_layout_is_recognised_through_its_key_map(tmp_path):
    """The TSN demo model's keys in PaddleVideo's names (tests/test_weights_loading.py writes them from
    the published table), loaded into an AttentionLSTM: named TSN, through the entry that reads them."""
    with paddle.LazyGuard():
        tsn = MODELS.get("TSN")(num_classes=5, backbone={"name": "ResNet", "depth": 18})
    official = {paddlevideo_name(k, 18): np.zeros([1], "float32") for k in tsn.state_dict()}
    path = tmp_path / "TSN_k400.pdparams"
    paddle.save(official, str(path))
    msg = error_of(demo_model(ALSTM_DEMO), path)
    assert re.match(rf"TSN_k400\.pdparams looks like a TSN checkpoint in the names of 'tsn_\w+' \(all "
                    rf"{len(official)} of its keys are TSN's\), not an AttentionLSTM: ", msg), msg


def test_a_file_of_no_zoo_model_says_so(tmp_path, monkeypatch):
    """Random names: no model claims them. A registered model whose defaults do not build is skipped."""
    class Unbuildable(ZooModel):
        def __init__(self, needed):
            super().__init__()

    monkeypatch.setitem(MODELS._items, "Unbuildable", Unbuildable)
    rng = np.random.default_rng(0)
    state = {f"block{i}.part{j}.w": rng.standard_normal([3]).astype("float32") for i in range(5) for j in range(3)}
    path = tmp_path / "mystery.pdparams"
    paddle.save(state, str(path))
    tsn = demo_model(TSN_DEMO)
    msg = error_of(tsn, path)
    n = len(tsn.state_dict())
    assert msg.startswith(f"mystery.pdparams matches none of the zoo's models: none of the model's {n} keys in it, "
                          f"{len(state)} unexpected ("), msg
    assert 0 < len(listed(msg, "unexpected")) <= 4


def test_a_file_of_the_models_own_kind_keeps_its_message(tsn_file):
    """Another num_classes: the head-shape message, word for word as before."""
    path, _ = tsn_file
    model = Session.from_file(TSN_DEMO, ["model.num_classes=7"]).model()
    assert error_of(model, path) == ("model.pdparams: fc.weight has shape [512, 5], the model expects [512, 7] "
                                     "(num_classes differs? set model.num_classes: 5)")


def test_a_successful_load_never_looks_at_the_zoo(tsn_file, monkeypatch):
    def boom():
        raise AssertionError("the zoo was built on a load that succeeded")

    monkeypatch.setattr(pretrained, "_zoo_key_sets", boom)
    path, keys = tsn_file
    report = load_pretrained(demo_model(TSN_DEMO), str(path), strict=True, log=quiet)
    assert report["loaded"] == len(keys) and report["missing"] == report["unexpected"] == []


def test_the_eval_tool_prints_it_on_one_line(tmp_path):
    """A DeepLabV3 demo file given to the TSN demo's eval: one `error:` line, exit code 2."""
    deeplab = demo_model(DEEPLAB_DEMO)
    path = tmp_path / "model.pdparams"
    paddle.save(deeplab.state_dict(), str(path))
    proc = tool("eval", "-c", TSN_DEMO, "--weights", path, "--output", tmp_path / "out", check=False)
    assert proc.returncode == 2
    line = assert_one_line_error(proc, "error: model.pdparams looks like a DeepLabV3 checkpoint", "not a TSN: ",
                                 "--weights-format")
    assert len(line) < 420, len(line)


# --------------------------------------------------------------------------- PaddleNLP post-norm files
TINY = dict(src_vocab_size=16, trg_vocab_size=16, d_model=8, d_inner_hid=16, n_head=2, num_encoder_layers=1,
            num_decoder_layers=1, max_length=12, dropout=0.0)


def test_a_post_norm_file_without_final_norms_points_to_final_norm_false(tmp_path):
    """PaddleNLP's TransformerModel with normalize_before=False builds its stacks without a final
    LayerNorm: such a file lacks exactly the keys `final_norm` adds."""
    paddle.seed(0)
    with_norm = Transformer(normalize_before=False, final_norm=True, **TINY)
    without = Transformer(normalize_before=False, final_norm=False, **TINY)
    final_norms = sorted(set(with_norm.state_dict()) - set(without.state_dict()))
    assert len(final_norms) == 4 and set(without.state_dict()) < set(with_norm.state_dict())
    path = tmp_path / "transformer.pdparams"
    paddle.save(without.state_dict(), str(path))

    msg = error_of(Transformer(normalize_before=False, final_norm=True, **TINY), path)
    assert "4 of the model's" in msg and set(listed(msg, "missing from the file")) == set(final_norms)
    assert msg.endswith("the file has no final LayerNorm after the encoder/decoder stacks (PaddleNLP's post-norm "
                        "layout): set model.final_norm: false (-o model.final_norm=false)"), msg

    fresh = Transformer(normalize_before=False, final_norm=False, **TINY)
    report = load_pretrained(fresh, str(path), strict=True, log=quiet)
    assert report["missing"] == report["unexpected"] == []
    for k, v in without.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[k].numpy(), v.numpy())

    # the same file in a pre-norm recipe (PaddleNLP's pre-norm files have the norms): both settings named
    msg = error_of(Transformer(normalize_before=True, final_norm=True, **TINY), path)
    assert "model.normalize_before: false and model.final_norm: false" in msg
    # anything else missing too: not this hint
    partial = tmp_path / "partial.pdparams"
    paddle.save({k: v for k, v in without.state_dict().items() if not k.startswith("transformer.decoder.")},
                str(partial))
    assert "final_norm" not in error_of(Transformer(normalize_before=False, final_norm=True, **TINY), partial)


def test_the_default_model_has_no_hint():
    class Minimal(ZooModel):
        pass

    assert Minimal().weights_hint(["a.weight"], []) is None


def test_the_class_count_hint_reads_the_axis_that_differs():
    """A conv head ([classes, in, 1, 1], DeepLabV3's cls) names its first axis, a Linear ([in, classes]) its
    last: 3-class weights into a 5-class model say 3 (the hint said 1, the kernel's width, before)."""
    class Head(paddle.nn.Layer):
        def __init__(self, classes):
            super().__init__()
            self.cls = paddle.nn.Conv2D(64, classes, 1)
            self.fc = paddle.nn.Linear(8, classes)

    three = {k: v.numpy() for k, v in Head(3).state_dict().items()}
    for key in ("cls.weight", "fc.weight"):
        state = {k: (v if k.split(".")[0] == key.split(".")[0] else Head(5).state_dict()[k].numpy())
                 for k, v in three.items()}
        with pytest.raises(ConfigError, match=r"num_classes differs\? set model.num_classes: 3\)"):
            pretrained.load_state(Head(5), state, head_keys=(r"cls\..*", r"fc\..*"), strict=True, what="w.pdparams")
