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

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.django_db(transaction=True)]

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
        cur.execute("SELECT count(*), max((detail->>'waited_seconds')::float8) FROM core_taskrunevent "
                    "WHERE workflow_run_id = ANY(%s) AND kind = 'redelivered'", [ids])
        redelivered, longest_wait = cur.fetchone()
    states = set(WorkflowRun.objects.for_organization(org).filter(pk__in=ids).values_list("state", flat=True))
    restart = restarted_at - killed_at
    bound = 2 * lease + restart
    print(f"\npool recovery: {open_at_kill} of {len(ids)} runs open at the kill; restart {restart:.1f} s; "
          f"runs finished after the kill at +{after_kill[0]:.1f} .. +{after_kill[-1]:.1f} s "
          f"(median +{after_kill[len(after_kill) // 2]:.1f}); bound {bound:.1f} s; {redelivered} generation(s) "
          f"redelivered from the dead processes' prefetch (longest wait since claim {longest_wait} s)")
    assert states == {"succeeded"}
    assert started_twice == 0
    assert open_at_kill > 0 and after_kill
    assert after_kill[-1] <= bound, (after_kill, restart)
    # Nothing was left to the 300 s dispatch lease.
    assert all(worker_child_pids(w.pid) for w in workers)


def test_a_worker_killed_between_a_last_success_and_its_runs_end_leaves_no_open_run(stack, org, make_workflow):
    """The last success and the run's end are one transaction (engine.repositories.driver
    .run_prepared: BEGIN ... COMMIT in one message). Here the worker process is SIGKILLed
    while its transaction sits between the two (a trigger holds the run's update), and the
    transaction is ended with it (its backend terminated): neither is kept, the attempt's
    lease expires, the retry records both. Nothing ever shows the task succeeded and the
    run still running."""
    wf = make_workflow(org, [{"key": "only", "type": "noop", "max_attempts": 3, "retry_backoff_seconds": 0.1}],
                       name="last-success")
    with connection.cursor() as cur:
        # A sequence is not transactional: only the first run update ever sleeps.
        cur.execute("""
            CREATE SEQUENCE ff_test_hold_once;
            CREATE FUNCTION ff_test_hold_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF nextval('ff_test_hold_once') = 1 THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$;
            CREATE TRIGGER ff_test_hold_run_end BEFORE UPDATE ON core_workflowrun FOR EACH ROW
            WHEN (OLD.state = 'running' AND NEW.state = 'succeeded') EXECUTE FUNCTION ff_test_hold_run_end();""")
    try:
        worker = stack.start_worker("worker", processes=1, threads=1)
        wait_worker_children([worker])
        stack.start_clock()
        run = start_run(workflow=wf)

        def held_backend():
            with connection.cursor() as cur:
                # This database's only: another suite's backend may sleep on the same server.
                cur.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND pid <> pg_backend_pid() "
                            "AND datname = current_database()")
                row = cur.fetchone()
            return row[0] if row else None

        backend = wait_until(held_backend, timeout=30, interval=0.05, what="the run's update to be held")
        with connection.cursor() as cur:  # inside the held transaction: both writes uncommitted
            cur.execute("SELECT state FROM core_taskrun WHERE workflow_run_id = %s", [run.pk])
            assert cur.fetchone()[0] == "running"
        os.killpg(worker.pid, signal.SIGKILL)
        worker.popen.wait(10)
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [backend])
        stack.procs.remove(worker)
        stack.start_worker("worker-b", processes=1, threads=1)

        def observed():
            with connection.cursor() as cur:
                cur.execute("SELECT r.state, t.state FROM core_workflowrun r JOIN core_taskrun t "
                            "ON t.workflow_run_id = r.id WHERE r.id = %s", [run.pk])
                states = cur.fetchone()
            assert states != ("running", "succeeded"), "the task succeeded while its run stayed open"
            return states if states[0] != "running" else None

        assert wait_until(observed, timeout=60, interval=0.02, what="the run to end") == ("succeeded", "succeeded")
        with connection.cursor() as cur:
            cur.execute("SELECT kind, attempt FROM core_taskrunevent WHERE workflow_run_id = %s "
                        "AND kind IN ('started', 'succeeded', 'lease_expired', 'run_finished') ORDER BY seq",
                        [run.pk])
            kinds = cur.fetchall()
        assert kinds == [("started", 1), ("lease_expired", 1), ("started", 2), ("succeeded", 2),
                         ("run_finished", None)], kinds
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS ff_test_hold_run_end ON core_workflowrun; "
                        "DROP FUNCTION IF EXISTS ff_test_hold_run_end(); DROP SEQUENCE IF EXISTS ff_test_hold_once;")
