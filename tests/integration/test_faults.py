"""Faults on real worker processes: a task that always fails, a worker killed with
SIGKILL mid-task, and a paused worker whose late completion must be rejected.

Leases are 3 s and heartbeats 0.5 s in the spawned processes (see conftest.py).
"""

from __future__ import annotations

import signal

import pytest

from engine.models import TaskRun
from engine.services import start_run
from flowforge.stack import worker_child_pids
from tests.integration.conftest import wait_for_run_terminal
from tests.integration.helpers import (
    assert_gap_free,
    events,
    outbox_rows,
    owner_pid,
    signal_pid,
    task_runs_by_key,
    wait_for_event,
    wait_started,
    wait_worker_children,
    worker_process_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_task_that_always_fails_is_retried_max_attempts_then_run_fails_and_downstream_skipped(
    stack, org, make_workflow
):
    wf = make_workflow(
        org,
        [
            {
                "key": "a",
                "type": "fail",
                "config": {"message": "boom"},
                "max_attempts": 3,
                "retry_backoff_seconds": 0.1,
            },
            {"key": "b", "type": "noop", "depends_on": ["a"]},
            {"key": "c", "type": "noop", "depends_on": ["b"]},
            {"key": "d", "type": "noop"},
        ],
        name="always-fails",
    )
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    run = start_run(workflow=wf)

    assert wait_for_run_terminal(run, timeout=30) == "failed"
    run.refresh_from_db()
    assert run.error == "task a failed"

    trs = task_runs_by_key(org, run)
    a = trs["a"]
    assert a.state == "failed"
    assert a.attempt == 3
    assert "RuntimeError: boom (attempt 3)" in a.error
    assert a.lease_owner is None and a.lease_expires_at is None and a.not_before is None
    assert a.finished_at is not None
    # One claim per attempt: tokens 1, 2, 3; the last generation is the one that started.
    assert a.fencing_token == 3 and a.started_fencing_token == 3
    assert trs["b"].state == "skipped" and trs["c"].state == "skipped"
    assert trs["b"].started_at is None and trs["c"].started_at is None
    assert trs["d"].state == "succeeded"

    started = events(org, task_run=a, kind="started")
    assert [(e.attempt, e.fencing_token) for e in started] == [(1, 1), (2, 2), (3, 3)]
    failures = [e for e in events(org, task_run=a) if e.kind in ("attempt_failed", "failed")]
    assert [(e.kind, e.from_state, e.to_state, e.attempt, e.fencing_token) for e in failures] == [
        ("attempt_failed", "running", "ready", 1, 1),
        ("attempt_failed", "running", "ready", 2, 2),
        ("attempt_failed", "running", "failed", 3, 3),
    ]
    assert [e.detail["error"] for e in failures] == [f"RuntimeError: boom (attempt {n})" for n in (1, 2, 3)]
    # The retries waited for their backoff (0.1 s, then 0.2 s) before being claimed again.
    claims = events(org, task_run=a, kind="claimed")
    assert len(claims) == 3
    for failure, claim, backoff in zip(failures[:2], claims[1:], (0.1, 0.2), strict=True):
        assert (claim.created_at - failure.created_at).total_seconds() >= backoff - 0.01
    # One outbox row per generation.
    assert sorted(o.fencing_token_snapshot for o in outbox_rows(org, a)) == [1, 2, 3]
    assert [
        o.attempt_snapshot for o in sorted(outbox_rows(org, a), key=lambda o: o.fencing_token_snapshot)
    ] == [1, 2, 3]

    skipped = [e for e in events(org, run=run, kind="skipped")]
    assert {e.task_run_id for e in skipped} == {trs["b"].pk, trs["c"].pk}
    assert all(e.detail == {"reason": "upstream_failed"} for e in skipped)
    assert len(events(org, task_run=trs["d"], kind="succeeded")) == 1
    finished = events(org, run=run, kind="run_finished")
    assert [(e.to_state, e.task_run_id) for e in finished] == [("failed", None)]
    assert_gap_free(org, run)


def test_worker_killed_with_sigkill_mid_task_loses_lease_and_run_succeeds(stack, org, make_workflow):
    wf = make_workflow(
        org,
        [
            {
                "key": "slow",
                "type": "sleep",
                "config": {"seconds": 4},
                "max_attempts": 2,
                "retry_backoff_seconds": 0.1,
            },
            {"key": "after", "type": "noop", "depends_on": ["slow"]},
        ],
        name="killed",
    )
    w1 = stack.start_worker("w1", processes=1, threads=2)
    w2 = stack.start_worker("w2", processes=1, threads=2)
    wait_worker_children([w1, w2])
    stack.start_clock()
    run = start_run(workflow=wf)
    slow = task_runs_by_key(org, run)["slow"]

    first = wait_started(org, slow.pk, timeout=20)
    assert first.attempt == 1 and first.fencing_token == 1
    pid = owner_pid(first.lease_owner)
    victim = worker_process_of(pid, [w1, w2])
    survivor = w2 if victim is w1 else w1
    assert worker_child_pids(victim.pid) == [pid]
    signal_pid(pid, signal.SIGKILL)

    assert wait_for_run_terminal(run, timeout=30) == "succeeded"
    assert survivor.alive()

    trs = task_runs_by_key(org, run)
    slow, after = trs["slow"], trs["after"]
    assert slow.state == "succeeded" and after.state == "succeeded"
    assert slow.attempt == 2
    assert slow.output == {"slept_seconds": 4.0}
    # The surviving worker ran the second attempt.
    assert slow.started_fencing_token == slow.fencing_token
    (second_start,) = [e for e in events(org, task_run=slow, kind="started") if e.attempt == 2]
    assert owner_pid(second_start.detail["worker"]) in worker_child_pids(survivor.pid)

    (reaped,) = events(org, task_run=slow, kind="lease_expired")
    assert (reaped.from_state, reaped.to_state, reaped.attempt) == ("running", "ready", 1)
    # The reaper bumped the token past the killed generation.
    assert reaped.fencing_token == first.fencing_token + 1
    assert "stopped heartbeating" in reaped.detail["error"]
    started = events(org, task_run=slow, kind="started")
    assert [e.attempt for e in started] == [1, 2]
    tokens = [e.fencing_token for e in started]
    assert len(set(tokens)) == 2 and tokens[0] == first.fencing_token and tokens[1] == slow.fencing_token
    assert tokens[1] > reaped.fencing_token
    assert len(events(org, task_run=slow, kind="succeeded")) == 1
    assert events(org, task_run=slow, kind="stale_completion_rejected") == []
    rows = outbox_rows(org, slow)
    snapshots = [o.fencing_token_snapshot for o in rows]
    assert len(rows) == 2 and len(set(snapshots)) == 2
    assert set(snapshots) == set(tokens)
    assert [o.attempt_snapshot for o in rows] == [1, 2]
    assert all(o.published_at is not None for o in rows)
    assert_gap_free(org, run)


def test_stale_completion_from_a_paused_worker_is_rejected_and_recorded(stack, org, make_workflow):
    wf = make_workflow(
        org,
        [
            {
                "key": "slow",
                "type": "sleep",
                "config": {"seconds": 2},
                "max_attempts": 2,
                "retry_backoff_seconds": 0.1,
            }
        ],
        name="paused",
    )
    w1 = stack.start_worker("w1", processes=1, threads=2)
    w2 = stack.start_worker("w2", processes=1, threads=2)
    wait_worker_children([w1, w2])
    stack.start_clock()
    run = start_run(workflow=wf)
    slow_id = task_runs_by_key(org, run)["slow"].pk

    first = wait_started(org, slow_id, timeout=20)
    pid = owner_pid(first.lease_owner)
    paused = worker_process_of(pid, [w1, w2])
    signal_pid(pid, signal.SIGSTOP)
    try:
        # Its heartbeats stop: the reaper takes the lease back, the other worker runs attempt 2.
        assert wait_for_run_terminal(run, timeout=30) == "succeeded"
        before = TaskRun.objects.for_organization(org).get(pk=slow_id)
        assert before.state == "succeeded" and before.attempt == 2
        assert before.fencing_token > first.fencing_token
        assert events(org, task_run=before, kind="stale_completion_rejected") == []
    finally:
        signal_pid(pid, signal.SIGCONT)

    rejected = wait_for_event(org, task_run=before, kind="stale_completion_rejected", timeout=15)
    after = TaskRun.objects.for_organization(org).get(pk=slow_id)
    assert rejected.detail["completion_fencing_token"] == first.fencing_token
    assert rejected.detail["current_fencing_token"] == before.fencing_token
    assert rejected.detail["completion_fencing_token"] < rejected.detail["current_fencing_token"]
    assert rejected.detail["state"] == "succeeded"
    assert rejected.fencing_token == first.fencing_token
    assert (rejected.from_state, rejected.to_state) == ("succeeded", "succeeded")
    # The stale completion changed nothing on the row.
    fields = (
        "state",
        "attempt",
        "fencing_token",
        "started_fencing_token",
        "output",
        "error",
        "finished_at",
        "lease_owner",
        "lease_expires_at",
    )
    assert {f: getattr(after, f) for f in fields} == {f: getattr(before, f) for f in fields}
    run.refresh_from_db()
    assert run.state == "succeeded"
    # The paused process survives its pause; its late completion came from it.
    assert paused.alive() and worker_child_pids(paused.pid) == [pid]

    (reaped,) = events(org, task_run=after, kind="lease_expired")
    assert (reaped.to_state, reaped.attempt, reaped.fencing_token) == ("ready", 1, first.fencing_token + 1)
    assert len(events(org, task_run=after, kind="succeeded")) == 1
    started = events(org, task_run=after, kind="started")
    assert [(e.attempt, e.fencing_token) for e in started] == [
        (1, first.fencing_token),
        (2, after.fencing_token),
    ]
    assert owner_pid(started[1].detail["worker"]) != pid
    assert len(events(org, task_run=after, kind="stale_completion_rejected")) == 1
    assert_gap_free(org, run)
