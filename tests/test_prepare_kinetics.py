"""data/prepare_kinetics.py --reencode (short keyframe interval, PyAV) and the video readers'
access paths on its clips: keyframes every N frames, every frame kept, the scaling asked, a corrupt
input reported by name and skipped, and the same frames from every access path."""
import importlib.util
import os

import numpy as np
import pytest

av = pytest.importorskip("av")
from readers.kinetics import KineticsDataset, _DecordVideo, _PyAVVideo, sample_indices  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, W, H = 40, 64, 48


def _load():
    spec = importlib.util.spec_from_file_location("prepare_kinetics", os.path.join(ROOT, "data", "prepare_kinetics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_clip(path, seed, n=N):
    """A tiny mpeg4 clip (FFmpeg's default: a keyframe every 12 frames) with moving content."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=25)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        for i in range(n):
            frame = np.roll(base, 3 * i, axis=1)
            for p in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def _keyframes(path):
    with av.open(str(path)) as c:
        return [i for i, f in enumerate(c.decode(video=0)) if f.key_frame]


def _size(path):
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return s.width, s.height, sum(1 for _ in c.decode(s))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prep")
    videos = tmp / "videos"
    for k, cls in enumerate(("b_cls", "a_cls", "a_cls")):
        _write_clip(videos / cls / f"v{k}.mp4", k)
    (videos / "a_cls" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video at all" * 4)
    out = tmp / "out"
    return videos, out


def test_reencode_keyframes_frames_size_and_a_corrupt_input(prepared, capsys):
    videos, out = prepared
    _load().main(["--train-dir", str(videos), "--out", str(out), "--reencode", "clips", "--gop", "8",
                  "--reencode-scale", "32"])
    printed = capsys.readouterr().out
    broken = [ln for ln in printed.splitlines() if "broken.mp4" in ln]
    assert len(broken) == 1 and "cannot re-encode" in broken[0]
    assert "train: 1 of 4 videos could not be re-encoded" in printed
    lines = (out / "train_reencoded.list").read_text().splitlines()
    assert (out / "label_names.txt").read_text().split() == ["a_cls", "b_cls"]
    # same `path label` lines and labels as train.list, without the broken video
    assert [ln.split()[1] for ln in lines] == [ln.split()[1] for ln in (out / "train.list").read_text().splitlines()
                                               if "broken" not in ln]
    assert len(lines) == 3
    for ln in lines:
        path = out / ln.split()[0]
        assert _keyframes(path) == list(range(0, N, 8))
        w, h, n = _size(path)
        assert (w, h, n) == (42, 32, N)        # short side 32, aspect kept, even sizes, every frame
    # the list reads as before with the Kinetics reader (decord, and PyAV's seeking read)
    for backend in ("decord", "pyav"):
        ds = KineticsDataset(str(out / "train_reencoded.list"), label_names=str(out / "label_names.txt"),
                             num_seg=3, mode="val", backend=backend)
        sample = ds[0]
        assert sample["imgs"].shape == (3, 32, 42, 3) and sample["label"] in (0, 1)
    # a re-run keeps the clips written (resumes), WxH scaling writes that size
    _load().main(["--train-dir", str(videos), "--out", str(out / "wh"), "--reencode", "clips", "--gop", "16",
                  "--reencode-scale", "40x30"])
    first = (out / "wh" / "train_reencoded.list").read_text().split()[0]
    assert _size(out / "wh" / first) == (40, 30, N)
    assert _keyframes(out / "wh" / first) == [0, 16, 32]
    # the defaults: a keyframe every 4 frames, and the fast-decode tuning (I and P frames only)
    _load().main(["--train-dir", str(videos), "--out", str(out / "defaults"), "--reencode", "clips"])
    first = out / "defaults" / (out / "defaults" / "train_reencoded.list").read_text().split()[0]
    assert _keyframes(first) == list(range(0, N, 4))
    with av.open(str(first)) as c:
        assert {int(f.pict_type) for f in c.decode(video=0)} <= {int(av.video.frame.PictureType.I),
                                                               int(av.video.frame.PictureType.P)}


def test_parse_scale_and_output_size():
    pk = _load()
    assert pk.parse_scale("0") is None and pk.parse_scale("256") == 256 and pk.parse_scale("340x256") == (340, 256)
    with pytest.raises(Exception):
        pk.parse_scale("big")
    assert pk.output_size(455, 256, 256) == (456, 256)
    assert pk.output_size(640, 480, None) == (640, 480)
    assert pk.output_size(341, 255, (340, 256)) == (340, 256)


def test_access_paths_give_identical_frames(prepared, tmp_path):
    videos, _ = prepared
    src = videos / "b_cls" / "v0.mp4"
    short = tmp_path / "short.mp4"
    assert _load().reencode_video((str(src), str(short), 8, None, 23, "veryfast")) == (N, None)
    fast = tmp_path / "fast.mp4"            # --fast-decode: the same keyframes, no B-frames
    assert _load().reencode_video((str(src), str(fast), 8, None, 23, "veryfast", True)) == (N, None)
    assert _keyframes(fast) == list(range(0, N, 8))
    with av.open(str(fast)) as c:
        assert {int(f.pict_type) for f in c.decode(video=0)} <= {int(av.video.frame.PictureType.I),
                                                               int(av.video.frame.PictureType.P)}
    rng = np.random.default_rng(0)
    for path in (src, short, fast):         # mp4v (keyint 12) and short-GOP H.264 (keyint 8)
        for idx in [np.array([0, 39, 39, 7, 8, 20])] + [sample_indices(N, 3, 2, True, rng).reshape(-1)
                                                        for _ in range(3)]:
            batch = _DecordVideo(str(path)).read(idx, "batch")
            seek = _DecordVideo(str(path)).read(idx, "seek")
            pyav = _PyAVVideo(str(path)).read(idx)
            forward = super(_PyAVVideo, _PyAVVideo(str(path))).read(idx)    # the sequential read
            assert batch.shape == (len(idx), H, W, 3)
            np.testing.assert_array_equal(batch, seek)
            np.testing.assert_array_equal(pyav, forward)
            np.testing.assert_array_equal(pyav, batch)
