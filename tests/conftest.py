import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from engine.cpu import mkl_environment  # noqa: E402  (before paddle is imported)

mkl_environment()
os.environ.setdefault("GLOG_minloglevel", "2")

import pytest  # noqa: E402

from tests.helpers import ROOT as _ROOT, tool  # noqa: E402

ATTENTION_LSTM_DEMO = "configs/video/attention_lstm/attention_lstm_demo.yaml"


@pytest.fixture(scope="session")
def yt8m_demo():
    """The generated YouTube-8M demo data (written once; later calls are no-ops)."""
    from data import demo_youtube8m
    return demo_youtube8m.make(os.path.join(_ROOT, "data", "youtube8m_demo"))


@pytest.fixture(scope="session")
def attention_lstm_run(yt8m_demo, tmp_path_factory):
    """The AttentionLSTM demo recipe trained once, uninterrupted; eval, infer and resume tests reuse it."""
    out = tmp_path_factory.mktemp("attention_lstm_demo")
    tool("train", "-c", ATTENTION_LSTM_DEMO, "--output", out)
    return out


TSN_DEMO = "configs/video/tsn/tsn_demo.yaml"
STNET_DEMO = "configs/video/stnet/stnet_demo.yaml"


@pytest.fixture(scope="session")
def kinetics_demo():
    """The generated Kinetics-format demo videos, {'appearance': folder, 'motion': folder}
    (written once, where `python data/make_demo.py kinetics` writes them)."""
    from data import demo_kinetics
    return demo_kinetics.make(os.path.join(_ROOT, "data", "kinetics_demo"))


@pytest.fixture(scope="session")
def tsn_demo_run(kinetics_demo, tmp_path_factory):
    """The TSN demo recipe trained once; the eval and infer tests reuse its weights."""
    out = tmp_path_factory.mktemp("tsn_demo")
    tool("train", "-c", TSN_DEMO, "--output", out)
    return out


DEEPLAB_DEMO = "configs/vision/deeplabv3/deeplabv3_demo.yaml"


@pytest.fixture(scope="session")
def voc_demo():
    """The generated VOC-format segmentation demo (written once, where `python data/make_demo.py
    segmentation` writes it); returns its VOCdevkit folder."""
    from data import demo_segmentation
    return demo_segmentation.make(os.path.join(_ROOT, "data", "voc_demo"))


@pytest.fixture(scope="session")
def deeplab_demo_run(voc_demo, tmp_path_factory):
    """The DeepLabV3 demo recipe trained once; the eval and infer tests reuse its weights."""
    out = tmp_path_factory.mktemp("deeplab_demo")
    tool("train", "-c", DEEPLAB_DEMO, "--output", out)
    return out
