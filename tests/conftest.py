import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from engine.cpu import cpu_info, flush_denormals, has_bf16, mkl_environment  # noqa: E402  (before paddle is imported)

USER_MKL_DEBUG_CPU_TYPE = os.environ.get("MKL_DEBUG_CPU_TYPE")  # before our default: the user's own choice
mkl_environment()
os.environ.setdefault("GLOG_minloglevel", "2")
# In-process tests compute as the tools do (runtime.flush_denormals defaults to true): FTZ + DAZ on
# this thread, inherited by the threads started later. ZOO_TEST_FLUSH_DENORMALS=0 runs them without
# it (e.g. the golden tests both ways); tests/test_denormals.py sets and restores it itself.
flush_denormals(os.environ.get("ZOO_TEST_FLUSH_DENORMALS", "1") != "0")

import pytest  # noqa: E402

from data import (demo_bert, demo_coco, demo_kinetics, demo_segmentation, demo_translation,  # noqa: E402
                  demo_youtube8m)
from readers.tfrecord import iter_records, write_records  # noqa: E402
from tests.helpers import ROOT as _ROOT, OpPath, counting_fused_ops, launch, read_metrics, tool  # noqa: E402

ATTENTION_LSTM_DEMO = "configs/video/attention_lstm/attention_lstm_demo.yaml"

# What computes in bf16 needs a CPU with native bf16 (AVX512_BF16 or AMX-BF16): our AMD Zen 4 and Intel
# Xeon kinds. On an older CPU (e.g. AMD Zen 3: AVX2, no AVX-512) oneDNN has no bf16 kernels at all, so
# those tests cannot run there; what such a CPU does instead (one log line and fp32) is tested on it.
NATIVE_BF16 = has_bf16()
needs_native_bf16 = pytest.mark.skipif(
    not NATIVE_BF16, reason=f"this CPU ({cpu_info()['model']}, family {cpu_info()['family']} model "
                            f"{cpu_info()['model_id']}) has no native bf16 (AVX512_BF16 or AMX-BF16) for oneDNN")

# The operator paths that compute with oneDNN's kernels: a test taking one is ISA-sensitive (`isa`).
KERNEL_FIXTURES = {"op_path", "op_path_conv", "op_path_fp32"}


def pytest_collection_modifyitems(items):
    """Marks `isa` every test that runs the operator paths (KERNEL_FIXTURES); the other ISA-sensitive
    tests carry the mark in their files (docs/contributing.md lists both)."""
    for item in items:
        if KERNEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.isa)


@pytest.fixture(scope="session")
def yt8m_demo():
    """The generated YouTube-8M demo data (written once; later calls are no-ops)."""
    return demo_youtube8m.make(os.path.join(_ROOT, "data", "youtube8m_demo"))


@pytest.fixture(scope="session")
def attention_lstm_run(yt8m_demo, tmp_path_factory):
    """The AttentionLSTM demo recipe trained once, uninterrupted; eval, infer and resume tests reuse it."""
    out = tmp_path_factory.mktemp("attention_lstm_demo")
    tool("train", "-c", ATTENTION_LSTM_DEMO, "--output", out)
    return out


# The data-parallel recipe the distributed tests share (test_distributed.py, test_multinode.py): the
# AttentionLSTM demo without dropout, 2 epochs of 25 optimizer steps at the global batch 32, the loss
# logged at every step, a checkpoint every 10 steps, written on every node; with the moving average of
# the weights (train.ema), which every rank keeps alike.
DP_RECIPE = ["-c", ATTENTION_LSTM_DEMO, "-o", "model.drop_rate=0", "-o", "train.epochs=2", "-o", "train.log_interval=1",
             "-o", "runtime.num_threads=1", "-o", "train.save_steps=10", "-o", "train.save_on_each_node=true",
             "-o", "train.ema.enable=true", "-o", "train.ema.decay=0.99"]
HALF_BATCH = ["-o", "reader.train.batch_size=16"]   # per card: 2 ranks x 16 = the demo's batch of 32


@pytest.fixture(scope="session")
def one_process_run(yt8m_demo, tmp_path_factory):
    """DP_RECIPE on 1 process at batch 32."""
    out = tmp_path_factory.mktemp("dp_one_process")
    tool("train", *DP_RECIPE, "--output", out)
    return out


@pytest.fixture(scope="session")
def two_process_run(yt8m_demo, tmp_path_factory):
    """DP_RECIPE on 2 processes of one host (loopback) at 16 per card."""
    root = tmp_path_factory.mktemp("dp_two_processes")
    launch(2, "train", *DP_RECIPE, *HALF_BATCH, "--output", root / "out", log_dir=root / "log")
    return root / "out"


@pytest.fixture(scope="session")
def odd_eval(attention_lstm_run, yt8m_demo, tmp_path_factory):
    """(eval arguments over a 99-video val set, 1 process's metrics): an odd number of samples, so that
    a distributed sampler repeats one to even out 2 ranks."""
    root = tmp_path_factory.mktemp("odd_eval")
    records = [r for _, r in zip(range(99), iter_records(os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")))]
    write_records(str(root / "odd.tfrecord"), records)
    args = ["-c", ATTENTION_LSTM_DEMO, "-o", f"reader.val.files=[{root / 'odd.tfrecord'}]", "-o",
            "reader.val.batch_size=16", "--weights", os.path.join(attention_lstm_run, "final")]
    tool("eval", *args, "--output", root / "one")
    return args, read_metrics(root / "one")


NEXTVLAD_DEMO = "configs/video/nextvlad/nextvlad_demo.yaml"
ATTENTION_CLUSTER_DEMO = "configs/video/attention_cluster/attention_cluster_demo.yaml"


def _trained(tmp_path_factory, name, config):
    out = tmp_path_factory.mktemp(name)
    tool("train", "-c", config, "--output", out)
    return out


@pytest.fixture(scope="session")
def nextvlad_demo_run(yt8m_demo, tmp_path_factory):
    """The NeXtVLAD demo recipe trained once (its GAP test and INT8 quantization read it)."""
    return _trained(tmp_path_factory, "nextvlad_demo", NEXTVLAD_DEMO)


@pytest.fixture(scope="session")
def attention_cluster_demo_run(yt8m_demo, tmp_path_factory):
    """The Attention Cluster demo recipe trained once (its GAP test and INT8 quantization read it)."""
    return _trained(tmp_path_factory, "attention_cluster_demo", ATTENTION_CLUSTER_DEMO)


TSN_DEMO = "configs/video/tsn/tsn_demo.yaml"
STNET_DEMO = "configs/video/stnet/stnet_demo.yaml"


@pytest.fixture(scope="session")
def kinetics_demo():
    """The generated Kinetics-format demo videos, {'appearance': folder, 'motion': folder}
    (written once, where `python data/make_demo.py kinetics` writes them)."""
    return demo_kinetics.make(os.path.join(_ROOT, "data", "kinetics_demo"))


@pytest.fixture(scope="session")
def tsn_demo_run(kinetics_demo, tmp_path_factory):
    """The TSN demo recipe trained once; the eval and infer tests reuse its weights."""
    out = tmp_path_factory.mktemp("tsn_demo")
    tool("train", "-c", TSN_DEMO, "--output", out)
    return out


@pytest.fixture(scope="session")
def stnet_demo_run(kinetics_demo, tmp_path_factory):
    """The StNet demo recipe trained once on the motion demo (its test and INT8 quantization read it)."""
    return _trained(tmp_path_factory, "stnet_demo", STNET_DEMO)


TRANSFORMER_DEMO = "configs/nlp/transformer/transformer_demo.yaml"


@pytest.fixture(scope="session")
def translation_demo():
    """The generated translation demo corpus and its sentencepiece model (written once)."""
    return demo_translation.make(os.path.join(_ROOT, "data", "translation_demo"))


@pytest.fixture(scope="session")
def transformer_demo_run(translation_demo, tmp_path_factory):
    """The Transformer demo recipe trained once on the generated corpus; the BLEU, decoding, infer and
    checkpoint-averaging tests reuse it."""
    out = tmp_path_factory.mktemp("transformer_demo")
    tool("train", "-c", TRANSFORMER_DEMO, "--output", out)
    return out


BERT_PRETRAIN_DEMO = "configs/nlp/bert/bert_pretrain_demo.yaml"
BERT_GLUE_DEMO = "configs/nlp/bert/bert_glue_demo.yaml"


@pytest.fixture(scope="session")
def bert_demo():
    """The generated BERT demo data (grammar corpus, pair task, vocab), written once."""
    return demo_bert.make(os.path.join(_ROOT, "data", "bert_demo"))


@pytest.fixture(scope="session")
def bert_pretrain_run(bert_demo, tmp_path_factory):
    """The BERT pretraining demo trained once; the fine-tuning tests start from its final/."""
    out = tmp_path_factory.mktemp("bert_pretrain_demo")
    tool("train", "-c", BERT_PRETRAIN_DEMO, "--output", out)
    return out


@pytest.fixture(scope="session")
def bert_glue_run(bert_pretrain_run, tmp_path_factory):
    """The GLUE demo fine-tuned once from the pretraining demo's final/ (as BERT is used)."""
    out = tmp_path_factory.mktemp("bert_glue_demo")
    tool("train", "-c", BERT_GLUE_DEMO, "--output", out,
         "-o", f"train.pretrained={bert_pretrain_run / 'final'}")   # the folder, as the README says
    return out


@pytest.fixture(scope="session")
def bert_glue_scratch_run(bert_demo, tmp_path_factory):
    """The GLUE demo recipe as is (from scratch): what fine-tuning from pretraining is compared with."""
    out = tmp_path_factory.mktemp("bert_glue_demo_scratch")
    tool("train", "-c", BERT_GLUE_DEMO, "--output", out)
    return out


MASK_RCNN_DEMO = "configs/vision/mask_rcnn/mask_rcnn_demo.yaml"


@pytest.fixture(scope="session")
def coco_demo():
    """The generated COCO-format demo (written once, where `python data/make_demo.py coco` writes it)."""
    return demo_coco.make(os.path.join(_ROOT, "data"))


@pytest.fixture(scope="session")
def mask_rcnn_demo_run(coco_demo, tmp_path_factory):
    """The Mask R-CNN demo recipe trained once; the eval and infer tests reuse its weights."""
    out = tmp_path_factory.mktemp("mask_rcnn_demo")
    tool("train", "-c", MASK_RCNN_DEMO, "--output", out, timeout=1800)
    return out


DEEPLAB_DEMO = "configs/vision/deeplabv3/deeplabv3_demo.yaml"


@pytest.fixture(scope="session")
def voc_demo():
    """The generated VOC-format segmentation demo (written once, where `python data/make_demo.py
    segmentation` writes it); returns its VOCdevkit folder."""
    return demo_segmentation.make(os.path.join(_ROOT, "data", "voc_demo"))


@pytest.fixture(scope="session")
def deeplab_demo_run(voc_demo, tmp_path_factory):
    """The DeepLabV3 demo recipe trained once; the eval and infer tests reuse its weights."""
    out = tmp_path_factory.mktemp("deeplab_demo")
    tool("train", "-c", DEEPLAB_DEMO, "--output", out)
    return out


def _op_path(path):
    # import cost: ops loads paddle (~2.5 s); every test session imports this module, not all need paddle
    import ops
    from ops import functional, library
    fused, bf16, bf16_act = path != "reference", path == "bf16", path == "bf16act"
    if fused:
        library.set_threads(2)
        assert library.load(), library.state["error"]
    if bf16:
        if not NATIVE_BF16:
            pytest.skip(needs_native_bf16.kwargs["reason"])
        assert ops.bf16_supported(), "the CPU has native bf16, but oneDNN does not use it (ONEDNN_MAX_CPU_ISA?)"
    # a whole value: what ran before the test (a tool's setup in this process) leaves nothing in it
    with ops.precision(ops.Precision(fast_ops=fused, bf16=bf16, bf16_act=bf16_act)), counting_fused_ops() as ran:
        yield OpPath(fused, ran, bf16, bf16_act)


@pytest.fixture(params=["reference", "fused", "bf16"])
def op_path(request):
    """Run a golden test on each operator path: pure Paddle; our fused C++ operators (what train, eval
    and infer run by default, `runtime.fast_ops`); and those under bf16 autocast (train.amp.dtype
    bfloat16: matmul and convolution in bf16; tests/helpers.golden_close's bf16 tolerance). Yields an
    OpPath recording the fused operators that ran, so the test can show the path was really taken."""
    yield from _op_path(request.param)


@pytest.fixture(params=["reference", "fused", "bf16", "bf16act"])
def op_path_conv(request):
    """op_path for the ResNet family, with a fourth path: bf16 activations (ops.Precision.bf16_act, issue
    43: convolutions write bf16, BN and pooling read and write it, the trunk's outputs fp32), at
    golden_close's bf16 tolerance. It runs on every CPU: without native bf16 the convolutions compute in
    fp32 on the bf16-rounded operands, the products a bf16 CPU computes (only the summation order
    differs)."""
    yield from _op_path(request.param)


@pytest.fixture(params=["reference", "fused"])
def op_path_fp32(request):
    """op_path without bf16, for a test whose outputs are all token ids or top-k choices (which bf16's
    rounding may change: issue 22 holds floats to its tolerance, not those)."""
    yield from _op_path(request.param)


def _exported(tmp_path_factory, name, config, run, fmt="paddle"):
    """tools/export.py of a trained demo's final weights (paddle: for Paddle Inference; onnx: for ONNX
    Runtime and OpenVINO)."""
    out = tmp_path_factory.mktemp(name) / "export"
    tool("export", "-c", config, "--weights", run / "final" / "model.pdparams", "--format", fmt, "--output", out)
    return out


@pytest.fixture(scope="session")
def tsn_demo_export(tsn_demo_run, tmp_path_factory):
    """The trained TSN demo exported once (the server's and the page's tests serve it)."""
    return _exported(tmp_path_factory, "tsn_demo_export", TSN_DEMO, tsn_demo_run)


@pytest.fixture(scope="session")
def tsn_demo_onnx_export(tsn_demo_run, tmp_path_factory):
    """The trained TSN demo exported once as ONNX (served on ONNX Runtime and on OpenVINO)."""
    return _exported(tmp_path_factory, "tsn_demo_onnx_export", TSN_DEMO, tsn_demo_run, fmt="onnx")


@pytest.fixture(scope="session")
def deeplab_demo_export(deeplab_demo_run, tmp_path_factory):
    """The trained DeepLabV3 demo exported once."""
    return _exported(tmp_path_factory, "deeplab_demo_export", DEEPLAB_DEMO, deeplab_demo_run)


@pytest.fixture(scope="session")
def bert_glue_export(bert_glue_run, tmp_path_factory):
    """The fine-tuned GLUE demo exported once."""
    return _exported(tmp_path_factory, "bert_glue_export", BERT_GLUE_DEMO, bert_glue_run)


@pytest.fixture(scope="session")
def mask_rcnn_demo_export(mask_rcnn_demo_run, tmp_path_factory):
    """The trained Mask R-CNN demo exported once (its programs and the Python between them)."""
    return _exported(tmp_path_factory, "mask_rcnn_demo_export", MASK_RCNN_DEMO, mask_rcnn_demo_run)


@pytest.fixture(scope="session")
def transformer_demo_export(transformer_demo_run, tmp_path_factory):
    """The trained Transformer demo exported once (its encoder and decoder step)."""
    return _exported(tmp_path_factory, "transformer_demo_export", TRANSFORMER_DEMO, transformer_demo_run)
