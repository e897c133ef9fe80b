"""Entry points the tests (and the page benchmark) drive the engine through, one
generation at a time, built on the production operations of
``engine.repositories.task_runs``. No production path runs them: a worker records its
starts and successes in batches (``task_runs.start_and_complete_many``)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from engine.repositories import task_runs
from engine.repositories.types import CompletionResult, Dispatch, StartedAttempt, StartRequest, SuccessRequest


def start_attempts(
    requests: Sequence[StartRequest], *, lease_seconds: float, connection_attempts: int = 0
) -> list[StartedAttempt | None]:
    """Start several generations at once (``start_and_complete_many`` with starts only,
    and without the claim a worker's batch then makes: a start alone); returns, in order,
    each request's StartedAttempt or None (stale or duplicate, recorded)."""
    started, _results, _claimed = task_runs.start_and_complete_many(
        starts=requests, successes=(), worker_lease_seconds=lease_seconds, dispatch_lease_seconds=0.0,
        owner="", connection_attempts=connection_attempts, claim=False,
    )
    return started


def start_attempt(
    *, task_run_id: uuid.UUID, fencing_token: int, owner: str, lease_seconds: float
) -> StartedAttempt | None:
    """Start generation ``fencing_token`` of a task run as ``owner``; None (recorded) when
    the message is stale or a duplicate delivery."""
    return start_attempts([StartRequest(task_run_id, fencing_token, owner)], lease_seconds=lease_seconds)[0]


def complete_successes(
    requests: Sequence[SuccessRequest],
    *,
    lease_seconds: float,
    owner: str,
    connection_attempts: int = 0,
    reserve_seconds: float = 0.0,
    claim: bool = True,
) -> tuple[list[CompletionResult], tuple[Dispatch, ...]]:
    """Record several successes at once (``start_and_complete_many`` with successes only);
    returns each request's result and what the batch's claim took for their organizations
    (their dependents, and any other ready task run of theirs there was room for), or
    nothing without ``claim``."""
    _started, results, claimed = task_runs.start_and_complete_many(
        starts=(), successes=requests, worker_lease_seconds=0.0, dispatch_lease_seconds=lease_seconds,
        owner=owner, connection_attempts=connection_attempts, reserve_seconds=reserve_seconds, claim=claim,
    )
    return results, claimed


def complete_attempt(
    *,
    task_run_id: uuid.UUID,
    fencing_token: int,
    succeeded: bool,
    output: Any = None,
    error: str = "",
    retryable: bool = True,
    lease_seconds: float,
    owner: str,
    claim: bool = True,
) -> CompletionResult:
    """Finish generation ``fencing_token`` of a task run: a success as a batch of one
    (what its claim took in ``dispatches``; ``claim`` as in ``complete_successes``), a
    failure through ``task_runs.fail_attempt``."""
    if succeeded:
        results, dispatches = complete_successes(
            [SuccessRequest(task_run_id, fencing_token, output)], lease_seconds=lease_seconds, owner=owner,
            claim=claim,
        )
        return dataclasses.replace(results[0], dispatches=dispatches)
    return task_runs.fail_attempt(task_run_id=task_run_id, fencing_token=fencing_token, error=error,
                                  retryable=retryable)
