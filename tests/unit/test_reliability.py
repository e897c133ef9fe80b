"""Timeouts, the stuck-run sweep, and cancellation racing completion."""

from __future__ import annotations

import datetime as dt
import re
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from engine.models import TaskRun, TaskRunEvent, WorkflowRun
from engine.repositories import driver, runs, task_runs
from engine.repositories import types as repo_types
from engine.services import start_run
from engine.sql import queries
from engine.states import TASK_QUEUE
from engine.sweeper import sweep_runs
from tenancy.models import Organization
from tests import engine_helpers

LEASE = 30.0


def claim_and_start(run, key: str = "a"):
    with transaction.atomic():
        (d,) = task_runs.claim_ready_many(limit=1, lease_seconds=LEASE, owner="test",
                                       task_run_ids=[TaskRun.objects.for_organization(run.organization_id)
                                                     .get(workflow_run=run, task__key=key).pk])
    with transaction.atomic():
        started = engine_helpers.start_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token,
                                            owner="worker", lease_seconds=LEASE)
    assert started is not None
    return d


@pytest.mark.django_db
def test_the_sweep_closes_a_running_run_whose_task_runs_all_finished(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf)
    d = claim_and_start(run)
    with transaction.atomic():
        engine_helpers.complete_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token, succeeded=True,
                                     output=None, lease_seconds=LEASE, owner="test")
    # As if the run's own update had been lost: every task done, the run still open.
    old = timezone.now() - dt.timedelta(minutes=5)
    WorkflowRun.objects.for_organization(org).filter(pk=run.pk).update(state="running", finished_at=None, created_at=old)
    assert sweep_runs() == {"finished": 1, "settled": 0, "timed_out": 0}
    run.refresh_from_db()
    assert run.state == "succeeded" and run.finished_at is not None
    assert sweep_runs() == {"finished": 0, "settled": 0, "timed_out": 0}


@pytest.mark.django_db
def test_a_run_past_its_workflow_timeout_is_failed_and_its_tasks_cancelled(org):
    from engine.services import apply_definition

    wf = apply_definition(organization=org, document={
        "name": "slow", "timeout_seconds": 60,
        "tasks": [{"key": "a", "type": "sleep", "config": {"seconds": 600}},
                  {"key": "b", "type": "noop", "depends_on": ["a"]}]})
    assert wf.run_timeout_seconds == 60
    run = start_run(workflow=wf)
    d = claim_and_start(run)
    young = start_run(workflow=wf)
    WorkflowRun.objects.for_organization(org).filter(pk=run.pk).update(
        # Both: a run's timeout counts from its start (a run queued behind its workflow's
        # run limit starts later than it was created).
        created_at=timezone.now() - dt.timedelta(seconds=61), started_at=timezone.now() - dt.timedelta(seconds=61))
    assert sweep_runs()["timed_out"] == 1
    run.refresh_from_db()
    assert run.state == "failed"
    assert run.error == "run timed out: still running after its workflow's timeout of 60 s"
    states = dict(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("task__key", "state"))
    assert states == {"a": "cancelled", "b": "cancelled"}
    # The worker still running "a" finds its lease gone and its completion is refused.
    with transaction.atomic():
        assert task_runs.heartbeat_many(leases=[(d.task_run_id, d.fencing_token)], lease_seconds=LEASE) == set()
    young.refresh_from_db()
    assert young.state == "running"


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_completion_ends_in_exactly_one_terminal_state_100_times(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}], name="race")
    outcomes = {"succeeded": 0, "cancelled": 0}
    for _ in range(100):
        run = start_run(workflow=wf)
        d = claim_and_start(run)
        barrier = threading.Barrier(2)
        results: dict[str, object] = {}
        errors: list[BaseException] = []

        def complete(barrier=barrier, results=results, errors=errors, d=d):
            try:
                barrier.wait(5)
                with transaction.atomic():
                    results["complete"] = engine_helpers.complete_attempt(
                        task_run_id=d.task_run_id, fencing_token=d.fencing_token, succeeded=True, output={"ok": 1},
                        lease_seconds=LEASE, owner="test")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        def cancel(barrier=barrier, results=results, errors=errors, run=run):
            try:
                barrier.wait(5)
                from engine.db import atomic_retry

                results["cancel"] = atomic_retry(
                    lambda: runs.cancel(workflow_run_id=run.pk, reason="race"))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=complete), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        run.refresh_from_db()
        task = TaskRun.objects.for_organization(org).get(workflow_run=run)
        kinds = list(TaskRunEvent.objects.for_organization(org).filter(task_run=task)
                     .values_list("kind", flat=True).order_by("seq"))
        terminal = [k for k in kinds if k in ("succeeded", "cancelled")]
        assert len(terminal) == 1, kinds  # exactly one terminal transition, recorded
        if run.state == "succeeded":
            assert task.state == "succeeded" and results["cancel"] is False
            assert results["complete"].accepted
        else:
            assert run.state == "cancelled" and task.state == "cancelled" and results["cancel"] is True
            assert not results["complete"].accepted and "stale_completion_rejected" in kinds
        outcomes[run.state] += 1
    assert sum(outcomes.values()) == 100
    print(f"cancel vs completion, 100 races: {outcomes}")


@pytest.mark.django_db
def test_a_workflow_timeout_must_be_positive(org):
    from engine.definitions import DefinitionError
    from engine.services import apply_definition

    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document={"name": "x", "timeout_seconds": 0,
                                                     "tasks": [{"key": "a", "type": "noop"}]})
    assert excinfo.value.errors == [{"path": "timeout_seconds", "message": "must be at least 0.001, got 0"}]


@pytest.mark.django_db
def test_a_stale_prepared_plan_is_retried_on_a_fresh_connection(monkeypatch):
    """After a migration changes a table, a prepared statement fails with SQLSTATE 0A000;
    the retry helper reconnects and runs the work again."""
    from django.db import NotSupportedError

    from engine import db

    class Stale(Exception):
        sqlstate = "0A000"

    calls, resets = [], []
    monkeypatch.setattr(db, "_reset_connection", lambda: resets.append(1))

    def work():
        calls.append(1)
        if len(calls) == 1:
            raise NotSupportedError("cached plan must not change result type") from Stale()
        return "done"

    assert db.retry_transient(work, atomic=False) == "done"
    assert (len(calls), len(resets)) == (2, 1)


@pytest.mark.django_db(transaction=True)
def test_hot_path_statements_are_prepared_once_and_planned_once_per_connection(org, make_workflow):
    """The transitions run as server-side prepared statements with a generic plan: a
    second call on the connection neither parses nor plans again (without
    ``prepare_threshold`` psycopg silently disabled preparing, and every call re-planned)."""
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    start_run(workflow=wf)
    start_run(workflow=wf)
    for _ in range(2):
        claimed = task_runs.claim_ready_many(limit=1, lease_seconds=60, owner="test")
        assert len(claimed) == 1
    with connection.cursor() as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s",
                    [driver.prepared_form(queries["task_run_claim_fair"])[0]])
        rows = cur.fetchall()
    assert rows == [(2, 0)]


HOT_STATEMENTS = ("task_run_claim_fair", "task_run_lock_orgs_of", "task_run_start_many", "task_run_succeed_many",
                  "task_run_start_and_succeed_many", "task_run_promote_dependents", "run_finish_if_done_many")


def test_hot_statements_are_prepared_from_their_compacted_text_with_numbered_parameters():
    """``driver.prepared_form``: the text PREPARE gets (comments and runs of whitespace out, each
    ``%(name)s`` made ``$n`` in order of first use) and a distinct name per statement."""
    forms = {}
    for attr in HOT_STATEMENTS:
        sql = queries[attr]
        name, text, order = driver.prepared_form(sql)
        assert "--" not in text and "\n" not in text and "%(" not in text, attr
        assert text.split() == re.sub(r"%\((\w+)\)s", lambda m, order=order: f"${order.index(m.group(1)) + 1}",
                                      " ".join(line.split("--")[0] for line in sql.splitlines())).split(), attr
        assert sorted(set(re.findall(r"\$(\d+)", text)), key=int) == [str(i + 1) for i in range(len(order))]
        forms[name] = attr
    assert len(forms) == len(HOT_STATEMENTS)
    assert driver.compact("SELECT 1 -- one\n  , 2\n\t FROM t") == "SELECT 1 , 2 FROM t"
    assert driver.prepared_form("SELECT %(b)s, %(a)s, %(b)s")[1:] == ("SELECT $1, $2, $1", ("b", "a"))


@pytest.mark.django_db(transaction=True)
def test_a_failed_hot_transaction_is_rolled_back_and_the_connection_stays_usable(org, make_workflow):
    """A statement failing mid-transaction (here a parameter the server rejects) rolls
    back the whole transaction, raises, and leaves the connection idle: the next call
    prepares nothing twice and works."""
    from django.db import DataError

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf)
    connection.close()
    with pytest.raises(DataError):
        task_runs.claim_ready_many(limit=-1, lease_seconds=60, owner="test")  # LIMIT must not be negative
    assert connection.connection.info.transaction_status == 0  # idle, not in a failed transaction
    (claimed,) = task_runs.claim_ready_many(limit=5, lease_seconds=60, owner="test")
    assert claimed.workflow_run_id == run.pk
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM core_taskrunevent WHERE workflow_run_id = %s AND kind = 'claimed'",
                    [run.pk])
        assert cur.fetchone()[0] == 1


def _generic_plan(sql: str, params: dict, types: dict) -> str:
    """EXPLAIN (ANALYZE) of ``sql`` as the hot path runs it: a prepared statement's generic
    plan, made under ``driver.INDEX_PROBES_ONLY``, inside a transaction rolled back."""
    import re

    names: list[str] = []

    def placeholder(match):
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, sql)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(driver.INDEX_PROBES_ONLY)
            cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cur.execute(f"PREPARE ff_plan_probe({', '.join(types[n] for n in names)}) AS {text}")
            cur.execute(f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE ff_plan_probe({', '.join(['%s'] * len(names))})",
                        [params[n] for n in names])
            plan = "\n".join(r[0] for r in cur.fetchall())
            cur.execute("DEALLOCATE ff_plan_probe")
        transaction.set_rollback(True)
    return plan


@pytest.mark.django_db(transaction=True)
def test_hot_statements_find_task_runs_by_primary_key_even_with_statistics_from_an_empty_table(org, make_workflow):
    """Statistics taken while the table was nearly empty say almost nothing is running or
    succeeded; a plan trusting them scanned every running (or succeeded) task run of the
    table per start and completion batch. The hot statements must reach their rows by
    primary key and probe a run's open task runs per run, whatever the statistics say."""
    # Room for all 1,501 claims at once (the free plan's would stop them at 64).
    Organization.objects.filter(pk=org.pk).update(weight_override=100, max_running_task_runs_override=10_000)
    small = make_workflow(org, [{"key": "a", "type": "noop"}], name="small")
    start_run(workflow=small)
    with connection.cursor() as cur:
        cur.execute("ANALYZE core_taskrun")
    wide = make_workflow(org, [{"key": f"t{i:04d}", "type": "noop"} for i in range(1500)], name="wide")
    start_run(workflow=wide)
    claimed = task_runs.claim_ready_many(limit=2000, lease_seconds=60, owner="test")
    assert len(claimed) == 1501
    batch = claimed[:8]
    ids, tokens = [d.task_run_id for d in batch], [d.fencing_token for d in batch]
    engine_helpers.start_attempts([repo_types.StartRequest(i, t, "w") for i, t in zip(ids, tokens, strict=True)],
                               lease_seconds=60)
    with connection.cursor() as cur:
        cur.execute("UPDATE core_taskrun SET state = 'succeeded', lease_owner = NULL, lease_expires_at = NULL,"
                    " finished_at = clock_timestamp() WHERE id = ANY(%s)", [ids])
    params = {"ids": ids, "tokens": tokens, "outputs": ["null"] * 8, "lease": 60.0,
              "start_ids": ids, "start_tokens": tokens, "owners": ["w"] * 8, "worker_lease": 60.0,
              "start_outbox": [None] * 8, "owner": "test", "queue": TASK_QUEUE, "reserve": 0.0,
              "upstream_bytes": 1024 * 1024}
    types = {"ids": "uuid[]", "tokens": "bigint[]", "outputs": "text[]", "lease": "float8",
             "start_ids": "uuid[]", "start_tokens": "bigint[]", "owners": "text[]", "worker_lease": "float8",
             "start_outbox": "uuid[]", "owner": "text", "queue": "text", "reserve": "float8",
             "upstream_bytes": "bigint"}
    for name, sql in (("start", queries["task_run_start_many"]), ("succeed", queries["task_run_succeed_many"]),
                      ("start and succeed", queries["task_run_start_and_succeed_many"]),
                      ("promote", queries["task_run_promote_dependents"]),
                      ("finish", queries["run_finish_if_done_many"])):
        plan = _generic_plan(sql, params, types)
        assert "Seq Scan on core_taskrun " not in plan, (name, plan)
        assert "Seq Scan on core_outboxmessage" not in plan, (name, plan)
        assert "idx_taskrun_lease_expiry" not in plan, (name, plan)
        assert "idx_taskrun_state_age" not in plan, (name, plan)
        assert "core_taskrun_pkey" in plan, (name, plan)
    plan = _generic_plan(queries["run_finish_if_done_many"], params, types)
    assert "idx_taskrun_run_state" in plan
