"""The model contract (engine/model.py): a model that overrides nothing gets the documented defaults,
and every registered model is a ZooModel, so the engine can call the contract on any of them."""
import warnings

import paddle
import pytest

from engine import builder
from engine.components import load_all
from deploy import export
from engine.model import DataAgreement, NormLayer, Weights, ZooModel, unwrap
from engine.errors import ConfigError
from engine.registry import MODELS, Registry
from engine.training.optim import split_decay
from engine.weights.pretrained import load_pretrained, model_layouts
from models.nlp.bert import BertModel

load_all()


class Minimal(ZooModel):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(2, 3)

    def forward(self, batch):
        return {"logits": self.fc(batch["x"])}


class Reader:
    """What check_agreement reads of a reader."""
    num_classes, vocab_size, max_seq_length = 5, 100, 1000


def test_a_minimal_model_gets_the_documented_defaults(tmp_path):
    m = Minimal()
    assert m.weights() == Weights(head_keys=(), foreign_keys=(), layout_models=(), layouts=(), backbone=None)
    assert m.data_agreement() == DataAgreement(num_classes=None, num_classes_key="num_classes", vocab_size=None,
                                               max_seq_length=None)
    assert m.check_weights_config({"model_type": "bert", "hidden_size": 7}, 3, str(tmp_path)) is None
    assert Minimal.exported_runner({}, {}) is None
    assert unwrap(m) is m
    for spec in (m.export_spec, lambda: export.spec_of(m)):
        with pytest.raises(ConfigError, match=r"^model Minimal cannot be exported \(it has no export_spec\)$"):
            spec()
    # what the engine makes of the defaults: native files only, nothing compared with the reader
    layouts = model_layouts(m)
    assert list(layouts) == ["native"]
    assert list(layouts["native"].head_keys) == [] and list(layouts["native"].foreign_keys) == []
    builder.check_agreement(m, Reader())


def test_the_engine_reads_what_a_model_overrides():
    class Vocabulary(Minimal):
        def data_agreement(self):
            return DataAgreement(num_classes=3, num_classes_key="trg_vocab_size")

    with pytest.raises(ConfigError, match=r"model\.trg_vocab_size is 3 but reader\.val \(Reader\) has 5 classes; "
                                          r"make them agree \(e\.g\. -o model\.trg_vocab_size=5\)"):
        builder.check_agreement(Vocabulary(), Reader(), "val")


def test_unwrap_takes_the_model_out_of_data_parallel():
    m = Minimal()
    with warnings.catch_warnings():   # one process: "return to single-card operation"
        warnings.simplefilter("ignore")
        wrapped = paddle.DataParallel(m)
    assert unwrap(wrapped) is m


def test_every_registered_model_is_a_zoo_model():
    assert len(MODELS.names()) >= 10
    for name in MODELS.names():
        cls = MODELS.get(name)
        assert isinstance(cls, type) and issubclass(cls, ZooModel), name
        assert MODELS.name_of(cls) == name
    assert issubclass(BertModel, ZooModel)   # loaded by load_bert, not registered
    assert MODELS.name_of(Minimal) is None


def test_a_registry_lists_its_objects_in_registration_order_and_names_them():
    reg = Registry("thing")
    first, second = type("Second", (), {}), type("First", (), {})
    reg.register("b")(first)
    reg.register("a")(second)
    assert reg.values() == [first, second] and reg.names() == ["a", "b"]
    assert reg.name_of(second) == "a" and reg.name_of(object) is None


def test_a_norm_layer_of_a_models_own_takes_the_norm_rule():
    class Gain(NormLayer):
        def __init__(self):
            super().__init__()
            self.weight = self.create_parameter([3, 3])

    class Net(Minimal):
        def __init__(self):
            super().__init__()
            self.gain = Gain()

    decay, exempt, _ = split_decay(Net())
    assert [n for n, _ in decay] == ["fc.weight"] and sorted(n for n, _ in exempt) == ["fc.bias", "gain.weight"]
    decay, _, _ = split_decay(Net(), no_decay=["bias"])
    assert sorted(n for n, _ in decay) == ["fc.weight", "gain.weight"]


def test_loading_into_a_layer_outside_the_contract_is_one_line(tmp_path):
    """A plain paddle layer has no weights(): one ConfigError naming its class, not an AttributeError."""
    layer = paddle.nn.Linear(2, 3)
    path = str(tmp_path / "w.pdparams")
    paddle.save(layer.state_dict(), path)
    with pytest.raises(ConfigError, match=r"^cannot load weights into a Linear: it is not an engine\.model\.ZooModel"):
        load_pretrained(layer, path, log=lambda *_: None)
