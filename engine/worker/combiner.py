"""The Combiner: a worker process's threads share one transaction at a time.

Generic threading only (no database): ``BatchCompleter`` (``engine.worker.batching``)
runs a process's starts and successes through one, so under load one commit covers
several tasks. Its rules, in short:

- idle: a request runs at once, alone, in its submitter's thread (no added latency);
- busy: requests queue and go together into the next batch, run by one of their
  submitters (the "lead"); a batch that raises is run again request by request, so one
  bad request fails only itself;
- ``wait=False`` (write-behind): when busy, the request is queued and ``submit`` returns
  None at once; its ``on_result(result, error)`` is called by the thread that runs it;
- nothing queued is left behind: a lead hands over to a waiting submitter, or runs the
  write-behind requests itself before returning;
- linger (``linger_seconds``): a lead that starts right after a batch released several
  waiting submitters waits, up to that long, for their next requests, so they share one
  batch instead of the first one's write-behind going alone (below).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Combiner[Req, Res]:
    """Runs the requests of a process's threads in batches, one batch at a time.

    A request that arrives while no batch is running runs at once, alone (no added
    latency at light load); requests that arrive while one is running wait and go
    together into the next batch, which one of them runs. So a worker process has at
    most one such transaction in flight, and under load one commit covers several
    tasks instead of each thread queueing on the same run row for a commit of its own.
    ``run_batch(requests)`` returns one result per request, in order; when it raises
    for a batch of several, each request is run again alone (``run_batch([request])``)
    and gets its own result or exception, so one bad request fails only itself.

    ``submit(request)`` waits for the request's result (or raises its exception).
    ``submit(request, wait=False, on_result=f)`` does not wait when a batch is already
    running: the request goes into the next batch, ``f(result, error)`` is called (by
    the thread that runs that batch) once it has run, and the call returns None. With
    no batch running it runs the request at once, like ``submit(request)`` (``f`` is
    not called).
    Nothing queued is left behind: the thread that runs a batch hands the next one to a
    waiting submitter or, when only requests nobody waits for are queued, runs it itself.

    With ``linger_seconds`` > 0: the waiting submitters a batch releases (R of them) are
    the threads most likely to submit again at once (a worker thread records its
    success, written behind, then starts its next generation). A lead that begins within
    ``linger_seconds`` of such a release, R >= 2, having found the combiner idle (not a
    successor, nor a lead kept for write-behind requests: theirs waited a whole batch
    already), waits until R - 1 waiting requests other than its own are queued (at most
    a full batch), or ``linger_seconds`` have passed, or none has arrived for LINGER_GAP
    of it, before it takes the batch (plus the wait for the interpreter lock, when the
    process's other threads hold it, once the wait is over). Without it, under load, the first
    released thread's write-behind success found the combiner idle and went alone, and
    the others' next starts waited a whole batch behind it: batches alternated between
    8 starts and none (2 x 8 threads, 2,000 independent no-op tasks: 45% of the batches
    held no start). Released threads busy with handlers of real length send nothing, so
    such a linger ends after LINGER_GAP x ``linger_seconds``.
    """

    #: A linger also ends once no waiting request has arrived for this share of it.
    LINGER_GAP = 0.25

    def __init__(self, run_batch: Callable[[list[Req]], list[Res]], *, max_batch: int = 64,
                 linger_seconds: float = 0.0):
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._linger = linger_seconds
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False
        # A lingering lead waits on this (with the lock) for waiting submitters to arrive.
        self._arrived = threading.Condition(self._lock)
        self._lingering = False
        # The waiting submitters the last batch released, and when (time.monotonic()).
        self._released = 0
        self._released_at = float("-inf")

    def submit(self, request: Req, *, wait: bool = True,
               on_result: Callable[[Res | None, BaseException | None], None] | None = None) -> Res | None:
        slot = _Slot(request, wait, on_result)
        with self._lock:
            self._queue.append(slot)
            if self._lingering and wait:
                self._arrived.notify()
            if self._busy:
                if not wait:
                    return None  # the thread running the current batch, or its successor, runs it
            else:
                self._busy = True
                slot.lead = True
        # Only a lead that found the combiner idle lingers: a successor's and a kept lead's
        # requests waited through a whole batch already.
        fresh = slot.lead
        while True:
            if not slot.lead:
                slot.wait_ready()
                if not slot.lead:  # woken with its result
                    return slot.result()
            with self._lock:
                if fresh:
                    self._gather(slot)
                    fresh = False
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                self._released = sum(1 for s in batch if s.wait)
            self._run(batch)
            with self._lock:
                self._released_at = time.monotonic()
                successor = None
                if not self._queue:  # (its own request ran: it was queued first)
                    self._busy = False
                    finished = True
                elif slot.done:
                    # Hand the lead to a waiting submitter; with only requests nobody waits
                    # for queued, keep it (they must not be left behind).
                    successor = next((s for s in self._queue if s.wait), None)
                    if successor is not None:
                        successor.lead = True
                    finished = successor is not None
                else:
                    finished = False
            for s in batch:
                if s is not slot and s.wait:
                    s.set_ready()
            if successor is not None:
                successor.set_ready()
            if finished:
                return slot.result()

    def _gather(self, lead: _Slot) -> None:
        """The linger (class docstring) of a lead that found the combiner idle, with the
        lock held: when the last batch released two or more waiting submitters less than
        ``linger_seconds`` ago, wait until as many waiting requests, ``lead``'s own aside,
        less one (a full batch at most), are queued, until
        ``linger_seconds`` have passed, or until none has arrived for LINGER_GAP of it."""
        if self._linger <= 0 or self._released < 2 or len(self._queue) >= self._max_batch:
            return
        now = time.monotonic()
        if now - self._released_at > self._linger:
            return  # not right after a release: nobody in particular to wait for
        deadline = now + self._linger
        gap = self._linger * self.LINGER_GAP
        quiet_until = now + gap
        wanted = min(self._released, self._max_batch) - 1
        arrived = sum(1 for s in self._queue if s.wait and s is not lead)
        self._lingering = True
        try:
            while arrived < wanted:
                left = min(deadline, quiet_until) - time.monotonic()
                if left <= 0:
                    return
                self._arrived.wait(left)
                now_arrived = sum(1 for s in self._queue if s.wait and s is not lead)
                if now_arrived > arrived:
                    arrived, quiet_until = now_arrived, time.monotonic() + gap
        finally:
            self._lingering = False

    def _run(self, batch: list[_Slot]) -> None:
        try:
            results = self._run_batch([s.request for s in batch])
            for s, res in zip(batch, results, strict=True):
                s.value = res
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                # One bad request must not fail the others it happened to share a batch with
                # (their transaction rolled back whole): each runs again alone, and only the
                # ones that fail alone get an error.
                log.warning("a batch of %d requests failed (%s: %s); running each alone",
                            len(batch), type(exc).__name__, exc)
                for s in batch:
                    try:
                        (s.value,) = self._run_batch([s.request])
                    except Exception as alone:
                        s.error = alone
        except BaseException as exc:
            for s in batch:
                s.error = exc
        for s in batch:
            s.done = True
            if s.on_result is not None and not s.lead:  # (a lead's own request: returned to it)
                try:
                    s.on_result(s.value, s.error)
                except Exception:
                    log.exception("a batched request's result callback failed")


class _Slot:
    __slots__ = ("request", "wait", "on_result", "_ready", "lead", "done", "value", "error")

    def __init__(self, request, wait: bool = True, on_result=None):
        self.request = request
        self.wait = wait
        self.on_result = on_result
        # Released once, by the thread that hands this slot its result or the lead: a bare
        # lock, as threading.Event's condition variable costs several times more per hand-off.
        self._ready = threading.Lock()
        self._ready.acquire()
        self.lead = False
        self.done = False
        self.value = None
        self.error: BaseException | None = None

    def wait_ready(self) -> None:
        self._ready.acquire()

    def set_ready(self) -> None:
        self._ready.release()

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value
