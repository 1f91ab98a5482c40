"""api/models.py: any of the nine models in one call (create_model), with the CPU settings our trainer
applies (setup_cpu), and docs/getting-started.md's own-loop example, run as a user runs it."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from api import models as api_models
from engine.errors import ConfigError
from engine.registry import MODELS
from tests.helpers import ENV, ROOT, doc_blocks

DOC = os.path.join(ROOT, "docs", "getting-started.md")
# every demo recipe, by name, and the class each builds (the nine families; BERT's two demos)
DEMOS = {"attention_cluster_demo": "AttentionCluster", "attention_lstm_demo": "AttentionLSTM",
         "bert_glue_demo": "BertForSequenceClassification", "bert_pretrain_demo": "BertForPretraining",
         "deeplabv3_demo": "DeepLabV3", "mask_rcnn_demo": "MaskRCNN", "nextvlad_demo": "NeXtVLAD",
         "stnet_demo": "StNet", "transformer_demo": "Transformer", "tsn_demo": "TSN"}


def _python(code):
    """`code` in a fresh process from the clone's folder, as a user's script (PYTHONPATH=.)."""
    env = {k: v for k, v in ENV.items() if k not in ("MKL_DEBUG_CPU_TYPE", "FLAGS_use_stride_kernel")}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(env, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_demo_recipe_builds_by_name_and_by_file():
    assert set(DEMOS) == {n for n in api_models.recipes() if n.endswith("_demo")}
    for name, cls in DEMOS.items():
        assert type(api_models.create_model(name, cpu=False)).__name__ == cls, name
    path = api_models.recipes()["tsn_demo"]
    assert os.path.relpath(path, ROOT) == os.path.join("configs", "video", "tsn", "tsn_demo.yaml")
    assert type(api_models.create_model(path, cpu=False)).__name__ == "TSN"


def test_model_arguments_and_overrides_reach_the_model():
    fc = dict(api_models.create_model("tsn_demo", cpu=False, num_classes=7).named_parameters())["fc.weight"]
    assert list(fc.shape) == [512, 7]                       # the demo's ResNet-18: 512 features
    over = api_models.create_model("tsn_demo", overrides=["model.num_classes=3"], cpu=False)
    assert list(dict(over.named_parameters())["fc.weight"].shape) == [512, 3]


def test_an_entry_builds_the_model_it_holds_weights_for():
    # bert-base-uncased names the SST-2 fine-tuning recipe that starts from it; its weights are the
    # pretraining model's (engine/weights/pretrained.py), which is what it builds
    assert type(api_models.create_model("bert-base-uncased", cpu=False)).__name__ == "BertForPretraining"
    assert type(api_models.create_model("tsn_r50_k400_3seg", cpu=False)).__name__ == "TSN"
    # an entry without a recipe: its model and model_args (BERT-base cased: vocabulary 28996)
    cased = api_models.create_model("bert-base-cased", cpu=False)
    assert list(cased.bert.embeddings.word_embeddings.weight.shape) == [28996, 768]


def test_pretrained_weights_load_from_a_file_and_an_entry_by_name(tmp_path, monkeypatch):
    paddle.seed(1)
    trained = api_models.create_model("attention_cluster_demo", cpu=False)
    path = str(tmp_path / "model.pdparams")
    paddle.save(trained.state_dict(), path)
    lines = []
    paddle.seed(2)
    loaded = api_models.create_model("attention_cluster_demo", pretrained=path, cpu=False, log=lines.append)
    for key, value in trained.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[key].numpy(), value.numpy(), err_msg=key)
    assert any(path in line for line in lines), lines
    # pretrained=True on an entry loads that entry (not reached here: the tests stay offline)
    asked = []
    monkeypatch.setattr(api_models, "load_pretrained", lambda model, spec, log: asked.append(spec))
    api_models.create_model("tsn_r50_k400_3seg", pretrained=True, cpu=False)
    assert asked == ["tsn_r50_k400_3seg"]


@pytest.mark.parametrize("name, kwargs, message", [
    ("tsn_r50_100e_k40", {}, "create_model: 'tsn_r50_100e_k40' is neither a recipe file, a recipe name nor a "
                             "pretrained entry (did you mean 'tsn_r50_100e_k400'?)"),
    ("tsn_r50_100e_k400", {"pretrained": True}, "create_model: pretrained=True takes a pretrained entry's name, "
                                                "'tsn_r50_100e_k400' is a recipe (its entries: tsn_r50_k400_3seg)"),
    ("bert-base-cased", {"overrides": ["model.num_classes=2"]}, "create_model: 'bert-base-cased' has no recipe"),
    ("tsn_demo", {"overrides": ["model.num_clases=3"]}, "num_clases"),
])
def test_bad_names_and_arguments_are_one_line(name, kwargs, message):
    with pytest.raises(ConfigError) as e:
        api_models.create_model(name, cpu=False, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


SETTINGS = """
import json, os, paddle, ops
from engine import cpu
state = lambda: {"fast_ops": ops.current_precision().fast_ops, "ftz": bool(cpu.mxcsr() & cpu.FTZ),
    "stride": paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"],
    "mkl": os.environ.get("MKL_DEBUG_CPU_TYPE")}
print("PLAIN", json.dumps(state()))
{make}
print("AFTER", json.dumps(state()))
"""


@pytest.mark.parametrize("make", ["from api.models import create_model; create_model('tsn_demo')",
                                  "from api.models import setup_cpu; setup_cpu()",
                                  "from engine.registry import MODELS; from engine.components import load_all; "
                                  "load_all(); MODELS.build({'name': 'NeXtVLAD', 'num_classes': 5})"])
def test_the_trainers_cpu_settings_come_with_create_model_or_one_call(make):
    """A fresh process as a user's script starts (no tools, none of our environment): paddle's defaults
    until create_model or setup_cpu (our fused operators on, flushed denormals, no stride kernels, MKL's
    AVX2 path on AMD); a model built through the registry alone leaves them as paddle has them."""
    out = _python(SETTINGS.replace("{make}", make))
    before, after = (json.loads(ln.split(" ", 1)[1]) for ln in out.splitlines() if ln.startswith(("PLAIN", "AFTER")))
    assert before["fast_ops"] is False and before["ftz"] is False and before["stride"] is True, before
    if "MODELS.build" in make:
        assert after == before, after
        return
    amd = open("/proc/cpuinfo").read().count("AuthenticAMD") > 0
    assert after["fast_ops"] is True and after["ftz"] is True and after["stride"] is False, after
    assert after["mkl"] == ("5" if amd else None), after


def test_the_own_loop_example_trains_on_our_kernels():
    """docs/getting-started.md's loop, verbatim, in a fresh process: its loss falls on the one batch it
    fits (1.51 -> 0.09 in 8 steps on amd-zen4; asked here: below half the first), and the fused
    operators ran it."""
    blocks = [b for b in doc_blocks(DOC, "python") if "create_model" in b]
    assert len(blocks) == 1
    probe = ("\nfrom ops import library\nimport ops\nprint('FUSED', ops.current_precision().fast_ops, library.state['loaded'])\n")
    out = _python(blocks[0] + probe)
    losses = [float(ln.rsplit(" ", 1)[1]) for ln in out.splitlines() if ln.startswith("step ")]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0], out
    assert "FUSED True True" in out, out


def test_registry_built_models_are_the_same_network():
    """create_model builds what the registry builds from the recipe's model section: the same
    parameters, by name and shape."""
    from engine import config
    from engine.components import load_all
    load_all()
    cfg = config.load(api_models.recipes()["stnet_demo"])
    ours, registry = api_models.create_model("stnet_demo", cpu=False), MODELS.build(cfg["model"])
    assert {k: list(v.shape) for k, v in ours.state_dict().items()} == \
        {k: list(v.shape) for k, v in registry.state_dict().items()}
