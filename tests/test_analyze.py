"""tools/analyze.py and benchmarks/flops.py: parameters and multiply-adds (MACs; FLOPs = 2 x MACs) of a
recipe's model at its input shape, by module (docs/tools.md, "analyze").

The expected MACs below are worked out by hand from the layers' sizes, not from the code under test;
the full-size figures are the published ones (ResNet-50) or the parameter counts tests/test_bert_model.py
holds (BERT-base, from PaddleNLP's tables).
"""
import glob
import json
import os

import paddle
import paddle.nn as nn
import pytest

import ops
from benchmarks import flops
from engine import builder
from engine.components import load_all
from engine.errors import ConfigError
from ops import library
from tests.helpers import ROOT, one_error_line, tools_in_one_process
from tests.test_model_zoo_page import _tool as download_tool

DEMOS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"),
                                                            recursive=True))
TSN_DEMO = "configs/video/tsn/tsn_demo.yaml"


class _Small(nn.Layer):
    """One conv through ops.conv2d (the way the models call it), one Linear called as a layer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(3, 8, 3, padding=1)
        self.fc = nn.Linear(16, 4)

    def forward(self, batch):
        ops.conv2d(batch["image"], self.conv)
        return self.fc(batch["features"])


def _macs(layer, *inputs, run=None):
    total, counter = flops.count_macs(layer, inputs[0] if len(inputs) == 1 else inputs, run=run)
    return total, counter


def test_hand_counts_of_small_layers():
    paddle.seed(0)
    # Conv2D 3 -> 8, 3x3, padding 1, on 1 x 3 x 10 x 10: the output is 8 x 10 x 10 = 800 values, each the
    # sum of 3 x 3 x 3 = 27 products: 800 x 27 = 21,600 = 8*3*3*3*10*10
    # Linear 16 -> 4 on a batch of 5: 5 rows x 4 outputs x 16 products = 320 = 5*16*4
    model = _Small()
    total, c = _macs(model, {"image": paddle.randn([1, 3, 10, 10]), "features": paddle.randn([5, 16])})
    assert 8 * 3 * 3 * 3 * 10 * 10 == 21_600 and 5 * 16 * 4 == 320
    assert dict(c.by_module) == {"conv": 21_600, "fc": 320} and total == 21_920
    assert dict(c.by_op) == {"conv": 21_600, "linear": 320}

    # a plain layer call (paddle's own forward): grouped, strided Conv2D 8 -> 8, groups 4, 3x3, stride 2,
    # padding 1 on 1 x 8 x 10 x 10: output 8 x 5 x 5 = 200 values, each over 8/4 = 2 channels x 9 = 18
    # products: 3,600
    conv = nn.Conv2D(8, 8, 3, stride=2, padding=1, groups=4)
    assert _macs(conv, paddle.randn([1, 8, 10, 10]))[0] == 200 * 18 == 3_600
    # Conv2DTranspose 4 -> 2, kernel 2, stride 2 on 1 x 4 x 3 x 3: each of the 36 input values is multiplied
    # into 2 x 2 x 2 = 8 outputs: 288 (as: 2 x 6 x 6 = 72 outputs, each 4 products)
    deconv = nn.Conv2DTranspose(4, 2, 2, stride=2)
    assert _macs(deconv, paddle.randn([1, 4, 3, 3]))[0] == 72 * 4 == 288
    # through ops.conv_transpose, as Mask R-CNN's mask head calls it: the same count
    assert _macs(deconv, paddle.randn([1, 4, 3, 3]), run=lambda m, x: ops.conv_transpose(x, m))[0] == 288
    # bidirectional LSTM 6 -> 5 on 2 sequences of 7 steps: per step and direction 4 gates x 5 units x
    # (6 inputs + 5 hidden) = 220 products; x 2 directions x 2 sequences x 7 steps = 6,160
    lstm = nn.LSTM(6, 5, direction="bidirect")
    x = paddle.randn([2, 7, 6])
    assert _macs(lstm, x)[0] == 4 * 5 * 11 * 2 * 2 * 7 == 6_160
    assert _macs(lstm, x, run=lambda m, x: ops.lstm(x, m))[0] == 6_160
    # batched matmul [2, 3, 4, 5] @ [2, 3, 5, 6]: 2 x 3 products of 4x5 by 5x6, 4 x 6 x 5 = 120 each: 720
    a, b = paddle.randn([2, 3, 4, 5]), paddle.randn([2, 3, 5, 6])
    assert _macs(nn.Layer(), None, run=lambda m, _: paddle.matmul(a, b))[0] == 720
    assert _macs(nn.Layer(), None, run=lambda m, _: ops.matmul(a, b.transpose([0, 1, 3, 2]), transpose_y=True))[0] == 720
    # attention over q [1, 2 heads, 4, 8], k and v [1, 2, 6, 8]: q k^T is 2 x 4 x 6 dot products of 8, p v the
    # same count again: 2 x (2 x 4 x 6 x 8) = 768
    q, k = paddle.randn([1, 2, 4, 8]), paddle.randn([1, 2, 6, 8])
    total, c = _macs(nn.Layer(), None, run=lambda m, _: ops.attention(q, k, k, paddle.zeros([1, 1, 1, 6])))
    assert total == 2 * (2 * 4 * 6 * 8) == 768 and dict(c.by_op) == {"attention": 768}
    # ops.linear on three layers sharing their input (q, k, v): one GEMM of the joined weights, each
    # layer's share under its own name, and the reference path's paddle.matmul inside is not counted again
    holder = nn.Layer()
    holder.q, holder.k, holder.v = nn.Linear(16, 4), nn.Linear(16, 4), nn.Linear(16, 8)
    total, c = _macs(holder, None, run=lambda m, _: ops.linear(paddle.randn([5, 16]), [m.q, m.k, m.v]))
    assert dict(c.by_module) == {"q": 320, "k": 320, "v": 640} and total == 5 * 16 * 16


def test_the_counting_pass_restores_what_it_wrapped():
    originals = (paddle.matmul, ops.linear, ops.functional.conv2d, nn.functional.conv2d,
                 paddle.nn.layer.rnn.RNNBase.forward)
    layer = nn.Linear(3, 2)
    with pytest.raises(ZeroDivisionError):
        flops.count_macs(layer, paddle.randn([1, 3]), run=lambda m, x: [m(x), 1 / 0])
    assert (paddle.matmul, ops.linear, ops.functional.conv2d, nn.functional.conv2d,
            paddle.nn.layer.rnn.RNNBase.forward) == originals
    assert layer.training   # its mode is given back too
    assert not layer._forward_pre_hooks and not layer._forward_post_hooks


def test_resnet50_at_224_gives_the_published_figures():
    """torchvision's ResNet-50 (v1.5, the stride in the 3x3 conv, our variant "b"): 4.09 GMACs (its weights
    table says "GFLOPS 4.09": multiply-adds) and 25,557,032 parameters (timm/torchvision); the head is
    global pooling + fc 2048 -> 1000."""
    load_all()
    paddle.seed(0)
    model = builder.build_model({"name": "ResNet", "depth": 50, "num_classes": 1000})
    total, c = flops.count_macs(model, paddle.randn([1, 3, 224, 224]))
    assert builder.count_params(model) == 25_557_032
    assert abs(total - 4.09e9) / 4.09e9 < 0.002, total
    assert c.by_module["fc"] == 2048 * 1000 and c.by_op["conv"] == total - 2048 * 1000

    # TSN-R50's recipe with one segment: that backbone (without its ImageNet fc) + fc 2048 -> 400
    tsn = flops.analyze("configs/video/tsn/tsn_r50_100e_k400.yaml", shape={"segments": 1}, depth=1)
    assert tsn["input"]["shapes"] == {"imgs": [1, 1, 1, 3, 224, 224]}
    assert tsn["macs"] == total - 2048 * 1000 + 2048 * 400
    assert {r["name"]: r["macs"] for r in tsn["modules"]} == {"": tsn["macs"], "backbone": total - 2048 * 1000,
                                                              "fc": 2048 * 400}
    assert tsn["params"]["trainable"] == tsn["params"]["trainable_lazy"] == 24_327_632   # R50 trunk + fc 2048x400+400
    assert 25_557_032 - (2048 * 1000 + 1000) + (2048 * 400 + 400) == 24_327_632


def test_bert_base_parameters_and_its_hand_count():
    # tests/test_bert_model.py: 110,106,428 (pretraining), 109,483,778 (sequence classification, 2 classes)
    pre = flops.analyze("configs/nlp/bert/bert_base_1000k_pretrain.yaml", macs=False)
    assert pre["params"]["trainable"] == pre["params"]["trainable_lazy"] == 110_106_428
    assert "macs" not in pre and pre["modules"][0] == {"name": "", "type": "BertForPretraining", "params": 110_106_428,
                                                       "macs": 0}
    # BERT-base on 128 tokens, per layer: q, k, v, out 4 x 768 x 768 and the FFN 2 x 768 x 3072 per token,
    # 128 tokens: 128 x 7,077,888 = 905,969,664; attention 2 x 12 heads x 128 x 128 x 64 = 25,165,824;
    # x 12 layers = 11,173,625,856; + pooler 768 x 768 + classifier 768 x 2 (one [CLS] row each)
    glue = flops.analyze("configs/nlp/bert/bert_base_3e_glue_sst2.yaml", depth=1)
    assert glue["params"]["trainable"] == 109_483_778
    per_layer = 128 * (4 * 768 * 768 + 2 * 768 * 3072) + 2 * 12 * 128 * 128 * 64
    assert glue["macs"] == 12 * per_layer + 768 * 768 + 768 * 2 == 11_174_217_216
    assert glue["macs_by_op"]["attention"] == 12 * 2 * 12 * 128 * 128 * 64


def test_the_demo_counts_by_hand():
    # BERT GLUE demo: 2 layers of width 64 (FFN 256, 2 heads) on 48 tokens
    bert = flops.analyze("configs/nlp/bert/bert_glue_demo.yaml")
    assert bert["macs"] == 2 * (48 * (4 * 64 * 64 + 2 * 64 * 256) + 2 * 48 * 48 * 64) + 64 * 64 + 64 * 2
    # AttentionLSTM demo, 300 frames: per feature (rgb 1024, audio 128) an fc to 64, then a bidirectional
    # LSTM of 64 (4 x 64 x (64 + 64) a step and direction), attention fc 128 -> 1, then fc 256 -> 128 -> 64 -> 8
    lstm = flops.analyze("configs/video/attention_lstm/attention_lstm_demo.yaml")
    per_feature = lambda d: 300 * (d * 64 + 2 * 4 * 64 * 128 + 128)   # noqa: E731
    assert lstm["macs"] == per_feature(1024) + per_feature(128) + 256 * 128 + 128 * 64 + 64 * 8
    assert lstm["macs_by_op"]["rnn"] == 2 * 300 * 2 * 4 * 64 * 128


def _committed():
    with open(flops.JSON, encoding="utf-8") as f:
        return json.load(f)


def test_the_committed_json_is_what_the_tool_counts_for_the_demos():
    """configs/macs.json (`tools/analyze.py --all --json ...`, read by the model-zoo table) holds
    every recipe, and the demos' records are what the analysis gives now (regenerate it when they differ)."""
    records = _committed()["recipes"]
    assert sorted(records) == sorted(flops._rel(p) for p in flops.recipes())
    for path in DEMOS:
        assert records[path] == flops.table_entry(flops.analyze(path, depth=0)), path


def test_fused_and_reference_operators_count_the_same():
    if not os.path.isfile(library.library_path()):
        pytest.skip("the fused operators are not built here (make ops); the reference path is counted above")
    for path in (TSN_DEMO, "configs/nlp/transformer/transformer_demo.yaml",
                 "configs/video/attention_lstm/attention_lstm_demo.yaml"):
        reference = flops.analyze(path, depth=4)
        with ops.precision(fast_ops=True):
            fused = flops.analyze(path, depth=4)
        assert library.state["loaded"]
        assert (fused["macs"], fused["modules"]) == (reference["macs"], reference["modules"]), path


def test_the_model_zoo_table_shows_the_committed_macs():
    tool = download_tool()
    assert os.path.samefile(tool.FLOPS_JSON, flops.JSON)
    load_all()
    table = tool.markdown_table("../").splitlines()
    assert "| Parameters | MACs (input) |" in table[0]
    tsn = next(line for line in table if "<code>tsn_<wbr>r50_<wbr>k400_<wbr>3seg</code>" in line)
    assert "| 24.33 M | 12.26 G (3 seg x 224x224) |" in tsn
    resnet = next(line for line in table if "<code>resnet50_<wbr>imagenet_<wbr>paddlevideo</code>" in line)
    assert "| 23.51 M | - |" in resnet   # a backbone entry without a recipe


def test_the_command_line(tmp_path):
    out = str(tmp_path / "tsn_demo.json")
    runs = tools_in_one_process([
        ("analyze", ["-c", TSN_DEMO, "--depth", "1", "--json", out], {}),
        ("analyze", ["-c", "configs/video/tsn/no_such_recipe.yaml"], {}),
        ("analyze", ["-c", TSN_DEMO, "--input-shape", "segments=three"], {}),
        ("analyze", ["-c", TSN_DEMO, "--input-shape", "segmnts=8"], {}),
        ("analyze", ["-c", TSN_DEMO, "--input-shape", "batch=2,size=64", "--params-only"], {}),
    ])
    ok = runs[0]
    assert ok["code"] == 0, ok["stderr"][-2000:]
    text = ok["stdout"]
    assert "MACs: 389,639,680 (389.64 M) multiply-adds" in text and "FLOPs = 2 x MACs = 779.28 M" in text
    assert "not counted: element-wise operations" in text and "softmax" in text
    assert "segments 3 (reader.val.num_seg); height 56 (reader.val CenterCrop size)" in text
    rows = text.split("\n\n", 1)[1].splitlines()
    assert rows[0].split() == ["module", "type", "params", "MACs", "share"]
    assert [r.split()[0] for r in rows[1:]] == ["TSN", "backbone", "fc", f"{out}:"]   # then the JSON's line
    assert rows[1].split()[-1] == "100.0%"
    with open(out, encoding="utf-8") as f:
        record = json.load(f)
    assert record["macs"] == 389_639_680 and record["flops"] == 2 * record["macs"]
    assert record["params"]["trainable"] == 11_183_301 and record["config"] == TSN_DEMO

    assert "no such recipe file" in one_error_line(runs[1])
    assert "'segments=three' is not NAME=N" in one_error_line(runs[2])
    assert "did you mean 'segments'?" in one_error_line(runs[3])
    assert runs[4]["code"] == 0 and "MACs" not in runs[4]["stdout"].split("\n\n")[0]
    assert "parameters: 11,183,301 trainable" in runs[4]["stdout"]


def test_input_shape_words_parse():
    assert flops.parse_shape(["batch=2", "segments=8,size=256"]) == {"batch": 2, "segments": 8, "height": 256,
                                                                      "width": 256}
    for bad in ("8", "batch=", "=3", "batch=0", "batch=2.5"):
        with pytest.raises(ConfigError, match="is not NAME=N"):
            flops.parse_shape([bad])
    assert dict(flops.subtree({"a.b.c": 2, "a.d": 3, "": 1}, 1)) == {"": 6, "a": 5}
