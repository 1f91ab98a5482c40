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

from engine import builder, config
from engine.components import load_all
from engine.cpu import has_bf16
from deploy import export, openvino
from deploy.predictor import Predictor
from deploy.quantize import Recorder
from engine.errors import ConfigError
from tests.conftest import (ATTENTION_LSTM_DEMO, BERT_GLUE_DEMO, BERT_PRETRAIN_DEMO, DEEPLAB_DEMO, MASK_RCNN_DEMO,
                            TRANSFORMER_DEMO, TSN_DEMO)
from tests.helpers import ROOT, one_error_line, peaked_transformer, tool, tools_in_one_process

# what these tests expect depends on which kernels oneDNN runs: `make test-isa` runs them under each
# ONEDNN_MAX_CPU_ISA cap (tests/isa.py)
pytestmark = pytest.mark.isa

load_all()
DEMOS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*_demo.yaml"), recursive=True))
DEMO_DATA = {"bert": ["bert_demo"], "transformer": ["translation_demo"], "deeplabv3": ["voc_demo"],
             "mask_rcnn": ["coco_demo"]}   # by config folder; else the videos'
# Programs that choose among float scores (the RPN's NMS inside Mask R-CNN's `detect`): oneDNN's
# convolutions round differently from the dynamic graph's CPU kernels (~1e-6), which flips near-ties of
# a random model's flat scores (one proposal more or less). Such a demo is compared on the plain CPU
# kernels, and under oneDNN on these outputs of the same calls, which no choice precedes.
ONEDNN_CONTINUOUS = {"mask_rcnn": {"features": ["p2", "p3", "p4", "p5"]}}


def _same_top_k(a, b, where, atol=1e-4):
    """The same ranking up to ties: the scores agree rank by rank, and every class keeps its score; two
    classes may trade places only when their scores are within atol (a well-trained demo gives several
    classes ~0, and the two backends round those differently)."""
    assert np.allclose([t["score"] for t in a], [t["score"] for t in b], atol=atol), (where, a, b)
    theirs = {t["class_id"]: t["score"] for t in b}
    lowest = min(theirs.values())
    for rank, t in enumerate(a):
        if t["class_id"] in theirs:
            assert abs(t["score"] - theirs[t["class_id"]]) <= atol, (where, rank, a, b)
        else:                                          # left b's top-k at its boundary only
            assert t["score"] <= lowest + atol, (where, rank, a, b)


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
    if "image" in first:  # [B, C, H, W]: smaller by 32 px (PadImages' size divisor of the detection recipes)
        h, w = first["image"].shape[2:]
        small["image"] = first["image"][:2, :, :h - 32, :w - 32]
        if "image_size" in first:
            small["image_size"] = paddle.minimum(first["image_size"][:2], paddle.to_tensor([h - 32, w - 32], "int64"))
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


def assert_same(got, ref, what):
    """Floats within the golden tolerance, integers equal; lists (one array per image) item by item.
    Binary masks (thresholded probabilities, which the pipeline test compares before the threshold)
    may differ in 1 pixel of 10^4: those whose probability is within float noise of the threshold."""
    if isinstance(ref, list):
        assert isinstance(got, list) and len(got) == len(ref), what
        for i, (g, r) in enumerate(zip(got, ref)):
            assert_same(g, r, f"{what}[{i}]")
        return
    ref = ref.numpy() if isinstance(ref, paddle.Tensor) else np.asarray(ref)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if np.issubdtype(ref.dtype, np.floating):
        assert close(got, ref), (what, float(np.abs(got - ref).max()))
    elif what.startswith("masks"):
        assert int((got != ref).sum()) <= ref.size // 10000, (what, int((got != ref).sum()), ref.size)
    else:
        assert np.array_equal(got, ref), (what, int((got != ref).sum()))


# DeepLabV3's evaluation options: the shared Python runs the exported network on windows of two scales, flipped
SEG_OPTIONS = ["model.slide_crop_size=[64, 48]", "model.slide_stride=[48, 40]", "model.test_scales=[0.75, 1.0]",
               "model.test_flip=true"]
CASES = [pytest.param(p, [], id=os.path.relpath(p, ROOT)) for p in DEMOS] + [
    pytest.param(os.path.join(ROOT, DEEPLAB_DEMO), SEG_OPTIONS, id=DEEPLAB_DEMO + "-slide-scales-flip"),
    # RoIAlign without the half-pixel offset (checkpoints of our earlier default): ONNX's output_half_pixel
    pytest.param(os.path.join(ROOT, MASK_RCNN_DEMO), ["model.roi.aligned=false"], id=MASK_RCNN_DEMO + "-unaligned")]


@pytest.mark.parametrize("backend", ["inference", "onnxruntime"])
@pytest.mark.parametrize("path,overrides", CASES)
def test_exported_program_matches_the_dynamic_model(path, overrides, backend, tmp_path, request):
    folder = os.path.basename(os.path.dirname(path))
    for fixture in DEMO_DATA.get(folder, ["yt8m_demo", "kinetics_demo"]):
        request.getfixturevalue(fixture)
    cfg = config.load(path, overrides)
    paddle.seed(0)
    model = builder.build_model(cfg["model"])
    model.eval()
    export.export(model, cfg, str(tmp_path), fmt="onnx" if backend == "onnxruntime" else "paddle")
    continuous = ONEDNN_CONTINUOUS.get(folder) if backend == "inference" else None
    predictor = Predictor(str(tmp_path), mkldnn=continuous is None, backend=backend,
                          wrap=(lambda p: Recorder(p, 16)) if backend == "onnxruntime" else None)
    # the ONNX export on OpenVINO too: fp32 (its f32 precision hint, on every CPU kind)
    ov = Predictor(str(tmp_path), backend="openvino") if backend == "onnxruntime" else None
    assert predictor.precision == "fp32" and (ov is None or ov.precision == "fp32")
    if ov:
        assert {p.inference_precision for p in ov.programs.values()} == {"f32"}
    onednn = Predictor(str(tmp_path)) if continuous else None
    spec = export.spec_of(model)
    for i, batch in enumerate(_batches(cfg)):
        with paddle.no_grad():
            ref = model(batch)
            if type(model).run_exported is not None:   # each network call of the shared Python (before NMS, ...)
                calls = []

                def recording(name, inputs):
                    calls.append((name, inputs, model.run_program(name, inputs)))
                    return calls[-1][2]

                type(model).run_exported(recording, batch, spec["settings"])
                assert {name for name, *_ in calls} == set(spec["programs"])
                assert len(calls) > 2 * 2 * 2 or overrides is not SEG_OPTIONS    # windows x scales x flips
                for name, inputs, outputs in calls:
                    feeds = {k: v.numpy() for k, v in inputs.items()}
                    raw = predictor.programs[name](feeds)
                    assert set(raw) == set(outputs), name
                    for key in raw:
                        assert_same(raw[key], outputs[key], f"{name}.{key}")
                    if continuous and name in continuous:
                        raw = onednn.programs[name](feeds)
                        for key in continuous[name]:
                            assert_same(raw[key], outputs[key], f"{name}.{key} (oneDNN)")
        got = predictor(batch)
        assert set(got) == set(spec["outputs"])
        for key in got:
            assert_same(got[key], ref[key], key)
        if ov:   # and on the first batch OpenVINO asked for bf16
            _openvino_matches(ov, predictor, batch, ref, folder,
                              Predictor(str(tmp_path), backend="openvino", precision="bf16") if i == 0 else None)
    if backend == "inference":
        _bf16_matches_fp32(str(tmp_path), _batches(cfg)[0])


# Models whose prediction chooses among float scores (NMS, a beam search): on a random model's flat
# scores OpenVINO's rounding (~1e-6 from ONNX Runtime's) flips near-ties, as oneDNN's does. Their
# programs are compared call by call; their final predictions in the trained demos' infer tests.
FLOAT_CHOICES = {"mask_rcnn"}


def _openvino_matches(ov, ort, batch, ref, folder, bf16=None):
    """OpenVINO's programs on the feeds ONNX Runtime's programs were given (recorded) give their
    outputs within the golden tolerance, and its predictions the dynamic model's. `bf16`: OpenVINO's
    predictor asked for bf16, whose outputs stay within BF16_RTOL of fp32's where OpenVINO has bf16 on
    this CPU, and are fp32's (compiled f32) where it has not."""
    worst = 0.0
    for name, rec in ort.programs.items():
        assert rec.feeds, name
        for feeds in rec.feeds:
            want, got = rec.program(feeds), ov.programs[name](feeds)
            for key in want:
                assert_same(got[key], want[key], f"openvino: {name}.{key}")
            if bf16 is not None:
                half = bf16.programs[name](feeds)
                for key, value in got.items():
                    if bf16.precision == "fp32" or not np.issubdtype(value.dtype, np.floating) or not value.size:
                        assert np.array_equal(half[key], value), (name, key)
                    else:
                        rel = np.linalg.norm(half[key] - value) / max(np.linalg.norm(value), 1e-12)
                        assert rel <= BF16_RTOL, (name, key, rel)
                        worst = max(worst, rel)
        rec.feeds.clear()
    if bf16 is not None:
        assert {p.inference_precision for p in bf16.programs.values()} == {"bf16" if bf16.precision == "bf16" else "f32"}
        assert bf16.precision == ("bf16" if openvino.has_bf16() else "fp32")
        assert bf16.precision == "fp32" or worst > 1e-4, "bf16 computed exactly what fp32 did: its kernels did not run"
    if folder not in FLOAT_CHOICES:
        got = ov(batch)
        for key in got:
            assert_same(got[key], ref[key], f"openvino: {key}")


# bf16 (8 mantissa bits: 2^-9 = 2e-3 per rounding) against fp32, relative L2 of each float output of
# each program on the same feeds: the "about 1e-2"; measured up to 1.4e-2 (random BERT's logits)
BF16_RTOL = 2e-2


def _bf16_matches_fp32(export_dir, batch):
    """`precision="bf16"` (what tools/export.py --precision bf16 records) runs oneDNN's bf16 kernels
    here (both our CPU kinds have native bf16) and each program's outputs stay within BF16_RTOL of
    the fp32 oneDNN program's on the feeds the fp32 predictor gave it."""
    fp32 = Predictor(export_dir, wrap=lambda p: Recorder(p, 3))
    fp32(batch)
    bf16 = Predictor(export_dir, precision="bf16")
    if not has_bf16():   # a CPU without native bf16 (our AMD Zen 4 and Intel Xeon kinds have it): fp32
        assert bf16.precision == "fp32"
        for name, rec in fp32.programs.items():
            for feeds in rec.feeds:
                want, got = rec.program(feeds), bf16.programs[name](feeds)
                assert all(np.array_equal(got[k], want[k]) for k in want), name
        return
    assert bf16.precision == "bf16"
    worst = 0.0
    for name, rec in fp32.programs.items():
        assert rec.feeds, name
        for feeds in rec.feeds:
            want, got = rec.program(feeds), bf16.programs[name](feeds)
            for key, ref in want.items():
                if np.issubdtype(ref.dtype, np.floating) and ref.size:
                    rel = np.linalg.norm(got[key] - ref) / max(np.linalg.norm(ref), 1e-12)
                    assert rel <= BF16_RTOL, (name, key, rel)
                    worst = max(worst, rel)
                else:
                    assert np.array_equal(got[key], ref), (name, key)
    assert worst > 1e-4, "bf16 computed exactly what fp32 did: its kernels did not run"


BACKENDS = ("dynamic", "inference", "onnxruntime", "openvino")
FORMAT_OF = {"inference": "paddle", "onnxruntime": "onnx"}
EXPORT_OF = {"openvino": "onnxruntime"}    # the backend whose export another runs (OpenVINO reads the ONNX export)


def _export_dir(tmp_path, name, backend):
    return tmp_path / f"{name}_{EXPORT_OF.get(backend, backend)}_export"


def _exports(cfg, weights, tmp_path, name):
    """tools/export.py runs writing `<name>_<backend>_export` for the exported backends."""
    return [("export", ["-c", cfg, "--weights", weights, "--format", fmt, "--output", tmp_path / f"{name}_{b}_export"],
             None) for b, fmt in FORMAT_OF.items()]


def test_infer_with_the_exported_model_writes_what_the_dynamic_one_writes(tsn_demo_run, attention_lstm_run,
                                                                          yt8m_demo, kinetics_demo, tmp_path):
    """TSN's and AttentionLSTM's predictions.json on every backend; tools/eval.py on the AttentionLSTM ONNX
    export gives the same metrics on OpenVINO as on ONNX Runtime."""
    videos = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    runs, outs = [], {}
    for name, cfg, run, inputs in [("tsn", TSN_DEMO, tsn_demo_run, videos),
                                   ("al", ATTENTION_LSTM_DEMO, attention_lstm_run, shard)]:
        weights = os.path.join(run, "final", "model.pdparams")
        runs += _exports(cfg, weights, tmp_path, name)
        for backend in BACKENDS:
            out = tmp_path / f"{name}_{backend}"
            outs[(name, backend)] = out
            w = weights if backend == "dynamic" else _export_dir(tmp_path, name, backend)
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", inputs,
                                   "--output", out], None))
    runs += [("eval", ["--weights", _export_dir(tmp_path, "al", b), "--backend", b, "--output", tmp_path / f"eval_{b}"],
              None) for b in ("onnxruntime", "openvino")]
    results = tools_in_one_process(runs)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results if r["code"]]
    for name in ("tsn", "al"):
        dyn = json.load(open(outs[(name, "dynamic")] / "predictions.json"))
        for backend in BACKENDS[1:]:
            inf = json.load(open(outs[(name, backend)] / "predictions.json"))
            assert len(dyn) == len(inf) > 0
            for a, b in zip(dyn, inf):
                assert a["id"] == b["id"]
                _same_top_k(a["top_k"], b["top_k"], (backend, a["id"]))
            assert open(outs[("al", "dynamic")] / "submission.csv").read().splitlines()[0] == \
                open(outs[("al", backend)] / "submission.csv").read().splitlines()[0]
    ort, ov = (json.load(open(tmp_path / f"eval_{b}" / "metrics.json")) for b in ("onnxruntime", "openvino"))
    assert ort.keys() == ov.keys() and len(ort) > 1, (ort, ov)
    for key, value in ort.items():
        if isinstance(value, (int, float)):
            assert abs(value - ov[key]) <= 1e-4, (key, value, ov[key])
    assert ort["gap"] > 0.1, ort                # a trained model (not a vacuous 0 against 0)


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


@pytest.mark.parametrize("backend", ["inference", "onnxruntime"])
def test_transformer_exports_its_encoder_and_one_decoder_step_and_decodes_with_the_same_search(backend, tmp_path):
    """The boundary: programs `encoder` and `decoder_step`, Python BeamSearch over them. Each program gives
    the dynamic network's outputs (a step with a non-empty cache too), and the whole predictor the
    dynamic model's translations at two batch sizes and source lengths."""
    m, src = peaked_transformer(beam_size=4)
    fmt = FORMAT_OF[backend]
    export.export(m, {"model": {"name": "Transformer"}}, str(tmp_path), fmt=fmt)
    ext = export.FORMATS[fmt][0]
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(ext)) == ["decoder_step" + ext, "encoder" + ext]
    predictor = Predictor(str(tmp_path), backend=backend)
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
    # the same programs under PaddleNLP's v1 search (the weights are peaked_transformer's either way)
    m1, _ = peaked_transformer(beam_size=4, beam_search_version="v1", max_out_len=12)
    run_v1 = type(m).exported_runner(predictor.programs, dict(predictor.record["settings"], **m1.search_settings()))
    batch = {"src_ids": src, "src_ids_mask": (src != 0).astype("float32")}
    got = run_v1(batch)
    with paddle.no_grad():
        ref = m1({k: paddle.to_tensor(v) for k, v in batch.items()})
    assert np.array_equal(got["ids"], ref["ids"].numpy()) and close(got["scores"], ref["scores"].numpy())
    assert len(set(got["ids_len"].tolist())) > 1
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
        runs += _exports(cfg, weights, tmp_path, name)
        for backend in BACKENDS:
            w = weights if backend == "dynamic" else _export_dir(tmp_path, name, backend)
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", inputs,
                                   "--output", tmp_path / f"{name}_{backend}"], None))
    bad = [("infer", ["-c", TRANSFORMER_DEMO, "--backend", b, "--weights", _export_dir(tmp_path, "mt", b),
                      "--input", long_src, "--output", tmp_path / f"bad1_{b}"], None) for b in BACKENDS[1:]] + \
          [("infer", ["-c", BERT_GLUE_DEMO, "--backend", b, "--weights", _export_dir(tmp_path, "glue", b),
                      "--input", long_tsv, "--output", tmp_path / f"bad2_{b}", "-o", "reader.test.max_seq_length=100"],
            None) for b in BACKENDS[1:]]
    results = tools_in_one_process(runs + bad)
    assert all(r["code"] == 0 for r in results[:len(runs)]), [r["stderr"][-1500:] for r in results if r["code"]]
    read = lambda name, backend, file: (tmp_path / f"{name}_{backend}" / file).read_text(encoding="utf-8")  # noqa: E731
    glue = read("glue", "dynamic", "RTE.tsv")
    mt = read("mt", "dynamic", "translations.txt").split("\n")
    assert len(glue.splitlines()) > 50
    assert len(mt) == 42 and mt[20] == "" and all(mt[:20]) and all(mt[21:41])   # 41 lines, the empty one empty
    dyn = [json.loads(line) for line in read("pretrain", "dynamic", "pretraining_scores.jsonl").splitlines()]
    assert len(dyn) > 50 and sum(r["mlm_correct"] for r in dyn) > 0
    for backend in BACKENDS[1:]:
        assert glue == read("glue", backend, "RTE.tsv"), backend
        assert mt == read("mt", backend, "translations.txt").split("\n"), backend
        inf = [json.loads(line) for line in read("pretrain", backend, "pretraining_scores.jsonl").splitlines()]
        assert len(dyn) == len(inf)
        for a, b in zip(dyn, inf):
            assert (a["id"], a["mlm_correct"], a["mlm_total"]) == (b["id"], b["mlm_correct"], b["mlm_total"]), backend
            assert abs(a["p_is_next"] - b["p_is_next"]) <= 2e-4, backend
    lines = [one_error_line(r) for r in results[len(runs):]]
    n = len(BACKENDS) - 1
    for line, result in zip(lines[:n], results[len(runs):]):
        assert line and "sample 0 has" in line and "position table holds (model.max_length 64)" in line, result
    for line, result in zip(lines[n:], results[len(runs) + n:]):
        assert line and re.search(r"input 'input_ids' has shape \[1, (\d+)\], the exported program takes at most "
                                  r"\['\?', 64\] \(BERT's position table", line), result
        assert int(re.search(r"shape \[1, (\d+)\]", line).group(1)) > 64


def test_infer_with_exported_deeplab_and_mask_rcnn_writes_what_the_dynamic_path_writes(
        deeplab_demo_run, mask_rcnn_demo_run, voc_demo, coco_demo, tmp_path):
    """Label PNGs (DeepLabV3) and detections.json (Mask R-CNN) of the trained demos through tools/infer.py,
    dynamic vs exported (oneDNN on, the default); an input the exported programs cannot take gets one line."""
    seg = [os.path.join(voc_demo, "VOC2012", "JPEGImages", f"val_{i:04d}.jpg") for i in range(3)]
    det = [os.path.join(ROOT, "data", "coco_demo", "val", f"val_{i:04d}.png") for i in range(3)]
    runs = []
    for name, cfg, run, inputs in (("seg", DEEPLAB_DEMO, deeplab_demo_run, seg),
                                   ("det", MASK_RCNN_DEMO, mask_rcnn_demo_run, det)):
        weights = os.path.join(run, "final", "model.pdparams")
        runs += _exports(cfg, weights, tmp_path, name)
        for backend in BACKENDS:
            w = weights if backend == "dynamic" else _export_dir(tmp_path, name, backend)
            runs.append(("infer", ["-c", cfg, "--weights", w, "--backend", backend, "--input", *inputs,
                                   "--output", tmp_path / f"{name}_{backend}"], None))
    results = tools_in_one_process(runs)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results if r["code"]]
    from PIL import Image
    for backend in BACKENDS[1:]:
        for path in seg:
            stem = os.path.splitext(os.path.basename(path))[0]
            dyn, inf = (np.asarray(Image.open(tmp_path / f"seg_{b}" / f"{stem}.png")) for b in ("dynamic", backend))
            assert dyn.shape == inf.shape and np.array_equal(dyn, inf), (backend, stem, int((dyn != inf).sum()))
            assert len(np.unique(dyn)) > 1      # a trained model: more than one class on the image
        dyn, inf = (json.load(open(tmp_path / f"det_{b}" / "detections.json")) for b in ("dynamic", backend))
        assert len(dyn) == len(inf) > 0, backend
        for a, b in zip(dyn, inf):   # box to box
            assert (a["image_id"], a["category_id"]) == (b["image_id"], b["category_id"]), (backend, a, b)
            assert np.allclose(a["bbox"], b["bbox"], atol=1e-2), (backend, a, b)
            assert abs(a["score"] - b["score"]) <= 1e-4, (backend, a, b)
            ma, mb = _rle_decode(a["segmentation"]), _rle_decode(b["segmentation"])
            assert ma.shape == mb.shape and (ma != mb).sum() <= ma.size // 10000, \
                (backend, a["bbox"], (ma != mb).sum())
        assert sum(_rle_decode(a["segmentation"]).any() for a in dyn) > len(dyn) // 2     # masks were compared
    # inputs the exported programs cannot take: a shape refused ahead (channels), one the program fails on
    # (an empty image: Paddle's report reduced to its summary line), sizes that disagree (the shared Python)
    for backend in BACKENDS[1:]:
        seg_pred, det_pred = (Predictor(str(_export_dir(tmp_path, name, backend)), backend=backend)
                              for name in ("seg", "det"))
        cases = [(seg_pred, {"image": np.zeros((1, 4, 64, 64), np.float32)},
                  r"^input 'image' has shape \[1, 4, 64, 64\], the exported program takes \['\?', 3, '\?', '\?'\]"),
                 (seg_pred, {"image": np.zeros((1, 3, 0, 32), np.float32)},
                  r"^the exported program .*model(\.onnx)? cannot take inputs image \[1, 3, 0, 32\]: \S+"),
                 (det_pred, {"image": np.zeros((1, 3, 64, 64), np.float32), "image_size": np.array([[64, 64]] * 3),
                             "scale_factor": np.ones((1, 2), np.float32), "orig_size": np.array([[64, 64]])},
                  r"^MaskRCNN: image_size has 3 rows for 1 images")]
        for predictor, batch, pattern in cases:
            with pytest.raises(ConfigError, match=pattern) as e:
                predictor(batch)
            assert "\n" not in str(e.value), (backend, str(e.value))


def _rle_decode(rle):
    """COCO's uncompressed RLE (column-major runs, zeros first) -> a bool [H, W] mask."""
    h, w = rle["size"]
    values = np.arange(len(rle["counts"])) % 2 == 1
    return np.repeat(values, rle["counts"]).reshape(w, h).T


# Layers paddle2onnx 2.1.0 cannot convert, exported through tools/export.py in a process of their own:
# a mean over all axes (its converter aborts the process: "Can not get input 'axis(dim)' value") and
# paddle's NMS (no converter).
_UNCONVERTIBLE = r'''
import runpy, sys
sys.path.insert(0, "tools")
import _bootstrap
import paddle
from paddle.static import InputSpec
from engine.model import ZooModel
from engine.registry import MODELS


@MODELS.register("MeanOverAllAxes")
class MeanOverAllAxes(ZooModel):
    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.fc = paddle.nn.Linear(8, num_classes)

    def forward(self, batch):
        y = self.fc(batch["x"])
        return {"logits": y - paddle.mean(y)}

    def export_spec(self, example=None):
        return {"inputs": {"x": InputSpec([None, 8], "float32")}, "outputs": ["logits"]}


@MODELS.register("BoxNMS")
class BoxNMS(MeanOverAllAxes):
    def forward(self, batch):
        y = self.fc(batch["x"])
        return {"logits": paddle.vision.ops.nms(y, 0.5)}


sys.argv = ["tools/export.py"] + sys.argv[1:]
runpy.run_path("tools/export.py", run_name="__main__")
'''


def test_onnx_export_and_runtime_refuse_bad_input_with_one_line(tmp_path, yt8m_demo):
    import subprocess
    import sys
    from tests.helpers import ENV
    outs = []
    for name in ("MeanOverAllAxes", "BoxNMS"):
        (tmp_path / f"{name}.yaml").write_text(f"model: {{name: {name}}}\n")
        proc = subprocess.run([sys.executable, "-c", _UNCONVERTIBLE, "-c", tmp_path / f"{name}.yaml", "--format",
                               "onnx", "--output", tmp_path / name], cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=300)
        outs.append(one_error_line({"code": proc.returncode, "stderr": proc.stderr}) or (proc.returncode, proc.stderr))
    assert re.match(r"error: cannot export program 'model' to ONNX: paddle2onnx 2\.1\.0 aborted \(signal 6\) "
                    r"converting pd_op\.mean \(in MeanOverAllAxes\): Can not get input 'axis\(dim\)' value",
                    outs[0]), outs[0]
    assert re.match(r"error: cannot export program 'model' to ONNX: paddle2onnx 2\.1\.0 has no ONNX converter for "
                    r"pd_op\.nms \(in BoxNMS\)$", outs[1]), outs[1]

    cfg = config.load(ATTENTION_LSTM_DEMO)
    paddle.seed(0)
    model = builder.build_model(cfg["model"])
    freeze = lambda: subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True,  # noqa: E731
                                    text=True, check=True).stdout
    before = freeze()
    export.export(model, cfg, str(tmp_path / "al"), fmt="onnx")
    assert freeze() == before        # nothing installed by the export (polygraphy would add onnx_graphsurgeon)
    export.export(model, cfg, str(tmp_path / "al_paddle"))
    assert sorted(os.listdir(tmp_path / "al")) == ["infer_cfg.yml", "model.onnx"]   # no intermediate files left
    broken = {}
    for case in ("missing", "corrupt", "opset", "version"):
        broken[case] = tmp_path / case
        shutil.copytree(tmp_path / "al", broken[case])
    os.remove(broken["missing"] / "model.onnx")
    (broken["corrupt"] / "model.onnx").write_bytes((tmp_path / "al" / "model.onnx").read_bytes()[:5000])
    for case, old, new in (("opset", "opset: 16", "opset: 13"),
                           ("version", "zoo_export_version: 1", "zoo_export_version: 2")):
        text = (broken[case] / "infer_cfg.yml").read_text()
        assert old in text
        (broken[case] / "infer_cfg.yml").write_text(text.replace(old, new))
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    hidden = tmp_path / "no_onnx"          # an environment without the ONNX packages: importing them fails
    for module in ("onnx", "onnxruntime", "paddle2onnx"):
        (hidden / module).mkdir(parents=True)
        (hidden / module / "__init__.py").write_text(f"raise ImportError('no module named {module}')\n")
    infer = lambda w, backend="onnxruntime": ("infer", [  # noqa: E731
        "-c", ATTENTION_LSTM_DEMO, "--backend", backend, "--weights", w, "--input", shard,
        "--output", tmp_path / "o"], None)
    runs = [infer(broken["missing"]), infer(broken["corrupt"]), infer(broken["opset"]), infer(broken["version"]),
            infer(tmp_path / "al_paddle"), infer(tmp_path / "al", backend="inference")]
    results = tools_in_one_process(runs)
    without = dict(ENV, PYTHONPATH=str(hidden))
    runs += [("export", ["-c", ATTENTION_LSTM_DEMO, "--format", "onnx", "--output", tmp_path / "x"], None),
             infer(tmp_path / "al")]
    for name, argv, _ in runs[-2:]:
        proc = tool(name, *argv, check=False, env=without)
        results.append({"code": proc.returncode, "stderr": proc.stderr})
    expected = [r"model\.onnx is missing \(an incomplete export\)",
                r"model\.onnx: not a model ONNX Runtime can load \(.+\)",
                r"infer_cfg\.yml: ONNX opset 13, this code reads opset 16; export the model again",
                r"infer_cfg\.yml: export format version 2, this code reads version 1",
                r"holds an export of --format paddle, which --backend inference runs; for --backend onnxruntime "
                r"export with tools/export\.py --format onnx",
                r"holds an export of --format onnx, which --backend onnxruntime or openvino runs; for --backend inference",
                r"--format onnx needs onnx, onnxruntime, paddle2onnx: pip install -r requirements-onnx\.txt$",
                r"--backend onnxruntime needs onnx, onnxruntime, paddle2onnx: pip install -r requirements-onnx\.txt$"]
    for result, pattern, run in zip(results, expected, runs):
        line = one_error_line(result)
        assert line and re.search(pattern, line), (run[1], result)
