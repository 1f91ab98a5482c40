"""Every file the docs and the ops/ comments point at is in the project.

Checked: README.md, CHANGELOG.md and docs/**/*.md (their relative Markdown links `[..](path#anchor)`
resolve to a file or folder next to the document, and every project path they mention exists), and the
comments and docstrings of ops/*.py and ops/csrc/* (every project path they mention exists).

A path mention is a token of path characters with a "/" whose first part is a top-level entry of the
repository (`engine/data.py`, `tools/`), or one ending in a known extension (`tsn_demo.yaml`,
`reference/platform.md`, `DESIGN.md`). It resolves against the document's folder, then the repository
root; a bare file name also matches a file of that name anywhere in the project. Not checked:
URLs, placeholders (`<model>`, `*`, `{..}`, `$VAR`, `...`, upper-case words such as DIR/NAME/CONFIG,
except in a Markdown file's name), command-line flags, absolute paths, and the allow-lists below.
"""
import glob
import io
import os
import re
import tokenize

from tests.helpers import ROOT

EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".txt", ".cc", ".h", ".json")

# Paths under these are written by runs or placed by the user, never part of the project (git-ignored).
GENERATED_PREFIXES = (
    "output/",  # the tools' default output folders (output/<config name>/)
    "log/",     # paddle.distributed.launch's worker logs
)
# data/<folder>/...: a dataset the user places or data/make_demo.py writes (.gitignore: data/*/); only
# the scripts at data/'s top level are in the project. Checked in _allowed.

# Other projects' source paths, quoted as where something comes from (not files of ours).
UPSTREAM_PREFIXES = (
    "paddle/", "python/paddle/",      # Paddle's source tree and the wheel's C++ headers
    "oneapi/",                         # oneDNN's headers
    "paddlenlp/", "model_zoo/", "examples/",   # PaddleNLP's package and repository folders
    "ppdet/",                          # PaddleDetection's package
    "fluid/",                          # PaddlePaddle/models v1.x (fluid/PaddleCV/video/...)
    "docs/en/",                        # PaddleVideo's model-zoo pages (we have no docs/en/)
    "configs/deeplabv3/", "configs/mask_rcnn/",   # PaddleSeg's, PaddleDetection's (ours: configs/vision/)
)

# File names (and one dataset-relative path) that are not files of ours, by kind.
ALLOWED_NAMES = {
    # written by the tools into a run's or an export's folder
    "config.yaml", "metrics.json", "model.json", "infer_cfg.yml", "predictions.json", "translations.txt",
    "bbox.json", "segm.json", "detections.json",
    "report.md", "report.json", "confusion.json", "scalars.jsonl",   # tools/eval.py --report, the trainer
    "gpu_check.json",                                                # tools/gpu_check.py "gpu_check.json",
    # files of a dataset or of a Hugging Face weights folder the user provides
    "instances_train2017.json", "instances_val2017.json", "label_names.txt", "kinetics400_label.txt",
    "train.txt", "val.txt", "vocab.txt", "config.json",
    "ImageSets/Segmentation/aug.txt",   # inside the VOC folder (README: data/prepare_voc_sbd.py writes it)
    # other projects' scripts (PaddleVideo, google-research/bert, PaddleNLP's transformer example)
    "tf2pkl.py", "create_pretraining_data.py", "predict.py",
}

# The user's own recipes (docs/own-data.md): written by the user under configs/my/, their `_base_`
# paths (../<domain>/<model>/x.yaml) relative to that folder.
USER_CONFIGS = "configs/my/"

# Files a worked example asks the reader to imagine or write; they do not exist on purpose.
EXAMPLES = {
    "my_models.py",               # docs/contributing.md: the user's own module of its example
    "models/video/mean_pool.py",  # docs/contributing.md: where that example would live in the tree
    "name.json",                  # docs/contributing.md: a program `name`'s file in an export
    "configs/x.yaml",             # README.md: a config path inside a quoted error message
    "configs/nope.yaml",          # docs/troubleshooting.md: the missing recipe of a real error line
    "data/nope.list",             # docs/troubleshooting.md: the missing list file of a real error line
    # docs/configs.md: the _base_ line of a quoted recipe, relative to configs/video/tsn/
    "../../_base_/runtime.yaml", "../../_base_/kinetics400.yaml",
}

LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+|\bmailto:\S+|\bwww\.\S+")
TOKEN = re.compile(r"[\w.\-/~$<>*{}]+")
PLACEHOLDER_CHARS = set("<>*{}$~")
UPPER_WORD = re.compile(r"[A-Z][A-Z0-9_]*")


def documents():
    docs = [os.path.join(ROOT, name) for name in ("README.md", "CHANGELOG.md")]
    docs += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [d for d in docs if os.path.isfile(d)]


def op_sources():
    files = glob.glob(os.path.join(ROOT, "ops", "*.py")) + glob.glob(os.path.join(ROOT, "ops", "csrc", "*"))
    files.sort()
    return [f for f in files if os.path.isfile(f)]


def comment_lines(path):
    """[(line number, text)]: the comments and string literals (docstrings) of a Python file, the
    comments of a C/C++ one, each line at its own number."""
    text = open(path, encoding="utf-8").read()
    if path.endswith(".py"):
        kinds = (tokenize.COMMENT, tokenize.STRING)
        pieces = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
                  if t.type in kinds]
    else:
        pieces = [(text.count("\n", 0, m.start()) + 1, m.group(0))
                  for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S)]
    return [(first + i, line) for first, piece in pieces for i, line in enumerate(piece.split("\n"))]


def _project_names():
    """The file names in the project: what git would track (no hidden, output, log or cache folders,
    and of data/ only its scripts, as .gitignore keeps data/*/ out)."""
    names = set()
    skip = {"output", "log", "profiler_log", "__pycache__"}
    for folder, dirs, files in os.walk(ROOT):
        if folder == os.path.join(ROOT, "data"):
            dirs[:] = []
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip]
        names.update(files)
    return names


def _top_level():
    return {n for n in os.listdir(ROOT) if not n.startswith(".")}


def _placeholder(token):
    if PLACEHOLDER_CHARS & set(token) or "..." in token or token.startswith(("-", "/")):
        return True
    for part in token.split("/"):
        if part.endswith(".md"):
            continue   # README.md, DESIGN.md: Markdown files are named in capitals
        stem = part[:part.rindex(".")] if part.endswith(EXTENSIONS) else part
        if any(UPPER_WORD.fullmatch(word) for word in stem.split(".")):   # DIR, NAME.json, helpers.ATTR
            return True
    return False


def _allowed(path):
    if path in EXAMPLES or path in ALLOWED_NAMES:
        return True
    if path.startswith(GENERATED_PREFIXES + UPSTREAM_PREFIXES + (USER_CONFIGS,)):
        return True
    parts = path.rstrip("/").split("/")
    # under data/, a folder (data/coco, data/youtube8m_demo/pkl/) is a dataset; a file is one of our scripts
    if parts[0] != "data" or len(parts) == 1:
        return False
    return len(parts) > 2 or path.endswith("/") or "." not in parts[1]


def _exists(path, folder, names):
    bare = "/" not in path.rstrip("/")
    return (os.path.exists(os.path.join(folder, path)) or os.path.exists(os.path.join(ROOT, path))
            or (bare and path in names)
            or (path.startswith("../") and os.path.exists(os.path.normpath(os.path.join(ROOT, USER_CONFIGS, path)))))


def path_mentions(text):
    """The tokens of `text` that name a project path (see the module docstring), in order."""
    top = _top_level()
    found = []
    for m in TOKEN.finditer(URL.sub(" ", text)):
        token = m.group(0).rstrip(".,:;")
        token = token[2:] if token.startswith("./") else token
        if not token or _placeholder(token):
            continue
        if "/" in token.rstrip("/"):
            if token.split("/")[0] in top or token.endswith(EXTENSIONS):
                found.append(token)
        elif token.endswith(EXTENSIONS) and token.partition(".")[0]:
            found.append(token)
    return found


def broken_mentions():
    """[(file relative to ROOT, line number, what)] for every link or path mention that resolves nowhere."""
    names = _project_names()
    broken = []
    for path in documents() + op_sources():
        folder = os.path.dirname(path)
        rel = os.path.relpath(path, ROOT)
        if path.endswith(".md"):
            lines = list(enumerate(open(path, encoding="utf-8").read().split("\n"), 1))
        else:
            lines = comment_lines(path)
        for number, line in lines:
            if path.endswith(".md"):
                for target in LINK.findall(line):
                    if URL.match(target) or target.startswith("#"):
                        continue
                    target = target.split("#")[0]
                    if not os.path.exists(os.path.join(folder, target)):
                        broken.append((rel, number, f"link ({target})"))
            for token in path_mentions(line):
                if not _allowed(token) and not _exists(token, folder, names):
                    broken.append((rel, number, token))
    return broken


def test_every_link_and_path_mention_exists():
    broken = broken_mentions()
    where = "\n".join(f"{f}:{n}: {what}" for f, n, what in broken)
    assert not broken, "files the docs or the ops/ comments name that are not in the project:\n" + where


def test_the_check_finds_what_it_should():
    """The checker itself: a dangling mention, link and bare Markdown name are found; placeholders,
    URLs, outputs, datasets and upstream paths are not."""
    found = path_mentions("Read DESIGN.md and reference/platform.md; `tools/nope.py -c configs/a/b.yaml`")
    assert found == ["DESIGN.md", "reference/platform.md", "tools/nope.py", "configs/a/b.yaml"]
    assert path_mentions("see https://x.org/a/b.md, `output/<config>/config.yaml`, DIR/metrics.json, "
                         "fp16/bf16, --train-csv/--val-csv, ${HOME}/x.py, tests/helpers.BF16_RTOL") == []
    assert path_mentions("NAME.json DIR/x") == []
    for ok in ("output/tsn_demo/final/model.pdparams", "data/youtube8m_demo/tfrecord/", "data/coco",
               "paddle/fluid/operators/x.cc", "python/paddle/nn/layer.py", "metrics.json"):
        assert _allowed(ok), ok
    for bad in ("data/nope.py", "tools/nope.py", "DESIGN.md", "reference/platform.md"):
        assert not _allowed(bad) and not _exists(bad, ROOT, _project_names()), bad
    links = LINK.findall("[a](docs/contributing.md#the-layout) ![i](x.png \"t\")")
    assert links == ["docs/contributing.md#the-layout", "x.png"]
