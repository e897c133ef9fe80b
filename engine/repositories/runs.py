"""Writes of runs (core_workflowrun): create one with its task runs, derive its terminal
state, cancel it, admit runs queued behind their workflow's run limit. Statements:
``engine/sql/runs.sql``. Call inside ``transaction.atomic`` (``admit_queued`` excepted:
it opens a transaction per workflow name)."""

from __future__ import annotations

import json
import typing
import uuid
from typing import Any

from django.db import transaction

from engine.repositories import events
from engine.repositories.driver import fetch
from engine.sql import queries
from engine.states import RunSchedule
from flowforge.jsonb import jsonb_safe


class RunFinished(typing.NamedTuple):
    """A run that took its terminal ``state``; ``limited``: its workflow has
    max_running_runs, so a run queued behind that limit may be admitted now (nudge the
    scheduler, whose tick runs ``admit_queued``)."""

    state: str
    limited: bool


def lock(key: str) -> None:
    """Take the transaction-scoped advisory lock on ``key`` (``run_lock``): held until
    the caller's transaction ends. Keys: ``runs-per-minute:<org id>`` (the organization's
    start quota), ``workflow-runs:<org id>:<workflow name>`` (a name's run limit),
    ``backfills:<org id>`` (the organization's count of backfills going, engine.backfill)."""
    fetch(queries["run_lock"], {"key": key})


def run_limit_lock_key(organization_id, workflow_name: str) -> str:
    return f"workflow-runs:{organization_id}:{workflow_name}"


def create_with_task_runs(
    *,
    workflow_id: uuid.UUID,
    organization_id: uuid.UUID,
    run_input: dict[str, Any],
    trigger_source: str,
    triggered_by_id: uuid.UUID | None = None,
    retry_of_id: uuid.UUID | None = None,
    trigger_id: uuid.UUID | None = None,
    priority: int = 0,
    api_key_id: uuid.UUID | None = None,
    concurrency_keys: dict[str, str] | None = None,
    queued_reason: str | None = None,
    held: bool = False,
    run_id: uuid.UUID | None = None,
    schedule: RunSchedule | None = None,
) -> uuid.UUID:
    """Insert a WorkflowRun and all its TaskRuns in one go, and the ``run_started`` event.
    Returns the run id (``run_id`` when given).

    Without ``queued_reason`` the run is ``running``, its roots ``ready`` (``ready_at``
    now) and the rest ``pending`` (the design brief's "Start"). With it the run is
    queued behind its workflow's run limit: ``pending``, every task run ``pending``, and
    a run-level ``waiting`` event with ``detail.reason = queued_reason``;
    ``admit_queued`` starts it later. ``held`` alone stores it the same way without the
    event (a run the caller cancels at once: the run limit's ``cancel_newest``).

    Each task run's priority is ``priority`` + its task's, and its concurrency key
    ``concurrency_keys[task key]`` (the task's key rendered with the run input by the
    caller: ``engine.limit_keys.render_concurrency_key``), NULL for a task without one.
    ``api_key_id`` is the API key that started it (None for anyone else).
    ``schedule`` (a cron run's instant and data interval) fills scheduled_for,
    data_interval_start and data_interval_end; without it they stay NULL.
    The caller has checked that the workflow may be started (it is active).
    """
    run_id = run_id or uuid.uuid4()
    held = held or queued_reason is not None
    state = "pending" if held else "running"
    fetch(
        queries["run_insert"],
        {
            "run": run_id,
            "org": organization_id,
            "wf": workflow_id,
            "input": jsonb_safe(run_input),
            "source": trigger_source,
            "user": triggered_by_id,
            "api_key": api_key_id,
            "retry_of": retry_of_id,
            "trigger": trigger_id,
            "state": state,
            "priority": priority,
            "scheduled_for": schedule.scheduled_for if schedule else None,
            "interval_start": schedule.data_interval_start if schedule else None,
            "interval_end": schedule.data_interval_end if schedule else None,
        },
    )
    fetch(queries["task_run_insert_for_run"], {
        "run": run_id, "wf": workflow_id, "priority": priority, "held": held,
        "keys": json.dumps(concurrency_keys or {}),
    })
    events.append(
        workflow_run_id=run_id,
        kind="run_started",
        to_state=state,
        detail={"trigger_source": trigger_source, "retry_of": str(retry_of_id) if retry_of_id else None,
                **({"scheduled_for": schedule.as_dict()["scheduled_for"]} if schedule else {})},
    )
    if queued_reason is not None:
        events.append(workflow_run_id=run_id, kind="waiting", to_state=state, detail={"reason": queued_reason})
    return run_id


def count_recent(*, organization_id: uuid.UUID, window_seconds: float, limit: int) -> tuple[int, float | None]:
    """(runs the organization created in the last ``window_seconds``, counted up to
    ``limit``; seconds until the oldest of those counted leaves the window, None when
    there are none) — ``run_count_recent``. At ``limit`` the quota is full until then."""
    n, free_in = fetch(queries["run_count_recent"],
                       {"org": organization_id, "window": float(window_seconds), "limit": limit})[0]
    return n, free_in


def count_open_of_name(*, organization_id: uuid.UUID, workflow_name: str) -> tuple[int, int]:
    """(running, queued) runs of every version of ``workflow_name`` (``run_count_open_of_name``)."""
    running, queued = fetch(queries["run_count_open_of_name"], {"org": organization_id, "name": workflow_name})[0]
    return running, queued


def oldest_open_of_name(*, organization_id: uuid.UUID, workflow_name: str, limit: int) -> list[uuid.UUID]:
    """The ids of the ``limit`` oldest runs still going (running or queued) of every
    version of ``workflow_name``, oldest first."""
    rows = fetch(queries["run_list_oldest_open_of_name"],
                 {"org": organization_id, "name": workflow_name, "limit": limit})
    return [r[0] for r in rows]


def admit_queued(*, limit: int = 1000, names_limit: int = 200) -> int:
    """Admit runs queued behind their workflow's run limit (``max_running_runs``),
    oldest first, while each workflow name has room: the run becomes ``running``
    (``started_at``, a ``run_admitted`` event) and its roots ``ready`` (``ready_at``).
    Returns how many runs were admitted. The scheduler's tick calls it.

    One transaction per (organization, workflow name), up to ``names_limit`` names and
    ``limit`` runs per name: the name's advisory lock (``run_lock``, the one a start
    takes) in its own statement first, so the count of running runs in
    ``run_admit_queued`` (a later statement, a fresh snapshot under READ COMMITTED) sees
    every start and admission committed before, and two admitters never both fill the
    last place. Must not run inside a transaction of the caller's (it would hold every
    name's lock until that one ends)."""
    admitted = 0
    for organization_id, name in fetch(queries["run_list_queued_names"], {"limit": names_limit}):
        with transaction.atomic():
            lock(run_limit_lock_key(organization_id, name))
            admitted += len(fetch(queries["run_admit_queued"], {"org": organization_id, "name": name, "limit": limit}))
    return admitted


def finish(*, workflow_run_id: uuid.UUID) -> RunFinished | None:
    """``finish_if_done``, returning the new state with whether the run's workflow has a
    run limit (``RunFinished``), or None."""
    rows = fetch(queries["run_finish_if_done"], {"run": workflow_run_id})
    return RunFinished(rows[0][1], bool(rows[0][2])) if rows else None


def finish_if_done(*, workflow_run_id: uuid.UUID) -> str | None:
    """Derive and set the run's terminal state once none of its task runs is open
    (``run_finish_if_done``, one probe of ``idx_taskrun_run_state``): failed if any task
    failed, else cancelled if any was cancelled, else succeeded. Returns the new state, or
    None when the run is not finished (or was already finished by someone else).
    Run after the statement that bumped the run's event counter, so it sees every
    transition of the run committed before."""
    finished = finish(workflow_run_id=workflow_run_id)
    return finished.state if finished else None


def cancel(*, workflow_run_id: uuid.UUID, reason: str, final_state: str = "cancelled") -> bool:
    """Cancel a run: every open task run (pending, ready, running) becomes ``cancelled``
    with its fencing token bumped (``task_run_cancel_open``), so a running worker's next
    heartbeat finds it gone and its completion is rejected as stale; then the run becomes
    ``final_state`` (``cancelled``, or ``failed`` when the run is stopped for timing out)
    with ``reason`` as its error (``run_cancel``). Returns False when the run was already
    terminal (the cancel lost a race with the run's completion and changed nothing).
    Raises ValueError for another ``final_state``."""
    if final_state not in ("cancelled", "failed"):
        raise ValueError(f"final_state must be cancelled or failed, not {final_state!r}")
    fetch(queries["task_run_cancel_open"], {"run": workflow_run_id, "reason": reason})
    # Then the run's row (task runs first, the run last: the engine's lock order), which a
    # person's action on the run holds while it reopens finished task runs
    # (engine.recovery): once it is ours, a new look closes what such an action reopened
    # after the first look, so no task run of a cancelled run is left open.
    fetch(queries["run_lock_row"], {"run": workflow_run_id})
    fetch(queries["task_run_cancel_open"], {"run": workflow_run_id, "reason": reason})
    rows = fetch(queries["run_cancel"], {"run": workflow_run_id, "reason": reason, "final": final_state})
    return bool(rows)
