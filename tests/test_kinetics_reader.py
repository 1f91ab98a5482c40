"""Kinetics reader, video transforms, demo data and list preparation, on real files made here."""
import copy
import importlib.util
import inspect
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest

from engine.errors import ConfigError, SampleError
from engine.data import collate
from engine.registry import DATASETS, TRANSFORMS
from readers import kinetics, transforms as T, video_transforms as vt
from readers.kinetics import KineticsDataset, sample_indices

H, W, N = 48, 64, 32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name):
    """data/ holds scripts, not a package: load one by path."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "data", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gray_frames(n=N, h=H, w=W):
    """Frame i is uniformly gray at level 8*i: the decoded level tells the frame number."""
    return np.stack([np.full((h, w, 3), 8 * i, np.uint8) for i in range(n)])


def write_cv2(path, frames, fourcc):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 25,
                             (frames.shape[2], frames.shape[1]))
    assert writer.isOpened()
    for f in frames:
        writer.write(np.ascontiguousarray(f[:, :, ::-1]))
    writer.release()
    return str(path)


def write_ffmpeg(path, frames, codec_args):
    import imageio_ffmpeg
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "rawvideo",
           "-pix_fmt", "rgb24", "-s", f"{frames.shape[2]}x{frames.shape[1]}", "-r", "25", "-i", "-",
           *codec_args, "-pix_fmt", "yuv420p", str(path)]
    subprocess.run(cmd, input=frames.tobytes(), check=True)
    return str(path)


CODECS = {
    "mp4v.mp4": lambda p, f: write_cv2(p, f, "mp4v"),
    "mjpg.avi": lambda p, f: write_cv2(p, f, "MJPG"),
    "h264.mp4": lambda p, f: write_ffmpeg(p, f, ["-c:v", "libx264"]),
    "vp9.webm": lambda p, f: write_ffmpeg(p, f, ["-c:v", "libvpx-vp9", "-b:v", "0", "-crf", "30",
                                                 "-deadline", "realtime", "-cpu-used", "8"]),
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    out = {name: make(d / name, gray_frames()) for name, make in CODECS.items()}
    out["short"] = write_cv2(d / "short.avi", gray_frames(5), "MJPG")
    return out


def make_list(tmp_path, rows, name="list.txt"):
    path = tmp_path / name
    path.write_text("".join(f"{p} {lab}\n" for p, lab in rows))
    return str(path)


# ---------------------------------------------------------------- sampling

def test_train_indices_random_inside_each_segment():
    seen = set()
    for s in range(200):
        idx = sample_indices(40, 4, 3, True, np.random.default_rng(s))
        assert idx.shape == (1, 4, 3)
        starts = idx[0, :, 0]
        for i, st in enumerate(starts):
            assert i * 10 <= st <= i * 10 + 10 - 3  # the window stays in its segment
        assert (np.diff(idx[0], axis=1) == 1).all()  # seglen consecutive frames
        seen.update((starts - np.arange(4) * 10).tolist())
    assert seen == set(range(8))  # every offset 0..avg-seglen is drawn


def test_eval_indices_are_segment_centres_and_clips_spread():
    assert sample_indices(40, 4, 1, False)[0, :, 0].tolist() == [4, 14, 24, 34]
    assert sample_indices(43, 4, 1, False)[0, :, 0].tolist() == [4, 14, 24, 34]  # avg = 43 // 4
    assert sample_indices(40, 2, 5, False)[0].tolist() == [[9, 10, 11, 12, 13], [29, 30, 31, 32, 33]]
    two = sample_indices(40, 4, 1, False, num_clips=2)[:, :, 0]
    assert two.tolist() == [[2, 12, 22, 32], [7, 17, 27, 37]]


def test_short_videos_wrap_around():
    # fewer frames per segment than seglen: windows start at the segment start and run on
    assert sample_indices(10, 4, 3, True, np.random.default_rng(0))[0].tolist() == \
        [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8]]
    # fewer frames than segments: segment i starts at frame i, modulo the length
    assert sample_indices(3, 5, 1, False)[0, :, 0].tolist() == [0, 1, 2, 0, 1]
    assert sample_indices(3, 2, 4, True, np.random.default_rng(0))[0].tolist() == \
        [[0, 1, 2, 0], [1, 2, 0, 1]]


def test_sampling_depends_only_on_seed_epoch_index(tmp_path, videos):
    lst = make_list(tmp_path, [(videos["mjpg.avi"], 0)] * 6)
    a = KineticsDataset(lst, num_seg=4, seed=3)
    b = KineticsDataset(lst, num_seg=4, seed=3)
    first = [a[i]["_frame_idx"] for i in range(6)]
    assert all((b[i]["_frame_idx"] == first[i]).all() for i in range(6))
    assert all((a[i]["_frame_idx"] == first[i]).all() for i in range(6))
    assert any((first[i] != first[0]).any() for i in range(1, 6))  # differs by index
    b.set_epoch(1)
    assert any((b[i]["_frame_idx"] != first[i]).any() for i in range(6))  # and by epoch
    c = KineticsDataset(lst, num_seg=4, seed=4)
    assert any((c[i]["_frame_idx"] != first[i]).any() for i in range(6))


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("codec", sorted(CODECS))
def test_decoded_frames_are_the_sampled_ones(tmp_path, videos, codec):
    lst = make_list(tmp_path, [(videos[codec], 2)] * 4)
    for backend in ("decord", "cv2"):
        for mode, seglen in (("train", 3), ("val", 1)):
            ds = KineticsDataset(lst, num_seg=5, seglen=seglen, mode=mode, backend=backend)
            for i in range(4):
                s = ds[i]
                idx = s["_frame_idx"].reshape(-1)
                assert s["imgs"].shape == (5 * seglen, H, W, 3) and s["imgs"].dtype == np.uint8
                levels = s["imgs"].reshape(len(idx), -1).mean(1)
                assert np.abs(levels - 8 * idx).max() < 4, (codec, backend, idx, levels)
                assert s["label"] == 2 and s["label"].dtype == np.int64


def test_video_shorter_than_segments(tmp_path, videos):
    ds = KineticsDataset(make_list(tmp_path, [(videos["short"], 1)]), num_seg=8, seglen=2, mode="test")
    s = ds[0]
    idx = s["_frame_idx"].reshape(-1)
    assert idx.tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 0, 0, 1, 1, 2, 2, 3]
    assert np.abs(s["imgs"].reshape(16, -1).mean(1) - 8 * idx).max() < 4


def test_corrupt_and_missing_videos_are_skipped_and_counted(tmp_path, videos):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    truncated = tmp_path / "truncated.mp4"
    data = open(videos["mp4v.mp4"], "rb").read()
    truncated.write_bytes(data[: len(data) // 3])
    rows = [(videos["mp4v.mp4"], 0), (str(garbage), 1), (str(truncated), 2), (str(tmp_path / "gone.mp4"), 3)]
    lst = make_list(tmp_path, rows)
    tr = [{"name": "CenterCrop", "size": 32}, {"name": "Normalize"}]
    ds = KineticsDataset(lst, num_seg=3, transforms=tr, mode="val")
    batch = collate([ds[i] for i in range(4)])
    assert batch["num_skipped"] == 3
    assert batch["imgs"].shape == (1, 3, 3, 32, 32) and batch["index"].tolist() == [0]
    strict = KineticsDataset(lst, num_seg=3, skip_bad=False)
    for i in (1, 2, 3):
        with pytest.raises(SampleError, match=os.path.basename(rows[i][0])):
            strict[i]


@pytest.mark.parametrize("backend", ["cv2", "pyav"])
def test_container_promising_more_frames_than_it_holds(tmp_path, videos, backend):
    data = open(videos["mjpg.avi"], "rb").read()
    cut = tmp_path / "cut.avi"  # the header still says 32 frames
    cut.write_bytes(data[: int(len(data) * 0.8)])
    imgs, idx = kinetics.read_video(str(cut), 4, 1, False, None, backends=(backend,))
    assert idx.max() < 0.85 * N  # re-sampled over the frames actually there
    assert np.abs(imgs.reshape(4, -1).mean(1) - 8 * idx.reshape(-1)).max() < 4
    stub = tmp_path / "stub.avi"
    stub.write_bytes(data[: int(len(data) * 0.55)])  # the avi header is ~40% here
    with pytest.raises(SampleError, match=f"stub.avi.*{backend}: truncated"):
        kinetics.read_video(str(stub), 4, 1, False, None, backends=(backend,))


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_pyav_decodes_the_frames_decord_and_cv2_decode(videos, codec):
    """The pyav backend alone (no fallback): the same sampled frames as decord and cv2, frame-accurate
    (neighbouring frames differ by 8 grey levels). VP9 in webm has no frame count in its header, so
    pyav counts the frames by decoding."""
    for train, seglen, clips in ((True, 3, 1), (False, 1, 1), (False, 2, 3)):
        got = {b: kinetics.read_video(videos[codec], 5, seglen, train, np.random.default_rng(7), clips,
                                      backends=(b,))
               for b in ("pyav", "decord", "cv2")}
        imgs, idx = got["pyav"]
        assert imgs.shape == (clips * 5 * seglen, H, W, 3) and imgs.dtype == np.uint8
        assert np.abs(imgs.reshape(len(imgs), -1).mean(1) - 8 * idx.reshape(-1)).max() < 4, (codec, idx)
        for other in ("decord", "cv2"):
            assert (got[other][1] == idx).all(), (codec, other)
            assert np.abs(got[other][0].astype(int) - imgs).max() <= 3, (codec, other)


def test_pyav_backend_in_the_reader(tmp_path, videos):
    lst = make_list(tmp_path, [(videos["h264.mp4"], 0), (videos["vp9.webm"], 1)])
    pyav = KineticsDataset(lst, num_seg=4, seglen=2, backend="pyav", seed=3)
    assert pyav.backends == ("pyav", "decord", "cv2")  # the others only if pyav cannot read a file
    ref = KineticsDataset(lst, num_seg=4, seglen=2, backend="cv2", seed=3)
    for i in range(2):
        a, b = pyav[i], ref[i]
        assert (a["_frame_idx"] == b["_frame_idx"]).all()
        assert a["imgs"].shape == (8, H, W, 3) and np.abs(a["imgs"].astype(int) - b["imgs"]).max() <= 3


def test_pyav_backend_without_pyav_is_a_config_error(tmp_path, videos, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ImportError
    lst = make_list(tmp_path, [(videos["h264.mp4"], 0)])
    with pytest.raises(ConfigError, match=r"^Kinetics.backend 'pyav' needs PyAV \(pip install av\)") as e:
        KineticsDataset(lst, backend="pyav")
    assert "\n" not in str(e.value)
    assert KineticsDataset(lst, backend="decord").backends == ("decord", "cv2")  # pyav is never a fallback


def test_list_parsing_and_config_errors(tmp_path, videos):
    (tmp_path / "sub dir").mkdir()
    shutil.copy(videos["mjpg.avi"], tmp_path / "sub dir" / "v 1.avi")
    names = tmp_path / "names.txt"
    names.write_text("abseiling 1\nair drumming 0\n")  # Kinetics' "name idx" form
    lst = tmp_path / "l.txt"
    lst.write_text("sub dir/v 1.avi 1\nsub dir/v 1.avi abseiling\n\nsub dir/v 1.avi\n")
    ds = KineticsDataset(str(lst), label_names=str(names), mode="val")
    assert ds.label_names == ["air drumming", "abseiling"]
    assert ds.labels.tolist() == [1, 1, -1]  # relative to the list's folder; no label -> -1
    assert ds.describe(0) == str(tmp_path / "sub dir" / "v 1.avi")
    assert ds[2]["imgs"].shape == (3, H, W, 3)
    root_list = tmp_path / "elsewhere.txt"
    root_list.write_text("v 1.avi 0\n")
    assert os.path.isfile(KineticsDataset(str(root_list), data_root=str(tmp_path / "sub dir")).describe(0))
    bad = tmp_path / "bad.txt"
    bad.write_text("a.mp4 0\nb.mp4 7\n")
    with pytest.raises(ConfigError, match="bad.txt:2"):
        KineticsDataset(str(bad), label_names=str(names))
    with pytest.raises(ConfigError, match="not found"):
        KineticsDataset(str(tmp_path / "nope.txt"))
    for kw in ({"mode": "training"}, {"format": "pkl"}, {"num_seg": 0}, {"backend": "ffmpeg"}):
        with pytest.raises(ConfigError):
            KineticsDataset(str(lst), **kw)



def test_a_label_not_in_the_class_list_is_one_line_naming_file_line_and_label(tmp_path, videos):
    """`Red` for `red` (the issue's case): read as part of the path it made `video not found:
    .../clip.avi Red`, a skipped video and a class short of samples."""
    shutil.copy(videos["mjpg.avi"], tmp_path / "clip_0001.avi")
    names = tmp_path / "label_names.txt"
    names.write_text("blue\nred\nbed\n")
    lst = tmp_path / "train.list"
    lst.write_text("clip_0001.avi red\nclip_0001.avi Red\n")
    with pytest.raises(ConfigError) as e:
        KineticsDataset(str(lst), label_names=str(names))
    assert str(e.value) == (f"{lst}:2: label 'Red' is not a class of {names} (3 classes) (did you mean 'red'?)")
    # a missing video with a mistyped label: the label is still the error, not a skipped video
    lst.write_text("gone/clip_0009.mp4 Red\n")
    with pytest.raises(ConfigError, match=r"train.list:1: label 'Red' is not a class"):
        KineticsDataset(str(lst), label_names=str(names))
    # frame folders: `folder num_frames label`
    (tmp_path / "clip_0002").mkdir()
    lst.write_text("clip_0002 16 Red\n")
    with pytest.raises(ConfigError, match=r"train.list:1: label 'Red' is not a class"):
        KineticsDataset(str(lst), label_names=str(names), format="frames")
    # no class list: a name where an index belongs
    lst.write_text("clip_0001.avi red\n")
    with pytest.raises(ConfigError, match=r"train.list:1: label 'red' is not a class index, and "
                                          r"Kinetics.label_names is not set"):
        KineticsDataset(str(lst))
    # what stays a path: a file name with spaces and no label, and a class name with spaces
    shutil.copy(videos["mjpg.avi"], tmp_path / "my clip.avi")
    names.write_text("blue\nair drumming\n")
    lst.write_text("my clip.avi\nmy clip.avi air drumming\n")
    ds = KineticsDataset(str(lst), label_names=str(names))
    assert ds.labels.tolist() == [-1, 1] and ds.describe(0) == ds.describe(1) == str(tmp_path / "my clip.avi")


@pytest.fixture
def short_warnings():
    """What logger "zoo" warns about short clips, whatever an earlier test's setup_logging left on it
    (propagation off)."""
    logger, said = logging.getLogger("zoo"), []

    class Keep(logging.Handler):
        def emit(self, record):
            if "fewer than the" in record.getMessage():
                said.append(record.getMessage())

    handler, level = Keep(logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.WARNING, logging.WARNING))
    yield said
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_clips_shorter_than_a_clip_samples_say_so_once(tmp_path, videos, short_warnings):
    """Five 5-frame clips, read twice (two epochs), with 8 segments x 2 frames = 16 sampled: one
    warning naming a file, its 5 frames and the 16; a 32-frame clip with 16 sampled says nothing."""
    rows = []
    for i in range(5):
        shutil.copy(videos["short"], tmp_path / f"short_{i}.avi")
        rows.append((f"short_{i}.avi", 0))
    ds = KineticsDataset(make_list(tmp_path, rows), num_seg=8, seglen=2, mode="test")
    for epoch in range(2):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            ds[i]
    (said,) = short_warnings
    assert "short_0.avi has 5 frames, fewer than the 16 a clip samples (num_seg 8 x seglen 2)" in said, said
    full = KineticsDataset(make_list(tmp_path, [(videos["mjpg.avi"], 0)], "full.txt"), num_seg=8, seglen=2,
                           mode="test")
    full[0]
    assert short_warnings == [said]


def test_the_short_clip_warning_is_once_across_worker_processes(tmp_path, short_warnings):
    """The loader's workers are processes started again every epoch: one that said it stops the others."""
    import multiprocessing
    frames = tmp_path / "frames"
    frames.mkdir()
    ok, jpg = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    for i in range(3):
        (frames / f"img_{i + 1:05d}.jpg").write_bytes(jpg.tobytes())
    ds = KineticsDataset(make_list(tmp_path, [("frames 3", 0)] * 2), format="frames", num_seg=4, mode="test")
    worker = multiprocessing.get_context("fork").Process(target=ds.__getitem__, args=(0,))
    worker.start()
    worker.join()
    assert worker.exitcode == 0
    ds[1]
    assert short_warnings == []
    KineticsDataset(make_list(tmp_path, [("frames 3", 0)], "other.txt"), format="frames", num_seg=4,
                    mode="test")[0]
    assert len(short_warnings) == 1     # the flag is the reader's, not the process's
    # a copy (deepcopy, pickle) keeps what was said and says nothing more
    copied = copy.deepcopy(ds)
    copied[0]
    assert len(short_warnings) == 1 and pickle.loads(pickle.dumps(ds))._short_said.value == 1
    # a process started by spawn (the dataset pickled for it) shares the flag too
    fresh = KineticsDataset(make_list(tmp_path, [("frames 3", 0)], "spawned.txt"), format="frames", num_seg=4,
                            mode="test")
    worker = multiprocessing.get_context("spawn").Process(target=fresh.__getitem__, args=(0,))
    worker.start()
    worker.join()
    assert worker.exitcode == 0 and fresh._short_said.value == 1


# ---------------------------------------------------------------- transforms

def coord_frames(n, h, w):
    """Channel 0 = row, channel 1 = column, channel 2 = 10 * frame: pixel values tell their origin."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([np.stack([y, x, np.full_like(y, 10 * f)], -1) for f in range(n)]).astype(np.uint8)


def run(transform, imgs, seed=0, **meta):
    return transform({"imgs": imgs, "_rng": np.random.default_rng(seed), "_fields": {"imgs": "video"},
                      **meta})


def test_ten_crop_geometry():
    s = run(vt.TenCrop(20), coord_frames(2, 40, 50))
    imgs = s["imgs"]
    assert imgs.shape == (20, 20, 20, 3) and s["_num_crops"] == 10
    corners = [(0, 0), (0, 30), (20, 0), (20, 30), (10, 15)]
    for k, (y, x) in enumerate(corners):
        for f in range(2):
            crop = imgs[k * 2 + f]  # crop-major, then frames
            assert (crop[0, 0, 0], crop[0, 0, 1], crop[0, 0, 2]) == (y, x, 10 * f)
            assert crop[-1, -1, 0] == y + 19 and crop[-1, -1, 1] == x + 19
            flipped = imgs[(5 + k) * 2 + f]
            assert (flipped == crop[:, ::-1]).all()
            assert flipped[0, 0, 1] == x + 19


def test_three_crop_along_the_long_side():
    land = run(vt.ThreeCrop(20), coord_frames(1, 20, 60))["imgs"]
    assert [tuple(c[0, 0, :2]) for c in land] == [(0, 0), (0, 20), (0, 40)]
    port = run(vt.ThreeCrop(20), coord_frames(1, 50, 24))["imgs"]
    assert [tuple(c[0, 0, :2]) for c in port] == [(0, 2), (15, 2), (30, 2)]


def test_multiscale_crop_in_bounds_and_one_crop_per_video():
    h, w, size = 64, 85, 48
    base = min(h, w)
    sides = {size if abs(int(base * s) - size) < 3 else int(base * s) for s in (1, .875, .75, .66)}
    positions = set()
    for seed in range(300):
        y, x, ch, cw = vt.multiscale_crop_box(h, w, size, np.random.default_rng(seed))
        assert ch in sides and cw in sides and 0 <= y and y + ch <= h and 0 <= x and x + cw <= w
        ys, xs = (h - ch) // 4, (w - cw) // 4
        if ys and xs:
            positions.add((y // ys, x // xs))
    assert len(positions) == 13  # the 13 fixed offsets of TSN's more_fix_crop
    frames = coord_frames(4, h, w)
    for seed in range(5):
        out = run(vt.MultiScaleCrop(size), frames, seed)["imgs"]
        assert out.shape == (4, size, size, 3)
        assert (out[..., :2] == out[:1, ..., :2]).all()  # same geometry on every frame
        assert [int(out[f, ..., 2].mean()) for f in range(4)] == [0, 10, 20, 30]


def test_random_crop_and_flip_shared_by_all_frames():
    frames = coord_frames(3, 30, 40)
    flips = set()
    for seed in range(20):
        s = run(T.RandomFlip(0.5), run(T.RandomCrop(16), frames, seed)["imgs"], seed)
        out = s["imgs"]
        assert (out[..., :2] == out[:1, ..., :2]).all()
        flips.add(bool(out[0, 0, 0, 1] > out[0, 0, -1, 1]))
    assert flips == {True, False}


def test_scale_fixed_ratio_and_keep_ratio():
    land = np.zeros((2, 360, 640, 3), np.uint8)
    assert run(T.Scale(256, fixed_ratio=True), land)["imgs"].shape == (2, 256, 341, 3)
    assert run(T.Scale(256), land)["imgs"].shape == (2, 256, 455, 3)
    port = np.zeros((1, 640, 360, 3), np.uint8)
    assert run(T.Scale(256, fixed_ratio=True), port)["imgs"].shape == (1, 341, 256, 3)
    keep = np.zeros((1, 256, 320, 3), np.uint8)  # short side already 256: left as is
    assert run(T.Scale(256, fixed_ratio=True), keep)["imgs"].shape == (1, 256, 320, 3)
    with pytest.raises(ConfigError, match="larger than the frames"):
        run(T.CenterCrop(300), keep)


def test_normalize_layout_superimages_and_views():
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (3 * 2, 8, 8, 3), dtype=np.uint8)  # 3 segments x seglen 2
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    out = run(T.Normalize(mean, std, in_main_process=False), imgs, _num_seg=3, _seglen=2)["imgs"]
    assert out.shape == (3, 6, 8, 8) and out.dtype == np.float32
    for t in range(3):
        for j in range(2):
            for c in range(3):
                ref = (imgs[t * 2 + j, :, :, c] / 255.0 - mean[c]) / std[c]
                np.testing.assert_allclose(out[t, 3 * j + c], ref, rtol=1e-5, atol=1e-5)
    # 2 clips x 2 segments, three crops: views are crop-major (v = crop * clips + clip)
    frames = coord_frames(4, 20, 40)
    s = run(vt.ThreeCrop(20), frames, _num_seg=2, _seglen=1, _num_clips=2)
    out = T.Normalize([0, 0, 0], [1 / 255] * 3, in_main_process=False)(s)["imgs"]  # identity: pixels kept
    assert out.shape == (6, 2, 3, 20, 20)
    for crop, x0 in enumerate([0, 10, 20]):
        for clip in range(2):
            for t in range(2):
                v = out[crop * 2 + clip, t]
                assert v[1, 0, 0] == x0 and v[2, 0, 0] == 10 * (clip * 2 + t)


def test_transforms_registered_with_annotated_kwargs():
    for name in ("Scale", "RandomCrop", "MultiScaleCrop", "RandomFlip", "CenterCrop", "ThreeCrop",
                 "TenCrop", "Normalize"):
        cls = TRANSFORMS.get(name)
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert all(p.annotation is not inspect.Parameter.empty for p in params), name
    params = list(inspect.signature(DATASETS.get("Kinetics").__init__).parameters.values())[1:]
    assert all(p.annotation is not inspect.Parameter.empty for p in params)


# ---------------------------------------------------------------- frames format and tools

def smooth_frames(n, h, w):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([np.stack([(2 * x + 5 * f) % 256, (3 * y + 7 * f) % 256, 128 + 0 * x + 4 * f], -1)
                     for f in range(n)]).astype(np.uint8)


def test_frames_folder_matches_video(tmp_path):
    frames = smooth_frames(20, 48, 64)
    video = write_cv2(tmp_path / "v.avi", frames, "MJPG")
    folder = tmp_path / "v_frames"
    folder.mkdir()
    for i, f in enumerate(frames, 1):
        cv2.imwrite(str(folder / f"img_{i:05d}.jpg"), f[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
    tr = [{"name": "Scale", "short_size": 40}, {"name": "CenterCrop", "size": 32},
          {"name": "Normalize", "in_main_process": False}]
    vid = KineticsDataset(make_list(tmp_path, [(video, 1)], "v.txt"), num_seg=3, seglen=2, mode="val",
                          transforms=tr)
    counted = KineticsDataset(make_list(tmp_path, [(str(folder), 1)], "f.txt"), format="frames",
                              num_seg=3, seglen=2, mode="val", transforms=tr)
    (tmp_path / "f3.txt").write_text(f"{folder} 20 1\n")
    listed = KineticsDataset(str(tmp_path / "f3.txt"), format="frames", num_seg=3, seglen=2, mode="val",
                             transforms=tr)
    a, b, c = vid[0]["imgs"], counted[0]["imgs"], listed[0]["imgs"]
    assert a.shape == b.shape == (3, 6, 32, 32)
    assert np.array_equal(b, c)
    assert np.abs(a - b).mean() < 0.1  # JPEG vs MJPG coding (ImageNet-normalised units)
    s = KineticsDataset(str(tmp_path / "f3.txt"), format="frames", num_seg=3, seglen=2)[0]
    ref = frames[s["_frame_idx"].reshape(-1)].astype(np.float32)
    assert np.abs(s["imgs"].astype(np.float32) - ref).mean() < 4  # frame i is img_{i+1}


def test_prepare_kinetics_on_a_tiny_folder(tmp_path):
    prepare_kinetics = load_script("prepare_kinetics")
    root = tmp_path / "k"
    for cls in ("zumba", "air drumming"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            write_cv2(root / cls / f"{i}.mp4", smooth_frames(6 + i, 32, 40), "mp4v")
    (root / "zumba" / "notes.txt").write_text("not a video")
    out = tmp_path / "lists"
    prepare_kinetics.main(["--root", str(root), "--out", str(out), "--val-fraction", "0.34",
                           "--frames", "--frame-short-side", "16"])
    assert (out / "label_names.txt").read_text().split("\n")[:2] == ["air drumming", "zumba"]
    train = (out / "train.list").read_text().strip().split("\n")
    val = (out / "val.list").read_text().strip().split("\n")
    assert len(train) == 4 and len(val) == 2
    assert sorted(int(ln.rsplit(None, 1)[1]) for ln in val) == [0, 1]
    ds = KineticsDataset(str(out / "train.list"), label_names=str(out / "label_names.txt"), num_seg=2)
    assert sorted(ds.labels.tolist()) == [0, 0, 1, 1] and ds[0]["imgs"].shape[1:] == (32, 40, 3)
    frames_lines = (out / "val_frames.list").read_text().strip().split("\n")
    assert len(frames_lines) == 2
    fds = KineticsDataset(str(out / "val_frames.list"), format="frames", num_seg=2, mode="val")
    for i, ln in enumerate(frames_lines):
        path, n, label = ln.rsplit(None, 2)
        assert len(os.listdir(out / path)) == int(n) and fds.labels[i] == int(label)
        assert fds[i]["imgs"].shape == (2, 16, 20, 3)


def test_demo_data_is_real_video_and_idempotent(tmp_path):
    import decord
    demo_kinetics = load_script("demo_kinetics")
    out = demo_kinetics.make(str(tmp_path), seed=1, num_train=10, num_val=5)
    for demo, folder in out.items():
        assert os.path.isfile(os.path.join(folder, "DONE"))
        names = open(os.path.join(folder, "label_names.txt")).read().split()
        assert len(names) == 5
        ds = KineticsDataset(os.path.join(folder, "train.list"), num_seg=3, seglen=5 if demo == "motion" else 1)
        assert len(ds) == 10 and sorted(set(ds.labels.tolist())) == list(range(5))
        vr = decord.VideoReader(ds.describe(0))
        assert len(vr) == (24 if demo == "motion" else 16) and vr[0].shape == (64, 80, 3)
    stamps = {demo: os.path.getmtime(os.path.join(folder, "DONE")) for demo, folder in out.items()}
    demo_kinetics.make(str(tmp_path), seed=1, num_train=10, num_val=5)
    assert {demo: os.path.getmtime(os.path.join(folder, "DONE")) for demo, folder in out.items()} == stamps
    # a new version of one demo rewrites that demo only
    with open(os.path.join(out["appearance"], "DONE")) as f:
        assert json.load(f)["version"] == demo_kinetics.VERSIONS["appearance"]
    with open(os.path.join(out["motion"], "DONE")) as f:
        old = json.load(f)
    with open(os.path.join(out["motion"], "DONE"), "w") as f:
        json.dump(dict(old, version=old["version"] - 1), f)
    demo_kinetics.make(str(tmp_path), seed=1, num_train=10, num_val=5)
    with open(os.path.join(out["motion"], "DONE")) as f:
        assert json.load(f) == old
    assert os.path.getmtime(os.path.join(out["appearance"], "DONE")) == stamps["appearance"]


def test_motion_demo_frames_change_only_when_the_class_moves():
    dk = load_script("demo_kinetics")
    for label, name in enumerate(dk.MOTION_CLASSES):
        v = dk.motion_video(label, np.random.default_rng([5, label])).astype(np.float32)
        moved = (np.abs(np.diff(v, axis=0)).max(-1) > 80).mean()  # far above the frame noise
        assert (moved > 0.005) == (name != "static"), (name, moved)


def test_motion_demo_sprites_differ_from_the_background_in_luminance():
    """The sprite stands out in luminance, not only in colour (a colour-only edge is blurred by the
    codecs' 4:2:0 chroma). A moving sprite covers each pixel in few frames, so the per-pixel median over
    time is the background; by construction the sprite is >= 22 grey levels of luma away from it
    (background 99-155 once flattened, dark sprites <= 77, light ones >= 178), ~60 typically."""
    dk = load_script("demo_kinetics")
    luma = np.array([0.299, 0.587, 0.114], np.float32)
    for i in range(30):
        v = dk.motion_video(1 + i % 3, np.random.default_rng([6, i])).astype(np.float32)  # up/down/horizontal
        d = v - np.median(v, axis=0)
        sprite = np.abs(d).max(-1) > 60
        assert np.median(np.abs(d @ luma)[sprite]) > 40, i


def test_for_inputs_reads_raw_files_and_folders(tmp_path, videos):
    (tmp_path / "a" / "b").mkdir(parents=True)
    shutil.copy(videos["h264.mp4"], tmp_path / "a" / "b" / "x.mp4")
    shutil.copy(videos["mjpg.avi"], tmp_path / "a" / "y.AVI")
    (tmp_path / "a" / "notes.txt").write_text("-")
    recipe = {"list_file": "val.list", "num_seg": 4, "mode": "train",
              "transforms": [{"name": "CenterCrop", "size": 32}, {"name": "Normalize"}]}
    ds = KineticsDataset.for_inputs([str(tmp_path / "a"), videos["vp9.webm"]], **recipe)
    assert [os.path.basename(ds.describe(i)) for i in range(len(ds))] == ["x.mp4", "y.AVI", "vp9.webm"]
    assert ds.mode == "test" and ds.labels.tolist() == [-1, -1, -1]
    assert collate([ds[i] for i in range(3)])["imgs"].shape == (3, 4, 3, 32, 32)
    frames = tmp_path / "f" / "v1"
    frames.mkdir(parents=True)
    for i in range(1, 7):
        cv2.imwrite(str(frames / f"img_{i:05d}.jpg"), np.zeros((8, 8, 3), np.uint8))
    fds = KineticsDataset.for_inputs([str(tmp_path / "f")], format="frames", num_seg=2)
    assert len(fds) == 1 and fds[0]["imgs"].shape == (2, 8, 8, 3)
    with pytest.raises(ConfigError, match="no video files"):
        KineticsDataset.for_inputs([str(tmp_path / "f")])
    with pytest.raises(ConfigError, match="not found"):
        KineticsDataset.for_inputs([str(tmp_path / "missing.mp4")])
