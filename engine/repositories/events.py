"""Appends to a run's history that are not a task-run transition (seed 001): a run's
start, and why a start or a completion was refused. Transitions write their own events
in their statement (``engine/sql/task_runs.sql``).

Each event's ``seq`` comes from ``core_workflowrun.last_event_seq`` under that run's row
lock, so a run's history is gap-free and in commit order.
"""

from __future__ import annotations

import uuid
from typing import Any

from engine.repositories.driver import fetch
from engine.sql import queries
from flowforge.jsonb import jsonb_safe


def append(
    *,
    workflow_run_id: uuid.UUID,
    kind: str,
    task_run_id: uuid.UUID | None = None,
    from_state: str = "",
    to_state: str = "",
    attempt: int | None = None,
    fencing_token: int | None = None,
    detail: dict[str, Any] | None = None,
) -> int | None:
    """Append one event to a run's history (``event_append``); returns its ``seq`` (None
    if the run is gone). Used for events that are not a task-run transition: a run's
    start and end, a rejected stale completion, an ignored duplicate delivery."""
    rows = fetch(
        queries["event_append"],
        {
            "run": workflow_run_id,
            "tr": task_run_id,
            "kind": kind,
            "from": from_state,
            "to": to_state,
            "attempt": attempt,
            "token": fencing_token,
            "detail": jsonb_safe(detail or {}),
        },
    )
    return rows[0][0] if rows else None


def append_redelivered(generations: list[tuple[uuid.UUID, int]], *, consumer: str) -> list[tuple[uuid.UUID, float]]:
    """A ``redelivered`` event for each (task run id, fencing token) generation of
    ``generations`` that is still claimed and not started: its message was given back to
    its queue after the worker process ``consumer`` (a broker id) died holding it
    (``event_append_redelivered_many``; one statement, autocommit or the caller's
    transaction). Returns (task run id, seconds since its claim or None) per event written;
    generations that started, moved on or are gone are skipped."""
    if not generations:
        return []
    rows = fetch(queries["event_append_redelivered_many"], {
        "ids": [g[0] for g in generations], "tokens": [int(g[1]) for g in generations], "consumer": consumer})
    return [(row[0], row[1]) for row in rows]


def append_ignored_start(*, task_run_id: uuid.UUID, fencing_token: int) -> None:
    """Record why generation ``fencing_token`` of a task run was not started: a duplicate
    delivery of the generation that already started, or a stale message (the row moved to
    another generation or state). Nothing is recorded for a task run that is gone."""
    current = fetch(queries["task_run_get_generation"], {"id": task_run_id})
    if not current:
        return
    run_id, state, token, started_token = current[0]
    duplicate = token == fencing_token and started_token == fencing_token
    append(
        workflow_run_id=run_id,
        task_run_id=task_run_id,
        kind="duplicate_delivery_ignored" if duplicate else "stale_dispatch_ignored",
        from_state=state,
        to_state=state,
        fencing_token=fencing_token,
        detail={"message_fencing_token": fencing_token, "current_fencing_token": token, "state": state},
    )


def append_stale_completion(*, task_run_id: uuid.UUID, fencing_token: int, succeeded: bool,
                            reason: str | None = None, once: bool = False) -> None:
    """Record a completion of generation ``fencing_token`` that matched nothing (the row
    moved to another generation or state) as ``stale_completion_rejected``, with
    ``reason`` (the refusal's code, e.g. ``lease_expired``) in its detail when given.
    Nothing is recorded for a task run that is gone, nor with ``once`` when an event
    already records this generation's refused completion of the same outcome
    (``event_stale_completion_recorded``: a worker replaying a refused call, or a hostile
    one, cannot grow the run's history)."""
    outcome = "succeeded" if succeeded else "failed"
    if once and fetch(queries["event_stale_completion_recorded"],
                      {"id": task_run_id, "token": fencing_token, "outcome": outcome})[0][0]:
        return
    current = fetch(queries["task_run_get_generation"], {"id": task_run_id})
    if not current:
        return
    run_id, state, token, _started_token = current[0]
    append(
        workflow_run_id=run_id,
        task_run_id=task_run_id,
        kind="stale_completion_rejected",
        from_state=state,
        to_state=state,
        fencing_token=fencing_token,
        detail={
            "completion_fencing_token": fencing_token,
            "current_fencing_token": token,
            "state": state,
            "outcome": outcome,
            **({"reason": reason} if reason else {}),
        },
    )
