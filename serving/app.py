"""The HTTP side of tools/serve.py: the Open Inference Protocol (KServe v2 REST) over an export's
programs, a task endpoint over api.inferencer.Inferencer, limits, one-line JSON errors and metrics.

Why it is shaped so:
- Any client of Triton, OpenVINO Model Server, MLServer or KServe speaks the v2 protocol, so the
  tensors are exchanged as it defines them; the task endpoint is for what a user holds (a file, a
  sentence) and answers what tools/infer.py writes, because both go through one Inferencer.
- A handler only checks, queues and awaits: the batcher's one thread (serving/batching.py) hands
  each batch to the model's own process (serving/worker.py: Paddle Inference holds the GIL while it
  runs), so a slow model never stalls health checks, metrics or the refusals of bad input.
- Every refusal is one JSON line `{"error": "<field>: <why>"}` (the protocol's error shape) with a
  4xx status, and the server goes on serving: bad input is the client's, never the server's end.

Ragged outputs (a list of one array per sample, Mask R-CNN's per-image detections) have no v2
tensor shape: each sample's array is its own output named `<name>_<i>`, i counting the request's
samples from 0. Text answers of the task endpoint are numbered by their place in the request (ids
"0", "1", ...), whatever other requests shared their model call.
"""
import asyncio
import base64
import json
import math
import os
import re
import tempfile
import threading
import time

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from serving.batching import Batcher, Closed, QueueFull
from serving.worker import DATATYPES, ModelDied, Refused, one_line

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page")
NUMPY_OF = {v: k for k, v in DATATYPES.items() if k != "bfloat16"}
# uploads that hold one sample each (so several requests' files share one model call), by suffix
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".flv", ".mpg", ".mpeg")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class JSONAnswer(JSONResponse):
    """JSON that carries a model's NaN or infinite outputs (as Python's json writes them) instead of
    failing the answer: a score of -inf is an answer, not a server error."""

    def render(self, content):
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Limits:
    def __init__(self, max_request_mb=32.0, max_video_s=60.0, decode_timeout_s=10.0, max_image_mp=40.0):
        self.max_bytes = int(max_request_mb * 1024 * 1024)
        self.max_video_s, self.decode_timeout_s = max_video_s, decode_timeout_s
        self.max_image_mp = max_image_mp


# ---- metrics (Prometheus' text exposition format, written here: no client library to pin)

class _Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.sum, self.count = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, value):
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name, labels=""):
        out = []
        for edge, n in zip(self.buckets, self.counts):
            le = f'le="{edge:g}"'
            out.append(f"{name}_bucket{{{labels + ',' if labels else ''}{le}}} {n}")
        out.append(f"{name}_bucket{{{labels + ',' if labels else ''}le=\"+Inf\"}} {self.count}")
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {self.sum:.6f}", f"{name}_count{tail} {self.count}"]
        return out


class Metrics:
    """Counters written from the event loop and the batcher's thread alike (one lock)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests, self.errors, self.latency = {}, 0, {}
        self.batches = _Histogram(BATCH_BUCKETS)
        self.in_flight = 0

    def request(self, endpoint, code, seconds):
        with self.lock:
            self.requests[(endpoint, code)] = self.requests.get((endpoint, code), 0) + 1
            self.errors += code >= 400
            self.latency.setdefault(endpoint, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, size):
        with self.lock:
            self.batches.observe(size)

    def text(self, queue_depth, restarts=0):
        with self.lock:
            out = ["# HELP zoo_requests_total Requests answered, by endpoint and status code.",
                   "# TYPE zoo_requests_total counter"]
            out += [f'zoo_requests_total{{endpoint="{e}",code="{c}"}} {n}' for (e, c), n in sorted(self.requests.items())]
            out += ["# HELP zoo_request_errors_total Requests answered with a status of 400 or more.",
                    "# TYPE zoo_request_errors_total counter", f"zoo_request_errors_total {self.errors}",
                    "# HELP zoo_request_latency_seconds Time from a request's arrival to its answer.",
                    "# TYPE zoo_request_latency_seconds histogram"]
            for endpoint, hist in sorted(self.latency.items()):
                out += hist.lines("zoo_request_latency_seconds", f'endpoint="{endpoint}"')
            out += ["# HELP zoo_batch_size Samples in each model call the batcher made.",
                    "# TYPE zoo_batch_size histogram"] + self.batches.lines("zoo_batch_size")
            out += ["# HELP zoo_queue_depth Requests accepted and waiting for a model call.",
                    "# TYPE zoo_queue_depth gauge", f"zoo_queue_depth {queue_depth}",
                    "# HELP zoo_requests_in_flight Inference requests accepted and not yet answered.",
                    "# TYPE zoo_requests_in_flight gauge", f"zoo_requests_in_flight {self.in_flight}",
                    "# HELP zoo_model_restarts_total Model processes that died and were replaced.",
                    "# TYPE zoo_model_restarts_total counter", f"zoo_model_restarts_total {restarts}"]
        return "\n".join(out) + "\n"


# ---- the model as the server's process sees it

class Served:
    """What the HTTP side knows of the model (the export's record) and how a batch reaches it: the
    batcher's thread calls `execute`, which waits on the model's process (serving/worker.py)."""

    def __init__(self, model, name, metrics):
        self.model, self.name, self.metrics = model, name, metrics
        self.record = model.record
        self.inputs = {spec["name"]: spec for spec in self.record["inputs"]}
        self.output_names = list(self.record["outputs"])
        self.output_types = dict(model.output_types)
        self.texts = model.texts
        self.platform = f"{model.backend} ({self.record.get('format', 'paddle')} export)"

    def execute(self, key, payloads):
        kind = key[0]
        results, sizes = self.model.execute(kind, kind == "v2" and key[1] is not None, payloads)
        for size in sizes:
            self.metrics.batch(size)
        for result in results:
            if kind == "v2" and isinstance(result, dict):
                for name, value in result.items():
                    first = value[0] if isinstance(value, list) and value else value
                    if isinstance(first, np.ndarray):
                        self.output_types.setdefault(name, DATATYPES.get(first.dtype.name, "BYTES"))
        return results

    def metadata(self):
        inputs = [{"name": s["name"], "datatype": DATATYPES.get(s["dtype"], s["dtype"].upper()),
                   "shape": list(s["shape"])} for s in self.record["inputs"]]
        # a datatype a program does not state before a run is "BYTES" (unknown) until an answer shows it
        outputs = [{"name": n, "datatype": self.output_types.get(n, "BYTES"), "shape": [-1]} for n in self.output_names]
        return {"name": self.name, "versions": ["1"], "platform": self.platform, "inputs": inputs,
                "outputs": outputs}


# ---- request parsing and limits

async def _body(request, limits):
    """The request's body, refused with 413 as soon as it passes the limit (Content-Length first)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_bytes:
        raise Refused(413, f"body: {int(declared)} bytes, this server takes at most {limits.max_bytes} "
                           f"(--max-request-mb)")
    return b"".join([chunk async for chunk in _limited(request, limits)])


async def _limited(request, limits, tail=None):
    """The body's chunks, refused past the limit; `tail` (a list) keeps its last bytes."""
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if tail is not None and chunk:
                tail[:] = [(b"".join(tail) + chunk)[-256:]]
            if size > limits.max_bytes:
                raise Refused(413, f"body: more than {limits.max_bytes} bytes, this server takes at most "
                                   f"{limits.max_bytes} (--max-request-mb)")
            yield chunk
    except ClientDisconnect:
        raise Refused(400, "body: the client closed the connection before the body ended") from None


async def _json(request, limits):
    return _parsed(await _body(request, limits))


def _parsed(body):
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise Refused(400, f"body: not UTF-8 text (byte {e.start}), JSON is asked for") from None
    except json.JSONDecodeError as e:
        raise Refused(400, f"body: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _tensor(i, tensor, spec):
    """A v2 input tensor as the numpy array the program takes, or Refused naming the field."""
    where = f"inputs[{i}]"
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise Refused(400, f"{where}.shape: {json.dumps(shape)[:100]}, a list of sizes (integers >= 0) is asked for")
    want_type = DATATYPES.get(spec["dtype"], spec["dtype"].upper())
    datatype = tensor.get("datatype")
    if datatype != want_type:
        raise Refused(400, f"{where}.datatype: {json.dumps(datatype)[:60]}, input '{spec['name']}' takes {want_type}")
    data = tensor.get("data")
    if not isinstance(data, list):
        raise Refused(400, f"{where}.data: {type(data).__name__}, a list of values (flat or nested) is asked for")
    try:
        values = np.asarray(data)
    except ValueError:   # nested lists of unequal lengths
        raise Refused(400, f"{where}.data: nested lists of unequal lengths") from None
    kinds = {"BOOL": "b", "FP16": "biuf", "FP32": "biuf", "FP64": "biuf"}.get(datatype, "iu")
    if values.size and values.dtype.kind not in kinds:
        raise Refused(400, f"{where}.data: values of {values.dtype.kind == 'f' and 'float' or values.dtype.name} "
                           f"kind, {datatype} takes {'booleans' if kinds == 'b' else 'integers' if kinds == 'iu' else 'numbers'}")
    if values.size != math.prod(shape):
        raise Refused(400, f"{where}.data: {values.size} values, shape {shape} holds {math.prod(shape)}")
    try:
        values = values.astype(NUMPY_OF[datatype]).reshape(shape)
    except (OverflowError, ValueError) as e:
        raise Refused(400, f"{where}.data: {one_line(e)}") from None
    want = spec["shape"]
    if len(shape) != len(want) or any(w != -1 and w != g for w, g in zip(want, shape)):
        raise Refused(400, f"{where}.shape: {shape}, input '{spec['name']}' takes {want} (-1: any size)")
    most = spec.get("max_shape")
    if most and any(m != -1 and g > m for m, g in zip(most, shape)):
        raise Refused(400, f"{where}.shape: {shape}, input '{spec['name']}' takes at most {most}"
                           + (f" ({spec['max_shape_why']})" if spec.get("max_shape_why") else ""))
    return values


def _v2_request(body, served):
    """(feeds, the output names asked for, the request's id) of a v2 infer body."""
    if not isinstance(body, dict):
        raise Refused(400, f"body: a JSON {type(body).__name__}, an object with 'inputs' is asked for")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise Refused(400, "inputs: a non-empty list of tensors {name, shape, datatype, data} is asked for")
    feeds = {}
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise Refused(400, f"inputs[{i}]: a {type(tensor).__name__}, a tensor object is asked for")
        name = tensor.get("name")
        if name not in served.inputs:
            raise Refused(400, f"inputs[{i}].name: {json.dumps(name)[:80]} is no input of {served.name} "
                               f"(its inputs: {', '.join(served.inputs)})")
        if name in feeds:
            raise Refused(400, f"inputs[{i}].name: '{name}' given twice")
        feeds[name] = _tensor(i, tensor, served.inputs[name])
    missing = [n for n in served.inputs if n not in feeds]
    if missing:
        raise Refused(400, f"inputs: '{missing[0]}' is missing ({served.name} takes {', '.join(served.inputs)})")
    asked = body.get("outputs")
    names = served.output_names
    if asked is not None:
        if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
            raise Refused(400, "outputs: a list of {\"name\": ...} is asked for")
        names = []
        for i, o in enumerate(asked):
            if o.get("name") not in served.output_names:
                raise Refused(400, f"outputs[{i}].name: {json.dumps(o.get('name'))[:80]} is no output of "
                                   f"{served.name} (its outputs: {', '.join(served.output_names)})")
            names.append(o["name"])
    ident = body.get("id")
    if ident is not None and not isinstance(ident, str):
        raise Refused(400, f"id: {json.dumps(ident)[:60]}, a string is asked for")
    return feeds, names, ident


def _v2_key(feeds, served):
    """Requests whose feeds differ only in dim 0 (every input batched: -1 first) run concatenated."""
    specs = served.inputs
    if all(specs[n]["shape"] and specs[n]["shape"][0] == -1 and v.ndim for n, v in feeds.items()):
        sizes = {len(v) for v in feeds.values()}
        if len(sizes) == 1:
            return ("v2", tuple((n, v.shape[1:]) for n, v in sorted(feeds.items()))), sizes.pop()
    return ("v2", None, object()), 1   # a key equal to no other: alone


def _v2_outputs(outputs, names):
    out = []
    for name in names:
        value = outputs[name]
        if isinstance(value, list):   # ragged: one array per sample (module docstring)
            for i, v in enumerate(value):
                out.append(_v2_tensor(f"{name}_{i}", np.asarray(v)))
        else:
            out.append(_v2_tensor(name, np.asarray(value)))
    return out


def _v2_tensor(name, value):
    return {"name": name, "shape": list(value.shape), "datatype": DATATYPES.get(value.dtype.name, "BYTES"),
            "data": value.reshape(-1).tolist()}


def _suffix_of(name, data):
    """The suffix the Inferencer reads an upload by: the file's signature, else its name's."""
    head = bytes(data[:16])
    if head[:4] == b"RIFF" and head[8:12] in (b"AVI ", b"WEBP"):
        return ".avi" if head[8:12] == b"AVI " else ".webp"
    if head[4:8] == b"ftyp":
        return ".mp4"
    for magic, suffix in ((b"\x89PNG", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"BM", ".bmp"),
                          (b"\x1a\x45\xdf\xa3", ".mkv")):
        if head.startswith(magic):
            return suffix
    return os.path.splitext(name or "")[1].lower()


def _probe_video(data, suffix):
    """(frames, fps) from the container's metadata, without decoding the frames."""
    import cv2  # the readers' dependency; loaded with the first video, not at import
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        cap = cv2.VideoCapture(f.name)
        try:
            if not cap.isOpened():
                return None
            return cap.get(cv2.CAP_PROP_FRAME_COUNT), cap.get(cv2.CAP_PROP_FPS)
        finally:
            cap.release()


async def _check_video(name, data, limits):
    try:
        found = await asyncio.wait_for(asyncio.to_thread(_probe_video, data, _suffix_of(name, data)),
                                       limits.decode_timeout_s)
    except asyncio.TimeoutError:
        raise Refused(408, f"file: reading {name!r}'s video metadata took over {limits.decode_timeout_s:g} s "
                           f"(--decode-timeout-s)") from None
    if found is None:
        raise Refused(400, f"file: {name!r} is not a video that can be decoded (no video stream opens)")
    frames, fps = found
    if frames > 0 and fps > 0 and frames / fps > limits.max_video_s:
        raise Refused(413, f"file: {name!r} lasts {frames / fps:.1f} s ({int(frames)} frames at {fps:g} fps), "
                           f"this server takes at most {limits.max_video_s:g} s (--max-video-s)")


def _image_size(data):
    """(width, height) from a PNG, JPEG, BMP or WebP header, without decoding; None for another format or
    a header that does not say (the reader then decides). A small file can hold a huge flat image: its
    decoded pixels, not its bytes, are what the model's process would have to hold."""
    data = bytes(data[:1 << 16])   # a JPEG's frame header may follow its EXIF segment, whose length is a 16-bit field
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:2] == b"BM" and len(data) >= 26:
        return abs(int.from_bytes(data[18:22], "little", signed=True)), abs(int.from_bytes(data[22:26], "little",
                                                                                             signed=True))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8X" and len(data) >= 30:
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if chunk == b"VP8 " and len(data) >= 30:
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
        if chunk == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        return None
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 <= len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:   # fill bytes before a marker
                i += 1
                continue
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):   # a start of frame
                return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def _check_image(name, data, limits):
    size = _image_size(data)
    if size and size[0] * size[1] > limits.max_image_mp * 1e6:
        raise Refused(413, f"file: {name!r} is {size[0]}x{size[1]} pixels ({size[0] * size[1] / 1e6:.1f} MP), this "
                           f"server takes at most {limits.max_image_mp:g} MP (--max-image-mp)")


async def _task_items(request, served, limits):
    """(batcher kind, items) of a task request: uploads as (name, bytes), or texts."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_bytes:
            raise Refused(413, f"body: {int(declared)} bytes, this server takes at most {limits.max_bytes} "
                               f"(--max-request-mb)")
        tail = []
        parser = MultiPartParser(request.headers, _limited(request, limits, tail), max_files=16, max_fields=16,
                                 max_part_size=limits.max_bytes)
        try:
            form = await parser.parse()
        except MultiPartException as e:
            raise Refused(400, f"body: not a readable multipart form ({one_line(e)})") from None
        boundary = re.search(r'boundary="?([^";]+)', ctype)
        if boundary and not b"".join(tail).rstrip().endswith(b"--" + boundary.group(1).encode() + b"--"):
            await form.close()
            raise Refused(400, "body: the multipart form ends before its closing boundary (a cut upload)")
        try:
            files = [f for f in form.getlist("file") if hasattr(f, "read")]
            if not files:
                texts = _form_texts(form, served)
                if texts is None:
                    raise Refused(400, "file: missing; send the input as the multipart field 'file'"
                                       + (" (or the fields 'text' and 'text_pair')" if served.texts else ""))
                return "texts", texts
            items = []
            for f in files:
                data = await f.read()
                name = os.path.basename(f.filename or "upload")
                if not data:
                    raise Refused(400, f"file: {name!r} is empty")
                items.append((name, data))
        finally:
            await form.close()
        kind = "files"
        for name, data in items:
            suffix = _suffix_of(name, data)
            if suffix in VIDEO_SUFFIXES:
                await _check_video(name, data, limits)
            elif suffix in IMAGE_SUFFIXES:
                _check_image(name, data, limits)
            if served.texts or suffix not in VIDEO_SUFFIXES + IMAGE_SUFFIXES:
                kind = "many"   # a file of many samples (a TSV, a corpus, a TFRecord): a call of its own
        return kind, items
    if ctype.startswith("application/json") or not ctype:
        body = await _json(request, limits)
        if not isinstance(body, dict):
            raise Refused(400, f"body: a JSON {type(body).__name__}, an object with 'text' or 'texts' is asked for")
        return "texts", _json_texts(body, served)
    raise Refused(415, f"content-type: {ctype[:80]!r}; send multipart/form-data with the field 'file', "
                       f"or JSON {{\"text\": ...}}")


def _needs_text_model(served, field):
    if not served.texts:
        raise Refused(400, f"{field}: {served.name} reads files, not text; send the input as the multipart "
                           f"field 'file'")


def _form_texts(form, served):
    text = form.get("text")
    if text is None:
        return None
    _needs_text_model(served, "text")
    pair = form.get("text_pair")
    return [(text, pair) if pair is not None else text]


def _json_texts(body, served):
    if "texts" in body:
        _needs_text_model(served, "texts")
        texts = body["texts"]
        if not isinstance(texts, list) or not texts:
            raise Refused(400, "texts: a non-empty list of strings (or [a, b] pairs) is asked for")
        out = []
        for i, t in enumerate(texts):
            if isinstance(t, str):
                out.append(t)
            elif isinstance(t, list) and len(t) == 2 and all(isinstance(s, str) for s in t):
                out.append(tuple(t))
            else:
                raise Refused(400, f"texts[{i}]: {json.dumps(t)[:80]}, a string or a pair [a, b] of strings is asked for")
        return out
    if "text" in body:
        _needs_text_model(served, "text")
        text, pair = body["text"], body.get("text_pair")
        if not isinstance(text, str):
            raise Refused(400, f"text: {json.dumps(text)[:80]}, a string is asked for")
        if pair is not None and not isinstance(pair, str):
            raise Refused(400, f"text_pair: {json.dumps(pair)[:80]}, a string is asked for")
        return [(text, pair) if pair is not None else text]
    raise Refused(400, f"text: missing; send JSON {{\"text\": ...}} (or \"texts\": [...])"
                  if served.texts else f"file: missing; {served.name} reads files: send the multipart field 'file'")


def _answer_json(answer):
    """An Inferencer answer with its files as base64 (JSON carries no bytes)."""
    out = dict(answer)
    if isinstance(out.get("files"), dict):
        out["files"] = {role: base64.b64encode(data).decode("ascii") if isinstance(data, (bytes, bytearray)) else data
                        for role, data in out["files"].items()}
    return out


# ---- the application

def create_app(model, name, max_batch=8, max_delay_ms=5.0, queue_size=64, limits=None, version="0"):
    """The ASGI app serving `model` (a serving.worker.ModelProcess) as model `name`. The batcher's
    thread starts with the app's lifespan and, at shutdown, answers every job accepted before the
    model's process is closed."""
    limits = limits or Limits()
    metrics = Metrics()
    served = Served(model, name, metrics)
    batcher = Batcher(served.execute, max_batch, max_delay_ms / 1000.0, queue_size)

    def model_of(request):
        asked = request.path_params["model"]
        if asked != name:
            raise Refused(404, f"model: '{asked}' is not served here (this server serves '{name}')")
        return served

    async def queued(key, payload, size):
        metrics.in_flight += 1
        try:
            return await batcher.submit(key, payload, size)
        except QueueFull:
            raise Refused(503, f"queue: full ({queue_size} requests wait already, --queue); try again") from None
        except Closed:
            raise Refused(503, "server: shutting down") from None
        finally:
            metrics.in_flight -= 1

    async def server_metadata(request):
        # "models" is ours, not the protocol's (v2 has no call that lists models): the page reads its name here
        return JSONAnswer({"name": "paddle-zoo", "version": version, "extensions": ["task", "metrics"],
                           "models": [name]})

    async def live(request):
        return JSONAnswer({"live": True})

    async def ready(request):
        # false while a replacement model process loads (serving/worker.py): a balancer sends elsewhere
        up = bool(model.ready)
        return JSONAnswer({"ready": up}, status_code=200 if up else 503)

    async def model_metadata(request):
        return JSONAnswer(model_of(request).metadata())

    async def model_ready(request):
        up = bool(model.ready)
        return JSONAnswer({"name": model_of(request).name, "ready": up}, status_code=200 if up else 503)

    async def infer(request):
        model = model_of(request)
        raw = await _body(request, limits)
        # megabytes of JSON tensors take a while to parse and to write: off the event loop
        feeds, names, ident = await asyncio.to_thread(lambda: _v2_request(_parsed(raw), model))
        key, size = _v2_key(feeds, model)
        result = await queued(key, feeds, size)
        if isinstance(result, Exception):
            raise result

        def answer():
            body = {"model_name": name, "model_version": "1", "outputs": _v2_outputs(result, names)}
            if ident is not None:
                body["id"] = ident
            return JSONAnswer(body)
        return await asyncio.to_thread(answer)

    async def task(request):
        model = model_of(request)
        kind, items = await _task_items(request, model, limits)
        size = len(items)
        key = (kind,) if kind != "many" else ("many", object())
        answers = await queued(key, items, size)
        if isinstance(answers, Exception):
            raise answers
        for answer in answers:
            if "error" in answer:
                field = "text" if kind == "texts" else "file"
                raise Refused(400, f"{field}: {one_line(answer['error'])}")
        return JSONAnswer({"model_name": name, "answers": [_answer_json(a) for a in answers]})

    async def metrics_text(request):
        return PlainTextResponse(metrics.text(batcher.depth(), model.restarts), media_type="text/plain; version=0.0.4")

    async def page(request):
        path = os.path.join(PAGE, "index.html")
        if not os.path.isfile(path):
            raise Refused(404, "page: serving/page/index.html is not installed")
        return FileResponse(path, media_type="text/html")

    async def refused(request, exc):
        return JSONAnswer({"error": exc.message}, status_code=exc.status)

    async def http_error(request, exc):
        if exc.status_code == 404:
            message = f"path: {request.url.path} is no endpoint of this server (see GET /v2/models/{name})"
        elif exc.status_code == 405:
            message = f"method: {request.method} {request.url.path} takes {exc.headers.get('Allow', '') if exc.headers else ''}"
        else:
            message = f"request: {one_line(exc.detail)}"
        return JSONAnswer({"error": message}, status_code=exc.status_code, headers=exc.headers)

    async def model_died(request, exc):   # an event the server recovers from (serving/worker.py): no traceback
        return JSONAnswer({"error": f"model: {exc}"}, status_code=500)

    async def internal(request, exc):
        return JSONAnswer({"error": f"server: {type(exc).__name__}: {one_line(exc)}"}, status_code=500)

    def lifespan(app):
        return _Lifespan(batcher, model)

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2/models/{model}", model_metadata, methods=["GET"]),
        Route("/v2/models/{model}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        Route("/v2/models/{model}/task", task, methods=["POST"]),
        Route("/metrics", metrics_text, methods=["GET"]),
        Mount("/page", app=StaticFiles(directory=PAGE, check_dir=False), name="page"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={Refused: refused, HTTPException: http_error, ModelDied: model_died,
                                        Exception: internal})
    app.state.served, app.state.batcher, app.state.metrics = served, batcher, metrics
    return _Measured(app, metrics)


class _Lifespan:
    """Starts the batcher's thread with the server; at shutdown (after uvicorn has answered every
    request in flight) lets it finish what it accepted before the process ends."""

    def __init__(self, batcher, model):
        self.batcher, self.model = batcher, model

    async def __aenter__(self):
        self.batcher.start()

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self.batcher.close)
        await asyncio.to_thread(self.model.close)


class _Measured:
    """ASGI wrapper: each HTTP request's status and latency into the metrics, by endpoint name."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics
        self.state = app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            endpoint = getattr(scope.get("endpoint"), "__name__", None) or "other"
            self.metrics.request(endpoint, status[0], time.monotonic() - start)
