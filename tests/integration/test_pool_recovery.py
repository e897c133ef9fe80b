"""Issue 22: the whole worker pool SIGKILLed under load and restarted (as a supervisor
would) recovers in seconds, not after the dispatch lease.

The dispatch lease is 300 s here (the deployment's default), so a generation whose
message died in a killed process's prefetch would wait that long (or upstream Dramatiq's
60 s and a random maintenance) without flowforge.broker_recovery. Worker lease 3 s,
heartbeats 0.5 s, broker beats 0.5 s and dead after 3 s (conftest.py). The bigger
version, 150 runs and three kills through the API, is ``make faults`` (kill_pool).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection

from engine.models import WorkflowRun
from engine.services import start_run
from flowforge.stack import wait_until, worker_child_pids
from tests.integration.conftest import LEASE_SECONDS
from tests.integration.helpers import wait_worker_children

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASKS = [
    {"key": "a", "type": "sleep", "config": {"seconds": 0.2}, "max_attempts": 5, "retry_backoff_seconds": 0.2},
    {"key": "b", "type": "sleep", "config": {"seconds": 0.2}, "depends_on": ["a"], "max_attempts": 5,
     "retry_backoff_seconds": 0.2},
    {"key": "c", "type": "noop", "depends_on": ["a"], "max_attempts": 5},
    {"key": "d", "type": "noop", "depends_on": ["b", "c"], "max_attempts": 5},
]


def _kill_pool(workers) -> None:
    """SIGKILL every process of the pool: each dramatiq master with its worker processes
    (their process group: Stack starts each command in a session of its own)."""
    for proc in workers:
        os.killpg(proc.pid, signal.SIGKILL)
    for proc in workers:
        proc.popen.wait(10)


def test_a_killed_and_restarted_pool_finishes_every_run_within_two_leases_of_its_restart(
    stack, org, make_workflow
):
    stack.env["FLOWFORGE_DISPATCH_LEASE_SECONDS"] = "300"
    lease = float(LEASE_SECONDS)
    wf = make_workflow(org, TASKS, name="pool-load")
    workers = [stack.start_worker(f"worker-{i}", processes=1, threads=4) for i in (1, 2)]
    wait_worker_children(workers)
    stack.start_clock()
    runs = [start_run(workflow=wf) for _ in range(40)]
    ids = [r.pk for r in runs]

    def finished() -> int:
        return WorkflowRun.objects.for_organization(org).filter(pk__in=ids, finished_at__isnull=False).count()

    wait_until(lambda: finished() >= 8 or None, timeout=60, interval=0.05, what="a fifth of the runs")
    _kill_pool(workers)
    killed_at = time.time()
    open_at_kill = len(ids) - finished()
    stack.procs[:] = [p for p in stack.procs if p not in workers]
    workers = [stack.start_worker(f"worker-{i}b", processes=1, threads=4) for i in (1, 2)]

    wait_until(lambda: finished() == len(ids) or None, timeout=120, interval=0.1, what="every run to finish")
    with connection.cursor() as cur:
        cur.execute("SELECT min(EXTRACT(EPOCH FROM created_at))::float8 FROM core_taskrunevent "
                    "WHERE workflow_run_id = ANY(%s) AND kind = 'started' AND created_at > to_timestamp(%s)",
                    [ids, killed_at])
        restarted_at = cur.fetchone()[0]  # the restarted pool's first start
        cur.execute("SELECT EXTRACT(EPOCH FROM finished_at)::float8 - %s FROM core_workflowrun "
                    "WHERE id = ANY(%s) AND finished_at > to_timestamp(%s) ORDER BY 1", [killed_at, ids, killed_at])
        after_kill = [row[0] for row in cur.fetchall()]
        cur.execute("SELECT count(*) FROM (SELECT task_run_id, fencing_token FROM core_taskrunevent "
                    "WHERE workflow_run_id = ANY(%s) AND kind = 'started' "
                    "GROUP BY 1, 2 HAVING count(*) > 1) d", [ids])
        started_twice = cur.fetchone()[0]
    states = set(WorkflowRun.objects.for_organization(org).filter(pk__in=ids).values_list("state", flat=True))
    restart = restarted_at - killed_at
    bound = 2 * lease + restart
    print(f"\npool recovery: {open_at_kill} of {len(ids)} runs open at the kill; restart {restart:.1f} s; "
          f"runs finished after the kill at +{after_kill[0]:.1f} .. +{after_kill[-1]:.1f} s "
          f"(median +{after_kill[len(after_kill) // 2]:.1f}); bound {bound:.1f} s")
    assert states == {"succeeded"}
    assert started_twice == 0
    assert open_at_kill > 0 and after_kill
    assert after_kill[-1] <= bound, (after_kill, restart)
    # Nothing was left to the 300 s dispatch lease.
    assert all(worker_child_pids(w.pid) for w in workers)
