"""The model's own process: the server's batcher thread hands it each batch and waits for the answers.

Paddle Inference holds the GIL while a program runs (a thread beside a TSN call got no time until
it ended: docs/performance.md#deployment-figures), so a model run in the server's process would stall its event loop, health
checks and refusals included, for every call. The model therefore runs in one child process (spawned:
no copy of the server's threads or sockets), fed through a pipe; the server's one batcher thread waits
on that pipe with the GIL released. Predictors are not thread-safe: one process, one call at a time.

The child ignores SIGINT and SIGTERM: a Ctrl-C reaches the whole process group, and the server, not
its model, decides when to stop (after answering what it accepted). It ends when the server closes
the pipe, or when the server dies (the pipe's end of file).
"""
import multiprocessing
import multiprocessing.connection
import re
import signal
import sys
import threading
import time

import numpy as np

from api.inferencer import map_strings
from engine.errors import ConfigError, SampleError

# numpy dtype names (infer_cfg.yml's) <-> the Open Inference Protocol's datatypes
DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64", "bfloat16": "BF16"}
_TOKEN = re.compile("\x1f(\\d+)\x1f")   # marks which request an uploaded file came from (in answer ids)


class Refused(Exception):
    """A request answered with `status` and the one line `message` (naming the field and value)."""

    def __init__(self, status, message):
        super().__init__(status, message)   # both in args: it crosses the pipe pickled
        self.status, self.message = status, message

    def __str__(self):
        return self.message


class ModelDied(RuntimeError):
    """The model's process ended under a batch (killed by the kernel's OOM killer, a crash in a
    backend): that batch's requests are answered 500, and a new process serves the next ones."""


class ModelProcess:
    """The served model, as the server's process sees it: the export's record and `execute`, which
    runs one batch in the child and returns (one result per payload, the samples of each model call).
    A child that dies is replaced by a watching thread (`restarts` counts them; `ready` is false from its
    death until the successor has loaded), so one request that kills the model does not end the service."""

    def __init__(self, export_dir, **inferencer_options):
        self._args, self.restarts, self._loading, self._closed = (str(export_dir), inferencer_options), 0, True, False
        self._lock = threading.Lock()   # one batch or one replacement at a time
        self._start()
        threading.Thread(target=self._watch, name="zoo-model-watch", daemon=True).start()

    def _start(self):
        self._loading = True
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, *self._args), name="zoo-model", daemon=True)
        self._proc.start()
        child.close()
        kind, info = self._receive()
        if kind == "error":
            self._proc.join(10)
            raise ConfigError(info)
        self.record, self.texts, self.backend, self.output_types = info
        self._loading = False

    @property
    def ready(self):
        """False while a new process loads, and from the moment the process dies (before the next batch
        would find out): a health check sees it at once."""
        return not self._loading and self._proc.is_alive()

    @property
    def pid(self):
        return self._proc.pid

    def execute(self, kind, batched, payloads):
        with self._lock:
            if not self._proc.is_alive():   # died between batches, before the watcher replaced it
                self._replace()
            try:
                self._conn.send((kind, batched, payloads))
                return self._receive()
            except (ModelDied, OSError) as e:   # answered now; the watcher starts the successor
                died = e if isinstance(e, ModelDied) else self._died()
                raise ModelDied(f"{died} while running this batch; a new model process serves the next "
                                f"requests") from None

    def _watch(self):
        """Replace a process that died, under a batch (whose requests are answered first, not after a
        model load) or between batches (so the server is ready again without waiting for a request,
        which a balancer would not send to an unready server)."""
        while True:
            proc = self._proc
            multiprocessing.connection.wait([proc.sentinel])
            with self._lock:
                if self._closed:
                    return
                if self._proc is not proc:   # a batch found it dead first and replaced it
                    continue
                try:
                    self._replace()
                    continue
                except (ConfigError, ModelDied) as e:   # cannot load now (the export moved?): try again
                    _say(f"error: the model process could not be restarted: {e}")
            time.sleep(1.0)

    def _replace(self):
        self._proc.join(1)   # its sentinel fires as its files close, a moment before its exit code exists
        _say(f"the model process {self._proc.pid} ended (exit code {self._proc.exitcode}); starting a new one")
        self._conn.close()
        self.restarts += 1
        self._start()

    def _died(self):
        self._proc.join(1)
        return ModelDied(f"the model process ended (exit code {self._proc.exitcode})")

    def _receive(self):
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    def close(self):
        with self._lock:   # after the batch that runs; the watcher then starts no other process
            self._closed = True
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.terminate()


def _say(line):
    """One line on stderr in one write: print's two (text, then newline) interleave with other threads'."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _serve(conn, export_dir, options):
    """The child's life: build the Inferencer, say what it serves, then run batches until told to stop."""
    _ignore_stop_signals()
    try:
        from api.inferencer import Inferencer  # paddle loads in this child only, never in the server's process
        from engine import runtime
        inferencer = Inferencer(export_dir, workers=0, **options)
        runtime.setup_logging(None)
        runner = Runner(inferencer)
        _ignore_stop_signals()   # again: importing paddle installs its own handlers (a SIGTERM aborted it)
    except (ConfigError, SampleError) as e:
        conn.send(("error", str(e)))
        return
    except Exception as e:   # a bug, reported in one line by the server's tools/serve.py
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", (runner.record, runner.texts, runner.predictor.backend, runner.output_types())))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        kind, batched, payloads = message
        runner.sizes = []
        try:
            results = runner.execute(kind, batched, payloads)
        except Exception as e:   # answered to each request of the batch; the process serves on
            results = [RuntimeError(f"{type(e).__name__}: {one_line(e)}")] * len(payloads)
        conn.send((results, runner.sizes))


def _ignore_stop_signals():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Runner:
    """What the child does with a batch: v2 feeds concatenated along dim 0 and the outputs split back;
    task items in one Inferencer.run and the answers split back by request. `sizes`: the samples of
    each model call made (the server's zoo_batch_size)."""

    def __init__(self, inferencer):
        self.inferencer = inferencer
        self.predictor = inferencer.model
        self.record = self.predictor.record
        self.texts = hasattr(inferencer.reader_class, "write_texts")
        self.sizes = []

    def execute(self, kind, batched, payloads):
        if kind == "v2":
            return self._v2(payloads, batched)
        return self._task(kind, payloads)

    def output_types(self):
        """Datatypes a program states before any run (Paddle Inference's handles); the rest are learned
        from the first answers (a model's Python between programs makes them)."""
        programs = getattr(self.predictor, "programs", {})
        if len(programs) != 1:
            return {}
        program = next(iter(programs.values()))
        out = {}
        try:
            names = program.predictor.get_output_names()
            for name, handle_name in zip(program.outputs, names):
                dtype = str(program.predictor.get_output_handle(handle_name).type()).split(".")[-1].lower()
                dtype = {"float": "float32", "int": "int32", "long": "int64"}.get(dtype, dtype)
                if dtype in DATATYPES:
                    out[name] = DATATYPES[dtype]
        except Exception:   # a backend that states no dtype before a run (ONNX Runtime, OpenVINO)
            return {}
        return {k: v for k, v in out.items() if k in self.record["outputs"]}

    # v2

    def _v2(self, feeds_list, batched):
        if batched and len(feeds_list) > 1:
            sizes = [len(next(iter(f.values()))) for f in feeds_list]
            merged = {n: np.concatenate([f[n] for f in feeds_list]) for n in feeds_list[0]}
            try:
                split = _split(self._predict(merged), sizes)
                if split is not None:
                    return split
            except (ConfigError, SampleError):
                pass    # each alone below: one request's refusal must not fail the others
        results = []
        for feeds in feeds_list:
            try:
                results.append(self._predict(feeds))
            except (ConfigError, SampleError) as e:
                results.append(Refused(400, f"inputs: {one_line(e)}"))
        return results

    def _predict(self, feeds):
        outputs = self.predictor(feeds)
        sizes = [len(v) for v in feeds.values() if getattr(v, "ndim", 0)]
        self.sizes.append(sizes[0] if sizes else 1)
        return outputs

    # task

    def _task(self, kind, jobs):
        if kind == "texts":
            items = [item for job in jobs for item in job]
            answers = self._run(items)
            if len(jobs) == 1:
                return [answers if isinstance(answers, Exception) else _renumbered(answers)]
            if isinstance(answers, Exception) or len(answers) != len(items):
                return [self._task(kind, [job])[0] for job in jobs]   # whose input it was: each alone
            out, start = [], 0
            for job in jobs:
                out.append(_renumbered(answers[start:start + len(job)]))
                start += len(job)
            return out
        # files: each upload's name carries its request's number, read back from the answer ids
        items = [(f"\x1f{j}\x1f{name}", data) for j, job in enumerate(jobs) for name, data in job]
        answers = self._run(items)
        if isinstance(answers, Exception):
            if len(jobs) > 1:
                return [self._task(kind, [job])[0] for job in jobs]
            return [answers]
        out = [[] for _ in jobs]
        for answer in answers:
            found = _TOKEN.search(str(answer.get("id", "")))
            j = int(found.group(1)) if found else (0 if len(jobs) == 1 else None)
            if j is None:
                return [self._task(kind, [job])[0] for job in jobs]
            out[j].append(_untokened(answer))
        return out

    def _run(self, items):
        try:
            result = self.inferencer.run(items)
        except (ConfigError, SampleError) as e:
            uploads = any(isinstance(i, tuple) and len(i) == 2 and isinstance(i[1], (bytes, bytearray)) for i in items)
            return Refused(400, f"{'file' if uploads else 'text'}: {_untokened_text(one_line(e))}")
        self.sizes.append(len(result.answers) or len(items))
        return result.answers


def _split(outputs, sizes):
    """Each request's share of a concatenated run's outputs, or None where an output is not per sample."""
    total, per = sum(sizes), [dict() for _ in sizes]
    for name, value in outputs.items():
        if len(value) != total:
            return None
        start = 0
        for i, n in enumerate(sizes):
            per[i][name] = value[start:start + n]
            start += n
    return per


def _renumbered(answers):
    return [dict(a, id=str(i)) for i, a in enumerate(answers)]


def _untokened_text(text):
    return _TOKEN.sub("", text)


def _untokened(answer):
    """An answer without the request marks, in every string of it (a detection's `file` too)."""
    return map_strings(answer, _untokened_text)


def one_line(error):
    text = " ".join(str(error).split())
    return text[:2000] or type(error).__name__
