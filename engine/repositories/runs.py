"""Writes of runs (core_workflowrun): create one with its task runs, derive its terminal
state, cancel it. Statements: ``engine/sql/runs.sql``. Call inside ``transaction.atomic``."""

from __future__ import annotations

import uuid
from typing import Any

from engine.repositories import events
from engine.repositories.driver import fetch
from engine.sql import queries
from flowforge.jsonb import jsonb_safe


def create_with_task_runs(
    *,
    workflow_id: uuid.UUID,
    organization_id: uuid.UUID,
    run_input: dict[str, Any],
    trigger_source: str,
    triggered_by_id: uuid.UUID | None = None,
    retry_of_id: uuid.UUID | None = None,
    trigger_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """Insert a WorkflowRun (``running``) and all its TaskRuns in one go: roots
    ``ready``, the rest ``pending`` (the design brief's "Start"), and the
    ``run_started`` event. Returns the run id.

    The caller has checked that the workflow may be started (it is active).
    """
    run_id = uuid.uuid4()
    fetch(
        queries["run_insert"],
        {
            "run": run_id,
            "org": organization_id,
            "wf": workflow_id,
            "input": jsonb_safe(run_input),
            "source": trigger_source,
            "user": triggered_by_id,
            "retry_of": retry_of_id,
            "trigger": trigger_id,
        },
    )
    fetch(queries["task_run_insert_for_run"], {"run": run_id, "wf": workflow_id})
    events.append(
        workflow_run_id=run_id,
        kind="run_started",
        to_state="running",
        detail={"trigger_source": trigger_source, "retry_of": str(retry_of_id) if retry_of_id else None},
    )
    return run_id


def finish_if_done(*, workflow_run_id: uuid.UUID) -> str | None:
    """Derive and set the run's terminal state once none of its task runs is open
    (``run_finish_if_done``, one probe of ``idx_taskrun_run_state``): failed if any task
    failed, else cancelled if any was cancelled, else succeeded. Returns the new state, or
    None when the run is not finished (or was already finished by someone else).
    Run after the statement that bumped the run's event counter, so it sees every
    transition of the run committed before."""
    rows = fetch(queries["run_finish_if_done"], {"run": workflow_run_id})
    return rows[0][1] if rows else None


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
    rows = fetch(queries["run_cancel"], {"run": workflow_run_id, "reason": reason, "final": final_state})
    return bool(rows)
