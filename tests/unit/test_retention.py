"""Run retention and offloaded outputs (issue 21): a finished run past its organization's
retention goes with everything it owns, files included; nothing else goes."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from engine import offload, retention
from engine.models import (
    AttemptSecrets,
    IdempotencyKey,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
    OffloadedPayload,
    OutboxMessage,
    RunSubscription,
    TaskLog,
    TaskRun,
    TaskRunEvent,
    TriggerFiring,
    WorkflowRun,
)
from engine.services import start_run
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.models import Organization
from tests.unit.test_notifications import actor_for, endpoint_for, finished_run

pytestmark = pytest.mark.django_db

OWNED = (TaskRun, TaskRunEvent, TaskLog, OutboxMessage, IdempotencyKey, TriggerFiring, RunSubscription,
         NotificationEvent, OffloadedPayload)


@pytest.fixture(autouse=True)
def offload_dir(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "offload": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "offload"), "base_url": None}}}
    from django.core.files.storage import storages

    storages._storages.pop("offload", None)  # the handler caches its storages
    storages._backends = None
    yield tmp_path / "offload"
    storages._storages.pop("offload", None)
    storages._backends = None


def age(run, days: float) -> None:
    """Make ``run`` look created and finished ``days`` ago."""
    with connection.cursor() as cur:
        cur.execute("UPDATE core_workflowrun SET created_at = now() - make_interval(secs => %s * 86400.0), "
                    "finished_at = CASE WHEN finished_at IS NULL THEN NULL ELSE now() - make_interval(secs => %s * 86400.0) END "
                    "WHERE id = %s", [days, days, run.pk])
        # Its history moves with it: run_created_at is the run's created_at (migration 0033).
        for table in ("core_taskrunevent", "core_tasklog"):
            cur.execute(f"UPDATE {table} SET run_created_at = r.created_at FROM core_workflowrun r "
                        f"WHERE r.id = %s AND {table}.workflow_run_id = r.id", [run.pk])


def owned_counts(run) -> dict[str, int]:
    counts = {m.__name__: m.objects.unscoped().filter(workflow_run_id=run.pk).count() for m in OWNED}
    counts["AttemptSecrets"] = AttemptSecrets.objects.unscoped().filter(task_run__workflow_run_id=run.pk).count()
    counts["NotificationDelivery"] = NotificationDelivery.objects.unscoped().filter(event__workflow_run_id=run.pk).count()
    counts["NotificationAttempt"] = NotificationAttempt.objects.unscoped().filter(
        delivery__event__workflow_run_id=run.pk).count()
    return counts


def decorate(org, run, offload_dir) -> str:
    """Give ``run`` one row of everything a run can own, and an offloaded file; returns the file's key."""
    task_run = TaskRun.objects.unscoped().filter(workflow_run=run).first()
    TaskLog.objects.unscoped().create(organization=org, workflow_run=run, task_run=task_run, attempt=1,
                                      run_created_at=run.created_at, fencing_token=task_run.fencing_token,
                                      level="info", message="hello")
    AttemptSecrets.objects.unscoped().create(task_run=task_run, organization=org, fencing_token=task_run.fencing_token,
                                            values_encrypted="x")
    IdempotencyKey.objects.unscoped().create(organization=org, key=f"k-{uuid.uuid4().hex[:6]}", request_hash="h",
                                             workflow_run=run, expires_at=timezone.now() + dt.timedelta(hours=1))
    RunSubscription.objects.unscoped().create(organization=org, workflow_run=run,
                                              expires_at=timezone.now() + dt.timedelta(hours=1))
    trigger = create_trigger(actor=Actor.system(org), data={
        "name": f"t-{uuid.uuid4().hex[:6]}", "workflow_name": run.workflow.name, "cron_expression": "0 6 * * *",
        "timezone": "UTC", "input": {}})
    TriggerFiring.objects.unscoped().create(organization=org, trigger=trigger, scheduled_for=timezone.now(),
                                            workflow_run=run)
    for delivery in NotificationDelivery.objects.unscoped().filter(event__workflow_run=run):
        NotificationAttempt.objects.unscoped().create(organization=org, delivery=delivery, number=1, outcome=NotificationAttempt.Outcome.values[0],
                                                      started_at=timezone.now())
    ref = offload.offload_output(organization_id=org.pk, workflow_run_id=run.pk, task_run_id=task_run.pk,
                                 fencing_token=task_run.fencing_token, text=json.dumps({"big": "x" * 1000}))
    assert offload.is_ref(json.loads(ref))
    key = OffloadedPayload.objects.unscoped().get(task_run=task_run).storage_key
    assert (offload_dir / key).exists()
    return key


def test_a_finished_run_past_retention_goes_with_everything_it_owns(make_org, settings, offload_dir):
    settings.FLOWFORGE_EGRESS_ALLOW = []
    org = make_org()
    endpoint_for(org, "https://93.184.215.14/hook")
    old = finished_run(org, "nightly", fail=True)
    key = decorate(org, old, offload_dir)
    before = owned_counts(old)
    assert all(n >= 1 for n in before.values()), before
    recent = finished_run(org, "recent")
    retry = start_run(workflow=old.workflow, actor=actor_for(org), retry_of=old)
    age(old, 40)
    result = retention.purge()
    assert (result.runs, result.files) == (1, 1)
    assert not WorkflowRun.objects.unscoped().filter(pk=old.pk).exists()
    assert all(n == 0 for n in owned_counts(old).values()), owned_counts(old)
    assert not (offload_dir / key).exists()
    # Nothing else went: the recent run, and the retry (which forgets the run it retried).
    assert WorkflowRun.objects.unscoped().filter(pk__in=[recent.pk, retry.pk]).count() == 2
    assert TaskRunEvent.objects.unscoped().filter(workflow_run=recent).exists()
    retry.refresh_from_db()
    assert retry.retry_of_id is None


def test_open_runs_recent_runs_and_kept_forever_organizations_stay(make_org, settings):
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org, forever, short = make_org(), make_org(), make_org()
    Organization.objects.filter(pk=forever.pk).update(run_retention_days=0)
    Organization.objects.filter(pk=short.pk).update(run_retention_days=2)
    running = start_run(workflow=finished_run(org, "wf").workflow, actor=actor_for(org))
    age(running, 90)
    young = finished_run(org, "young")
    age(young, 29)
    kept = finished_run(forever, "kept")
    age(kept, 3650)
    shortlived = finished_run(short, "short")
    age(shortlived, 3)
    preview = {b.slug: b.runs for b in retention.backlog()}
    assert preview == {short.slug: 1}
    assert retention.purge().runs == 1
    assert not WorkflowRun.objects.unscoped().filter(pk=shortlived.pk).exists()
    assert WorkflowRun.objects.unscoped().filter(pk__in=[running.pk, young.pk, kept.pk]).count() == 3
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 0  # the deployment keeps everything: only overrides purge
    age(young, 400)
    assert retention.purge().runs == 0


def test_a_retention_in_seconds_replaces_the_days_and_an_organizations_days_still_win(make_org, settings):
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 120  # a soak's few minutes
    org, days = make_org(), make_org()
    Organization.objects.filter(pk=days.pk).update(run_retention_days=1)
    old, fresh, daily = finished_run(org, "old"), finished_run(org, "fresh"), finished_run(days, "daily")
    for run, minutes in ((old, 3), (fresh, 1), (daily, 3)):
        age(run, minutes / 1440)
    assert [(b.slug, b.runs, b.retention_seconds) for b in retention.backlog()] == [(org.slug, 1, 120.0)]
    assert retention.purge().runs == 1
    assert set(WorkflowRun.objects.unscoped().values_list("pk", flat=True)) == {fresh.pk, daily.pk}
    out = io.StringIO()
    age(fresh, 5 / 1440)
    call_command("purge_runs", "--preview", stdout=out)
    assert f"{org.slug}: 1 run(s) past 120 seconds" in out.getvalue()
    assert retention.describe(86400) == "1 day" and retention.describe(0.5) == "0.5 seconds"


def test_batches_are_bounded_and_the_next_pass_goes_on(make_org):
    org = make_org()
    runs = [finished_run(org, f"b{i}") for i in range(5)]
    for run in runs:
        age(run, 60)
    assert retention.purge(max_runs=2, batch_runs=1).runs == 2
    assert WorkflowRun.objects.unscoped().filter(organization=org).count() == 3
    assert retention.purge(batch_runs=2).runs == 3
    assert WorkflowRun.objects.unscoped().filter(organization=org).count() == 0


def test_published_outbox_rows_go_after_the_keep_time_unpublished_ones_never(make_org, settings):
    org = make_org()
    run = finished_run(org, "outbox")
    task_runs = list(TaskRun.objects.unscoped().filter(workflow_run=run))

    def message(token: int, published: bool) -> OutboxMessage:
        return OutboxMessage.objects.unscoped().create(
            organization=org, workflow_run=run, task_run=task_runs[0], routing_key="flowforge.tasks", payload={},
            fencing_token_snapshot=100 + token, attempt_snapshot=1,
            published_at=timezone.now() if published else None)

    published = [message(i, True) for i in range(3)]
    pending = message(9, False)
    with connection.cursor() as cur:
        cur.execute("UPDATE core_outboxmessage SET created_at = created_at - interval '2 hours', "
                    "published_at = published_at - interval '2 hours' WHERE workflow_run_id = %s", [run.pk])
    settings.FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS = 3 * 3600
    assert retention.purge_published_outbox() == 0
    settings.FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS = 3600
    assert retention.purge_published_outbox() == len(published)
    left = set(OutboxMessage.objects.unscoped().filter(workflow_run=run).values_list("id", flat=True))
    assert pending.pk in left and not left & {m.pk for m in published}


def test_the_command_previews_then_purges(make_org):
    org = make_org()
    run = finished_run(org, "cmd")
    age(run, 45)
    out = io.StringIO()
    call_command("purge_runs", "--preview", stdout=out)
    assert f"{org.slug}: 1 run(s) past 30 days" in out.getvalue()
    assert WorkflowRun.objects.unscoped().filter(pk=run.pk).exists()
    out = io.StringIO()
    call_command("purge_runs", stdout=out)
    assert "removed 1 run(s)" in out.getvalue()
    assert not WorkflowRun.objects.unscoped().filter(pk=run.pk).exists()


def test_the_settings_page_shows_the_retention(make_org, settings):
    from tenancy.models import Membership

    org = make_org()
    owner = Membership.objects.unscoped().filter(organization=org).select_related("user").first().user
    client = Client()
    client.force_login(owner)
    page = client.get("/settings/", HTTP_X_ORGANIZATION=org.slug).content.decode()
    assert 'data-retention-seconds="2592000">30 days' in page
    Organization.objects.filter(pk=org.pk).update(run_retention_days=7)
    page = client.get("/settings/", HTTP_X_ORGANIZATION=org.slug).content.decode()
    assert 'data-retention-seconds="604800">7 days <span class="muted small">(set for this organization)' in page


def test_the_purge_waits_between_batches_four_times_as_long_as_each_took(make_org, settings, monkeypatch):
    """Paced (the soak: flat out, purging 1,000,000 runs cost the engine 28% of its
    throughput): after each full batch but the last, a wait of FLOWFORGE_RETENTION_PAUSE_FACTOR
    times the batch's own time, at most MAX_PAUSE_SECONDS."""
    org = make_org()
    for i in range(3):
        age(finished_run(org, f"p{i}"), 60)
    waits: list[float] = []
    clock = iter(range(0, 1000, 2))  # each batch "takes" 2 s by the monotonic clock
    monkeypatch.setattr(retention.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(retention.time, "sleep", waits.append)
    settings.FLOWFORGE_RETENTION_PAUSE_FACTOR = 2
    assert retention.purge(batch_runs=1).runs == 3
    # Three full batches, then an empty one ends it: a wait after each full one (2 s x 2).
    assert waits == [4.0, 4.0, 4.0]
    waits.clear()
    for i in range(2):
        age(finished_run(org, f"q{i}"), 60)
    settings.FLOWFORGE_RETENTION_PAUSE_FACTOR = 4  # 8 s, capped
    assert retention.purge(batch_runs=1, max_runs=2).runs == 2
    assert waits == [retention.MAX_PAUSE_SECONDS]  # none after the pass's last batch
    settings.FLOWFORGE_RETENTION_PAUSE_FACTOR = 0
    age(finished_run(org, "r"), 60)
    waits.clear()
    assert retention.purge(batch_runs=1).runs == 1 and waits == []
