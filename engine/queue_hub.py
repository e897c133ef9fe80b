"""One LISTEN connection per process that wakes the long polls of the organizations'
own workers (issue 18, docs/workers.md).

The trigger ``taskrun_worker_ready_notify`` (engine migration 0019) raises
``pg_notify('flowforge_worker_ready', '<organization id>:<queue>')`` at the commit of
every worker task run that becomes ready. A poll that found nothing to claim waits on a
``QueueWait`` of its (organization, queue) here instead of asking the database again:

- ``wait_for(organization_id, queue)`` registers the poll's interest and returns once the
  process's listener thread LISTENs (or after READY_TIMEOUT_SECONDS: the wait is then not
  ``live``, and the poll re-checks every NOT_LIVE_RECHECK_SECONDS). Register *before* the
  claim: a task that turns ready between the claim and the wait is then announced.
- The thread waits on the connection's socket and sets the events of the waits of the
  (organization, queue) each notification names. The notification only says "look": the
  poll claims by its own query, and a poll woken for a task another worker took waits again.
- When the connection drops, the thread reconnects with backoff and wakes every wait
  (notifications sent meanwhile are lost). With no wait registered for
  IDLE_CLOSE_SECONDS, it closes the connection and ends; the next wait starts it again.

A waiting poll holds no transaction open (its web thread's connection idles), so an idle
worker costs the database its claim once per poll, nothing between.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import uuid

import psycopg

from engine import live

log = logging.getLogger(__name__)

#: The channel of the trigger taskrun_worker_ready_notify (engine migration 0019).
CHANNEL = "flowforge_worker_ready"
APPLICATION_NAME = "flowforge-queue-hub"
RECONNECT_MIN_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 30.0
IDLE_CLOSE_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 5.0
#: Seconds between a poll's own re-checks while the hub cannot promise a notification.
NOT_LIVE_RECHECK_SECONDS = 1.0
_TICK_SECONDS = 5.0


class QueueWait:
    """One poll's interest in one queue. ``wait(timeout)`` returns True once a notification
    about the queue (or a reconnection) arrived since the last ``wait``, False after
    ``timeout`` seconds; ``close()`` ends the interest (idempotent; also a context manager).
    ``live`` is True while the hub LISTENs, so a notification can be relied on."""

    def __init__(self, hub: QueueHub, key: str):
        self._hub = hub
        self.key = key
        self.signal = threading.Event()
        self.closed = False

    @property
    def live(self) -> bool:
        return self._hub.connected

    def wait(self, timeout: float) -> bool:
        seen = self.signal.wait(max(0.0, timeout))
        self.signal.clear()
        return seen

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._hub._remove(self)

    def __enter__(self) -> QueueWait:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class QueueHub:
    """The process's listener (module docstring). Use ``hub()``, not this class."""

    def __init__(self, *, channel: str = CHANNEL, application_name: str = APPLICATION_NAME) -> None:
        # The channel and connection name: the worker queues' by default; engine.org_hub
        # listens to the organizations' run changes with the same machinery.
        self.channel = channel
        self.application_name = application_name
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._waits: dict[str, set[QueueWait]] = {}
        self._thread: threading.Thread | None = None
        self.connected = False
        self._ready = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @staticmethod
    def key(organization_id: uuid.UUID, queue: str) -> str:
        """The notification payload that names (organization, queue)."""
        return f"{organization_id}:{queue}"

    def wait_for(self, organization_id: uuid.UUID, queue: str) -> QueueWait:
        """A QueueWait of the organization's ``queue``, returned once the hub LISTENs (or
        after READY_TIMEOUT_SECONDS). Starts the hub's thread if needed."""
        w = QueueWait(self, self.key(organization_id, queue))
        with self._lock:
            self._waits.setdefault(w.key, set()).add(w)
            if self._thread is None:
                self._ready.clear()
                self._thread = threading.Thread(target=self._serve, name=self.application_name, daemon=True)
                self._thread.start()
        self._ready.wait(READY_TIMEOUT_SECONDS)
        return w

    def waiting(self) -> int:
        """How many waits are registered (the process's held long polls)."""
        with self._lock:
            return sum(len(ws) for ws in self._waits.values())

    def _remove(self, w: QueueWait) -> None:
        with self._lock:
            ws = self._waits.get(w.key)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self._waits[w.key]
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _serve(self) -> None:
        conn: psycopg.Connection | None = None
        backoff = RECONNECT_MIN_SECONDS
        idle_since: float | None = None
        try:
            while True:
                with self._lock:
                    if self._waits:
                        idle_since = None
                    else:
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since >= IDLE_CLOSE_SECONDS:
                            self._thread = None  # the next wait_for starts a new thread
                            self.connected = False
                            return
                if conn is None:
                    try:
                        conn = live.listen_connection(application_name=self.application_name, channel=self.channel)
                    except Exception:  # noqa: BLE001 - the database is away: retry with backoff
                        log.warning("queue hub: cannot LISTEN; retrying in %.1fs", backoff, exc_info=True)
                        conn = None
                        self._ready.set()  # polls waiting in wait_for go on, re-checking themselves
                        self._sleep(backoff)
                        backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
                        continue
                    backoff = RECONNECT_MIN_SECONDS
                    self.connected = True
                    self._ready.set()
                    self._wake_all()  # whatever was announced while away is lost: every poll looks
                try:
                    self._dispatch(conn)
                    timeout = IDLE_CLOSE_SECONDS if idle_since is not None else _TICK_SECONDS
                    readable, _, _ = select.select([conn.fileno(), self._wake_r], [], [], timeout)
                    if self._wake_r in readable:
                        with contextlib.suppress(BlockingIOError, OSError):
                            while os.read(self._wake_r, 4096):
                                pass
                    self._dispatch(conn)
                except Exception:  # noqa: BLE001 - the hub must outlive a lost connection
                    log.warning("queue hub: LISTEN connection lost; reconnecting", exc_info=True)
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
                    self.connected = False
                    self._wake_all()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
                    self.connected = False

    def _sleep(self, seconds: float) -> None:
        select.select([self._wake_r], [], [], seconds)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 4096):
                pass

    def _dispatch(self, conn: psycopg.Connection) -> None:
        """Set the events of the waits of every (organization, queue) notified so far."""
        notifies = list(conn.notifies(timeout=0))  # list(): ends the generator, releasing the lock
        if not notifies:
            return
        with self._lock:
            for n in notifies:
                for w in self._waits.get(n.payload, ()):
                    w.signal.set()

    def _wake_all(self) -> None:
        with self._lock:
            for ws in self._waits.values():
                for w in ws:
                    w.signal.set()


_hub: QueueHub | None = None
_hub_lock = threading.Lock()


def hub() -> QueueHub:
    """This process's QueueHub (a new one in a forked child: threads do not survive a fork)."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():
            _hub = QueueHub()
        return _hub
