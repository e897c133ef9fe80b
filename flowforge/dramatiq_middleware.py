"""Dramatiq middleware shared by every actor."""

from __future__ import annotations

import threading
import time
from queue import Empty, PriorityQueue

from django import db
from dramatiq.middleware import Middleware
from dramatiq.worker import WorkerThread

from flowforge import logs


class DjangoConnectionMiddleware(Middleware):
    """Drop unusable or expired database connections around each message.

    A worker thread keeps its Django connection between messages; after a
    PostgreSQL restart that connection is dead, and ``close_old_connections`` (with
    ``CONN_HEALTH_CHECKS``) replaces it instead of failing every later message.
    """

    def before_process_message(self, broker, message):
        db.close_old_connections()

    def after_process_message(self, broker, message, *, result=None, exception=None):
        db.close_old_connections()

    def after_skip_message(self, broker, message):
        db.close_old_connections()

    def before_worker_thread_shutdown(self, broker, thread):
        db.connection.close()


class LogContextMiddleware(Middleware):
    """Bind the task run and generation of an execute message to the thread's log lines
    (flowforge.logs), and reset them when the message is done."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before_process_message(self, broker, message):
        self._local.token = None
        if message.actor_name in ("execute_task_run", "execute_task_run_first") and len(message.args) >= 2:
            ctx_fields = {"task_run_id": message.args[0], "fencing_token": message.args[1]}
            self._local.token = logs._fields.set({**logs._fields.get(), **{k: str(v) for k, v in ctx_fields.items()}})

    def _reset(self):
        token = getattr(self._local, "token", None)
        if token is not None:
            logs._fields.reset(token)
            self._local.token = None

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self._reset()

    def after_skip_message(self, broker, message):
        self._reset()


class LaneWorkQueue(PriorityQueue):
    """Dramatiq's work queue of one worker process (a priority queue of the fetched
    messages waiting for a thread, ``dramatiq.worker._WorkQueueItem``: lowest ``priority``
    first) whose *reserved* threads take only urgent messages.

    A thread registered with ``reserve()`` takes the queue's head only when its priority is
    at most ``max_priority`` (an organization's first-lane generation, a control actor),
    and otherwise waits; every other thread takes the head whatever it is, as upstream's.
    So when every ordinary thread is busy with bulk work, a first-lane message fetched by
    this process starts on a reserved thread at once instead of waiting for one of them to
    finish (issue 16's fairness: B's first task against A's burst). Unbounded, as
    Dramatiq's own (``PriorityQueue()``)."""

    def __init__(self, max_priority: int) -> None:
        super().__init__()
        self.max_priority = max_priority
        self._reserved: set[int] = set()
        self._reserved_waiting = 0  # under self.mutex

    def reserve(self) -> None:
        """Make the calling thread a reserved taker (before its first ``get``)."""
        with self.mutex:
            self._reserved.add(threading.get_ident())

    def _urgent_head(self) -> bool:
        return bool(self.queue) and self.queue[0].priority <= self.max_priority

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item`` and wake one taker, as upstream's, plus each reserved thread
        waiting: a reserved thread woken for an item it may not take would otherwise
        swallow the wake-up an idle ordinary thread needed. Never blocks (unbounded)."""
        with self.not_empty:
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify(1 + self._reserved_waiting)

    def get(self, block: bool = True, timeout: float | None = None):
        """The head item (``queue.PriorityQueue.get``); for a reserved thread, the head only
        once it is urgent (priority <= max_priority). Raises ``queue.Empty`` when none
        came within ``timeout`` seconds (or at once when ``block`` is false)."""
        if threading.get_ident() not in self._reserved:
            return super().get(block, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.not_empty:
            while not self._urgent_head():
                remaining = None if deadline is None else deadline - time.monotonic()
                if not block or (remaining is not None and remaining <= 0):
                    raise Empty
                self._reserved_waiting += 1
                try:
                    self.not_empty.wait(remaining)
                finally:
                    self._reserved_waiting -= 1
            item = self._get()
            self.not_full.notify()
            return item


class _ReservedWorkerThread(WorkerThread):
    """Dramatiq's worker thread, registered as a reserved taker of its LaneWorkQueue."""

    def run(self) -> None:
        self.work_queue.reserve()
        super().run()


class WorkQueueLanes(Middleware):
    """Gives this worker process a ``LaneWorkQueue`` with ``reserved_threads`` reserved
    threads beside Dramatiq's ``--threads`` ordinary ones (None: the setting
    FLOWFORGE_WORKER_RESERVED_THREADS), taking messages of Dramatiq priority at most
    ``max_priority`` (None: engine.states.TASK_FIRST_PRIORITY, the first lane; the control
    actors, at 0, too), and keeps a reference to the queue so ``urgent_message_waiting``
    can look at it. The reserved threads are extra: the ordinary threads, and so the bulk
    work one organization alone can run, are Dramatiq's ``--threads`` as before."""

    def __init__(self, reserved_threads: int | None = None, max_priority: int | None = None) -> None:
        self._reserved_threads = reserved_threads
        self._max_priority = max_priority

    def before_worker_boot(self, broker, worker):
        global _work_queue
        # Before Dramatiq's own worker middleware creates the consumers and threads, which
        # take worker.work_queue as they are made.
        worker.work_queue = LaneWorkQueue(self._priority())
        _work_queue = worker.work_queue

    def after_worker_boot(self, broker, worker):
        for _ in range(self._count()):
            thread = _ReservedWorkerThread(broker=broker, consumers=worker.consumers, work_queue=worker.work_queue,
                                           worker_timeout=worker.worker_timeout)
            thread.start()
            worker.workers.append(thread)  # stopped and joined with the others

    def _count(self) -> int:
        if self._reserved_threads is not None:
            return self._reserved_threads
        from django.conf import settings

        return settings.FLOWFORGE_WORKER_RESERVED_THREADS

    def _priority(self) -> int:
        if self._max_priority is not None:
            return self._max_priority
        from engine.states import TASK_FIRST_PRIORITY

        return TASK_FIRST_PRIORITY


_work_queue = None


def urgent_message_waiting(below_priority: int) -> bool:
    """True when this worker process has fetched a message of Dramatiq priority lower
    (more urgent) than ``below_priority`` that waits for a free thread; False otherwise,
    and outside a worker process (no work queue).

    Reads the head of the priority queue's heap without its lock: a racy peek, which can
    only be stale by the item a thread takes meanwhile (the caller then yields for a
    message another thread took, which costs a hand-off, never correctness)."""
    queue = _work_queue
    if queue is None:
        return False
    try:
        head = queue.queue[0]
    except IndexError:
        return False
    return head.priority < below_priority
