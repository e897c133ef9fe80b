"""A person's writes to a run after a failure (engine.recovery, issue 19): lock the run,
send a finished run back to running, reopen finished task runs, mark one succeeded or
skipped. Statements: ``engine/sql/recovery.sql``.

Each transition is one conditional UPDATE matched on the row's state and fencing token (a
lost race matches nothing and changes nothing; the caller sees it in the result) that
bumps the token, with its event written in the same statement. What follows them (the
promotion of dependents, the skipping of what can no longer run, the run's end) is the
engine's own statements, as after a completion (``promote_dependents`` here runs
``task_run_promote_dependents``; ``task_runs.skip_descendants``, ``runs.finish``). Call inside ``transaction.atomic``, after ``lock_run``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from engine.repositories.driver import fetch
from engine.sql import queries
from flowforge.jsonb import jsonb_safe


@dataclasses.dataclass(frozen=True)
class Reopen:
    """One finished task run to reopen: matched on ``from_state`` and ``fencing_token``, it
    becomes ``to_state`` (pending, or ready for a task without dependencies)."""

    task_run_id: uuid.UUID
    fencing_token: int
    from_state: str
    to_state: str


def lock_run(*, workflow_run_id: uuid.UUID) -> str | None:
    """Lock the run's row for the rest of the transaction (``run_lock_row``) and return its
    state (None if the run is gone). Taken before any of the run's task runs by every
    person's action on the run; a cancel takes it after closing the task runs it saw open
    and then looks again (``runs.cancel``), the sweeper before closing the run: neither
    misses what an action reopened."""
    rows = fetch(queries["run_lock_row"], {"run": workflow_run_id})
    return rows[0][0] if rows else None


def reopen_run(*, workflow_run_id: uuid.UUID, detail: dict[str, Any]) -> str | None:
    """A finished run back to running (``run_reopen``: finished_at and error cleared,
    ``resumed_at`` now, a ``resumed`` event with ``detail``). Returns the state it left, or
    None when it was not finished (nothing changed)."""
    rows = fetch(queries["run_reopen"], {"run": workflow_run_id, "detail": jsonb_safe(detail)})
    return rows[0][0] if rows else None


def reopen_task_runs(changes: Sequence[Reopen], *, detail: dict[str, Any]) -> set[uuid.UUID]:
    """Reopen finished task runs (``task_run_reopen_many``): each matched on its state and
    token becomes pending or ready with its token bumped, the attempt after the last that
    started and a fresh attempt budget (``attempt_base``); a ``reset`` event each with
    ``detail``. Returns the ids reopened (a change whose row moved on is left out)."""
    if not changes:
        return set()
    rows = fetch(queries["task_run_reopen_many"], {
        "ids": [c.task_run_id for c in changes],
        "tokens": [c.fencing_token for c in changes],
        "from_states": [c.from_state for c in changes],
        "to_states": [c.to_state for c in changes],
        "detail": jsonb_safe(detail),
    })
    return {r[0] for r in rows}


def mark_succeeded(*, task_run_id: uuid.UUID, fencing_token: int, from_state: str, output_json: str,
                   detail: dict[str, Any]) -> int | None:
    """Mark a failed, skipped or cancelled task run succeeded with ``output_json`` (JSON text,
    already checked by the caller), matched on ``from_state`` and ``fencing_token``
    (``task_run_mark_succeeded``, a ``marked_succeeded`` event with ``detail``). Returns its
    new fencing token, or None when the row had moved on (nothing changed)."""
    rows = fetch(queries["task_run_mark_succeeded"], {
        "id": task_run_id, "token": fencing_token, "from_state": from_state, "output": output_json,
        "detail": jsonb_safe(detail)})
    return rows[0][1] if rows else None


def mark_skipped(*, task_run_id: uuid.UUID, fencing_token: int, from_state: str,
                 detail: dict[str, Any]) -> int | None:
    """Mark a failed or cancelled task run skipped, matched on ``from_state`` and
    ``fencing_token`` (``task_run_mark_skipped``, a ``marked_skipped`` event with
    ``detail``). Returns its new fencing token, or None when the row had moved on."""
    rows = fetch(queries["task_run_mark_skipped"], {
        "id": task_run_id, "token": fencing_token, "from_state": from_state, "detail": jsonb_safe(detail)})
    return rows[0][1] if rows else None


def promote_dependents(generations: Sequence[tuple[uuid.UUID, int]]) -> int:
    """The engine's fan-in rule for the dependents of succeeded task runs, given as
    (task run id, fencing token) generations (``task_run_promote_dependents``, the statement
    a completion runs): each pending dependent whose dependencies have all succeeded becomes
    ready with a ``promoted`` event. Returns how many were promoted."""
    if not generations:
        return 0
    rows = fetch(queries["task_run_promote_dependents"],
                 {"ids": [g[0] for g in generations], "tokens": [g[1] for g in generations]})
    return rows[0][0]
