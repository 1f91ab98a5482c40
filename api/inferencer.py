"""Task-level inference for any of the nine models: what `tools/infer.py`, the server (tools/serve.py)
and a user's script all call, so the three give one answer for one input.

    from api.inferencer import Inferencer
    tsn = Inferencer("output/tsn_demo/export")              # an export folder of tools/export.py
    tsn = Inferencer("tsn_r50_k400_3seg")                   # a pretrained entry (its recipe, its weights)
    seg = Inferencer("configs/vision/deeplabv3/deeplabv3_demo.yaml", weights="output/demo/final")
    tsn("clip.mp4")[0]["top_k"][0]                          # {"class_id", "label", "score"}
    seg(image_array)[0]["files"]["label"]                   # the label PNG's bytes, as tools/infer.py writes it
    Inferencer("output/glue_demo/export")([("a sentence", "its pair")])[0]["prediction"]

An input is what a user holds: a path (a file or a folder, as tools/infer.py takes it), the bytes of a
file (an upload: `(file_name, bytes)` keeps its name), an image array (H, W, 3 RGB uint8), or, for a
model that reads text, a string (a sentence; a sentence pair as a tuple; for text models a path is a
`pathlib.Path`). Whatever is not a path is written to a temporary file in the reader's own input format
(a PNG, the GLUE task's TSV layout, one line per sentence) and read from there: one reader, one
pre-processing (the recipe's, or what the export recorded) for files and for values alike.

An answer per sample is the recipe's `infer:` writer's (outputs/base.py `answers`): its `id`, the task's
answer (`top_k`, `classes`, `detections`, `prediction`, `translation`), and `files`, the per-sample
files the writer wrote, by role (paths when `output_dir` is given, else their bytes). An input the
reader cannot read answers `{"id", "error"}` with the reader's reason, the other inputs theirs.
"""
import os
import pathlib
import shutil
import tempfile
import types

import numpy as np

from engine.errors import ConfigError, did_you_mean

# file signatures -> the suffix a reader takes the bytes by (a name given with them wins where none matches)
_MAGIC = ((b"\x89PNG", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"BM", ".bmp"), (b"\x1a\x45\xdf\xa3", ".mkv"))


def _suffix(data, name=None):
    if data[:4] == b"RIFF" and data[8:12] in (b"AVI ", b"WEBP"):
        return ".avi" if data[8:12] == b"AVI " else ".webp"
    if data[4:8] == b"ftyp":
        return ".mp4"
    for magic, suffix in _MAGIC:
        if data.startswith(magic):
            return suffix
    return os.path.splitext(str(name or ""))[1][:16] or ".bin"


class Result:
    """One run: `answers` (one per sample, in input order), `lines` (tools/infer.py's printed lines),
    `files` (everything written: per-sample files and the writer's own, e.g. predictions.json),
    `skipped` (samples the reader could not read)."""

    def __init__(self):
        self.answers, self.lines, self.files, self.skipped = [], [], [], 0


class Inferencer:
    """A model ready to answer inputs (module docstring).

    source: an export folder (tools/export.py or tools/quantize.py), a pretrained entry's name, or a
        recipe (file or name, as api.models.create_model takes it) with `weights`.
    weights: for a recipe, a .pdparams file, checkpoint, final/ folder, entry name or URL.
    backend, precision, ov_hint, mkldnn, tensorrt, weights_format: as tools/infer.py's flags.
    overrides: `-o` strings on the recipe (e.g. "infer.top_k=3").
    split: whose pre-processing reads the inputs (default: the recipe's eval split).
    workers: the reader's worker processes (None: the recipe's; a server takes 0).
    """

    def __init__(self, source, weights=None, backend=None, precision=None, ov_hint="LATENCY", mkldnn=True,
                 tensorrt=None, weights_format=None, overrides=(), split=None, batch_size=None, workers=None,
                 trust_weights=False, setup=True):
        from deploy import load  # paddle loads here, never at import
        from engine.session import Session
        if load.is_export(source):
            session, weights = load.from_export(source, overrides, trust_weights), weights or source
        else:
            path, entry_weights = _recipe(source)
            weights = weights or entry_weights
            if not weights:
                raise ConfigError(f"Inferencer: the recipe {source} needs weights (a .pdparams file, a checkpoint, "
                                  f"an entry name or URL)")
            session = Session.from_file(path, overrides, trust_weights)
        self.session, self.weights = session, weights
        self.writer = session.infer_writer()   # checked before the model is built
        if setup:
            session.setup()
        import ops  # after the session's setup (paddle loads with it), never at import
        # what this thread computes with now (runtime.fast_ops): every call enters it, so a call from
        # another thread (a web framework's pool) runs the same kernels (ops/functional.py: threads)
        self.ops_precision = ops.current_precision()
        self.split = split or session.cfg.eval_split()
        self.batch_size, self.workers = batch_size, workers
        args = types.SimpleNamespace(backend=backend, no_mkldnn=not mkldnn, trt=tensorrt, precision=precision,
                                     ov_hint=ov_hint)
        self.model = load.runnable(session, weights, weights_format, args=args)
        self.model.eval()
        self.label_names = session.label_names(required=True)
        self.reader_class = session.reader_class(self.split)

    def __call__(self, inputs):
        """The answers for `inputs` (one input or a list of them), with the per-sample files as bytes."""
        return self.run(inputs).answers

    def run(self, inputs, output_dir=None, batch_size=None, log=None):
        """A Result for `inputs`; the writer's files go to `output_dir` (None: a temporary folder, the
        per-sample files returned as bytes in the answers). `log(line)` gets each line as it is made."""
        items = [inputs] if _single(inputs) else list(inputs)
        if not items:
            raise ConfigError("Inferencer: no inputs")
        scratch = tempfile.mkdtemp(prefix="zoo_infer_")
        try:
            paths, names = self._as_files(items, os.path.join(scratch, "in"))
            out = output_dir or os.path.join(scratch, "out")
            return self._predict(paths, names, out, batch_size, log, keep=output_dir is not None)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _as_files(self, items, folder):
        """(paths for the reader, {temporary path: the name it answers by})."""
        os.makedirs(folder, exist_ok=True)
        texts = hasattr(self.reader_class, "write_texts")
        paths, names, sentences = [], {}, []
        for n, item in enumerate(items):
            if isinstance(item, pathlib.PurePath) or (isinstance(item, str) and not texts):
                paths.append(os.fspath(item))
            elif isinstance(item, (str, tuple, list)) and texts and not _is_upload(item):
                sentences.append(item)
            elif isinstance(item, (bytes, bytearray)) or _is_upload(item):
                name, data = item if _is_upload(item) else (f"input {n}", item)
                path = os.path.join(folder, f"{n}{_suffix(bytes(data[:16]), name)}")
                with open(path, "wb") as f:
                    f.write(data)
                paths.append(path)
                names[path] = str(name)
            elif isinstance(item, np.ndarray):
                paths.append(_write_image(item, os.path.join(folder, f"{n}.png"), n))
                names[paths[-1]] = f"input {n}"
            else:
                raise ConfigError(f"Inferencer: input {n} is a {type(item).__name__}; give a path, the bytes of a "
                                  f"file, an image array" + (" or text" if texts else ""))
        if sentences:
            if paths:
                raise ConfigError("Inferencer: give texts or files in one call, not both")
            kwargs = dict(self.session.reader(self.split)[0])
            kwargs.pop("name", None)
            path = self.reader_class.write_texts(sentences, os.path.join(folder, "texts.txt"), **kwargs)
            paths.append(path)
            names[path] = "text"
        return paths, names

    def _predict(self, paths, names, out, batch_size, log, keep):
        import paddle  # after the session's setup
        from engine import runtime
        from engine.data import empty
        s, writer, result = self.session, self.writer, Result()
        dataset = s.input_dataset(paths, self.split)
        loader, _, _ = s.loader(self.split, dataset=dataset, batch_size=batch_size or self.batch_size,
                                sharded=False, workers=self.workers)
        writer.open(out, dataset, self.label_names)
        by_index = {}
        # eval.amp; an exported program is fp32 (no effect)
        with paddle.no_grad(), runtime.autocast(s.eval_amp, base=self.ops_precision):
            for batch in loader:
                for index, reason in zip(batch["skipped"], batch.get("skip_reasons", [])):
                    by_index[int(index)] = {"id": _named(dataset.describe(index), names), "error": _named(reason, names)}
                result.skipped += batch["num_skipped"]
                if empty(batch):
                    continue
                preds, meta = to_numpy(self.model(batch)), to_numpy(batch)
                meta["id"] = [dataset.describe(i) for i in meta["index"].tolist()]
                first = len(writer.answers)
                for line in writer.write(preds, meta):
                    result.lines.append(line)
                    if log:
                        log(line)
                for index, answer in zip(meta["index"].tolist(), writer.answers[first:]):
                    # a detection's `file` names its input too; a caller must not see our scratch folder
                    renamed = map_strings(answer, lambda text: _named(text, names)) if names else answer
                    by_index[int(index)] = dict(renamed, id=_named(answer.get("id", index), names))
        result.files = writer.close()
        for index in sorted(by_index):
            answer = by_index[index]
            if "files" in answer:
                answer["files"] = {role: path if keep else _read(path) for role, path in answer["files"].items()}
            result.answers.append(answer)
        if result.skipped == len(dataset) and keep:   # files asked for, none written (the reader named each)
            what = "the one input" if len(dataset) == 1 else f"none of the {len(dataset)} inputs"
            raise ConfigError(f"{what} could not be read ({'it is' if len(dataset) == 1 else 'each is'} named "
                              f"above); nothing written")
        return result


def _recipe(source):
    """(recipe path, the weights it implies) of an entry name, a recipe file or a recipe name."""
    # the registries load every component (and paddle): only when an Inferencer is made, never at import
    from api.models import ROOT, recipes
    from engine.components import load_all
    from engine.weights.pretrained import WEIGHTS
    load_all()
    if source in WEIGHTS:
        entry = WEIGHTS.get(source)
        if not entry.config:
            raise ConfigError(f"Inferencer: the entry {source} records no recipe (its pre-processing and classes); "
                              f"give a recipe with weights={source!r}")
        return os.path.join(ROOT, entry.config), entry.name
    if os.path.isfile(str(source)) and str(source).endswith((".yaml", ".yml")):
        return str(source), None
    if os.path.exists(str(source)):   # weights (a .pdparams file, final/, a checkpoint): their recipe is not in them
        raise ConfigError(f"-c CONFIG is needed: {source} is not an export folder (with infer_cfg.yml), which "
                          f"records its recipe; in Python, Inferencer(recipe, weights={str(source)!r})")
    found = recipes()
    if source in found:
        return found[source], None
    raise ConfigError(f"Inferencer: '{source}' is neither an export folder, a pretrained entry, a recipe file nor a "
                      f"recipe name{did_you_mean(str(source), list(found) + WEIGHTS.names())}")


def _single(inputs):
    return (isinstance(inputs, (str, bytes, bytearray, np.ndarray, pathlib.PurePath))
            or _is_upload(inputs) or (isinstance(inputs, tuple) and len(inputs) == 2
                                      and all(isinstance(v, str) for v in inputs)))


def _is_upload(item):
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (bytes, bytearray))


def _write_image(array, path, n):
    import cv2  # import cost (docs/performance.md#import-costs): only a caller with image arrays pays it
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ConfigError(f"Inferencer: input {n}: an image array must be uint8 [H, W, 3] (RGB), got "
                          f"{array.dtype} {list(array.shape)}")
    cv2.imwrite(path, np.ascontiguousarray(array[:, :, ::-1]))   # lossless: the reader sees these pixels
    return path


def _named(ident, names):
    """A sample's id with a temporary file's path replaced by the name its input answers by."""
    ident = str(ident)
    for path, name in names.items():
        ident = ident.replace(path, name)
    return ident


def map_strings(value, fn):
    """`value` (an answer: dicts, lists, strings, numbers) with `fn` applied to every string in it. A
    list whose first item is a number is taken as numbers (an RLE's counts) and not walked."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (str, dict, list, tuple)):
        return type(value)(map_strings(v, fn) for v in value)
    return value


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def to_numpy(tree):
    """Tensors (and lists of tensors) as numpy; bfloat16 as float32; everything else unchanged."""
    import paddle  # after the session's setup: nothing at import
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_numpy(v) for v in tree]
    if isinstance(tree, paddle.Tensor):
        return (tree.astype("float32") if tree.dtype == paddle.bfloat16 else tree).numpy()
    return tree
