"""Downloads against a local HTTP server: resume, retries, hash checks, offline errors, safe extraction,
weight resolution and the download tool."""
import hashlib
import http.server
import importlib.util
import io
import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
import zipfile

import numpy as np
import pytest

from engine.weights import download as dl
from engine.weights.download import ArchiveError, DownloadError, download, extract
from engine.weights.pretrained import (WEIGHTS, PretrainedEntry, load_pretrained, load_weights_file,
                               resolve_weights)
from engine.errors import ConfigError
from engine.model import ZooModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(backoff=0.01, progress=False, timeout=5)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves `state.files`; honours `Range` unless told not to; can fail on demand."""

    def do_GET(self):
        st = self.server.state
        rng = self.headers.get("Range")
        st.requests.append((self.path, rng))
        codes = st.errors.get(self.path)
        if codes:
            self.send_error(codes.pop(0))
            return
        if self.path not in st.files:
            self.send_error(404)
            return
        data, start = st.files[self.path], 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and st.honour_range:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = st.cut_after.pop(self.path, None)  # once: send part of the body, then hang up
        self.wfile.write(body if cut is None else body[:cut])
        self.wfile.flush()

    def log_message(self, *args):
        pass


class _State:
    def __init__(self):
        self.files, self.errors, self.cut_after, self.requests = {}, {}, {}, []
        self.honour_range = True


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.state = _State()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    yield base, srv.state, srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def zoo_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ZOO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _blob(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _leftovers(dest):
    return [p for p in (dest, dest + ".partial") if os.path.exists(p)]


def test_cache_dir_follows_env(zoo_home, monkeypatch):
    assert dl.cache_dir() == str(zoo_home / "weights")
    monkeypatch.delenv("PADDLE_ZOO_HOME")
    assert dl.cache_dir() == os.path.expanduser("~/.cache/paddle_zoo/weights")


def test_verified_download_and_cache_hit_without_network(server, tmp_path):
    base, st, srv = server
    data = _blob(3000)
    st.files["/w.pdparams"] = data
    dest = str(tmp_path / "c" / "w.pdparams")
    assert download([f"{base}/w.pdparams"], dest, sha256=_sha(data), **FAST) == dest
    assert open(dest, "rb").read() == data and not os.path.exists(dest + ".partial")
    srv.shutdown()
    srv.server_close()
    n = len(st.requests)
    assert download([f"{base}/w.pdparams"], dest, sha256=_sha(data), **FAST) == dest
    assert len(st.requests) == n


def test_hash_mismatch_rejected_and_file_removed(server, tmp_path):
    base, st, _ = server
    st.files["/w.pdparams"] = data = _blob(2000)
    dest = str(tmp_path / "w.pdparams")
    url = f"{base}/w.pdparams"
    with pytest.raises(DownloadError) as err:
        download([url], dest, sha256="ab" * 32, **FAST)
    msg = str(err.value)
    assert url in msg and "ab" * 32 in msg and _sha(data) in msg and "\n" not in msg
    assert _leftovers(dest) == []
    with pytest.raises(DownloadError, match=hashlib.md5(data).hexdigest()):
        download([url], dest, md5="0" * 32, **FAST)
    assert _leftovers(dest) == []


def test_interrupted_transfer_is_resumed(server, tmp_path):
    base, st, _ = server
    st.files["/big.pdparams"] = data = _blob(50000, 1)
    st.cut_after["/big.pdparams"] = 12345
    dest = str(tmp_path / "big.pdparams")
    download([f"{base}/big.pdparams"], dest, sha256=_sha(data), **FAST)
    assert open(dest, "rb").read() == data
    assert ("/big.pdparams", "bytes=12345-") in st.requests


def test_partial_file_resumed_restarted_or_complete(server, tmp_path):
    base, st, _ = server
    st.files["/f.bin"] = data = _blob(8000, 2)
    url, dest = f"{base}/f.bin", str(tmp_path / "f.bin")
    # a partial left by an earlier run is continued with a Range request
    open(dest + ".partial", "wb").write(data[:3000])
    download([url], dest, sha256=_sha(data), **FAST)
    assert open(dest, "rb").read() == data and st.requests[-1] == ("/f.bin", "bytes=3000-")
    # a server that ignores Range answers 200 with the whole file: the partial is rewritten
    os.remove(dest)
    st.honour_range = False
    open(dest + ".partial", "wb").write(b"x" * 3000)
    download([url], dest, sha256=_sha(data), **FAST)
    assert open(dest, "rb").read() == data
    # a complete partial: 416 means nothing is left to fetch
    os.remove(dest)
    st.honour_range = True
    open(dest + ".partial", "wb").write(data)
    download([url], dest, sha256=_sha(data), **FAST)
    assert open(dest, "rb").read() == data and not os.path.exists(dest + ".partial")


def test_server_error_retried_then_mirror_used(server, tmp_path):
    base, st, _ = server
    st.files["/w.pdparams"] = data = _blob(1000)
    st.errors["/w.pdparams"] = [500, 503]
    dest = str(tmp_path / "w.pdparams")
    download([f"{base}/w.pdparams"], dest, sha256=_sha(data), **FAST)
    assert len(st.requests) == 3
    # a dead first mirror (404) falls through to the second
    os.remove(dest)
    download([f"{base}/gone.pdparams", f"{base}/w.pdparams"], dest, sha256=_sha(data), **FAST)
    assert open(dest, "rb").read() == data


def test_404_is_final_and_names_the_url(server, tmp_path):
    base, st, _ = server
    url, dest = f"{base}/missing.pdparams", str(tmp_path / "missing.pdparams")
    with pytest.raises(DownloadError) as err:
        download([url], dest, **FAST)
    msg = str(err.value)
    assert url in msg and "404" in msg and dest in msg and "\n" not in msg
    assert len(st.requests) == 1 and _leftovers(dest) == []


def test_offline_names_url_and_place_to_put_the_file(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url, dest = f"http://127.0.0.1:{port}/w.pdparams", str(tmp_path / "w" / "w.pdparams")
    with pytest.raises(DownloadError) as err:
        download([url], dest, retries=1, **FAST)
    msg = str(err.value)
    assert url in msg and f"place the file by hand at {dest}" in msg and "\n" not in msg
    # and a file placed there by hand is then used as is
    open(dest, "wb").write(b"by hand")
    assert download([url], dest, retries=1, **FAST) == dest


def test_unknown_hash_warns_with_computed_sha256(server, tmp_path, capsys):
    base, st, _ = server
    st.files["/w.pdparams"] = data = _blob(700)
    download([f"{base}/w.pdparams"], str(tmp_path / "w.pdparams"), **FAST)
    err = capsys.readouterr().err
    assert "warning" in err and "could not be verified" in err and _sha(data) in err


# ---------------------------------------------------------------- archives

def _tar(path, members, mode="w"):
    """members: list of (TarInfo, bytes or None)."""
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return str(path)


def _file(name, data=b"x"):
    return tarfile.TarInfo(name), data


def _dir(name):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize("members, member", [
    ([_file("ok.txt"), _file("../x")], "../x"),
    ([_file("/tmp/abs_x")], "/tmp/abs_x"),
    ([_link("evil", "../../etc")], "evil"),
    ([_link("evil", "/etc/passwd")], "evil"),
    ([_link("hard", "../outside", tarfile.LNKTYPE)], "hard"),
    ([_dir("d"), _link("d/up", ".."), _link("d/up/esc", "..")], "d/up/esc"),  # a chain
    ([_link("dev", "", tarfile.CHRTYPE)], "dev"),
])
def test_unsafe_tar_members_are_refused(tmp_path, members, member):
    archive = _tar(tmp_path / "bad.tar", members)
    out = tmp_path / "out"
    with pytest.raises(ArchiveError) as err:
        extract(archive, out)
    assert f"'{member}'" in str(err.value) and "\n" not in str(err.value)
    assert not out.exists() and os.listdir(tmp_path) == ["bad.tar"]


def test_unsafe_zip_member_is_refused(tmp_path):
    path = tmp_path / "bad.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("../x", b"x")
    with pytest.raises(ArchiveError, match=r"'\.\./x'"):
        extract(path, tmp_path / "out")


def test_good_archives_extract_atomically(tmp_path):
    archive = _tar(tmp_path / "w.tar.gz", [_dir("m"), _file("m/w.pdparams", b"abc"),
                                           _link("m/alias", "w.pdparams")], mode="w:gz")
    out = tmp_path / "cache" / "w"
    out.parent.mkdir()
    open(out.parent / "stale", "w").close()
    assert extract(archive, out) == str(out)
    assert (out / "m" / "w.pdparams").read_bytes() == b"abc" and (out / "m" / "alias").read_bytes() == b"abc"
    assert sorted(os.listdir(out.parent)) == ["stale", "w"]  # no temp folder left
    zpath = tmp_path / "z.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("a/b.npz", b"zz")
    extract(zpath, out)  # replaces the earlier extraction
    assert os.listdir(out) == ["a"] and (out / "a" / "b.npz").read_bytes() == b"zz"
    with pytest.raises(ArchiveError, match="not a .tar"):
        extract(_touch(tmp_path / "x.bin"), tmp_path / "o")


# ---------------------------------------------------------------- resolve / load

@pytest.fixture
def entry(server, monkeypatch):
    base, st, _ = server
    import paddle

    buf = io.BytesIO()
    paddle.save({"fc.w": paddle.ones([3, 2]), "fc.b": paddle.full([2], 0.5)}, buf)
    st.files["/fc.pdparams"] = data = buf.getvalue()
    e = PretrainedEntry(name="test_fc_tmp", model="Linear", urls=[f"{base}/fc.pdparams"],
                        sha256=_sha(data), key_map=[(r"fc\.w", "weight"), (r"fc\.b", "bias")])
    monkeypatch.setitem(WEIGHTS._items, e.name, e)
    return e


def test_resolve_entry_name_downloads_and_loads(entry, zoo_home):
    import paddle

    path, got = resolve_weights(entry.name, progress=False)
    assert got is entry and path == str(zoo_home / "weights" / entry.name / "fc.pdparams")

    class Linear(ZooModel, paddle.nn.Linear):   # load_pretrained asks the model for its weights()
        pass

    model = Linear(3, 2)
    logs = []
    report = load_pretrained(model, entry.name, log=logs.append, progress=False)
    assert report["entry"] == entry.name and report["missing"] == [] and report["loaded"] == 2
    np.testing.assert_allclose(model.bias.numpy(), [0.5, 0.5])
    # a URL an entry lists is that entry (its hash and key map apply)
    assert resolve_weights(entry.urls[0], progress=False) == (path, entry)


def test_resolve_entry_with_archive_member(server, monkeypatch, zoo_home):
    base, st, _ = server
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("release/model.npz")
        payload = io.BytesIO()
        np.savez(payload, w=np.arange(4.0))
        info.size = len(payload.getvalue())
        tf.addfile(info, io.BytesIO(payload.getvalue()))
    st.files["/rel.tar.gz"] = buf.getvalue()
    e = PretrainedEntry(name="test_arc_tmp", model="X", urls=[f"{base}/rel.tar.gz"],
                        sha256=_sha(buf.getvalue()), archive_member="release/model.npz")
    monkeypatch.setitem(WEIGHTS._items, e.name, e)
    path, _ = resolve_weights(e.name, progress=False)
    assert path == str(zoo_home / "weights" / e.name / "rel" / "release" / "model.npz")
    np.testing.assert_array_equal(load_weights_file(path)["w"], np.arange(4.0))
    n = len(st.requests)
    assert resolve_weights(e.name, progress=False)[0] == path and len(st.requests) == n


def test_entry_without_release_quotes_its_notes(monkeypatch):
    e = PretrainedEntry(name="test_none_tmp", model="X", urls=[], notes="the publisher never released it")
    monkeypatch.setitem(WEIGHTS._items, e.name, e)
    with pytest.raises(ConfigError, match="no released file: the publisher never released it"):
        resolve_weights(e.name)


def test_resolve_url_local_path_and_missing(server, tmp_path, zoo_home):
    base, st, _ = server
    st.files["/dir/u.npz"] = b"u"
    path, e = resolve_weights(f"{base}/dir/u.npz", progress=False)
    assert (path, e) == (str(zoo_home / "weights" / "u.npz"), None) and open(path, "rb").read() == b"u"
    local = tmp_path / "mine.pdparams"
    local.write_bytes(b"m")
    assert resolve_weights(str(local)) == (str(local), None)
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "nope.pdparams"))):
        resolve_weights(str(tmp_path / "nope.pdparams"))


def test_load_weights_file_errors(tmp_path):
    bad = tmp_path / "bad.pdparams"
    bad.write_bytes(b"garbage" * 10)
    with pytest.raises(ConfigError) as err:
        load_weights_file(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unsupported weights file"):
        load_weights_file(_touch(tmp_path / "w.bin"))
    with pytest.raises(ConfigError, match="archive"):
        load_weights_file(_touch(tmp_path / "w.tar.gz"))


def _touch(path):
    path.write_bytes(b"")
    return path


# ---------------------------------------------------------------- tools/download.py

def _tool(*args, home):
    env = dict(os.environ, PADDLE_ZOO_HOME=str(home), GLOG_minloglevel="2")
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "download.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_tool_list_runs(zoo_home):
    res = _tool("--list", home=zoo_home)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()


@pytest.mark.parametrize("name, close", [("no_such_weights", None),
                                         ("tsn_r50_imagenet_int", "tsn_r50_imagenet_init")])
def test_tool_unknown_name_is_one_line_and_exit_2(zoo_home, name, close):
    """README: every tool exits with one `error: ...` line and code 2 on bad input (engine.cli.run)."""
    res = _tool(name, home=zoo_home)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr
    assert f"unknown pretrained weight '{name}'" in lines[0]
    if close:
        assert f"(did you mean '{close}'?)" in lines[0]
    else:
        assert "did you mean" not in lines[0]
    assert not os.path.exists(zoo_home / "weights" / name)


def test_tool_download_list_and_markdown(entry, tmp_path, monkeypatch, capsys):
    """In process, with a temporary entry (the subprocess cannot see it)."""
    spec = importlib.util.spec_from_file_location("zoo_tool_download", os.path.join(ROOT, "tools", "download.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(tool.components, "load_all", lambda: None)
    entry.metrics, entry.dataset, entry.num_params = {"top1": 0.717, "bleu": 27.3}, "K400 val", 8
    none = PretrainedEntry(name="test_none_tmp", model="X", urls=[], config="configs/x/x_demo.yaml")
    monkeypatch.setitem(WEIGHTS._items, none.name, none)
    monkeypatch.setattr(entry, "reproduced", "demo only")
    assert tool.main([entry.name, "--dir", str(tmp_path / "d")]) == 0
    assert os.path.isfile(tmp_path / "d" / entry.name / "fc.pdparams")
    assert tool.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "top1 71.70%, bleu 27.30 (K400 val)" in out and "no release" in out
    assert tool.main(["--markdown"]) == 0
    table = capsys.readouterr().out
    fc, none_ = "<code>test_<wbr>fc_<wbr>tmp</code>", "<code>test_<wbr>none_<wbr>tmp</code>"
    assert f"| Linear | {fc} | - | 0.00 M | - |" in table   # no recipe: no MACs
    assert f"| {fc} | top1 71.70%, bleu 27.30 (K400 val) | - | demo only |" in table
    assert f"{none_} (no release) | [x_<wbr>demo.yaml](configs/x/x_demo.yaml)" in table
    assert "| not run |" in table
    assert tool.main(["test_none_tmp"]) == 2
    assert "no released file" in capsys.readouterr().err
    # one name failing does not stop the others; the code says one failed
    assert tool.main(["test_none_tmp", entry.name, "--dir", str(tmp_path / "d")]) == 2
    out, err = capsys.readouterr()
    assert err.count("error: ") == 1 and "test_none_tmp" in err and f"{entry.name}: " in out
