"""Issue 17 with real PostgreSQL, Redis and Dramatiq worker processes: a new run's roots
are claimed by the start itself and reach an idle worker without a poll; a start whose
process dies between its commit and its publish still runs, through the relay.

Latencies are read from the event log (the database's clock) and compared with each
other, never with a wall-clock constant.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import pytest
from django.conf import settings

from engine.dispatch import INLINE_PUBLISH_RESERVATION_SECONDS
from engine.models import OutboxMessage, TaskRunEvent, WorkflowRun
from engine.services import start_run
from flowforge.stack import wait_until
from tests.integration.conftest import wait_for_run_terminal
from tests.integration.helpers import wait_worker_children


def _start_to_first_start_ms(run) -> float:
    started = TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run=run, kind="started").order_by("created_at").first()
    return (started.created_at - run.created_at).total_seconds() * 1000


@pytest.mark.alone  # compares the start latency after an idle gap with the busy one
def test_a_new_runs_roots_are_claimed_by_its_start_and_an_idle_worker_takes_them_without_polling(
    stack, org, make_workflow
):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}],
                       name="quick")
    worker = stack.start_worker("w", processes=1, threads=2)
    wait_worker_children([worker])
    # No clock: nothing but the start's own publish and the worker's wake-up moves the run.
    latencies = []
    for gap in (0.0, 0.0, 1.5, 0.0, 1.5):
        time.sleep(gap)  # idle gaps: an upstream consumer has backed off by then
        run = start_run(workflow=wf)
        assert wait_for_run_terminal(run, timeout=20) == "succeeded"
        (claimed,) = TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run=run, kind="claimed", task_run__task__key="a")
        # Claimed by the process that started the run, in its transaction: no scheduler hop.
        assert claimed.detail["lease_owner"].startswith("start@")
        assert claimed.created_at - run.created_at < (
            TaskRunEvent.objects.for_organization(run.organization_id).get(workflow_run=run, kind="started", task_run__task__key="a").created_at
            - run.created_at)
        latencies.append(_start_to_first_start_ms(run))
    # An idle consumer is woken by the enqueue: after 1.5 s idle (an upstream consumer
    # polls every 1 s by then) the start is as quick as right after another run, within
    # a factor that leaves room for this shared machine's noise but not for a 1 s poll.
    busy = statistics.median([latencies[0], latencies[1], latencies[3]])
    after_idle = max(latencies[2], latencies[4])
    assert after_idle < max(10 * busy, busy + 100), latencies


def test_a_start_whose_process_dies_before_publishing_still_runs_through_the_relay(
    stack, stack_env, org, make_workflow
):
    wf = make_workflow(org, [{"key": "only", "type": "noop"}], name="orphaned-start")
    worker = stack.start_worker("w", processes=1, threads=2)
    wait_worker_children([worker])
    stack.start_clock()  # its relay drains unpublished outbox rows every second
    # A separate "web" process commits the start (the run, its claimed root, the outbox
    # row) and is killed at its publish, before the message reaches the broker.
    script = (
        "import django; django.setup()\n"
        "from engine.models import Workflow\n"
        "from engine.services import start_run\n"
        f"run = start_run(workflow=Workflow.objects.unscoped().get(pk='{wf.pk}'))\n"
        "print('unreachable: the publish should have killed this process')\n"
    )
    # (Its dispatch lease longer than the publish reservation, as a deployment's is: the
    # relay, not the reaper, is what recovers the lost publish.)
    env = dict(stack_env, FLOWFORGE_BROKER_MIDDLEWARE="tests.faults.middleware.KillBeforeExecuteEnqueue",
               FLOWFORGE_DISPATCH_LEASE_SECONDS="60")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 137, (done.returncode, done.stdout, done.stderr)
    (run,) = WorkflowRun.objects.for_organization(org).filter(workflow=wf)
    # Committed before the kill: claimed by the start, its outbox row unpublished and reserved.
    (row,) = OutboxMessage.objects.for_organization(org).filter(workflow_run=run)
    assert row.published_at is None and row.next_attempt_at is not None
    reserved_until = row.next_attempt_at
    assert TaskRunEvent.objects.for_organization(run.organization_id).get(workflow_run=run, kind="claimed").detail["lease_owner"].startswith("start@")

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"

    def stamped():  # the relay stamps its row after the publish (a woken worker may finish first)
        row.refresh_from_db()
        return row.published_at is not None

    wait_until(stamped, timeout=10, what="the relay's stamp of the orphaned outbox row")
    assert row.publish_attempts == 1
    # The relay sent it once the start's reservation had passed, not before.
    assert row.published_at >= reserved_until
    assert time.monotonic() - began >= 0.9 * INLINE_PUBLISH_RESERVATION_SECONDS
    started = TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run=run, kind="started")
    assert [e.fencing_token for e in started] == [1]  # the claimed generation, started once


def test_an_organization_without_room_leaves_its_roots_ready_and_they_run_when_room_frees(
    stack, org, make_workflow
):
    from tenancy.models import Organization

    Organization.objects.filter(pk=org.pk).update(max_running_task_runs_override=1)
    wf = make_workflow(org, [{"key": "slow", "type": "sleep", "config": {"seconds": 1}},
                             {"key": "other", "type": "noop"}], name="no-room")
    worker = stack.start_worker("w", processes=1, threads=2)
    wait_worker_children([worker])
    stack.start_clock()
    run = start_run(workflow=wf)
    # One root claimed by the start (the quota is 1), the other left ready for later.
    states = sorted(run.task_runs.values_list("state", flat=True))
    assert states == ["ready", "running"], states
    assert wait_for_run_terminal(run, timeout=30) == "succeeded"
    wait_until(lambda: run.task_runs.filter(state="succeeded").count() == 2, timeout=5, what="both tasks")
