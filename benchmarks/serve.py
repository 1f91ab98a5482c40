"""The inference server (tools/serve.py) under load: N concurrent clients on 127.0.0.1, batching off and on.

python benchmarks/serve.py [--only tsn bert_glue deeplabv3] [--clients 8] [--seconds 20] [--warmup 3]
                           [--work output/serve_bench] [--output PATH]      # `make bench-serve`: the table
python benchmarks/serve.py --export DIR [--input FILE | --text S [--text-pair S]] [--clients 8]
                           [--seconds 20] [--warmup 3] [--modes off on] [--output PATH]   # one export
python benchmarks/serve.py --show [--docs] [--kind KIND]   # the table from the JSON (docs/performance.md,
                                                           # docs/deployment.md)

Each mode starts its own server (`tools/serve.py --model DIR --port 0`, batching off: `--max-batch 1`;
on: `--max-batch 8 --max-delay-ms 5`) as a subprocess, waits for its `serving NAME on http://...` line,
and lets --clients threads, each on its own keep-alive connection (http.client), send the same
task-endpoint request back to back (`POST /v2/models/NAME/task`: the video or image as a multipart
upload, the sentence pair as JSON): a closed loop, so a client's next request waits for its answer, as
a user's page or script does. The first --warmup seconds of that load are not counted (the predictor's
first batches choose kernels; a batch size the server has not seen costs a first run), and the same
clients carry on into the timed --seconds, so its queue is as full at the window's first instant as
at its last.

Per mode: requests/s (answers completed inside the timed window / the window), latency p50 / p90 /
p99 / max of those as the client sees it (sent to answer read), failed requests (of all sent, warm-up
included: anything but a 200 holding one answer without an error; a row with failures is a bug, not
a figure), the server's peak memory (the resident sets of its process and all its children summed,
sampled from /proc every `interval` of the sampler from start to stop, and the server's own VmHWM), and the sizes of the
batches it ran in the timed window (the zoo_batch_size histogram of /metrics, read at its start and
end). The clients share the machine's cores with the server, so the benchmark's own CPU time in the
window is recorded beside (what the server did not get).

Without --export the three demo exports the issue names (TSN, BERT GLUE, DeepLabV3) are measured; a
missing one is made under --work first (data/make_demo.py, tools/train.py on the demo recipe,
tools/export.py): the weights' quality does not change the cost of a request. Their rows go to
benchmarks/results/<kind>/serve.json (benchmarks/report.py; merged by model and mode, so --only
keeps the other rows) and `--show --docs` writes the kind's table into docs/performance.md and
a short one into docs/deployment.md. `--export` measures any export and writes JSON only with
--output. Needs requirements-serve.txt (the server's), nothing more: the clients are the standard
library's.
"""
import argparse
import http.client
import importlib.metadata
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import report  # noqa: E402
from benchmarks.memory import status_kb  # noqa: E402

SERVE = os.path.join(ROOT, "tools", "serve.py")
READY = re.compile(r"serving (\S+) on http://([^\s:/]+):(\d+)")
# batching off, then on: the spec's defaults (tools/serve.py --max-batch 8 --max-delay-ms 5)
MODES = {"off": {"max_batch": 1, "max_delay_ms": 0}, "on": {"max_batch": 8, "max_delay_ms": 5}}
DEPLOYMENT = os.path.join(ROOT, "docs", "deployment.md")

# the issue's three demo exports: recipe, the demo data it trains on, the request a user would send
DEMOS = {
    "tsn": dict(title="TSN demo", config="configs/video/tsn/tsn_demo.yaml", data="kinetics",
                input="data/kinetics_demo/kinetics_appearance/videos/val/yellow/val_0021.mp4",
                what="a demo video (80x64 mp4v)"),
    "bert_glue": dict(title="BERT GLUE demo", config="configs/nlp/bert/bert_glue_demo.yaml", data="bert",
                      pair="data/bert_demo/glue/dev.tsv", what="a sentence pair (the demo GLUE task's first dev row)"),
    "deeplabv3": dict(title="DeepLabV3 demo", config="configs/vision/deeplabv3/deeplabv3_demo.yaml",
                      data="segmentation",
                      input="data/voc_demo/VOCdevkit/VOC2012/JPEGImages/val_0000.jpg",
                      what="a demo image (JPEG)"),
}


# ------------------------------------------------------------------------------- requests
def task_request(input_path=None, text=None, text_pair=None):
    """(body bytes, content type, description) of one task-endpoint request: a file as the multipart
    upload a browser's form sends (field `file`), text as the JSON the text models take. Built once:
    every client sends the same bytes, so the server's work per request does not vary."""
    if input_path is not None:
        with open(input_path, "rb") as f:
            data = f.read()
        boundary = uuid.uuid4().hex
        name = os.path.basename(input_path).replace('"', "")
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        what = f"{os.path.relpath(input_path, ROOT)} ({len(data)} bytes)"
        return body, f"multipart/form-data; boundary={boundary}", what
    payload = {"text": text} if text_pair is None else {"text": text, "text_pair": text_pair}
    return json.dumps(payload).encode(), "application/json", json.dumps(payload)


def first_pair(tsv):
    """The first row's sentence pair of a GLUE-layout TSV (header: index, sentence1, sentence2, label)."""
    with open(tsv, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        row = f.readline().rstrip("\n").split("\t")
    return row[header.index("sentence1")], row[header.index("sentence2")]


def _answer_error(status, raw):
    """None for a good answer (200, one answer, no error in it), else one line saying what was wrong."""
    text = raw[:300].decode("utf-8", "replace")
    if status != 200:
        return f"{status}: {text}"
    try:
        answers = json.loads(raw)["answers"]
    except (ValueError, KeyError, TypeError):
        return f"200 without answers: {text}"
    if len(answers) != 1 or "error" in answers[0]:
        return f"200 with {len(answers)} answers: {text}"
    return None


class Client(threading.Thread):
    """One user: a keep-alive connection sending `body` to `path` back to back until `stop` (a
    time.monotonic() value); records (sent, latency s, error or None) per request. A dropped
    connection is a failed request and a new connection, as a real client would reconnect."""

    def __init__(self, host, port, path, body, content_type, stop):
        super().__init__(daemon=True)
        self.host, self.port, self.path, self.body, self.stop = host, port, path, body, stop
        self.headers = {"Content-Type": content_type, "Content-Length": str(len(body))}
        self.records = []

    def run(self):
        conn = None
        while time.monotonic() < self.stop:
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            sent = time.monotonic()
            try:
                conn.request("POST", self.path, body=self.body, headers=self.headers)
                resp = conn.getresponse()
                raw = resp.read()
                error = _answer_error(resp.status, raw)
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                error = f"{type(e).__name__}: {e}"
                conn.close()
                conn = None
            self.records.append((sent, time.monotonic() - sent, error))
        if conn is not None:
            conn.close()


def load(server, path, body, content_type, clients, warmup, seconds):
    """`clients` clients, without a pause, for `warmup` then `seconds`: (the records of all requests, the
    timed window's (start, end), the /metrics pages at its start and end, the CPU seconds this process
    spent in it). Only answers completed inside the window count, so the window sees the steady state:
    full queues from its first instant (the warm-up's clients carry on into it) and none of the
    ramp-down of the last requests."""
    t0 = time.monotonic()
    start, end = t0 + warmup, t0 + warmup + seconds
    threads = [Client(server.host, server.port, path, body, content_type, end) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start - time.monotonic()))
    before, cpu0 = server.get("/metrics")[1], os.times()
    time.sleep(max(0.0, end - time.monotonic()))
    after, cpu1 = server.get("/metrics")[1], os.times()
    for t in threads:
        t.join()
    records = [r for t in threads for r in t.records]
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return records, (start, end), (before, after), cpu


def percentile(values, q):
    """The nearest-rank q-th percentile (0-100) of `values` (no interpolation: a latency that happened)."""
    values = sorted(values)
    if not values:
        return None
    return values[min(len(values) - 1, max(0, int(-(-q * len(values) // 100)) - 1))]


# ------------------------------------------------------------------------------- the server
def _children(pid):
    """The process ids below `pid` (its children, theirs, ...), from /proc/*/stat's parent field."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                parent[int(name)] = int(stat[stat.rfind(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        found += frontier
    return found

def terminate(proc, timeout=60):
    """SIGTERM, which the server answers by finishing what it accepted; a kill only past `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MemorySampler(threading.Thread):
    """The peak of the summed VmRSS of a process and its children, every `interval` s: the server's
    footprint as a machine sees it (a decoder or worker process it starts counts too)."""

    def __init__(self, pid, interval=0.05):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_kb, self.done = pid, interval, 0, threading.Event()
        self.children_seen = 0
        self._tree, self._tree_at = [], 0.0

    def run(self):
        while not self.done.is_set():
            now = time.monotonic()
            if now - self._tree_at > 1.0:             # walking /proc costs: the tree once a second
                self._tree, self._tree_at = _children(self.pid), now
                self.children_seen = max(self.children_seen, len(self._tree))
            self.peak_kb = max(self.peak_kb, sum(status_kb(p, "VmRSS") or 0 for p in [self.pid] + self._tree))
            self.done.wait(self.interval)


class Server:
    """tools/serve.py in a subprocess on a free loopback port: started, waited for, stopped with SIGTERM.
    Its output (merged) is drained by a thread so that a chatty log never blocks it; the last lines
    are kept for an error message."""

    def __init__(self, export, max_batch, max_delay_ms, extra=(), timeout=300):
        cmd = [sys.executable, SERVE, "--model", export, "--host", "127.0.0.1", "--port", "0",
               "--max-batch", str(max_batch), "--max-delay-ms", str(max_delay_ms), *extra]
        self.command = " ".join(["tools/serve.py"] + cmd[2:])
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1)
        self.sampler = MemorySampler(self.proc.pid)
        self.sampler.start()
        self.lines, self.name, self.host, self.port = [], None, None, None
        ready = threading.Event()
        threading.Thread(target=self._drain, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or self.name is None:
            self.stop()
            raise SystemExit(f"error: {self.command}: no 'serving NAME on http://...' line within {timeout} s "
                             f"(exit {self.proc.poll()}); its last lines:\n" + "".join(self.lines[-30:]))
        self.ready_rss_kb = self.sampler.peak_kb

    def _drain(self, ready):
        for line in self.proc.stdout:
            self.lines = (self.lines + [line])[-200:]
            m = READY.search(line)
            if m and self.name is None:
                self.name, self.host, self.port = m.group(1), m.group(2), int(m.group(3))
                ready.set()
        ready.set()                                   # the process ended: no line is coming

    def get(self, path):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def stop(self):
        """SIGTERM (the server drains and exits), then the peak memory; (exit code, VmHWM kB)."""
        hwm = status_kb(self.proc.pid, "VmHWM") or 0
        terminate(self.proc)
        self.sampler.done.set()
        self.sampler.join()
        return self.proc.returncode, hwm


def model_platform(server):
    """The v2 metadata's `platform` (which backend runs the export), None where it does not say."""
    status, text = server.get(f"/v2/models/{server.name}")
    try:
        return json.loads(text).get("platform") if status == 200 else None
    except (ValueError, AttributeError):
        return None


def batch_histogram(metrics):
    """{'sum', 'count', 'buckets': {le: cumulative count}} of zoo_batch_size in a Prometheus text page
    (the series of every label set added: the endpoints' batches together)."""
    out = {"sum": 0.0, "count": 0.0, "buckets": {}}
    for line in metrics.splitlines():
        m = re.match(r"zoo_batch_size_(bucket|sum|count)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        value = float(m.group(3))
        if m.group(1) == "bucket":
            le = re.search(r'le="([^"]+)"', m.group(2) or "")
            if le:
                out["buckets"][le.group(1)] = out["buckets"].get(le.group(1), 0.0) + value
        else:
            out[m.group(1)] += value
    return out


def batch_sizes(before, after):
    """The batches run between two /metrics pages: count, mean size, and the count per histogram
    bucket (not cumulative: batches with size in (previous le, le])."""
    a, b = batch_histogram(before), batch_histogram(after)
    count = b["count"] - a["count"]
    per, previous = {}, 0.0
    for le in sorted(b["buckets"], key=lambda x: float("inf") if x == "+Inf" else float(x)):
        cumulative = b["buckets"][le] - a["buckets"].get(le, 0.0)
        if cumulative - previous:
            per[le] = int(round(cumulative - previous))
        previous = cumulative
    return {"batches": int(round(count)), "mean": (b["sum"] - a["sum"]) / count if count else None, "per_bucket": per}


# ------------------------------------------------------------------------------- one measurement
def _add_batches(total, part):
    total["batches"] += part["batches"]
    total["size_sum"] += (part["mean"] or 0.0) * part["batches"]
    for le, n in part["per_bucket"].items():
        total["per_bucket"][le] = total["per_bucket"].get(le, 0) + n


def measure(export, body, content_type, modes, clients, seconds, warmup, rounds, extra=(), label=None):
    """One export in each of `modes`: a server per mode, all up at once, loaded in turn for `rounds`
    rounds of seconds / rounds each (the order reversed every other round, as benchmarks/peers.py's
    sides), so that what else runs on the machine falls on every mode alike; one row per mode."""
    servers, rows = {}, []
    try:
        for mode in modes:
            servers[mode] = Server(export, MODES[mode]["max_batch"], MODES[mode]["max_delay_ms"], extra)
        stats = {m: {"records": [], "timed": [], "window": 0.0, "cpu": 0.0, "loads": [], "round_rps": [],
                     "batches": {"batches": 0, "size_sum": 0.0, "per_bucket": {}}} for m in modes}
        for r in range(rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                server, st = servers[mode], stats[mode]
                # the first round warms the server up; later ones refill its queue before the window
                lead = warmup if r == 0 else min(1.0, warmup)
                st["loads"].append(os.getloadavg()[0])
                records, (start, end), (before, after), cpu = load(
                    server, f"/v2/models/{server.name}/task", body, content_type, clients, lead, seconds / rounds)
                timed = [(lat, err) for sent, lat, err in records if start <= sent + lat <= end]
                st["records"] += records
                st["timed"] += timed
                st["window"] += end - start
                st["cpu"] += cpu
                st["round_rps"].append(sum(err is None for _, err in timed) / (end - start))
                _add_batches(st["batches"], batch_sizes(before, after))
        platforms = {m: model_platform(servers[m]) for m in modes}
    finally:
        stopped = {m: srv.stop() for m, srv in servers.items()}
    for mode in modes:
        server, st, (code, hwm_kb) = servers[mode], stats[mode], stopped[mode]
        latencies = [lat for lat, err in st["timed"] if err is None]
        errors = [err for _, _, err in st["records"] if err is not None]   # warm-up and the last ones included
        bs = st["batches"]
        row = {"model": label or server.name, "name": server.name, "export": export, "mode": mode, **MODES[mode],
               "platform": platforms[mode], "git_commit": report.git_commit(), "server_command": server.command,
               "clients": clients, "seconds": seconds, "warmup_s": warmup, "rounds": rounds,
               "requests": len(st["timed"]), "answers": len(latencies), "failed": len(errors),
               "requests_sent": len(st["records"]), "errors": sorted(set(errors))[:5], "window_s": st["window"],
               "requests_per_s": len(latencies) / st["window"] if st["window"] > 0 else 0.0,
               "round_requests_per_s": st["round_rps"],
               **{f"p{q}_ms": (percentile(latencies, q) or 0.0) * 1000 for q in (50, 90, 99)},
               "max_ms": max(latencies, default=0.0) * 1000,
               "mean_ms": sum(latencies) / len(latencies) * 1000 if latencies else None,
               "peak_rss_mb": server.sampler.peak_kb / 1024, "server_vmhwm_mb": hwm_kb / 1024,
               "ready_rss_mb": server.ready_rss_kb / 1024, "server_children": server.sampler.children_seen,
               "batch_sizes": {"batches": bs["batches"],
                               "mean": bs["size_sum"] / bs["batches"] if bs["batches"] else None,
                               "per_bucket": bs["per_bucket"]},
               "server_exit": code, "client_cpu_s": st["cpu"], "load_before": min(st["loads"]),
               "loads_before": st["loads"]}
        mean = f"{row['batch_sizes']['mean']:.2f}" if row["batch_sizes"]["mean"] else "-"
        print(f"  {row['model']:<10} batching {mode:<3} {row['requests_per_s']:7.2f} req/s  "
              f"(rounds {' '.join(f'{x:.1f}' for x in st['round_rps'])})  p50 {row['p50_ms']:7.1f} ms  "
              f"p99 {row['p99_ms']:7.1f} ms  failed {row['failed']}  peak {row['peak_rss_mb']:.0f} MB  "
              f"batches {bs['batches']} (mean {mean})  load {min(st['loads']):.1f}-{max(st['loads']):.1f}", flush=True)
        for err in row["errors"]:
            print(f"    failed: {err}", flush=True)
        if code not in (0, None):
            print(f"  note: the server exited {code} on SIGTERM; its last lines:\n" + "".join(server.lines[-10:]),
                  flush=True)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------- the demo exports
def _run(cmd, log):
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {proc.returncode}); its log: {log}")


def demo_export(name, work):
    """The export folder of demo `name` under `work`, made if missing: data, a training run, the export."""
    spec, base = DEMOS[name], os.path.join(os.path.abspath(work), name)
    export, weights = os.path.join(base, "export"), os.path.join(base, "run", "final", "model.pdparams")
    if os.path.isfile(os.path.join(export, "infer_cfg.yml")):
        return export
    os.makedirs(base, exist_ok=True)
    print(f"  {name}: making the demo export under {base} (demo data, tools/train.py, tools/export.py)", flush=True)
    _run(["data/make_demo.py", spec["data"]], os.path.join(base, "make_demo.log"))
    if not os.path.isfile(weights):
        _run(["tools/train.py", "-c", spec["config"], "--output", os.path.join(base, "run")],
             os.path.join(base, "train.log"))
    _run(["tools/export.py", "-c", spec["config"], "--weights", weights, "--output", export],
         os.path.join(base, "export.log"))
    return export


def demo_request(name):
    spec = DEMOS[name]
    if "pair" in spec:
        a, b = first_pair(os.path.join(ROOT, spec["pair"]))
        return task_request(text=a, text_pair=b)
    return task_request(input_path=os.path.join(ROOT, spec["input"]))


# ------------------------------------------------------------------------------- results and tables
def versions():
    """The server stack's and paddle's versions, as installed (no import: metadata only)."""
    out = {}
    for dist in ("paddlepaddle", "starlette", "uvicorn", "python-multipart"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def header(args):
    return {"command": " ".join(["benchmarks/serve.py"] + sys.argv[1:]), **report.cpu_record(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "versions": versions(),
            "git_commit": report.git_commit(), "clients": args.clients, "seconds": args.seconds,
            "warmup_s": args.warmup, "rounds": args.rounds, "modes": {m: MODES[m] for m in args.modes}}


def write_rows(path, result):
    """`result` to `path`, its rows merged into the file's others by (model, mode): a run of one model
    keeps the rest of the table. Atomic, so a stopped run leaves the previous file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rows = {}
    if os.path.isfile(path):
        with open(path) as f:
            rows = {(r["model"], r["mode"]): r for r in json.load(f).get("rows", [])}
    rows.update({(r["model"], r["mode"]): r for r in result["rows"]})
    order = {m: i for i, m in enumerate(DEMOS)}
    result = dict(result, rows=sorted(rows.values(), key=lambda r: (order.get(r["model"], len(order)), r["model"],
                                                                      list(MODES).index(r["mode"]))))
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    return result


def _one(rows, key, fmt="{}"):
    """The rows' common value of `key` in words, or "per row" where they differ (--only runs merged)."""
    values = {r.get(key) for r in rows}
    return fmt.format(values.pop()) if len(values) == 1 else "per row (JSON)"


def _heading(result):
    v, rows = result.get("versions", {}), result["rows"]
    commits = sorted({str(r.get("git_commit", result.get("git_commit")))[:10] for r in rows})
    return (f"{result['cpu']} ({result.get('cpu_kind')}, {result['cpu_vendor']}), {result['cpu_count']} cores shared "
            f"by the server and the clients, paddle {v.get('paddlepaddle')}, uvicorn {v.get('uvicorn')}, "
            f"{_one(rows, 'platform')}; {_one(rows, 'clients')} clients x {_one(rows, 'seconds', '{:g}')} s per row in "
            f"{_one(rows, 'rounds')} rounds, the modes alternating, after {_one(rows, 'warmup_s', '{:g}')} s of "
            f"warm-up, task endpoint; commit {', '.join(commits)}")


def _loads(r):
    loads = r.get("loads_before") or [r["load_before"]]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def _batches(r):
    bs = r["batch_sizes"]
    return f"{bs['mean']:.2f}" if bs.get("mean") else "-"


def table_lines(result):
    """docs/performance.md's table of a serve.json."""
    lines = [_heading(result), "",
             "| model | request | batching | requests/s | p50 ms | p99 ms | failed | mean batch | peak MB (server) "
             "| load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        batching = "off (`--max-batch 1`)" if r["mode"] == "off" else \
            f"on (`--max-batch {r['max_batch']} --max-delay-ms {r['max_delay_ms']}`)"
        lines.append(f"| {r.get('title', r['model'])} | {r.get('request', '-')} | {batching} | "
                     f"**{r['requests_per_s']:.1f}** | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | "
                     f"{r['failed']} of {r.get('requests_sent', r['requests'])} | {_batches(r)} | "
                     f"{r['peak_rss_mb']:.0f} | {_loads(r)} |")
    return lines


def short_lines(result):
    """docs/deployment.md's short table of a serve.json (the full one is in docs/performance.md)."""
    rows = result["rows"]
    lines = [f"{result.get('cpu_kind')}, {_one(rows, 'clients')} clients x {_one(rows, 'seconds', '{:g}')} s, "
             f"load (1 min) {min(min(r.get('loads_before') or [r['load_before']]) for r in rows):.1f}-"
             f"{max(max(r.get('loads_before') or [r['load_before']]) for r in rows):.1f} "
             f"([the measurement](performance.md#serving-under-load)):", "",
             "| model | batching | requests/s | p50 / p99 ms | peak MB |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        batching = "off" if r["mode"] == "off" else f"on ({r['max_batch']}, {r['max_delay_ms']} ms)"
        lines.append(f"| {r.get('title', r['model'])} | {batching} | {r['requests_per_s']:.1f} | "
                     f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} "
                     f"| {r['peak_rss_mb']:.0f} |")
    return lines


def write_docs(result):
    kind = result.get("cpu_kind")
    report.write_page("bench-serve", kind, table_lines(result), "benchmarks/serve.py --docs")
    report.write_page("bench-serve", kind, short_lines(result), "benchmarks/serve.py --docs", DEPLOYMENT)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", help="measure this export folder (default: the three demo exports)")
    p.add_argument("--input", help="with --export: the file to upload (a video, an image, ...)")
    p.add_argument("--text", help="with --export: the sentence to send (a text model)")
    p.add_argument("--text-pair", help="with --text: its pair (a sentence-pair task)")
    p.add_argument("--only", nargs="+", choices=list(DEMOS), help="without --export: these demo exports")
    p.add_argument("--work", default="output/serve_bench", help="where missing demo exports are made")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0, help="the timed window per mode")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of the same load before it, not counted")
    p.add_argument("--rounds", type=int, default=4, help="the timed seconds of each mode in this many "
                   "turns, the modes alternating")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--max-batch", type=int, default=MODES["on"]["max_batch"], help="batching on: tools/serve.py's")
    p.add_argument("--max-delay-ms", type=float, default=MODES["on"]["max_delay_ms"],
                   help="batching on: tools/serve.py's")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="passed to tools/serve.py as is (e.g. --serve-arg=--backend=onnxruntime)")
    p.add_argument("--output", help="the results JSON (default without --export: "
                   "benchmarks/results/<this CPU's kind>/serve.json; with --export: none unless given)")
    p.add_argument("--kind", help="with --show/--docs: the results of this CPU kind (default: this machine's)")
    p.add_argument("--show", action="store_true", help="print the table of the results JSON")
    p.add_argument("--docs", action="store_true", help="write it into docs/performance.md and docs/deployment.md")
    args = p.parse_args(argv)
    if min(args.clients, args.rounds, args.max_batch) < 1 or args.seconds <= 0 or min(args.warmup, args.max_delay_ms) < 0:
        p.error("--clients, --rounds and --max-batch are at least 1, --seconds above 0, "
                "--warmup and --max-delay-ms not below 0")
    if (args.input or args.text) and not args.export:
        p.error("--input and --text go with --export (the demo exports have their own requests)")
    if args.input and args.text:
        p.error("--input or --text, not both")
    if args.text_pair and not args.text:
        p.error("--text-pair needs --text")
    if args.export and args.only:
        p.error("--only picks demo exports: not with --export")
    if args.kind and not (args.show or args.docs):
        p.error("--kind is for --show/--docs: a run measures this machine's kind")
    default_json = os.path.join(report.results_dir(args.kind), "serve.json")
    if args.show or args.docs:
        path = args.output or default_json
        if not os.path.isfile(path):
            raise SystemExit(f"error: {os.path.relpath(path, ROOT)}: no serving results of this CPU kind yet "
                             "(make bench-serve)")
        with open(path) as f:
            result = json.load(f)
        print("\n".join(table_lines(result)))
        if args.docs:
            write_docs(result)
        return
    if not os.path.isfile(SERVE):
        raise SystemExit("error: tools/serve.py is missing")
    MODES["on"] = {"max_batch": args.max_batch, "max_delay_ms": args.max_delay_ms}
    if args.max_delay_ms == int(args.max_delay_ms):
        MODES["on"]["max_delay_ms"] = int(args.max_delay_ms)
    if args.export:
        if not os.path.isfile(os.path.join(args.export, "infer_cfg.yml")):
            raise SystemExit(f"error: --export {args.export}: no infer_cfg.yml there (an export of tools/export.py)")
        if args.input and not os.path.isfile(args.input):
            raise SystemExit(f"error: --input {args.input}: no such file")
        if not (args.input or args.text):
            raise SystemExit("error: --export needs the request: --input FILE or --text S [--text-pair S]")
        jobs = [(None, os.path.abspath(args.export), task_request(args.input, args.text, args.text_pair))]
        output = args.output
    else:
        jobs = [(name, demo_export(name, args.work), demo_request(name)) for name in args.only or DEMOS]
        output = args.output or default_json
    result = dict(header(args), rows=[])
    for name, export, (body, content_type, what) in jobs:
        for row in measure(export, body, content_type, args.modes, args.clients, args.seconds, args.warmup,
                           args.rounds, args.serve_arg, label=name):
            row["request"] = DEMOS[name]["what"] if name else what
            row["title"] = DEMOS[name]["title"] if name else row["model"]
            row["export"] = os.path.relpath(export, ROOT) if export.startswith(ROOT) else export
            result["rows"].append(row)
        if output:                                   # after every export: a stopped run keeps what it measured
            saved = write_rows(output, dict(result))
    print("\n" + "\n".join(table_lines(saved if output else result)))
    failed = sum(r["failed"] for r in result["rows"])
    if failed:
        raise SystemExit(f"error: {failed} failed requests (see the lines above)")


if __name__ == "__main__":
    main()
