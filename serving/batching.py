"""Dynamic batching: requests that arrive close together run as one model call on the one thread that
owns the model.

Paddle's predictors are not thread-safe and the machine has few cores, so one thread runs every
model call and the event loop only queues work and awaits its answer. The queue is bounded: when it
is full a request is refused at once (the server answers 503) instead of waiting without limit.

A job has a `key`: only jobs of one key are gathered into one call (the app's key says which can be
concatenated: v2 feeds of the same trailing shapes, texts with texts, files with files). A job that
does not fit the batch being gathered (another key, or more samples than are left) waits, in arrival
order, for the next one.
"""
import asyncio
import collections
import queue
import threading
import time


class QueueFull(Exception):
    """The bounded queue holds --queue jobs already."""


class Closed(Exception):
    """The batcher is shutting down and takes no new job."""


class Job:
    __slots__ = ("key", "payload", "size", "arrived", "future", "loop")

    def __init__(self, key, payload, size, future, loop):
        self.key, self.payload, self.size = key, payload, max(1, int(size))
        self.arrived, self.future, self.loop = time.monotonic(), future, loop


class Batcher:
    """`execute(key, payloads)` runs on the batcher's thread and returns one result per payload (an
    Exception instance answers that job with the exception). `max_delay_s` is counted from the first
    job's arrival, so a job that already waited while the model ran is not held longer."""

    def __init__(self, execute, max_batch=8, max_delay_s=0.005, queue_size=64, name="zoo-inference"):
        self.execute, self.max_batch, self.max_delay_s = execute, max(1, int(max_batch)), max(0.0, max_delay_s)
        self._queue = queue.Queue(maxsize=max(1, int(queue_size)))
        self._carry = collections.deque()     # jobs taken from the queue that wait for a later batch
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.running = 0                      # jobs in the model call under way

    def start(self):
        self._thread.start()
        return self

    def depth(self):
        """Jobs accepted and not yet in a model call."""
        return self._queue.qsize() + len(self._carry)

    async def submit(self, key, payload, size=1):
        """The job's result, awaited without blocking the event loop; QueueFull or Closed at once."""
        if self._closing.is_set():
            raise Closed()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            self._queue.put_nowait(Job(key, payload, size, future, loop))
        except queue.Full:
            raise QueueFull() from None
        return await future

    def close(self, timeout=None):
        """Stop taking jobs; the thread answers every job already accepted, then ends."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # the batcher's thread

    def _loop(self):
        while True:
            first = self._next(block=True)
            if first is None:
                if self._closing.is_set() and not self._carry and self._queue.empty():
                    return
                continue
            self._run(self._gather(first))

    def _next(self, block):
        if self._carry:
            return self._carry.popleft()
        try:
            return self._queue.get(timeout=0.1) if block else self._queue.get_nowait()
        except queue.Empty:
            return None

    def _gather(self, first):
        batch, total, passed = [first], first.size, collections.deque()
        deadline = first.arrived + self.max_delay_s
        while self._carry and total < self.max_batch:   # earlier arrivals first
            job = self._carry.popleft()
            if job.key == first.key and total + job.size <= self.max_batch:
                batch.append(job)
                total += job.size
            else:
                passed.append(job)
        while total < self.max_batch:
            wait = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job.key == first.key and total + job.size <= self.max_batch:
                batch.append(job)
                total += job.size
            else:
                passed.append(job)
        passed.extend(self._carry)
        self._carry = passed
        return batch

    def _run(self, jobs):
        self.running = len(jobs)
        try:
            results = self.execute(jobs[0].key, [job.payload for job in jobs])
            if len(results) != len(jobs):
                raise RuntimeError(f"the batch of {len(jobs)} jobs gave {len(results)} results")
        except Exception as e:   # a failure of the whole call answers each of its jobs with it
            results = [e] * len(jobs)
        finally:
            self.running = 0
        for job, result in zip(jobs, results):
            job.loop.call_soon_threadsafe(_resolve, job.future, result)


def _resolve(future, result):
    if future.done():   # the client went away and the request's task was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
