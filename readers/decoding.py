"""Decoding without the decoders' noise: what the C libraries (libjpeg, libpng, FFmpeg, decord's
logger) write to file descriptor 2 while a file decodes is captured, never printed; our own message
names the file instead.

- `CaptureStderr`: a context manager pointing fd 2 at an in-memory file (memfd) for its block and
  back (always, exceptions and KeyboardInterrupt included); `.text` is what was written, `.line`
  its first message line without the libraries' `[tag @ 0x...]` / `[hh:mm:ss] file.cc:83:` prefixes.
  A few syscalls when nothing is written. fd 2 is the process's: a capture holds a lock (another
  thread's capture waits), and whatever another thread writes to stderr meanwhile is captured too
  (the readers decode in the calling thread or in DataLoader worker processes); a capture inside a
  capture of the same thread leaves the outer one in charge.
- `read_image`: one image file as uint8 RGB [H, W, 3] (cv2.imread's pixels, EXIF orientation
  included), or SampleError naming the file (and what the decoder said). A file that decodes while
  the decoder complains (a truncated JPEG decodes to grey below the cut) is used, with one warning
  naming it (`warn_decoded`: once per file per process, not every epoch).

Registers nothing (readers/__init__.py's COMPONENTS lists it not); the readers import it.
"""
import logging
import os
import re
import sys
import tempfile
import threading

import cv2
import numpy as np

from engine.errors import SampleError

log = logging.getLogger("zoo")

_MAX_READ = 1 << 16       # of a decoder's output, the first 64 KiB are read back (its first line matters)
_PREFIXES = re.compile(r"^(\[[^\]]* @ (0x)?[0-9a-fA-F]+\] *"               # FFmpeg: [mov,mp4,... @ 0x55...]
                       r"|\[\d\d:\d\d:\d\d\] \S+:\d+: *"                  # dmlc (decord): [11:09:10] file.cc:83:
                       r"|\[ *(WARN|ERROR|INFO|DEBUG)[^\]]*\] *(global )?(\S+:\d+ )?)+")   # OpenCV's logger


class _Sink:
    """The process's capture file (a memfd; a temporary file where there is none) and the lock that
    makes one capture at a time. A forked child (a DataLoader worker) makes its own: the parent's
    shares its file offset."""
    fd, pid = None, None
    lock = threading.Lock()
    local = threading.local()

    @classmethod
    def check_fork(cls):
        """In a forked child (a DataLoader worker) start afresh: the parent's file shares its offset,
        and its lock may have been held by a thread the child does not have."""
        if cls.pid != os.getpid():
            cls.forget_after_fork()
            cls.pid = os.getpid()

    @classmethod
    def get(cls):
        if cls.fd is None:
            if hasattr(os, "memfd_create"):
                cls.fd = os.memfd_create("zoo-decoder-stderr")        # close-on-exec by default
            else:
                with tempfile.TemporaryFile() as f:
                    cls.fd = os.dup(f.fileno())
        return cls.fd

    @classmethod
    def forget_after_fork(cls):
        if cls.fd is not None and cls.pid is not None:
            try:
                os.close(cls.fd)
            except OSError:
                pass
        cls.fd, cls.lock, cls.local = None, threading.Lock(), threading.local()


def decoder_line(text, limit=160):
    """The first non-empty line of a decoder's output (or an exception's message) without the
    libraries' prefixes, at most `limit` characters; "" when there is none."""
    for raw in text.splitlines():
        line = _PREFIXES.sub("", raw.strip()).strip()
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


class CaptureStderr:
    """`with CaptureStderr() as cap: decode(...)`: what was written to fd 2 meanwhile is in
    `cap.text` (not printed), its first message line in `cap.line`."""

    def __init__(self):
        self.text = ""
        self._saved = None

    @property
    def line(self):
        return decoder_line(self.text)

    def __enter__(self):
        _Sink.check_fork()
        local = _Sink.local
        if getattr(local, "depth", 0):          # the outer capture of this thread keeps what is written
            local.depth += 1
            return self
        _Sink.lock.acquire()
        try:
            self._saved = _redirect()
        except BaseException:
            _Sink.lock.release()
            raise
        local.depth = 1
        return self

    def __exit__(self, *exc):
        local = _Sink.local
        local.depth -= 1
        if local.depth:
            return False
        try:
            if self._saved is not None:
                try:
                    os.dup2(self._saved, 2)     # first of all: fd 2 is the process's stderr again
                finally:
                    os.close(self._saved)
                    self._saved = None
                try:
                    self.text = _drain(_Sink.fd)
                except OSError:                 # the capture file failed: the decode's result stands
                    pass
        finally:
            _Sink.lock.release()
        return False


def _redirect():
    """Point fd 2 at the capture file; the duplicate of the real stderr to restore, or None when
    there is nothing to capture with (no fd 2, no file): the decode then runs uncaptured."""
    try:
        sink = _Sink.get()
        if sys.stderr is not None:
            sys.stderr.flush()                  # Python's own buffered output goes where it was headed
        saved = os.dup(2)
    except (OSError, ValueError):
        return None
    try:
        os.dup2(sink, 2)
    except BaseException as e:
        os.close(saved)
        if isinstance(e, OSError):
            return None
        raise
    return saved


def _drain(fd):
    """What was written to the capture file (its offset is the count), which is then emptied."""
    size = os.lseek(fd, 0, os.SEEK_CUR)
    if not size:
        return ""
    data = os.pread(fd, min(size, _MAX_READ), 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    return data.decode("utf-8", "replace")


_warned = set()


def warn_decoded(what, path, line):
    """One warning (once per file in this process) for a file that decoded while its decoder
    reported `line`: it is used, and the log says which file to look at."""
    key = (what, os.fspath(path))
    if not line or key in _warned:
        return
    _warned.add(key)
    log.warning("%s %s: the decoder reported '%s' (truncated or damaged?): using what it decoded",
                what, path, line)


def reported(line):
    """`: the decoder reported '...'` for an error message, or "" without a line."""
    return f": the decoder reported '{line}'" if line else ""


def read_image(path, where="", what="image"):
    """uint8 RGB [H, W, 3] of an image file, or SampleError naming it (`where`: appended to the
    path in the messages; `what`: the word for the file in them, e.g. "frame").

    cv2.imread, not imdecode of the bytes: libjpeg's file source ends a truncated JPEG with a fake
    end-of-image marker (the rows below the cut grey), OpenCV's memory source fails on it."""
    if not os.path.isfile(path):
        raise SampleError(f"{what} not found: {path}{where}")
    with CaptureStderr() as cap:
        img = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
    line = cap.line
    if img is None:
        raise SampleError(f"cannot decode {what} {path}{where} (corrupt or not an image){reported(line)}")
    warn_decoded(what, path, line)
    return np.ascontiguousarray(img[:, :, ::-1])
