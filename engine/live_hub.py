"""One LISTEN connection per process, shared by every live stream the process serves.

The event trigger (engine migrations 0006/0007) raises ``pg_notify('flowforge_run_events',
'<run id>:<seq>')`` at the commit of every event of a run that has an unexpired
RunSubscription row. Before this hub each stream opened its own psycopg connection to
LISTEN, so N open streams held N PostgreSQL connections; now a process holds one:

- ``watch(organization_id=..., run_id=...)`` registers a stream's interest in a run and
  returns a Watch. The first watch of a run makes the hub upsert one RunSubscription row
  for it (one row per run per process, however many streams watch it), on the hub's
  connection, which is already LISTENing; ``watch`` returns once that is done, so an
  event committed after it returns is announced, and one committed before is in the
  stream's first read.
- One background thread per process (started lazily in the process that serves streams:
  gunicorn forks its workers after import, so the thread and its connection belong to
  the pid that started them, and a forked child starts its own) waits on the
  connection's socket and wakes the Watches of the run each notification names. The
  notification only says "look": a stream re-reads from its own cursor.
- Every RENEW_SECONDS the hub renews the subscriptions of every watched run in one
  statement; when the last Watch of a run is closed it deletes the run's row.
- If the connection drops, the hub reconnects with backoff (RECONNECT_MIN_SECONDS
  doubling to RECONNECT_MAX_SECONDS), re-subscribes every watched run under the same
  row ids, and then wakes every Watch: notifications sent while it was away are lost,
  so every stream re-reads. While it is away ``Watch.live`` is False and streams poll.
- When no run has been watched for IDLE_CLOSE_SECONDS the thread closes the connection
  and exits, so a process serving no stream holds no connection; the next ``watch``
  starts it again.

The hub never reads run data: streams read through Django's connection of their own
thread and release it before each wait (api.streaming, frontend.live), so a waiting
stream holds no PostgreSQL connection at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg

from engine import live

log = logging.getLogger(__name__)

# application_name of the hub's LISTEN connection (visible in pg_stat_activity).
APPLICATION_NAME = "flowforge-live-hub"
# Seconds between reconnection attempts after the connection drops: doubled each failure, up to the max.
RECONNECT_MIN_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 30.0
# Seconds without any watched run after which the hub closes its connection and its thread ends.
IDLE_CLOSE_SECONDS = 1.0
# Longest time, in seconds, ``watch`` waits for the hub to LISTEN and subscribe before the
# stream goes on without notifications (it then polls).
READY_TIMEOUT_SECONDS = 5.0
# Seconds the hub thread sleeps at most between two looks at its work.
_TICK_SECONDS = 5.0


class Watch:
    """One stream's interest in one run. ``wait(timeout)`` blocks until the hub saw a
    notification about the run (or reconnected) since the last ``wait``, or ``timeout``
    seconds passed; ``close()`` ends the interest (idempotent).

    ``live`` is True while the run's subscription is in place and the hub is connected,
    i.e. while a notification can be relied on to arrive; a stream polls otherwise.
    """

    def __init__(self, hub: Hub, *, organization_id: uuid.UUID, run_id: uuid.UUID):
        self._hub = hub
        self.organization_id = organization_id
        self.run_id = run_id
        self._signal = threading.Event()
        self._ready = threading.Event()
        self.live = False
        self.closed = False

    def wait(self, timeout: float) -> bool:
        """True if the run was announced (or the hub reconnected) since the last call."""
        seen = self._signal.wait(max(0.0, timeout))
        # Cleared before the caller's re-read: a notification after this is seen by the next wait.
        self._signal.clear()
        return seen

    @property
    def pending(self) -> bool:
        """True when a notification is waiting (the next ``wait`` returns at once)."""
        return self._signal.is_set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._hub._unwatch(self)


@dataclass
class _Run:
    """A watched run: its subscription row and its Watches."""

    organization_id: uuid.UUID
    sub_id: uuid.UUID = field(default_factory=uuid.uuid4)
    state: str = "new"  # new (to upsert), active, failed (retried at the next renewal)
    watches: set[Watch] = field(default_factory=set)


class Hub:
    """The process's listener (see the module docstring). Use ``hub()``, not this class."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}  # str(run id): the notification payload's prefix
        self._to_delete: list[uuid.UUID] = []
        self._thread: threading.Thread | None = None
        self._connected = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # --- the streams' side ---------------------------------------------------------------------

    def watch(self, *, organization_id: uuid.UUID, run_id: uuid.UUID) -> Watch:
        """A Watch of ``run_id``; returns once the hub LISTENs and the run is subscribed
        (or after READY_TIMEOUT_SECONDS, or at once when subscribing failed: the Watch
        is then not ``live`` and its stream polls). Starts the hub's thread if needed."""
        w = Watch(self, organization_id=organization_id, run_id=run_id)
        key = str(run_id)
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = _Run(organization_id=organization_id)
            run.watches.add(w)
            if run.state == "failed":
                run.state = "new"  # a new stream: try subscribing now rather than at the next renewal
            if run.state == "active" and self._connected:
                w.live = True
                w._ready.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="flowforge-live-hub", daemon=True)
                self._thread.start()
        self._wake()
        w._ready.wait(READY_TIMEOUT_SECONDS)
        return w

    def _unwatch(self, w: Watch) -> None:
        key = str(w.run_id)
        with self._lock:
            run = self._runs.get(key)
            if run is None or w not in run.watches:
                return
            run.watches.discard(w)
            if not run.watches:
                del self._runs[key]
                if run.state == "active":
                    self._to_delete.append(run.sub_id)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # --- the hub's thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        conn: psycopg.Connection | None = None
        backoff = RECONNECT_MIN_SECONDS
        renewed = time.monotonic()
        idle_since: float | None = None
        ever_connected = False
        try:
            while True:
                with self._lock:
                    if self._runs:
                        idle_since = None
                    else:
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since >= IDLE_CLOSE_SECONDS and (not self._to_delete or conn is None):
                            self._thread = None  # a later watch() starts a new thread
                            self._connected = False
                            return
                if conn is None:
                    try:
                        conn = live.listen_connection(application_name=APPLICATION_NAME)
                    except Exception:  # noqa: BLE001 - the database is away: retry with backoff
                        log.warning("live hub: cannot connect to LISTEN; retrying in %.1fs", backoff, exc_info=True)
                        self._set_all_ready()  # streams waiting in watch() go on, polling
                        self._sleep(backoff)
                        backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
                        continue
                    backoff = RECONNECT_MIN_SECONDS
                    renewed = time.monotonic()
                    reconnected, ever_connected = ever_connected, True
                    with self._lock:
                        for run in self._runs.values():
                            run.state = "new"  # upserted again, under the same row id
                        self._connected = True
                else:
                    reconnected = False
                try:
                    due = time.monotonic() - renewed >= live.RENEW_SECONDS
                    self._sync(conn, renew=due)
                    if due:
                        renewed = time.monotonic()
                    if reconnected:
                        self._wake_all()  # notifications of the outage are lost: everyone re-reads
                    self._dispatch(conn)
                    timeout = max(0.0, min(_TICK_SECONDS, live.RENEW_SECONDS - (time.monotonic() - renewed)))
                    if idle_since is not None:
                        timeout = min(timeout, IDLE_CLOSE_SECONDS)
                    readable, _, _ = select.select([conn.fileno(), self._wake_r], [], [], timeout)
                    if self._wake_r in readable:
                        with contextlib.suppress(BlockingIOError, OSError):
                            while os.read(self._wake_r, 4096):
                                pass
                    self._dispatch(conn)
                except Exception as exc:  # noqa: BLE001 - the hub must outlive any one failure
                    broken = isinstance(exc, OSError | ValueError) or conn.closed or conn.broken
                    if not broken:  # a statement failed on a healthy connection: go on
                        log.exception("live hub: statement failed")
                        self._sleep(RECONNECT_MIN_SECONDS)
                        continue
                    log.warning("live hub: LISTEN connection lost; reconnecting", exc_info=True)
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
                    with self._lock:
                        self._connected = False
                        for run in self._runs.values():
                            for w in run.watches:
                                w.live = False
                    self._wake_all()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
                    self._connected = False

    def _sleep(self, seconds: float) -> None:
        """Sleep, or less when a stream arrives or leaves."""
        select.select([self._wake_r], [], [], seconds)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 4096):
                pass

    def _sync(self, conn: psycopg.Connection, *, renew: bool) -> None:
        """Apply what the streams asked for: subscribe new runs, delete the rows of runs
        no longer watched, and (``renew``) extend every watched run's row in one statement."""
        with self._lock:
            deletes, self._to_delete = self._to_delete, []
            new = [(k, r.sub_id, r.organization_id) for k, r in self._runs.items()
                   if r.state == "new" or (renew and r.state == "failed")]
            active = [r.sub_id for r in self._runs.values() if r.state == "active"] if renew else []
        live.unsubscribe(conn, deletes)
        if active:
            kept = live.renew(conn, active)
            lost = set(active) - kept  # purged while the hub was stalled: subscribe again
            if lost:
                with self._lock:
                    for k, r in self._runs.items():
                        if r.sub_id in lost:
                            new.append((k, r.sub_id, r.organization_id))
        for key, sub_id, organization_id in new:
            try:
                live.subscribe(conn, organization_id=organization_id, run_id=uuid.UUID(key), sub_id=sub_id)
                state = "active"
            except psycopg.IntegrityError as exc:
                # The run is not committed yet (or is gone): its streams poll; retried at the next renewal.
                log.debug("live hub: no subscription for run %s (%s)", key, exc)
                state = "failed"
            with self._lock:
                run = self._runs.get(key)
                if run is None or run.sub_id != sub_id:
                    if state == "active":  # unwatched meanwhile
                        self._to_delete.append(sub_id)
                    continue
                run.state = state
                for w in run.watches:
                    w.live = state == "active"
                    w._ready.set()
        # Runs unwatched while being subscribed: their rows go now rather than at the next tick.
        with self._lock:
            late, self._to_delete = self._to_delete, []
        live.unsubscribe(conn, late)

    def _dispatch(self, conn: psycopg.Connection) -> None:
        """Wake the Watches of every run named by the notifications received so far."""
        # list() runs the generator to its end, so it releases the connection's lock.
        notifies = list(conn.notifies(timeout=0))
        if not notifies:
            return
        with self._lock:
            for n in notifies:
                run = self._runs.get(n.payload.partition(":")[0])
                if run is not None:
                    for w in run.watches:
                        w._signal.set()

    def _wake_all(self) -> None:
        with self._lock:
            for run in self._runs.values():
                for w in run.watches:
                    w._signal.set()

    def _set_all_ready(self) -> None:
        with self._lock:
            for run in self._runs.values():
                for w in run.watches:
                    w._ready.set()


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """This process's Hub (a new one in a forked child: threads and connections do not
    survive a fork)."""
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():
            _hub = Hub()
        return _hub


def _after_fork_in_child() -> None:
    # The parent's lock may have been held by another thread at the fork.
    global _hub, _hub_lock
    _hub, _hub_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def watch(*, organization_id: uuid.UUID, run_id: uuid.UUID) -> Watch:
    """Watch ``run_id`` through this process's hub (``Hub.watch``). Close the Watch."""
    return hub().watch(organization_id=organization_id, run_id=run_id)


def release_connection() -> None:
    """Close the calling thread's Django connection before a stream waits, so a waiting
    stream holds no PostgreSQL connection (the next read opens one again: a few
    milliseconds, paid only when a wait ends, against a connection per open stream).
    Inside a transaction (a test's) the connection is left alone: closing it would doom
    the transaction."""
    from django.db import connection

    if not connection.in_atomic_block:
        connection.close()


