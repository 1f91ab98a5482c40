"""Metrics: hand-computed YouTube-8M GAP/Hit@1/PERR and top-k/mean class accuracy, duplicates by
index, and a 2-process evaluation that must equal the 1-process numbers exactly."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.registry import METRICS
from engine.training.samplers import EpochBatchSampler
from metrics.base import IndexedMetric, top_k
from metrics.classification import Classification
from metrics.youtube8m import YouTube8M, gap, global_average_precision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# three videos, four classes
PROBS = np.array([[0.9, 0.8, 0.1, 0.0],     # A: label 0
                  [0.2, 0.7, 0.6, 0.3],     # B: labels 2, 3
                  [0.5, 0.4, 0.35, 0.05]],  # C: label 3
                 np.float32)
LABELS = np.array([[1, 0, 0, 0],
                   [0, 0, 1, 1],
                   [0, 0, 0, 1]], np.float32)


def feed(metric, probs, labels, index):
    metric.update({"probs": np.asarray(probs, np.float32)},
                  {"labels": np.asarray(labels, np.float32), "index": np.asarray(index, np.int64)})


def test_global_gap_differs_from_per_batch_average():
    # top 2 per video: A (0.9,1) (0.8,0); B (0.7,0) (0.6,1); C (0.5,0) (0.4,0); positives 1+2+1 = 4
    # pooled: 0.9+ 0.8 0.7 0.6+ 0.5 0.4 -> AP = (1/1 + 2/4) / 4 = 0.375
    m = YouTube8M(top_k=2)
    feed(m, PROBS[:1], LABELS[:1], [0])
    feed(m, PROBS[1:], LABELS[1:], [1, 2])
    out = m.accumulate()
    assert out["gap"] == pytest.approx(0.375)
    # batch {A}: (1/1) / 1 = 1;  batch {B, C}: 0.7 0.6+ 0.5 0.4, 3 positives -> (1/2) / 3 = 1/6
    per_batch = [gap(PROBS[:1], LABELS[:1], 2), gap(PROBS[1:], LABELS[1:], 2)]
    assert per_batch == pytest.approx([1.0, 1 / 6])
    assert np.mean(per_batch) == pytest.approx(7 / 12)      # what averaging batch GAPs would report
    # Hit@1: A argmax 0 is a label; B argmax 1 and C argmax 0 are not -> 1/3
    assert out["hit_at_1"] == pytest.approx(1 / 3)
    # PERR: A (1 label) top1 {0}: 1/1; B (2 labels) top2 {1, 2}: 1/2; C top1 {0}: 0 -> 1.5 / 3
    assert out["perr"] == pytest.approx(0.5)
    assert out["num_samples"] == 3


def test_ties_count_with_expected_ap_whatever_the_order():
    # X: [0.6, 0.1] label 0; Y: [0.6, 0.2] label 1 (outside Y's top 1); top_k = 1
    # pool: 0.6 (hit, X) and 0.6 (miss, Y) tie; positives 2 (Y's label counts too)
    # hit first: (1/1)/2 = 0.5, hit second: (1/2)/2 = 0.25 -> expected 0.375
    probs, labels = [[0.6, 0.1], [0.6, 0.2]], [[1, 0], [0, 1]]
    for order in ([0, 1], [1, 0]):
        m = YouTube8M(top_k=1)
        for i in order:
            feed(m, [probs[i]], [labels[i]], [i])
        assert m.accumulate()["gap"] == pytest.approx(0.375)
    # 0.9 (hit), then a 3-way tie at 0.5 holding 2 hits, 3 positives. The miss lands at rank 2, 3
    # or 4: sums of precisions 1 + 2/3 + 3/4, 1 + 1 + 3/4, 1 + 1 + 1 -> mean 49/18, / 3 = 49/54
    assert global_average_precision([0.5, 0.9, 0.5, 0.5], [1, 1, 0, 1], 3) == pytest.approx(49 / 54)


def test_tie_handling_equals_the_mean_over_shuffles():
    """The starter code shuffles, then stable-sorts: average its AP over every input order."""
    import itertools
    # a tie at the top, a 3-way tie with 2 labels, a tie with no label, an untied label
    scores = np.array([0.9, 0.5, 0.3, 0.9, 0.5, 0.5, 0.3, 0.1])
    hits = np.array([1, 1, 0, 0, 0, 1, 0, 1])
    total = []
    for perm in itertools.permutations(range(8)):
        order = sorted(perm, key=lambda i: -scores[i])           # stable, like sorted(reverse=True)
        found = np.cumsum(hits[order])
        total.append(np.sum(hits[order] * found / np.arange(1, 9)) / 6)
    assert global_average_precision(scores, hits, 6) == pytest.approx(np.mean(total), rel=1e-12)


def test_labels_outside_top_k_count_as_positives():
    # V1 [0.9, 0.8, 0.1] label 2 (outside its top 2); V2 [0.3, 0.2, 0.1] label 0
    # pool 0.9 0.8 0.3+ 0.2 with 2 positives -> (1/3) / 2 = 1/6 (1/3 if only retrieved labels counted)
    m = YouTube8M(top_k=2)
    feed(m, [[0.9, 0.8, 0.1], [0.3, 0.2, 0.1]], [[0, 0, 1], [1, 0, 0]], [0, 1])
    assert m.accumulate()["gap"] == pytest.approx(1 / 6)


def test_perr_zero_scores_no_labels_and_hit_at_1_ties():
    m = YouTube8M(top_k=3)
    feed(m, [[0.5, 0.0, 0.0],     # labels 0, 1: top 2 = {0, 1}; class 1 has score 0 -> PERR 1/2
             [0.4, 0.4, 0.2],     # label 1: tie for the max, arg-max takes class 0 -> Hit@1 0, PERR 0
             [0.3, 0.2, 0.1]],    # no label: PERR 0, Hit@1 0
         [[1, 1, 0], [0, 1, 0], [0, 0, 0]], [0, 1, 2])
    out = m.accumulate()
    assert out["perr"] == pytest.approx((0.5 + 0 + 0) / 3)
    assert out["hit_at_1"] == pytest.approx(1 / 3)            # only video 0 (arg-max 0 is a label)
    m = YouTube8M(top_k=3)
    feed(m, [[0.2, 0.6, 0.6]], [[0, 0, 1]], [0])               # tie 1 vs 2 for the max: class 1 wins
    assert m.accumulate()["hit_at_1"] == 0.0


def test_top_k_breaks_ties_by_class_id():
    cols, vals = top_k(np.array([[0.1, 0.5, 0.5, 0.9, 0.5]]), 3)
    assert cols.tolist() == [[3, 1, 2]] and vals.tolist() == [[0.9, 0.5, 0.5]]
    cols, _ = top_k(np.array([[1.0, 1.0], [0.0, 2.0]]), 5)   # k above the class count
    assert cols.tolist() == [[0, 1], [1, 0]]


def test_duplicate_indices_are_dropped():
    ref = YouTube8M(top_k=2)
    feed(ref, PROBS, LABELS, [0, 1, 2])
    padded = YouTube8M(top_k=2)       # as a sampler pads 3 samples to 4 on 2 ranks
    feed(padded, PROBS[[2, 0]], LABELS[[2, 0]], [2, 0])
    feed(padded, PROBS[[1, 2]], LABELS[[1, 2]], [1, 2])
    assert padded.accumulate() == ref.accumulate()
    padded.reset()
    assert padded.accumulate()["num_samples"] == 0


def reference_gap_perr(probs, labels, k):
    """The starter-code definitions written out plainly (valid when no scores tie)."""
    pairs, perr = [], []
    for p, lab in zip(probs, labels):
        pairs += [(p[c], lab[c] > 0) for c in np.argsort(-p)[:k]]
        n = int(lab.sum())
        top = np.argsort(-p)[:n] if n else np.arange(len(p))
        perr.append(sum(float(lab[c]) for c in top if p[c] > 0) / len(top))
    pairs.sort(key=lambda x: -x[0])
    found, ap = 0, 0.0
    for rank, (_, hit) in enumerate(pairs, 1):
        if hit:
            found += 1
            ap += found / rank
    return ap / labels.sum(), float(np.mean(perr))


def test_matches_starter_code_definition_on_random_scores():
    rng = np.random.default_rng(0)
    probs = rng.random((60, 30)).astype(np.float32)
    labels = (rng.random((60, 30)) < 0.1).astype(np.float32)
    m = YouTube8M(top_k=5)
    for start in range(0, 60, 7):
        feed(m, probs[start:start + 7], labels[start:start + 7], np.arange(start, min(start + 7, 60)))
    out = m.accumulate()
    ref_gap, ref_perr = reference_gap_perr(probs, labels, 5)
    assert out["gap"] == pytest.approx(ref_gap, rel=1e-12)
    assert out["perr"] == pytest.approx(ref_perr, rel=1e-12)
    assert out["hit_at_1"] == pytest.approx(labels[np.arange(60), probs.argmax(1)].mean())


def test_paddle_tensors_and_bfloat16_predictions():
    # AMP evaluation hands over bfloat16 tensors, whose .numpy() is raw uint16 bits
    import paddle
    m = YouTube8M(top_k=2)
    m.update({"probs": paddle.to_tensor(PROBS).astype("bfloat16")},
             {"labels": paddle.to_tensor(LABELS), "index": paddle.to_tensor([0, 1, 2])})
    assert m.accumulate()["gap"] == pytest.approx(0.375)   # bf16 keeps the order of these scores
    assert m.collect()[1]["scores"][0] == pytest.approx([0.9, 0.8], abs=0.01)


def test_youtube8m_errors():
    with pytest.raises(ConfigError, match="top_k must be a positive integer"):
        YouTube8M(top_k=0)
    with pytest.raises(ValueError, match=r"batch\['labels'\] shape \[1, 3\] does not match"):
        feed(YouTube8M(), [[0.1, 0.2]], [[0, 1, 0]], [0])
    with pytest.raises(ValueError, match="contains NaN"):
        feed(YouTube8M(), [[np.nan, 0.2]], [[0, 1]], [0])
    assert METRICS.get("YouTube8M") is YouTube8M and METRICS.get("Classification") is Classification


# ----------------------------------------------------------------------------- classification

SCORES = np.array([[5, 4, 3, 2, 1, 0],      # label 0: top1 hit
                   [5, 4, 3, 2, 1, 0],      # label 1: top1 miss, in top5
                   [5, 4, 3, 2, 1, 0],      # label 5: last, outside top5
                   [0, 9, 0, 0, 0, 0],      # label 1: top1 hit
                   [1, 1, 1, 1, 1, 1]],     # label 2: all tied -> ranking 0..5, top1 miss, in top5
                  np.float32)
LABEL = np.array([0, 1, 5, 1, 2])


def test_topk_and_mean_class_accuracy_by_hand():
    m = Classification()
    m.update({"logits": SCORES}, {"label": LABEL, "index": np.arange(5)})
    out = m.accumulate()
    assert out["top1"] == pytest.approx(2 / 5)     # samples 0, 3
    assert out["top5"] == pytest.approx(4 / 5)     # all but sample 2
    # per class recall: 0 -> 1/1, 1 -> 1/2, 2 -> 0/1, 5 -> 0/1; mean over the 4 classes = 0.375
    assert out["mean_class_acc"] == pytest.approx(0.375)
    assert out["num_samples"] == 5


def test_mean_class_acc_averages_ground_truth_classes_only():
    # labels [0, 0], predictions [0, 1]: class 0 recall 1/2. (MMAction2 would average in a 0 for
    # class 1, which is predicted but never a label: 0.25.)
    m = Classification(topk=[1])
    m.update({"probs": np.array([[0.9, 0.1], [0.2, 0.8]])}, {"label": np.array([0, 0]), "index": np.array([0, 1])})
    assert m.accumulate() == {"top1": 0.5, "mean_class_acc": 0.5, "num_samples": 2}


def test_classification_duplicates_and_errors():
    m = Classification()
    m.update({"logits": SCORES[[0, 1]]}, {"label": LABEL[[0, 1]], "index": np.array([0, 1])})
    m.update({"logits": SCORES[[1, 2, 3, 4, 0]]}, {"label": LABEL[[1, 2, 3, 4, 0]], "index": np.array([1, 2, 3, 4, 0])})
    assert m.accumulate()["top1"] == pytest.approx(2 / 5) and m.accumulate()["num_samples"] == 5
    with pytest.raises(ValueError, match="neither 'logits' nor 'probs'"):
        m.update({"x": SCORES}, {"label": LABEL, "index": np.arange(5)})
    with pytest.raises(ConfigError, match="topk must be a list of positive integers"):
        Classification(topk=[0])


# ----------------------------------------------------------------------------- data parallel

def eval_data(n=7, classes=6, seed=5):
    rng = np.random.default_rng(seed)
    probs = np.round(rng.random((n, classes)), 1).astype(np.float32)   # coarse: many ties
    labels = (rng.random((n, classes)) < 0.3).astype(np.float32)
    return probs, labels, rng.integers(0, classes, n)


class RaggedRows(IndexedMetric):
    """A metric with ragged per-sample rows, as detection (a list of boxes) and translation (a
    hypothesis string) have: detections = the classes scored >= 0.5, hypothesis = their names."""

    def names(self):
        return ["detections", "text"]

    def update(self, preds, batch):
        probs = np.asarray(preds["probs"])
        dets = [np.nonzero(row >= 0.5)[0] for row in probs]
        self.add(batch["index"], dets=dets, hyp=[" ".join(f"c{c}" for c in d) for d in dets])

    def accumulate(self):
        index, rows = self.collect()
        return {"detections": int(sum(len(d) for d in rows["dets"])), "text": " | ".join(rows["hyp"]),
                "index": index.tolist()}


def test_ragged_rows_keep_one_row_per_index_in_index_order():
    m = RaggedRows()
    probs = np.array([[0.9, 0.6], [0.1, 0.2], [0.5, 0.0]])
    m.update({"probs": probs[[2, 0]]}, {"index": np.array([2, 0])})
    m.update({"probs": probs[[1, 2]]}, {"index": np.array([1, 2])})      # 2 repeated, as padding repeats
    assert m.accumulate() == {"detections": 3, "text": "c0 c1 |  | c0", "index": [0, 1, 2]}
    with pytest.raises(ValueError, match="field 'hyp' has 1 rows for a batch of 2"):
        m.add(np.array([0, 1]), hyp=["x"])


def run_eval(probs, labels, label, num_replicas=1, rank=0):
    metrics = [YouTube8M(top_k=3), Classification(topk=[1, 3]), RaggedRows()]
    sampler = EpochBatchSampler(len(probs), batch_size=2, shuffle=True, seed=3,
                                num_replicas=num_replicas, rank=rank)
    for idx in sampler:
        idx = np.array(idx)
        for m in metrics:
            m.update({"probs": probs[idx]}, {"labels": labels[idx], "label": label[idx], "index": idx})
    return {type(m).__name__: m.accumulate() for m in metrics}


WORKER = """
import json, sys
sys.path.insert(0, {root!r})
import numpy as np
import paddle.distributed as dist
from tests.test_metrics import run_eval
dist.init_parallel_env()
d = np.load({data!r})
rank, world = dist.get_rank(), dist.get_world_size()
result = run_eval(d["probs"], d["labels"], d["label"], num_replicas=world, rank=rank)
with open({out!r} + f"/rank{{rank}}.json", "w") as f:
    json.dump({{"world": world, "result": result}}, f)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_give_the_one_process_numbers(tmp_path):
    probs, labels, label = eval_data()
    np.savez(tmp_path / "data.npz", probs=probs, labels=labels, label=label)
    # 7 samples on 2 ranks: the sampler pads to 8, so one sample is seen twice
    seen = [i for r in range(2) for b in EpochBatchSampler(7, 2, True, seed=3, num_replicas=2, rank=r) for i in b]
    assert len(seen) == 8 and set(seen) == set(range(7))
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER.format(root=ROOT, data=str(tmp_path / "data.npz"),
                                                    out=str(tmp_path))))
    env = dict(os.environ, GLOG_minloglevel="2")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
           "--log_dir", str(tmp_path / "log"), "--max_restart", "0",
           "--start_port", str(free_port()), "--gloo_port", str(free_port()), str(script)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    logs = "".join((tmp_path / "log" / f).read_text() for f in sorted(os.listdir(tmp_path / "log"))
                   if f.startswith("workerlog")) if (tmp_path / "log").is_dir() else ""
    assert proc.returncode == 0, proc.stderr[-3000:] + logs[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    single = run_eval(probs, labels, label)
    assert single["YouTube8M"]["num_samples"] == 7 and single["RaggedRows"]["index"] == list(range(7))
    for r in ranks:
        assert r["world"] == 2
        assert r["result"] == single       # exact equality, every rank
