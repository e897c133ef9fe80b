"""The lease reaper: take back running task runs whose lease expired."""

from __future__ import annotations

import logging

from django.db import connection

from engine import metrics, sql
from engine.db import atomic_retry
from engine.dispatch import nudge_scheduler
from engine.relay import publish_dispatches
from engine.repositories import task_runs
from engine.states import TaskRunState

log = logging.getLogger(__name__)


def _nudge() -> None:
    try:
        nudge_scheduler()
    except Exception:  # noqa: BLE001 - the clock's tick claims them anyway
        log.warning("could not nudge the scheduler; the clock's next tick claims")


def reap_once(*, limit: int = 500) -> int:
    """Expire every lease that ran out (``idx_taskrun_lease_expiry``), each in its own
    transaction so one run's advance never waits for another's. Returns how many
    leases were taken back."""
    reaped = 0
    for task_run_id, token in task_runs.get_expired_leases(limit=limit):
        try:
            result = atomic_retry(
                lambda tr=task_run_id, tok=token: task_runs.expire_lease(
                    task_run_id=tr, fencing_token=tok)
            )
        except Exception:
            # One row that cannot be reaped must not keep every lease after it from expiring.
            log.exception("reaping the lease of task run %s generation %s failed; the next pass retries it",
                          task_run_id, token)
            metrics.incr("flowforge_lease_reaps_total", "error")
            continue
        if result.accepted:
            reaped += 1
            metrics.incr("flowforge_lease_reaps_total",
                         {TaskRunState.READY: "requeued", TaskRunState.FAILED: "failed"}.get(result.state or "", "other"))
            if result.run_state is not None:
                metrics.incr("flowforge_runs_finished_total", result.run_state)
            log.info("reaped lease of task run %s generation %s -> %s", task_run_id, token, result.state)
            publish_dispatches(result.dispatches)
            if result.promoted:
                # The failure made dependents ready (a failure handler, a cleanup): claim them now.
                _nudge()
    fail_dead_letters()
    return reaped


def fail_dead_letters(*, limit: int = 200) -> int:
    """Fail the claimed, never-started generations whose outbox row was dead-lettered
    (seed 001's outbox: kept and replayable, but the task must not wait forever on a
    message the broker never took). Partial index ``idx_outbox_dead_letter`` keeps the
    scan to dead-lettered rows. Returns how many task runs were failed."""
    with connection.cursor() as cur:
        cur.execute(sql.queries["outbox_list_dead_lettered_undelivered"], {"limit": limit})
        rows = cur.fetchall()
    failed = 0
    for task_run_id, token, attempts, last_error in rows:
        error = f"dispatch dead-lettered: the broker refused it {attempts} times (last error: {last_error})"
        result = atomic_retry(
            lambda tr=task_run_id, tok=token, err=error: task_runs.fail_undelivered(
                task_run_id=tr, fencing_token=tok, error=err,
            )
        )
        if result.accepted:
            failed += 1
            if result.run_state is not None:
                metrics.incr("flowforge_runs_finished_total", result.run_state)
            if result.promoted:
                _nudge()
            log.warning("task run %s generation %s failed: %s", task_run_id, token, error)
    return failed
