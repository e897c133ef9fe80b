"""The scheduler and the worker runtime, driven in the pytest process.

``engine.scheduler.schedule_once()`` claims and publishes (to real Redis, in this
checkout's broker namespace); ``engine.worker.execute.execute()`` runs one generation the
way the ``execute_task_run`` actor would. No worker process is involved: each
generation to execute is read back from its OutboxMessage row.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

import dramatiq
import pytest
from django.db import connection

from engine import dispatch
from engine.handlers import TaskContext
from engine.models import OutboxMessage, TaskRun, TaskRunEvent, WorkflowRun
from engine.reaper import reap_once
from engine.repositories import task_runs as task_run_ops
from engine.repositories import types
from engine.scheduler import schedule_once
from engine.services import start_run
from engine.worker import batching, heartbeat
from engine.worker import execute as worker
from engine.worker.combiner import Combiner, _Slot
from tests import engine_helpers

TASK_QUEUE = "flowforge.tasks"


@pytest.fixture(autouse=True)
def quiet_heartbeater(monkeypatch):
    """A heartbeater whose background thread never beats during a test (so it never holds
    a database connection); tests call ``beat()`` themselves."""
    hb = heartbeat.Heartbeater(interval_seconds=3600, lease_seconds=30)
    monkeypatch.setattr(heartbeat, "_heartbeater", hb)
    return hb


@pytest.fixture
def broker():
    import engine.actors  # noqa: F401  (declares the queues, so flush_all reaches them)
    from flowforge.broker import broker as b  # the configured broker (Redis, this checkout's namespace)

    assert dramatiq.get_broker() is b
    b.flush_all()
    yield b
    b.flush_all()


def published_task_messages(broker) -> list[tuple[str, int]]:
    """(task_run_id, fencing_token) of the execute_task_run messages waiting in Redis (both
    lanes: the first lane's go to the head of the same queue)."""
    out = []
    for data in broker.client.hgetall(f"{broker.namespace}:{TASK_QUEUE}.msgs").values():
        msg = dramatiq.Message.decode(data)
        assert msg.actor_name in ("execute_task_run", "execute_task_run_first")
        out.append((msg.args[0], msg.args[1]))
    return sorted(out)


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def drive(run_id, *, max_rounds: int = 30):
    """Schedule, then execute every generation that has an outbox row and was not
    executed yet, until the run is finished. Returns [(task key, token, outcome)]."""
    keys = dict(TaskRun.objects.unscoped().filter(workflow_run_id=run_id).values_list("id", "task__key"))
    executed: set[tuple[str, int]] = set()
    outcomes = []
    for _ in range(max_rounds):
        schedule_once()
        todo = [
            (m.payload["task_run_id"], m.payload["fencing_token"])
            for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run_id).order_by("created_at")
            if (m.payload["task_run_id"], m.payload["fencing_token"]) not in executed
        ]
        for tr_id, token in todo:
            executed.add((tr_id, token))
            outcomes.append((keys[uuid.UUID(tr_id)], token, worker.execute(tr_id, token)))
        if WorkflowRun.objects.unscoped().get(pk=run_id).is_terminal:
            return outcomes
    raise AssertionError(f"run {run_id} did not finish: {outcomes}")


def dispatched_root(run, broker) -> str:
    """Claim the run's only root task (its message is then dropped from Redis, so what a
    test finds there later was published afterwards); returns its task-run id."""
    schedule_once()
    (message,) = OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk)
    broker.flush_all()
    return message.payload["task_run_id"]


def task_runs(run_id) -> dict[str, TaskRun]:
    return {t.task.key: t for t in TaskRun.objects.unscoped().filter(workflow_run_id=run_id).select_related("task")}


def event_kinds(run_id, key=None) -> list[str]:
    qs = TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id).order_by("seq")
    if key is not None:
        qs = qs.filter(task_run__task__key=key)
    return list(qs.values_list("kind", flat=True))


def assert_gap_free(run_id):
    seqs = list(TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id).order_by("seq")
                .values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.django_db(transaction=True)
def test_diamond_of_noop_tasks_runs_to_success_in_process(org, make_workflow, broker):
    wf = make_workflow(
        org,
        [
            {"key": "a", "type": "noop"},
            {"key": "b", "type": "noop", "depends_on": ["a"]},
            {"key": "c", "type": "noop", "depends_on": ["a"]},
            {"key": "d", "type": "noop", "depends_on": ["b", "c"]},
        ],
        name="diamond",
    )
    run = start_run(workflow=wf, run_input={"n": 1})

    outcomes = drive(run.pk)

    assert [o[0] for o in outcomes][0] == "a"
    assert sorted(o[0] for o in outcomes[1:3]) == ["b", "c"]
    assert outcomes[3][0] == "d"
    assert [(o[1], o[2]) for o in outcomes] == [(1, "succeeded")] * 4
    run.refresh_from_db()
    assert run.state == "succeeded" and run.finished_at is not None and run.error == ""
    rows = task_runs(run.pk)
    for key, row in rows.items():
        assert (row.state, row.attempt, row.fencing_token, row.started_fencing_token) == ("succeeded", 1, 1, 1), key
        assert row.lease_expires_at is None and row.finished_at >= row.started_at
    for key in "bcd":
        assert event_kinds(run.pk, key) == ["promoted", "claimed", "started", "succeeded"]
    assert event_kinds(run.pk)[0] == "run_started" and event_kinds(run.pk)[-1] == "run_finished"
    assert_gap_free(run.pk)

    # One outbox row per generation, each published (stamped after Redis took it).
    msgs = list(OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk))
    assert len(msgs) == 4
    assert all(m.published_at is not None and m.publish_attempts == 1 for m in msgs)
    assert published_task_messages(broker) == sorted((str(r.pk), 1) for r in rows.values())

    # A second delivery of a finished generation is ignored.
    assert worker.execute(rows["a"].pk, 1) == "ignored"
    assert event_kinds(run.pk)[-1] == "duplicate_delivery_ignored"
    assert schedule_once() == 0


@pytest.mark.django_db(transaction=True)
def test_failing_task_is_retried_and_succeeds_on_second_attempt(org, make_workflow, broker):
    wf = make_workflow(
        org,
        [
            {"key": "flaky", "type": "fail", "config": {"fail_attempts": 1}, "max_attempts": 2,
             "retry_backoff_seconds": 0},
            {"key": "after", "type": "noop", "depends_on": ["flaky"]},
        ],
        name="flaky",
    )
    run = start_run(workflow=wf)

    outcomes = drive(run.pk)

    assert outcomes == [("flaky", 1, "retrying"), ("flaky", 2, "succeeded"), ("after", 1, "succeeded")]
    run.refresh_from_db()
    assert run.state == "succeeded"
    rows = task_runs(run.pk)
    flaky = rows["flaky"]
    assert (flaky.state, flaky.attempt, flaky.fencing_token) == ("succeeded", 2, 2)
    assert flaky.output == {"succeeded_on_attempt": 2}
    assert flaky.error == ""
    assert rows["after"].state == "succeeded"
    assert event_kinds(run.pk, "flaky") == ["claimed", "started", "attempt_failed", "claimed", "started", "succeeded"]
    failed_ev = TaskRunEvent.objects.unscoped().get(workflow_run_id=run.pk, kind="attempt_failed")
    assert failed_ev.attempt == 1 and failed_ev.fencing_token == 1
    assert failed_ev.detail["error"] == "RuntimeError: task failed on purpose (attempt 1)"
    snapshots = sorted(
        OutboxMessage.objects.unscoped().filter(task_run=flaky).values_list("fencing_token_snapshot", "attempt_snapshot")
    )
    assert snapshots == [(1, 1), (2, 2)]
    assert_gap_free(run.pk)


@pytest.mark.django_db(transaction=True)
def test_task_failing_all_attempts_fails_the_run_and_skips_downstream(org, make_workflow, broker):
    wf = make_workflow(
        org,
        [
            {"key": "boom", "type": "fail", "config": {"message": "no"}, "max_attempts": 2,
             "retry_backoff_seconds": 0},
            {"key": "after", "type": "noop", "depends_on": ["boom"]},
        ],
        name="boom",
    )
    run = start_run(workflow=wf)
    outcomes = drive(run.pk)
    assert outcomes == [("boom", 1, "retrying"), ("boom", 2, "failed")]
    run.refresh_from_db()
    assert run.state == "failed" and run.error == "task boom failed"
    rows = task_runs(run.pk)
    assert (rows["boom"].state, rows["boom"].attempt) == ("failed", 2)
    assert rows["boom"].error == "RuntimeError: no (attempt 2)"
    assert rows["after"].state == "skipped"


@pytest.mark.django_db(transaction=True)
def test_message_of_reaped_generation_is_ignored_and_new_generation_runs(org, make_workflow, broker):
    wf = make_workflow(org, [{"key": "lost", "type": "noop"}], name="lost")
    run = start_run(workflow=wf)
    assert schedule_once() == 1
    row = task_runs(run.pk)["lost"]
    # The message was lost and the claim's lease ran out before any worker started it.
    TaskRun.objects.unscoped().filter(pk=row.pk).update(lease_expires_at=db_now() - dt.timedelta(seconds=1))
    assert reap_once() == 1
    row.refresh_from_db()
    assert (row.state, row.attempt, row.fencing_token) == ("ready", 1, 2)

    assert worker.execute(row.pk, 1) == "ignored"  # the late first delivery
    assert event_kinds(run.pk, "lost")[-1] == "stale_dispatch_ignored"
    outcomes = drive(run.pk)
    assert outcomes == [("lost", 1, "ignored"), ("lost", 3, "succeeded")]
    row.refresh_from_db()
    assert (row.state, row.attempt, row.fencing_token) == ("succeeded", 1, 3)


@pytest.mark.django_db(transaction=True)
def test_heartbeater_extends_live_lease_and_flags_lost_generation(org, make_workflow, quiet_heartbeater):
    wf = make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop"}], name="hb")
    run = start_run(workflow=wf)
    assert schedule_once() == 2
    rows = task_runs(run.pk)
    from django.db import transaction

    contexts = {}
    for key in ("x", "y"):
        with transaction.atomic():
            started = engine_helpers.start_attempt(
                task_run_id=rows[key].pk, fencing_token=1, owner="w", lease_seconds=5
            )
        contexts[key] = TaskContext(
            task_run_id=started.task_run_id, workflow_run_id=started.workflow_run_id,
            organization_id=started.organization_id, task_key=key, attempt=1, max_attempts=1, fencing_token=1,
            timeout_seconds=None, config={}, input={}, upstream={},
        )
    # y's lease ran out and the reaper took it back (a new generation).
    TaskRun.objects.unscoped().filter(pk=rows["y"].pk).update(lease_expires_at=db_now() - dt.timedelta(seconds=1))
    assert reap_once() == 1

    hb = quiet_heartbeater
    hb.lease_seconds = 120
    for ctx in contexts.values():
        hb.register(ctx)
    try:
        before = db_now()
        hb.beat()
    finally:
        for ctx in contexts.values():
            hb.unregister(ctx)
    assert not contexts["x"].lease_lost
    assert contexts["y"].lease_lost
    x = TaskRun.objects.unscoped().get(pk=rows["x"].pk)
    assert x.lease_expires_at >= before + dt.timedelta(seconds=119)
    y = TaskRun.objects.unscoped().get(pk=rows["y"].pk)
    assert (y.state, y.fencing_token) == ("failed", 2)


@pytest.mark.django_db(transaction=True)
def test_a_worker_thread_continues_down_a_chain_without_the_broker(org, make_workflow, broker, settings):
    """execute(continue_inline=True): after each success the thread runs the dependent it
    claimed itself (up to FLOWFORGE_INLINE_CONTINUATIONS hops); the next one past the cap,
    and every other dependent of a fan-out, goes through the broker."""
    settings.FLOWFORGE_INLINE_CONTINUATIONS = 2
    wf = make_workflow(
        org,
        [
            {"key": "a", "type": "noop"},
            {"key": "b", "type": "noop", "depends_on": ["a"]},
            {"key": "c", "type": "noop", "depends_on": ["b"]},
            {"key": "d", "type": "noop", "depends_on": ["c"]},
            {"key": "e", "type": "noop", "depends_on": ["c"]},
        ],
        name="chain-then-fan-out",
    )
    run = start_run(workflow=wf)

    assert worker.execute(dispatched_root(run, broker), 1, continue_inline=True) == "succeeded"

    rows = task_runs(run.pk)
    assert {k: rows[k].state for k in "abcde"} == {
        "a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "running", "e": "running"}
    # b and c ran in this thread: their outbox rows are stamped, no message was sent;
    # c's success claimed d and e, past the cap of 2 hops, so both went to the broker.
    outbox = {m.task_run_id: m for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk)}
    assert all(m.published_at is not None and m.publish_attempts == 1 for m in outbox.values())
    assert published_task_messages(broker) == sorted((str(rows[k].pk), 1) for k in "de")
    for key in "bc":
        assert event_kinds(run.pk, key) == ["promoted", "claimed", "started", "succeeded"]
    # A late broker delivery of a continued generation is a duplicate: ignored.
    assert worker.execute(rows["b"].pk, 1) == "ignored"

    for key in "de":
        assert worker.execute(rows[key].pk, 1, continue_inline=True) == "succeeded"
    run.refresh_from_db()
    assert run.state == "succeeded"
    assert_gap_free(run.pk)


@pytest.mark.django_db(transaction=True)
def test_a_fan_out_keeps_one_dependent_for_the_thread_and_publishes_the_rest(org, make_workflow, broker):
    wf = make_workflow(
        org,
        [{"key": "root", "type": "noop"}] + [{"key": f"x{i}", "type": "noop", "depends_on": ["root"]} for i in range(4)],
        name="fan-out",
    )
    run = start_run(workflow=wf)

    assert worker.execute(dispatched_root(run, broker), 1, continue_inline=True) == "succeeded"

    rows = task_runs(run.pk)
    done = sorted(k for k, r in rows.items() if r.state == "succeeded")
    waiting = sorted(k for k, r in rows.items() if r.state == "running")
    assert len(done) == 2 and "root" in done  # the root and the one dependent this thread kept
    assert len(waiting) == 3
    assert published_task_messages(broker) == sorted((str(rows[k].pk), 1) for k in waiting)


@pytest.mark.django_db(transaction=True)
def test_without_continue_inline_every_dependent_goes_through_the_broker(org, make_workflow, broker):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf)
    assert worker.execute(dispatched_root(run, broker), 1) == "succeeded"
    rows = task_runs(run.pk)
    assert rows["b"].state == "running" and rows["b"].started_at is None
    assert published_task_messages(broker) == [(str(rows["b"].pk), 1)]


def test_a_start_and_a_success_recorded_in_one_batch_share_one_transaction(org, make_workflow, broker):
    """``start_and_complete``: a worker process's pending starts and successes go in one
    transaction. The success claims its dependent, the start starts its own task run, a
    stale start and a stale completion in the same batch change nothing and are recorded;
    the run's history stays gap-free and in order."""

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"},
                             {"key": "c", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf)
    schedule_once()
    trs = task_runs(run.pk)
    a, b = trs["a"], trs["b"]
    started, _, _ = task_run_ops.start_and_complete_many(
        starts=[types.StartRequest(a.pk, a.fencing_token, "w1")], successes=[],
        worker_lease_seconds=30, dispatch_lease_seconds=300, owner="test")
    assert started[0] is not None and started[0].task_key == "a" and started[0].has_dependents
    started, results, dispatched = task_run_ops.start_and_complete_many(
        starts=[types.StartRequest(b.pk, b.fencing_token, "w2"),
                types.StartRequest(b.pk, b.fencing_token + 5, "w3")],          # stale generation
        successes=[types.SuccessRequest(a.pk, a.fencing_token, {"rows": 3}),
                   types.SuccessRequest(b.pk, b.fencing_token + 5, None)],      # stale completion
        worker_lease_seconds=30, dispatch_lease_seconds=300, owner="test")
    assert [s is not None for s in started] == [True, False]
    assert started[0].task_key == "b" and started[0].attempt == 1 and not started[0].has_dependents
    assert [(r.accepted, r.state) for r in results] == [(True, "succeeded"), (False, None)]
    trs = task_runs(run.pk)
    assert [d.task_run_id for d in dispatched] == [trs["c"].pk]
    assert (trs["a"].state, trs["b"].state, trs["c"].state) == ("succeeded", "running", "running")
    assert trs["a"].output == {"rows": 3}
    assert trs["b"].started_fencing_token == trs["b"].fencing_token and trs["b"].lease_owner == "w2"
    events = list(TaskRunEvent.objects.unscoped().filter(workflow_run_id=run.pk).order_by("seq")
                  .values_list("seq", "kind"))
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
    # One statement records the success and the start (successes' events first), the next
    # promotes and claims; the stale requests are recorded after the commit.
    assert [kind for _, kind in events][-6:] == ["succeeded", "started", "promoted", "claimed",
                                                  "stale_dispatch_ignored", "stale_completion_rejected"]


@pytest.mark.django_db(transaction=True)
def test_successes_queued_behind_a_batch_in_flight_are_all_committed_by_the_time_the_threads_return(
        org, make_workflow, broker, monkeypatch):
    """A task without dependents whose success is submitted while the process's batch is in
    flight does not wait for it (write-behind): its thread returns "succeeded" and the
    success goes into the next batch. Each start batch is slowed to 50 ms here, so the
    first thread's success is certainly submitted while the second batch runs; once every
    thread has returned, every success is committed, once, and the run is finished."""
    import threading
    import time

    wf = make_workflow(org, [{"key": f"t{i}", "type": "noop"} for i in range(6)])
    run = start_run(workflow=wf)
    schedule_once()
    generations = [(m.payload["task_run_id"], m.payload["fencing_token"])
                   for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk)]
    assert len(generations) == 6

    def slow_starts(items):
        if any(isinstance(i, batching.Start) for i in items):
            time.sleep(0.05)
        return batching.record_batch(items)

    completer = batching.BatchCompleter(slow_starts)
    combiner = completer.combiner
    monkeypatch.setattr(worker, "completer", completer)
    queued = []
    submit = combiner.submit

    def spy(request, *, wait=True, on_result=None):
        result = submit(request, wait=wait, on_result=on_result)
        if not wait and result is None:
            queued.append(request.request.task_run_id)
        return result

    monkeypatch.setattr(combiner, "submit", spy)
    outcomes: list[str] = []

    def work(tr_id, token, delay):
        time.sleep(delay)
        try:
            outcomes.append(worker.execute(tr_id, token))
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(tr, tok, 0 if i == 0 else 0.01))
               for i, (tr, tok) in enumerate(generations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == ["succeeded"] * 6
    assert queued, "no success was submitted while a batch was in flight"
    run.refresh_from_db()
    assert run.state == "succeeded"
    assert {t.state for t in task_runs(run.pk).values()} == {"succeeded"}
    with connection.cursor() as cur:
        cur.execute("SELECT kind, count(*), count(DISTINCT task_run_id) FROM core_taskrunevent "
                    "WHERE workflow_run_id = %s AND kind IN ('started', 'succeeded') GROUP BY kind", [run.pk])
        assert sorted(cur.fetchall()) == [("started", 6, 6), ("succeeded", 6, 6)]


# --- Claim bursts: several generations per broker message ----------------------------------------


def queued_messages(broker) -> list[dramatiq.Message]:
    """Every message waiting in the task queue, in no particular order."""
    raw = broker.client.hgetall(f"{broker.namespace}:{TASK_QUEUE}.msgs")
    return [dramatiq.Message.decode(data) for data in raw.values()]


def generations(run_id) -> set[tuple[str, int]]:
    """(task_run_id, fencing_token) of every outbox row of the run."""
    return {(m.payload["task_run_id"], m.payload["fencing_token"])
            for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run_id)}


def test_group_rows_deals_the_oldest_rows_round_robin_into_fanout_messages():
    from engine.relay import group_rows

    assert group_rows(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert group_rows(list(range(6)), 3) == [[0, 3], [1, 4], [2, 5]]
    # At most ``fanout`` rows, or no fan-out limit: a message each.
    assert group_rows([10, 11, 12], 3) == [[10], [11], [12]]
    assert group_rows([10, 11], 0) == [[10], [11]]
    assert group_rows([], 3) == []


@pytest.mark.django_db(transaction=True)
def test_a_claim_burst_over_the_fanout_goes_out_as_fanout_messages_that_run_every_generation_once(
    org, make_workflow, broker, settings
):
    settings.FLOWFORGE_DISPATCH_FANOUT = 3
    settings.FLOWFORGE_DISPATCH_FIRST = 0  # every generation on the bulk lane, whose messages are grouped
    wf = make_workflow(org, [{"key": f"t{i}", "type": "noop"} for i in range(7)])
    run = start_run(workflow=wf, run_input={})
    assert schedule_once() == 7

    messages = queued_messages(broker)
    assert sorted(m.actor_name for m in messages) == ["execute_task_runs"] * 3
    assert sorted(len(m.args[0]) for m in messages) == [2, 2, 3]
    carried = [tuple(pair) for m in messages for pair in m.args[0]]
    assert sorted(carried) == sorted(generations(run.pk))  # every generation once, in one message
    assert not OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk, published_at__isnull=True).exists()

    for m in messages:  # what the execute_task_runs actor does with each
        assert worker.execute_many([(t, token) for t, token in m.args[0]]) == ["succeeded"] * len(m.args[0])
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"
    # A redelivered message (its worker died before the ack) starts nothing again.
    assert worker.execute_many([(t, token) for t, token in messages[0].args[0]]) == ["ignored"] * len(
        messages[0].args[0])
    assert event_kinds(run.pk).count("started") == 7
    assert_gap_free(run.pk)


@pytest.mark.django_db(transaction=True)
def test_a_slow_task_hands_the_rest_of_its_message_back_to_the_broker(org, make_workflow, broker, settings):
    settings.FLOWFORGE_DISPATCH_FANOUT = 0  # one message per generation: the group is built by hand below
    settings.FLOWFORGE_GROUP_HANDOFF_SECONDS = 0.1
    wf = make_workflow(org, [{"key": "slow", "type": "sleep", "config": {"seconds": 1.0}},
                             {"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    run = start_run(workflow=wf, run_input={})
    schedule_once()
    by_key = {key: (str(t.pk), t.fencing_token) for key, t in task_runs(run.pk).items()}
    broker.flush_all()

    outcomes = worker.execute_many([by_key["slow"], by_key["a"], by_key["b"]])

    assert outcomes == ["succeeded"]  # only the slow one ran here
    messages = queued_messages(broker)
    handed = sorted((m.actor_name, m.args[0], m.args[1]) for m in messages)
    assert handed == sorted([("execute_task_run", *by_key["a"]), ("execute_task_run", *by_key["b"])])
    rows = task_runs(run.pk)
    assert rows["slow"].state == "succeeded"
    # Handed off while the slow one still ran (HandOff's thread), not after it finished.
    finished_ms = rows["slow"].finished_at.timestamp() * 1000
    assert all(m.message_timestamp < finished_ms - 500 for m in messages), (finished_ms, messages)
    for key in ("a", "b"):  # claimed, not started: the next thread to take the message starts it
        assert rows[key].state == "running" and rows[key].started_fencing_token is None
        assert worker.execute(*by_key[key]) == "succeeded"
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_thread_yields_the_rest_of_its_message_to_a_more_urgent_fetched_message(
    org, make_workflow, broker, settings, monkeypatch
):
    """A message of three bulk generations; after the first, the process's work queue
    holds a fetched first-lane message (priority 5, before bulk's 10): the thread hands the
    other two back to the broker at once (one message each) and returns, to take it. With
    only bulk messages waiting it runs its whole message. (The hand-off watchdog is kept
    out of it: its limit is an hour.)"""
    import queue

    from dramatiq.worker import _WorkQueueItem

    import flowforge.dramatiq_middleware as mw

    settings.FLOWFORGE_DISPATCH_FANOUT = 0  # one message per generation: the group is built by hand below
    settings.FLOWFORGE_GROUP_HANDOFF_SECONDS = 3600
    wf = make_workflow(org, [{"key": k, "type": "noop"} for k in ("a", "b", "c", "d", "e", "f")])
    run = start_run(workflow=wf, run_input={})
    schedule_once()
    by_key = {key: (str(t.pk), t.fencing_token) for key, t in task_runs(run.pk).items()}
    broker.flush_all()
    work_queue = queue.PriorityQueue()
    monkeypatch.setattr(mw, "_work_queue", work_queue)

    # Only a bulk message waits: nothing more urgent, the whole message runs here.
    work_queue.put(_WorkQueueItem(10, object()))
    assert worker.execute_many([by_key["a"], by_key["b"], by_key["c"]]) == ["succeeded"] * 3
    assert queued_messages(broker) == []

    # A first-lane message waits (it arrives while "d" runs): "e" and "f" go back to the broker.
    real_execute = worker.execute

    def execute_then_fetch_urgent(*args, **kwargs):
        outcome = real_execute(*args, **kwargs)
        work_queue.put(_WorkQueueItem(5, object()))
        return outcome

    monkeypatch.setattr(worker, "execute", execute_then_fetch_urgent)
    assert worker.execute_many([by_key["d"], by_key["e"], by_key["f"]]) == ["succeeded"]
    handed = sorted((m.actor_name, m.args[0], m.args[1]) for m in queued_messages(broker))
    assert handed == sorted([("execute_task_run", *by_key["e"]), ("execute_task_run", *by_key["f"])])
    rows = task_runs(run.pk)
    assert rows["d"].state == "succeeded"
    for key in ("e", "f"):  # claimed, not started: the next thread to take the message starts it
        assert rows[key].state == "running" and rows[key].started_fencing_token is None


@pytest.mark.django_db(transaction=True)
def test_a_first_lane_start_is_its_own_transaction_not_a_place_in_the_batch(org, make_workflow, broker, monkeypatch):
    """``execute(..., alone=True)`` (the first-lane actor) starts the generation without the
    process's batching completer (whose next batch may wait on another organization's run
    row), then asks its refiller for the organization; the completion goes the usual way."""
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf, run_input={})
    schedule_once()
    (tr,) = task_runs(run.pk).values()
    broker.flush_all()
    inline = batching.InlineCompleter()

    class NoBatchedStart:
        refilled: list = []

        class refiller:
            @staticmethod
            def request(ids):
                NoBatchedStart.refilled.extend(ids)

        def start(self, request):
            raise AssertionError("a first-lane start went into the batch")

        def complete(self, completion):
            return inline.complete(completion)

    monkeypatch.setattr(worker, "completer", NoBatchedStart())
    assert worker.execute(str(tr.pk), tr.fencing_token, continue_inline=True, alone=True) == "succeeded"
    assert NoBatchedStart.refilled == [tr.pk]
    assert "started" in event_kinds(run.pk)
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


def test_urgent_message_waiting_reads_the_head_of_the_work_queue(monkeypatch):
    """Outside a worker process (no work queue) and with an empty one: False; True only
    when the most urgent waiting message's priority is below the one given."""
    import queue

    from dramatiq.worker import _WorkQueueItem

    import flowforge.dramatiq_middleware as mw

    monkeypatch.setattr(mw, "_work_queue", None)
    assert mw.urgent_message_waiting(10) is False
    work_queue = queue.PriorityQueue()
    monkeypatch.setattr(mw, "_work_queue", work_queue)
    assert mw.urgent_message_waiting(10) is False
    work_queue.put(_WorkQueueItem(10, object()))
    assert mw.urgent_message_waiting(10) is False
    work_queue.put(_WorkQueueItem(0, object()))
    assert mw.urgent_message_waiting(10) is True
    assert mw.urgent_message_waiting(0) is False


def test_a_reserved_thread_takes_only_urgent_messages_and_never_swallows_a_wake_up():
    """LaneWorkQueue (a worker process's work queue; first lane at priority 5): a reserved
    thread leaves a bulk message (10) to an ordinary thread, even when the put wakes it
    first, and takes first-lane (5) and control (0) messages, most urgent first."""
    import threading

    from dramatiq.worker import _WorkQueueItem

    from flowforge.dramatiq_middleware import LaneWorkQueue

    work_queue = LaneWorkQueue(max_priority=5)
    taken: dict[str, list[int]] = {"reserved": [], "ordinary": []}

    def taker(name: str, reserved: bool) -> None:
        if reserved:
            work_queue.reserve()
        while True:
            item = work_queue.get(timeout=30)  # a swallowed wake-up leaves a message 30 s
            if item.message is None:
                return  # told to stop
            taken[name].append(item.priority)

    def wait_for(name: str, n: int) -> None:
        deadline = time.monotonic() + 5
        while len(taken[name]) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    reserved = threading.Thread(target=taker, args=("reserved", True), daemon=True)
    reserved.start()
    time.sleep(0.1)  # the reserved thread waits first: a single wake-up would go to it
    ordinary = threading.Thread(target=taker, args=("ordinary", False), daemon=True)
    ordinary.start()
    time.sleep(0.1)
    work_queue.put(_WorkQueueItem(10, "bulk"))
    wait_for("ordinary", 1)
    assert taken == {"reserved": [], "ordinary": [10]}
    work_queue.put(_WorkQueueItem(100, None))  # the ordinary thread stops; the reserved one leaves it
    ordinary.join(5)
    assert not ordinary.is_alive()
    # Only the reserved thread takes now: the urgent ones, most urgent first; the bulk one stays.
    work_queue.put(_WorkQueueItem(10, "bulk"))
    work_queue.put(_WorkQueueItem(5, "first lane"))
    work_queue.put(_WorkQueueItem(0, "control"))
    wait_for("reserved", 2)
    time.sleep(0.1)
    assert taken["reserved"] == [0, 5]
    assert [item.priority for item in work_queue.queue] == [10]
    work_queue.put(_WorkQueueItem(1, None))
    reserved.join(5)
    assert not reserved.is_alive()
    # An ordinary get takes the bulk one.
    assert work_queue.get(block=False).priority == 10


@pytest.mark.django_db(transaction=True)
def test_generations_the_broker_refuses_to_take_back_are_run_by_their_own_thread(
    org, make_workflow, broker, settings, monkeypatch
):
    import flowforge.broker

    settings.FLOWFORGE_DISPATCH_FANOUT = 0
    settings.FLOWFORGE_GROUP_HANDOFF_SECONDS = 0.1
    wf = make_workflow(org, [{"key": "slow", "type": "sleep", "config": {"seconds": 0.5}},
                             {"key": "a", "type": "noop"}])
    run = start_run(workflow=wf, run_input={})
    schedule_once()
    by_key = {key: (str(t.pk), t.fencing_token) for key, t in task_runs(run.pk).items()}
    broker.flush_all()
    # The broker is down while the hand-off is tried: every enqueue fails.
    tried = []

    def refuse(messages, broker=None):
        tried.append([(m.actor_name, *m.args) for m in messages])
        return [ConnectionError("Redis is down")] * len(messages)

    monkeypatch.setattr(flowforge.broker, "enqueue_many", refuse)

    assert worker.execute_many([by_key["slow"], by_key["a"]]) == ["succeeded", "succeeded"]
    assert tried == [[("execute_task_run", *by_key["a"])]]  # tried once, while "slow" ran
    assert queued_messages(broker) == []
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_timeouts_and_backoffs_stored_out_of_range_never_compute_a_timestamp_out_of_range(
    org, make_workflow, broker, quiet_heartbeater
):
    """Definitions stored before the limits existed (or written around them): the engine
    bounds the lease, the retry delay, the timeout checks and the run timeout itself
    instead of failing on 'timestamp out of range' (and failing what shares its batch)."""
    from engine.sweeper import sweep_runs

    wf = make_workflow(org, [{"key": "a", "type": "fail", "max_attempts": 3}, {"key": "b", "type": "noop"}])
    with connection.cursor() as cur:
        cur.execute("UPDATE core_task SET timeout_seconds = 1e20, retry_backoff_seconds = 1e308 WHERE workflow_id = %s",
                    [wf.pk])
        cur.execute("UPDATE core_workflow SET run_timeout_seconds = 1e20 WHERE id = %s", [wf.pk])
    run = start_run(workflow=wf, run_input={})
    claimed = {d.task_run_id: d for d in task_run_ops.claim_ready_many(limit=10, lease_seconds=60, owner="o")}
    rows = task_runs(run.pk)
    started = engine_helpers.start_attempts(
        [types.StartRequest(rows[k].pk, claimed[rows[k].pk].fencing_token, "w") for k in ("a", "b")],
        lease_seconds=30)
    assert all(s is not None for s in started)
    now = db_now()
    for key in ("a", "b"):  # the worker's lease: the timeout is longer
        lease_left = (task_runs(run.pk)[key].lease_expires_at - now).total_seconds()
        assert 25 < lease_left <= 30, (key, lease_left)
    assert task_run_ops.heartbeat_many(leases=[(s.task_run_id, s.fencing_token) for s in started], lease_seconds=30) == {
        s.task_run_id for s in started}

    a = started[0]
    result = engine_helpers.complete_attempt(task_run_id=a.task_run_id, fencing_token=a.fencing_token, succeeded=False,
                                          error="boom", lease_seconds=60, owner="o")
    assert result.state == "ready"
    delay = (task_runs(run.pk)["a"].not_before - db_now()).total_seconds()
    assert 86000 < delay <= 86400  # MAX_RETRY_BACKOFF_SECONDS
    assert sweep_runs() == {"finished": 0, "settled": 0, "timed_out": 0}
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "running"


@pytest.mark.django_db(transaction=True)
def test_a_request_that_fails_its_batch_fails_alone_and_the_others_are_recorded(org, make_workflow, broker):

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    run = start_run(workflow=wf, run_input={})
    claimed = task_run_ops.claim_ready_many(limit=10, lease_seconds=60, owner="o")
    started = engine_helpers.start_attempts(
        [types.StartRequest(d.task_run_id, d.fencing_token, "w") for d in claimed], lease_seconds=30)
    good, bad = started
    # A success whose output is not JSON text makes the shared statement fail.
    items = [
        batching.Success(types.SuccessRequest(good.task_run_id, good.fencing_token, None, False,
                                                    output_json='{"ok": true}'), run.pk, False),
        batching.Success(types.SuccessRequest(bad.task_run_id, bad.fencing_token, None, False,
                                                    output_json="{not json"), run.pk, False),
    ]
    combiner = Combiner(batching.record_batch)
    slots = [_Slot(item) for item in items]
    combiner._run(slots)

    assert slots[0].error is None and slots[0].value[0].accepted
    assert slots[1].error is not None and "json" in str(slots[1].error).lower()
    states = {key: tr.state for key, tr in task_runs(run.pk).items()}
    good_key = next(k for k, tr in task_runs(run.pk).items() if tr.pk == good.task_run_id)
    assert states[good_key] == "succeeded" and sorted(states.values()) == ["running", "succeeded"]


@pytest.mark.django_db(transaction=True)
def test_a_lease_that_cannot_be_reaped_does_not_keep_the_others_from_expiring(org, make_workflow, broker,
                                                                               monkeypatch):

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    run = start_run(workflow=wf, run_input={})
    task_run_ops.claim_ready_many(limit=10, lease_seconds=60, owner="o")
    with connection.cursor() as cur:  # both dispatch leases ran out, "a" first
        cur.execute("UPDATE core_taskrun SET lease_expires_at = clock_timestamp() - interval '1 minute' "
                    "WHERE workflow_run_id = %s", [run.pk])
    rows = task_runs(run.pk)
    real = task_run_ops.expire_lease

    def broken_for_a(**kwargs):
        if kwargs["task_run_id"] == rows["a"].pk:
            raise RuntimeError("this row cannot be reaped")
        return real(**kwargs)

    monkeypatch.setattr(task_run_ops, "expire_lease", broken_for_a)
    assert reap_once() == 1
    after = task_runs(run.pk)
    assert after["a"].state == "running" and after["b"].state == "ready"  # "b" went back, "a" waits for the next pass


@pytest.mark.django_db(transaction=True)
def test_an_attempt_whose_lease_ran_to_its_timeout_is_reaped_as_timed_out_not_as_a_lost_worker(
    org, make_workflow, broker, quiet_heartbeater
):
    """The start counts started_at and the lease from one instant, so a lease bounded by
    timeout_seconds ends exactly at started_at + timeout and the reaper says so."""
    import time


    wf = make_workflow(org, [{"key": "a", "type": "sleep", "config": {"seconds": 5}, "timeout_seconds": 0.25,
                              "max_attempts": 1}])
    run = start_run(workflow=wf, run_input={})
    (d,) = task_run_ops.claim_ready_many(limit=10, lease_seconds=60, owner="o")
    (s,) = engine_helpers.start_attempts([types.StartRequest(d.task_run_id, d.fencing_token, "w")],
                                      lease_seconds=30)
    row = task_runs(run.pk)["a"]
    assert (row.lease_expires_at - row.started_at).total_seconds() == 0.25
    time.sleep(0.4)  # no heartbeat: the lease runs out at the timeout

    assert reap_once() == 1
    assert event_kinds(run.pk, "a")[-1] == "attempt_timed_out"
    row = task_runs(run.pk)["a"]
    assert row.state == "failed" and row.error == "attempt timed out (timeout_seconds reached)"


# --- Lanes: the first lane goes to the head of the task queue ------------------------------------


def test_a_first_lane_message_is_fetched_before_the_backlog_already_queued(broker):
    """Three bulk messages queued, then one of the first lane: a worker's next fetch (the
    Redis broker's own ``fetch``) takes the first-lane message first, then the backlog in
    order; every message is on the one task queue, the first lane's an
    ``execute_task_run_first`` (its actor's priority puts it before bulk messages a worker
    has already fetched)."""
    bulk = [dispatch.dispatch_message([(f"bulk-{i}", 1)], TASK_QUEUE) for i in range(3)]
    first = dispatch.dispatch_message([("first", 1)], "flowforge.tasks.first")
    assert (first.queue_name, first.actor_name) == (TASK_QUEUE, "execute_task_run_first")
    assert dispatch.enqueue_many(bulk) == [None] * 3
    assert dispatch.enqueue_many([first]) == [None]
    fetched = [dramatiq.Message.decode(data) for data in broker.do_fetch(TASK_QUEUE, 4)]
    assert [m.args[0] for m in fetched] == ["first", "bulk-0", "bulk-1", "bulk-2"]
    # Several first-lane messages of one publish keep their order (the claim's).
    several = [dispatch.dispatch_message([(f"first-{i}", 1)], "flowforge.tasks.first") for i in range(3)]
    assert dispatch.enqueue_many(several) == [None] * 3
    again = [dramatiq.Message.decode(data).args[0] for data in broker.do_fetch(TASK_QUEUE, 3)]
    assert again == ["first-0", "first-1", "first-2"]
    assert [m.actor_name for m in fetched] == ["execute_task_run_first"] + ["execute_task_run"] * 3
    from engine import actors

    assert actors.execute_task_run_first.priority < actors.execute_task_run.priority
