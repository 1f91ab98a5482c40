"""Export for Paddle Inference: every exportable demo model's exported program gives the dynamic
model's outputs (golden README tolerance) at another batch size and input size than any fixed one,
tools/infer.py --backend inference writes what the dynamic path writes, and bad export directories
or inputs get one clear line."""
import glob
import json
import os
import re
import shutil

import numpy as np
import paddle
import pytest

from engine import builder, config, export
from engine.components import load_all
from engine.predictor import Predictor
from engine.registry import ConfigError
from tests.conftest import ATTENTION_LSTM_DEMO, BERT_GLUE_DEMO, BERT_PRETRAIN_DEMO, TRANSFORMER_DEMO, TSN_DEMO
from tests.helpers import ROOT, one_error_line, tool, tools_in_one_process

load_all()
DEMOS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"), recursive=True))
DEMO_DATA = {"bert": ["bert_demo"], "transformer": ["translation_demo"]}   # by config folder; else the videos'


def close(ours, ref):
    """The golden README's tolerance: |ours - ref| <= 1e-4 * max(1, max|ref|) + 1e-4 * |ref|."""
    ref = np.asarray(ref, np.float64)
    return bool(np.all(np.abs(np.asarray(ours, np.float64) - ref)
                       <= 1e-4 * max(1.0, float(np.abs(ref).max(initial=0))) + 1e-4 * np.abs(ref)))


def _batches(cfg):
    """Two val batches of different sizes (and, for videos, another frame size and segment count)."""
    loader, _, _ = builder.build_loader(cfg, "val", 0, batch_size=3)
    first = next(iter(loader))
    small = {k: v[:2] if isinstance(v, paddle.Tensor) and v.ndim else v for k, v in first.items()}
    if "imgs" in first:   # [B, T, C, H, W]: another segment count and image size than the reader's
        imgs = first["imgs"][:, :2]
        small["imgs"] = paddle.nn.functional.interpolate(
            imgs.reshape([-1] + imgs.shape[2:]), size=[48, 40], mode="bilinear").reshape(
            imgs.shape[:3] + [48, 40])[:2]
    for key in [k for k in first if k + "_mask" in first]:   # padded features and tokens: a shorter length
        t = 3 if first[key].ndim == 3 else max(2, first[key].shape[1] // 2)
        small[key], small[key + "_mask"] = first[key][:2, :t], first[key + "_mask"][:2, :t]
        if key + "_len" in first:
            small[key + "_len"] = paddle.minimum(first[key + "_len"][:2], paddle.to_tensor(t, "int64"))
    if "masked_lm_positions" in first:   # masked tokens cut off with the sequence are no longer masked
        gone = small["masked_lm_positions"] >= small["input_ids"].shape[1]
        small["masked_lm_ids"] = paddle.where(gone, paddle.full_like(small["masked_lm_ids"], -1), small["masked_lm_ids"])
        small["masked_lm_positions"] = paddle.where(gone, paddle.zeros_like(gone, "int64"), small["masked_lm_positions"])
    return [first, small]


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: os.path.relpath(p, ROOT))
def test_exported_program_matches_the_dynamic_model(path, tmp_path, request):
    for fixture in DEMO_DATA.get(os.path.basename(os.path.dirname(path)), ["yt8m_demo", "kinetics_demo"]):
        request.getfixturevalue(fixture)
    cfg = config.load(path)
    paddle.seed(0)
    model = builder.build_model(cfg["model"])
    model.eval()
    export.export(model, cfg, str(tmp_path))
    predictor = Predictor(str(tmp_path))
    for batch in _batches(cfg):
        got = predictor(batch)
        with paddle.no_grad():
            ref = model(batch)
        assert set(got) == set(export.spec_of(model)["outputs"])
        for key in got:
            assert got[key].shape == tuple(ref[key].shape), key
            assert close(got[key], ref[key].numpy()), (key, float(np.abs(got[key] - ref[key].numpy()).max()))


def test_infer_with_the_exported_model_writes_what_the_dynamic_one_writes(tsn_demo_run, attention_lstm_run,
                                                                          yt8m_demo, kinetics_demo, tmp_path):
    videos = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    runs, outs = [], {}
    for name, cfg, run, inputs in [("tsn", TSN_DEMO, tsn_demo_run, videos),
                                   ("al", ATTENTION_LSTM_DEMO, attention_lstm_run, shard)]:
        weights = os.path.join(run, "final", "model.pdparams")
        runs.append(("export", ["-c", cfg, "--weights", weights, "--output", tmp_path / f"{name}_export"], None))
        for backend in ("dynamic", "inference"):
            out = tmp_path / f"{name}_{backend}"
            outs[(name, backend)] = out
            w = weights if backend == "dynamic" else tmp_path / f"{name}_export"
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", inputs,
                                   "--output", out], None))
    results = tools_in_one_process(runs)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results if r["code"]]
    for name in ("tsn", "al"):
        dyn, inf = (json.load(open(outs[(name, b)] / "predictions.json")) for b in ("dynamic", "inference"))
        assert len(dyn) == len(inf) > 0
        for a, b in zip(dyn, inf):
            assert a["id"] == b["id"] and [t["class_id"] for t in a["top_k"]] == [t["class_id"] for t in b["top_k"]]
            assert np.allclose([t["score"] for t in a["top_k"]], [t["score"] for t in b["top_k"]], atol=1e-4)
    assert open(outs[("al", "dynamic")] / "submission.csv").read().splitlines()[0] == \
        open(outs[("al", "inference")] / "submission.csv").read().splitlines()[0]


def test_bad_export_directories_and_inputs(tmp_path, yt8m_demo):
    cfg = config.load(ATTENTION_LSTM_DEMO)
    model = builder.build_model(cfg["model"])
    export.export(model, cfg, str(tmp_path / "al"))
    shutil.copytree(tmp_path / "al", tmp_path / "no_cfg")
    os.remove(tmp_path / "no_cfg" / "infer_cfg.yml")
    shutil.copytree(tmp_path / "al", tmp_path / "old")
    with open(tmp_path / "old" / "infer_cfg.yml") as f:
        text = f.read().replace("zoo_export_version: 1", "zoo_export_version: 0")
    with open(tmp_path / "old" / "infer_cfg.yml", "w") as f:
        f.write(text)
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    runs = [("infer", ["-c", TSN_DEMO, "--backend", "inference", "--weights", tmp_path / "al", "--input", shard,
                       "--output", tmp_path / "o1"], None),
            ("infer", ["-c", ATTENTION_LSTM_DEMO, "--backend", "inference", "--weights", tmp_path / "no_cfg",
                       "--input", shard, "--output", tmp_path / "o2"], None),
            ("infer", ["-c", ATTENTION_LSTM_DEMO, "--backend", "inference", "--weights", tmp_path / "old",
                       "--input", shard, "--output", tmp_path / "o3"], None)]
    expected = [["holds an exported AttentionLSTM", "builds TSN"], ["no infer_cfg.yml"],
                ["export format version 0", "export the model again"]]
    for result, fragments in zip(tools_in_one_process(runs), expected):
        line = one_error_line(result)
        assert line and all(f in line for f in fragments), result
    predictor = Predictor(str(tmp_path / "al"))
    with pytest.raises(ConfigError, match=r"input 'rgb' has shape \[2, 5, 7\], the exported program takes "
                                          r"\['\?', '\?', 1024\]"):
        predictor({"rgb": np.zeros((2, 5, 7), np.float32), "rgb_len": np.ones(2, np.int64),
                   "rgb_mask": np.ones((2, 5), np.float32), "audio": np.zeros((2, 5, 128), np.float32),
                   "audio_len": np.ones(2, np.int64), "audio_mask": np.ones((2, 5), np.float32)})


def _peaked_transformer():
    """A small random post-norm Transformer with its weights scaled up: peaked distributions, so beam
    search keeps hypotheses of several lengths (a random model at the usual scale repeats one token)."""
    from models.nlp.transformer import Transformer
    paddle.seed(1)
    m = Transformer(src_vocab_size=24, trg_vocab_size=24, d_model=32, d_inner_hid=64, n_head=4, num_encoder_layers=2,
                    num_decoder_layers=2, max_length=30, dropout=0.0, normalize_before=False, beam_size=4,
                    max_len_a=1.0, max_len_b=4)
    for p in m.parameters():
        if p.ndim == 2:
            p.set_value(p.numpy() * 3)
    m.eval()
    src = np.random.default_rng(0).integers(3, 24, size=(6, 7))
    src[:, -1] = 1
    src[4, 3:] = [1, 0, 0, 0]
    return m, src


def test_transformer_exports_its_encoder_and_one_decoder_step_and_decodes_with_the_same_search(tmp_path):
    """The boundary: programs `encoder` and `decoder_step`, Python BeamSearch over them. Each program gives
    the dynamic network's outputs (a step with a non-empty cache too), and the whole predictor the
    dynamic model's translations at two batch sizes and source lengths."""
    m, src = _peaked_transformer()
    export.export(m, {"model": {"name": "Transformer"}}, str(tmp_path))
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".json")) == ["decoder_step.json", "encoder.json"]
    predictor = Predictor(str(tmp_path))
    lengths = set()
    for rows, cols in ((6, 7), (3, 5)):
        ids = src[:rows, :cols]
        batch = {"src_ids": ids, "src_ids_mask": (ids != 0).astype("float32")}
        got = predictor(batch)
        with paddle.no_grad():
            ref = m({k: paddle.to_tensor(v) for k, v in batch.items()})
        assert np.array_equal(got["ids"], ref["ids"].numpy()) and np.array_equal(got["ids_len"], ref["ids_len"].numpy())
        assert close(got["scores"], ref["scores"].numpy())
        lengths |= set(got["ids_len"].tolist())
    assert len(lengths) > 2                # hypotheses of several lengths: the search was exercised
    # the programs alone, teacher-forced over three steps (the cache grows 0 -> 3 positions)
    enc, step = predictor.programs["encoder"], predictor.programs["decoder_step"]
    batch = {"src_ids": src, "src_ids_mask": (src != 0).astype("float32")}
    out = enc(batch)
    with paddle.no_grad():
        memory, bias = m.encode(paddle.to_tensor(src), paddle.to_tensor(batch["src_ids_mask"]))
        memory_kv = m.transformer.decoder.memory_kv(memory)
        caches = m.empty_caches(len(src))
        assert close(out["memory_bias"], bias.numpy())
        for i, (k, v) in enumerate(memory_kv):
            assert close(out[f"memory_k{i}"], k.numpy()) and close(out[f"memory_v{i}"], v.numpy())
        cache_np = [(k.numpy(), v.numpy()) for k, v in caches]
        for t, token in enumerate([0, 5, 9]):
            ids = np.full((len(src), 1), token, np.int64)
            logp, caches = m.decoder_step(paddle.to_tensor(ids), memory_kv, bias, caches)
            feeds = {"ids": ids, "memory_bias": out["memory_bias"]}
            for i, (mk, mv) in enumerate(memory_kv):
                feeds.update({f"memory_k{i}": out[f"memory_k{i}"], f"memory_v{i}": out[f"memory_v{i}"],
                              f"cache_k{i}": cache_np[i][0], f"cache_v{i}": cache_np[i][1]})
            res = step(feeds)
            assert close(res["logp"], logp.numpy()), t
            cache_np = [(res[f"cache_k{i}"], res[f"cache_v{i}"]) for i in range(len(caches))]
            assert all(c[0].shape[2] == t + 1 and close(c[0], d[0].numpy()) for c, d in zip(cache_np, caches))
    # a source longer than the position table: the dynamic model's line, from the runner
    long = np.full((2, 31), 5)
    long[:, -1] = 1
    with pytest.raises(ConfigError, match=r"source of sample 8 has 31 tokens .*position table holds "
                                          r"\(model.max_length 30\)"):
        predictor({"src_ids": long, "src_ids_mask": np.ones(long.shape, np.float32), "index": np.array([8, 9])})


def test_infer_with_exported_bert_and_transformer_writes_what_the_dynamic_path_writes(
        bert_demo, bert_pretrain_run, bert_glue_run, transformer_demo_run, translation_demo, tmp_path):
    """GLUE submission, pretraining scores and translations through tools/infer.py, dynamic vs exported;
    inputs the exported programs cannot take (a sequence past BERT's position table, a source past the
    Transformer's) get one line."""
    with open(os.path.join(translation_demo, "test.en"), encoding="utf-8") as f:
        sentences = f.read().splitlines()[:40]
    src = tmp_path / "src.en"
    src.write_text("\n".join(sentences[:20] + [""] + sentences[20:]) + "\n", encoding="utf-8")
    long_src = tmp_path / "long.en"
    long_src.write_text("the dog sees a cat " * 20 + ".\n", encoding="utf-8")
    long_tsv = tmp_path / "long.tsv"
    long_tsv.write_text("index\tsentence1\tsentence2\n0\t" + "one two three " * 30 + "\tfour five\n", encoding="utf-8")
    cases = {"glue": (BERT_GLUE_DEMO, bert_glue_run, os.path.join(bert_demo, "glue", "test.tsv")),
             "pretrain": (BERT_PRETRAIN_DEMO, bert_pretrain_run, os.path.join(bert_demo, "corpus", "val.txt")),
             "mt": (TRANSFORMER_DEMO, transformer_demo_run, src)}
    runs = []
    for name, (cfg, run, inputs) in cases.items():
        weights = os.path.join(run, "final", "model.pdparams")
        runs.append(("export", ["-c", cfg, "--weights", weights, "--output", tmp_path / f"{name}_export"], None))
        for backend, w in (("dynamic", weights), ("inference", tmp_path / f"{name}_export")):
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", inputs,
                                   "--output", tmp_path / f"{name}_{backend}"], None))
    bad = [("infer", ["-c", TRANSFORMER_DEMO, "--backend", "inference", "--weights", tmp_path / "mt_export",
                      "--input", long_src, "--output", tmp_path / "bad1"], None),
           ("infer", ["-c", BERT_GLUE_DEMO, "--backend", "inference", "--weights", tmp_path / "glue_export",
                      "--input", long_tsv, "--output", tmp_path / "bad2", "-o", "reader.test.max_seq_length=100"], None)]
    results = tools_in_one_process(runs + bad)
    assert all(r["code"] == 0 for r in results[:len(runs)]), [r["stderr"][-1500:] for r in results if r["code"]]
    read = lambda name, backend, file: (tmp_path / f"{name}_{backend}" / file).read_text(encoding="utf-8")  # noqa: E731
    glue = read("glue", "dynamic", "RTE.tsv")
    assert glue == read("glue", "inference", "RTE.tsv") and len(glue.splitlines()) > 50
    mt = read("mt", "dynamic", "translations.txt").split("\n")
    assert mt == read("mt", "inference", "translations.txt").split("\n")
    assert len(mt) == 42 and mt[20] == "" and all(mt[:20]) and all(mt[21:41])   # 41 lines, the empty one empty
    dyn, inf = ([json.loads(line) for line in read("pretrain", b, "pretraining_scores.jsonl").splitlines()]
                for b in ("dynamic", "inference"))
    assert len(dyn) == len(inf) > 50 and sum(r["mlm_correct"] for r in dyn) > 0
    for a, b in zip(dyn, inf):
        assert (a["id"], a["mlm_correct"], a["mlm_total"]) == (b["id"], b["mlm_correct"], b["mlm_total"])
        assert abs(a["p_is_next"] - b["p_is_next"]) <= 2e-4
    lines = [one_error_line(r) for r in results[len(runs):]]
    assert lines[0] and "sample 0 has" in lines[0] and "position table holds (model.max_length 64)" in lines[0], \
        results[len(runs)]
    assert lines[1] and re.search(r"input 'input_ids' has shape \[1, (\d+)\], the exported program takes at most "
                                  r"\['\?', 64\] \(BERT's position table", lines[1]), results[-1]
    assert int(re.search(r"shape \[1, (\d+)\]", lines[1]).group(1)) > 64
