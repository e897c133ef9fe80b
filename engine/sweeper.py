"""The stuck-run sweep: nothing waits forever.

Three queries over ``idx_wfrun_state_age`` (state = 'running' AND created_at < ...),
the seed's stuck-run sweep:

- a run still ``running`` whose task runs are all terminal (its last completion died
  between its commit and the run's own update — which the transition design makes
  rare, not impossible) is closed with the state derived from its task runs;
- a run still ``running`` with pending task runs and none ready or running (a settle of
  dependents by their trigger rules was lost: ``task_runs.settle_dependents`` ran in a
  transaction of its own after a success's, and the process died between the two) has its
  dependents settled (``task_runs.settle_run``);
- a run older than its workflow's ``run_timeout_seconds`` is stopped: its open task
  runs are cancelled (a running worker sees it on its next heartbeat) and the run
  ends ``failed`` with an error that says it timed out.
"""

from __future__ import annotations

import logging

from django.db import connection

from engine import metrics, sql
from engine.db import atomic_retry
from engine.dispatch import nudge_scheduler
from engine.repositories import recovery, runs, task_runs
from engine.states import RunState

log = logging.getLogger(__name__)

# A running run younger than this is not checked for "all tasks terminal" (its own
# completion is most likely still committing).
SETTLE_SECONDS = 30


def _ids(name: str, params: dict) -> list:
    with connection.cursor() as cur:
        cur.execute(sql.queries[name], params)
        return [r[0] for r in cur.fetchall()]


def sweep_runs(*, limit: int = 200) -> dict[str, int]:
    """Close finished-but-open runs, settle stalled ones and fail timed-out ones. Returns how
    many of each."""
    finished = 0
    for run_id in _ids("run_list_settled_open", {"settle": SETTLE_SECONDS, "limit": limit}):
        state = atomic_retry(lambda rid=run_id: _finish_locked(rid))
        if state:
            finished += 1
            metrics.incr("flowforge_runs_finished_total", state)
            log.warning("sweep closed run %s (%s): every task run had finished", run_id, state)
    settled = 0
    for run_id in _ids("run_list_stalled", {"settle": SETTLE_SECONDS, "limit": limit}):
        promoted, state = atomic_retry(lambda rid=run_id: _settle(rid))
        if promoted or state:
            settled += 1
            log.warning("sweep settled stalled run %s: %s task run(s) made ready%s", run_id, promoted,
                        f", run {state}" if state else "")
            if state:
                metrics.incr("flowforge_runs_finished_total", state)
            if promoted:
                nudge_scheduler()
    timed_out = 0
    for run_id, timeout in _rows("run_list_timed_out", {"limit": limit}):
        reason = f"run timed out: still running after its workflow's timeout of {timeout:g} s"
        if atomic_retry(lambda rid=run_id, why=reason: runs.cancel(
                workflow_run_id=rid, reason=why, final_state=RunState.FAILED.value)):
            timed_out += 1
            metrics.incr("flowforge_runs_finished_total", RunState.FAILED.value)
            log.warning("sweep failed run %s: %s", run_id, reason)
    return {"finished": finished, "settled": settled, "timed_out": timed_out}


def _settle(run_id) -> tuple[int, str | None]:
    """A stalled run's dependents settled by their trigger rules (``task_runs.settle_run``),
    then its end derived: (task runs made ready, the run's new state or None)."""
    promoted = task_runs.settle_run(workflow_run_id=run_id)
    return promoted, runs.finish_if_done(workflow_run_id=run_id)


def _finish_locked(run_id) -> str | None:
    """``runs.finish_if_done`` under the run's row lock (``recovery.lock_run``), in the caller's
    transaction: its look at the task runs is then taken after any person's action on the
    run committed (engine.recovery reopens finished task runs under that lock), so a run
    reopened meanwhile is not closed on what it looked like before."""
    recovery.lock_run(workflow_run_id=run_id)
    return runs.finish_if_done(workflow_run_id=run_id)


def _rows(name: str, params: dict) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql.queries[name], params)
        return cur.fetchall()
