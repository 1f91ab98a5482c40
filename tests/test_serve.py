"""tools/serve.py (issue 64) on the trained demo exports, as a client sees it: each server a subprocess
on a free loopback port. The v2 answers equal the export's Predictor on the same feeds; the task
endpoint equals tools/infer.py on the same inputs (a video, images, sentence pairs, translations);
a burst is batched and each answer is its own; bad requests get one 4xx line and the server answers
the next good one; SIGTERM during a burst answers every accepted request and exits 0."""
import asyncio
import base64
import concurrent.futures
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

from benchmarks.serve import terminate
from serving import app
from tests.helpers import ENV, ROOT, tools_in_one_process

pytest.importorskip("uvicorn", reason="requirements-serve.txt (make test installs it)")


class Server:
    """tools/serve.py in a subprocess; `url` once its `serving NAME on URL` line came."""

    def __init__(self, export, *flags):
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--model", str(export),
                                      "--port", "0", *map(str, flags)], cwd=ROOT, env=ENV, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.lines, self._lines, self.url = [], queue.Queue(), None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._lines.put(line)
        self._lines.put(None)

    def wait(self, timeout=240):
        end = time.monotonic() + timeout
        while self.url is None:
            try:
                line = self._lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no 'serving' line (exit {self.proc.poll()}):\n" + "\n".join(self.lines[-40:]))
            found = re.match(r"serving (\S+) on (http://\S+)$", line.strip())
            if found:
                self.name, self.url = found.groups()
        return self

    def post(self, path, **kwargs):
        return requests.post(self.url + path, timeout=120, **kwargs)

    def get(self, path):
        return requests.get(self.url + path, timeout=60)

    def stop(self):
        terminate(self.proc)


@pytest.fixture(scope="module")
def servers(tsn_demo_export, deeplab_demo_export, bert_glue_export, transformer_demo_export, mask_rcnn_demo_export,
            tsn_demo_onnx_export):
    """The five demo exports served at once (their model loads overlap), TSN's ONNX export on ONNX Runtime
    and on OpenVINO, and a second TSN server for the queue and shutdown checks; each reused by every test
    of the module."""
    started = {"tsn": Server(tsn_demo_export, "--max-request-mb", 1, "--max-delay-ms", 50, "--max-video-s", 30),
               "seg": Server(deeplab_demo_export, "--max-image-mp", 1), "glue": Server(bert_glue_export),
               "mt": Server(transformer_demo_export), "det": Server(mask_rcnn_demo_export),
               "tsn_ort": Server(tsn_demo_onnx_export, "--backend", "onnxruntime"),
               "tsn_ov": Server(tsn_demo_onnx_export, "--backend", "openvino"),
               "tsn2": Server(tsn_demo_export, "--queue", 2, "--max-batch", 1, "--decode-timeout-s", 0.0001)}
    try:
        for s in started.values():
            s.wait()
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def exports(tsn_demo_export, deeplab_demo_export, bert_glue_export, transformer_demo_export, mask_rcnn_demo_export):
    return {"tsn": tsn_demo_export, "seg": deeplab_demo_export, "glue": bert_glue_export,
            "mt": transformer_demo_export, "det": mask_rcnn_demo_export}


def _predictor(export):
    from deploy.predictor import Predictor
    return Predictor(str(export))


def _feeds(export, seed=0, batch=1):
    """Random feeds the export takes, shaped by its infer_cfg.yml (variable sizes small)."""
    from deploy.record import read_infer_cfg
    rng = np.random.default_rng(seed)
    sizes = {"imgs": [batch, 1, 2, 3, 32, 32], "image": [batch, 3, 48, 64]}
    feeds = {}
    for spec in read_infer_cfg(str(export))["inputs"]:
        shape = sizes.get(spec["name"]) or [batch] + [8 if d == -1 else d for d in spec["shape"][1:]]
        if "mask" in spec["name"]:
            feeds[spec["name"]] = np.ones(shape, spec["dtype"])
        elif "type" in spec["name"]:
            feeds[spec["name"]] = np.zeros(shape, spec["dtype"])
        elif spec["dtype"].startswith("float"):
            feeds[spec["name"]] = rng.standard_normal(shape).astype(spec["dtype"])
        elif spec["name"] in ("image_size", "orig_size"):   # Mask R-CNN: the image's own height, width
            feeds[spec["name"]] = np.array([sizes["image"][2:]] * batch, spec["dtype"])
        elif spec["name"] == "scale_factor":
            feeds[spec["name"]] = np.ones(shape, spec["dtype"])
        elif spec["name"].endswith("_len"):
            feeds[spec["name"]] = np.full(shape, 8, spec["dtype"])
        else:
            feeds[spec["name"]] = rng.integers(4, 20, shape).astype(spec["dtype"])
    return feeds


DATATYPE = {"float32": "FP32", "int64": "INT64", "int32": "INT32", "bool": "BOOL", "uint8": "UINT8"}


def _v2_body(feeds, ident=None):
    body = {"inputs": [{"name": n, "shape": list(v.shape), "datatype": DATATYPE[v.dtype.name],
                        "data": v.reshape(-1).tolist()} for n, v in feeds.items()]}
    if ident:
        body["id"] = ident
    return body


def _close(got, want):
    want = np.asarray(want, np.float64)
    got = np.asarray(got, np.float64)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= 1e-4 * max(1.0, float(np.abs(want).max(initial=0)))
                                                   + 1e-4 * np.abs(want)))


def _assert_v2_equals(answer, expected, name):
    by_name = {o["name"]: o for o in answer["outputs"]}
    for key, want in expected.items():
        if isinstance(want, list):   # ragged: one output per sample
            for i, w in enumerate(want):
                out = by_name[f"{key}_{i}"]
                assert _close(np.reshape(out["data"], out["shape"]), w), (name, key, i)
            continue
        out = by_name[key]
        got = np.asarray(out["data"]).reshape(out["shape"])
        assert out["shape"] == list(want.shape), (name, key, out["shape"], want.shape)
        if np.issubdtype(want.dtype, np.floating):
            assert _close(got, want), (name, key, float(np.abs(got - want).max()))
        else:
            assert np.array_equal(got, want), (name, key)


def test_batcher_gathers_by_key_refuses_a_full_queue_and_drains_on_close():
    """serving/batching.py alone (no model): jobs of one key within the delay share a call, up to
    max_batch samples; another key waits for its own call; a full queue refuses at once; close()
    answers what was accepted."""
    from serving.batching import Batcher, QueueFull
    calls, gate = [], threading.Event()

    def execute(key, payloads):
        gate.wait(5)
        calls.append((key, list(payloads)))
        return [p * 10 for p in payloads]

    async def main():
        batcher = Batcher(execute, max_batch=3, max_delay_s=0.05, queue_size=3).start()
        jobs = [asyncio.ensure_future(batcher.submit("b" if i in (2, 5) else "a", i)) for i in range(12)]
        await asyncio.sleep(0.2)   # the first call holds the gate: the queue fills, the rest are refused
        gate.set()
        results = await asyncio.gather(*jobs, return_exceptions=True)
        late = await batcher.submit("a", 99)
        await asyncio.to_thread(batcher.close)
        return results, late

    results, late = asyncio.run(main())
    assert late == 990
    refused = [i for i, r in enumerate(results) if isinstance(r, QueueFull)]
    assert refused and all(results[i] == i * 10 for i in range(12) if i not in refused), results
    assert all(len(p) <= 3 for _, p in calls) and any(len(p) > 1 for _, p in calls), calls
    assert all((k == "b") == (p[0] in (2, 5)) and len({q in (2, 5) for q in p}) == 1 for k, p in calls), calls


def test_v2_metadata_and_infer_equal_the_exported_programs(servers, exports):
    """Every demo's metadata lists its export's inputs; its infer answer is the Predictor's outputs on
    the same feeds (the Transformer: its encoder + decoder step driven by the model's search)."""
    for name, export in exports.items():
        s = servers[name]
        assert s.get("/v2/health/live").json() == {"live": True}
        assert s.get("/v2/health/ready").json() == {"ready": True}
        server = s.get("/v2").json()
        assert server["name"] == "paddle-zoo" and server["models"] == [s.name]   # the one model it serves
        page = s.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        meta = s.get(f"/v2/models/{s.name}").json()
        predictor = _predictor(export)
        assert [i["name"] for i in meta["inputs"]] == [i["name"] for i in predictor.inputs]
        assert [i["shape"] for i in meta["inputs"]] == [i["shape"] for i in predictor.inputs]
        assert {o["name"] for o in meta["outputs"]} == set(predictor.record["outputs"])
        assert s.get(f"/v2/models/{s.name}/ready").json() == {"name": s.name, "ready": True}
        feeds = _feeds(export)
        r = s.post(f"/v2/models/{s.name}/infer", json=_v2_body(feeds, "req-1"))
        assert r.status_code == 200, (name, r.text)
        answer = r.json()
        assert answer["model_name"] == s.name and answer["id"] == "req-1"
        _assert_v2_equals(answer, predictor(feeds), name)


def _top_k_same(a, b, where):
    assert [t["class_id"] for t in a] == [t["class_id"] for t in b] or \
        np.allclose([t["score"] for t in a], [t["score"] for t in b], atol=1e-5), (where, a, b)
    assert np.allclose([t["score"] for t in a], [t["score"] for t in b], atol=1e-5), (where, a, b)


def test_the_task_endpoint_answers_what_tools_infer_writes(servers, exports, kinetics_demo, voc_demo, bert_demo,
                                                           translation_demo, coco_demo, tmp_path):
    """A video (TSN top-k), images (DeepLabV3: label and overlay PNGs byte for byte), a photo (Mask R-CNN:
    its detections and RLE masks), sentence pairs (BERT GLUE predictions) and sentences to translate
    (Transformer), against tools/infer.py."""
    video = os.path.join(kinetics_demo["appearance"], "videos", "val", "blue", "val_0003.mp4")
    images = [os.path.join(voc_demo, "VOC2012", "JPEGImages", f"val_{i:04d}.jpg") for i in range(2)]
    rows = open(os.path.join(bert_demo, "glue", "test.tsv"), encoding="utf-8").read().splitlines()[:7]
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = [row.split("\t")[1:3] for row in rows[1:]]
    sentences = open(os.path.join(translation_demo, "test.en"), encoding="utf-8").read().splitlines()[:5]
    (tmp_path / "src.en").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    photo = os.path.join(ROOT, "data", "coco_demo", "val", "val_0001.png")
    runs = [("infer", ["--weights", exports[n], "--input", *inputs, "--output", tmp_path / n], None)
            for n, inputs in (("tsn", [video]), ("seg", images), ("glue", [tmp_path / "pairs.tsv"]),
                              ("mt", [tmp_path / "src.en"]), ("det", [photo]))]
    results = tools_in_one_process(runs)
    assert all(r["code"] == 0 for r in results), [r["stderr"][-1500:] for r in results]

    with open(video, "rb") as f:
        r = servers["tsn"].post("/v2/models/tsn/task", files={"file": ("clip.mp4", f)})
    assert r.status_code == 200, r.text
    (want,) = json.load(open(tmp_path / "tsn" / "predictions.json"))
    (got,) = r.json()["answers"]
    assert got["id"] == "clip.mp4"
    _top_k_same(got["top_k"], want["top_k"], "tsn")

    r = servers["seg"].post(f"/v2/models/{servers['seg'].name}/task",
                            files=[("file", (os.path.basename(p), open(p, "rb").read())) for p in images])
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert len(answers) == 2
    for path, answer in zip(images, answers):
        stem = os.path.splitext(os.path.basename(path))[0]
        assert answer["id"] == os.path.basename(path)
        assert base64.b64decode(answer["files"]["label"]) == (tmp_path / "seg" / f"{stem}.png").read_bytes()
        assert base64.b64decode(answer["files"]["overlay"]) == (tmp_path / "seg" / f"{stem}_overlay.png").read_bytes()

    with open(photo, "rb") as f:
        r = servers["det"].post(f"/v2/models/{servers['det'].name}/task", files={"file": ("shapes.png", f)})
    assert r.status_code == 200, r.text
    (answer,) = r.json()["answers"]
    want = [dict(d, file="shapes.png") for d in json.load(open(tmp_path / "det" / "detections.json"))]
    assert answer["id"] == "shapes.png" and answer["detections"] == want and want, (answer, want)
    assert base64.b64decode(answer["files"]["drawn"]) == (tmp_path / "det" / "val_0001_det.png").read_bytes()

    r = servers["glue"].post(f"/v2/models/{servers['glue'].name}/task", json={"texts": pairs})
    assert r.status_code == 200, r.text
    written = [line.split("\t") for line in (tmp_path / "glue" / "RTE.tsv").read_text().splitlines()[1:]]
    assert [a["prediction"] for a in r.json()["answers"]] == [p for _, p in written]
    one = servers["glue"].post(f"/v2/models/{servers['glue'].name}/task", json={"text": pairs[0][0], "text_pair": pairs[0][1]})
    assert one.status_code == 200 and one.json()["answers"][0]["prediction"] == written[0][1], one.text

    r = servers["mt"].post(f"/v2/models/{servers['mt'].name}/task", json={"texts": sentences})
    assert r.status_code == 200, r.text
    assert [a["translation"] for a in r.json()["answers"]] == \
        (tmp_path / "mt" / "translations.txt").read_text(encoding="utf-8").splitlines()


def test_an_onnx_export_is_served_on_onnx_runtime_and_on_openvino(servers, tsn_demo_onnx_export, kinetics_demo):
    """The other two backends behind the same endpoints: a v2 answer is that backend's Predictor's on the
    same feeds, and an uploaded video's top-k is the Paddle Inference server's (up to float rounding)."""
    from deploy.predictor import Predictor
    video = os.path.join(kinetics_demo["appearance"], "videos", "val", "blue", "val_0003.mp4")
    data = open(video, "rb").read()
    paddle = servers["tsn"].post("/v2/models/tsn/task", files={"file": ("clip.mp4", data)})
    assert paddle.status_code == 200, paddle.text
    (want,) = paddle.json()["answers"]
    feeds = _feeds(tsn_demo_onnx_export)
    for key, backend in (("tsn_ort", "onnxruntime"), ("tsn_ov", "openvino")):
        s = servers[key]
        meta = s.get(f"/v2/models/{s.name}").json()
        assert meta["platform"] == f"{backend} (onnx export)", meta
        r = s.post(f"/v2/models/{s.name}/infer", json=_v2_body(feeds))
        assert r.status_code == 200, (key, r.text)
        _assert_v2_equals(r.json(), Predictor(str(tsn_demo_onnx_export), backend=backend)(feeds), key)
        r = s.post(f"/v2/models/{s.name}/task", files={"file": ("clip.mp4", data)})
        assert r.status_code == 200, (key, r.text)
        (got,) = r.json()["answers"]
        assert got["id"] == "clip.mp4" and got["top_k"][0]["class_id"] == want["top_k"][0]["class_id"], (key, got, want)
        assert np.allclose([t["score"] for t in got["top_k"]], [t["score"] for t in want["top_k"]], atol=1e-4), \
            (key, got, want)


def _metric(text, name, labels=""):
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_a_burst_is_batched_and_each_answer_is_its_own(servers, exports, kinetics_demo):
    """Concurrent v2 requests of different feeds, and concurrent video uploads: model calls of more than
    one sample (zoo_batch_size), each answer the Predictor's (or tools/infer.py's) for its own input."""
    s, export = servers["tsn"], exports["tsn"]
    predictor = _predictor(export)
    feeds = [_feeds(export, seed=i) for i in range(8)]
    want = [predictor(f) for f in feeds]
    before = s.get("/metrics").text
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: s.post("/v2/models/tsn/infer", json=_v2_body(feeds[i], f"r{i}")), range(8)))
    for i, r in enumerate(answers):
        assert r.status_code == 200 and r.json()["id"] == f"r{i}", r.text
        _assert_v2_equals(r.json(), want[i], f"burst {i}")
    assert not np.allclose(want[0]["logits"], want[1]["logits"])   # distinct answers were told apart
    videos = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(kinetics_demo["appearance"], "videos", "val"))
                    for f in fs if f.endswith(".mp4"))[:6]
    alone = [s.post("/v2/models/tsn/task", files={"file": (os.path.basename(v), open(v, "rb").read())}).json()
             for v in videos[:2]]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        burst = list(pool.map(lambda v: s.post("/v2/models/tsn/task", files={"file": (os.path.basename(v), open(v, "rb").read())}),
                              videos))
    for v, r in zip(videos, burst):
        assert r.status_code == 200, r.text
        assert r.json()["answers"][0]["id"] == os.path.basename(v)
    for a, r in zip(alone, burst):
        _top_k_same(r.json()["answers"][0]["top_k"], a["answers"][0]["top_k"], a["answers"][0]["id"])
    text = s.get("/metrics").text
    calls = _metric(text, "zoo_batch_size_count") - (_metric(before, "zoo_batch_size_count") or 0)
    ones = _metric(text, "zoo_batch_size_bucket", '{le="1"}') - (_metric(before, "zoo_batch_size_bucket", '{le="1"}') or 0)
    assert calls < 14 and ones < calls, text      # 14 requests in fewer calls, some of more than one sample
    assert _metric(text, "zoo_requests_total", '{endpoint="infer",code="200"}') >= 8
    assert _metric(text, "zoo_queue_depth") == 0
    assert "zoo_request_latency_seconds_bucket" in text


def _png(width, height):
    """A flat grey PNG: a few kB that decode to width x height x 3 bytes."""
    import cv2
    return cv2.imencode(".png", np.full((height, width, 3), 128, np.uint8))[1].tobytes()


def test_an_image_upload_is_measured_by_its_header_without_decoding():
    """The pixel limit reads the width and height each format's header holds (PNG IHDR, a JPEG's start
    of frame, BMP's info header, WebP's VP8 / VP8L / VP8X chunk): here files OpenCV wrote of a known
    size, each also cut to its first 64 bytes (the size is in the header)."""
    import cv2
    img = np.zeros((123, 457, 3), np.uint8)
    img[5:50, 7:90] = 200
    for ext, params in ((".png", []), (".jpg", []), (".bmp", []), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80]),
                        (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])):   # lossy (VP8) and lossless (VP8L)
        data = cv2.imencode(ext, img, params)[1].tobytes()
        assert app._image_size(data) == (457, 123), ext
        assert app._image_size(data[:64]) in ((457, 123), None), ext   # a JPEG's frame header may come later
    assert app._image_size(b"not an image") is None and app._image_size(b"\xff\xd8" + b"\x00" * 20) is None
    with pytest.raises(app.Refused, match=r"'big.png' is 1200x1000 pixels \(1.2 MP\), this server takes at most "
                                          r"1 MP \(--max-image-mp\)"):
        app._check_image("big.png", _png(1200, 1000), app.Limits(max_image_mp=1))
    app._check_image("small.png", _png(1000, 1000), app.Limits(max_image_mp=1))


def _long_video(path, seconds=40):
    import cv2
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 1.0, (32, 32))
    for i in range(seconds):
        out.write(np.full((32, 32, 3), i * 5 % 255, np.uint8))
    out.release()
    return path.read_bytes()


def _raw(url, data):
    """Bytes sent as they are (a body the client library would not send), the response read back."""
    host, port = re.match(r"http://([^:]+):(\d+)", url).groups()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_bad_requests_get_one_line_and_the_server_answers_the_next_good_one(servers, exports, tmp_path):
    s, glue, seg = servers["tsn"], servers["glue"], servers["seg"]
    good = _v2_body(_feeds(exports["tsn"]))
    tensor = good["inputs"][0]
    video = _long_video(tmp_path / "long.mp4")
    boundary = "zoo-test-boundary"
    cut_form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.mp4\"\r\n"
                f"Content-Type: video/mp4\r\n\r\n").encode() + b"\x00" * 100
    infer, task = "/v2/models/tsn/infer", "/v2/models/tsn/task"
    cases = [
        ("non-JSON", lambda: s.post(infer, data=b"\x89PNG not json"), 400, "body"),
        ("truncated JSON", lambda: s.post(infer, data=json.dumps(good)[:200]), 400, "body: not JSON"),
        ("a JSON list", lambda: s.post(infer, json=[1, 2]), 400, "body"),
        ("no inputs", lambda: s.post(infer, json={"inputs": []}), 400, "inputs"),
        ("unknown input", lambda: s.post(infer, json={"inputs": [dict(tensor, name="pixels")]}), 400, '"pixels" is no input'),
        ("data length != shape", lambda: s.post(infer, json={"inputs": [dict(tensor, data=tensor["data"][:-1])]}),
         400, "inputs[0].data"),
        ("wrong rank", lambda: s.post(infer, json={"inputs": [dict(tensor, shape=[2, 3, 32, 32])]}), 400,
         "inputs[0].shape"),
        ("wrong datatype", lambda: s.post(infer, json={"inputs": [dict(tensor, datatype="INT64")]}), 400,
         "inputs[0].datatype"),
        ("strings as data", lambda: s.post(infer, json={"inputs": [dict(tensor, data=["a"] * len(tensor["data"]))]}),
         400, "inputs[0].data"),
        ("ragged nested data", lambda: s.post(infer, json={"inputs": [dict(tensor, shape=[3], data=[[1, 2], [3]])]}),
         400, "inputs[0]"),
        ("unknown output", lambda: s.post(infer, json=dict(good, outputs=[{"name": "boxes"}])), 400, "outputs[0].name"),
        ("missing input", lambda: glue.post(f"/v2/models/{glue.name}/infer", json={"inputs": [
            _v2_body(_feeds(exports["glue"]))["inputs"][0]]}), 400, "is missing"),
        ("unknown model", lambda: s.post("/v2/models/resnet/infer", json=good), 404, "'resnet' is not served"),
        ("unknown path", lambda: s.get("/v3/models"), 404, "path"),
        ("wrong method", lambda: requests.put(s.url + infer, json=good, timeout=60), 405, "method"),
        ("an mp4 that is not a video", lambda: s.post(task, files={"file": ("clip.mp4", os.urandom(5000))}), 400,
         "file: 'clip.mp4'"),
        ("a file the reader cannot read", lambda: s.post(task, files={"file": ("notes.txt", b"hello\n")}), 400,
         "file:"),
        ("an oversized upload", lambda: s.post(task, files={"file": ("big.mp4", b"\x00" * (1 << 21))}), 413,
         "--max-request-mb"),
        ("an oversized body, no Content-Length", lambda: s.post(infer, data=iter([b"x" * (1 << 19)] * 4)), 413,
         "--max-request-mb"),
        ("a video over --max-video-s", lambda: s.post(task, files={"file": ("long.mp4", video)}), 413,
         "--max-video-s"),
        ("a form without 'file'", lambda: s.post(task, files={"other": ("a.mp4", b"x")}), 400, "file: missing"),
        ("a truncated form", lambda: s.post(task, data=cut_form,
                                            headers={"content-type": f"multipart/form-data; boundary={boundary}"}),
         400, "body"),
        ("text to a video model", lambda: s.post(task, json={"text": "/etc/passwd"}), 400, "text:"),
        ("an unknown content type", lambda: s.post(task, data=b"x", headers={"content-type": "text/plain"}), 415,
         "content-type"),
        ("an image over --max-image-mp", lambda: seg.post(f"/v2/models/{seg.name}/task", files={"file": (
            "flat.png", _png(1200, 1000))}), 413, "'flat.png' is 1200x1000 pixels (1.2 MP)"),
        ("texts of numbers", lambda: glue.post(f"/v2/models/{glue.name}/task", json={"texts": [1, 2]}), 400, "texts[0]"),
    ]
    assert len(cases) >= 20
    for what, send, status, fragment in cases:
        r = send()
        assert r.status_code == status, (what, r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/json"), what
        assert r.text.count("\n") <= 1 and set(r.json()) == {"error"}, (what, r.text)
        assert fragment in r.json()["error"] and "\n" not in r.json()["error"], (what, r.text)
        after = s.post(infer, json=good)
        assert after.status_code == 200, (what, after.text)
    # a body shorter than its Content-Length, the connection closed: the server survives it
    host, port = re.match(r"http://([^:]+):(\d+)", s.url).groups()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v2/models/tsn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\"")
    status, body = _raw(s.url, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and json.loads(body) == {"live": True}
    assert s.post(infer, json=good).status_code == 200
    errors = _metric(s.get("/metrics").text, "zoo_request_errors_total")
    assert errors >= len(cases) - 3   # all but the two sent to the GLUE server and the one to DeepLabV3's


def _heavy(s, body):
    """A request of a slow model call, sent in a thread once its reply is awaited: returns when the
    server holds it (zoo_requests_in_flight), so what follows waits behind it."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(s.post, "/v2/models/tsn/infer", data=body)
    pool.shutdown(wait=False)
    end = time.monotonic() + 60
    while not future.done() and _metric(s.get("/metrics").text, "zoo_requests_in_flight") < 1:
        assert time.monotonic() < end
        time.sleep(0.005)
    return future


HEAVY = {"imgs": np.zeros((1, 1, 8, 3, 160, 160), np.float32)}


def test_a_full_queue_answers_503_and_a_slow_probe_408(servers, exports, tmp_path):
    """--queue 2 --max-batch 1: behind a slow call, two requests wait and the next ones get 503 at once
    (one line); --decode-timeout-s 0.0001: no video's metadata is read that fast (408)."""
    s = servers["tsn2"]
    small = json.dumps(_v2_body(_feeds(exports["tsn"]))).encode()
    heavy = _heavy(s, json.dumps(_v2_body(HEAVY)).encode())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: s.post("/v2/models/tsn/infer", data=small), range(8)))
    assert heavy.result().status_code == 200
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {200, 503} and codes.count(200) >= 2, codes
    assert all(r.json()["error"].startswith("queue: full") for r in answers if r.status_code == 503)
    r = s.post("/v2/models/tsn/task", files={"file": ("clip.mp4", _long_video(tmp_path / "short.mp4", 3))})
    assert r.status_code == 408 and "--decode-timeout-s" in r.json()["error"], r.text
    assert s.post("/v2/models/tsn/infer", data=small).status_code == 200


def test_sigterm_during_a_burst_answers_every_accepted_request_and_exits_0(servers, exports):
    s = servers["tsn2"]
    export = exports["tsn"]
    predictor = _predictor(export)
    feeds = [_feeds(export, seed=20 + i) for i in range(2)]
    want = [predictor(f) for f in feeds]
    heavy = _heavy(s, json.dumps(_v2_body(HEAVY)).encode())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:   # behind it, the two --queue 2 holds
        futures = [pool.submit(s.post, "/v2/models/tsn/infer", json=_v2_body(f, f"q{i}")) for i, f in enumerate(feeds)]
        end = time.monotonic() + 30
        while _metric(s.get("/metrics").text, "zoo_requests_in_flight") < 3:   # all three accepted
            assert time.monotonic() < end and not heavy.done(), "the burst never arrived"
            time.sleep(0.005)
        os.killpg(s.proc.pid, signal.SIGTERM)   # its group, as a service manager stops it: the model's process too
        answers = [f.result() for f in futures]
    assert heavy.result().status_code == 200
    for i, r in enumerate(answers):
        assert r.status_code == 200, r.text
        assert r.json()["id"] == f"q{i}"
        _assert_v2_equals(r.json(), want[i], f"q{i}")
    assert s.proc.wait(60) == 0, "\n".join(s.lines[-20:])
    assert any(line.startswith("stopped tsn") for line in s.lines), s.lines[-5:]
    with pytest.raises(requests.ConnectionError):   # no longer listening
        requests.get(s.url + "/v2/health/live", timeout=5)


def _model_process(server_pid):
    """The pid of the server's model process (serving/worker.py: a spawned child), from /proc."""
    found = []
    for task in os.listdir(f"/proc/{server_pid}/task"):
        with open(f"/proc/{server_pid}/task/{task}/children") as f:
            for pid in map(int, f.read().split()):
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    cmd = c.read()
                if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                    found.append(pid)
    assert len(found) == 1, found
    return found[0]


def _unready_then_ready(s, timeout=120):
    """Poll /v2/health/ready until it has answered 503 (not ready) and then 200 again; a signal takes a
    moment to end a process, so a first answer may still be the old ready one."""
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        r = s.get("/v2/health/ready")
        seen.append((r.status_code, r.json()["ready"]))
        if seen[-1] == (200, True) and (503, False) in seen:
            return
        time.sleep(0.02)
    raise AssertionError(f"not unready and then ready again in {timeout} s: {seen[:3]} ... {seen[-3:]}")


def test_a_killed_model_process_is_replaced_and_the_server_serves_on(servers, bert_glue_export):
    """The kernel's OOM killer or a crash in a backend ends the model's process. Under a batch: that
    batch is answered 500 naming it, and a new process serves the next requests. Between batches: the
    server says not ready at once and is ready again without waiting for a request (a balancer would
    send none to an unready server). The child is stopped (SIGSTOP) before the request so that the kill
    lands while the batch is in its pipe, not before."""
    s = servers["glue"]
    task = f"/v2/models/{s.name}/task"
    pair = {"text": "A man is playing a guitar.", "text_pair": "A man plays music."}
    before = s.post(task, json=pair)
    assert before.status_code == 200, before.text
    said = len(s.lines)
    old = _model_process(s.proc.pid)
    os.kill(old, signal.SIGSTOP)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(s.post, task, json=pair)
        deadline = time.time() + 30
        while _metric(s.get("/metrics").text, "zoo_requests_in_flight") < 1 and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)   # past the batching delay: the batch is in the stopped child's pipe
        os.kill(old, signal.SIGKILL)
        r = first.result(timeout=120)
    assert r.status_code == 500 and set(r.json()) == {"error"}, r.text
    assert "the model process ended (exit code -9) while running this batch" in r.json()["error"], r.text
    _unready_then_ready(s)   # answered first, then the successor loaded
    after = s.post(task, json=pair)
    assert after.status_code == 200 and after.json() == before.json(), after.text
    second = _model_process(s.proc.pid)
    assert second != old
    os.kill(second, signal.SIGKILL)   # between batches: no request comes to find out
    _unready_then_ready(s)
    assert _model_process(s.proc.pid) not in (old, second)
    again = s.post(task, json=pair)
    assert again.status_code == 200 and again.json() == before.json(), again.text
    assert _metric(s.get("/metrics").text, "zoo_model_restarts_total") == 2
    assert sum(f"the model process {pid} ended (exit code -9); starting a new one" in line
               for pid in (old, second) for line in s.lines) == 2, s.lines[-10:]
    assert not any("Traceback" in line for line in s.lines[said:]), s.lines[said:]   # an event, not a bug
    # a successor that cannot load (its export moved away) is tried again until one loads
    moved = str(bert_glue_export) + ".moved"
    os.rename(bert_glue_export, moved)
    try:
        os.kill(_model_process(s.proc.pid), signal.SIGKILL)
        deadline = time.time() + 120
        while not any("error: the model process could not be restarted" in l for l in s.lines) \
                and time.time() < deadline:
            time.sleep(0.1)
        assert any("error: the model process could not be restarted" in l for l in s.lines), s.lines[-10:]
        assert s.get("/v2/health/ready").status_code == 503
    finally:
        os.rename(moved, bert_glue_export)
    _unready_then_ready(s)
    last = s.post(task, json=pair)
    assert last.status_code == 200 and last.json() == before.json(), last.text
