"""Verified, resumable, atomic downloads into the weights cache, and safe archive extraction.

Standard library only (urllib), so fetching weights never needs another dependency. A download goes
to `<dest>.partial` (resumed with an HTTP Range request after an interruption) and is renamed to
`<dest>` only once complete and verified, so a file at `<dest>` is always whole. A file placed there
by hand is used without any network access. The release servers are known to be flaky or gone
(dead BOS links), hence mirrors, retries and an error that tells an offline user where to put the file.
"""
import contextlib
import hashlib
import http.client
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib

from engine.errors import ConfigError

CHUNK = 1 << 20
USER_AGENT = "paddle-zoo-download/1"


class DownloadError(ConfigError):
    """A file could not be downloaded or verified; the message names the URL and where to put it."""


class ArchiveError(ConfigError):
    """An archive is unreadable or holds a member that would land outside its folder."""


class _Retry(Exception):
    """Transient failure (connection, timeout, 5xx, short read): try the same URL again."""


class _Final(Exception):
    """Failure that retrying the same URL cannot fix (404, 403 ...): go to the next mirror."""


def cache_dir():
    """`$PADDLE_ZOO_HOME/weights` when set, else `~/.cache/paddle_zoo/weights` (not created here)."""
    home = os.environ.get("PADDLE_ZOO_HOME")
    root = os.path.join(home, "weights") if home else os.path.join("~", ".cache", "paddle_zoo", "weights")
    return os.path.abspath(os.path.expanduser(root))


def url_filename(url):
    name = os.path.basename(urllib.parse.unquote(urllib.parse.urlparse(url).path))
    if not name:
        raise DownloadError(f"cannot tell a file name from URL {url}")
    return name


def file_hash(path, algo="sha256"):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def _one_line(obj):
    return " ".join(str(obj).split()) or type(obj).__name__


def _mismatch(path, sha256, md5):
    """(algo, expected, actual) of the first known hash that does not match, else None."""
    for algo, want in (("sha256", sha256), ("md5", md5)):
        if want:
            got = file_hash(path, algo)
            if got.lower() != want.strip().lower():
                return algo, want.strip().lower(), got
    return None


@contextlib.contextmanager
def _lock(dest):
    """Serialise downloads of one file across processes (every rank of a multi-card run may ask)."""
    try:
        import fcntl  # POSIX only: this must work where it is absent (the except)
    except ImportError:  # not POSIX: no lock, the atomic rename still keeps `dest` whole
        yield
        return
    try:
        fh = open(dest + ".lock", "a")
    except OSError as e:
        raise DownloadError(f"cannot write to {os.path.dirname(dest)}: {_one_line(e)}")
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class _Progress:
    """A plain-text bar updated in place on a terminal; silent otherwise."""

    def __init__(self, name, enabled):
        self.name = name
        self.enabled = bool(enabled) and sys.stderr.isatty()
        self.shown = False
        self.start = self.last = time.monotonic()
        self.first = None

    def update(self, done, total):
        if not self.enabled:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = done
        if now - self.last < 0.2 and (total is None or done < total):
            return
        self.last = now
        rate = (done - self.first) / max(now - self.start, 1e-6) / 1e6
        if total:
            bar = "#" * int(30 * done / total)
            text = f"{self.name} [{bar:<30}] {100 * done / total:5.1f}% {done / 1e6:.1f}/{total / 1e6:.1f} MB"
        else:
            text = f"{self.name} {done / 1e6:.1f} MB"
        sys.stderr.write(f"\r{text} {rate:.1f} MB/s ")
        sys.stderr.flush()
        self.shown = True

    def close(self):
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.shown = False


def _content_range(value):
    """'bytes a-b/N' -> (a, N); 'bytes */N' -> (None, N); N is None when '*'."""
    m = re.match(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)", value or "")
    if not m:
        return None, None
    start = int(m.group(1)) if m.group(1) is not None else None
    total = int(m.group(2)) if m.group(2) != "*" else None
    return start, total


def _fetch_once(url, partial, timeout, bar):
    """One request; appends to or rewrites `partial`. Returns True when bytes of an earlier attempt
    were kept (a resumed file)."""
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    headers = {"User-Agent": USER_AGENT}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except ValueError as e:  # malformed URL
        raise _Final(_one_line(e))
    except urllib.error.HTTPError as e:
        code, content_range = e.code, e.headers.get("Content-Range") if e.headers else None
        e.close()
        if code == 416 and have:  # nothing left to send: the partial file is complete
            _, total = _content_range(content_range)
            if total is None or total == have:
                return True
            os.remove(partial)  # larger than the file on the server: start over
            raise _Retry(f"partial file of {have} bytes does not fit the server's {total}")
        if code >= 500 or code in (408, 429):
            raise _Retry(f"HTTP {code}")
        raise _Final(f"HTTP {code} {_one_line(e.reason)}")
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = _one_line(getattr(e, "reason", e))
        if reason.startswith("unknown url type"):
            raise _Final(reason)
        raise _Retry(reason)

    with resp:
        status = getattr(resp, "status", None) or 200  # file:// answers without a status
        length = resp.headers.get("Content-Length")
        if have and status == 206:
            start, total = _content_range(resp.headers.get("Content-Range"))
            if start != have:
                os.remove(partial)
                raise _Retry(f"server resumed at byte {start}, not {have}")
            if total is None and length:
                total = have + int(length)
            mode, done = "ab", have
        else:  # 200: the server ignored the Range header, so the body is the whole file
            mode, done, total = "wb", 0, int(length) if length else None
        resumed = mode == "ab"
        with open(partial, mode) as f:
            while True:
                try:
                    block = resp.read(CHUNK)
                except (OSError, http.client.HTTPException) as e:
                    raise _Retry(f"transfer interrupted after {done} bytes ({_one_line(e)})")
                if not block:
                    break
                f.write(block)
                done += len(block)
                bar.update(done, total)
            f.flush()
            os.fsync(f.fileno())
    if total is not None and done < total:
        raise _Retry(f"connection closed after {done} of {total} bytes")
    return resumed


def _fetch(url, partial, retries, timeout, backoff, bar):
    """Retries transient failures with exponential back-off; returns `_fetch_once`'s resumed flag."""
    attempt = 0
    while True:
        try:
            return _fetch_once(url, partial, timeout, bar)
        except _Retry as e:
            if attempt >= retries:
                raise _Final(f"{e} (after {attempt + 1} attempts)")
            time.sleep(backoff * 2 ** attempt)
            attempt += 1
        finally:
            bar.close()


def download(urls, dest, sha256=None, md5=None, retries=3, timeout=30, progress=True, backoff=1.0,
             log=None):
    """Fetch `dest` from the first mirror that serves it, verify it, and return its path.

    A `dest` that exists and matches the known hash (or any `dest` when no hash is known) is returned
    without touching the network. Without a known hash the computed sha256 is printed with a warning:
    record it in the entry only if the file is trusted.
    """
    urls = [urls] if isinstance(urls, str) else list(urls or ())
    dest = os.path.abspath(os.path.expanduser(os.fspath(dest)))
    log = log or _stderr
    if not urls:
        raise DownloadError(f"no URL given for {dest}")
    if os.path.isfile(dest) and _mismatch(dest, sha256, md5) is None:
        return dest
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create the folder of {dest}: {_one_line(e)}")
    partial = dest + ".partial"
    with _lock(dest):
        if os.path.isfile(dest):  # another process may have finished it while we waited
            bad = _mismatch(dest, sha256, md5)
            if bad is None:
                return dest
            log(f"warning: {dest} has {bad[0]} {bad[2]}, expected {bad[1]}; downloading it again")
        failures = []
        for url in urls:
            if progress:
                log(f"downloading {url} -> {dest}")
            bar = _Progress(os.path.basename(dest), progress)
            try:
                resumed = _fetch(url, partial, retries, timeout, backoff, bar)
                bad = _mismatch(partial, sha256, md5)
                if bad and resumed:  # the kept bytes may come from another version of the file
                    log(f"warning: resumed download of {url} fails its {bad[0]} check; starting over")
                    os.remove(partial)
                    _fetch(url, partial, retries, timeout, backoff, bar)
                    bad = _mismatch(partial, sha256, md5)
            except _Final as e:
                failures.append(f"{url}: {e}")
                continue
            if bad:
                os.remove(partial)
                failures.append(f"{url}: {bad[0]} mismatch, expected {bad[1]}, got {bad[2]} "
                                "(the bad file was deleted)")
                continue
            if not sha256 and not md5:
                log(f"warning: no sha256/md5 is recorded for {url}, so it could not be verified; "
                    f"computed sha256 {file_hash(partial)}")
            os.replace(partial, dest)
            return dest
    raise DownloadError(f"cannot download {os.path.basename(dest)} from {'; '.join(failures)}; "
                        f"without network, place the file by hand at {dest}")


# ---------------------------------------------------------------- archives

def _refuse(archive, name, why):
    raise ArchiveError(f"refusing to extract {archive}: member '{name}' {why}")


def _check_name(archive, name):
    if not name or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or os.path.isabs(name):
        _refuse(archive, name, "has an absolute path")
    if ".." in re.split(r"[\\/]+", name):
        _refuse(archive, name, "has a '..' component")


def _inside(root, path):
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def _extract_tar(archive, root):
    with tarfile.open(archive, "r:*") as tf:
        for m in tf:
            _check_name(archive, m.name)
            if m.ischr() or m.isblk() or m.isfifo():
                _refuse(archive, m.name, "is a device file")
            if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                _refuse(archive, m.name, "has an unsupported type")
            target = os.path.join(root, m.name)
            # realpath against what is already extracted catches chains of innocent-looking symlinks
            if not _inside(root, os.path.dirname(target)) or not _inside(root, target):
                _refuse(archive, m.name, "would be written through a symlink outside the folder")
            if m.issym():
                if os.path.isabs(m.linkname) or not _inside(
                        root, os.path.join(os.path.dirname(target), m.linkname)):
                    _refuse(archive, m.name, f"is a symlink to '{m.linkname}', outside the folder")
            if m.islnk():
                if os.path.isabs(m.linkname) or not _inside(root, os.path.join(root, m.linkname)):
                    _refuse(archive, m.name, f"is a hard link to '{m.linkname}', outside the folder")
            tf.extract(m, root, filter="data")


def _extract_zip(archive, root):
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            _check_name(archive, info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                _refuse(archive, info.filename, "is a symlink (not supported in zip archives)")
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                _refuse(archive, info.filename, "is a device file")
        zf.extractall(root)


def _archive_kind(archive):
    low = archive.lower()
    if low.endswith(".zip"):
        return "zip"
    if re.search(r"\.(tar|tgz|tar\.gz|tar\.bz2|tbz2|tar\.xz|txz)$", low):
        return "tar"
    if zipfile.is_zipfile(archive):
        return "zip"
    if tarfile.is_tarfile(archive):
        return "tar"
    return None


def extract(archive, dest_dir):
    """Extract a .tar/.tar.gz/.tgz/.zip into `dest_dir` (replacing it) and return `dest_dir`.

    Members go to a temporary sibling folder first, so `dest_dir` appears only complete; a member
    with an absolute path, a '..' component, a link leading outside, or a device file stops it.
    """
    archive = os.fspath(archive)
    dest_dir = os.path.abspath(os.fspath(dest_dir))
    if not os.path.isfile(archive):
        raise ArchiveError(f"archive not found: {archive}")
    kind = _archive_kind(archive)
    if kind is None:
        raise ArchiveError(f"{archive} is not a .tar, .tar.gz/.tgz or .zip archive")
    parent = os.path.dirname(dest_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(dest_dir) + ".", suffix=".tmp", dir=parent)
    try:
        root = os.path.realpath(tmp)
        try:
            (_extract_zip if kind == "zip" else _extract_tar)(archive, root)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:
            raise ArchiveError(f"cannot read archive {archive}: {_one_line(e)}")
        if os.path.exists(dest_dir):
            old = tempfile.mkdtemp(prefix=os.path.basename(dest_dir) + ".", suffix=".old", dir=parent)
            os.replace(dest_dir, os.path.join(old, "x"))
            os.replace(tmp, dest_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return dest_dir


def archive_stem(name):
    """'tsn_kinetics.tar.gz' -> 'tsn_kinetics': the folder an archive is extracted into."""
    return re.sub(r"\.(zip|tar|tgz|tar\.gz|tar\.bz2|tbz2|tar\.xz|txz)$", "", name, flags=re.I) or name
