"""Kinetics-style raw RGB reader: a list file of `path label` lines, videos or frame folders.

TSN sampling (as the Fluid KineticsReader and PaddleVideo's Sampler): the video is cut into
`num_seg` equal segments of `len // num_seg` frames; training takes `seglen` consecutive frames
at a random offset in each segment, evaluation at the segment centre; indices wrap around for
videos shorter than `num_seg * seglen`. Only the sampled frames are decoded.

Multi-view testing ("25 segments x 10 crops") is expressed as `num_seg=25` plus a `TenCrop`
transform: segments are the model's time axis, views (crops x `num_clips`) are averaged by the
model. `num_clips > 1` samples several temporal clips of `num_seg` segments each (at evenly
spread offsets inside the segments at test time) and adds them as views.
"""
import inspect
import logging
import multiprocessing
import os
import typing

import cv2
import numpy as np

from engine.errors import ConfigError, SampleError, did_you_mean
from engine.data import SampleDataset
from engine.registry import DATASETS
from readers.decoding import CaptureStderr, decoder_line, read_image, reported, warn_decoded
from readers.fields import declare

MODES = {"train": True, "val": False, "valid": False, "test": False, "infer": False}
BACKENDS = ("decord", "cv2", "pyav")
BACKEND_MODULES = {"decord": "decord", "cv2": "cv2", "pyav": "av"}  # PyAV imports as `av`
log = logging.getLogger("zoo")
VIDEO_EXTS = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".flv", ".mpg", ".mpeg")


def segment_starts(num_frames, num_seg, seglen, train, rng=None, num_clips=1):
    """First frame of each segment's window: int64 [num_clips, num_seg] (before wrapping).

    avg = num_frames // num_seg. With avg >= seglen, training draws the start uniformly in
    [0, avg - seglen] inside each segment, evaluation takes (avg - 1) // 2 (clip c of C takes
    ((2c + 1) * avg - 1) // (2C), which is the same for C = 1). A shorter avg starts at the
    segment's first frame, and a video with fewer frames than segments starts segment i at i.
    """
    avg = num_frames // num_seg
    base = np.arange(num_seg, dtype=np.int64) * max(avg, 1)
    if avg < seglen:
        return np.tile(base, (num_clips, 1))
    if train:
        return base + rng.integers(0, avg - seglen + 1, size=(num_clips, num_seg))
    offs = ((2 * np.arange(num_clips, dtype=np.int64) + 1) * avg - 1) // (2 * num_clips)
    return base[None, :] + offs[:, None]


def sample_indices(num_frames, num_seg, seglen, train, rng=None, num_clips=1):
    """Frame indices int64 [num_clips, num_seg, seglen]: consecutive windows, modulo the length."""
    starts = segment_starts(num_frames, num_seg, seglen, train, rng, num_clips)
    return (starts[..., None] + np.arange(seglen)) % num_frames


class _Truncated(Exception):
    """The decoder reached the end before a frame the container promised."""

    def __init__(self, available):
        super().__init__(f"only {available} frames decodable")
        self.available = available


def _bgr_to_rgb(frame):
    return frame[:, :, ::-1]


class _DecordVideo:
    """decord's two access paths give the same frames: `get_batch` on the sorted indices (used), or
    a seek per frame (`seek_accurate(i)` + `next()`, what `vr[i]` does). get_batch seeks to the
    keyframe before an index when that is ahead of where it stands, and decodes forward otherwise,
    so it does what a seek per frame would where seeking pays. benchmarks/video_formats.py found
    the two close in CPU time per clip (docs/performance.md#reader-figures) on long-GOP H.264 (keyint 250),
    short-GOP H.264 (keyint 8, 16) and mp4v clips, neither ahead on every format or in every run,
    so get_batch stays, with no rule on the keyframe interval."""

    def __init__(self, path):
        import decord  # the reader works without it: _backends keeps decord only where it imports
        self.vr = decord.VideoReader(path, num_threads=1)
        self.num_frames = len(self.vr)

    def read(self, indices, access="batch"):
        uniq, inverse = np.unique(indices, return_inverse=True)
        if access == "batch":
            frames = self.vr.get_batch(uniq.tolist()).asnumpy()
        else:                                   # "seek": one seek per frame (the benchmark's other path)
            frames = []
            for i in uniq.tolist():
                self.vr.seek_accurate(i)
                frames.append(self.vr.next().asnumpy())
            frames = np.stack(frames)
        return frames[inverse.reshape(-1)]


class _SequentialVideo:
    """Decoders without reliable random access: read forward to the last wanted frame."""

    def read(self, indices):
        uniq, inverse = np.unique(indices, return_inverse=True)
        got, count = {}, 0
        for i, frame in self._iter(int(uniq[-1]), set(uniq.tolist())):
            count = i + 1
            if frame is not None:
                got[i] = frame
        if len(got) < len(uniq):
            raise _Truncated(count)
        return np.stack([got[i] for i in uniq.tolist()])[inverse.reshape(-1)]


class _Cv2Video(_SequentialVideo):
    def __init__(self, path):
        self.cv2, self.path = cv2, path
        cap = cv2.VideoCapture(path)
        if not cap.isOpened():
            raise IOError("cv2 cannot open it")
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        cap.release()
        if n <= 0:
            n = sum(1 for _ in self._iter(None, ()))
        self.num_frames = n

    def _iter(self, last, wanted):
        """(index, RGB frame, or None when not wanted) up to `last`; unwanted frames are only
        grabbed, not converted."""
        cap = self.cv2.VideoCapture(self.path)
        try:
            i = 0
            while last is None or i <= last:
                if not cap.grab():
                    return
                frame = None
                if i in wanted:
                    ok, frame = cap.retrieve()
                    if not ok:
                        return
                    frame = _bgr_to_rgb(frame)
                yield i, frame
                i += 1
        finally:
            cap.release()


class _PyAVVideo(_SequentialVideo):
    def __init__(self, path):
        import av  # optional: requirements-test.txt only (backend pyav)
        self.av, self.path = av, path
        with av.open(path) as container:
            n = container.streams.video[0].frames
        if n <= 0:
            n = sum(1 for _ in self._iter(None, ()))
        self.num_frames = n

    def read(self, indices):
        """Seek to the keyframe before a wanted frame when that keyframe lies ahead of the decoder,
        else decode forward (decord's get_batch does the same): a short keyframe interval then
        costs a few frames per segment instead of the clip up to its last wanted frame. Frames are
        told by their timestamps (the packets' pts in display order). A file with one keyframe,
        or timestamps that do not give one frame each, is read forward (_SequentialVideo.read),
        as is one whose decoder fails midway (which then reports the truncation)."""
        uniq = np.unique(indices)
        try:
            got = self._read_seeking(uniq)
        except self.av.error.FFmpegError:
            got = None
        if got is None or len(got) < len(uniq):
            return super().read(indices)
        inverse = np.searchsorted(uniq, indices)
        return np.stack([got[i] for i in uniq.tolist()])[inverse.reshape(-1)]

    def _read_seeking(self, uniq):
        """{index: RGB frame} through seeks, or None where the file does not lend itself to it."""
        with self.av.open(self.path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1   # as decord's num_threads=1: a worker, one core
            pts, key = [], []
            for packet in container.demux(stream):
                if packet.size:
                    if packet.pts is None:
                        return None
                    pts.append(packet.pts)
                    key.append(packet.is_keyframe)
            order = np.argsort(pts, kind="stable")
            frame_pts = np.asarray(pts, dtype=np.int64)[order]
            keyframes = np.flatnonzero(np.asarray(key)[order])
            if (len(keyframes) < 2 or keyframes[0] != 0 or uniq[-1] >= len(frame_pts)
                    or np.any(np.diff(frame_pts) <= 0)):
                return None
            index_of = {int(p): i for i, p in enumerate(frame_pts)}
            got, pos, frames = {}, -1, None
            for i in uniq.tolist():
                k = int(keyframes[np.searchsorted(keyframes, i, side="right") - 1])
                if frames is None or k > pos:
                    container.seek(int(frame_pts[k]), stream=stream, backward=True)
                    frames = container.decode(stream)
                for frame in frames:
                    pos = index_of.get(frame.pts, pos)
                    if pos == i:
                        got[i] = frame.to_ndarray(format="rgb24")
                        break
                    if pos > i:
                        return None
                else:
                    return None
            return got

    def _iter(self, last, wanted):
        """A packet FFmpeg rejects ends the stream, as it ends cv2's grab(): a cut file is then
        re-sampled or reported as truncated by read_video, whichever backend read it."""
        with self.av.open(self.path) as container:
            frames = container.decode(video=0)
            i = 0
            while last is None or i <= last:
                try:
                    frame = next(frames)
                except (StopIteration, self.av.error.FFmpegError):
                    return
                yield i, frame.to_ndarray(format="rgb24") if i in wanted else None
                i += 1


_OPENERS = {"decord": _DecordVideo, "cv2": _Cv2Video, "pyav": _PyAVVideo}


def _module_available(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _short_error(e):
    """First line of a decoder's message without decord's '[time] file.cc:line:' prefixes."""
    return decoder_line(str(e), 200) or type(e).__name__


def read_video(path, num_seg, seglen, train, rng, num_clips=1, backends=("decord", "cv2"), on_short=None):
    """Decode the sampled frames of one video: (uint8 [F, H, W, 3] RGB, indices [C, T, L]).

    Each backend is tried in turn. A container that promises more frames than it holds is
    re-sampled once with the frames actually decodable (frame counts in headers are often a little
    off), unless fewer than half of them are: that is a truncated file. What a backend's decoder
    prints is captured (readers/decoding.py): in the SampleError, or one warning naming the file
    when it decodes anyway. `on_short(path, num_frames)` is called for a video with fewer frames
    than a clip samples (`num_seg * seglen`), whose frames therefore repeat.
    """
    errors, lines = [], []
    for name in backends:
        cap = CaptureStderr()   # FFmpeg's and decord's own stderr lines: in our message, not printed
        try:
            with cap:
                frames, idx, n = _decode(_OPENERS[name], path, num_seg, seglen, train, rng, num_clips)
        except Exception as e:  # decoders raise their own types; all mean "cannot read"
            errors.append(f"{name}: {_short_error(e)}")
            line = cap.line     # kept when it says more than the exceptions do
            if line and line not in lines and not any(line in err for err in errors):
                lines.append(line)
            continue
        warn_decoded("video", path, cap.line)
        if on_short is not None and n < num_seg * seglen:
            on_short(path, n)
        return frames, idx
    line = "; ".join(lines)[:200]
    raise SampleError(f"cannot decode video {path} ({'; '.join(errors)}){reported(line)}")


def _decode(opener, path, num_seg, seglen, train, rng, num_clips):
    """One backend's attempt at read_video: (frames, indices, frames sampled from), or its exception."""
    video = opener(path)
    n = video.num_frames
    if n <= 0:
        raise IOError("no frames")
    idx = sample_indices(n, num_seg, seglen, train, rng, num_clips)
    try:
        frames = video.read(idx.reshape(-1))
    except _Truncated as e:
        if e.available < max(1, n // 2):
            raise IOError(f"truncated: {e.available} of {n} frames decodable")
        n = e.available
        idx = sample_indices(n, num_seg, seglen, train, rng, num_clips)
        frames = video.read(idx.reshape(-1))
    return np.ascontiguousarray(frames), idx, n


def read_frame_folder(folder, num_frames, template, num_seg, seglen, train, rng, num_clips=1, on_short=None):
    """The sampled frames of a folder of JPEGs numbered from 1 (`img_00001.jpg`); `on_short` as in
    read_video."""
    if num_frames is None:
        if not os.path.isdir(folder):
            raise SampleError(f"frame folder not found: {folder}")
        head, tail = template.split("{")[0], template.split("}")[-1]
        num_frames = sum(1 for f in os.listdir(folder) if f.startswith(head) and f.endswith(tail))
    if num_frames <= 0:
        raise SampleError(f"no frames '{template}' in {folder}")
    if on_short is not None and num_frames < num_seg * seglen:
        on_short(folder, num_frames)
    idx = sample_indices(num_frames, num_seg, seglen, train, rng, num_clips)
    uniq, inverse = np.unique(idx, return_inverse=True)
    frames = []
    for i in uniq.tolist():
        frames.append(read_image(os.path.join(folder, template.format(i + 1)), what="frame"))
    if len({f.shape for f in frames}) != 1:
        raise SampleError(f"frames of different sizes in {folder}")
    return np.ascontiguousarray(np.stack(frames)[inverse.reshape(-1)]), idx


def read_label_names(path):
    """Class names: one `name` per line (index = line), or `name idx` lines (Kinetics' label file)."""
    if not os.path.isfile(path):
        raise ConfigError(f"label_names file not found: {path}")
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    pairs = [ln.rsplit(None, 1) for ln in lines]
    if all(len(p) == 2 and p[1].lstrip("-").isdigit() for p in pairs):
        ids = [int(p[1]) for p in pairs]
        if sorted(ids) == list(range(len(ids))):
            names = [None] * len(ids)
            for (name, _), i in zip(pairs, ids):
                names[i] = name
            return names
    return lines


def _is_int(s):
    return s.lstrip("-").isdigit()


@DATASETS.register("Kinetics")
class KineticsDataset(SampleDataset):
    """Kinetics-400 style list reader for TSN/StNet.

    list_file lines: `path label`; for `format: frames` also `folder num_frames label`. A label may
    be a class name from `label_names`; a line with no label gets -1 (inference). Relative paths
    resolve against `data_root`, else the list file's folder.

    Sample: `imgs` (after `Normalize`: float32 [num_seg, seglen*3, H, W], or [V, num_seg, seglen*3,
    H, W] with several views), `label` int64. Before Normalize `imgs` is uint8 [F, H, W, 3] and
    `_frame_idx` [num_clips, num_seg, seglen] holds the decoded frame numbers (0-based);
    `_fields` declares `imgs` as video for the transforms.

    Args:
        list_file: the list of samples, one `path label` line each (`folder num_frames label` for
            frames); the label is a class index or a name from `label_names`.
        data_root: the folder the list's relative paths resolve against (default: the list file's).
        label_names: a class-name file (line i = class i, or Kinetics' `name index` lines): the list
            may then give names, and outputs name the classes.
        format: `video`: video files, decoded with `backend`; `frames`: folders of frame images named
            by `frame_template`.
        frame_template: the file name of frame i (counted from 1) in a frame folder, a Python format
            string with one field.
        num_seg: the segments a video is cut into, one sampled window each: the model's time axis
            (TSN: 3 to train, 25 to test).
        seglen: consecutive frames per segment window, stacked on the channels (StNet: 5).
        mode: `train` draws each window at a random offset in its segment; the others take the
            segment centre (deterministic evaluation).
        num_clips: temporal clips of `num_seg` segments per video, added as views the model averages
            (multi-clip testing).
        backend: the decoder tried first; decord and cv2, where installed, follow for a file it
            cannot read.
    """

    SOURCE_KEYS = ("list_file", "data_root")
    def __init__(self, list_file: str, data_root: str = None, label_names: str = None,
                 format: typing.Literal["video", "frames"] = "video", frame_template: str = "img_{:05d}.jpg",
                 num_seg: int = 3, seglen: int = 1, mode: typing.Literal[tuple(MODES)] = "train", num_clips: int = 1,
                 backend: typing.Literal[BACKENDS] = "decord",
                 skip_bad: bool = True, transforms: list = None, seed: int = 0):
        self._setup(label_names, format, frame_template, num_seg, seglen, mode, num_clips, backend,
                    skip_bad, transforms, seed)
        self.items = self._read_list(list_file, data_root)

    def _setup(self, label_names, format, frame_template, num_seg, seglen, mode, num_clips, backend,
               skip_bad, transforms, seed):
        super().__init__(transforms=transforms, seed=seed, skip_bad=skip_bad)
        if mode not in MODES:
            raise ConfigError(f"Kinetics.mode must be one of {sorted(MODES)}, got '{mode}'")
        if format not in ("video", "frames"):
            raise ConfigError(f"Kinetics.format must be 'video' or 'frames', got '{format}'")
        if backend not in BACKENDS:
            raise ConfigError(f"Kinetics.backend must be one of {list(BACKENDS)}, got '{backend}'")
        for key, value in (("num_seg", num_seg), ("seglen", seglen), ("num_clips", num_clips)):
            if value < 1:
                raise ConfigError(f"Kinetics.{key} must be >= 1, got {value}")
        if format == "frames" and "{" not in frame_template:
            raise ConfigError(f"Kinetics.frame_template needs a '{{}}' field, got '{frame_template}'")
        self.format, self.frame_template = format, frame_template
        self.num_seg, self.seglen, self.num_clips = num_seg, seglen, num_clips
        self.mode, self.train = mode, MODES[mode]
        self.backends = self._backends(backend) if format == "video" else ()
        self.label_names = read_label_names(label_names) if label_names else None
        self.label_names_file = label_names
        # shared with the loader's worker processes (inherited when they start, every epoch): a
        # flag of this process alone would repeat the warning per worker and per epoch
        self._short_said = multiprocessing.RawValue("b", 0)
        self.num_classes = len(self.label_names) if self.label_names else None

    @classmethod
    def for_inputs(cls, inputs, **kwargs):
        """Unlabelled videos (files, or folders searched recursively; frame folders for
        `format: frames`) read with the recipe's test reader arguments."""
        kwargs = {k: v for k, v in kwargs.items() if k not in ("list_file", "data_root")}
        try:
            bound = inspect.signature(cls.__init__).bind(None, None, **kwargs)
        except TypeError as e:
            raise ConfigError(f"Kinetics: {e}") from None
        bound.apply_defaults()
        args = {k: v for k, v in bound.arguments.items() if k not in ("self", "list_file", "data_root")}
        if MODES.get(args["mode"]):
            args["mode"] = "test"  # a train reader's random sampling has no place in inference
        ds = cls.__new__(cls)
        ds._setup(**args)
        ds.items = [(p, None, -1) for p in ds._find_inputs(inputs)]
        return ds

    def _find_inputs(self, inputs):
        head, tail = self.frame_template.split("{")[0], self.frame_template.split("}")[-1]

        def is_frame_dir(d):
            return any(f.startswith(head) and f.endswith(tail) for f in os.listdir(d))

        found = []
        for path in inputs:
            if not os.path.exists(path):
                raise ConfigError(f"input not found: {path}")
            if self.format == "video" and os.path.isfile(path):
                found.append(path)
            elif self.format == "video":
                found += sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                                if f.lower().endswith(VIDEO_EXTS))
            elif os.path.isdir(path):
                found += sorted(d for d, _, _ in os.walk(path) if is_frame_dir(d))
        if not found:
            kind = "video files" if self.format == "video" else f"frame folders ('{self.frame_template}')"
            raise ConfigError(f"no {kind} found in {', '.join(inputs)}")
        return found

    @staticmethod
    def _backends(backend):
        if backend == "pyav" and not _module_available("av"):
            raise ConfigError("Kinetics.backend 'pyav' needs PyAV (pip install av); "
                              "or use 'decord' / 'cv2'")
        order = [backend] + [b for b in ("decord", "cv2") if b != backend]
        return tuple(b for b in order if b == "cv2" or _module_available(BACKEND_MODULES[b]))

    def _read_list(self, list_file, data_root):
        if not os.path.isfile(list_file):
            raise ConfigError(f"Kinetics list_file not found: {list_file}")
        root = data_root if data_root else os.path.dirname(os.path.abspath(list_file))
        name_to_id = {n: i for i, n in enumerate(self.label_names or [])}
        items = []
        with open(list_file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                where = f"{list_file}:{lineno}"
                path, nframes, label = self._parse_line(line, name_to_id, root, where)
                if self.label_names is not None and label >= len(self.label_names):
                    raise ConfigError(f"{where}: label {label} >= {len(self.label_names)} "
                                      f"classes in label_names")
                items.append((os.path.join(root, path), nframes, label))
        if not items:
            raise ConfigError(f"Kinetics list_file {list_file} has no entries")
        return items

    def _parse_line(self, line, name_to_id, root, where):
        """(path, num_frames or None, label); splits from the right so paths may hold spaces.

        A last word that is neither a class index nor a class name is still read as a label when
        what precedes it looks like the path (an existing file or folder, a video file name, a
        frame count) and the whole line names nothing: read as part of the path, a mistyped
        label would only show as that video being skipped as missing, and its class would
        quietly lose samples."""
        path, nframes, label = line, None, -1
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and not (_is_int(parts[1]) or parts[1] in name_to_id):
            spaced = [n for n in name_to_id if " " in n and line.endswith(" " + n)]
            if spaced:              # a class name with spaces ("air drumming")
                name = max(spaced, key=len)
                parts = [line[:-len(name)].rstrip(), name]
            elif self._reads_as_label(parts[0], line, root):
                raise ConfigError(f"{where}: {self._unknown_label(parts[1])}")
        if len(parts) == 2 and (_is_int(parts[1]) or parts[1] in name_to_id):
            path = parts[0]
            label = int(parts[1]) if _is_int(parts[1]) else name_to_id[parts[1]]
            if self.format == "frames":
                head = path.rsplit(None, 1)
                if len(head) == 2 and _is_int(head[1]):
                    path, nframes = head[0], int(head[1])
        return path, nframes, label

    def _reads_as_label(self, head, line, root):
        if os.path.exists(os.path.join(root, line)):
            return False            # a path with spaces and no label
        if self.format == "video":
            return head.lower().endswith(VIDEO_EXTS) or os.path.isfile(os.path.join(root, head))
        counted = head.rsplit(None, 1)
        return (len(counted) == 2 and _is_int(counted[1])) or os.path.isdir(os.path.join(root, head))

    def _unknown_label(self, word):
        if self.label_names is None:
            return (f"label '{word}' is not a class index, and Kinetics.label_names is not set to "
                    f"give the class names")
        return (f"label '{word}' is not a class of {self.label_names_file} ({len(self.label_names)} classes)"
                f"{did_you_mean(word, self.label_names)}")

    def __getstate__(self):
        """A copy pickled outside a process start (copy.deepcopy, a user's pickle.dumps) takes the flag's
        value into a flag of its own: shared memory passes only to a process being started."""
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            state["_short_said"] = int(self._short_said.value)
        return state

    def __setstate__(self, state):
        if isinstance(state.get("_short_said"), int):
            state["_short_said"] = multiprocessing.RawValue("b", state["_short_said"])
        self.__dict__.update(state)

    def _say_short(self, path, num_frames):
        """Once per reader: a list of many short clips would otherwise fill the log, and one named
        example is enough to look for the others."""
        if self._short_said.value:
            return
        self._short_said.value = 1
        log.warning("Kinetics: %s has %d frames, fewer than the %d a clip samples (num_seg %d x seglen %d): "
                    "its frames repeat (said once; other clips this short are not named)",
                    path, num_frames, self.num_seg * self.seglen, self.num_seg, self.seglen)

    @property
    def labels(self):
        return np.array([it[2] for it in self.items], dtype=np.int64)

    def __len__(self):
        return len(self.items)

    def describe(self, index):
        return self.items[index][0]

    def load(self, index):
        path, nframes, label = self.items[index]
        # the base class adds sample["_rng"] after load(); sampling uses its own stream of the same
        # (seed, epoch, index) so it does not replay the transforms' draws
        rng = np.random.default_rng([self.seed, self.epoch, index, 1])
        if self.format == "video":
            if not os.path.isfile(path):
                raise SampleError(f"video not found: {path}")
            imgs, idx = read_video(path, self.num_seg, self.seglen, self.train, rng, self.num_clips,
                                   self.backends, on_short=self._say_short)
        else:
            imgs, idx = read_frame_folder(path, nframes, self.frame_template, self.num_seg,
                                          self.seglen, self.train, rng, self.num_clips,
                                          on_short=self._say_short)
        return declare({"imgs": imgs, "label": np.int64(label), "_frame_idx": idx,
                        "_num_seg": self.num_seg, "_seglen": self.seglen, "_num_clips": self.num_clips},
                       imgs="video")
