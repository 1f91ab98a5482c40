"""docs/own-data.md runs as written: every block of the page, on data generated in its layout.

The page has one `## ` section per format. In each: a ```text title="data/<name>"``` tree, a ```yaml
title="configs/my/<name>.yaml"``` config and ```bash``` blocks of commands. For each section this test
writes the format's files (real mp4 videos, JPEG frames, TFRecords, pkl, COCO JSON, PNG masks, text +
a sentencepiece model trained on it, TSV) into a working folder laid out as the repository (its code
and configs/ linked in, data/ and output/ its own), writes the config where its title says, runs every
command of the section there as a user types it, with only tiny-model / few-step `-o` overrides
appended to the tools (the page's commands stay as typed), and checks that each one exited 0 and wrote
what it should; then that every path of the tree exists. A block outside a known section, or a
section without a generator here, fails the test: nothing on the page goes unrun.

The commands of one section run in one helper process (paddle imported once), one section at a time.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from data import demo_bert, demo_coco, demo_kinetics, demo_segmentation, demo_translation, demo_youtube8m
from tests.helpers import ENV, ROOT

PAGE = os.path.join(ROOT, "docs", "own-data.md")
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
TITLE = re.compile(r'title="([^"]+)"')

# -------------------------------------------------------------------------------- the page


def page_sections():
    """{config name: {"title", "tree": (root, body), "config": (path, body), "commands": [str]}}, and the
    blocks that belong to no section, in page order."""
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    sections, stray = {}, [b.group(0) for b in BLOCK.finditer(parts[0])]
    for heading, body in zip(parts[1::2], parts[2::2]):
        blocks = [(m.group(1), (TITLE.search(m.group(2)) or [None, None])[1], m.group(3)) for m in BLOCK.finditer(body)]
        configs = [title for lang, title, _ in blocks if lang == "yaml" and title]
        if not blocks:   # prose only
            continue
        if len(configs) != 1:
            stray += [f"section '{heading}': {len(configs)} titled yaml configs"]
            continue
        name = os.path.splitext(os.path.basename(configs[0]))[0]
        sec = {"title": heading, "tree": None, "config": None, "commands": []}
        for lang, title, body_ in blocks:
            if lang == "yaml" and title:
                sec["config"] = (title, body_)
            elif lang == "text" and title and sec["tree"] is None:
                sec["tree"] = (title, body_)
            elif lang == "bash":
                sec["commands"] += [c for c in body_.replace("\\\n", " ").splitlines() if c.strip()]
            else:
                stray.append(f"section '{heading}': a ```{lang} {title or ''}``` block this test does not run")
        sections[name] = sec
    return sections, stray


def tree_paths(root, body):
    """The paths a ├──/└── tree names, relative to the working folder (folders end in '/')."""
    lines = [ln for ln in body.splitlines() if ln.strip()]
    assert lines[0].rstrip("/") == root.rstrip("/"), (lines[0], root)
    stack, out = [root.rstrip("/")], []
    for ln in lines[1:]:
        pos = min(i for i in (ln.find("├"), ln.find("└")) if i >= 0)
        depth = pos // 4 + 1
        name = ln[pos + 4:].strip()
        stack = stack[:depth] + [name.rstrip("/")]
        out.append("/".join(stack) + ("/" if name.endswith("/") else ""))
    return out


SECTIONS, STRAY = page_sections()

# -------------------------------------------------------------------------------- the data


def _write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


VIDEO_CLASSES = ["jump", "run", "wave"]


def make_videos(work, tmp):
    """data/my_videos/videos/<class>/clip_NNNN.mp4: 4 real mp4 videos a class (the page's prepare
    command writes the lists)."""
    folder = os.path.join(work, "data", "my_videos", "videos")
    names = {"jump": [1, 2, 5, 6], "run": [3, 7, 8, 9], "wave": [4, 10, 11, 12]}
    for label, cls in enumerate(VIDEO_CLASSES):
        os.makedirs(os.path.join(folder, cls))
        for n in names[cls]:
            frames = demo_kinetics.appearance_video(label, np.random.default_rng(n), num_frames=16)
            demo_kinetics.write_video(os.path.join(folder, cls, f"clip_{n:04d}.mp4"), frames, "mp4v")


def make_frames(work, tmp):
    """data/my_frames: 9 videos as JPEG frame folders (16 frames), 6 train / 3 val, `folder n label` lines."""
    root = os.path.join(work, "data", "my_frames")
    rows = {"train": [], "val": []}
    for i in range(9):
        label, name = i % 3, f"clip_{i + 1:04d}"
        frames = demo_kinetics.appearance_video(label, np.random.default_rng(100 + i), num_frames=16)
        os.makedirs(os.path.join(root, "frames", name))
        for t, frame in enumerate(frames, 1):
            cv2.imwrite(os.path.join(root, "frames", name, f"img_{t:05d}.jpg"), frame[:, :, ::-1])
        # the last training video without its frame count (`folder label`: the reader counts them)
        rows["val" if i >= 6 else "train"].append(f"frames/{name} {len(frames)} {label}" if i != 5 else
                                                  f"frames/{name} {label}")
    for split, lines in rows.items():
        _write_lines(os.path.join(root, f"{split}.list"), lines)
    _write_lines(os.path.join(root, "label_names.txt"), VIDEO_CLASSES)


def _yt8m(work, tmp, fmt, name):
    """YouTube-8M shards (the demo generator's, 4 classes, 10-30 frames) in the page's layout."""
    gen = demo_youtube8m.make(os.path.join(tmp, "yt8m_gen"), num_train=16, num_val=8, num_classes=4,
                              max_frames=30, train_shards=2, val_shards=1)
    root = os.path.join(work, "data", name)
    os.makedirs(os.path.join(root, "train"))
    os.makedirs(os.path.join(root, "val"))
    for i in range(2):
        shutil.copy(os.path.join(gen, fmt, f"train{i:04d}.{fmt}"), os.path.join(root, "train", f"train{i:04d}.{fmt}"))
    shutil.copy(os.path.join(gen, fmt, f"validate0000.{fmt}"), os.path.join(root, "val", f"val0000.{fmt}"))
    shutil.copy(os.path.join(gen, "label_names.txt"), root)


def make_yt8m(work, tmp):
    _yt8m(work, tmp, "tfrecord", "my_yt8m")


def make_pkl(work, tmp):
    _yt8m(work, tmp, "pkl", "my_pkl")


def make_coco(work, tmp):
    """data/my_coco: the COCO demo's images and JSON (4 categories, ids 1/3/7/12, polygons + RLE,
    crowd regions), images as JPEG named a.jpg, b.jpg, ... as the page's tree."""
    root = os.path.join(work, "data", "my_coco")
    os.makedirs(os.path.join(root, "annotations"))
    rng = np.random.default_rng(0)
    for split, num, first, named in (("train2017", 8, 1, ["a", "b"]), ("val2017", 3, 1001, ["c"])):
        names = iter(named + [f"{split}_{i:04d}" for i in range(num)])
        demo_coco.write_split(root, split, num, rng, first)
        ann = os.path.join(root, "annotations", f"instances_{split}.json")
        with open(ann) as f:
            coco = json.load(f)
        for image in coco["images"]:
            png = os.path.join(root, split, image["file_name"])
            image["file_name"] = next(names) + ".jpg"
            cv2.imwrite(os.path.join(root, split, image["file_name"]), cv2.imread(png), [cv2.IMWRITE_JPEG_QUALITY, 95])
            os.remove(png)
        with open(ann, "w") as f:
            json.dump(coco, f)


def make_seg(work, tmp):
    """data/my_seg: JPEG images and single-channel PNG masks (0..4, 255 on outlines), `image label` lists."""
    root = os.path.join(work, "data", "my_seg")
    os.makedirs(os.path.join(root, "images"))
    os.makedirs(os.path.join(root, "labels"))
    rng = np.random.default_rng(0)
    rows = {"train": [], "val": []}
    for i, name in enumerate(["a", "b", "c", "d", "e", "f", "g", "h"]):
        img, label = demo_segmentation.make_image(rng)
        cv2.imwrite(os.path.join(root, "images", name + ".jpg"), img[:, :, ::-1])
        Image.fromarray(label, mode="L").save(os.path.join(root, "labels", name + ".png"))
        rows["val" if i >= 6 else "train"].append(f"images/{name}.jpg labels/{name}.png")
    for split, lines in rows.items():
        _write_lines(os.path.join(root, f"{split}.list"), lines)
    _write_lines(os.path.join(root, "label_names.txt"), demo_segmentation.CLASSES)


def make_mt(work, tmp):
    """data/my_mt: the translation demo's grammar, 400 / 8 / 4 sentence pairs (the page's spm command
    trains the sentencepiece model)."""
    root = os.path.join(work, "data", "my_mt")
    lex, rng = demo_translation.lexicon(0), np.random.default_rng(0)
    for split, n in (("train", 400), ("valid", 8), ("test", 4)):
        pairs = [demo_translation.sentence(rng, lex)[:2] for _ in range(n)]
        _write_lines(os.path.join(root, f"{split}.en"), [p[0] for p in pairs])
        _write_lines(os.path.join(root, f"{split}.de"), [p[1] for p in pairs])


def make_corpus(work, tmp):
    """data/my_corpus: the BERT demo's grammar documents (blank lines between them) and its vocab."""
    root = os.path.join(work, "data", "my_corpus")
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 6)):
        docs = demo_bert._documents(rng, n)
        _write_lines(os.path.join(root, f"{split}.txt"), [line for d in docs for line in d + [""]][:-1])
    _write_lines(os.path.join(root, "vocab.txt"), demo_bert.vocabulary())


def make_glue(work, tmp):
    """data/my_glue: RTE-layout TSV files of the BERT demo's pair task, and its vocab."""
    root = os.path.join(work, "data", "my_glue")
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("dev", 8), ("test", 4)):
        rows = demo_bert._pairs(rng, n)
        header = "index\tsentence1\tsentence2" + ("" if split == "test" else "\tlabel")
        _write_lines(os.path.join(root, f"{split}.tsv"),
                     [header] + ["\t".join(map(str, r if split != "test" else r[:3])) for r in rows])
    _write_lines(os.path.join(root, "vocab.txt"), demo_bert.vocabulary())


# -------------------------------------------------------------------------------- small and fast

_TSN = ["model.backbone.depth=18", "train.pretrained=null", "train.epochs=1"] + [
    f"reader.{s}.{k}" for s in ("train", "val", "test")
    for k in ("batch_size=3", "num_workers=0", "transforms.0.short_size=64", "transforms.1.size=56")] + [
    "reader.test.num_seg=2"]
_BERT = ["model.size=tiny", f"model.vocab_size={len(demo_bert.vocabulary())}", "model.hidden_size=16",
         "model.num_attention_heads=2", "model.max_position_embeddings=64"]
_MT_VOCAB = 160
# what the test appends to each tool command of a section (`-o` ...): the model shrunk (the same for
# train, eval, infer and export, so the weights fit), one epoch or two steps, small inputs, no workers
OVERRIDES = {
    "my_videos": _TSN,
    "my_frames": _TSN,
    "my_yt8m": ["model.embedding_size=8", "model.lstm_size=8", "model.fc_sizes=[16,8]", "train.epochs=1",
                "reader.train.batch_size=4", "reader.train.num_workers=0", "reader.val.batch_size=4",
                "reader.val.num_workers=0"],
    "my_pkl": ["model.cluster_nums=[2,2]", "model.fc_sizes=[16,8]", "model.seg_num=10", "train.epochs=1",
               "reader.train.transforms.0.num_frames=10", "reader.val.transforms.0.num_frames=10",
               "reader.train.batch_size=4", "reader.train.num_workers=0", "reader.val.batch_size=4",
               "reader.val.num_workers=0"],
    "my_coco": ["model.backbone.depth=18", "model.backbone.base_channels=8", "model.backbone.frozen_stages=-1",
                "model.backbone.freeze_norm=false", "model.fpn_channels=16", "model.rpn.batch_size_per_image=32",
                "model.rpn.train_pre_nms_top_n=100", "model.rpn.train_post_nms_top_n=50",
                "model.rpn.test_pre_nms_top_n=50", "model.rpn.test_post_nms_top_n=50",
                "model.roi.batch_size_per_image=32", "model.box_fc=32", "model.mask_convs=1", "model.mask_channels=16",
                "model.test.max_per_image=10", "train.pretrained=null", "train.epochs=1", "reader.train.batch_size=2",
                "reader.train.num_workers=0", "reader.val.num_workers=0", "reader.train.transforms.0.short_sizes=[96]",
                "reader.train.transforms.0.max_size=160", "reader.val.transforms.0.short_sizes=[96]",
                "reader.val.transforms.0.max_size=160"],
    "my_seg": ["model.backbone.depth=18", "model.backbone.variant=b", "model.backbone.output_stride=16",
               "model.backbone.multi_grid=[1,2]", "model.aspp_ratios=null", "model.aspp_channels=16",
               "train.pretrained=null", "train.max_steps=2", "reader.train.batch_size=2",
               "reader.train.num_workers=0", "reader.val.num_workers=0", "reader.train.transforms.1.crop_size=[64,64]"],
    "my_mt": [f"model.src_vocab_size={_MT_VOCAB}", f"model.trg_vocab_size={_MT_VOCAB}", "model.d_model=16",
              "model.d_inner_hid=32", "model.n_head=2", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
              "model.max_out_len=16", "model.beam_size=2", "train.epochs=1", "reader.train.num_workers=0"],
    "my_corpus": _BERT + ["train.max_steps=2", "reader.train.batch_size=8", "reader.train.num_workers=0",
                          "reader.val.batch_size=16", "reader.train.max_seq_length=48",
                          "reader.val.max_seq_length=48", "reader.train.max_predictions_per_seq=8",
                          "reader.val.max_predictions_per_seq=8"],
    "my_glue": _BERT + ["train.pretrained=null", "train.epochs=1", "reader.train.batch_size=8",
                        "reader.train.num_workers=0"] + [f"reader.{s}.max_seq_length=48" for s in ("train", "val", "test")],
}
# a data-preparation command's arguments the test changes: a vocabulary the few generated lines can fill
REWRITES = {"my_mt": [("--vocab-size 8000", f"--vocab-size {_MT_VOCAB}")]}
GENERATORS = {"my_videos": make_videos, "my_frames": make_frames, "my_yt8m": make_yt8m, "my_pkl": make_pkl,
              "my_coco": make_coco, "my_seg": make_seg, "my_mt": make_mt, "my_corpus": make_corpus,
              "my_glue": make_glue}

# -------------------------------------------------------------------------------- running

_DRIVER = r"""
import contextlib, io, json, os, runpy, sys
sys.path.insert(0, "tools")
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv = argv
    err, std, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # noqa: BLE001 - reported as the command's failure
            import traceback
            err.write(traceback.format_exc())
            code = 1
    out.append({"code": code or 0, "stdout": std.getvalue()[-3000:], "stderr": err.getvalue()[-3000:]})
    if code:
        break
print(json.dumps(out))
"""


def working_folder(tmp):
    """A folder laid out as the repository: its code and configs/ linked in; data/ (with the scripts)
    and output/ its own; configs/my/ for the user's configs."""
    work = os.path.join(tmp, "work")
    os.makedirs(os.path.join(work, "configs", "my"))
    os.makedirs(os.path.join(work, "data"))
    for name in os.listdir(ROOT):
        if not name.startswith(".") and name not in ("data", "output", "configs", "log"):
            os.symlink(os.path.join(ROOT, name), os.path.join(work, name))
    for name in os.listdir(os.path.join(ROOT, "configs")):
        os.symlink(os.path.join(ROOT, "configs", name), os.path.join(work, "configs", name))
    for name in os.listdir(os.path.join(ROOT, "data")):
        if name.endswith(".py"):
            os.symlink(os.path.join(ROOT, "data", name), os.path.join(work, "data", name))
    return work


def _flag(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def planned(name, command):
    """(argv to run, what it must write: a list of paths relative to the working folder)."""
    for old, new in REWRITES.get(name, []):
        command = command.replace(old, new)
    argv = shlex.split(command)
    assert argv[0] == "python" and len(argv) > 1, f"not a `python SCRIPT ...` command: {command}"
    argv = argv[1:]
    script = argv[0]
    if not script.startswith("tools/"):
        return argv, []
    tool = os.path.splitext(os.path.basename(script))[0]
    config, weights, output = _flag(argv, "-c"), _flag(argv, "--weights"), _flag(argv, "--output")
    if config:
        assert config == f"configs/my/{name}.yaml", f"{command}: another section's config"
        argv += ["-o", *OVERRIDES[name]]
    if tool == "train":
        out = output or f"output/{name}"
        return argv, [f"{out}/final/model.pdparams", f"{out}/metrics.json", f"{out}/config.yaml"]
    run = weights.rsplit("/", 1)[0] if weights else None
    if tool == "eval":
        return argv, [f"{output or run + '/eval'}/metrics.json"]
    if tool == "infer":
        return argv, [(output or run + "/infer") + "/"]
    if tool == "export":
        return argv, [f"{output}/infer_cfg.yml"]
    raise AssertionError(f"{command}: a tool this test has no check for")


# what the page's config sets for the data: the overrides never change these
DATA_KEYS = ("list_file", "files", "ann_file", "image_dir", "data_dir", "vocab_file", "spm_model", "src_file", "tgt_file",
             "label_names", "labels", "num_classes", "format")


def _inputs(work, argv):
    """The files an infer command's --input names (folders searched recursively)."""
    found = []
    for path in argv[argv.index("--input") + 1:]:
        if path.startswith("-"):
            break
        full = os.path.join(work, path)
        found += [full] if os.path.isfile(full) else [os.path.join(d, f) for d, _, fs in os.walk(full) for f in fs]
    return found


def check_infer(work, name, argv, out):
    """What tools/infer.py wrote answers each input, in the format's terms (class names of the data)."""
    files, inputs = os.listdir(out), _inputs(work, argv)
    names_file = os.path.join(work, "data", name, "label_names.txt")
    if "predictions.json" in files:   # classification: top-k with the data's class names
        with open(os.path.join(out, "predictions.json")) as f:
            preds = json.load(f)
        with open(names_file) as f:
            names = f.read().split()
        assert preds and {t["label"] for p in preds for t in p["top_k"]} <= set(names), preds[:1]
        if name in ("my_videos", "my_frames"):   # one per video file / frame folder
            videos = {os.path.dirname(i) if name == "my_frames" else i for i in inputs}
            assert len(preds) == len(videos), (len(preds), len(videos))
    elif "detections.json" in files:
        with open(os.path.join(out, "detections.json")) as f:
            dets = json.load(f)
        with open(os.path.join(work, "data", name, "annotations", "instances_val2017.json")) as f:
            cats = {c["name"] for c in json.load(f)["categories"]}
        assert {d["label"] for d in dets} <= cats, dets[:1]
    elif "translations.txt" in files:
        with open(os.path.join(out, "translations.txt")) as f, open(inputs[0]) as g:
            assert len(f.read().splitlines()) == len(g.read().splitlines())
    elif name == "my_seg":   # a label PNG and an overlay per image
        for image in inputs:
            stem = os.path.splitext(os.path.basename(image))[0]
            assert {stem + ".png", stem + "_overlay.png"} <= set(files), (stem, files)
    elif name == "my_glue":
        with open(os.path.join(out, "RTE.tsv")) as f, open(inputs[0]) as g:
            assert len(f.read().splitlines()) == len(g.read().splitlines())
    else:
        assert files, out


def _dotted(tree, prefix=""):
    if not isinstance(tree, dict):
        return [prefix[:-1]]
    return [k for key, v in tree.items() for k in _dotted(v, f"{prefix}{key}.")]


def test_the_overrides_leave_the_pages_data_settings_alone():
    """The test shrinks models and runs; the data paths, formats and class counts are the page's."""
    for name, sec in SECTIONS.items():
        page_keys = {k for k in _dotted(yaml.safe_load(sec["config"][1])) if k.split(".")[-1] in DATA_KEYS}
        touched = {o.split("=")[0] for o in OVERRIDES[name]} & page_keys
        assert not touched, (name, touched)


def test_every_block_of_the_page_is_run():
    assert not STRAY, STRAY
    assert set(SECTIONS) == set(GENERATORS), (sorted(SECTIONS), sorted(GENERATORS))
    for name, sec in SECTIONS.items():
        assert sec["tree"] and sec["tree"][0] == f"data/{name}", (name, sec["tree"] and sec["tree"][0])
        assert sec["config"][0] == f"configs/my/{name}.yaml", sec["config"][0]
        tools = [shlex.split(c)[1] for c in sec["commands"]]
        assert "tools/train.py" in tools and "tools/eval.py" in tools and "tools/infer.py" in tools, (name, tools)


# the names the page gives the recipe folders' families
FAMILIES = {"tsn": "TSN", "stnet": "StNet", "deeplabv3": "DeepLabV3", "mask_rcnn": "Mask R-CNN",
            "attention_lstm": "AttentionLSTM", "nextvlad": "NeXtVLAD", "attention_cluster": "Attention Cluster"}


def test_the_page_says_which_recipes_drop_the_last_partial_batch():
    """The conventions' drop_last sentences against the video and vision recipes as they resolve (the
    demos, which set it for their tiny sets, aside): each family in the sentence that fits it."""
    from engine import config
    import glob
    dropping = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "video", "*", "*.yaml"))
                       + glob.glob(os.path.join(ROOT, "configs", "vision", "*", "*.yaml"))):
        if path.endswith("_demo.yaml"):
            continue
        family = FAMILIES[os.path.basename(os.path.dirname(path))]
        drops = bool(config.load(path, validate_config=False)["reader"]["train"].get("drop_last", False))
        assert dropping.setdefault(family, drops) == drops, f"{family}: its recipes disagree on drop_last"
    with open(PAGE, encoding="utf-8") as f:
        text = " ".join(f.read().split())
    bullet = text[text.index("- Batch sizes are per card."):text.index("Change any value on the command line")]
    drop = next(s for s in bullet.split(". ") if "drop the last partial batch" in s)
    keep = next(s for s in bullet.split(". ") if "keep it" in s)
    assert {f for f in FAMILIES.values() if f in drop} == {f for f, d in dropping.items() if d}, drop
    assert {f for f in FAMILIES.values() if f in keep} == {f for f, d in dropping.items() if not d}, keep


@pytest.mark.parametrize("name", list(SECTIONS))
def test_section_runs_on_its_format(name, tmp_path):
    sec = SECTIONS[name]
    t0 = time.time()
    work = working_folder(str(tmp_path))
    GENERATORS[name](work, str(tmp_path))
    path, body = sec["config"]
    with open(os.path.join(work, path), "w", encoding="utf-8") as f:
        f.write(body)
    plans = [planned(name, c) for c in sec["commands"]]
    made = time.time()
    # data preparation first, each in its own process (a script may write to its real stderr); then
    # the tools together in one
    prep = [p for p, _ in plans if not p[0].startswith("tools/")]
    assert [p for p, _ in plans[:len(prep)]] == prep, "a data-preparation command after a tool command"
    results = []
    for argv in prep:
        proc = subprocess.run([sys.executable, *argv], cwd=work, capture_output=True, text=True, timeout=300, env=ENV)
        results.append({"code": proc.returncode, "stdout": proc.stdout[-3000:], "stderr": proc.stderr[-3000:]})
        if proc.returncode:
            break
    else:
        tools = [p for p, _ in plans[len(prep):]]
        proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(tools)], cwd=work,
                              capture_output=True, text=True, timeout=900, env=ENV)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results += json.loads(proc.stdout.strip().splitlines()[-1])
    for (argv, expected), command, r in zip(plans, sec["commands"], results):
        assert r["code"] == 0, f"`{command}` failed ({r['code']}):\n{r['stdout']}\n{r['stderr']}"
        for p in expected:
            full = os.path.join(work, p)
            ok = os.path.isdir(full) and os.listdir(full) if p.endswith("/") else os.path.isfile(full)
            assert ok, f"`{command}` did not write {p}:\n{r['stdout']}\n{r['stderr']}"
    assert len(results) == len(plans), "a command did not run"
    for argv, expected in plans:
        if argv[0] == "tools/infer.py":
            check_infer(work, name, argv, os.path.join(work, expected[0]))
    for argv, expected in plans:   # training and evaluation read every sample of the format
        for p in expected:
            if p.endswith("metrics.json"):
                with open(os.path.join(work, p)) as f:
                    metrics = json.load(f)
                assert metrics["num_samples"] > 0 and metrics["num_skipped"] == 0, (p, metrics)
    missing = [p for p in tree_paths(*sec["tree"]) if not os.path.exists(os.path.join(work, p))]
    assert not missing, f"the page's tree names paths the format's data lacks: {missing}"
    print(f"\n{name}: data {made - t0:.1f} s, commands {time.time() - made:.1f} s")
