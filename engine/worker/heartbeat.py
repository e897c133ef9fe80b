"""The worker's heartbeat: one daemon thread per process keeps its attempts' leases alive.

An attempt registers its TaskContext when its handler starts and unregisters it when the
handler returns. Every FLOWFORGE_HEARTBEAT_SECONDS the thread extends every registered
lease in one UPDATE (``task_runs.heartbeat_many``); an attempt whose lease could not be
extended (reaped, cancelled, superseded by a newer generation) gets ``context.lost`` set,
which a handler sees as ``context.lease_lost`` and stops for.
"""

from __future__ import annotations

import logging
import threading
import uuid

from django import db
from django.conf import settings

from engine.handlers import TaskContext
from engine.repositories import task_runs

log = logging.getLogger(__name__)


class Heartbeater:
    """One daemon thread per worker process that extends the leases of every attempt
    the process is running, in one UPDATE per beat. An attempt whose lease could not
    be extended (reaped, cancelled, superseded) has ``context.lost`` set.

    ``interval_seconds``: time between beats; ``lease_seconds``: how far each beat
    extends a lease (never past the attempt's timeout, see ``task_runs.heartbeat_many``).
    The thread starts with the first ``register``."""

    def __init__(self, *, interval_seconds: float, lease_seconds: float):
        self.interval_seconds = interval_seconds
        self.lease_seconds = lease_seconds
        self._active: dict[tuple[uuid.UUID, int], TaskContext] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, context: TaskContext) -> None:
        """Keep ``context``'s lease alive from the next beat on (starts the thread if needed)."""
        with self._lock:
            self._active[(context.task_run_id, context.fencing_token)] = context
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flowforge-heartbeat", daemon=True)
                self._thread.start()

    def unregister(self, context: TaskContext) -> None:
        """Stop extending ``context``'s lease (its handler returned)."""
        with self._lock:
            self._active.pop((context.task_run_id, context.fencing_token), None)

    def beat(self) -> None:
        """Extend every registered lease once (also called by tests)."""
        with self._lock:
            items = list(self._active.items())
        if not items:
            return
        alive = task_runs.heartbeat_many(leases=[k for k, _ in items], lease_seconds=self.lease_seconds)
        for (task_run_id, token), ctx in items:
            if task_run_id not in alive:
                log.warning("task run %s generation %s lost its lease", task_run_id, token)
                ctx.lost.set()

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.interval_seconds):
            try:
                self.beat()
            except Exception:
                log.exception("heartbeat failed; retrying next beat")
                db.connection.close()


_heartbeater: Heartbeater | None = None


def heartbeater() -> Heartbeater:
    """This process's Heartbeater (created on first use from FLOWFORGE_HEARTBEAT_SECONDS and
    FLOWFORGE_LEASE_SECONDS). Tests replace ``_heartbeater`` with one that never beats alone."""
    global _heartbeater
    if _heartbeater is None:
        _heartbeater = Heartbeater(
            interval_seconds=settings.FLOWFORGE_HEARTBEAT_SECONDS, lease_seconds=settings.FLOWFORGE_LEASE_SECONDS
        )
    return _heartbeater
