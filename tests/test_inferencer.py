"""api/inferencer.py: the one home of task-level inference. Its answers are what tools/infer.py writes
(predictions.json, label PNGs, detections.json, the GLUE submission, translations, pretraining scores),
for every demo model, whether an input is given as a file, as uploaded bytes, as an image array or as
text; an unreadable input answers its reason and the others theirs."""
import json
import os
import pathlib

import cv2
import numpy as np
import pytest

from tests.conftest import (ATTENTION_CLUSTER_DEMO, ATTENTION_LSTM_DEMO, BERT_GLUE_DEMO, BERT_PRETRAIN_DEMO,
                            DEEPLAB_DEMO, MASK_RCNN_DEMO, NEXTVLAD_DEMO, STNET_DEMO, TRANSFORMER_DEMO, TSN_DEMO)
from tests.helpers import tools_in_one_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cases(tsn_demo_run, stnet_demo_run, attention_lstm_run, nextvlad_demo_run, attention_cluster_demo_run,
          transformer_demo_run, bert_pretrain_run, bert_glue_run, mask_rcnn_demo_run, deeplab_demo_run,
          kinetics_demo, yt8m_demo, translation_demo, bert_demo, voc_demo, coco_demo, tmp_path_factory):
    """{name: (recipe, weights, inputs, tools/infer.py's output folder)}: the nine models (BERT twice:
    GLUE and pretraining) through tools/infer.py in one process."""
    tmp = tmp_path_factory.mktemp("inferencer")
    red = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    moving = os.path.join(kinetics_demo["motion"], "videos", "val")
    shard = os.path.join(yt8m_demo, "tfrecord", "validate0000.tfrecord")
    src = tmp / "src.en"
    with open(os.path.join(translation_demo, "test.en"), encoding="utf-8") as f:
        src.write_text("\n".join(f.read().splitlines()[:6]) + "\n", encoding="utf-8")
    pairs = tmp / "pairs.tsv"
    with open(os.path.join(bert_demo, "glue", "test.tsv"), encoding="utf-8") as f:
        pairs.write_text("".join(f.readlines()[:9]), encoding="utf-8")
    corpus = tmp / "corpus.txt"
    with open(os.path.join(bert_demo, "corpus", "val.txt"), encoding="utf-8") as f:
        corpus.write_text("".join(f.readlines()[:30]), encoding="utf-8")
    images = [os.path.join(voc_demo, "VOC2012", "JPEGImages", f"val_{i:04d}.jpg") for i in range(2)]
    photos = [os.path.join(ROOT, "data", "coco_demo", "val", f"val_{i:04d}.png") for i in range(2)]
    out = {
        "tsn": (TSN_DEMO, tsn_demo_run, [red]),
        "stnet": (STNET_DEMO, stnet_demo_run, [sorted(os.path.join(moving, d) for d in os.listdir(moving))[0]]),
        "attention_lstm": (ATTENTION_LSTM_DEMO, attention_lstm_run, [shard]),
        "nextvlad": (NEXTVLAD_DEMO, nextvlad_demo_run, [shard]),
        "attention_cluster": (ATTENTION_CLUSTER_DEMO, attention_cluster_demo_run, [shard]),
        "transformer": (TRANSFORMER_DEMO, transformer_demo_run, [str(src)]),
        "bert_pretrain": (BERT_PRETRAIN_DEMO, bert_pretrain_run, [str(corpus)]),
        "bert_glue": (BERT_GLUE_DEMO, bert_glue_run, [str(pairs)]),
        "mask_rcnn": (MASK_RCNN_DEMO, mask_rcnn_demo_run, photos),
        "deeplabv3": (DEEPLAB_DEMO, deeplab_demo_run, images),
    }
    runs = [("infer", ["-c", cfg, "--weights", os.path.join(run, "final", "model.pdparams"), "--input", *inputs,
                       "--output", tmp / name], None) for name, (cfg, run, inputs) in out.items()]
    # one image alone (the single-input tests): a batch of two pads the smaller image, which changes its borders
    runs.append(("infer", ["-c", DEEPLAB_DEMO, "--weights", os.path.join(deeplab_demo_run, "final", "model.pdparams"),
                           "--input", images[0], "--output", tmp / "deeplabv3_one"], None))
    results = tools_in_one_process(runs, timeout=900)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results if r["code"]]
    return {name: (cfg, os.path.join(run, "final", "model.pdparams"), inputs, tmp / name)
            for name, (cfg, run, inputs) in out.items()}


def _inferencer(cases, name, **kwargs):
    from api.inferencer import Inferencer
    cfg, weights, _, _ = cases[name]
    return Inferencer(cfg, weights=weights, **kwargs)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _jsonl(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_answers_are_what_tools_infer_writes_for_all_nine_models(cases):
    """The expected values are the files tools/infer.py wrote (its own process, the recipe's reader)."""
    for name, (cfg, weights, inputs, written) in cases.items():
        result = _inferencer(cases, name).run([pathlib.Path(p) for p in inputs], written / "again")
        answers = result.answers
        assert answers and not result.skipped, name
        if name in ("tsn", "stnet", "attention_lstm", "nextvlad", "attention_cluster"):
            assert answers == json.load(open(written / "predictions.json")), name
            assert _read(written / "again" / "predictions.json") == _read(written / "predictions.json"), name
        elif name == "transformer":
            lines = (written / "translations.txt").read_text(encoding="utf-8").splitlines()
            assert [a["translation"] for a in answers] == lines and len(lines) == 6 and all(lines), name
        elif name == "bert_pretrain":
            assert answers == _jsonl(written / "pretraining_scores.jsonl"), name
        elif name == "bert_glue":
            rows = (written / "RTE.tsv").read_text(encoding="utf-8").splitlines()[1:]
            assert [f"{a['id']}\t{a['prediction']}" for a in answers] == rows and len(rows) == 8, name
        elif name == "mask_rcnn":
            flat = [d for a in answers for d in a["detections"]]
            assert flat == json.load(open(written / "detections.json")) and flat, name
            for a in answers:
                drawn = a["files"]["drawn"]
                assert _read(drawn) == _read(written / os.path.basename(drawn)), name
        elif name == "deeplabv3":
            for path, a in zip(inputs, answers):
                stem = os.path.splitext(os.path.basename(path))[0]
                assert a["id"] == path and a["classes"], a
                assert _read(a["files"]["label"]) == _read(written / f"{stem}.png")
                assert _read(a["files"]["overlay"]) == _read(written / f"{stem}_overlay.png")


def test_values_a_user_holds_answer_as_their_files_do(cases):
    """Bytes of a video and of photos, an image array, sentences and sentence pairs: the answers
    tools/infer.py wrote for the same content as files (PNG bytes identical)."""
    cfg, weights, inputs, written = cases["tsn"]
    video = sorted(os.listdir(inputs[0]))[0]
    upload = (video, _read(os.path.join(inputs[0], video)))
    got = _inferencer(cases, "tsn", workers=0)([upload])
    expected = next(p for p in json.load(open(written / "predictions.json")) if p["id"].endswith(video))
    # one video alone against the folder's batch: the same classes; scores within float32 noise of another batch size
    assert got[0]["id"] == video and [t["class_id"] for t in got[0]["top_k"]] == \
        [t["class_id"] for t in expected["top_k"]], (got, expected)
    assert np.allclose([t["score"] for t in got[0]["top_k"]], [t["score"] for t in expected["top_k"]], atol=1e-5)

    _, _, images, written = cases["deeplabv3"]
    written = written.parent / "deeplabv3_one"
    rgb = cv2.imread(images[0])[:, :, ::-1].copy()
    answer = _inferencer(cases, "deeplabv3")(rgb)[0]
    stem = os.path.splitext(os.path.basename(images[0]))[0]
    assert answer["id"] == "input 0"
    assert answer["files"]["label"] == _read(written / f"{stem}.png")
    assert answer["files"]["overlay"] == _read(written / f"{stem}_overlay.png")

    _, _, photos, written = cases["mask_rcnn"]   # uploads: every path in an answer is the upload's name
    names = {p: f"photo {i}.png" for i, p in enumerate(photos)}
    got = _inferencer(cases, "mask_rcnn")([(names[p], _read(p)) for p in photos])
    flat = [d for a in got for d in a["detections"]]
    assert flat == [dict(d, file=names[d["file"]]) for d in json.load(open(written / "detections.json"))] and flat
    assert "zoo_infer_" not in json.dumps([{k: v for k, v in a.items() if k != "files"} for a in got])   # no scratch path

    _, _, tsv, written = cases["bert_glue"]
    rows = [line.rstrip("\n").split("\t") for line in open(tsv[0], encoding="utf-8")][1:]
    got = _inferencer(cases, "bert_glue")([(r[1], r[2]) for r in rows])   # RTE's test layout: index, a, b
    expected = [line.split("\t")[1] for line in (written / "RTE.tsv").read_text().splitlines()[1:]]
    assert [a["prediction"] for a in got] == expected

    _, _, src, written = cases["transformer"]
    sentences = open(src[0], encoding="utf-8").read().splitlines()
    got = _inferencer(cases, "transformer")(sentences)
    assert [a["translation"] for a in got] == (written / "translations.txt").read_text().splitlines()


def test_an_unreadable_input_answers_its_reason_and_the_others_theirs(cases, tmp_path):
    cfg, weights, inputs, written = cases["tsn"]
    video = sorted(os.listdir(inputs[0]))[0]
    good = (video, _read(os.path.join(inputs[0], video)))
    answers = _inferencer(cases, "tsn", workers=0)([("broken.mp4", b"\x00\x00\x00\x18ftypmp42 not a video"), good])
    assert len(answers) == 2 and "top_k" in answers[1], answers
    assert answers[0]["id"] == "broken.mp4" and answers[0]["error"] and "broken.mp4" in answers[0]["error"], answers
    assert "zoo_infer_" not in answers[0]["error"]          # the temporary path is not what the user gave


def test_bad_arguments_get_one_line(cases):
    from api.inferencer import Inferencer
    from engine.errors import ConfigError
    with pytest.raises(ConfigError, match="neither an export folder, a pretrained entry"):
        Inferencer("no_such_recipe")
    with pytest.raises(ConfigError, match="needs weights"):
        Inferencer(TSN_DEMO)
    glue = _inferencer(cases, "bert_glue")
    with pytest.raises(ConfigError, match=r"GLUE RTE: input 0 must be a pair of sentences"):
        glue(["one sentence"])
    seg = _inferencer(cases, "deeplabv3")
    with pytest.raises(ConfigError, match=r"an image array must be uint8 \[H, W, 3\]"):
        seg(np.zeros((4, 4), np.float32))


def test_the_getting_started_page_runs_on_the_demo_weights(cases, tmp_path):
    """docs/getting-started.md's first two blocks, as a user runs them (a fresh process from the clone's
    folder), with the released entry swapped for the DeepLabV3 demo's recipe and weights (no download
    here) and "my_photo.jpg" for a demo image: the overlay the script saves and the one tools/infer.py
    writes are tools/infer.py's bytes for that image."""
    import subprocess
    import sys
    from tests.helpers import ENV, doc_blocks
    cfg, weights, images, written = cases["deeplabv3"]
    written = written.parent / "deeplabv3_one"
    page = os.path.join(ROOT, "docs", "getting-started.md")
    python = next(b for b in doc_blocks(page, "python") if "Inferencer(" in b)
    shell = next(b for b in doc_blocks(page, "bash") if "tools/infer.py" in b)
    entry = "deeplabv3_r50vd_os8_voc12aug_40k"
    assert python.count(f'"{entry}"') == 1 and shell.count(f"--weights {entry} ") == 1
    script = (python.replace(f'"{entry}"', f'"{cfg}", weights="{weights}"').replace('"my_photo.jpg"', f'"{images[0]}"')
              .replace('"my_photo_overlay.png"', f'"{tmp_path / "overlay.png"}"'))
    env = dict(ENV, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "background" in proc.stdout, proc.stdout
    stem = os.path.splitext(os.path.basename(images[0]))[0]
    assert _read(tmp_path / "overlay.png") == _read(written / f"{stem}_overlay.png")
    command = (shell.strip().replace(".venv/bin/python", sys.executable)
               .replace(f"--weights {entry}", f"-c {cfg} --weights {weights}").replace("my_photo.jpg", images[0])
               .replace("output/my_photo", str(tmp_path / "cli")))
    proc = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _read(tmp_path / "cli" / f"{stem}_overlay.png") == _read(written / f"{stem}_overlay.png")
