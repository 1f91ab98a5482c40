"""YouTube-8M frame-level features: Google's TFRecords, read directly, and Paddle's `.pkl` files.

TFRecord: one `tf.train.SequenceExample` per video, context `id` (bytes) and `labels` (int64 list),
feature lists `rgb` / `audio` holding one bytes value per frame (uint8, 1024 resp. 128 values).
pkl (Fluid `tf2pkl.py`): a pickled list of dicts per file, `{'video', 'feature' (rgb uint8
[n, 1024]), 'audio' (uint8 [n, 128]), 'label' (class ids), 'nframes' (min(n, 300))}`; a file holding
one dict (PaddleVideo's per-video split) is read too.

Features stay quantized until `load`, which dequantizes with Paddle's formula x*4/255 + 4/512 - 2,
so 0 -> -2 + 4/512 and 255 -> 2 + 4/512 (not YouTube-8M's own bias of 4/510; the released weights
were trained with Paddle's).

Damaged files. The index walks record headers only (readers/tfrecord.py):
- a bad length CRC, a truncated file (or, with `check_crc: true`, which reads whole files while
  indexing, a bad data CRC) is found while indexing. With `skip_bad: false` the constructor raises
  CorruptRecord (file + byte offset). With `skip_bad: true` the walk resynchronises after a bad
  header, so only the records inside a damaged region are lost; `damage` lists each unreadable
  range with the records it cost (exact, or "about N" estimated from the bytes lost and the file's
  mean record size; a file cut short is measured against the median size of the dataset's
  intact TFRecord files), `damage_summary()` says it in one line, logged once, and
  `data_faults()` hands it to the trainer. Each range also keeps one index entry that fails on load,
  so `num_skipped` still shows a fault; its message carries the true count;
- a bad data CRC or an undecodable payload is otherwise found by `load`, which raises
  CorruptRecord and the base class skips that one sample (or stops the run) the same way.
A pkl file that cannot be unpickled is one damaged range holding all its videos (estimated from
the other pkl files' video counts).

pkl files are unpickled once at construction to count their videos, then on demand with a small
per-process cache; shuffled training over many large pkl shards therefore re-reads whole shards,
so prefer TFRecords or one-video pkl files for full-size runs.
"""
import collections
import dataclasses
import glob
import logging
import os
import typing
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.errors import ConfigError, SampleError
from engine.data import SampleDataset
from engine.registry import DATASETS, TRANSFORMS
from engine.weights.weightfile import unpickle
from readers.tfrecord import CorruptRecord, Damage, DecodeError, decode_sequence_example, \
    Scan, estimate_losses, read_record, scan_records

log = logging.getLogger("zoo")

FORMATS = ("auto", "tfrecord", "pkl")
_EXTENSIONS = {".tfrecord": "tfrecord", ".tfrec": "tfrecord", ".pkl": "pkl"}
_PKL_KEYS = {"rgb": "feature"}          # our feature name -> key in Paddle's pkl dicts
_DAMAGE_WORDS = {"truncated": "file cut short", "bad_header": "bad header",
                 "data_crc": "bad data CRC", "unreadable": "unreadable file"}
_SCALE, _BIAS = 4.0 / 255.0, 4.0 / 512.0 - 2.0


def dequantize(x):
    """uint8 features -> float32 in [-2 + 4/512, 2 + 4/512], as Paddle's YouTube-8M readers do."""
    return np.asarray(x, np.float32) * np.float32(_SCALE) + np.float32(_BIAS)


def _expand(entry, list_file=None):
    """Paths for one `files` entry: a list file (.list/.txt), a glob, or a path."""
    where = f" (listed in {list_file})" if list_file else ""
    if any(c in entry for c in "*?["):
        found = sorted(glob.glob(entry))
        if not found:
            raise ConfigError(f"YouTube8M: no file matches '{entry}'{where}")
        return [p for f in found for p in _expand(f, list_file)]
    if not os.path.isfile(entry):
        raise ConfigError(f"YouTube8M: file not found: '{entry}'{where}")
    if os.path.splitext(entry)[1].lower() in (".list", ".txt"):
        if list_file:
            raise ConfigError(f"YouTube8M: list file '{entry}' is listed inside {list_file}")
        folder = os.path.dirname(os.path.abspath(entry))
        paths = []
        with open(entry, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    path = line.split()[0]
                    paths += _expand(path if os.path.isabs(path) else os.path.join(folder, path),
                                     entry)
        if not paths:
            raise ConfigError(f"YouTube8M: list file '{entry}' names no files")
        return paths
    return [entry]


def _normalize_pkl(obj, path):
    """A pkl file's content as a list of str-keyed dicts (Python 2 pickles may carry bytes keys)."""
    videos = [obj] if isinstance(obj, dict) else obj
    if not isinstance(videos, (list, tuple)):
        raise SampleError(f"{path}: expected a list of video dicts, got {type(obj).__name__}")
    out = []
    for i, v in enumerate(videos):
        if not isinstance(v, dict):
            raise SampleError(f"{path}: item {i} is a {type(v).__name__}, not a video dict")
        out.append({k.decode("latin1") if isinstance(k, bytes) else k: val for k, val in v.items()})
    return out


def _load_pkl(path):
    try:    # features are data: unpickled through the allow-list, never as code
        return _normalize_pkl(unpickle(path, kind="feature file", hint="re-save it with only dicts, lists and numpy arrays"), path)
    except SampleError:
        raise
    except Exception as e:  # noqa: BLE001 - any unpickling failure means one unreadable file
        raise SampleError(f"{path}: cannot unpickle ({type(e).__name__}: {e})") from None


def _video_id(value):
    if isinstance(value, (list, tuple)) and value:   # a TFRecord bytes_list
        value = value[0]
    if isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else value.tobytes()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@DATASETS.register("YouTube8M")
class YouTube8M(SampleDataset):
    """YouTube-8M frame features from TFRecords or Paddle pkl files.

    A sample holds one float32 [n, dim] array per name in `feature_names` (n <= max_frames, the
    first frames of the video) and `labels`, a float32 multi-hot [num_classes]. Pair it with
    `PadSequences(keys=feature_names)`, or with `SampleFrames` + `Stack` for fixed-length models.
    The video id is available through `describe(index)`.

    Args:
        files: the feature files: paths, globs, or list files (`.list` or `.txt`) of paths.
        format: `tfrecord` (Google's frame-level TFRecords) or `pkl` (Paddle's pickled features);
            `auto` tells each file by its extension.
        feature_names: the per-frame features read, one array each (rgb 1024-d, audio 128-d).
        num_classes: the length of the multi-hot `labels` (3862: YouTube-8M 2018's vocabulary).
        max_frames: the most frames kept per video, the first ones (the dataset's videos have at most
            300, one a second).
        check_crc: check every record's data CRC while indexing (it reads whole files), so bad records
            are counted in `damage` up front instead of failing when read.
    """

    SOURCE_KEYS = ("files",)
    def __init__(self, files: list, format: typing.Literal[FORMATS] = "auto", feature_names: list = ["rgb", "audio"],
                 num_classes: int = 3862, max_frames: int = 300, skip_bad: bool = False,
                 check_crc: bool = False, transforms: list = [], seed: int = 0):
        super().__init__(transforms=transforms, seed=seed, skip_bad=skip_bad)
        if format not in FORMATS:
            raise ConfigError(f"YouTube8M: format must be one of {list(FORMATS)}, got '{format}'")
        if not feature_names:
            raise ConfigError("YouTube8M: feature_names is empty")
        if num_classes < 1 or max_frames < 1:
            raise ConfigError(f"YouTube8M: num_classes ({num_classes}) and max_frames "
                              f"({max_frames}) must be >= 1")
        entries = [files] if isinstance(files, str) else list(files or [])
        if not entries:
            raise ConfigError("YouTube8M: 'files' is empty")
        self.feature_names = list(feature_names)
        self.num_classes, self.max_frames = num_classes, max_frames
        self.check_crc = check_crc
        self.files = [p for e in entries for p in _expand(str(e))]
        self.formats = [self._format_of(p, format) for p in self.files]
        self._pkl_cache = collections.OrderedDict()
        self._ids = {}
        self._build_index()

    # ------------------------------------------------------------------------------ indexing
    @staticmethod
    def _format_of(path, format):
        if format != "auto":
            return format
        ext = os.path.splitext(path)[1].lower()
        if ext not in _EXTENSIONS:
            raise ConfigError(f"YouTube8M: cannot tell the format of '{path}' from its extension "
                              f"(known: {sorted(_EXTENSIONS)}); set format: tfrecord or pkl")
        return _EXTENSIONS[ext]

    def _scan(self, file_id):
        """(positions, Damage list, framed bytes of the readable records); pkl positions are list
        indices and their bytes are None."""
        path = self.files[file_id]
        if self.formats[file_id] == "tfrecord":
            scan = scan_records(path, check_crc=self.check_crc, stop_at_first=not self.skip_bad)
            return scan.offsets, scan.damage, scan.record_bytes
        try:
            videos = _load_pkl(path)
        except SampleError as e:
            size = os.path.getsize(path)
            reason = str(e)[len(path) + 2:] if str(e).startswith(f"{path}: ") else str(e)
            return [], [Damage(path, 0, size, "unreadable", reason, tail=True, exact=False)], None
        self._ids.update({(file_id, i): _video_id(v.get("video", f"{path}[{i}]"))
                          for i, v in enumerate(videos)})
        return list(range(len(videos))), [], None

    def _count_losses(self, scans):
        """{file id: its Damage list with the records lost}. A cut file is measured against the
        median size of the dataset's intact TFRecord files, a file with no readable record against
        the dataset's mean record size; an unreadable pkl file against the median video count of
        the intact ones."""
        intact = [i for i, (_, damage, _) in enumerate(scans) if not any(d.tail for d in damage)]
        sizes = [os.path.getsize(self.files[i]) for i in intact if self.formats[i] == "tfrecord"]
        expected = int(np.median(sizes)) if sizes else None
        counts = [len(scans[i][0]) for i in intact if self.formats[i] == "pkl"]
        typical = int(np.median(counts)) if counts else 0
        tf_scans = [s for i, s in enumerate(scans) if self.formats[i] == "tfrecord"]
        n_records = sum(len(pos) for pos, _, _ in tf_scans)
        mean = sum(b for _, _, b in tf_scans) / n_records if n_records else None
        damage = {}
        for file_id, (positions, found, record_bytes) in enumerate(scans):
            if not found:
                continue
            if self.formats[file_id] == "pkl":
                damage[file_id] = [dataclasses.replace(d, records_lost=max(1, typical),
                                                       lower_bound=not typical) for d in found]
                continue
            scan = Scan(positions, found, os.path.getsize(self.files[file_id]), record_bytes)
            damage[file_id] = estimate_losses(scan, mean_record_size=mean,
                                              expected_size=expected).damage
        return damage

    def _build_index(self):
        workers = min(8, len(self.files))
        if workers > 1:  # header walks are I/O bound; threads overlap the seeks
            with ThreadPoolExecutor(workers) as pool:
                scans = list(pool.map(self._scan, range(len(self.files))))
        else:
            scans = [self._scan(i) for i in range(len(self.files))]
        if not self.skip_bad:
            for _, damage, _ in scans:
                if damage:
                    raise damage[0].error(with_loss=False)
        by_file = self._count_losses(scans) if any(d for _, d, _ in scans) else {}
        self.damage = [d for file_id in sorted(by_file) for d in by_file[file_id]]
        file_of, pos_of, self._bad = [], [], {}
        for file_id, (positions, _, _) in enumerate(scans):
            # records and damaged ranges in file order; a range is one entry that fails on load
            entries = [(p, None) for p in positions]
            entries += [(d.offset, d) for d in by_file.get(file_id, [])]
            for pos, d in sorted(entries, key=lambda e: e[0]):
                if d is not None:
                    self._bad[len(file_of)] = d
                file_of.append(file_id)
                pos_of.append(pos)
        self._file_of = np.asarray(file_of, dtype=np.int32)
        self._pos_of = np.asarray(pos_of, dtype=np.int64)
        if self.damage:
            log.warning("YouTube8M: %s", self.damage_summary())

    def damage_summary(self, max_items=5):
        """One line: damaged files, records lost in all, the first ranges (file, byte, count)."""
        if not self.damage:
            return ""
        files = len({d.path for d in self.damage})
        total = sum(d.records_lost for d in self.damage)
        guessed = [d for d in self.damage if not d.exact]
        if not guessed:
            lost = f"{total}"
        elif all(d.lower_bound for d in guessed):
            lost = f"at least {total}"
        else:
            lost = f"about {total}" + (" or more" if any(d.lower_bound for d in guessed) else "")
        items = [f"{os.path.basename(d.path)} from byte {d.offset}: {d.lost_text()} "
                 f"({_DAMAGE_WORDS.get(d.kind, d.kind)})" for d in self.damage[:max_items]]
        if len(self.damage) > max_items:
            items.append(f"{len(self.damage) - max_items} more damaged ranges")
        return (f"{files} damaged file{'' if files == 1 else 's'}: {lost} "
                f"record{'' if total == 1 else 's'} lost ({'; '.join(items)})")

    def data_faults(self):
        """Records lost to damaged files (found while indexing), for the trainer's summaries."""
        return {"records_lost": int(sum(d.records_lost for d in self.damage)),
                "summary": self.damage_summary()}

    def __len__(self):
        return len(self._file_of)

    # ------------------------------------------------------------------------------- loading
    def _pkl_videos(self, file_id, cache_files=4):
        videos = self._pkl_cache.get(file_id)
        if videos is None:
            videos = _load_pkl(self.files[file_id])
            self._pkl_cache[file_id] = videos
            while len(self._pkl_cache) > cache_files:
                self._pkl_cache.popitem(last=False)
        else:
            self._pkl_cache.move_to_end(file_id)
        return videos

    def _raw(self, index):
        """(video id, {name: uint8 [n, dim]}, label ids) of one video, frames not yet cut."""
        if index in self._bad:
            raise self._bad[index].error()
        file_id, pos = int(self._file_of[index]), int(self._pos_of[index])
        path = self.files[file_id]
        if self.formats[file_id] == "tfrecord":
            data = read_record(path, pos)
            try:
                context, lists = decode_sequence_example(data, self.feature_names)
            except DecodeError as e:
                raise CorruptRecord(path, pos, f"not a SequenceExample ({e})") from None
            where = f"{path} @ byte {pos}"
            feats = {}
            for name in self.feature_names:
                if name not in lists:
                    raise SampleError(f"{where}: no feature list '{name}' "
                                      f"(has {sorted(lists)})")
                frames = []
                for f in lists[name][: self.max_frames]:
                    if not isinstance(f, list) or len(f) != 1:
                        raise SampleError(f"{where}: feature list '{name}' frames must be one "
                                          f"bytes value each")
                    frames.append(f[0])
                if len({len(b) for b in frames}) > 1:
                    raise SampleError(f"{where}: feature list '{name}' has frames of different "
                                      f"sizes {sorted({len(b) for b in frames})}")
                dim = len(frames[0]) if frames else 0
                feats[name] = np.frombuffer(b"".join(frames), np.uint8).reshape(len(frames), dim)
            labels = context.get("labels")
            labels = [] if labels is None else labels
            return _video_id(context.get("id", "")), feats, labels, where
        video = self._pkl_videos(file_id)[pos]
        where = f"{path} [video {pos}]"
        feats = {}
        for name in self.feature_names:
            key = _PKL_KEYS.get(name, name)
            if key not in video:
                raise SampleError(f"{where}: no key '{key}' for feature '{name}' "
                                  f"(has {sorted(video)})")
            arr = np.asarray(video[key])
            if arr.ndim != 2:
                raise SampleError(f"{where}: '{key}' has shape {arr.shape}, expected [n, dim]")
            n = int(video.get("nframes", len(arr)))
            feats[name] = arr[: min(n, self.max_frames)]
        return _video_id(video.get("video", "")), feats, video.get("label", []), where

    def load(self, index):
        vid, feats, label_ids, where = self._raw(index)
        self._ids.setdefault((int(self._file_of[index]), int(self._pos_of[index])), vid)
        sample = {}
        lengths = set()
        for name, arr in feats.items():
            if arr.dtype != np.uint8:
                raise SampleError(f"{where}: '{name}' is {arr.dtype}, expected quantized uint8")
            arr = arr[: self.max_frames]
            lengths.add(len(arr))
            sample[name] = dequantize(arr)
        if 0 in lengths:
            raise SampleError(f"{where}: video '{vid}' has no frames")
        labels = np.zeros(self.num_classes, np.float32)
        try:
            ids = np.asarray(label_ids, dtype=np.int64).ravel()
        except (TypeError, ValueError):
            raise SampleError(f"{where}: labels {label_ids!r} are not class ids") from None
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_classes):
            raise SampleError(f"{where}: video '{vid}' has label ids {ids.tolist()} outside "
                              f"[0, {self.num_classes})")
        labels[ids] = 1.0
        sample["labels"] = labels
        return sample

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """Inference over TFRecord/pkl files, globs or list files given on the command line."""
        kwargs.pop("files", None)
        return cls(files=list(inputs), **kwargs)

    def describe(self, index):
        """The video id (read from the record if the index did not see it)."""
        index = int(index)
        key = (int(self._file_of[index]), int(self._pos_of[index]))
        if key not in self._ids:
            path, pos = self.files[key[0]], key[1]
            if self.formats[key[0]] != "tfrecord" or index in self._bad:
                return f"{path}@{pos}"
            try:
                context, _ = decode_sequence_example(read_record(path, pos), context_only=True)
                self._ids[key] = _video_id(context.get("id", f"{path}@{pos}"))
            except (SampleError, DecodeError):
                return f"{path}@{pos}"
        return self._ids[key]


# --------------------------------------------------------------------------------- transforms

@TRANSFORMS.register("SampleFrames")
class SampleFrames:
    """Pick `num_frames` frames, one per equal stride of the video (Attention Cluster's input).

    mode "random": a uniform position inside each stride, drawn from `sample["_rng"]` (the original
    reader did this in every phase); "center": each stride's centre, deterministic for evaluation.
    Videos shorter than `num_frames` repeat frames. All `keys` get the same relative positions.

    Args:
        num_frames: the frames picked per video (>= 1), the model's fixed time length.
        mode: `center` takes each stride's centre (evaluation); `random` a uniform position in it.
        keys: the feature arrays sampled.
    """

    def __init__(self, num_frames: int, mode: typing.Literal["center", "random"] = "center", keys: list = ["rgb", "audio"]):
        if num_frames < 1:
            raise ConfigError(f"SampleFrames: num_frames must be >= 1, got {num_frames}")
        if mode not in ("center", "random"):
            raise ConfigError(f"SampleFrames: mode must be 'center' or 'random', got '{mode}'")
        self.num_frames, self.mode, self.keys = num_frames, mode, list(keys)

    def indices(self, length, u):
        pos = (np.arange(self.num_frames) + u) * (length / self.num_frames)
        return np.minimum(pos.astype(np.int64), length - 1)

    def __call__(self, sample):
        if self.mode == "random":
            u = sample["_rng"].random(self.num_frames)
        else:
            u = np.full(self.num_frames, 0.5)
        for key in self.keys:
            if key in sample:
                sample[key] = sample[key][self.indices(len(sample[key]), u)]
        return sample


@TRANSFORMS.register("PCARescale")
class PCARescale:
    """Undo the PCA whitening of the rgb features for NeXtVLAD:
    x = (x - 4/512) * (sqrt(eigenvalues[:dim]) + 1e-4), eigenvalues from a `.npy` file ([N] or
    [N, 1], as `yt8m_pca/eigenvals.npy`).

    Args:
        eigenvalues_file: the `.npy` file of the PCA eigenvalues (required).
        key: the feature rescaled.
    """

    def __init__(self, eigenvalues_file: str = None, key: str = "rgb"):
        if not eigenvalues_file:
            raise ConfigError("PCARescale: eigenvalues_file is required")
        if not os.path.isfile(eigenvalues_file):
            raise ConfigError(f"PCARescale: eigenvalues file not found: '{eigenvalues_file}'")
        try:
            eig = np.load(eigenvalues_file)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"PCARescale: cannot read '{eigenvalues_file}': {e}") from None
        eig = eig[:, 0] if eig.ndim == 2 else eig.ravel()
        if (eig < 0).any():
            raise ConfigError(f"PCARescale: '{eigenvalues_file}' has negative eigenvalues")
        self.scale = (np.sqrt(eig) + 1e-4).astype(np.float32)
        self.file, self.key = eigenvalues_file, key

    def __call__(self, sample):
        x = sample[self.key]
        dim = x.shape[-1]
        if dim > len(self.scale):
            raise ConfigError(f"PCARescale: '{self.file}' has {len(self.scale)} eigenvalues, "
                              f"'{self.key}' needs {dim}")
        sample[self.key] = (x - np.float32(4.0 / 512.0)) * self.scale[:dim]
        return sample
