"""The worker: polls a queue of your organization, runs each task's handler in a thread
of its own, keeps the leases alive and reports the results (docs/workers.md).

    worker = Worker(Client(url, worker_key), "images", concurrency=4)

    @worker.task("resize")
    def resize(ctx):
        ctx.log(f"resizing to {ctx.input['width']}")
        return {"thumbnail": "s3://…"}

    worker.run()    # blocks; SIGTERM or Ctrl-C drains it

The main thread polls with ``max_tasks`` = the free slots (never more), one thread
heartbeats every held task (flowforge_sdk.worker.heartbeat), one sends log lines in
batches (flowforge_sdk.worker.flusher), and each task runs in a thread of its own
(flowforge_sdk.worker.attempt). A poll answered with a ``Retry-After`` (a 503
``poll_capacity``: the server holds as many waiting polls as it may; a 429: rate
limited) is not a failure: the next poll waits those seconds (at most
MAX_RETRY_AFTER_SECONDS), with one WARNING line. When the server or the network is
down, the poll is tried again with exponential backoff and jitter, and results wait to
be reported until the server answers: nothing crashes and no result is given up while
the worker runs.

Stopping (``stop()``, the first SIGTERM or SIGINT) drains: no new poll, the poll in
flight is cut off (its connection is closed, flowforge_sdk._http.PollChannel, so an
idle worker stops in about POLL_CUT_GRACE_SECONDS, not at the end of a wait of up to
30 s; tasks the server had already handed out in it still arrive and run), the tasks
held finish and are reported, up to ``drain_timeout_seconds``; then ``run()`` returns.
A second signal (or ``stop(force=True)``) stops at once: the tasks left run out their
leases and the server hands them out again.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from flowforge_sdk._http import PollChannel
from flowforge_sdk._version import __version__
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.client import MAX_POLL_TASKS, MAX_POLL_WAIT_SECONDS, Client
from flowforge_sdk.errors import (
    AuthenticationError,
    FlowForgeError,
    NetworkError,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServerError,
    ValidationError,
)
from flowforge_sdk.models import WorkerInfo, WorkerTask
from flowforge_sdk.worker.attempt import Handler, report, run_handler
from flowforge_sdk.worker.context import TaskContext
from flowforge_sdk.worker.flusher import LogFlusher
from flowforge_sdk.worker.heartbeat import Heartbeater, next_heartbeat_delay
from flowforge_sdk.worker.held import HeldTask, HeldTasks
from flowforge_sdk.worker.logs import LogBuffer
from flowforge_sdk.workflow import QUEUE_RE

logger = logging.getLogger("flowforge_sdk.worker")

F = TypeVar("F", bound=Handler)
SDK_NAME = f"flowforge-python/{__version__}"
#: Longest wait before the next poll that a Retry-After (503 poll_capacity, 429) gets, in seconds.
MAX_RETRY_AFTER_SECONDS = 60.0
#: Seconds a stop gives the poll in flight to bring an answer the server already sent
#: before its connection is cut (flowforge_sdk._http.PollChannel).
POLL_CUT_GRACE_SECONDS = 1.0


class Worker:
    """Runs the handlers registered with ``@worker.task(name)`` for the tasks of ``queue``.

    ``client``: a Client with a worker key, or the server's URL (then ``api_key``, or
    the environment's ``FLOWFORGE_API_KEY``). ``concurrency``: tasks run at once (1-100).
    ``worker_name``: shown on the workers page (default ``<host>-<pid>``).
    ``poll_wait_seconds``: how long one poll may wait for work (0-30).
    ``drain_timeout_seconds``: how long a stop waits for the tasks held (None: no limit).
    ``backoff``: the delays between tries when the server cannot be reached.
    ``log_flush_interval_seconds``: how often buffered log lines are sent.
    ``handle_signals``: drain on SIGTERM/SIGINT while ``run()`` runs in the main thread.
    """

    def __init__(self, client: Client | str, queue: str, *, api_key: str | None = None, concurrency: int = 4,
                 worker_name: str | None = None, poll_wait_seconds: float = 20,
                 drain_timeout_seconds: float | None = 60.0, backoff: Backoff | None = None,
                 log_flush_interval_seconds: float = 1.0, handle_signals: bool = True) -> None:
        if not isinstance(queue, str) or not QUEUE_RE.match(queue):
            raise ValueError(f"queue {queue!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a letter "
                             "or digit")
        if not 1 <= concurrency <= MAX_POLL_TASKS:
            raise ValueError(f"concurrency must be from 1 to {MAX_POLL_TASKS}, got {concurrency}")
        if not 0 <= poll_wait_seconds <= MAX_POLL_WAIT_SECONDS:
            raise ValueError(f"poll_wait_seconds must be from 0 to {MAX_POLL_WAIT_SECONDS}, got {poll_wait_seconds}")
        if isinstance(client, Client):
            self.client = client
            self._owns_client = False
        else:
            key = api_key or os.environ.get("FLOWFORGE_API_KEY", "")
            if not key.strip():
                raise ValueError("no API key: pass api_key=... (a worker key) or set FLOWFORGE_API_KEY")
            # The worker retries by itself (below); the client's own retries would only stack up.
            self.client = Client(client, key, retries=0)
            self._owns_client = True
        self.queue = queue
        self.concurrency = concurrency
        self.poll_wait_seconds = poll_wait_seconds
        self.drain_timeout_seconds = drain_timeout_seconds
        self.backoff = backoff or Backoff(initial_seconds=0.5, max_seconds=30.0)
        self.log_flush_interval_seconds = log_flush_interval_seconds
        self.handle_signals = handle_signals
        host = socket.gethostname()
        self.info = WorkerInfo(id=str(uuid.uuid4()), name=worker_name or f"{host}-{os.getpid()}", host=host,
                               sdk=SDK_NAME, concurrency=concurrency)
        self._handlers: dict[str, Handler] = {}
        self.held = HeldTasks(concurrency)
        self._stopping = False  # guarded by self.held.cond (a reentrant lock: see HeldTasks)
        self._force = threading.Event()  # never waited on by the main thread: safe to set from a signal handler
        self._running = False
        self._stop_requested_at: float | None = None
        self._signals = 0
        self._fatal: FlowForgeError | None = None
        self._heartbeater: Heartbeater | None = None
        self._flusher: LogFlusher | None = None
        self._channel: PollChannel | None = None
        #: Counters since start: tasks received, results reported, results dropped, polls, failed polls,
        #: polls answered with a Retry-After (503 poll_capacity, 429).
        self.stats = {"received": 0, "reported": 0, "dropped": 0, "polls": 0, "poll_failures": 0,
                      "polls_deferred": 0}
        self._stats_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Worker(queue={self.queue!r}, id={self.info.id!r}, handlers={sorted(self._handlers)})"

    @property
    def worker_id(self) -> str:
        """The id this process sends as ``worker.id`` (a UUID, new each start)."""
        return self.info.id

    # --- handlers -------------------------------------------------------------------------

    def task(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator registering a handler for tasks whose ``name`` (the task's
        ``config.name``, default its key) is ``name`` (default: the function's name)."""

        def register(handler: F) -> F:
            self.register(name or handler.__name__, handler)
            return handler

        return register

    def register(self, name: str, handler: Handler) -> None:
        """Register ``handler(ctx) -> output`` for the task name ``name``."""
        if not isinstance(name, str) or not QUEUE_RE.match(name):
            raise ValueError(f"handler name {name!r}: use 1-64 letters, digits, '_', '-' or '.'")
        if name in self._handlers:
            raise ValueError(f"a handler named {name!r} is registered already")
        if not callable(handler):
            raise TypeError(f"the handler of {name!r} is not callable")
        self._handlers[name] = handler

    @property
    def handlers(self) -> dict[str, Handler]:
        return dict(self._handlers)

    # --- running --------------------------------------------------------------------------

    def run(self) -> None:
        """Poll, run and report until ``stop()`` (or SIGTERM/SIGINT), then drain and return.

        Raises the FlowForgeError that made the worker stop by itself, after draining:
        AuthenticationError (the key is unknown or revoked), PermissionDenied (not a
        worker key), ValidationError (the server refused the poll: a malformed queue),
        NotFound (the server has no worker endpoints)."""
        if not self._handlers:
            raise RuntimeError("no handler registered: decorate one with @worker.task('name')")
        if self._running:
            raise RuntimeError("this worker is running already")
        self._running = True
        previous = self._install_signal_handlers()
        self._heartbeater = Heartbeater(self.client.worker, self.held)
        self._flusher = LogFlusher(self.client.worker, self.held, interval=self.log_flush_interval_seconds)
        self._channel = self.client.worker.poll_channel(grace_seconds=POLL_CUT_GRACE_SECONDS)
        if self._stopping:  # stopped before the channel existed: nothing would cancel it
            self._channel.cancel()
        self._heartbeater.start()
        self._flusher.start()
        logger.info("worker %s (%s) polling queue %r with %d slots; handlers: %s", self.info.name, self.info.id,
                    self.queue, self.concurrency, ", ".join(sorted(self._handlers)))
        try:
            self._poll_loop()
            self._drain()
        finally:
            channel, self._channel = self._channel, None  # a later stop() has no poll to cut
            channel.close()
            self._heartbeater.stop()
            self._flusher.stop()
            self._heartbeater.join(timeout=5)
            self._flusher.join(timeout=5)
            self._restore_signal_handlers(previous)
            if self._owns_client:
                self.client.close()
            self._running = False
        if self._fatal is not None:
            raise self._fatal

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to drain (see the module's docstring); ``force``: stop now.
        Returns at once; ``run()`` returns when the drain is over. Safe from any thread
        and from a signal handler."""
        with self.held.cond:
            if not self._stopping:
                self._stopping = True
                self._stop_requested_at = time.monotonic()
            self.held.cond.notify_all()
        channel = self._channel
        if channel is not None:
            channel.cancel()  # an idle worker's poll would otherwise wait out its wait_seconds
        if force:
            self._force.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _poll_loop(self) -> None:
        backoff = self.backoff.copy()
        while True:
            free = self.held.wait_for_free_slot(stop=lambda: self._stopping)
            if free <= 0:
                return
            try:
                self._count("polls")
                result = self.client.worker.poll(self.queue, worker=self.info, max_tasks=min(free, MAX_POLL_TASKS),
                                                 wait_seconds=self.poll_wait_seconds, channel=self._channel)
            except Exception as exc:  # never crash the loop: _poll_failed says what it means
                delay = self._poll_failed(exc, backoff)
                if delay is None:
                    return
                self._sleep(delay)
                continue
            if backoff.failures:
                logger.info("worker %s: reconnected after %d failed polls", self.info.id, backoff.failures)
                backoff.reset()
            if len(result.tasks) > free:
                logger.warning("worker %s: the server handed out %d tasks for %d free slots", self.info.id,
                               len(result.tasks), free)
            for task in result.tasks:
                self._start(task)

    def _poll_failed(self, exc: Exception, backoff: Backoff) -> float | None:
        """What a poll that raised ``exc`` means: the seconds to wait before the next poll
        (counted and logged once), or None to poll no more."""
        if isinstance(exc, NetworkError) and self._stopping:
            logger.debug("worker %s: the poll in flight was cut off by the stop (%s)", self.info.id, exc)
            return None
        if isinstance(exc, AuthenticationError | PermissionDenied | ValidationError | NotFound):
            self._fatal = exc
            logger.error("worker %s: the server refused the poll, stopping: %s", self.info.id, _why(exc))
            self.stop()
            return None
        if isinstance(exc, RateLimited | ServerError) and exc.retry_after is not None:
            # Not a failure: the server says when to come back (503 poll_capacity: it holds
            # as many waiting polls as it may; 429: rate limited). Bounded, so that a wrong
            # header cannot park the worker; the wait ends early on a stop.
            self._count("polls_deferred")
            delay = min(exc.retry_after, MAX_RETRY_AFTER_SECONDS)
            logger.warning("worker %s: poll not served (%s %s); polling again after %.1f s, as its Retry-After "
                           "asks", self.info.id, exc.status, exc.code or "", delay)
            return delay
        self._count("poll_failures")
        delay = backoff.next_delay()
        if isinstance(exc, NetworkError | ServerError | RateLimited):
            logger.warning("worker %s: poll failed (%s); trying again in %.1f s", self.info.id, exc, delay)
        else:  # an unexpected answer (ApiError), or a bug
            logger.error("worker %s: poll failed unexpectedly (%r); trying again in %.1f s", self.info.id, exc, delay,
                         exc_info=exc)
        return delay

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds`` unless a stop is asked for meanwhile."""
        deadline = time.monotonic() + seconds
        with self.held.cond:
            while not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.held.cond.wait(min(left, 0.5))

    def _start(self, task: WorkerTask) -> None:
        """Hold ``task`` (one slot) and run its handler in a thread of its own."""
        logs = LogBuffer(task.task_run_id, task.fencing_token)
        ctx = TaskContext(task, logs=logs, on_batch_ready=self._wake_flusher)
        held = HeldTask(task=task, ctx=ctx, logs=logs, lease_seconds=task.lease_seconds,
                        next_heartbeat_at=time.monotonic() + next_heartbeat_delay(task.heartbeat_interval_seconds,
                                                                                  task.lease_seconds))
        self.held.add(held)
        self._count("received")
        logger.info("task %s: received (handler %r)", held.describe(), task.name)
        if self._heartbeater is not None:
            self._heartbeater.wake()
        thread = threading.Thread(target=self._run_attempt, args=(held,), name=f"flowforge-task-{task.task_key}",
                                  daemon=True)
        thread.start()

    def _run_attempt(self, held: HeldTask) -> None:
        try:
            outcome = run_handler(held, self._handlers.get(held.task.name), known=list(self._handlers))
            if outcome is None:
                logger.warning("task %s: result dropped, the server took the task back (%s)", held.describe(),
                               held.ctx.cancel_reason)
                self._count("dropped")
                return
            if report(held, outcome, api=self.client.worker, backoff=self.backoff, give_up=self._force):
                self._count("reported")
            else:
                self._count("dropped")
        except BaseException:  # noqa: B036 (the slot must be freed whatever happened)
            logger.exception("task %s: unexpected error in the worker", held.describe())
        finally:
            held.finished = True
            self.held.remove(held)

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self.stats[name] += 1

    def _wake_flusher(self) -> None:
        if self._flusher is not None:
            self._flusher.wake()

    def _drain(self) -> None:
        held = len(self.held)
        if held:
            logger.info("worker %s: draining, waiting for %d task(s)", self.info.id, held)
        start = self._stop_requested_at or time.monotonic()
        deadline = None if self.drain_timeout_seconds is None else start + self.drain_timeout_seconds
        if not self.held.wait_until_empty(deadline=deadline, force=self._force.is_set):
            left = [h.describe() for h in self.held.snapshot()]
            logger.warning("worker %s: stopping with %d task(s) unfinished (%s); their leases will run out and the "
                           "server will hand them out again", self.info.id, len(left), "; ".join(left))
            self._force.set()  # reports still being retried give up
        logger.info("worker %s: stopped", self.info.id)

    # --- signals --------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            logger.warning("worker %s: %s received, draining (send it again to stop at once)", self.info.id, name)
            self.stop()
        else:
            logger.warning("worker %s: %s received again, stopping now", self.info.id, name)
            self.stop(force=True)


def _why(exc: FlowForgeError) -> str:
    if isinstance(exc, AuthenticationError):
        return f"the API key was refused (unknown, expired or revoked): {exc}"
    if isinstance(exc, PermissionDenied):
        return f"the API key is not a worker key (create one with role 'worker'): {exc}"
    if isinstance(exc, NotFound):
        return f"the server has no worker endpoints at {exc.url}: {exc}"
    return str(exc)
