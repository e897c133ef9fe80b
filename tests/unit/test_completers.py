"""engine.worker.batching: the InlineCompleter (tests) and the BatchCompleter (production)
record the same results for the same requests, whether the BatchCompleter runs them
alone or several in one batch. Real PostgreSQL and Redis (the claims are published)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from engine.repositories import types
from engine.scheduler import schedule_once
from engine.services import start_run
from engine.worker.batching import BatchCompleter, Completer, Failure, InlineCompleter, Success, record_batch
from tests.unit.test_runtime_inprocess import broker, event_kinds, task_runs  # noqa: F401  (broker: a fixture)

TASKS = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "noop", "depends_on": ["a"]},
    {"key": "c", "type": "fail", "max_attempts": 2, "retry_backoff_seconds": 3600},
    {"key": "d", "type": "noop"},
    {"key": "e", "type": "fail", "max_attempts": 3},
]
CLAIMED = "acde"  # the roots: claimed by the scheduler, started by the completer under test


def _held_batches(release: threading.Event, entered: threading.Event, sizes: list[int]):
    """A run_batch that holds its first batch until ``release`` is set, so the requests
    submitted meanwhile queue and go together into the next batch; ``sizes`` gets the
    number of requests in each batch."""
    first = [True]

    def run_batch(items):
        sizes.append(len(items))
        if first[0]:
            first[0] = False
            entered.set()
            assert release.wait(10)
        return record_batch(items)

    return run_batch


def _start_all(completer: Completer, requests: dict[str, types.StartRequest], *, together: bool) -> dict:
    """Start each request; with ``together``, the first runs alone (held) and the others,
    submitted from their own threads meanwhile, as one batch."""
    if not together:
        return {key: completer.start(request) for key, request in requests.items()}
    started: dict = {}

    def start(key):
        try:
            started[key] = completer.start(requests[key])
        finally:
            connection.close()

    first, *rest = requests
    lead = threading.Thread(target=start, args=(first,))
    lead.start()
    assert completer.entered.wait(10)
    others = [threading.Thread(target=start, args=(key,)) for key in rest]
    for t in others:
        t.start()
    while len(completer.combiner._queue) < len(rest):
        threading.Event().wait(0.001)
    completer.release.set()
    for t in [lead, *others]:
        t.join(10)
    return started


def record_with(completer: Completer, org, make_workflow, *, together: bool = False) -> dict:
    """Run one workflow's requests through ``completer``; returns what it returned and what
    the database holds afterwards, with ids replaced by task keys."""
    wf = make_workflow(org, TASKS, name=f"parity-{type(completer).__name__}-{together}")
    run = start_run(workflow=wf, run_input={})
    assert schedule_once() == len(CLAIMED)  # (the retry of an earlier run's "c" is not due yet)
    rows = task_runs(run.pk)
    key_of = {row.pk: key for key, row in rows.items()}
    tok = {key: rows[key].fencing_token for key in CLAIMED}
    requests = {key: types.StartRequest(rows[key].pk, tok[key], f"w-{key}") for key in CLAIMED}
    requests["stale"] = types.StartRequest(rows["d"].pk, tok["d"] + 5, "w-stale")
    started = _start_all(completer, requests, together=together)
    started["duplicate"] = completer.start(types.StartRequest(rows["a"].pk, tok["a"], "w-again"))

    def success(key, output_json, *, token=None, continues=False):
        return Success(types.SuccessRequest(rows[key].pk, token or tok[key], None, key == "a",
                                                  output_json=output_json), run.pk, continues)

    recorded = {
        "a": completer.complete(success("a", '{"n": 1}', continues=True)),  # claims b, keeps it for the thread
        "d": completer.complete(success("d", '{"n": 2}')),                  # no dependents (write-behind when busy)
        "c": completer.complete(Failure(rows["c"].pk, tok["c"], "RuntimeError: once", True)),
        "e": completer.complete(Failure(rows["e"].pk, tok["e"], "OutputTooLarge: too big", False)),
        "stale": completer.complete(success("d", "null", token=tok["d"] + 5)),
    }
    return {
        "started": {k: s and (key_of[s.task_run_id], s.task_type, s.attempt, s.fencing_token, s.has_dependents,
                              s.upstream) for k, s in started.items()},
        "recorded": {k: (r.accepted, r.state, r.run_state, r.retry_in_seconds is not None,
                         following and key_of[following.task_run_id], len(r.dispatches))
                     for k, (r, following) in recorded.items()},
        "rows": {key: (row.state, row.attempt, row.fencing_token, row.output, row.error, row.lease_owner)
                 for key, row in task_runs(run.pk).items()},
        "events": {key: event_kinds(run.pk, key) for key in rows},
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_inline_and_batch_completers_record_the_same_results_for_the_same_requests(org, make_workflow):
    inline = record_with(InlineCompleter(), org, make_workflow)
    batch = record_with(BatchCompleter(), org, make_workflow)
    assert batch == inline

    # ... and those results are the right ones.
    assert inline["started"]["stale"] is None and inline["started"]["duplicate"] is None
    assert inline["started"]["a"][:5] == ("a", "noop", 1, 1, True)
    assert inline["recorded"] == {
        "a": (True, "succeeded", None, False, "b", 0),
        "d": (True, "succeeded", None, False, None, 0),
        "c": (True, "ready", None, True, None, 0),
        "e": (True, "failed", None, False, None, 0),
        "stale": (False, None, None, False, None, 0),
    }
    rows = inline["rows"]
    assert rows["a"][:4] == ("succeeded", 1, 1, {"n": 1}) and rows["d"][:4] == ("succeeded", 1, 1, {"n": 2})
    assert rows["b"][0] == "running" and rows["c"][:3] == ("ready", 2, 1)  # attempt 2 waits for its backoff
    assert rows["e"][0] == "failed" and rows["e"][4] == "OutputTooLarge: too big"
    assert inline["events"]["d"][-2:] == ["succeeded", "stale_completion_rejected"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_starts_that_share_a_batch_get_the_results_they_get_alone(org, make_workflow):
    inline = record_with(InlineCompleter(), org, make_workflow)
    release, entered = threading.Event(), threading.Event()
    sizes: list[int] = []
    completer = BatchCompleter(_held_batches(release, entered, sizes))
    completer.release, completer.entered = release, entered
    batch = record_with(completer, org, make_workflow, together=True)
    # The lead's start ran alone; the other four (one of them stale) shared the next batch.
    assert sizes[:2] == [1, 4]
    assert batch["started"] == inline["started"]
    assert batch == inline


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_batch_without_dependents_leaves_the_claim_to_its_refiller(org, make_workflow, settings):
    """A batch of starts and successes without dependents does not claim in its own
    transaction: it asks the process's refiller to claim for its organizations (here
    inline, so the test sees it at once), which takes what its start made room for."""
    from engine.models import TaskRun
    from engine.worker.batching import InlineRefiller

    settings.FLOWFORGE_DISPATCH_AHEAD = 4
    wf = make_workflow(org, [{"key": f"t{i:02d}", "type": "noop"} for i in range(12)], name="wide")
    run = start_run(workflow=wf)
    assert schedule_once() == 4  # the organization's dispatch-ahead: 4
    claimed = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running"))
    asked: list[list] = []

    class Recording(InlineRefiller):
        def request(self, task_run_ids):
            asked.append(list(task_run_ids))
            super().request(task_run_ids)

    completer = BatchCompleter(refiller=Recording())
    started = completer.start(types.StartRequest(claimed[0].pk, claimed[0].fencing_token, "w"))
    assert started is not None
    assert asked == [[claimed[0].pk]]
    running = TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running").count()
    assert running == 5  # 4 claimed + 1 refilled (the one that left the broker)
    started_rows = TaskRun.objects.for_organization(org).filter(workflow_run=run, started_at__isnull=False)
    assert started_rows.count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_refiller_thread_claims_what_a_start_made_room_for_without_the_batch_waiting(
    org, make_workflow, settings
):
    from engine.models import TaskRun
    from engine.worker.batching import Refiller
    from flowforge.stack import wait_until

    settings.FLOWFORGE_DISPATCH_AHEAD = 4
    wf = make_workflow(org, [{"key": f"t{i:02d}", "type": "noop"} for i in range(12)], name="wide")
    run = start_run(workflow=wf)
    assert schedule_once() == 4
    claimed = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running"))
    refiller = Refiller(interval_seconds=0.0)
    try:
        completer = BatchCompleter(refiller=refiller)
        for row in claimed[:2]:
            assert completer.start(types.StartRequest(row.pk, row.fencing_token, "w")) is not None

        def running():
            n = TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running").count()
            return n if n == 6 else None

        # Two left the broker: the refiller's thread claims two more (4 claimed + 2).
        assert wait_until(running, timeout=10, what="the refiller's claim") == 6
    finally:
        refiller.stop()


@pytest.mark.django_db(transaction=True)
def test_a_refill_with_nothing_ready_takes_no_claim_lock(org, make_workflow, settings):
    """A refill for an organization with no ready task run sends one read and no claim:
    it does not take the organization's claim lock (a chain's next success wants it)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from engine.models import TaskRun
    from engine.worker.batching import refill

    wf = make_workflow(org, [{"key": "only", "type": "noop"}], name="one")
    run = start_run(workflow=wf)
    assert schedule_once() == 1
    row = TaskRun.objects.for_organization(org).get(workflow_run=run)
    with CaptureQueriesContext(connection) as queries:
        assert refill([row.pk]) == 0
    sql = [q["sql"] for q in queries.captured_queries]
    assert len(sql) == 1 and "EXISTS" in sql[0], sql
    assert not any("pg_advisory_xact_lock" in s for s in sql)

    # With ready work (a second run's root), the same refill claims it.
    second = start_run(workflow=wf)
    assert refill([row.pk]) == 1
    assert TaskRun.objects.for_organization(org).get(workflow_run=second).state == "running"


@pytest.mark.django_db(transaction=True)
def test_a_last_success_and_its_runs_end_commit_together_or_not_at_all(org, make_workflow):
    """Issue 22: no process death can leave a run open with every task run finished. The
    last success and the run's terminal state are one transaction, sent whole (BEGIN ...
    COMMIT in one message): here the run's update fails, and the success is gone with it;
    the retry of the same success (as after a lease expiry) records both."""
    from engine.models import TaskRun, WorkflowRun
    from engine.worker.batching import Start

    wf = make_workflow(org, [{"key": "only", "type": "noop"}], name="last")
    run = start_run(workflow=wf)
    assert schedule_once() == 1
    row = TaskRun.objects.for_organization(org).get(workflow_run=run)
    started = record_batch([Start(types.StartRequest(row.pk, row.fencing_token, "w"))])[0]
    assert started is not None
    success = Success(types.SuccessRequest(row.pk, row.fencing_token, None, False), run.pk, False)
    try:
        with connection.cursor() as cur:
            cur.execute("""
                CREATE FUNCTION ff_test_refuse_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN RAISE EXCEPTION 'the run''s end refused (test)'; END $$;
                CREATE TRIGGER ff_test_refuse_run_end BEFORE UPDATE ON core_workflowrun FOR EACH ROW
                WHEN (NEW.state IS DISTINCT FROM OLD.state AND NEW.state = 'succeeded')
                EXECUTE FUNCTION ff_test_refuse_run_end();""")
        with pytest.raises(Exception, match="the run's end refused"):
            record_batch([success])
        row.refresh_from_db()
        run.refresh_from_db()
        assert (row.state, row.finished_at, run.state) == ("running", None, "running")
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS ff_test_refuse_run_end ON core_workflowrun; "
                        "DROP FUNCTION IF EXISTS ff_test_refuse_run_end();")
    record_batch([success])
    row.refresh_from_db()
    assert row.state == "succeeded"
    assert WorkflowRun.objects.for_organization(org).get(pk=run.pk).state == "succeeded"
