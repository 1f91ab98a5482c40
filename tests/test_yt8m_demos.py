"""The NeXtVLAD and Attention Cluster demo recipes really learn on the generated YouTube-8M data."""
import pytest

from engine import builder, config
from engine.components import load_all
from tests.helpers import read_metrics


@pytest.mark.parametrize("run", ["nextvlad_demo_run", "attention_cluster_demo_run"])
def test_demo_reaches_gap(run, request):
    m = read_metrics(request.getfixturevalue(run))
    assert m["gap"] >= 0.6 and m["hit_at_1"] >= 0.6, m
    assert m["num_samples"] == 200


def test_attention_cluster_random_eval_is_an_option(yt8m_demo, tmp_path):
    """Centre sampling (default) is deterministic; the original random sampling differs per epoch."""
    load_all()
    cfg = config.load("configs/video/attention_cluster/attention_cluster_demo.yaml",
                      ["reader.val.transforms.0.mode=random"])
    ds = builder.build_dataset(cfg, "val")
    a = ds[3]["rgb"]
    ds.set_epoch(1)
    assert (ds[3]["rgb"] != a).any()
    cfg = config.load("configs/video/attention_cluster/attention_cluster_demo.yaml")
    ds = builder.build_dataset(cfg, "val")
    a = ds[3]["rgb"]
    ds.set_epoch(1)
    assert (ds[3]["rgb"] == a).all() and a.shape == (32, 1024)
