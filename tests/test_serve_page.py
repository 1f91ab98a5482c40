"""The page at / of tools/serve.py in a real browser: Debian's chromium (/usr/bin/chromium, installed by
the Makefile's test target) driven by playwright, never a browser playwright downloads. The page is
plain JavaScript that nothing else runs, so only a browser shows that it finds the model, sends what a
user picks and draws what the server answers; these tests compare what it draws with the server's
JSON for the same input, and fail when it draws nothing.

The video test's screenshot is the one in docs/deployment.md: `ZOO_DOCS_SCREENSHOT=1 python -m pytest
tests/test_serve_page.py -k video` writes it to docs/images/serve_page.png (otherwise it goes to the
test's tmp_path, so `make test` leaves the work tree as it was)."""
import base64
import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

from tests.helpers import ENV, ROOT

CHROMIUM = "/usr/bin/chromium"
# headless, no GPU, and nothing that reaches out (updates, sync, first-run pages): the tests never
# touch the internet; --no-sandbox: the tests run as root, where chromium's sandbox refuses to start
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOT = os.path.join(ROOT, "docs", "images", "serve_page.png")
WAIT_MS = 30_000     # the page's answer: one demo video through TSN takes ~1 s on 2 cores


@contextlib.contextmanager
def serving(export_dir, timeout=120):
    """tools/serve.py on a free loopback port: yields (model name, base URL) once it prints its
    `serving NAME on http://HOST:PORT` line; SIGTERM and a wait at the end (it stops by itself; its own
    session, so a Ctrl-C of pytest reaches it only through this)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "serve.py"), "--model", str(export_dir),
                             "--host", "127.0.0.1", "--port", "0"], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines, seen = queue.Queue(), []
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    try:
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"tools/serve.py printed no `serving` line in {timeout} s:\n{''.join(seen)}")
            if line is None:
                raise AssertionError(f"tools/serve.py ended ({proc.wait()}) before serving:\n{''.join(seen)}")
            seen.append(line)
            if line.startswith("serving ") and " on http://" in line:
                name, url = line.split()[1], line.split(" on ")[-1].strip()
                break
        yield name, url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:   # its group: the model's own process too (serving/worker.py)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _post(url, body, content_type):
    """(status, JSON) of a POST, error statuses included (the page is compared with both)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _post_file(url, path, data=None):
    """The upload a browser makes of one file (multipart/form-data, field `file`), by hand."""
    boundary = uuid.uuid4().hex
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{os.path.basename(path)}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return _post(url, body, f"multipart/form-data; boundary={boundary}")


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for the module's tests (each test opens its own page)."""
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: apt-get install -y chromium (the Makefile does)"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser, url, name):
    """The page at 1280 px, loaded and showing the served model's name (it asked the API for it)."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url + "/")
    try:
        page.wait_for_function("name => document.getElementById('model-name').textContent === name", arg=name,
                               timeout=WAIT_MS)
    except PlaywrightTimeout:
        raise AssertionError(f"the page did not show the model {name!r}; it says: {page.inner_text('body')[:600]!r}, "
                             f"errors {errors}") from None
    assert not errors, errors
    return page, errors


def _drawn_top_k(page):
    """(label, score text, bar width %) of each top-k row the page drew, in its order."""
    return page.eval_on_selector_all(".top-k-row", """rows => rows.map(r => [
        r.querySelector('.top-k-label').textContent, r.querySelector('.top-k-score').textContent,
        parseFloat(r.querySelector('.top-k-fill').style.width)])""")


def test_page_draws_the_top_k_the_server_answers_for_a_video(tsn_demo_export, kinetics_demo, browser, tmp_path):
    """A demo video picked in the page: the bars it draws are the server's top-k (labels in order, scores
    as tools/infer.py prints them, bars as long as the scores); an mp4 that is not a video shows the
    server's one error line, and the page answers the next good video."""
    folder = os.path.join(kinetics_demo["appearance"], "videos", "val", "red")
    video = os.path.join(folder, sorted(os.listdir(folder))[0])
    with serving(tsn_demo_export) as (name, url):
        status, expected = _post_file(f"{url}/v2/models/{name}/task", video)
        assert status == 200 and len(expected["answers"]) == 1, expected
        top = expected["answers"][0]["top_k"]
        assert len(top) > 1

        page, errors = _open(browser, url, name)
        assert page.is_visible("#file") and not page.is_visible("#text"), "a video model shows the file input only"
        page.set_input_files("#file", video)
        page.click("#submit")
        page.wait_for_selector(".top-k-row", timeout=WAIT_MS)
        drawn = _drawn_top_k(page)
        assert [d[0] for d in drawn] == [t["label"] for t in top], (drawn, top)
        assert [d[1] for d in drawn] == [f"{t['score']:.3f}" for t in top], (drawn, top)
        for (_, _, width), t in zip(drawn, top):
            assert abs(width - 100 * t["score"]) < 0.01, (width, t)
        assert page.text_content(".answer-id") == expected["answers"][0]["id"]
        assert not page.is_visible("#error")
        shot = SCREENSHOT if os.environ.get("ZOO_DOCS_SCREENSHOT") == "1" else str(tmp_path / "serve_page.png")
        page.screenshot(path=shot, full_page=True)
        assert os.path.getsize(shot) > 10_000

        bad = tmp_path / "not_a_video.mp4"
        bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"this is no video" * 64)
        status, error = _post_file(f"{url}/v2/models/{name}/task", bad)
        assert 400 <= status < 500 and set(error) == {"error"}, (status, error)
        page.set_input_files("#file", str(bad))
        page.click("#submit")
        page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
        assert page.text_content("#error") == error["error"]
        assert not page.is_visible("#answer-card"), "an error hides the previous answer"

        page.set_input_files("#file", video)
        page.click("#submit")
        page.wait_for_selector("#answer-card:not([hidden]) .top-k-row", timeout=WAIT_MS)
        assert [d[0] for d in _drawn_top_k(page)] == [t["label"] for t in top]
        assert not page.is_visible("#error") and not errors, errors


def test_page_shows_the_prediction_for_a_sentence_pair(bert_glue_export, bert_demo, browser):
    """The GLUE demo (a pair task, RTE's layout): the page shows two text boxes, sends the pair as the
    task endpoint takes it, and shows the server's prediction for it."""
    with open(os.path.join(bert_demo, "glue", "test.tsv"), encoding="utf-8") as f:
        a, b = f.read().splitlines()[1].split("\t")[1:3]    # a pair of the demo grammar's words
    with serving(bert_glue_export) as (name, url):
        status, expected = _post(f"{url}/v2/models/{name}/task", json.dumps({"text": a, "text_pair": b}).encode(),
                                 "application/json")
        assert status == 200 and len(expected["answers"]) == 1, expected
        page, errors = _open(browser, url, name)
        assert page.is_visible("#text") and page.is_visible("#text-pair") and not page.is_visible("#file")
        page.fill("#text", a)
        page.fill("#text-pair", b)
        page.click("#submit")
        page.wait_for_selector(".prediction strong", timeout=WAIT_MS)
        assert page.text_content(".prediction strong") == expected["answers"][0]["prediction"]
        assert not page.is_visible("#error") and not errors, errors


def _png(colour, size=(48, 32)):
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_page_draws_pictures_detections_and_translations(browser, tmp_path):
    """The drawings no demo export here makes fast enough for this test (DeepLabV3's overlay and label
    PNGs, Mask R-CNN's drawn image and boxes, translations of several lines), from answers shaped as
    api/inferencer.py's with files in base64 as the server sends them; the page is served from
    serving/page/ by playwright's router, so this needs no model."""
    overlay, label, drawn = _png((200, 40, 40)), _png((0, 0, 128)), _png((40, 200, 40))
    answers = {"seg": {"id": "cat.png", "classes": ["background", "cat"],
                       "files": {"overlay": overlay, "label": label}},
               "det": {"id": "street.jpg", "files": {"drawn": drawn}, "detections": [
                   {"image_id": 0, "file": "street.jpg", "category_id": 3, "label": "car",
                    "bbox": [4.0, 5.5, 20.0, 10.25],
                    "score": 0.91234, "segmentation": {"size": [32, 48], "counts": "abc"}},
                   {"image_id": 0, "file": "street.jpg", "category_id": 1, "label": "person", "bbox": [30, 2, 8, 20],
                    "score": 0.5}]}}
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page_dir, sent = os.path.join(ROOT, "serving", "page"), []

    def fake_server(route):
        path = route.request.url.split("zoo.test", 1)[1].split("?")[0]
        if path == "/" or path.startswith("/page/"):
            name = "index.html" if path == "/" else path[len("/page/"):]
            kind = {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
            with open(os.path.join(page_dir, name), "rb") as f:
                return route.fulfill(status=200, body=f.read(), content_type=kind)
        model = fake_server.model
        if path == "/v2":
            return route.fulfill(json={"name": "paddle-zoo", "version": "0", "extensions": [], "models": [model]})
        if path == f"/v2/models/{model}":
            task = {"input": "text", "answer": "translation", "accept": ""} if model == "mt" else \
                {"input": "file", "answer": None, "accept": "image/*"}
            return route.fulfill(json={"name": model, "versions": ["1"], "platform": "test", "inputs": [],
                                       "outputs": [], "task": task})
        if path == f"/v2/models/{model}/task":
            if model == "mt":
                sent.append(route.request.post_data_json)
                return route.fulfill(json={"model_name": model, "answers": [
                    {"id": str(i), "translation": f"<{t}>"} for i, t in enumerate(sent[-1]["texts"])]})
            return route.fulfill(json={"model_name": model, "answers": [answers[model]]})
        return route.fulfill(status=404, json={"error": f"path: {path} is no endpoint"})

    page.route("http://zoo.test/**", fake_server)
    image = tmp_path / "cat.png"
    image.write_bytes(base64.b64decode(overlay))
    for model in ("seg", "det"):
        fake_server.model = model
        page.goto("http://zoo.test/")
        page.wait_for_function("name => document.getElementById('model-name').textContent === name", arg=model,
                               timeout=WAIT_MS)
        page.set_input_files("#file", str(image))
        page.click("#submit")
        page.wait_for_selector("#answer-card:not([hidden]) .answer", timeout=WAIT_MS)
        sources = page.eval_on_selector_all("#answers img",
                                            "imgs => imgs.map(i => [i.dataset.role, i.src, i.naturalWidth])")
        files = answers[model]["files"]
        assert sources == [[role, f"data:image/png;base64,{files[role]}", 48] for role in files], sources
    rows = page.eval_on_selector_all("table.detections tbody tr",
                                     "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    assert rows == [["car", "0.912", "4.0", "5.5", "20.0", "10.3", "RLE"],
                    ["person", "0.500", "30.0", "2.0", "8.0", "20.0", ""]]

    fake_server.model = "mt"    # a text model: one text box, each line a text of its own, each answered
    page.goto("http://zoo.test/")
    page.wait_for_function("() => document.getElementById('model-name').textContent === 'mt'", timeout=WAIT_MS)
    assert page.is_visible("#text") and not page.is_visible("#text-pair") and not page.is_visible("#file")
    assert page.text_content("#text-label") == "Text to translate"
    page.fill("#text", "ein Satz\n\n  zwei Sätze \n")
    page.click("#submit")
    page.wait_for_selector("#answer-card:not([hidden]) .translation", timeout=WAIT_MS)
    assert sent == [{"texts": ["ein Satz", "zwei Sätze"]}]
    assert page.eval_on_selector_all(".answer", "parts => parts.map(p => [p.querySelector('h3').textContent, "
                                     "p.querySelector('.translation').textContent])") == \
        [["“ein Satz”", "<ein Satz>"], ["“zwei Sätze”", "<zwei Sätze>"]]
    assert not errors, errors
