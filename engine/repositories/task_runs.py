"""Writes of task runs (core_taskrun), the only writer of their state (seed 000, "How
writes reach these tables"). Statements: ``engine/sql/task_runs.sql``.

Every state change is one conditional UPDATE whose WHERE clause states the
precondition (``state = 'ready'``, ``fencing_token = $token`` ...). A lost race
therefore matches no row and changes nothing; no function here raises for one.
Each transition writes its TaskRunEvent in the same statement (a data-modifying
CTE), and the event's ``seq`` comes from ``core_workflowrun.last_event_seq``
under that run's row lock, so a run's history is gap-free and in commit order
(seed 001).

Lock order, which keeps deadlocks rare: task-run rows first, the run row last
(the event-sequence bump is the last write of every statement). Statements that
read a run's other task runs (promotion, skipping, terminal-state derivation)
run *after* that bump, so under READ COMMITTED they see every transition of the
run that committed before ours (two completions racing on a fan-in both see the
other's result; one of them promotes).

The life of a generation here: ``claim_ready_many`` (ready -> running, outbox row),
``start_and_complete_many`` (a worker's starts and successes, the successes'
dependents promoted and claimed by the fan-in rule, finished runs derived),
``heartbeat_many``; a failure through ``fail_attempt``, ``expire_lease`` (the reaper)
or ``fail_undelivered`` (a dead-lettered dispatch), each then advancing the run
(``_advance_after_failure``: settle its dependents by their trigger rules, or schedule
the retry; derive the run's end); a false condition through ``skip_for_condition``.
``settle_dependents`` is the one way to advance a run after a finish other than a
worker's success (docs/api.md, "Trigger rules and conditions").

Functions must be called inside ``transaction.atomic`` unless their docstring says
otherwise.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction

from engine.db import atomic_retry
from engine.repositories import events, runs
from engine.repositories.driver import fetch, in_own_transaction, run_prepared
from engine.repositories.types import (
    CompletionResult,
    Dispatch,
    StartedAttempt,
    StartRequest,
    SuccessRequest,
)
from engine.sql import queries
from engine.states import TASK_FIRST_QUEUE, TASK_QUEUE, TASK_TERMINAL_STATES, RunSchedule
from flowforge.jsonb import strip_nul
from tenancy.limits import plan_table

# Characters of a failure's error kept on the task run and its event.
_MAX_ERROR_CHARS = 10_000
# Characters of a failed attempt's traceback its event keeps, at most: the ceiling of
# FLOWFORGE_TASK_TRACEBACK_MAX_CHARS, which cuts it before (with a line saying so).
MAX_TRACEBACK_CHARS = 100_000

# A batch of successes, in one round trip and one transaction (``run_prepared``): the
# conditional UPDATE + events; then, each statement with a fresh snapshot taken after the
# runs' event counters were bumped, promotion and claim of the dependents with one outbox
# row per generation, and the terminal state of each run left with nothing open. The
# statements after the first are idempotent: what they do after a stale or duplicate
# completion was due anyway.
_SUCCEED_STATEMENTS = (
    queries["task_run_succeed_many"],
    queries["task_run_promote_dependents"],
    queries["run_finish_if_done_many"],
)


def _json(value: Any) -> Any:
    """Decode a jsonb column from a raw cursor (Django's psycopg setup returns jsonb as text)."""
    return json.loads(value) if isinstance(value, str) else value


def _json_text(value: Any) -> str:
    """``value`` as JSON text for a jsonb column (NULs stripped, like ``jsonb_safe``).
    Raises ValueError for NaN or Infinity."""
    try:
        return json.dumps(strip_nul(value), allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"NaN and Infinity cannot be stored as JSON ({exc})") from exc


def _dispatches(rows: list[tuple]) -> list[Dispatch]:
    """The Dispatches of a claim's rows (a row per claimed generation with a NULL sixth
    column, its wait in seconds seventh, its lane eighth, its place in the claim's order
    ninth and tenth and whether it counted into a rate bucket eleventh, then a row per
    outbox row written), in claim order: the order they are published in, so a
    higher-priority generation is never sent behind a lower one of the same claim."""
    outbox_ids = {row[0]: row[5] for row in rows if row[5] is not None}
    claimed = sorted((row for row in rows if row[5] is None), key=lambda r: (r[8], r[9], str(r[0])))
    return [Dispatch(*row[:5], outbox_ids.get(row[0]), float(row[6]) if row[6] is not None else None, row[7],
                     bool(row[10]))
            for row in claimed]


# --- Claim (ready -> running) + outbox: the fair claim ------------------------------------------

#: Organizations locked and claimed for per scheduler statement (task_run_lock_ready_orgs).
CLAIM_ORGS_PER_PASS = 100
#: Rows past an organization's room the claim's index scan may look at, so that rows a
#: partly full gate turns away do not leave its room unused (task_run_claim_fair).
CLAIM_LOOKAHEAD = 32
_NO_ORG = uuid.UUID(int=0)


def claim_params(*, limit: int, lease_seconds: float, owner: str, reserve_seconds: float = 0.0) -> dict[str, Any]:
    """The parameters ``task_run_claim_fair`` shares with every claimer (the organizations
    to claim for, ``orgs``/``org_of``/``only_ids``, are each caller's): the batch ``limit``,
    the dispatch lease and owner, the publish reservation, the two lanes
    (FLOWFORGE_DISPATCH_FIRST), FLOWFORGE_DISPATCH_AHEAD and the plans' weights and quotas
    (``tenancy.limits.plan_table``)."""
    return {
        "limit": limit,
        "owner": owner,
        "lease": float(lease_seconds),
        "queue": TASK_QUEUE,
        "first_queue": TASK_FIRST_QUEUE,
        "first": int(settings.FLOWFORGE_DISPATCH_FIRST),
        "reserve": float(reserve_seconds),
        "ahead": int(settings.FLOWFORGE_DISPATCH_AHEAD),
        "refill": 0,
        "lookahead": CLAIM_LOOKAHEAD,
        "claim_queue": "",
        **plan_table(),
    }


def claim_ready_many(
    *,
    limit: int,
    lease_seconds: float,
    owner: str,
    task_run_ids: Sequence[uuid.UUID] | None = None,
    organizations: Sequence[uuid.UUID] | None = None,
    reserve_seconds: float = 0.0,
) -> list[Dispatch]:
    """Claim up to ``limit`` ready task runs fairly (the design brief's "Claim +
    dispatch", issue 16): ready -> running with a dispatch lease of ``lease_seconds`` and a
    bumped ``fencing_token``, one outbox row per new generation, a 'claimed' event each.

    For the ``organizations`` given (a worker's refill: ``organizations_with_ready_of``),
    else the first CLAIM_ORGS_PER_PASS with ready task runs
    (``ready_organizations_after``); with ``task_run_ids``, only those rows (and their
    organizations). One transaction: first the organizations' claim locks
    (``task_run_lock_orgs`` / ``task_run_lock_orgs_of``), then ``task_run_claim_fair``:
    weighted round robin between organizations, highest priority then oldest within one,
    within each organization's room (claimed-not-started under FLOWFORGE_DISPATCH_AHEAD x
    weight, running under its quota), concurrency permits, workflow limits and rate
    buckets. With ``reserve_seconds`` > 0 the outbox rows are reserved that long for the
    caller, who publishes them itself after the commit (``engine.relay.publish_claimed``).

    Returns the claimed generations, each with the seconds it waited. Never raises for a
    lost race. Runs in its own transaction (retried on a deadlock) unless called inside
    one, where it runs in the caller's (which then holds the locks until it ends).
    """
    if task_run_ids is not None and not task_run_ids:
        return []
    params = claim_params(limit=limit, lease_seconds=lease_seconds, owner=owner, reserve_seconds=reserve_seconds)
    if task_run_ids is not None:
        ids = list(task_run_ids)
        lock = (queries["task_run_lock_orgs_of"], {"lock_ids": ids})
        params.update(orgs=[], org_of=ids, only_ids=ids)
    else:
        orgs = list(organizations) if organizations is not None else ready_organizations_after(None)
        if not orgs:
            return []
        lock = (queries["task_run_lock_orgs"], {"orgs": orgs})
        params.update(orgs=orgs, org_of=[], only_ids=None)

    # The locks and the claim in one message to the server (each statement takes its own
    # snapshot, so the claim counts after the locks are granted).
    params.update(lock[1])
    return in_own_transaction(
        lambda: _dispatches(run_prepared([lock[0], queries["task_run_claim_fair"]], params)[1]), 0)


def lock_organization_claims(organization_ids: Sequence[uuid.UUID]) -> None:
    """Take the claim locks of ``organization_ids`` for the caller's transaction
    (``task_run_lock_orgs``, ascending key): what a claimer takes first, before any row lock."""
    fetch(queries["task_run_lock_orgs"], {"orgs": list(organization_ids)})


def ready_ids_of_runs(run_ids: Sequence[uuid.UUID], *, limit: int) -> list[uuid.UUID]:
    """Ids of up to ``limit`` ready task runs of the shared workers of the runs
    ``run_ids``, oldest first (``task_run_ready_of_runs``; read only): new runs' roots (a
    start's own claim; the claim after a caller's commit)."""
    if not run_ids:
        return []
    return [row[0] for row in fetch(queries["task_run_ready_of_runs"], {"runs": list(run_ids), "limit": limit})]


def organizations_with_ready_of(task_run_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Ids of the organizations of ``task_run_ids`` that have a ready task run, ascending
    (``task_run_ready_orgs_of``; read only, takes no lock)."""
    if not task_run_ids:
        return []
    return [row[0] for row in fetch(queries["task_run_ready_orgs_of"], {"ids": list(task_run_ids)})]


def ready_organizations_after(after: uuid.UUID | None, *, limit: int = CLAIM_ORGS_PER_PASS) -> list[uuid.UUID]:
    """Ids of up to ``limit`` organizations with ready task runs whose id sorts after
    ``after`` (None: from the first), ascending (``task_run_ready_orgs_after``; read only)."""
    return [row[0] for row in fetch(queries["task_run_ready_orgs_after"],
                                    {"after": after or _NO_ORG, "max_orgs": limit})]


# --- Start and succeed, one transaction -------------------------------------------------------


def _upstream_bytes() -> int:
    """FLOWFORGE_MAX_UPSTREAM_BYTES: bytes of dependency outputs (JSON text) one task is
    handed whole (StartedAttempt.upstream)."""
    return int(getattr(settings, "FLOWFORGE_MAX_UPSTREAM_BYTES", 1024 * 1024))


def start_and_complete_many(
    *,
    starts: Sequence[StartRequest],
    successes: Sequence[SuccessRequest],
    worker_lease_seconds: float,
    dispatch_lease_seconds: float,
    owner: str,
    connection_attempts: int = 0,
    reserve_seconds: float = 0.0,
    claim: bool = True,
) -> tuple[list[StartedAttempt | None], list[CompletionResult], tuple[Dispatch, ...]]:
    """Record ``successes`` (handlers that returned), then ``starts`` (delivered execute
    messages), in one transaction and one round trip: what a worker process's threads
    have to record at the same moment costs one commit and one bump of each run's event
    counter per statement.

    A start marks its generation started by its owner (at most once per generation) and
    takes the worker's lease of ``worker_lease_seconds`` (bounded by the task's
    ``timeout_seconds``); of starts naming the same task run only the first can start. A
    success matches only a generation that started; its pending dependents with the default
    rule whose dependencies have all succeeded are promoted to ready
    (``task_run_promote_dependents``, skipped when no success ``has_dependents``), and
    those with another trigger rule are decided right after, in a transaction of their own
    (``_settle_after_successes``: ready, skipped, or still pending); each run left with
    nothing open gets its terminal state. With both kinds, the two UPDATEs are one statement
    (``task_run_start_and_succeed_many``), so the runs' rows are locked only after both
    have run.

    With ``claim`` (what a worker does), the transaction first takes the claim locks of
    the requests' organizations and, after the promotion, claims for them
    (``task_run_claim_fair``, with ``dispatch_lease_seconds``, ``owner`` and
    ``reserve_seconds`` as in ``claim_ready_many``): what the successes promoted, and
    whatever their starts (room in the broker) and successes (room, permits) let in.
    Without it nothing is claimed (a test of one transition alone).

    Returns each start's StartedAttempt or None, each success's CompletionResult (both in
    request order) and the generations claimed (publish them after the commit). A stale
    or duplicate request is recorded afterwards (``events.append_ignored_start``,
    ``events.append_stale_completion``), each in its own transaction. In autocommit mode
    the whole is its own transaction, retried on a deadlock (and on a lost connection,
    ``connection_attempts`` times); inside a transaction it runs in it. Raises
    ValueError for an output holding NaN or Infinity.
    """
    first: dict[uuid.UUID, int] = {}
    for i, req in enumerate(starts):
        first.setdefault(req.task_run_id, i)
    to_start = [starts[i] for i in first.values()]
    if not successes and not to_start:
        return [], [], ()
    # One parameter dict for every statement (their names do not clash).
    params: dict[str, Any] = claim_params(
        limit=settings.FLOWFORGE_CLAIM_BATCH, lease_seconds=dispatch_lease_seconds, owner=owner,
        reserve_seconds=reserve_seconds,
    )
    # The claim locks of the organizations of these task runs first (before any row lock),
    # then their starts and successes, the successes' dependents promoted, and one fair
    # claim for those organizations: what the successes promoted and what their starts and
    # successes made room for (a start leaves the broker, a success frees a permit).
    lock_ids = [r.task_run_id for r in successes] + [r.task_run_id for r in to_start]
    # A refill claims once a quarter of the organization's dispatch-ahead has drained.
    params.update(lock_ids=lock_ids, org_of=lock_ids, orgs=[], only_ids=None,
                  refill=max(1, int(settings.FLOWFORGE_DISPATCH_AHEAD) // 4))
    statements: list[str] = [queries["task_run_lock_orgs_of"]] if claim else []
    promote_at: int | None = None  # where task_run_promote_dependents' rows are in the results
    if successes:
        params.update(
            ids=[r.task_run_id for r in successes],
            tokens=[r.fencing_token for r in successes],
            outputs=[r.output_json if r.output_json is not None else _json_text(r.output) for r in successes],
        )
    if to_start:
        params.update(
            start_ids=[r.task_run_id for r in to_start],
            start_tokens=[r.fencing_token for r in to_start],
            owners=[r.owner for r in to_start],
            start_outbox=[r.outbox_id for r in to_start],
            worker_lease=float(worker_lease_seconds),
            upstream_bytes=_upstream_bytes(),
        )
    if successes and to_start:  # both UPDATEs in one statement
        statements.append(queries["task_run_start_and_succeed_many"])
    elif successes:
        statements.append(queries["task_run_succeed_many"])
    else:
        statements.append(queries["task_run_start_many"])
    if any(r.has_dependents for r in successes):
        promote_at = len(statements)
        statements.append(queries["task_run_promote_dependents"])
    if claim:
        statements.append(queries["task_run_claim_fair"])
    if successes:
        statements.append(queries["run_finish_if_done_many"])

    out = in_own_transaction(lambda: run_prepared(statements, params), connection_attempts)
    claimed = list((out[-2] if successes else out[-1]) if claim else [])
    finished = list(out[-1] if successes else [])
    if promote_at is not None and out[promote_at][0][0]:
        # A success's task has a dependent with a rule other than all_success.
        more_claimed, more_finished = _settle_after_successes(
            [r.task_run_id for r in successes], params, claim=claim, connection_attempts=connection_attempts)
        claimed += more_claimed
        finished += more_finished
    finished = _finish_with_failures(finished, connection_attempts)
    first_rows = out[1] if claim else out[0]
    if successes and to_start:
        done = [(r[1], r[9], r[2], r[4]) for r in first_rows if r[0] == "d"]
        start_rows = [r[1:] for r in first_rows if r[0] == "s"]
    else:
        done = first_rows if successes else []
        start_rows = first_rows if not successes else []

    started = {
        (r[0], r[8]): StartedAttempt(
            task_run_id=r[0],
            workflow_run_id=r[1],
            organization_id=r[2],
            task_key=r[3],
            task_type=r[4],
            config=_json(r[5]) or {},
            attempt=r[6],
            max_attempts=r[7],
            fencing_token=r[8],
            timeout_seconds=r[9],
            run_input=_json(r[10]) or {},
            upstream=_json(r[11]) or {},
            dispatch_latency_seconds=float(r[12]) if r[12] is not None else None,
            has_dependents=r[13],
            condition=r[14] or "",
            schedule=RunSchedule(r[15], r[16], r[17]) if r[15] is not None else None,
        )
        for r in start_rows
    }
    start_results: list[StartedAttempt | None] = []
    for i, req in enumerate(starts):
        attempt = started.get((req.task_run_id, req.fencing_token)) if first[req.task_run_id] == i else None
        if attempt is None:
            in_own_transaction(
                lambda r=req: events.append_ignored_start(task_run_id=r.task_run_id, fencing_token=r.fencing_token),
                connection_attempts,
            )
        start_results.append(attempt)

    succeeded = {(row[0], row[1]): row for row in done}
    run_states = {r[0]: (r[1], bool(r[2])) for r in finished}  # run id -> (state, limited)
    results: list[CompletionResult] = []
    for req in successes:
        row = succeeded.pop((req.task_run_id, req.fencing_token), None)
        if row is None:
            in_own_transaction(
                lambda r=req: events.append_stale_completion(
                    task_run_id=r.task_run_id, fencing_token=r.fencing_token, succeeded=True
                ),
                connection_attempts,
            )
            results.append(CompletionResult(accepted=False))
            continue
        run_state, run_limited = run_states.pop(row[2], (None, False))
        results.append(CompletionResult(accepted=True, state=row[3], run_state=run_state, run_limited=run_limited))
    return start_results, results, tuple(_dispatches(claimed))


def _settle_after_successes(succeeded: list[uuid.UUID], params: dict[str, Any], *, claim: bool,
                            connection_attempts: int) -> tuple[list[tuple], list[tuple]]:
    """A batch's successes have dependents with rules other than all_success (which the
    batch's ``task_run_promote_dependents`` leaves alone): those are decided now
    (``settle_dependents`` of the successes: ready, or skipped and what depends on them
    settled in turn), in a transaction of its own right after the batch's (the batch goes
    to the server as one message and is committed by then; the default rule's hops keep
    their statements), with the claim locks first, then the claim of what that made ready
    and the finish of any run it closed. Returns (claim rows, finish rows) as the batch's.
    Should the process die between the two commits, the sweeper settles the run
    (``settle_run``)."""

    def follow_up() -> tuple[list[tuple], list[tuple]]:
        with transaction.atomic(savepoint=False):
            if claim:
                fetch(queries["task_run_lock_orgs_of"], params)
            settle_dependents(task_run_ids=succeeded)
            follow = ([queries["task_run_claim_fair"]] if claim else []) + [queries["run_finish_if_done_many"]]
            more = run_prepared(follow, params)
        return (list(more[0]) if claim else []), list(more[-1])

    if transaction.get_connection().in_atomic_block:
        return follow_up()
    return atomic_retry(follow_up, connection_attempts=connection_attempts)


def _finish_with_failures(finished: list[tuple], connection_attempts: int) -> list[tuple]:
    """The batch's finish rows (id, state, limited), with each run that
    ``run_finish_if_done_many`` left to ``run_finish_if_done`` (done, with a failed task
    run: state NULL) finished by it now, in a transaction of its own (a failure handler's
    success; rare on the hot path): its row then says failed or succeeded, or is dropped
    when another transaction finished the run first."""
    if all(row[1] is not None for row in finished):
        return finished
    out = [row for row in finished if row[1] is not None]
    for row in finished:
        if row[1] is None:
            done = (runs.finish(workflow_run_id=row[0]) if transaction.get_connection().in_atomic_block
                    else atomic_retry(lambda rid=row[0]: runs.finish(workflow_run_id=rid),
                                      connection_attempts=connection_attempts))
            if done is not None:
                out.append((row[0], done.state, done.limited))
    return out


def heartbeat_many(*, leases: Iterable[tuple[uuid.UUID, int]], lease_seconds: float) -> set[uuid.UUID]:
    """Extend the leases of running attempts, one statement for all of them
    (``task_run_heartbeat_many``).

    ``leases`` is (task_run_id, fencing_token) pairs. A lease is never extended past
    the attempt's ``started_at + timeout_seconds``, so a hung handler times out.
    Returns the ids whose lease was extended; the others were reaped, cancelled or
    moved to a newer generation, and their worker no longer owns them.
    May be called outside a transaction (autocommit).
    """
    return set(extend_leases(leases=leases, lease_seconds=lease_seconds))


def extend_leases(*, leases: Iterable[tuple[uuid.UUID, int]], lease_seconds: float) -> dict[uuid.UUID, float]:
    """``heartbeat_many``, answering {task_run_id: seconds the extended lease now runs}
    (less than ``lease_seconds`` when the attempt's timeout comes first); an id left out
    was not extended."""
    pairs = list(leases)
    if not pairs:
        return {}
    rows = fetch(
        queries["task_run_heartbeat_many"],
        {"ids": [p[0] for p in pairs], "tokens": [p[1] for p in pairs], "lease": float(lease_seconds)},
    )
    return {r[0]: max(0.0, float(r[1])) for r in rows}


# --- Failures, and what follows them ----------------------------------------------------------


def fail_attempt(*, task_run_id: uuid.UUID, fencing_token: int, error: str, retryable: bool = True,
                 traceback: str = "") -> CompletionResult:
    """Record that the started generation ``fencing_token`` of a task run failed with
    ``error`` (``task_run_fail_attempt``), then advance its run. ``traceback`` (redacted
    and cut by the caller; '' for none) is kept beside the error in the attempt's event
    (``detail.traceback``), cut to MAX_TRACEBACK_CHARS whatever the caller sent.

    Retried (back to ``ready``, attempt + 1, exponential backoff up to
    MAX_RETRY_BACKOFF_SECONDS) while attempts remain and ``retryable``; otherwise
    ``failed``, its descendants skipped and the run's end derived. A stale worker's
    failure matches nothing, is recorded as ``stale_completion_rejected`` and returns
    ``accepted=False``. Runs in its own transaction, or in the caller's.
    """
    with transaction.atomic(savepoint=False):
        rows = fetch(
            queries["task_run_fail_attempt"],
            {
                "id": task_run_id,
                "token": fencing_token,
                "error": strip_nul(error)[:_MAX_ERROR_CHARS],
                "retryable": retryable,
                "kind": "attempt_failed",
                "traceback": strip_nul(traceback)[:MAX_TRACEBACK_CHARS],
            },
        )
        if not rows:
            events.append_stale_completion(task_run_id=task_run_id, fencing_token=fencing_token, succeeded=False)
            return CompletionResult(accepted=False)
        return _advance_after_failure(rows[0])


def fail_undelivered(*, task_run_id: uuid.UUID, fencing_token: int, error: str) -> CompletionResult:
    """Fail a claimed generation whose dispatch was dead-lettered (the broker refused it
    MAX_PUBLISH_ATTEMPTS times; ``task_run_fail_undelivered``): the task run fails at once
    with ``error`` rather than waiting on a message that will never arrive, and the run
    advances (its dependents are skipped). Matches only that generation, still claimed
    and never started; returns ``accepted=False`` otherwise (it started after all, or
    moved on)."""
    rows = fetch(
        queries["task_run_fail_undelivered"],
        {"id": task_run_id, "token": fencing_token, "error": strip_nul(error)[:_MAX_ERROR_CHARS], "retryable": False,
         "kind": "dispatch_dead_lettered", "traceback": ""},
    )
    if not rows:
        return CompletionResult(accepted=False)
    return _advance_after_failure(rows[0])


def get_expired_leases(*, limit: int) -> list[tuple[uuid.UUID, int]]:
    """(task_run_id, fencing_token) of up to ``limit`` running rows whose lease has
    expired, oldest expiry first (``task_run_get_expired_leases``, ``idx_taskrun_lease_expiry``).
    Read-only; may run outside a transaction."""
    return [(r[0], r[1]) for r in fetch(queries["task_run_get_expired_leases"], {"limit": limit})]


def expire_lease(*, task_run_id: uuid.UUID, fencing_token: int) -> CompletionResult:
    """Take back one expired lease (the design brief's "Reap").

    A generation that never started (its message was lost or is still queued) goes
    back to ``ready`` without using an attempt (``task_run_requeue_never_started``). A
    generation that started and ran out of lease (worker died, or ``timeout_seconds``
    passed) fails this attempt (``task_run_fail_expired_lease``): back to ``ready`` with a
    backoff while attempts remain, else ``failed`` (and the run advances). Either way the
    fencing token is bumped, so the old generation's completion can never match. Returns
    ``accepted=False`` when the row was no longer expired (heartbeat, completion or
    another reaper won).
    """
    never_started = fetch(queries["task_run_requeue_never_started"], {"id": task_run_id, "token": fencing_token})
    if never_started:
        return CompletionResult(accepted=True, state="ready", retry_in_seconds=0.0)
    timed_out = fetch(queries["task_run_lease_reached_timeout"], {"id": task_run_id})
    if timed_out and timed_out[0][0]:
        error = "attempt timed out (timeout_seconds reached)"
        kind = "attempt_timed_out"
    else:
        error = "lease expired: the worker stopped heartbeating (crashed or lost its connection)"
        kind = "lease_expired"
    rows = fetch(
        queries["task_run_fail_expired_lease"],
        {"id": task_run_id, "token": fencing_token, "error": error, "retryable": True, "kind": kind, "traceback": ""},
    )
    if not rows:
        return CompletionResult(accepted=False)
    return _advance_after_failure(rows[0])


def _advance_after_failure(row: tuple) -> CompletionResult:
    """What follows a failed attempt (a fail statement's row: id, workflow_run_id,
    task_id, state, attempt, not_before): after a final failure the task's dependents go
    by their trigger rules (``settle_dependents``: skipped, or ready for a rule that
    reacts to it) and the run may finish; a retry reports its backoff."""
    task_run_id, run_id, _task_id, state, _attempt, not_before = row
    retry_in = None
    promoted = 0
    if state == "failed":
        promoted = settle_dependents(task_run_ids=[task_run_id])
    elif state == "ready" and not_before is not None:
        now = fetch(queries["database_now"], {})[0][0]
        retry_in = max(0.0, (not_before - now).total_seconds())
    finished = runs.finish(workflow_run_id=run_id) if state in TASK_TERMINAL_STATES else None
    return CompletionResult(accepted=True, state=state, run_state=finished.state if finished else None,
                            retry_in_seconds=retry_in, run_limited=bool(finished and finished.limited),
                            promoted=promoted)


def settle_dependents(*, task_run_ids: Sequence[uuid.UUID]) -> int:
    """Apply the trigger rules below ``task_run_ids``, task runs of one or more runs that
    have just finished (succeeded, failed, skipped or cancelled) other than through the
    worker's batch of successes, until nothing more changes: their pending descendants
    that can no longer run are skipped (``task_run_skip_descendants``, the closure through
    all_success and, below a failure, none_failed), then the pending dependents of all
    those are decided (``task_run_settle_dependents``: ready, skipped, or left pending),
    and what that skipped is settled in turn. Each transition writes its event.

    The one way to advance a run after such a finish; a statement that finishes a task run
    (or puts one back to pending, e.g. a retry of one task) calls it in the same
    transaction, after its run's event counter was bumped (module docstring). Returns how
    many task runs it made ready; they are not claimed here (the caller nudges the
    scheduler: a claim takes its organizations' locks before any row lock, and this
    transaction holds row locks already). Must be called inside a transaction."""
    promoted = 0
    changed = list(task_run_ids)
    while changed:
        skipped = [r[0] for r in fetch(queries["task_run_skip_descendants"], {"ids": changed})]
        decided = fetch(queries["task_run_settle_dependents"], {"ids": changed + skipped})
        promoted += sum(1 for r in decided if r[1] == "ready")
        changed = [r[0] for r in decided if r[1] == "skipped"]
    return promoted


def settle_run(*, workflow_run_id: uuid.UUID) -> int:
    """``settle_dependents`` over every finished task run of run ``workflow_run_id``
    (``task_run_finished_of_run``): the repair of a run whose settle was lost (the sweeper's
    ``run_list_stalled``: pending task runs and nothing ready or running). Idempotent: a
    pending task whose rule is not decided stays pending. Returns how many task runs it made
    ready. Must be called inside a transaction."""
    ids = [r[0] for r in fetch(queries["task_run_finished_of_run"], {"run": workflow_run_id})]
    return settle_dependents(task_run_ids=ids) if ids else 0


def skip_for_condition(*, task_run_id: uuid.UUID, fencing_token: int) -> CompletionResult:
    """Record that generation ``fencing_token``'s condition was false (its worker
    evaluated it, engine.conditions, before the handler): the task run becomes skipped
    (skip_reason ``condition_false``, a 'skipped' event naming the condition;
    ``task_run_skip_condition_false``), its dependents are settled by their trigger rules
    (``settle_dependents``) and the run may finish. Matches only that generation, started
    and still running; returns ``accepted=False`` otherwise (reaped or cancelled meanwhile:
    whoever moved it recorded why). Runs in its own transaction, or in the caller's."""
    with transaction.atomic(savepoint=False):
        rows = fetch(queries["task_run_skip_condition_false"], {"id": task_run_id, "token": fencing_token})
        if not rows:
            return CompletionResult(accepted=False)
        _id, run_id, _task_id, state = rows[0]
        promoted = settle_dependents(task_run_ids=[task_run_id])
        finished = runs.finish(workflow_run_id=run_id)
        return CompletionResult(accepted=True, state=state, run_state=finished.state if finished else None,
                                run_limited=bool(finished and finished.limited), promoted=promoted)


# --- The organizations' own workers (issue 18) --------------------------------------------------

#: The dispatch-ahead a worker poll's claim is given: a generation it claims is started in the
#: same transaction, so the organization's broker backlog is no bound on it.
_WORKER_POLL_AHEAD = 1_000_000


def claim_for_worker(
    *, organization_id: uuid.UUID, queue: str, limit: int, owner: str, lease_seconds: float,
) -> list[StartedAttempt]:
    """Claim and start up to ``limit`` ready task runs of ``queue``, a queue of
    organization ``organization_id``'s own workers, for the worker ``owner`` (a poll,
    docs/workers.md), in one transaction.

    The organization's claim lock, then ``task_run_claim_fair`` on that queue alone (highest
    priority then oldest; within the organization's quota of running task runs, its
    concurrency permits, workflow limits and rate buckets; no outbox row: the poll hands the
    generations out itself), then ``task_run_start_many``: each claimed generation started by
    ``owner`` with a lease of ``lease_seconds`` (bounded by the task's timeout). Events:
    'claimed' and 'started' each. Returns the StartedAttempts, in claim order; [] when
    nothing could be claimed. Raises what the database raises (a deadlock is retried by the
    caller, ``engine.db.atomic_retry``). Must be called outside a transaction or inside
    the caller's.
    """
    params = claim_params(limit=limit, lease_seconds=lease_seconds, owner=owner)
    params.update(orgs=[organization_id], org_of=[], only_ids=None, claim_queue=queue, ahead=_WORKER_POLL_AHEAD,
                  first=0)
    with transaction.atomic():
        claimed = _dispatches(run_prepared([queries["task_run_lock_orgs"], queries["task_run_claim_fair"]],
                                           params)[1])
        if not claimed:
            return []
        started, _results, _dispatched = start_and_complete_many(
            starts=[StartRequest(d.task_run_id, d.fencing_token, owner) for d in claimed], successes=[],
            worker_lease_seconds=lease_seconds, dispatch_lease_seconds=lease_seconds, owner=owner, claim=False,
        )
    # A generation this transaction claimed cannot have been started by anyone else.
    return [s for s in started if s is not None]
