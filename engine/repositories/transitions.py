"""The old names of the repositories' operations, kept only until their callers move to
``engine.repositories.task_runs``, ``runs``, ``events`` and ``driver`` (issue 15); then
this module is deleted. No logic and no SQL here: each name is bound to its new function,
except three adapters that drop arguments the new functions no longer take (the
``lease_seconds``/``owner`` of a failure, which never claims anything).
"""

from __future__ import annotations

import uuid

from engine.repositories import events, runs, task_runs
from engine.repositories.driver import autocommit_retry
from engine.repositories.types import (
    TASK_QUEUE,
    TERMINAL,
    CompletionResult,
    Dispatch,
    StartedAttempt,
    StartRequest,
    SuccessRequest,
)

claim_ready = task_runs.claim_ready_many
start_and_complete = task_runs.start_and_complete_many
heartbeat = task_runs.heartbeat_many
expired_leases = task_runs.get_expired_leases
skip_descendants = task_runs.skip_descendants
create_run_rows = runs.create_with_task_runs
finish_run_if_done = runs.finish_if_done
cancel_run = runs.cancel
record_run_event = events.append


def complete_attempt(*, task_run_id: uuid.UUID, fencing_token: int, succeeded: bool, error: str = "",
                     retryable: bool = True, lease_seconds: float, owner: str) -> CompletionResult:
    """``task_runs.fail_attempt`` (only failures come this way; successes go through
    ``task_runs.start_and_complete_many``)."""
    if succeeded:
        raise ValueError("a success is recorded by task_runs.start_and_complete_many")
    return task_runs.fail_attempt(task_run_id=task_run_id, fencing_token=fencing_token, error=error,
                                  retryable=retryable)


def expire_lease(*, task_run_id: uuid.UUID, fencing_token: int, lease_seconds: float, owner: str) -> CompletionResult:
    """``task_runs.expire_lease``."""
    return task_runs.expire_lease(task_run_id=task_run_id, fencing_token=fencing_token)


def fail_undelivered(*, task_run_id: uuid.UUID, fencing_token: int, error: str, lease_seconds: float,
                     owner: str) -> CompletionResult:
    """``task_runs.fail_undelivered``."""
    return task_runs.fail_undelivered(task_run_id=task_run_id, fencing_token=fencing_token, error=error)


__all__ = [
    "TASK_QUEUE", "TERMINAL", "CompletionResult", "Dispatch", "StartRequest", "StartedAttempt", "SuccessRequest",
    "autocommit_retry", "cancel_run", "claim_ready", "complete_attempt", "create_run_rows", "expire_lease",
    "expired_leases", "fail_undelivered", "finish_run_if_done", "heartbeat", "record_run_event",
    "skip_descendants", "start_and_complete",
]
