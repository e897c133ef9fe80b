"""The task-run and run transitions of engine.repositories (task_runs, runs) against real PostgreSQL.

Every function is called directly inside ``transaction.atomic()``; tests that need
real commits (threads, each with its own connection) use
``django_db(transaction=True)``.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.db import connection, transaction
from django.db.models import Count

from engine.models import OutboxMessage, TaskRun, TaskRunEvent, WorkflowRun
from engine.repositories import driver, runs, task_runs, types
from engine.sql import queries
from engine.states import TASK_FIRST_QUEUE, TASK_QUEUE
from tenancy.models import Organization
from tests import engine_helpers

LEASE = 30.0
OWNER = "test-scheduler"
WORKER = "test-worker"

DIAMOND = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "noop", "depends_on": ["a"]},
    {"key": "c", "type": "noop", "depends_on": ["a"]},
    {"key": "d", "type": "noop", "depends_on": ["b", "c"]},
]


# --- helpers ------------------------------------------------------------------------------------


def db_now() -> dt.datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def start(wf, run_input=None) -> uuid.UUID:
    with transaction.atomic():
        return runs.create_with_task_runs(
            workflow_id=wf.pk, organization_id=wf.organization_id, run_input=run_input or {}, trigger_source="cli"
        )


def run_row(run_id) -> WorkflowRun:
    return WorkflowRun.objects.unscoped().get(pk=run_id)


def task_run(run_id, key) -> TaskRun:
    return TaskRun.objects.unscoped().get(workflow_run_id=run_id, task__key=key)


def claim(limit=100, ids=None, owner=OWNER, lease=LEASE):
    with transaction.atomic():
        return task_runs.claim_ready_many(limit=limit, lease_seconds=lease, owner=owner, task_run_ids=ids)


def start_attempt(tr_id, token, lease=LEASE, owner=WORKER):
    with transaction.atomic():
        return engine_helpers.start_attempt(task_run_id=tr_id, fencing_token=token, owner=owner, lease_seconds=lease)


def complete(tr_id, token, succeeded=True, output=None, error="", claim=True):
    """Finish one generation; a success's batch claims for its organization as a worker's
    does (its dependents, and other ready task runs there is room for) unless ``claim`` is
    False (the test then claims what it means to itself)."""
    with transaction.atomic():
        return engine_helpers.complete_attempt(
            task_run_id=tr_id,
            fencing_token=token,
            succeeded=succeeded,
            output=output,
            error=error,
            lease_seconds=LEASE,
            owner=OWNER,
            claim=claim,
        )


def expire(tr_id, token):
    with transaction.atomic():
        return task_runs.expire_lease(task_run_id=tr_id, fencing_token=token)


def force_lease_expired(tr_id):
    TaskRun.objects.unscoped().filter(pk=tr_id).update(lease_expires_at=db_now() - dt.timedelta(seconds=5))


def events(run_id):
    """(seq, kind, task key or None, from, to, attempt, token, detail) in seq order."""
    return [
        (e.seq, e.kind, e.task_run.task.key if e.task_run_id else None, e.from_state, e.to_state, e.attempt,
         e.fencing_token, e.detail)
        for e in TaskRunEvent.objects.unscoped()
        .filter(workflow_run_id=run_id)
        .select_related("task_run__task")
        .order_by("seq")
    ]


def kinds(run_id, key=None):
    return [e[1] for e in events(run_id) if key is None or e[2] == key]


def assert_gap_free(run_id):
    seqs = list(
        TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    assert run_row(run_id).last_event_seq == len(seqs)
    return seqs


def run_claimed(dispatch, output=None, claim=True):
    """Start and succeed one claimed generation; returns the CompletionResult."""
    started = start_attempt(dispatch.task_run_id, dispatch.fencing_token)
    assert started is not None
    return complete(dispatch.task_run_id, dispatch.fencing_token, output=output, claim=claim)


# --- start ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_create_run_rows_makes_running_run_with_roots_ready_and_dependents_pending(org, make_workflow):
    wf = make_workflow(org, DIAMOND)
    run_id = start(wf, {"n": 1})

    run = run_row(run_id)
    assert run.state == "running"
    assert run.started_at is not None and run.finished_at is None
    assert run.input == {"n": 1}
    assert run.organization_id == org.pk
    states = {t.task.key: t for t in TaskRun.objects.unscoped().filter(workflow_run_id=run_id).select_related("task")}
    assert {k: t.state for k, t in states.items()} == {"a": "ready", "b": "pending", "c": "pending", "d": "pending"}
    for t in states.values():
        assert t.attempt == 1
        assert t.fencing_token == 0
        assert t.started_fencing_token is None
        assert t.lease_expires_at is None and t.lease_owner is None
        assert t.organization_id == org.pk
    evs = events(run_id)
    assert len(evs) == 1
    assert evs[0][:5] == (1, "run_started", None, "", "running")
    assert run.last_event_seq == 1


@pytest.mark.django_db
def test_services_start_run_uses_the_same_rows(org, make_workflow):
    from engine.services import start_run

    wf = make_workflow(org, DIAMOND)
    run = start_run(workflow=wf, run_input={"x": "y"})
    assert run.state == "running"
    assert task_run(run.pk, "a").state == "ready"
    assert kinds(run.pk) == ["run_started"]


# --- claim ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_claim_ready_takes_oldest_first_bumps_token_and_writes_one_outbox_row_per_generation(org, make_workflow):
    wf = make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop"}, {"key": "z", "type": "noop"}])
    run_id = start(wf)
    # Make the age order differ from the key order: z oldest, then x, then y.
    base = db_now() - dt.timedelta(minutes=10)
    for key, offset in (("z", 0), ("x", 1), ("y", 2)):
        TaskRun.objects.unscoped().filter(pk=task_run(run_id, key).pk).update(
            created_at=base + dt.timedelta(seconds=offset)
        )

    before = db_now()
    first = claim(limit=1)
    assert len(first) == 1
    z = task_run(run_id, "z")
    assert first[0].task_run_id == z.pk
    assert first[0].fencing_token == 1 and first[0].attempt == 1
    assert first[0].workflow_run_id == run_id and first[0].organization_id == org.pk
    assert first[0].outbox_id is not None
    assert z.state == "running"
    assert z.fencing_token == 1
    assert z.lease_owner == OWNER
    assert before + dt.timedelta(seconds=LEASE - 2) <= z.lease_expires_at <= db_now() + dt.timedelta(seconds=LEASE)
    assert z.started_fencing_token is None  # claimed, not started

    rest = claim(limit=10)
    assert {d.task_run_id for d in rest} == {task_run(run_id, "x").pk, task_run(run_id, "y").pk}
    assert all(d.fencing_token == 1 for d in rest)

    # The organization's first FLOWFORGE_DISPATCH_FIRST (2) generations waiting for a worker
    # ride the first lane (z, then one of x and y), the third the bulk lane.
    assert first[0].queue == TASK_FIRST_QUEUE
    assert sorted(d.queue for d in rest) == sorted([TASK_FIRST_QUEUE, TASK_QUEUE])
    for d in first + rest:
        msgs = list(OutboxMessage.objects.unscoped().filter(task_run_id=d.task_run_id))
        assert len(msgs) == 1
        m = msgs[0]
        assert m.id == d.outbox_id
        assert m.fencing_token_snapshot == d.fencing_token == 1
        assert m.attempt_snapshot == 1
        assert m.routing_key == d.queue
        assert m.published_at is None
        assert m.workflow_run_id == run_id and m.organization_id == org.pk
        assert m.payload["task_run_id"] == str(d.task_run_id)
        assert m.payload["fencing_token"] == 1
        assert m.payload["attempt"] == 1

    # One 'claimed' event per claim, in claim order, z's first.
    evs = events(run_id)
    assert [e[1] for e in evs] == ["run_started", "claimed", "claimed", "claimed"]
    assert evs[1][2] == "z"
    for e in evs[1:]:
        assert (e[3], e[4], e[5], e[6]) == ("ready", "running", 1, 1)
        assert e[7] == {"lease_owner": OWNER}

    assert claim(limit=10) == []
    assert OutboxMessage.objects.unscoped().count() == 3
    assert_gap_free(run_id)


@pytest.mark.django_db
def test_claim_ready_restricted_to_ids_claims_only_those(org, make_workflow):
    wf = make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop"}])
    run_id = start(wf)
    y = task_run(run_id, "y")
    got = claim(ids=[y.pk])
    assert [d.task_run_id for d in got] == [y.pk]
    assert task_run(run_id, "x").state == "ready"
    assert claim(ids=[]) == []


# --- start_attempt ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_start_attempt_starts_once_per_generation_and_ignores_duplicates_and_stale_tokens(org, make_workflow):
    wf = make_workflow(
        org,
        [
            {"key": "p", "type": "noop"},
            {"key": "q", "type": "fail", "config": {"message": "m"}, "depends_on": ["p"], "max_attempts": 4,
             "timeout_seconds": 120},
        ],
    )
    run_id = start(wf, {"in": 7})
    (dp,) = claim()
    complete_result = run_claimed(dp, output={"from_p": 1})
    (dq,) = complete_result.dispatches
    assert dq.fencing_token == 1

    # Generation 1 of q is never started: its lease runs out and the reaper makes generation 2.
    force_lease_expired(dq.task_run_id)
    assert expire(dq.task_run_id, 1).state == "ready"
    (dq3,) = claim()
    assert dq3.fencing_token == 3 and dq3.task_run_id == dq.task_run_id

    # An old generation's (late) message: ignored, recorded as stale.
    assert start_attempt(dq.task_run_id, 1) is None
    q = task_run(run_id, "q")
    assert q.started_fencing_token is None and q.started_at is None and q.fencing_token == 3
    stale = [e for e in events(run_id) if e[1] == "stale_dispatch_ignored"]
    assert len(stale) == 1
    assert stale[0][2] == "q" and stale[0][6] == 1
    assert stale[0][7] == {"message_fencing_token": 1, "current_fencing_token": 3, "state": "running"}

    started = start_attempt(dq3.task_run_id, 3)
    assert started is not None
    assert started.task_run_id == q.pk and started.workflow_run_id == run_id and started.organization_id == org.pk
    assert (started.task_key, started.task_type) == ("q", "fail")
    assert started.config == {"message": "m"}
    assert (started.attempt, started.max_attempts, started.fencing_token) == (1, 4, 3)
    assert started.timeout_seconds == 120
    assert started.run_input == {"in": 7}
    assert started.upstream == {"p": {"from_p": 1}}
    q = task_run(run_id, "q")
    assert q.started_fencing_token == 3 and q.started_at is not None and q.lease_owner == WORKER

    # The broker delivers generation 3 again: the handler must not run twice.
    assert start_attempt(dq3.task_run_id, 3) is None
    dup = [e for e in events(run_id) if e[1] == "duplicate_delivery_ignored"]
    assert len(dup) == 1
    assert dup[0][7] == {"message_fencing_token": 3, "current_fencing_token": 3, "state": "running"}
    assert [e[1] for e in events(run_id) if e[2] == "q"] == [
        "promoted", "claimed", "dispatch_expired", "claimed", "stale_dispatch_ignored", "started",
        "duplicate_delivery_ignored",
    ]
    assert_gap_free(run_id)


@pytest.mark.django_db
def test_start_attempt_bounds_lease_by_task_timeout(org, make_workflow):
    wf = make_workflow(org, [{"key": "t", "type": "noop", "timeout_seconds": 5}])
    run_id = start(wf)
    (d,) = claim()
    before = db_now()
    assert start_attempt(d.task_run_id, d.fencing_token, lease=300) is not None
    t = task_run(run_id, "t")
    assert before + dt.timedelta(seconds=4) < t.lease_expires_at < before + dt.timedelta(seconds=6)


# --- completion: success and fan-in -----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("order", [("b", "c"), ("c", "b")])
def test_complete_success_promotes_fan_in_only_after_all_parents_and_finishes_run(org, make_workflow, order):
    wf = make_workflow(org, DIAMOND)
    run_id = start(wf)
    (da,) = claim()
    res_a = run_claimed(da, output={"v": "a"})
    assert res_a.accepted and res_a.state == "succeeded" and res_a.run_state is None
    a = task_run(run_id, "a")
    assert a.state == "succeeded" and a.output == {"v": "a"} and a.finished_at is not None
    assert a.lease_expires_at is None and a.lease_owner is None

    # b and c were promoted and claimed in a's completion transaction.
    by_key = {task_run(run_id, k).pk: k for k in "bcd"}
    assert sorted(by_key[d.task_run_id] for d in res_a.dispatches) == ["b", "c"]
    for d in res_a.dispatches:
        assert d.fencing_token == 1 and d.outbox_id is not None
        assert OutboxMessage.objects.unscoped().get(pk=d.outbox_id).fencing_token_snapshot == 1
        assert task_run(run_id, by_key[d.task_run_id]).state == "running"
    assert task_run(run_id, "d").state == "pending"
    dispatch = {by_key[d.task_run_id]: d for d in res_a.dispatches}

    first, second = order
    res1 = run_claimed(dispatch[first])
    assert res1.state == "succeeded" and res1.dispatches == () and res1.run_state is None
    assert task_run(run_id, "d").state == "pending"
    assert "promoted" not in kinds(run_id, "d")

    res2 = run_claimed(dispatch[second])
    assert res2.state == "succeeded" and res2.run_state is None
    (dd,) = res2.dispatches
    d_row = task_run(run_id, "d")
    assert dd.task_run_id == d_row.pk and dd.fencing_token == 1 and dd.outbox_id is not None
    assert d_row.state == "running"
    assert kinds(run_id, "d") == ["promoted", "claimed"]

    res_d = run_claimed(dd)
    assert res_d.state == "succeeded" and res_d.run_state == "succeeded"
    run = run_row(run_id)
    assert run.state == "succeeded" and run.finished_at is not None and run.error == ""
    evs = events(run_id)
    assert evs[-1][1:5] == ("run_finished", None, "running", "succeeded")
    assert [e[1] for e in evs if e[2] == "a"] == ["claimed", "started", "succeeded"]
    for key in "bcd":
        assert [e[1] for e in evs if e[2] == key] == ["promoted", "claimed", "started", "succeeded"]
    # the fan-in child is promoted only after the second parent's 'succeeded'
    seq_of = {(e[1], e[2]): e[0] for e in evs}
    assert seq_of[("promoted", "d")] > seq_of[("succeeded", second)] > seq_of[("succeeded", first)]
    assert OutboxMessage.objects.unscoped().filter(workflow_run_id=run_id).count() == 4
    assert_gap_free(run_id)


@pytest.mark.django_db
def test_complete_success_without_start_is_rejected(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run_id = start(wf)
    (d,) = claim()
    res = complete(d.task_run_id, d.fencing_token, output={"x": 1})
    assert res.accepted is False
    a = task_run(run_id, "a")
    assert a.state == "running" and a.output is None
    assert kinds(run_id)[-1] == "stale_completion_rejected"


# --- completion: failure and retries ---------------------------------------------------------------


@pytest.mark.django_db
def test_failed_attempt_with_attempts_left_goes_back_to_ready_with_backoff(org, make_workflow):
    wf = make_workflow(org, [{"key": "f", "type": "fail", "max_attempts": 3, "retry_backoff_seconds": 30}])
    run_id = start(wf)
    (d,) = claim()
    assert start_attempt(d.task_run_id, 1) is not None
    before = db_now()
    res = complete(d.task_run_id, 1, succeeded=False, error="boom")
    after = db_now()
    assert res.accepted and res.state == "ready" and res.run_state is None and res.dispatches == ()
    assert 28 <= res.retry_in_seconds <= 30

    f = task_run(run_id, "f")
    assert f.state == "ready"
    assert f.attempt == 2
    assert f.fencing_token == 1
    assert f.error == "boom"
    assert f.finished_at is None and f.lease_expires_at is None and f.lease_owner is None
    assert before + dt.timedelta(seconds=30) <= f.not_before <= after + dt.timedelta(seconds=30)
    ev = events(run_id)[-1]
    assert ev[1:7] == ("attempt_failed", "f", "running", "ready", 1, 1)
    assert ev[7]["error"] == "boom" and ev[7]["retry_at"] is not None

    # Not claimable during the backoff ...
    assert claim() == []
    assert task_run(run_id, "f").state == "ready"
    # ... and claimable after it: a new generation carrying attempt 2.
    TaskRun.objects.unscoped().filter(pk=f.pk).update(not_before=db_now() - dt.timedelta(seconds=1))
    (d2,) = claim()
    assert (d2.task_run_id, d2.fencing_token, d2.attempt) == (f.pk, 2, 2)
    f = task_run(run_id, "f")
    assert f.state == "running" and f.not_before is None
    m = OutboxMessage.objects.unscoped().get(pk=d2.outbox_id)
    assert (m.fencing_token_snapshot, m.attempt_snapshot) == (2, 2)
    assert OutboxMessage.objects.unscoped().filter(task_run_id=f.pk).count() == 2


@pytest.mark.django_db
def test_retry_backoff_doubles_per_attempt(org, make_workflow):
    wf = make_workflow(org, [{"key": "f", "type": "fail", "max_attempts": 3, "retry_backoff_seconds": 10}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    complete(d.task_run_id, 1, succeeded=False, error="e1")
    TaskRun.objects.unscoped().filter(pk=d.task_run_id).update(not_before=None)
    (d2,) = claim()
    start_attempt(d2.task_run_id, 2)
    before = db_now()
    res = complete(d2.task_run_id, 2, succeeded=False, error="e2")
    assert res.state == "ready"
    f = task_run(run_id, "f")
    assert f.attempt == 3
    assert before + dt.timedelta(seconds=19) <= f.not_before <= db_now() + dt.timedelta(seconds=20)


@pytest.mark.django_db
def test_task_failing_every_attempt_fails_skips_descendants_transitively_and_fails_run(org, make_workflow):
    wf = make_workflow(
        org,
        [
            {"key": "bad", "type": "fail", "max_attempts": 3, "retry_backoff_seconds": 0},
            {"key": "ok", "type": "noop"},
            {"key": "child", "type": "noop", "depends_on": ["bad"]},
            {"key": "grandchild", "type": "noop", "depends_on": ["child", "ok"]},
        ],
    )
    run_id = start(wf)
    dispatches = {d.task_run_id: d for d in claim()}
    bad_id = task_run(run_id, "bad").pk
    ok_id = task_run(run_id, "ok").pk
    assert set(dispatches) == {bad_id, ok_id}
    res_ok = run_claimed(dispatches[ok_id])
    assert res_ok.dispatches == ()  # grandchild still waits for child

    d = dispatches[bad_id]
    for attempt in (1, 2, 3):
        assert (d.attempt, d.fencing_token) == (attempt, attempt)
        started = start_attempt(d.task_run_id, d.fencing_token)
        assert started.attempt == attempt
        res = complete(d.task_run_id, d.fencing_token, succeeded=False, error=f"nope {attempt}")
        assert res.accepted
        if attempt < 3:
            assert res.state == "ready" and res.run_state is None
            assert task_run(run_id, "bad").attempt == attempt + 1
            (d,) = claim()  # backoff 0: claimable at once
        else:
            assert res.state == "failed" and res.run_state == "failed"

    bad = task_run(run_id, "bad")
    assert bad.state == "failed" and bad.attempt == 3 and bad.error == "nope 3"
    assert bad.finished_at is not None and bad.not_before is None and bad.lease_expires_at is None
    for key in ("child", "grandchild"):
        row = task_run(run_id, key)
        assert row.state == "skipped" and row.finished_at is not None and row.fencing_token == 0
    assert task_run(run_id, "ok").state == "succeeded"
    run = run_row(run_id)
    assert run.state == "failed" and run.finished_at is not None
    assert run.error == "task bad failed"

    evs = events(run_id)
    assert [e[1] for e in evs if e[2] == "bad"] == [
        "claimed", "started", "attempt_failed", "claimed", "started", "attempt_failed", "claimed", "started",
        "attempt_failed",
    ]
    last_fail = [e for e in evs if e[2] == "bad"][-1]
    assert (last_fail[4], last_fail[5], last_fail[6]) == ("failed", 3, 3)
    skipped = [e for e in evs if e[1] == "skipped"]
    assert sorted(e[2] for e in skipped) == ["child", "grandchild"]
    assert all(e[7] == {"reason": "upstream_failed"} and e[4] == "skipped" for e in skipped)
    assert all(e[3] == "pending" for e in skipped)
    assert evs[-1][1:5] == ("run_finished", None, "running", "failed")
    assert min(e[0] for e in skipped) > last_fail[0]
    assert_gap_free(run_id)


# --- stale completion after a reap --------------------------------------------------------------------


@pytest.mark.django_db
def test_completion_of_reaped_generation_is_rejected_and_changes_nothing(org, make_workflow):
    wf = make_workflow(org, [{"key": "s", "type": "noop", "max_attempts": 3}])
    run_id = start(wf)
    (d1,) = claim()
    assert start_attempt(d1.task_run_id, 1) is not None
    force_lease_expired(d1.task_run_id)
    assert (d1.task_run_id, 1) in task_runs.get_expired_leases(limit=10)

    reaped = expire(d1.task_run_id, 1)
    assert reaped.accepted and reaped.state == "ready"
    s = task_run(run_id, "s")
    assert (s.state, s.attempt, s.fencing_token) == ("ready", 2, 2)
    assert "lease expired" in s.error
    assert kinds(run_id, "s")[-1] == "lease_expired"
    assert task_runs.get_expired_leases(limit=10) == []

    # The stale worker (generation 1) finishes while the row waits out its retry backoff
    # (an hour here, so that the claim every completion batch runs for its organization
    # cannot take it meanwhile, however slow this machine is).
    TaskRun.objects.unscoped().filter(pk=s.pk).update(not_before=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    s = task_run(run_id, "s")
    seq_before = run_row(run_id).last_event_seq
    res = complete(d1.task_run_id, 1, output={"late": True})
    assert res.accepted is False and res.state is None and res.dispatches == ()
    after = task_run(run_id, "s")
    assert (after.state, after.attempt, after.fencing_token, after.output) == ("ready", 2, 2, None)
    assert after.error == s.error and after.not_before == s.not_before
    ev = events(run_id)[-1]
    assert ev[0] == seq_before + 1
    assert ev[1:5] == ("stale_completion_rejected", "s", "ready", "ready")
    assert ev[6] == 1
    assert ev[7] == {"completion_fencing_token": 1, "current_fencing_token": 2, "state": "ready",
                     "outcome": "succeeded"}

    # The new generation runs; the stale worker's late failure report is rejected too.
    TaskRun.objects.unscoped().filter(pk=s.pk).update(not_before=None)
    (d3,) = claim()
    assert d3.fencing_token == 3 and d3.attempt == 2
    assert start_attempt(d3.task_run_id, 3) is not None
    res = complete(d1.task_run_id, 1, succeeded=False, error="late failure")
    assert res.accepted is False
    s = task_run(run_id, "s")
    assert (s.state, s.attempt, s.fencing_token) == ("running", 2, 3)
    assert events(run_id)[-1][7]["current_fencing_token"] == 3
    assert events(run_id)[-1][7]["outcome"] == "failed"

    done = complete(d3.task_run_id, 3, output={"fresh": True})
    assert done.accepted and done.run_state == "succeeded"
    s = task_run(run_id, "s")
    assert (s.state, s.attempt, s.fencing_token, s.output, s.error) == ("succeeded", 2, 3, {"fresh": True}, "")
    assert_gap_free(run_id)


# --- expire_lease ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_expire_lease_of_never_started_generation_returns_to_ready_without_using_an_attempt(org, make_workflow):
    wf = make_workflow(org, [{"key": "n", "type": "noop", "max_attempts": 1}])
    run_id = start(wf)
    (d,) = claim()
    force_lease_expired(d.task_run_id)
    res = expire(d.task_run_id, 1)
    assert res.accepted and res.state == "ready" and res.retry_in_seconds == 0.0
    n = task_run(run_id, "n")
    assert (n.state, n.attempt, n.fencing_token) == ("ready", 1, 2)
    assert n.lease_expires_at is None and n.lease_owner is None and n.not_before is None
    assert n.error == ""
    ev = events(run_id)[-1]
    assert ev[1:7] == ("dispatch_expired", "n", "running", "ready", 1, 2)
    # max_attempts=1 and still claimable: the lost dispatch used no attempt.
    (d2,) = claim()
    assert (d2.fencing_token, d2.attempt) == (3, 1)
    assert OutboxMessage.objects.unscoped().filter(task_run_id=n.pk).count() == 2


@pytest.mark.django_db
def test_expire_lease_of_started_generation_uses_the_attempt(org, make_workflow):
    wf = make_workflow(org, [{"key": "w", "type": "noop", "max_attempts": 2, "retry_backoff_seconds": 5}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    force_lease_expired(d.task_run_id)
    res = expire(d.task_run_id, 1)
    assert res.accepted and res.state == "ready" and 3 <= res.retry_in_seconds <= 5
    w = task_run(run_id, "w")
    assert (w.state, w.attempt, w.fencing_token) == ("ready", 2, 2)
    assert w.error.startswith("lease expired")
    assert w.not_before is not None and w.lease_expires_at is None
    ev = events(run_id)[-1]
    assert ev[1:7] == ("lease_expired", "w", "running", "ready", 1, 2)


@pytest.mark.django_db
def test_expire_lease_of_started_generation_with_attempts_spent_fails_task_and_run(org, make_workflow):
    wf = make_workflow(
        org,
        [{"key": "w", "type": "noop", "max_attempts": 1}, {"key": "after", "type": "noop", "depends_on": ["w"]}],
    )
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    force_lease_expired(d.task_run_id)
    res = expire(d.task_run_id, 1)
    assert res.accepted and res.state == "failed" and res.run_state == "failed"
    w = task_run(run_id, "w")
    assert (w.state, w.attempt, w.fencing_token) == ("failed", 1, 2)
    assert w.finished_at is not None and w.lease_expires_at is None
    assert task_run(run_id, "after").state == "skipped"
    run = run_row(run_id)
    assert run.state == "failed" and run.finished_at is not None
    assert kinds(run_id)[-3:] == ["lease_expired", "skipped", "run_finished"]
    assert_gap_free(run_id)


@pytest.mark.django_db
def test_expire_lease_of_timed_out_attempt_says_it_timed_out(org, make_workflow):
    import time

    wf = make_workflow(org, [{"key": "slow", "type": "noop", "max_attempts": 2, "timeout_seconds": 0.2}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1, lease=300)
    # The heartbeat cannot extend past started_at + timeout_seconds.
    with transaction.atomic():
        alive = task_runs.heartbeat_many(leases=[(d.task_run_id, 1)], lease_seconds=300)
    assert alive == {d.task_run_id}
    slow = task_run(run_id, "slow")
    assert slow.lease_expires_at <= slow.started_at + dt.timedelta(seconds=0.2)
    time.sleep(0.4)
    assert task_runs.get_expired_leases(limit=10) == [(d.task_run_id, 1)]
    res = expire(d.task_run_id, 1)
    assert res.accepted and res.state == "ready"
    slow = task_run(run_id, "slow")
    assert (slow.attempt, slow.fencing_token) == (2, 2)
    assert "timed out" in slow.error
    ev = events(run_id)[-1]
    assert ev[1:5] == ("attempt_timed_out", "slow", "running", "ready")
    assert "timed out" in ev[7]["error"]


@pytest.mark.django_db
def test_expire_lease_of_live_or_superseded_lease_changes_nothing(org, make_workflow):
    wf = make_workflow(org, [{"key": "l", "type": "noop"}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    seq = run_row(run_id).last_event_seq
    assert expire(d.task_run_id, 1).accepted is False  # lease still live
    force_lease_expired(d.task_run_id)
    assert expire(d.task_run_id, 0).accepted is False  # wrong generation
    l_row = task_run(run_id, "l")
    assert (l_row.state, l_row.attempt, l_row.fencing_token) == ("running", 1, 1)
    assert run_row(run_id).last_event_seq == seq


# --- heartbeat -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_heartbeat_extends_only_live_leases_of_the_current_generation(org, make_workflow):
    wf = make_workflow(org, [{"key": "h1", "type": "noop"}, {"key": "h2", "type": "noop"},
                             {"key": "h3", "type": "noop"}])
    run_id = start(wf)
    ds = {task_run(run_id, k).pk: k for k in ("h1", "h2", "h3")}
    for d in claim():
        start_attempt(d.task_run_id, d.fencing_token, lease=10)
    ids = {k: pk for pk, k in ds.items()}
    soon = db_now() + dt.timedelta(seconds=5)
    TaskRun.objects.unscoped().filter(pk__in=[ids["h1"], ids["h2"]]).update(lease_expires_at=soon)
    expired_at = db_now() - dt.timedelta(seconds=1)
    TaskRun.objects.unscoped().filter(pk=ids["h3"]).update(lease_expires_at=expired_at)

    before = db_now()
    with transaction.atomic():
        alive = task_runs.heartbeat_many(
            leases=[(ids["h1"], 1), (ids["h2"], 7), (ids["h3"], 1)], lease_seconds=120
        )
    assert alive == {ids["h1"]}
    h1, h2, h3 = (task_run(run_id, k) for k in ("h1", "h2", "h3"))
    assert before + dt.timedelta(seconds=119) <= h1.lease_expires_at <= db_now() + dt.timedelta(seconds=120)
    assert h2.lease_expires_at == soon  # wrong token: untouched
    assert h3.lease_expires_at == expired_at  # expired: belongs to the reaper
    assert all(t.state == "running" for t in (h1, h2, h3))
    with transaction.atomic():
        assert task_runs.heartbeat_many(leases=[], lease_seconds=10) == set()


@pytest.mark.django_db
def test_extend_leases_answers_the_lease_it_set_measured_from_the_same_instant(org, make_workflow):
    """The seconds answered are the lease just set, from the instant it was set: 30.0 for a
    lease of 30 s, not 29.9999x from a clock read again later (the worker API rounded that
    to 0.999 for a lease of 1 s under load); with a timeout nearer, what the timeout leaves."""
    wf = make_workflow(org, [{"key": "free", "type": "noop"},
                             {"key": "capped", "type": "noop", "timeout_seconds": 20}])
    run_id = start(wf)
    for d in claim():
        start_attempt(d.task_run_id, d.fencing_token, lease=10)
    free, capped = task_run(run_id, "free"), task_run(run_id, "capped")
    with transaction.atomic():
        answered = task_runs.extend_leases(leases=[(free.pk, 1), (capped.pk, 1)], lease_seconds=30)
    assert answered[free.pk] == 30.0
    capped.refresh_from_db()
    assert capped.lease_expires_at == capped.started_at + dt.timedelta(seconds=20)
    # What the timeout leaves of it: under 20 s (some time passed since the start), and exactly
    # the stored expiry less the instant the answer was measured from.
    assert 0 < answered[capped.pk] < 20


# --- cancel --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_run_cancels_open_task_runs_and_rejects_the_running_generation(org, make_workflow):
    wf = make_workflow(
        org,
        [
            {"key": "done", "type": "noop"},
            {"key": "run", "type": "noop"},
            {"key": "rdy", "type": "noop"},
            {"key": "pend", "type": "noop", "depends_on": ["run"]},
        ],
    )
    run_id = start(wf)
    (dd,) = claim(ids=[task_run(run_id, "done").pk])
    run_claimed(dd, claim=False)  # "rdy" stays ready
    (dr,) = claim(ids=[task_run(run_id, "run").pk])
    start_attempt(dr.task_run_id, 1)
    assert task_run(run_id, "rdy").state == "ready"
    assert task_run(run_id, "pend").state == "pending"

    with transaction.atomic():
        assert runs.cancel(workflow_run_id=run_id, reason="user asked") is True

    rows = {k: task_run(run_id, k) for k in ("done", "run", "rdy", "pend")}
    assert rows["done"].state == "succeeded" and rows["done"].fencing_token == 1
    assert (rows["run"].state, rows["run"].fencing_token) == ("cancelled", 2)
    assert (rows["rdy"].state, rows["rdy"].fencing_token) == ("cancelled", 0)
    assert (rows["pend"].state, rows["pend"].fencing_token) == ("cancelled", 0)
    for k in ("run", "rdy", "pend"):
        assert rows[k].finished_at is not None and rows[k].lease_expires_at is None and rows[k].lease_owner is None
    run = run_row(run_id)
    assert run.state == "cancelled" and run.finished_at is not None and run.error == "user asked"
    evs = events(run_id)
    cancelled = [e for e in evs if e[1] == "cancelled"]
    assert sorted(e[2] for e in cancelled) == ["pend", "rdy", "run"]
    assert all(e[4] == "cancelled" and e[7] == {"reason": "user asked"} for e in cancelled)
    assert {e[2]: e[6] for e in cancelled} == {"run": 2, "rdy": 0, "pend": 0}
    # Each event says which state the task run was cancelled from.
    assert {e[2]: e[3] for e in cancelled} == {"run": "running", "rdy": "ready", "pend": "pending"}
    assert evs[-1][1:5] == ("run_finished", None, "running", "cancelled")

    # The worker of the cancelled generation: its heartbeat fails, its completion is rejected.
    with transaction.atomic():
        assert task_runs.heartbeat_many(leases=[(dr.task_run_id, 1)], lease_seconds=30) == set()
    res = complete(dr.task_run_id, 1, output={"x": 1})
    assert res.accepted is False
    r = task_run(run_id, "run")
    assert (r.state, r.fencing_token, r.output) == ("cancelled", 2, None)
    assert events(run_id)[-1][1] == "stale_completion_rejected"
    assert events(run_id)[-1][7]["current_fencing_token"] == 2
    assert run_row(run_id).state == "cancelled"
    assert claim() == []

    # Cancelling again: already finished, nothing changes.
    seq = run_row(run_id).last_event_seq
    with transaction.atomic():
        assert runs.cancel(workflow_run_id=run_id, reason="again") is False
    assert run_row(run_id).last_event_seq == seq
    assert run_row(run_id).error == "user asked"
    assert_gap_free(run_id)


@pytest.mark.django_db
def test_cancel_of_finished_run_returns_false_and_changes_nothing(org, make_workflow):
    wf = make_workflow(org, [{"key": "only", "type": "noop"}])
    run_id = start(wf)
    (d,) = claim()
    assert run_claimed(d).run_state == "succeeded"
    before = run_row(run_id)
    with transaction.atomic():
        assert runs.cancel(workflow_run_id=run_id, reason="too late") is False
    after = run_row(run_id)
    assert (after.state, after.finished_at, after.error, after.last_event_seq) == (
        "succeeded", before.finished_at, "", before.last_event_seq,
    )
    assert task_run(run_id, "only").state == "succeeded"
    assert "cancelled" not in kinds(run_id)


# --- event sequence ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_event_seq_is_gap_free_and_unique_across_a_whole_run(org, make_workflow):
    wf = make_workflow(
        org,
        [
            {"key": "a", "type": "noop"},
            {"key": "b", "type": "fail", "depends_on": ["a"], "max_attempts": 2, "retry_backoff_seconds": 0},
            {"key": "c", "type": "noop", "depends_on": ["a"]},
            {"key": "d", "type": "noop", "depends_on": ["b", "c"]},
        ],
    )
    run_id = start(wf)
    other_run = start(wf)  # a second run's events are numbered independently
    (da,) = claim(ids=[task_run(run_id, "a").pk])
    start_attempt(da.task_run_id, 1)
    start_attempt(da.task_run_id, 1)  # duplicate delivery
    res = complete(da.task_run_id, 1)
    disp = {d.task_run_id: d for d in res.dispatches}
    db_ = disp[task_run(run_id, "b").pk]
    dc = disp[task_run(run_id, "c").pk]
    start_attempt(db_.task_run_id, 1)
    complete(db_.task_run_id, 1, succeeded=False, error="first")  # retry
    complete(db_.task_run_id, 1, claim=False)  # stale: and nothing claims the retry meanwhile
    (db2,) = claim(ids=[db_.task_run_id])
    run_claimed(db2)
    force_lease_expired(dc.task_run_id)  # c's dispatch got lost
    expire(dc.task_run_id, 1)
    (dc2,) = claim(ids=[dc.task_run_id])
    (dd,) = run_claimed(dc2).dispatches
    assert run_claimed(dd).run_state == "succeeded"

    seqs = assert_gap_free(run_id)
    assert len(seqs) == len(set(seqs))
    assert (
        TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id).values("seq")
        .annotate(n=Count("id")).filter(n__gt=1).count() == 0
    )
    evs = events(run_id)
    assert evs[0][1] == "run_started" and evs[-1][1] == "run_finished"
    assert [e[1] for e in evs if e[2] == "a"] == ["claimed", "started", "duplicate_delivery_ignored", "succeeded"]
    assert [e[1] for e in evs if e[2] == "d"] == ["promoted", "claimed", "started", "succeeded"]
    assert len(evs) == 1 + 4 + 8 + 6 + 4 + 1
    assert [e[1] for e in evs if e[2] == "b"] == [
        "promoted", "claimed", "started", "attempt_failed", "stale_completion_rejected", "claimed", "started",
        "succeeded",
    ]
    assert [e[1] for e in evs if e[2] == "c"] == [
        "promoted", "claimed", "dispatch_expired", "claimed", "started", "succeeded",
    ]
    # Numbered on its own from 1 (its run_started, and the claim of its root "a" that a
    # completion batch of the same organization may have made room for).
    assert assert_gap_free(other_run)[0] == 1
    assert kinds(other_run) in (["run_started"], ["run_started", "claimed"])


# --- NUL bytes ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_completion_output_with_nul_is_stored_without_it(org, make_workflow):
    wf = make_workflow(org, [{"key": "n", "type": "noop"}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    res = complete(d.task_run_id, 1, output={"text": "a\u0000b", "k\u0000ey": ["x\u0000"]})
    assert res.accepted and res.state == "succeeded"
    assert task_run(run_id, "n").output == {"text": "ab", "key": ["x"]}


@pytest.mark.django_db
def test_failure_error_with_nul_is_stored_without_it(org, make_workflow):
    wf = make_workflow(org, [{"key": "n", "type": "noop", "max_attempts": 1}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    res = complete(d.task_run_id, 1, succeeded=False, error="bad\u0000thing")
    assert res.accepted and res.state == "failed"
    assert task_run(run_id, "n").error == "badthing"
    assert events(run_id)[-2][7]["error"] == "badthing"


@pytest.mark.django_db
def test_completion_output_with_lone_surrogate_is_stored(org, make_workflow):
    # e.g. text decoded with errors="surrogateescape" (subprocess output, os.fsdecode)
    wf = make_workflow(org, [{"key": "n", "type": "noop"}])
    run_id = start(wf)
    (d,) = claim()
    start_attempt(d.task_run_id, 1)
    res = complete(d.task_run_id, 1, output={"text": "a\udcffb"})
    assert res.accepted and res.state == "succeeded"
    assert task_run(run_id, "n").output["text"] == "a\ufffdb"


# --- concurrency -----------------------------------------------------------------------------------


def _in_thread(fn, barrier, results, errors, idx):
    try:
        barrier.wait(timeout=30)
        results[idx] = fn()
    except BaseException as exc:  # noqa: BLE001 - surfaced by the test
        errors.append(exc)
    finally:
        connection.close()


def _run_threads(fns):
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)
    errors: list = []
    threads = [
        threading.Thread(target=_in_thread, args=(fn, barrier, results, errors, i)) for i, fn in enumerate(fns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_claim_the_same_task_run_twice(org, make_workflow):
    # Room for all 200 (the free plan's would stop the claims at 64 claimed-not-started).
    Organization.objects.filter(pk=org.pk).update(weight_override=100, max_running_task_runs_override=1000)
    wf = make_workflow(org, [{"key": f"t{i:03d}", "type": "noop"} for i in range(100)])
    runs = [start(wf), start(wf)]
    assert TaskRun.objects.unscoped().filter(state="ready").count() == 200

    def claimer(owner):
        def loop():
            got = []
            while True:
                batch = claim(limit=7, owner=owner)
                if not batch:
                    return got
                got.extend(batch)

        return loop

    results = _run_threads([claimer("s1"), claimer("s2")])
    ids1 = [d.task_run_id for d in results[0]]
    ids2 = [d.task_run_id for d in results[1]]
    assert len(ids1) == len(set(ids1)) and len(ids2) == len(set(ids2))
    assert set(ids1).isdisjoint(ids2)
    assert len(ids1) + len(ids2) == 200
    assert all(d.fencing_token == 1 and d.outbox_id is not None for d in results[0] + results[1])

    assert TaskRun.objects.unscoped().filter(state="running", fencing_token=1).count() == 200
    assert OutboxMessage.objects.unscoped().count() == 200
    assert (
        OutboxMessage.objects.unscoped().values("task_run_id", "fencing_token_snapshot").distinct().count() == 200
    )
    owners = dict(TaskRun.objects.unscoped().values_list("id", "lease_owner"))
    assert all(owners[i] == "s1" for i in ids1) and all(owners[i] == "s2" for i in ids2)
    for run_id in runs:
        seqs = assert_gap_free(run_id)
        assert len(seqs) == 101  # run_started + 100 claims
    assert TaskRunEvent.objects.unscoped().filter(kind="claimed").count() == 200


@pytest.mark.django_db(transaction=True)
def test_concurrent_completion_of_fan_in_parents_promotes_child_exactly_once(org, make_workflow):
    wf = make_workflow(
        org,
        [
            {"key": "left", "type": "noop"},
            {"key": "right", "type": "noop"},
            {"key": "join", "type": "noop", "depends_on": ["left", "right"]},
        ],
    )
    for _ in range(20):
        run_id = start(wf)
        dispatches = claim(ids=[task_run(run_id, "left").pk, task_run(run_id, "right").pk])
        assert len(dispatches) == 2
        for d in dispatches:
            assert start_attempt(d.task_run_id, d.fencing_token) is not None

        results = _run_threads(
            [lambda d=d: complete(d.task_run_id, d.fencing_token, output={"id": str(d.task_run_id)})
             for d in dispatches]
        )
        assert all(r.accepted and r.state == "succeeded" for r in results)
        join = task_run(run_id, "join")
        promoting = [r for r in results if r.dispatches]
        assert len(promoting) == 1
        (dj,) = promoting[0].dispatches
        assert dj.task_run_id == join.pk and dj.fencing_token == 1 and dj.outbox_id is not None
        assert join.state == "running" and join.fencing_token == 1
        assert kinds(run_id, "join") == ["promoted", "claimed"]
        assert OutboxMessage.objects.unscoped().filter(task_run_id=join.pk).count() == 1
        assert_gap_free(run_id)


@pytest.mark.django_db(transaction=True)
def test_a_success_of_a_task_nothing_depends_on_skips_the_promote_statement(org, make_workflow):
    """``StartedAttempt.has_dependents`` says whether a success can promote anything; a
    batch of successes none of which has dependents runs only the succeed and finish
    statements, and the run still finishes. A task with dependents still promotes."""
    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf)
    connection.close()  # a fresh connection: no statement prepared yet

    def prepared_promotes() -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s",
                        [driver.prepared_form(queries["task_run_promote_dependents"])[0]])
            return cur.fetchone()[0]

    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="test")
    (started_a,) = engine_helpers.start_attempts([types.StartRequest(a.task_run_id, a.fencing_token, "w")],
                                              lease_seconds=60)
    assert started_a.task_key == "a" and started_a.has_dependents is True
    results, (b,) = engine_helpers.complete_successes(
        [types.SuccessRequest(a.task_run_id, a.fencing_token, None, started_a.has_dependents)],
        lease_seconds=60, owner="test")
    assert results[0].accepted and results[0].run_state is None
    assert prepared_promotes() == 1
    connection.close()
    (started_b,) = engine_helpers.start_attempts([types.StartRequest(b.task_run_id, b.fencing_token, "w")],
                                              lease_seconds=60)
    assert started_b.task_key == "b" and started_b.has_dependents is False
    results, claimed = engine_helpers.complete_successes(
        [types.SuccessRequest(b.task_run_id, b.fencing_token, {"n": 1}, started_b.has_dependents)],
        lease_seconds=60, owner="test")
    assert claimed == ()
    assert (results[0].accepted, results[0].state, results[0].run_state) == (True, "succeeded", "succeeded")
    assert prepared_promotes() == 0
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_the_start_of_a_continuation_stamps_its_reserved_outbox_row_and_a_stale_one_does_not(org, make_workflow):
    """A dependent its own thread continues with gets no message: its outbox row stays
    reserved and unpublished after the claim, and the start (StartRequest.outbox_id)
    stamps it, in the start's transaction; a start that is refused stamps nothing, so the
    relay still sends the row once the reservation has passed."""
    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]},
                             {"key": "c", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf)
    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="test")
    (started_a,) = engine_helpers.start_attempts([types.StartRequest(a.task_run_id, a.fencing_token, "w")],
                                              lease_seconds=60)
    _results, claimed = engine_helpers.complete_successes(
        [types.SuccessRequest(a.task_run_id, a.fencing_token, None, started_a.has_dependents)],
        lease_seconds=60, owner="test", reserve_seconds=5.0)
    b, c = sorted(claimed, key=lambda d: TaskRun.objects.unscoped().get(pk=d.task_run_id).task.key)
    rows = {m.pk: m for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run.pk,
                                                                      pk__in=[b.outbox_id, c.outbox_id])}
    assert all(m.published_at is None and m.next_attempt_at is not None for m in rows.values())

    started = engine_helpers.start_attempts(
        [types.StartRequest(b.task_run_id, b.fencing_token, "w", outbox_id=b.outbox_id),
         types.StartRequest(c.task_run_id, c.fencing_token + 1, "w", outbox_id=c.outbox_id)],  # stale
        lease_seconds=60)
    assert started[0] is not None and started[1] is None
    stamped = OutboxMessage.objects.unscoped().get(pk=b.outbox_id)
    assert stamped.published_at is not None and stamped.publish_attempts == 1 and stamped.next_attempt_at is None
    untouched = OutboxMessage.objects.unscoped().get(pk=c.outbox_id)
    assert untouched.published_at is None and untouched.publish_attempts == 0


@pytest.mark.django_db(transaction=True)
def test_an_output_with_quotes_backslashes_and_sql_is_stored_exactly(org, make_workflow):
    """The hot transactions send their parameters as literals in one query string
    (``driver.run_prepared``): an output full of quoting hazards is stored as given."""
    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf)
    tricky = {"q": "it's \\ \"x\"; COMMIT; DROP TABLE core_taskrun; --", "e": "E'\\x00'", "u": "ü 😀 $1 %(ids)s",
              "n": [1.5, None, True], "nested": {"'": "''"}}
    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="te'st")
    engine_helpers.start_attempts([types.StartRequest(a.task_run_id, a.fencing_token, "w'; --")],
                               lease_seconds=60)
    results, _ = engine_helpers.complete_successes(
        [types.SuccessRequest(a.task_run_id, a.fencing_token, tricky, False)], lease_seconds=60, owner="t")
    assert results[0].accepted and results[0].run_state == "succeeded"
    row = TaskRun.objects.unscoped().get(pk=a.task_run_id)
    assert row.output == tricky
    assert TaskRunEvent.objects.unscoped().get(task_run_id=a.task_run_id, kind="started").detail == {"worker": "w'; --"}
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db
def test_the_hot_path_literals_read_back_as_the_values_they_render():
    """``driver._literal`` (the EXECUTE arguments of ``driver.run_prepared``) renders what
    PostgreSQL reads back as the same value, quoting hazards included; kinds it does not
    render itself go through psycopg's mogrify."""
    import psycopg

    from engine.repositories.driver import _literal

    u = uuid.uuid4()
    cases = [
        ("it's \\ \"x\"; COMMIT; --", "text"),
        ("ü 😀 $1 %(ids)s E'\\x41'", "text"),
        (["a'b", 'c"d', "e\\f", "{g,h}", "NULL", None, "", " sp "], "text[]"),
        ([u, None], "uuid[]"),
        ([1, -2, 2**40], "bigint[]"),
        ([], "text[]"),
        (1.5, "float8"),
        (1e-7, "float8"),
        (-3, "bigint"),
        (True, "boolean"),
        (None, "text"),
        (u, "uuid"),
        ([True, False], "boolean[]"),  # not rendered here: mogrify's
        (float("inf"), "float8"),  # likewise
    ]
    connection.ensure_connection()
    literal = psycopg.ClientCursor(connection.connection)
    with connection.cursor() as cur:
        for value, sql_type in cases:
            cur.execute(f"SELECT {_literal(value, literal)}::{sql_type}")
            assert cur.fetchone()[0] == value, (value, sql_type)
    assert _literal(["x"], literal) == "'{\"x\"}'" and _literal(u, literal) == f"'{u}'"
    with pytest.raises(psycopg.DataError):  # a NUL is refused, never cut short
        _literal("a\x00b", literal)


@pytest.mark.django_db(transaction=True)
def test_the_hot_path_renders_its_own_arguments_without_mogrify(org, make_workflow, monkeypatch):
    """With standard_conforming_strings on (PostgreSQL's default), a claim, a start and a
    success render every argument with ``_literal``: psycopg's mogrify is never called."""
    import psycopg

    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf)

    def refuse(*args, **kwargs):
        raise AssertionError("mogrify called on the hot path")

    monkeypatch.setattr(psycopg.ClientCursor, "mogrify", refuse)
    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="o")
    (started,) = engine_helpers.start_attempts([types.StartRequest(a.task_run_id, a.fencing_token, "w")],
                                            lease_seconds=60)
    results, _ = engine_helpers.complete_successes(
        [types.SuccessRequest(a.task_run_id, a.fencing_token, {"x": "it's"}, False)], lease_seconds=60,
        owner="o")
    assert started is not None and results[0].accepted and results[0].run_state == "succeeded"
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"
