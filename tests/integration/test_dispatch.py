"""Dispatch under delivery faults on real processes: a message delivered twice, two
schedulers racing, a message lost in the broker after the relay stamped it."""

from __future__ import annotations

import re
import sys
import time
from collections import Counter

import pytest
from django.db.models import Count
from django.utils import timezone

from engine import actors
from engine.models import OutboxMessage, TaskRun, TaskRunEvent
from engine.services import start_run
from flowforge.stack import wait_until
from tenancy.models import Organization
from tests.integration.conftest import wait_for_run_terminal
from tests.integration.helpers import (
    assert_gap_free,
    claim_in_process,
    create_run_without_nudge,
    events,
    outbox_rows,
    task_runs_by_key,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_same_outbox_message_delivered_twice_starts_the_task_once(stack, org, make_workflow):
    wf = make_workflow(org, [{"key": "nap", "type": "sleep", "config": {"seconds": 0.5}}], name="twice")
    run = create_run_without_nudge(wf)
    nap = task_runs_by_key(org, run)["nap"]

    # The dispatch lease only has to cover the time until a worker starts the attempt;
    # 30 s keeps the reaper away while the worker processes boot.
    dispatch = claim_in_process(nap.pk, lease_seconds=30, owner="test")
    assert dispatch.fencing_token == 1 and dispatch.attempt == 1 and dispatch.outbox_id is not None
    # This test is the relay: the row counts as published, and the broker delivers it twice.
    OutboxMessage.objects.for_organization(org).filter(pk=dispatch.outbox_id).update(
        published_at=timezone.now(), publish_attempts=1
    )
    actors.execute_task_run.send(str(nap.pk), dispatch.fencing_token)
    actors.execute_task_run.send(str(nap.pk), dispatch.fencing_token)

    # Two worker processes, so the two deliveries race for the start.
    stack.start_worker(processes=2, threads=2)
    stack.start_clock()

    assert wait_for_run_terminal(run, timeout=30) == "succeeded"

    def both_handled():
        ignored = [
            e
            for e in events(org, task_run=nap)
            if e.kind in ("duplicate_delivery_ignored", "stale_dispatch_ignored")
        ]
        return ignored or None

    ignored = wait_until(both_handled, timeout=10, what="the second delivery to be recorded")
    time.sleep(1.0)  # nothing else may arrive
    nap.refresh_from_db()
    assert nap.state == "succeeded" and nap.attempt == 1 and nap.fencing_token == 1
    assert nap.started_fencing_token == 1
    assert nap.output == {"slept_seconds": 0.5}
    started = events(org, task_run=nap, kind="started")
    assert [(e.attempt, e.fencing_token) for e in started] == [(1, 1)]
    ignored = [
        e
        for e in events(org, task_run=nap)
        if e.kind in ("duplicate_delivery_ignored", "stale_dispatch_ignored")
    ]
    assert len(ignored) == 1, [(e.kind, e.detail) for e in ignored]
    assert ignored[0].fencing_token == 1
    assert ignored[0].detail["message_fencing_token"] == 1 and ignored[0].detail["current_fencing_token"] == 1
    assert len(events(org, task_run=nap, kind="succeeded")) == 1
    assert events(org, task_run=nap, kind="stale_completion_rejected") == []
    # No second generation was ever made: one claim, one outbox row.
    assert len(events(org, task_run=nap, kind="claimed")) == 1
    assert [o.fencing_token_snapshot for o in outbox_rows(org, nap)] == [1]
    assert_gap_free(org, run)


SCHEDULER_SNIPPET = (
    "import django, os, time\n"
    "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.settings')\n"
    "django.setup()\n"
    "from engine.scheduler import schedule_once\n"
    "from engine.repositories import task_runs\n"
    "task_runs.claim_ready_many  # imported before the barrier\n"
    "start_at = float(os.environ['START_AT'])\n"
    "time.sleep(max(0.0, start_at - time.time()))\n"
    "print('CLAIMED', schedule_once(limit=25, max_batches=100), flush=True)\n"
)


def test_two_schedulers_at_once_create_one_outbox_row_per_generation(stack, org, make_workflow, settings):
    # Room for all 450 at once (the free plan's would stop the claims at 64): the claims'
    # organization lock serializes the two schedulers' batches, each claims some of them.
    # The runs are started as with FLOWFORGE_CLAIM_ON_START off: their roots are left to
    # the schedulers (this test is their race).
    settings.FLOWFORGE_CLAIM_ON_START = False
    Organization.objects.filter(pk=org.pk).update(weight_override=100, max_running_task_runs_override=10_000)
    wf = make_workflow(org, [{"key": f"t{i:03d}", "type": "noop"} for i in range(150)], name="wide")
    runs = [start_run(workflow=wf, run_input={"i": i}) for i in range(3)]
    run_ids = [r.pk for r in runs]
    assert (
        TaskRun.objects.for_organization(org).filter(workflow_run__in=run_ids, state="ready").count() == 450
    )

    # Both processes set Django up first, then start claiming at the same instant.
    env = dict(stack.env, START_AT=str(time.time() + 4.0))
    stack.env = env
    s1 = stack.start("sched1", [sys.executable, "-c", SCHEDULER_SNIPPET])
    s2 = stack.start("sched2", [sys.executable, "-c", SCHEDULER_SNIPPET])
    assert s1.popen.wait(40) == 0 and s2.popen.wait(40) == 0

    counts = []
    for proc in (s1, s2):
        found = re.findall(r"^CLAIMED (\d+)$", proc.log_path.read_text(), flags=re.M)
        assert len(found) == 1, proc.log_path.read_text()
        counts.append(int(found[0]))
    assert sum(counts) == 450, counts
    # Both really raced (each claimed part of the work).
    assert all(c > 0 for c in counts), counts

    trs = TaskRun.objects.for_organization(org).filter(workflow_run__in=run_ids)
    assert trs.count() == 450
    assert set(trs.values_list("state", flat=True)) == {"running"}
    assert set(trs.values_list("fencing_token", flat=True)) == {1}
    assert set(trs.values_list("attempt", flat=True)) == {1}
    outbox = OutboxMessage.objects.for_organization(org).filter(workflow_run__in=run_ids)
    assert outbox.count() == 450
    pairs = Counter(outbox.values_list("task_run_id", "fencing_token_snapshot"))
    assert len(pairs) == 450 and max(pairs.values()) == 1
    assert set(pairs) == {(tr_id, 1) for tr_id in trs.values_list("id", flat=True)}
    claimed = TaskRunEvent.objects.for_organization(org).filter(workflow_run__in=run_ids, kind="claimed")
    assert claimed.count() == 450
    assert max(claimed.values("task_run_id").annotate(n=Count("id")).values_list("n", flat=True)) == 1
    owners = Counter(claimed.values_list("detail__lease_owner", flat=True))
    assert len(owners) == 2 and sorted(owners.values()) == sorted(counts), (owners, counts)
    # The schedulers published what they claimed (inline publish after each batch's commit).
    assert outbox.filter(published_at__isnull=True).count() == 0

    stack.start_worker(processes=2, threads=8)
    stack.start_clock()
    for run in runs:
        assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    assert set(trs.values_list("state", flat=True)) == {"succeeded"}
    assert (
        TaskRunEvent.objects.for_organization(org).filter(workflow_run__in=run_ids, kind="succeeded").count()
        == 450
    )
    # Every task run started exactly once, whatever generation it ended on.
    started = TaskRunEvent.objects.for_organization(org).filter(workflow_run__in=run_ids, kind="started")
    assert started.count() == 450
    pairs = Counter(
        OutboxMessage.objects.for_organization(org)
        .filter(workflow_run__in=run_ids)
        .values_list("task_run_id", "fencing_token_snapshot")
    )
    assert max(pairs.values()) == 1
    for run in runs:
        assert_gap_free(org, run)


def test_lost_broker_message_is_recovered_from_the_database(stack, org, make_workflow):
    wf = make_workflow(org, [{"key": "only", "type": "noop"}], name="lost")
    run = create_run_without_nudge(wf)
    only = task_runs_by_key(org, run)["only"]

    dispatch = claim_in_process(only.pk, lease_seconds=3, owner="test")
    assert dispatch.fencing_token == 1 and dispatch.outbox_id is not None
    # The relay "published" it and the broker lost it: stamped, never delivered.
    OutboxMessage.objects.for_organization(org).filter(pk=dispatch.outbox_id).update(
        published_at=timezone.now(), publish_attempts=1
    )

    stack.start_worker(processes=1, threads=4)
    stack.start_clock()

    assert wait_for_run_terminal(run, timeout=30) == "succeeded"
    only.refresh_from_db()
    assert only.state == "succeeded"
    assert only.attempt == 1  # a dispatch that never started uses no attempt
    assert only.started_fencing_token == only.fencing_token

    (expired,) = events(org, task_run=only, kind="dispatch_expired")
    assert (expired.from_state, expired.to_state, expired.attempt) == ("running", "ready", 1)
    assert expired.fencing_token == 2  # bumped past the lost generation
    claims = events(org, task_run=only, kind="claimed")
    assert [(c.fencing_token, c.detail["lease_owner"]) for c in claims][0] == (1, "test")
    assert [c.fencing_token for c in claims] == [1, 3]
    assert claims[1].detail["lease_owner"].startswith("scheduler@")
    assert [(e.attempt, e.fencing_token) for e in events(org, task_run=only, kind="started")] == [(1, 3)]
    assert only.fencing_token == 3
    assert len(events(org, task_run=only, kind="succeeded")) == 1
    assert events(org, task_run=only, kind="lease_expired") == []
    assert events(org, task_run=only, kind="attempt_failed") == []
    # The expiry happened no sooner than the 3 s dispatch lease.
    (first_claim,) = [c for c in claims if c.fencing_token == 1]
    assert (expired.created_at - first_claim.created_at).total_seconds() >= 3.0
    rows = outbox_rows(org, only)
    assert [(o.fencing_token_snapshot, o.attempt_snapshot) for o in rows] == [(1, 1), (3, 1)]
    assert all(o.published_at is not None for o in rows)
    assert_gap_free(org, run)
