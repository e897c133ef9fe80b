"""Notifications (issue 19), in this process: what the ff_notification_record trigger records
with each transition, the outbox's claim (caps, fairness, leases), one attempt of a webhook
against a local HTTP server (signature, retries and backoff, dead letter, redirects, bounded
answers, the egress policy at delivery), replay, and the failure emails.

Runs are driven through the engine's own transitions (tests.unit.test_web_runs.drive_run);
deliveries are claimed with the outbox's statements and attempted with
``engine.notifier.deliver`` as the ``deliver_notification`` actor would. The messages a claim
sends go to this checkout's Redis namespace and are flushed after each test.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from audit.models import AuditLog
from engine import notifications, notifier, webhooks
from engine.models import (
    FailureSubscription,
    NotificationAttempt,
    NotificationDelivery,
    NotificationEvent,
    Workflow,
)
from engine.notifications import InvalidWebhook, ReplayRefused
from engine.repositories import events as event_ops
from engine.repositories import notifications as outbox
from engine.services import apply_definition, archive_workflow, cancel_run, start_run
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded
from tenancy.models import Membership, Role, User
from tenancy.permissions import Forbidden
from tenancy.services import remove_member
from tests.unit.test_web_runs import actor_for, drive_run, member
from tests.webhook_receiver import receiver_server

pytestmark = pytest.mark.django_db


# --- a receiver ------------------------------------------------------------------------------------


@pytest.fixture
def receiver(settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]  # the receiver is on loopback
    with receiver_server() as r:
        yield r


@pytest.fixture(autouse=True)
def fast_schedule(settings):
    settings.FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS = 10.0
    settings.FLOWFORGE_NOTIFY_BACKOFF_MAX_SECONDS = 60.0
    settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS = 3
    settings.FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.FLOWFORGE_NOTIFY_IN_FLIGHT = 50
    settings.FLOWFORGE_NOTIFY_IN_FLIGHT_PER_ORG = 50
    settings.FLOWFORGE_NOTIFY_IN_FLIGHT_PER_TARGET = 50


@pytest.fixture(autouse=True)
def flushed_broker():
    """The deliver_notification messages claims send go nowhere in this process: drop them."""
    import engine.actors  # noqa: F401  (declares the queues, so flush_all reaches them)
    from flowforge.broker import broker

    broker.flush_all()
    yield
    broker.flush_all()


# --- helpers -----------------------------------------------------------------------------------------


def workflow(org, name: str, *, fail: bool = False, sleep: bool = False):
    task = {"key": "only", "type": "noop"}
    if fail:
        task = {"key": "breaks", "type": "fail", "config": {"message": "disk full"}}
    if sleep:
        task = {"key": "naps", "type": "sleep", "config": {"seconds": 60}}
    return apply_definition(actor=actor_for(org), document={"name": name, "tasks": [task]})


def finished_run(org, name: str, *, fail: bool = False):
    wf = workflow(org, name, fail=fail)
    run = start_run(workflow=wf, actor=actor_for(org))
    return drive_run(run, fail={"breaks"} if fail else ())


def endpoint_for(org, url: str, *, events=("run.succeeded", "run.failed", "run.cancelled", "task.failed"),
                 workflow_name: str = "", enabled: bool = True):
    return notifications.create_endpoint(actor=actor_for(org), url=url, event_types=list(events),
                                         workflow_name=workflow_name, enabled=enabled)


def claim_all() -> list[tuple]:
    return outbox.claim(limit=100, per_org=100, per_target=100, lease_seconds=60)


def deliver_all() -> list[str | None]:
    """Claim every due delivery and attempt each once; returns the new states."""
    return [notifier.deliver(delivery_id, token) for delivery_id, token in claim_all()]


def deliveries(org) -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.for_organization(org).select_related("event").order_by("created_at"))


# --- recording ---------------------------------------------------------------------------------------


def test_an_organization_without_endpoints_records_nothing(make_org):
    org = make_org()
    finished_run(org, "quiet-ok")
    finished_run(org, "quiet-bad", fail=True)
    assert NotificationEvent.objects.unscoped().filter(organization_id=org.pk).count() == 0
    assert NotificationDelivery.objects.unscoped().filter(organization_id=org.pk).count() == 0


def test_a_failed_run_records_task_failed_and_run_failed_once_each_with_a_snapshot(make_org):
    org = make_org()
    endpoint, _ = endpoint_for(org, "https://93.184.215.14/hook")
    run = finished_run(org, "nightly", fail=True)
    events = list(NotificationEvent.objects.for_organization(org).order_by("run_event_seq"))
    assert [e.type for e in events] == ["task.failed", "run.failed"]
    task_failed, run_failed = events
    assert task_failed.payload["task_run"]["task_key"] == "breaks"
    assert task_failed.payload["task_run"]["error"] == "breaks failed <b>on purpose</b>"
    assert task_failed.payload["task_run"]["reason"] == "attempt_failed"
    assert run_failed.payload["run"]["id"] == str(run.pk)
    assert run_failed.payload["run"]["state"] == "failed"
    assert run_failed.payload["workflow"]["name"] == "nightly"
    assert run_failed.workflow_name == "nightly" and run_failed.workflow_run_id == run.pk
    # One pending delivery per event, to the endpoint, due now.
    rows = deliveries(org)
    assert [(d.event.type, d.endpoint_id, d.state) for d in rows] == [
        ("task.failed", endpoint.pk, "pending"), ("run.failed", endpoint.pk, "pending")]


def test_succeeded_and_cancelled_runs_are_recorded_with_their_type(make_org):
    org = make_org()
    endpoint_for(org, "https://93.184.215.14/hook")
    finished_run(org, "fine")
    wf = workflow(org, "long", sleep=True)
    run = start_run(workflow=wf, actor=actor_for(org))
    assert cancel_run(run=run, actor=actor_for(org)) is True
    types = list(NotificationEvent.objects.for_organization(org).order_by("created_at").values_list("type", flat=True))
    assert types == ["run.succeeded", "run.cancelled"]


def test_only_the_subscribed_types_and_the_filtered_workflow_are_recorded(make_org):
    org = make_org()
    only_runs, _ = endpoint_for(org, "https://93.184.215.14/a", events=["run.failed"])
    workflow(org, "other")  # a filter names an existing workflow
    only_other, _ = endpoint_for(org, "https://93.184.215.14/b", workflow_name="other")
    endpoint_for(org, "https://93.184.215.14/c", enabled=False)
    finished_run(org, "main", fail=True)
    rows = deliveries(org)
    assert [(d.event.type, d.endpoint_id) for d in rows] == [("run.failed", only_runs.pk)]
    finished_run(org, "other")
    assert [(d.event.type, d.endpoint_id) for d in deliveries(org)][1:] == [("run.succeeded", only_other.pk)]


def test_a_failure_that_will_be_retried_is_not_a_task_failed(make_org):
    org = make_org()
    endpoint_for(org, "https://93.184.215.14/hook", events=["task.failed"])
    wf = apply_definition(actor=actor_for(org), document={"name": "flaky", "tasks": [
        {"key": "once", "type": "fail", "config": {"fail_attempts": 1}, "max_attempts": 2,
         "retry_backoff_seconds": 0}]})
    run = drive_run(start_run(workflow=wf, actor=actor_for(org)), flaky={"once"})
    assert run.state == "succeeded"
    assert NotificationEvent.objects.for_organization(org).count() == 0


def test_a_refused_completion_of_a_failed_task_run_records_nothing_more(make_org):
    org = make_org()
    endpoint_for(org, "https://93.184.215.14/hook", events=["task.failed"])
    run = finished_run(org, "once", fail=True)
    assert NotificationEvent.objects.for_organization(org).count() == 1
    task_run = run.task_runs.get()
    # A late worker's completion of the failed task run: an event failed -> failed.
    with connection.cursor():
        event_ops.append_stale_completion(task_run_id=task_run.pk, fencing_token=task_run.fencing_token,
                                          succeeded=False)
    assert NotificationEvent.objects.for_organization(org).count() == 1


def test_another_organizations_endpoint_gets_nothing(make_org):
    org, other = make_org(), make_org()
    endpoint_for(other, "https://93.184.215.14/theirs")
    finished_run(org, "mine", fail=True)
    assert NotificationDelivery.objects.unscoped().count() == 0


# --- one attempt ---------------------------------------------------------------------------------------


def test_a_delivery_posts_the_event_signed_and_succeeds(make_org, receiver):
    org = make_org()
    endpoint, secret = endpoint_for(org, receiver.url, events=["run.failed"])
    run = finished_run(org, "nightly", fail=True)
    assert deliver_all() == ["succeeded"]
    (got,) = receiver.received
    event = NotificationEvent.objects.for_organization(org).get()
    assert got["path"] == "/hooks/flowforge?token=abc"
    assert webhooks.verify_signature(secret, got["headers"]["flowforge-signature"], got["body"]) > 0
    document = json.loads(got["body"])
    assert document["id"] == str(event.pk) == got["headers"]["flowforge-event-id"]
    assert document["type"] == "run.failed" == got["headers"]["flowforge-event-type"]
    assert document["data"]["run"]["id"] == str(run.pk)
    assert got["headers"]["content-type"] == "application/json"
    delivery = NotificationDelivery.objects.for_organization(org).get()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("succeeded", 1, 200)
    assert delivery.delivered_at is not None
    (attempt,) = NotificationAttempt.objects.for_organization(org)
    assert (attempt.number, attempt.outcome, attempt.status_code, attempt.retrying) == (1, "succeeded", 200, False)
    assert attempt.response_excerpt == '{"ok": true}' and attempt.duration_ms is not None
    # Nothing more is due: a second pass sends nothing.
    assert deliver_all() == [] and len(receiver.received) == 1
    assert endpoint.pk == delivery.endpoint_id


def test_a_5xx_is_retried_with_backoff_then_dead_lettered_with_the_same_body(make_org, receiver):
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.status, receiver.body = 503, b"maintenance"
    before = timezone.now()
    assert deliver_all() == ["pending"]
    delivery = NotificationDelivery.objects.for_organization(org).get()
    # Attempt 1 failed: the next one base * 2^0 = 10 s later, times 0.5 to 1.
    wait = (delivery.next_attempt_at - before).total_seconds()
    assert 5.0 - 0.5 <= wait <= 10.0 + 5.0
    assert deliver_all() == []  # not due yet
    for expected in ("pending", "dead"):
        NotificationDelivery.objects.for_organization(org).update(next_attempt_at=timezone.now())
        assert deliver_all() == [expected]
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("dead", 3, 503)
    assert delivery.dead_lettered_at is not None and delivery.next_attempt_at is None
    attempts = list(NotificationAttempt.objects.for_organization(org).order_by("number"))
    assert [(a.number, a.status_code, a.retrying) for a in attempts] == [(1, 503, True), (2, 503, True),
                                                                         (3, 503, False)]
    assert attempts[0].response_excerpt == "maintenance" and attempts[0].error == "HTTP 503"
    bodies = {r["body"] for r in receiver.received}
    ids = {r["headers"]["flowforge-event-id"] for r in receiver.received}
    assert len(receiver.received) == 3 and len(bodies) == 1 and len(ids) == 1
    assert [r["headers"]["flowforge-delivery-attempt"] for r in receiver.received] == ["1", "2", "3"]


def test_the_backoff_doubles_per_attempt_and_is_capped(make_org, receiver, settings):
    settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS = 6
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.status = 500
    waits = []
    for _ in range(5):
        NotificationDelivery.objects.for_organization(org).update(next_attempt_at=timezone.now())
        before = timezone.now()
        assert deliver_all() == ["pending"]
        delivery = NotificationDelivery.objects.for_organization(org).get()
        waits.append((delivery.next_attempt_at - before).total_seconds())
    # base 10 s, cap 60 s: 10, 20, 40, 60, 60 times a factor of 0.5 to 1.
    for wait, full in zip(waits, [10, 20, 40, 60, 60], strict=True):
        assert full * 0.5 - 0.5 <= wait <= full + 0.5, waits


@pytest.mark.parametrize(("status", "retried"), [(429, True), (408, True), (500, True), (404, False), (400, False),
                                                 (410, False)])
def test_which_answers_are_retried(make_org, receiver, status, retried):
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.status = status
    assert deliver_all() == ["pending" if retried else "dead"]


def test_a_redirect_is_not_followed_and_fails_the_delivery(make_org, receiver):
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    with receiver_server() as elsewhere:
        receiver.status, receiver.location = 307, elsewhere.url
        assert deliver_all() == ["dead"]
        assert elsewhere.received == []
    attempt = NotificationAttempt.objects.for_organization(org).get()
    assert attempt.status_code == 307 and "redirect" in attempt.error and "token" not in attempt.error


def test_a_long_answer_is_read_only_up_to_the_limit(make_org, receiver, settings):
    settings.FLOWFORGE_WEBHOOK_RESPONSE_BYTES = 100
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.body = b"x" * 5000
    assert deliver_all() == ["succeeded"]
    attempt = NotificationAttempt.objects.for_organization(org).get()
    assert attempt.response_excerpt == "x" * 100 and attempt.response_truncated is True


def test_a_slow_receiver_times_out_and_is_retried(make_org, receiver, settings):
    settings.FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS = 0.3
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.delay = 1.5
    assert deliver_all() == ["pending"]
    attempt = NotificationAttempt.objects.for_organization(org).get()
    assert attempt.status_code is None and attempt.error.startswith("timed out after 0.3 s")


def test_the_egress_policy_is_applied_again_at_delivery(make_org, receiver, settings):
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    settings.FLOWFORGE_EGRESS_ALLOW = []  # loopback was allowed when the URL was stored, not now
    assert deliver_all() == ["dead"]
    assert receiver.received == []
    attempt = NotificationAttempt.objects.for_organization(org).get()
    assert "egress refused: 127.0.0.1 (loopback)" in attempt.error


def test_a_rotated_secret_keeps_signing_beside_the_new_one_for_its_grace(make_org, receiver):
    org = make_org()
    endpoint, old = endpoint_for(org, receiver.url, events=["run.failed"])
    endpoint, new = notifications.rotate_secret(actor=actor_for(org), endpoint=endpoint, previous_valid_seconds=3600)
    finished_run(org, "first", fail=True)
    assert deliver_all() == ["succeeded"]
    # Signed when sent: rotated again, without a grace, only the newest signs from then on.
    endpoint, newest = notifications.rotate_secret(actor=actor_for(org), endpoint=endpoint)
    finished_run(org, "second", fail=True)
    assert deliver_all() == ["succeeded"]
    first, second = receiver.received
    assert first["headers"]["flowforge-signature"].count("v1=") == 2
    for secret in (old, new):
        webhooks.verify_signature(secret, first["headers"]["flowforge-signature"], first["body"])
    assert second["headers"]["flowforge-signature"].count("v1=") == 1
    webhooks.verify_signature(newest, second["headers"]["flowforge-signature"], second["body"])
    with pytest.raises(webhooks.SignatureError):
        webhooks.verify_signature(new, second["headers"]["flowforge-signature"], second["body"])


def test_verify_signature_refuses_a_changed_body_and_an_old_timestamp():
    body = b'{"id":"x"}'
    header = webhooks.signature_header(["whsec_test"], 1_700_000_000, body)
    assert webhooks.verify_signature("whsec_test", header, body, now=1_700_000_100) == 1_700_000_000
    with pytest.raises(webhooks.SignatureError, match="no signature matches"):
        webhooks.verify_signature("whsec_test", header, body + b" ", now=1_700_000_100)
    with pytest.raises(webhooks.SignatureError, match="tolerance"):
        webhooks.verify_signature("whsec_test", header, body, now=1_700_000_000 + 301)
    with pytest.raises(webhooks.SignatureError, match="no signature matches"):
        webhooks.verify_signature("whsec_other", header, body, now=1_700_000_100)


# --- the claim: caps, fairness, leases ----------------------------------------------------------------


def _pending_to(org, endpoint, n: int, name: str = "bulk") -> None:
    for i in range(n):
        finished_run(org, f"{name}-{i}", fail=True)
    assert NotificationDelivery.objects.for_organization(org).filter(endpoint=endpoint, state="pending").count() == n


def test_the_claim_keeps_to_the_caps_per_target_per_organization_and_in_all(make_org):
    a, b = make_org(), make_org()
    a1, _ = endpoint_for(a, "https://93.184.215.14/a1", events=["run.failed"])
    a2, _ = endpoint_for(a, "https://93.184.215.14/a2", events=["run.failed"])
    b1, _ = endpoint_for(b, "https://93.184.215.14/b1", events=["run.failed"])
    _pending_to(a, a1, 3, "a")  # a2 subscribed too: 3 each
    _pending_to(b, b1, 3, "b")
    claimed = outbox.claim(limit=10, per_org=3, per_target=2, lease_seconds=60)
    rows = NotificationDelivery.objects.unscoped().filter(pk__in=[c[0] for c in claimed])
    per_target = {}
    for row in rows:
        per_target[row.endpoint_id] = per_target.get(row.endpoint_id, 0) + 1
    assert per_target[b1.pk] == 2 and per_target.get(a1.pk, 0) + per_target.get(a2.pk, 0) == 3
    assert max(per_target.values()) <= 2
    # What is in flight counts: with those still sending, nothing more fits organization a,
    # and b1 has room for nothing more either (2 of 2).
    assert outbox.claim(limit=10, per_org=3, per_target=2, lease_seconds=60) == []
    # The deployment-wide cap.
    NotificationDelivery.objects.unscoped().filter(state="sending").update(state="succeeded", lease_expires_at=None)
    assert len(outbox.claim(limit=1, per_org=3, per_target=2, lease_seconds=60)) == 1


def test_a_backlog_of_one_organization_does_not_keep_another_waiting(make_org):
    noisy, quiet = make_org(), make_org()
    loud, _ = endpoint_for(noisy, "https://93.184.215.14/loud", events=["run.failed"])
    calm, _ = endpoint_for(quiet, "https://93.184.215.14/calm", events=["run.failed"])
    _pending_to(noisy, loud, 6, "noisy")
    # The quiet organization's one delivery is the newest of all.
    _pending_to(quiet, calm, 1, "quiet")
    claimed = outbox.claim(limit=2, per_org=5, per_target=5, lease_seconds=60)
    owners = set(NotificationDelivery.objects.unscoped().filter(pk__in=[c[0] for c in claimed])
                 .values_list("organization_id", flat=True))
    assert owners == {noisy.pk, quiet.pk}


def test_a_disabled_endpoints_deliveries_wait_until_it_is_enabled(make_org):
    org = make_org()
    endpoint, _ = endpoint_for(org, "https://93.184.215.14/hook", events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    notifications.update_endpoint(actor=actor_for(org), endpoint=endpoint, data={"enabled": False})
    assert claim_all() == []
    notifications.update_endpoint(actor=actor_for(org), endpoint=endpoint, data={"enabled": True})
    assert len(claim_all()) == 1


def test_a_lost_claim_counts_as_a_failed_attempt_and_its_late_outcome_is_refused(make_org, receiver):
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    ((delivery_id, token),) = claim_all()
    # The worker that holds it stops: its lease runs out.
    NotificationDelivery.objects.for_organization(org).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    notifier.tick()
    delivery = NotificationDelivery.objects.for_organization(org).get()
    attempt = NotificationAttempt.objects.for_organization(org).get()
    assert (attempt.number, attempt.outcome, attempt.error) == (1, "failed", notifier.LOST_ERROR)
    # tick() claimed it again at once? No: it backs off first.
    assert delivery.state == "pending" and delivery.next_attempt_at > timezone.now()
    # The lost worker's attempt, finishing late, changes nothing and sends nothing.
    assert notifier.deliver(delivery_id, token) is None
    assert receiver.received == []


# --- replay ----------------------------------------------------------------------------------------


def test_a_dead_delivery_is_replayed_with_the_same_event_and_audited(make_org, receiver, settings):
    settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS = 1
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.status = 500
    assert deliver_all() == ["dead"]
    dead = NotificationDelivery.objects.for_organization(org).get()
    receiver.status = 200
    replay = notifications.replay_delivery(actor=actor_for(org), delivery=dead)
    assert (replay.replay_of_id, replay.event_id, replay.state) == (dead.pk, dead.event_id, "pending")
    with pytest.raises(ReplayRefused, match="already pending"):
        notifications.replay_delivery(actor=actor_for(org), delivery=dead)
    with pytest.raises(ReplayRefused, match="is pending"):
        notifications.replay_delivery(actor=actor_for(org), delivery=replay)
    assert deliver_all() == ["succeeded"]
    first, second = receiver.received
    assert first["body"] == second["body"]
    assert first["headers"]["flowforge-event-id"] == second["headers"]["flowforge-event-id"]
    assert AuditLog.objects.for_organization(org).filter(action="webhook.delivery_replayed").count() == 1


# --- endpoints: the rules --------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:8000/hook", "egress refused: 127.0.0.1 (loopback)"),
    ("http://localhost/hook", "egress refused: 127.0.0.1 (loopback) for host 'localhost'"),
    ("http://10.1.2.3/hook", "private"),
    ("http://169.254.169.254/latest/meta-data", "cloud metadata"),
    ("http://[::1]/hook", "loopback"),
    ("http://2130706433/hook", "loopback"),
    ("ftp://93.184.215.14/hook", "absolute http:// or https:// URL"),
    ("https://user:pw@93.184.215.14/hook", "user or password"),
    ("https://93.184.215.14/hook#part", "fragment"),
    ("https://93.184.215.14/" + "a" * 2000, "at most 2000"),
    ("/relative", "absolute http:// or https:// URL"),
    ("", "required"),
])
def test_an_endpoint_url_the_rules_refuse_names_the_url_field(make_org, url, says):
    org = make_org()
    with pytest.raises(InvalidWebhook) as refused:
        endpoint_for(org, url)
    assert refused.value.field == "url" and says in refused.value.message
    assert not notifications.endpoints_of(org).exists()


def test_the_event_types_and_the_workflow_filter_are_checked(make_org):
    org = make_org()
    with pytest.raises(InvalidWebhook, match="unknown event type 'run.exploded'") as refused:
        endpoint_for(org, "https://93.184.215.14/hook", events=["run.failed", "run.exploded"])
    assert refused.value.field == "event_types"
    with pytest.raises(InvalidWebhook) as refused:
        endpoint_for(org, "https://93.184.215.14/hook", events=[])
    assert refused.value.field == "event_types"
    with pytest.raises(InvalidWebhook) as refused:
        endpoint_for(org, "https://93.184.215.14/hook", workflow_name="no spaces allowed")
    assert refused.value.field == "workflow_name"
    endpoint, _ = endpoint_for(org, "https://93.184.215.14/hook", events=["task.failed", "run.failed", "run.failed"])
    assert endpoint.event_types == ["run.failed", "task.failed"]


def missing_workflow(name: str) -> str:
    return (f"no workflow named {name!r} in this organization; give the name of one of its workflows (any version, "
            "active, draft or archived), or leave it empty for every workflow")


def test_a_workflow_filter_must_name_a_workflow_of_the_organization(make_org):
    org, stranger = make_org(), make_org()
    workflow(stranger, "theirs")
    for name in ("no-such-wf", "theirs"):  # another organization's workflow is refused as a missing one
        with pytest.raises(InvalidWebhook) as refused:
            endpoint_for(org, "https://93.184.215.14/hook", workflow_name=name)
        assert (refused.value.field, refused.value.message) == ("workflow_name", missing_workflow(name))
    assert not notifications.endpoints_of(org).exists()
    assert not AuditLog.objects.for_organization(org).filter(action="webhook.created").exists()
    # An archived workflow is still one of its workflows: it can be restored, and archiving cancels runs.
    archived = workflow(org, "retired")
    archive_workflow(actor=actor_for(org), workflow=archived, confirm="retired")
    assert Workflow.objects.for_organization(org).get(name="retired").state == "archived"
    endpoint, _ = endpoint_for(org, "https://93.184.215.14/hook", workflow_name="retired")
    assert endpoint.workflow_name == "retired"
    everything, _ = endpoint_for(org, "https://93.184.215.14/all", workflow_name="")
    assert everything.workflow_name == ""


def test_changing_the_workflow_filter_checks_it_and_an_unchanged_one_is_kept(make_org):
    org, stranger = make_org(), make_org()
    workflow(stranger, "theirs")
    workflow(org, "nightly")
    endpoint, _ = endpoint_for(org, "https://93.184.215.14/hook", workflow_name="nightly")
    for name in ("no-such-wf", "theirs"):
        with pytest.raises(InvalidWebhook) as refused:
            notifications.update_endpoint(actor=actor_for(org), endpoint=endpoint, data={"workflow_name": name})
        assert (refused.value.field, refused.value.message) == ("workflow_name", missing_workflow(name))
    endpoint.refresh_from_db()
    assert endpoint.workflow_name == "nightly"
    # Its workflow gone, the endpoint's other fields stay editable with the filter as it was.
    Workflow.objects.for_organization(org).filter(name="nightly").delete()
    changed = notifications.update_endpoint(actor=actor_for(org), endpoint=endpoint,
                                            data={"workflow_name": "nightly", "description": "pager"})
    assert (changed.workflow_name, changed.description) == ("nightly", "pager")


def test_the_number_of_endpoints_is_capped_with_a_clear_error(make_org, settings):
    settings.FLOWFORGE_MAX_WEBHOOKS_PER_ORG = 2
    org = make_org()
    endpoint_for(org, "https://93.184.215.14/1")
    endpoint_for(org, "https://93.184.215.14/2")
    with pytest.raises(QuotaExceeded) as refused:
        endpoint_for(org, "https://93.184.215.14/3")
    assert (refused.value.limit, refused.value.allowed, refused.value.used) == ("max_webhooks", 2, 2)
    assert "FLOWFORGE_MAX_WEBHOOKS_PER_ORG=2" in str(refused.value)
    assert notifications.endpoints_of(org).count() == 2


def test_the_secret_is_stored_encrypted_and_audits_name_no_secret_nor_path(make_org):
    org = make_org()
    endpoint, secret = endpoint_for(org, "https://93.184.215.14/hooks/T000/B000/XXXXSECRETPATH")
    assert secret.startswith("whsec_") and len(secret) > 40
    stored = type(endpoint).objects.for_organization(org).get(pk=endpoint.pk)
    assert secret not in stored.secret_ciphertext
    assert notifications.decrypt_secrets(org.pk, endpoint.pk, stored.secret_ciphertext, None) == [secret]
    notifications.update_endpoint(actor=actor_for(org), endpoint=endpoint,
                                  data={"url": "https://93.184.215.14/hooks/T000/B000/OTHERPATH"})
    notifications.rotate_secret(actor=actor_for(org), endpoint=endpoint)
    notifications.delete_endpoint(actor=actor_for(org), endpoint=endpoint)
    records = list(AuditLog.objects.for_organization(org).filter(action__startswith="webhook.").order_by("seq"))
    assert [r.action for r in records] == ["webhook.created", "webhook.updated", "webhook.secret_rotated",
                                           "webhook.deleted"]
    text = json.dumps([r.metadata for r in records])
    assert "SECRETPATH" not in text and "OTHERPATH" not in text and "whsec_" not in text
    assert records[0].metadata["url"] == "https://93.184.215.14"


def test_a_ciphertext_moved_to_another_endpoint_does_not_decrypt(make_org):
    from tenancy.vault import DecryptionError

    org = make_org()
    one, _ = endpoint_for(org, "https://93.184.215.14/1")
    two, _ = endpoint_for(org, "https://93.184.215.14/2")
    with pytest.raises(DecryptionError):
        notifications.decrypt_secrets(org.pk, two.pk, one.secret_ciphertext, None)


# --- failure emails ------------------------------------------------------------------------------


def test_a_subscribed_member_is_emailed_when_the_workflow_fails(make_org, settings):
    settings.FLOWFORGE_PUBLIC_URL = "https://flowforge.example.com"
    org = make_org()
    watcher = member(org, Role.VIEWER)
    bystander = member(org, Role.MEMBER)
    viewer_actor = Actor(organization=org, role=Role.VIEWER, user=watcher, channel="web")
    assert notifications.set_failure_subscription(actor=viewer_actor, workflow_name="nightly", subscribed=True)
    assert not notifications.set_failure_subscription(actor=viewer_actor, workflow_name="nightly", subscribed=True)
    finished_run(org, "nightly")  # a success: no email
    run = finished_run(org, "nightly", fail=True)
    finished_run(org, "other", fail=True)  # not subscribed to this one
    mail.outbox.clear()
    assert deliver_all() == ["succeeded"]
    (message,) = mail.outbox
    assert message.to == [watcher.email] and bystander.email not in message.to
    assert message.subject == f"[FlowForge] {org.name}: a run of nightly failed"
    assert str(run.pk) in message.body and "breaks (attempt 1): " in message.body and "breaks failed <b>on purpose</b>" in message.body
    assert f"https://flowforge.example.com/runs/{run.pk}/" in message.body
    assert AuditLog.objects.for_organization(org).filter(action="notification.failure_subscribed").count() == 1


def test_a_member_who_left_is_not_emailed(make_org):
    org = make_org()
    owner = actor_for(org)
    leaver = member(org, Role.MEMBER)
    later = member(org, Role.MEMBER)
    for user in (leaver, later):
        notifications.set_failure_subscription(
            actor=Actor(organization=org, role=Role.MEMBER, user=user, channel="web"), workflow_name="nightly",
            subscribed=True)
    remove_member(actor=owner, membership=Membership.objects.for_organization(org).get(user=leaver))
    assert not FailureSubscription.objects.for_organization(org).filter(user=leaver).exists()
    finished_run(org, "nightly", fail=True)
    # The other one leaves after the failure was recorded, before the email went out.
    remove_member(actor=owner, membership=Membership.objects.for_organization(org).get(user=later))
    mail.outbox.clear()
    assert deliver_all() == ["dead"]
    assert mail.outbox == []
    delivery = NotificationDelivery.objects.for_organization(org).get()
    assert delivery.recipient_id == later.pk and "no longer a member" in delivery.last_error


def test_an_api_key_cannot_subscribe_to_failure_emails(make_org):
    from tenancy.apikeys import create_api_key

    org = make_org()
    key, _full = create_api_key(actor=actor_for(org), name="ci", role=Role.ADMIN)
    as_key = Actor(organization=org, role=Role.ADMIN, api_key=key, channel="api")
    with pytest.raises(Forbidden):
        notifications.set_failure_subscription(actor=as_key, workflow_name="nightly", subscribed=True)


def test_failure_subscriptions_per_member_are_capped(make_org, settings):
    settings.FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER = 1
    org = make_org()
    actor = actor_for(org)
    notifications.set_failure_subscription(actor=actor, workflow_name="a", subscribed=True)
    with pytest.raises(QuotaExceeded) as refused:
        notifications.set_failure_subscription(actor=actor, workflow_name="b", subscribed=True)
    assert refused.value.limit == "max_failure_subscriptions"
    assert notifications.set_failure_subscription(actor=actor, workflow_name="a", subscribed=False)
    assert notifications.set_failure_subscription(actor=actor, workflow_name="b", subscribed=True)


def test_users_of_other_organizations_are_never_emailed(make_org):
    org, other = make_org(), make_org()
    outsider = User.objects.create_user(email="outsider@elsewhere.example")
    Membership.objects.create(organization=other, user=outsider, role=Role.OWNER)
    # A subscription row of a non-member (written behind the service's back) sends nothing.
    FailureSubscription.objects.create(organization=org, user=outsider, workflow_name="nightly")
    finished_run(org, "nightly", fail=True)
    assert NotificationDelivery.objects.unscoped().count() == 0


def test_rotate_secret_keys_re_encrypts_the_webhook_secrets_too(make_org, settings):
    from io import StringIO

    from cryptography.fernet import Fernet
    from django.core.management import call_command

    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FLOWFORGE_SECRET_KEYS = [old_key]
    org = make_org()
    endpoint, secret = endpoint_for(org, "https://93.184.215.14/hook")
    _rotated, current = notifications.rotate_secret(actor=actor_for(org), endpoint=endpoint,
                                                    previous_valid_seconds=60)
    settings.FLOWFORGE_SECRET_KEYS = [new_key, old_key]
    out = StringIO()
    call_command("rotate_secret_keys", stdout=out)
    assert "1 webhook secrets examined, 1 re-encrypted" in out.getvalue()
    settings.FLOWFORGE_SECRET_KEYS = [new_key]  # the old key dropped
    row = type(endpoint).objects.for_organization(org).get(pk=endpoint.pk)
    assert notifications.decrypt_secrets(org.pk, endpoint.pk, row.secret_ciphertext,
                                         row.previous_secret_ciphertext) == [current, secret]


def _trigger_calls(run, *, kind: str, task_run: bool, to_state: str, first_seq: int) -> dict[str, int]:
    """{trigger: calls} of an INSERT of 200 history rows of ``kind`` for ``run`` (EXPLAIN ANALYZE)."""
    import re

    with connection.cursor() as cur:
        cur.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) INSERT INTO core_taskrunevent (id, organization_id, "
            "workflow_run_id, task_run_id, seq, kind, from_state, to_state, attempt, fencing_token, detail, "
            "created_at, run_created_at) SELECT gen_random_uuid(), t.organization_id, t.workflow_run_id, "
            "CASE WHEN %s THEN t.id END, %s + g, %s, 'running', %s, 1, 1, '{}', now(), r.created_at "
            "FROM core_taskrun t JOIN core_workflowrun r ON r.id = t.workflow_run_id, generate_series(1, 200) g "
            "WHERE t.workflow_run_id = %s",
            [task_run, first_seq, kind, to_state, run.pk])
        plan = "\n".join(row[0] for row in cur.fetchall())
    calls: dict[str, int] = {}
    # On a partitioned table a row trigger is named with the partition that fired it.
    for name, n in re.findall(r"Trigger (\w+)(?: on \w+)?: calls=(\d+)", plan):
        calls[name] = calls.get(name, 0) + int(n)
    return calls


def test_the_notification_trigger_runs_only_for_a_runs_end_and_a_task_runs_failure(make_org):
    """What an organization without endpoints pays: claims, starts, successes and retries
    never call ff_notification_record (its WHEN clause), and its end writes nothing."""
    org = make_org()
    run = start_run(workflow=workflow(org, "x"), actor=actor_for(org))
    for n, (kind, task_run, to_state) in enumerate([("claimed", True, "running"), ("started", True, "running"),
                                                    ("succeeded", True, "succeeded"),
                                                    ("attempt_failed", True, "ready")]):
        calls = _trigger_calls(run, kind=kind, task_run=task_run, to_state=to_state, first_seq=1000 * (n + 1))
        assert "ff_notification_record" not in calls and calls["ff_taskrunevent_notify"] == 200, (kind, calls)
    assert _trigger_calls(run, kind="run_finished", task_run=False, to_state="failed",
                          first_seq=9000)["ff_notification_record"] == 200
    assert _trigger_calls(run, kind="attempt_failed", task_run=True, to_state="failed",
                          first_seq=10000)["ff_notification_record"] == 200
    assert NotificationEvent.objects.unscoped().filter(organization_id=org.pk).count() == 0


def test_staff_read_deliveries_in_the_admin_without_an_endpoints_url(make_org, receiver, settings):
    from django.test import Client

    settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS = 1
    org = make_org()
    endpoint_for(org, receiver.url, events=["run.failed"])
    finished_run(org, "nightly", fail=True)
    receiver.status = 500
    assert deliver_all() == ["dead"]
    delivery = NotificationDelivery.objects.for_organization(org).get()
    staff = User.objects.create_user(email="staff@flowforge.example", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    listing = client.get("/admin/engine/notificationdelivery/?state__exact=dead")
    assert listing.status_code == 200 and str(delivery.pk) in listing.content.decode()
    page = client.get(f"/admin/engine/notificationdelivery/{delivery.pk}/change/").content.decode()
    assert "HTTP 500" in page and "token=abc" not in page and "hooks/flowforge" not in page
