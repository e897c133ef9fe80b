"""Why ready task runs and queued runs wait (issue 16): the reasons, computed in SQL
(``engine/sql/waiting.sql``), and the scheduler's ``waiting`` events when they change.

The reasons' words are the design brief's (docs/scheduling.md, "Wait reasons"):
``waiting: concurrency stripe 5/5``, ``waiting: rate limit github 10/10 per second, next
window in 0.4 s``, ``waiting: organization quota 100/100 running``, ``waiting: workflow
limit 3/3 running tasks``, ``waiting: organization's share of the workers (64 dispatched,
not started)``, ``waiting: retry backoff, 3.2 s``, ``waiting: workflow run limit 2/2``,
``waiting: for a worker``.

``reasons`` and ``run_reasons`` only read (any transaction or autocommit);
``note_waiting`` writes and is its own statement (autocommit, or the caller's transaction).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction

from engine.repositories.driver import fetch
from engine.sql import queries
from tenancy.limits import plan_table

#: The reason of a ready task run nothing holds back (its claim follows).
FOR_A_WORKER = "waiting: for a worker"
# A reason's countdown: ", 3.2 s" (retry backoff), ", next window in 0.4 s" or ", second half in
# 0.2 s" (rate limit).
_COUNTDOWN = re.compile(r",( next window in| second half in)? [0-9.]+ s\Z")

# Ready task runs note_waiting looks at per call, at most (the heads of the organizations' queues).
NOTE_LIMIT = 500


def _limits_params() -> dict[str, Any]:
    """The parameters every reason statement takes: the plans as parallel arrays
    (``tenancy.limits.plan_table``) and FLOWFORGE_DISPATCH_AHEAD."""
    return {**plan_table(), "dispatch_ahead": int(settings.FLOWFORGE_DISPATCH_AHEAD)}


def reasons(*, run_id: uuid.UUID | None = None,
            task_run_ids: Sequence[uuid.UUID] = ()) -> dict[uuid.UUID, str]:
    """``{task_run_id: reason}`` for each task run that is ``ready`` now, among the task
    runs of ``run_id`` and those in ``task_run_ids`` (``task_run_wait_reasons``). Task runs
    in other states are absent. One statement; never raises for missing ids."""
    if run_id is None and not task_run_ids:
        return {}
    rows = fetch(queries["task_run_wait_reasons"],
                 {"run": run_id, "ids": list(task_run_ids), **_limits_params()})
    return dict(rows)


def run_reasons(run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """``{run_id: reason}`` for each run among ``run_ids`` that is ``pending`` because its
    workflow's ``max_running_runs`` is reached (``waiting: workflow run limit 2/2``, the
    running runs of every version of the name over the limit); other runs are absent."""
    if not run_ids:
        return {}
    return dict(fetch(queries["run_wait_reasons"], {"ids": list(run_ids)}))


def without_countdown(reason: str) -> str:
    """``reason`` without its countdown: "waiting: retry backoff, 3.2 s" -> "waiting: retry
    backoff"; "..., next window in 0.4 s" and "..., second half in 0.2 s" -> "..." (what a
    page that is not refreshed each second shows, and what ``wait_reason`` keeps)."""
    return _COUNTDOWN.sub("", reason)


def stored_reason(reason: str) -> str:
    """What ``wait_reason`` keeps of ``reason``: the words without a countdown ("retry
    backoff, 3.2 s" is kept as "retry backoff", "..., next window in 0.4 s" without it,
    so a reason that only counts down is no change), '' when nothing holds the task run
    back ("waiting: for a worker"), at most the column's 200 characters."""
    if reason == FOR_A_WORKER:
        return ""
    return without_countdown(reason)[:200]


def note_waiting(*, limit: int = NOTE_LIMIT) -> int:
    """Record what changed in why ready task runs wait: for at most ``limit`` ready task
    runs (each organization's next ones in claim order, an equal share per organization
    with ready work: ``task_run_waiting_heads``), their reasons (``task_run_wait_reasons``,
    the API's own), and for those whose ``stored_reason`` differs from their
    ``wait_reason`` column, the column set and, when something holds them back, a
    ``waiting`` event with ``detail = {"reason": <the reason's words>}``
    (``task_run_note_waiting``; rows a claim has locked are skipped).

    Returns the number of events written. One transaction (its own, or the caller's).
    """
    if limit <= 0:
        return 0
    with transaction.atomic():
        heads = [row[0] for row in fetch(queries["task_run_waiting_heads"], {"limit": int(limit)})]
        found = reasons(task_run_ids=heads)
        if not found:
            return 0
        ids = list(found)
        rows = fetch(queries["task_run_note_waiting"], {
            "ids": ids, "reasons": [found[i] for i in ids], "stored": [stored_reason(found[i]) for i in ids]})
    return int(rows[0][1]) if rows else 0


def attach(run, task_runs=None) -> None:
    """Set ``waiting_reason`` on ``run`` (a WorkflowRun) and on each of its task runs
    (``task_runs``, else its prefetched ``task_runs``): the reason for a ready task run
    and for a run queued by its workflow's run limit, None otherwise. At most two
    statements, none when nothing is ready or pending (what the API's run and the run page
    show)."""
    rows = list(run.task_runs.all()) if task_runs is None else list(task_runs)
    ready = [tr.pk for tr in rows if tr.state == "ready"]
    found = reasons(task_run_ids=ready) if ready else {}
    for tr in rows:
        tr.waiting_reason = found.get(tr.pk)
    run.waiting_reason = run_reasons([run.pk]).get(run.pk) if run.state == "pending" else None


def attach_runs(runs) -> None:
    """Set ``waiting_reason`` on each run of ``runs`` (a page of WorkflowRuns): the run
    limit reason of a queued run, None otherwise; one statement when any is pending."""
    pending = [r.pk for r in runs if r.state == "pending"]
    found = run_reasons(pending) if pending else {}
    for r in runs:
        r.waiting_reason = found.get(r.pk)
