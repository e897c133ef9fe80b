"""What a task handler receives: the task's inputs, a way to log, and whether the
worker still owns the task."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from flowforge_sdk.errors import TaskCancelled
from flowforge_sdk.models import WorkerTask
from flowforge_sdk.worker.logs import LogBuffer


class TaskContext:
    """The context of one task generation handed to this worker.

    ``input``: the task's ``config.input`` (secrets resolved); ``run_input``: the run's
    input; ``upstream``: the outputs of the task's dependencies, by task key; ``schedule``:
    a cron run's instant and data interval (None for other runs);
    ``attempt`` of ``max_attempts``; ids and names of the task run, its run, workflow
    and queue. Treat ``input`` as sensitive: it may hold secret values.

    ``log(message, level="info")`` sends a line to the run page (buffered, batched).

    ``cancelled`` turns True (and ``cancel_event`` is set) when the server answers a
    heartbeat (or a log call) with 409: the run was cancelled or timed out
    (``cancel_reason`` ``cancelled``), or the lease was lost (``lease_expired``,
    ``stale_fencing_token``). The handler should stop soon; whatever it returns is
    dropped. Long handlers check ``ctx.cancelled``, or sleep with ``ctx.wait(seconds)``
    (returns True when cancelled), or call ``ctx.raise_if_cancelled()``.
    """

    def __init__(self, task: WorkerTask, *, logs: LogBuffer, on_batch_ready: Callable[[], None] | None = None) -> None:
        self.task = task
        self._logs = logs
        self._on_batch_ready = on_batch_ready
        self._cancel_event = threading.Event()
        self._cancel_reason: str | None = None
        self.lease_expires_at: dt.datetime | None = task.lease_expires_at

    def __repr__(self) -> str:  # ids only: input may hold secrets
        return (f"TaskContext(task_key={self.task_key!r}, task_run_id={self.task_run_id!r}, "
                f"attempt={self.attempt}, cancelled={self.cancelled})")

    # --- the task ------------------------------------------------------------------------------

    @property
    def input(self) -> dict[str, Any]:
        return self.task.input

    @property
    def run_input(self) -> dict[str, Any]:
        return self.task.run_input

    @property
    def upstream(self) -> dict[str, Any]:
        return self.task.upstream

    @property
    def schedule(self) -> dict[str, str] | None:
        """For a run a cron trigger or a backfill started: {"scheduled_for",
        "data_interval_start", "data_interval_end"} (ISO 8601, UTC), the instant the run is
        for and the interval [previous instant, scheduled_for) it covers; None otherwise."""
        return self.task.schedule

    @property
    def attempt(self) -> int:
        return self.task.attempt

    @property
    def max_attempts(self) -> int:
        return self.task.max_attempts

    @property
    def task_run_id(self) -> str:
        return self.task.task_run_id

    @property
    def workflow_run_id(self) -> str:
        return self.task.workflow_run_id

    @property
    def workflow(self) -> str:
        return self.task.workflow

    @property
    def task_key(self) -> str:
        return self.task.task_key

    @property
    def name(self) -> str:
        """The handler name the task asked for."""
        return self.task.name

    @property
    def queue(self) -> str:
        return self.task.queue

    @property
    def fencing_token(self) -> int:
        return self.task.fencing_token

    @property
    def timeout_seconds(self) -> float | None:
        return self.task.timeout_seconds

    # --- logging -------------------------------------------------------------------------------

    def log(self, message: str, level: str = "info") -> None:
        """Send ``message`` to the task's log on the run page (``level``: debug, info,
        warning or error; ValueError otherwise). Buffered: lines go out in batches,
        and all of them before the result. The server redacts secret values from them."""
        if self._logs.add(level, message) and self._on_batch_ready is not None:
            self._on_batch_ready()

    # --- cancellation --------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the server said this worker no longer owns the task."""
        return self._cancel_event.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        """Set when ``cancelled`` turns True (to wait on, or to hand to other code)."""
        return self._cancel_event

    @property
    def cancel_reason(self) -> str | None:
        """``cancelled``, ``lease_expired``, ``stale_fencing_token`` or ``not_found``; None while owned."""
        return self._cancel_reason

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; returns True (at once) if the task is cancelled meanwhile."""
        return self._cancel_event.wait(seconds)

    def raise_if_cancelled(self) -> None:
        """Raise TaskCancelled when the task is no longer this worker's."""
        if self.cancelled:
            raise TaskCancelled(self._cancel_reason or "cancelled")

    def _mark_lost(self, reason: str) -> bool:
        """Record that the server refused this generation; False when it was already known."""
        if self._cancel_event.is_set():
            return False
        self._cancel_reason = reason
        self._cancel_event.set()
        return True
