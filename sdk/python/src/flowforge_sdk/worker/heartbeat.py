"""The heartbeat thread: one thread for all the tasks a worker holds, each extended
every ``heartbeat_interval_seconds`` (the interval its poll answer gave), or sooner when
the lease the server last answered is short: each answer's ``lease_seconds`` says how
long the lease now runs, at most the time left before the attempt's timeout, so the
next heartbeat is due within a third of it (``next_heartbeat_delay``).

A 409 (``cancelled``, ``lease_expired``, ``stale_fencing_token``) or a 404 means the
worker no longer owns the generation: the task's context is marked cancelled, so the
handler can stop and its result is dropped. A heartbeat that got no answer (the server
or the network is down, a 5xx, a 429) is tried again sooner, and never stops the
thread: the lease may still be alive when the server comes back.
"""

from __future__ import annotations

import logging
import threading
import time

from flowforge_sdk.client import WorkerAPI
from flowforge_sdk.errors import (
    AuthenticationError,
    Conflict,
    NotFound,
    PermissionDenied,
    RateLimited,
)
from flowforge_sdk.models import lease_end
from flowforge_sdk.worker.held import HeldTask, HeldTasks

logger = logging.getLogger("flowforge_sdk.worker")

#: Longest sleep of the thread between two looks at the held tasks, in seconds.
MAX_TICK_SECONDS = 1.0
#: Longest wait for one heartbeat's answer, in seconds (less when the interval is shorter).
HEARTBEAT_TIMEOUT_SECONDS = 10.0
#: First retry of a heartbeat that got no answer, in seconds (doubling, capped at the interval).
RETRY_FIRST_SECONDS = 0.5
#: Shortest delay between two heartbeats of a task that a short lease brings, in seconds.
MIN_HEARTBEAT_SECONDS = 0.5


def next_heartbeat_delay(interval: float, lease_seconds: float | None) -> float:
    """Seconds until a task's next heartbeat: ``interval`` (the poll's
    ``heartbeat_interval_seconds``), or a third of ``lease_seconds`` (the lease the server
    last answered) when that is sooner, but not under MIN_HEARTBEAT_SECONDS (unless the
    interval is). ``lease_seconds`` None (an answer without it): the interval."""
    if lease_seconds is None:
        return interval
    return min(interval, max(MIN_HEARTBEAT_SECONDS, lease_seconds / 3))


class Heartbeater(threading.Thread):
    """Sends the heartbeats of every held task until ``stop()``."""

    def __init__(self, api: WorkerAPI, held: HeldTasks) -> None:
        super().__init__(name="flowforge-heartbeat", daemon=True)
        self._api = api
        self._held = held
        self._stop_event = threading.Event()
        self._wake = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self._wake.set()

    def wake(self) -> None:
        """Look at the held tasks now (new tasks arrived)."""
        self._wake.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = time.monotonic()
            next_due = now + MAX_TICK_SECONDS
            for held in self._held.snapshot():
                if held.finished or held.ctx.cancelled:
                    continue
                if held.next_heartbeat_at <= now:
                    self.beat(held)
                next_due = min(next_due, held.next_heartbeat_at)
            self._wake.wait(max(0.0, next_due - time.monotonic()))
            self._wake.clear()

    def beat(self, held: HeldTask) -> None:
        """One heartbeat of ``held``, and its next due time."""
        period = next_heartbeat_delay(held.task.heartbeat_interval_seconds, held.lease_seconds)
        try:
            # A hung call must not hold up the other tasks' heartbeats past their interval.
            lease = self._api.extend_lease(held.task_run_id, held.task.fencing_token,
                                           timeout=max(1.0, min(period, HEARTBEAT_TIMEOUT_SECONDS)))
        except (Conflict, NotFound) as exc:
            reason = (exc.code or "conflict") if isinstance(exc, Conflict) else "not_found"
            if not held.finished and held.ctx._mark_lost(reason):
                logger.warning("task %s: the server took it back (%s: %s); its result will be dropped",
                               held.describe(), reason, exc.detail)
            return
        except (AuthenticationError, PermissionDenied) as exc:
            logger.error("task %s: heartbeat refused, the key is not a valid worker key (%s)", held.describe(), exc)
            held.next_heartbeat_at = time.monotonic() + period
            return
        except Exception as exc:  # the server or the network is down, or a bug: never stop beating
            held.heartbeat_failures += 1
            wait = min(period, RETRY_FIRST_SECONDS * 2 ** min(held.heartbeat_failures - 1, 16))
            if isinstance(exc, RateLimited) and exc.retry_after is not None:
                wait = max(wait, min(exc.retry_after, period))
            logger.warning("task %s: heartbeat failed (%s); trying again in %.1f s", held.describe(), exc, wait)
            held.next_heartbeat_at = time.monotonic() + wait
            return
        held.heartbeat_failures = 0
        if lease is not None:  # without one, the last lease known (and the interval) stand
            held.lease_seconds = lease
            held.ctx.lease_expires_at = lease_end(lease)
        held.next_heartbeat_at = time.monotonic() + next_heartbeat_delay(held.task.heartbeat_interval_seconds,
                                                                         held.lease_seconds)
