"""A dispatch the broker keeps refusing is dead-lettered, its task fails with a clear
error instead of waiting, and the dead letter can be replayed."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from engine import relay
from engine.models import OutboxMessage, TaskRun, WorkflowRun
from engine.reaper import fail_dead_letters
from engine.repositories import task_runs
from engine.services import start_run


class Refused(Exception):
    pass


@pytest.fixture
def broker_refuses(monkeypatch):
    def refuse(rows):
        return [], [(r[0], "Refused: the broker is unreachable") for r in rows]

    monkeypatch.setattr(relay, "_publish_rows", refuse)


@pytest.mark.django_db
def test_a_dead_lettered_dispatch_fails_its_task_and_can_be_replayed(org, make_workflow, broker_refuses, monkeypatch):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf)
    with transaction.atomic():
        (d,) = task_runs.claim_ready_many(limit=10, lease_seconds=300, owner="test")
    outbox = OutboxMessage.objects.for_organization(org).get(task_run_id=d.task_run_id)
    for _ in range(relay.MAX_PUBLISH_ATTEMPTS):
        OutboxMessage.objects.for_organization(org).filter(pk=outbox.pk).update(next_attempt_at=None)
        relay.relay_batch(limit=10)
    outbox.refresh_from_db()
    assert outbox.dead_lettered_at is not None and outbox.published_at is None
    assert outbox.publish_attempts == relay.MAX_PUBLISH_ATTEMPTS
    assert outbox.last_error == "Refused: the broker is unreachable"

    assert fail_dead_letters() == 1
    task = TaskRun.objects.for_organization(org).get(pk=d.task_run_id)
    assert task.state == "failed"
    assert task.error == (f"dispatch dead-lettered: the broker refused it {relay.MAX_PUBLISH_ATTEMPTS} times "
                          "(last error: Refused: the broker is unreachable)")
    run.refresh_from_db()
    assert run.state == "failed"
    assert TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="b").state == "skipped"
    assert fail_dead_letters() == 0  # nothing twice

    out = io.StringIO()
    call_command("outbox_replay", "--all", stdout=out)
    assert f"run {run.pk} retried as run" in out.getvalue()
    retry = WorkflowRun.objects.for_organization(org).get(retry_of=run)
    assert retry.state == "running"
    outbox.refresh_from_db()
    assert outbox.replayed_at is not None and outbox.dead_lettered_at is not None  # kept
    out = io.StringIO()
    call_command("outbox_replay", "--all", stdout=out)
    assert out.getvalue().strip() == "no dead letters to replay"


@pytest.mark.django_db
def test_a_dead_letter_whose_generation_still_waits_is_published_again(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    start_run(workflow=wf)
    with transaction.atomic():
        (d,) = task_runs.claim_ready_many(limit=10, lease_seconds=300, owner="test")
    OutboxMessage.objects.for_organization(org).filter(task_run_id=d.task_run_id).update(
        dead_lettered_at=timezone.now(), publish_attempts=10, last_error="Refused")
    out = io.StringIO()
    call_command("outbox_replay", "--all", stdout=out)
    assert "published again" in out.getvalue()
    row = OutboxMessage.objects.for_organization(org).get(task_run_id=d.task_run_id)
    assert (row.dead_lettered_at, row.publish_attempts, row.replayed_at is not None) == (None, 0, True)
    assert relay.relay_batch(limit=10) == (1, 0)  # the relay takes it again
