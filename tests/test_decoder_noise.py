"""The decoders' own stderr lines (libjpeg, FFmpeg, decord) are not printed: readers/decoding.py
captures file descriptor 2 around each decode; our warning (logger "zoo") names the file, once per
file, when it decodes anyway, and the SampleError names it when it does not. On real files made here."""
import logging
import os
import sys

import cv2
import numpy as np
import pytest

from engine.errors import SampleError
from readers import coco, decoding, kinetics, segmentation
from readers.decoding import CaptureStderr, decoder_line, read_image
from tests.conftest import DEEPLAB_DEMO
from tests.helpers import tool

NOISE = ("JPEG", "moov", " @ 0x", ".cc:", "ERROR", "dht", "[")   # what the decoders' lines carry


@pytest.fixture
def zoo_warnings(caplog):
    """The messages logger "zoo" warns, even after a tool's setup_logging stopped it propagating."""
    logger = logging.getLogger("zoo")
    propagate, logger.propagate = logger.propagate, True
    with caplog.at_level(logging.WARNING, logger="zoo"):
        yield lambda: [r.getMessage() for r in caplog.records if r.name == "zoo"]
    logger.propagate = propagate


def _image():
    y, x = np.mgrid[:72, :96]
    return np.stack([x * 2, y * 3, (x + y) % 256], -1).astype(np.uint8)


@pytest.fixture
def jpegs(tmp_path):
    """(good, truncated) real JPEGs: cv2.imwrite's file, and its first 60%."""
    good = str(tmp_path / "good.jpg")
    assert cv2.imwrite(good, _image())
    data = open(good, "rb").read()
    trunc = tmp_path / "trunc.jpg"
    trunc.write_bytes(data[: int(len(data) * 0.6)])
    return good, str(trunc)


def _imread_rgb(path):
    """cv2.imread's pixels (RGB), its own libjpeg lines kept off the stderr the tests watch."""
    with CaptureStderr():
        return cv2.imread(str(path), cv2.IMREAD_COLOR)[:, :, ::-1]


def _fd2():
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------------------- the fd-2 capture
def test_capture_takes_what_c_code_writes_to_fd2_and_gives_fd2_back(capfd):
    before = _fd2()
    with CaptureStderr() as cap:
        os.write(2, b"[mjpeg @ 0x55d0c0ffee00] dht: len 74 is too large\nsecond line\n")
    os.write(2, b"after\n")
    assert cap.text == "[mjpeg @ 0x55d0c0ffee00] dht: len 74 is too large\nsecond line\n"
    assert cap.line == "dht: len 74 is too large"
    assert _fd2() == before and capfd.readouterr().err == "after\n"
    with CaptureStderr() as quiet:   # the capture file was emptied
        pass
    assert quiet.text == "" and quiet.line == ""
    assert decoder_line("[11:09:10] /github/workspace/src/video/video_reader.cc:83: ERROR opening: x.mp4") \
        == "ERROR opening: x.mp4"


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_fd2_is_restored_after_an_exception(capfd, exc):
    before, fds = _fd2(), _open_fds()
    with pytest.raises(exc):
        with CaptureStderr():
            os.write(2, b"Premature end of JPEG file\n")
            raise exc("in the decode")
    os.write(2, b"after\n")
    assert _fd2() == before and _open_fds() == fds
    assert capfd.readouterr().err == "after\n"
    assert decoding._Sink.lock.acquire(blocking=False)   # released
    decoding._Sink.lock.release()


def test_python_output_buffered_before_is_not_captured_and_a_nested_capture_leaves_it_to_the_outer(capfd):
    sys.stderr.write("python's own, no newline yet")
    with CaptureStderr() as outer:
        with CaptureStderr() as inner:
            os.write(2, b"from C\n")
    assert outer.text == "from C\n" and inner.text == ""
    assert capfd.readouterr().err == "python's own, no newline yet"


# ------------------------------------------------------------------------------------------ images
def test_one_image_reader_for_the_readers():
    assert segmentation.read_image is coco.read_image is read_image


def test_truncated_jpeg_decodes_as_imread_quietly_with_one_warning(jpegs, capfd, zoo_warnings):
    good, trunc = jpegs
    for path in (good, trunc):
        expected = _imread_rgb(path)
        for _ in range(3):    # every epoch reads it again
            img = read_image(path)
            assert img.dtype == np.uint8 and img.flags.c_contiguous and np.array_equal(img, expected)
    assert capfd.readouterr().err == ""
    assert zoo_warnings() == [f"image {trunc}: the decoder reported 'Premature end of JPEG file' "
                              f"(truncated or damaged?): using what it decoded"]


def test_an_image_that_does_not_decode_names_the_file_and_what_the_decoder_said(tmp_path, jpegs, capfd):
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    with pytest.raises(SampleError, match=r"cannot decode image .*garbage\.jpg \(corrupt or not an image\)$"):
        segmentation.read_image(str(garbage))
    stub = tmp_path / "stub.jpg"      # the headers of a JPEG, no scan
    stub.write_bytes(open(jpegs[0], "rb").read()[:300])
    with pytest.raises(SampleError, match=r"cannot decode image .*stub\.jpg \(image id 7 of a\.json\) \(corrupt "
                                          r"or not an image\): the decoder reported 'Premature end of JPEG file'"):
        coco.read_image(str(stub), " (image id 7 of a.json)")
    with pytest.raises(SampleError, match="image not found: .*gone.jpg"):
        read_image(str(tmp_path / "gone.jpg"))
    assert capfd.readouterr().err == ""


def test_a_truncated_frame_of_a_frame_folder(tmp_path, jpegs, capfd, zoo_warnings):
    good, trunc = jpegs
    data = {1: open(good, "rb").read(), 2: open(trunc, "rb").read()}
    for i in (1, 2):
        (tmp_path / f"img_{i:05d}.jpg").write_bytes(data[i])
    imgs, idx = kinetics.read_frame_folder(str(tmp_path), None, "img_{:05d}.jpg", 2, 1, False, None)
    assert idx.reshape(-1).tolist() == [0, 1] and np.array_equal(imgs[1], _imread_rgb(trunc))
    assert capfd.readouterr().err == ""
    assert len(zoo_warnings()) == 1 and zoo_warnings()[0].startswith(f"frame {tmp_path / 'img_00002.jpg'}: ")


# ------------------------------------------------------------------------------------------ videos
def _write_video(path, fourcc, n=32):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 25, (64, 48))
    assert writer.isOpened()
    for i in range(n):
        writer.write(np.full((48, 64, 3), 8 * i, np.uint8))
    writer.release()
    return open(path, "rb").read()


def test_videos_that_do_not_decode_are_named_without_ffmpeg_lines_on_stderr(tmp_path, capfd):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    data = _write_video(tmp_path / "full.mp4", "mp4v")
    cut = tmp_path / "cut.mp4"      # mp4v's moov atom is at the end: cut, nothing opens
    cut.write_bytes(data[: len(data) // 2])
    for path in (garbage, cut):
        with pytest.raises(SampleError) as info:
            kinetics.read_video(str(path), 4, 1, False, None)
        message = str(info.value)
        assert message.startswith(f"cannot decode video {path} (decord: ") and "; cv2: " in message
        assert "\n" not in message and len(message) < 400
    assert message.endswith(": the decoder reported 'moov atom not found'")
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err


def test_a_video_that_decodes_while_its_decoder_complains_warns_once(tmp_path, capfd, zoo_warnings, monkeypatch):
    """A damaged file that decodes anyway. Whether FFmpeg complains about a cut file depends on which
    frames its decoding threads reach first (it varies from run to run), so the decoder here is a
    stand-in that writes what FFmpeg writes, at fd level, and returns frames."""
    class Complaining:
        def __init__(self, path):
            self.num_frames = 32

        def read(self, indices):
            os.write(2, b"[mjpeg @ 0x55c358edfc40] dht: len 74 is too large\n"
                        b"[mjpeg @ 0x55c358edfc40] huffman table decode error\n")
            return np.zeros((len(indices), 48, 64, 3), np.uint8)

    monkeypatch.setitem(kinetics._OPENERS, "decord", Complaining)
    path = tmp_path / "damaged.avi"
    for _ in range(2):
        imgs, idx = kinetics.read_video(str(path), 4, 1, False, None)
        assert imgs.shape == (4, 48, 64, 3)
    err = capfd.readouterr().err
    assert not any(n in err for n in NOISE), err
    assert zoo_warnings() == [f"video {path}: the decoder reported 'dht: len 74 is too large' (truncated or "
                              f"damaged?): using what it decoded"]


# -------------------------------------------------------------------------------------- end to end
def test_infer_on_a_truncated_jpeg_prints_our_warning_not_libjpegs(tmp_path, jpegs):
    from engine.session import Session   # paddle: only this test needs it
    import paddle
    weights = str(tmp_path / "model.pdparams")
    paddle.save(Session.from_file(DEEPLAB_DEMO).model().state_dict(), weights)
    good, trunc = jpegs
    proc = tool("infer", "-c", DEEPLAB_DEMO, "--weights", weights, "--input", trunc, good,
                "--output", tmp_path / "out")
    assert "Premature end of JPEG file" not in proc.stderr, proc.stderr
    assert f"WARNING image {trunc}: the decoder reported 'Premature end of JPEG file'" in proc.stdout + proc.stderr
    assert os.path.isfile(tmp_path / "out" / "trunc.png") and os.path.isfile(tmp_path / "out" / "good.png")
