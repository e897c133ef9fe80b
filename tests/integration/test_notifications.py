"""Issue 19, "Done when" (notifications), with real Dramatiq worker processes and the clock:
a webhook endpoint on loopback (allowed by FLOWFORGE_EGRESS_ALLOW, as a test deployment would)
receives each event of a succeeded, a failed and a cancelled run once, with a valid signature;
while it answers 500, a delivery is retried with backoff and then dead-lettered; a replay
through the API delivers it; and the member subscribed to the failing workflow gets one email.

The receiver is a local HTTP server in this process (tests.webhook_receiver); the emails are
written as files by the worker processes (tests/settings.py, FLOWFORGE_TEST_MAIL_DIR).
"""

from __future__ import annotations

import email
import json
import time

import pytest
from django.test import Client

from engine import notifications, webhooks
from engine.models import NotificationAttempt, NotificationDelivery, NotificationEvent, TaskRun
from engine.services import apply_definition, cancel_run, start_run
from flowforge.stack import wait_until
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role, User
from tests.integration.conftest import wait_for_run_terminal
from tests.webhook_receiver import receiver_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BACKOFF_BASE = 0.5  # seconds: attempt n is retried after 0.5 * 2^(n-1) s, times 0.5 to 1


def _owner(org) -> Actor:
    user = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    return Actor(organization=org, role=Role.OWNER, user=user, channel="cli")


def _mails(directory) -> list[email.message.Message]:
    if not directory.exists():
        return []
    return [email.message_from_bytes(p.read_bytes()) for p in sorted(directory.iterdir())]


def _deliveries(org, **filters) -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.for_organization(org).filter(**filters).select_related("event"))


def test_webhooks_are_delivered_once_signed_retried_dead_lettered_and_replayed(stack, org, settings, tmp_path):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]  # this process stores the loopback URL
    mail_dir = tmp_path / "mail"
    stack.env.update(
        FLOWFORGE_EGRESS_ALLOW="127.0.0.1/32",
        FLOWFORGE_CLOCK_NOTIFY_SECONDS="0.2",
        FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS=str(BACKOFF_BASE),
        FLOWFORGE_NOTIFY_BACKOFF_MAX_SECONDS="5",
        FLOWFORGE_NOTIFY_MAX_ATTEMPTS="3",
        FLOWFORGE_TEST_MAIL_DIR=str(mail_dir),
    )
    owner = _owner(org)
    watcher = User.objects.create_user(email="on-call@notify.example")
    Membership.objects.create(organization=org, user=watcher, role=Role.MEMBER)
    notifications.set_failure_subscription(
        actor=Actor(organization=org, role=Role.MEMBER, user=watcher, channel="web"), workflow_name="breaks",
        subscribed=True)
    fine = apply_definition(actor=owner, document={"name": "fine", "tasks": [{"key": "a", "type": "noop"}]})
    breaks = apply_definition(actor=owner, document={"name": "breaks", "tasks": [
        {"key": "step", "type": "fail", "config": {"message": "disk full"}}]})
    naps = apply_definition(actor=owner, document={"name": "naps", "tasks": [
        {"key": "nap", "type": "sleep", "config": {"seconds": 30}}]})

    with receiver_server() as receiver:
        endpoint, secret = notifications.create_endpoint(
            actor=owner, url=receiver.url,
            event_types=["run.succeeded", "run.failed", "run.cancelled", "task.failed"])
        stack.start_worker(processes=1, threads=4)
        stack.start_clock()

        # --- each event once, signed ---------------------------------------------------------------
        ok_run = start_run(workflow=fine, actor=owner)
        bad_run = start_run(workflow=breaks, actor=owner)
        nap_run = start_run(workflow=naps, actor=owner)
        assert wait_for_run_terminal(ok_run) == "succeeded"
        assert wait_for_run_terminal(bad_run) == "failed"
        wait_until(lambda: TaskRun.objects.for_organization(org).filter(workflow_run=nap_run, state="running",
                                                                         started_at__isnull=False).exists(),
                   timeout=30, what="the sleep task to start")
        assert cancel_run(run=nap_run, actor=owner) is True
        wait_until(lambda: len(_deliveries(org, state="succeeded")) == 5, timeout=30,
                   what="4 webhook deliveries and 1 email to succeed")
        time.sleep(1.5)  # a duplicate would be sent by now (the clock ticks every 0.2 s)
        events = {str(e.pk): e for e in NotificationEvent.objects.for_organization(org)}
        assert len(receiver.received) == 4
        got = {}
        for request in receiver.received:
            webhooks.verify_signature(secret, request["headers"]["flowforge-signature"], request["body"])
            document = json.loads(request["body"])
            assert document["id"] == request["headers"]["flowforge-event-id"]
            got[document["type"]] = document
        assert set(got) == {"run.succeeded", "task.failed", "run.failed", "run.cancelled"}
        assert {d["id"] for d in got.values()} == set(events)  # each event once
        assert got["run.succeeded"]["data"]["run"]["id"] == str(ok_run.pk)
        assert got["run.failed"]["data"]["run"]["id"] == str(bad_run.pk)
        assert got["task.failed"]["data"]["task_run"]["task_key"] == "step"
        assert "disk full" in got["task.failed"]["data"]["task_run"]["error"]
        assert got["run.cancelled"]["data"]["run"]["id"] == str(nap_run.pk)

        (message,) = _mails(mail_dir)
        assert message["To"] == watcher.email
        assert "a run of breaks failed" in message["Subject"]
        text = message.get_payload(decode=True).decode()
        assert str(bad_run.pk) in text and "step (attempt 1)" in text and "disk full" in text

        # --- a 500 is retried with backoff, then dead-lettered --------------------------------------
        receiver.status = 500
        before = len(receiver.received)
        retried_run = start_run(workflow=fine, actor=owner)
        assert wait_for_run_terminal(retried_run) == "succeeded"

        def dead():
            rows = [d for d in _deliveries(org, state="dead") if d.event.workflow_run_id == retried_run.pk]
            return rows[0] if rows else None

        dead_delivery = wait_until(dead, timeout=30, what="the delivery to be dead-lettered")
        attempts = list(NotificationAttempt.objects.for_organization(org).filter(delivery=dead_delivery)
                        .order_by("number"))
        assert [(a.number, a.status_code, a.retrying) for a in attempts] == [(1, 500, True), (2, 500, True),
                                                                             (3, 500, False)]
        # Each retry waited at least half its backoff: 0.5 * 2^(n-1) s times 0.5 to 1.
        for n, (earlier, later) in enumerate(zip(attempts, attempts[1:], strict=False), start=1):
            gap = (later.started_at - earlier.started_at).total_seconds()
            assert gap >= BACKOFF_BASE * 2 ** (n - 1) * 0.5, (n, gap)
        failing = receiver.received[before:]
        assert len(failing) == 3
        assert {r["headers"]["flowforge-event-id"] for r in failing} == {str(dead_delivery.event_id)}
        assert len({r["body"] for r in failing}) == 1
        assert [r["headers"]["flowforge-delivery-attempt"] for r in failing] == ["1", "2", "3"]

        # --- a replay through the API delivers it -----------------------------------------------------
        receiver.status = 200
        _key, admin_key = create_api_key(actor=owner, name="ops", role=Role.ADMIN)
        api = Client(headers={"Authorization": f"Bearer {admin_key}"})
        resp = api.post(f"/api/v1/webhooks/{endpoint.pk}/deliveries/{dead_delivery.pk}/replay/")
        assert resp.status_code == 202, resp.content
        replay_id = resp.json()["id"]
        wait_until(lambda: NotificationDelivery.objects.for_organization(org).get(pk=replay_id).state == "succeeded",
                   timeout=30, what="the replay to be delivered")
        time.sleep(1.0)
        replayed = receiver.received[before + 3:]
        assert len(replayed) == 1
        assert replayed[0]["headers"]["flowforge-event-id"] == str(dead_delivery.event_id)
        assert replayed[0]["body"] == failing[0]["body"]
        webhooks.verify_signature(secret, replayed[0]["headers"]["flowforge-signature"], replayed[0]["body"])
    # Every delivery is accounted for: 4 + 1 email + the dead one + its replay.
    states = sorted(d.state for d in _deliveries(org))
    assert states == ["dead"] + ["succeeded"] * 6


def test_a_receiver_that_never_finishes_holds_a_worker_thread_for_the_attempt_limit_only(stack, org, settings):
    """A hostile receiver trickles its answer a byte at a time (each read well within the read
    timeout): the attempt is stopped at FLOWFORGE_NOTIFY_ATTEMPT_SECONDS, counted as a failure
    and retried later; meanwhile the endpoint never has more than one delivery in flight
    (FLOWFORGE_NOTIFY_IN_FLIGHT_PER_TARGET), and another organization's endpoint is served."""
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    stack.env.update(
        FLOWFORGE_EGRESS_ALLOW="127.0.0.1/32",
        FLOWFORGE_CLOCK_NOTIFY_SECONDS="0.2",
        FLOWFORGE_NOTIFY_ATTEMPT_SECONDS="2",
        FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS="5",
        FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS="60",
    )
    from tenancy.services import create_organization

    other, other_owner, _ = create_organization(slug="notify-other", name="Other", owner_email="o@other.example")
    owner, their_owner = _owner(org), Actor(organization=other, role=Role.OWNER, user=other_owner, channel="cli")
    mine = apply_definition(actor=owner, document={"name": "fine", "tasks": [{"key": "a", "type": "noop"}]})
    theirs = apply_definition(actor=their_owner, document={"name": "fine", "tasks": [{"key": "a", "type": "noop"}]})
    with receiver_server() as slow, receiver_server() as quick:
        slow.trickle = 30.0
        notifications.create_endpoint(actor=owner, url=slow.url, event_types=["run.succeeded"])
        notifications.create_endpoint(actor=their_owner, url=quick.url, event_types=["run.succeeded"])
        stack.start_worker(processes=1, threads=4)
        stack.start_clock()
        runs = [start_run(workflow=mine, actor=owner) for _ in range(3)]
        theirs_run = start_run(workflow=theirs, actor=their_owner)
        for run in [*runs, theirs_run]:
            assert wait_for_run_terminal(run) == "succeeded"
        # The other organization's delivery goes through while the slow one is held.
        wait_until(lambda: len(quick.received) == 1, timeout=30, what="the other organization's delivery")

        def first_stopped():
            return NotificationAttempt.objects.for_organization(org).filter(error__startswith="stopped").first()

        attempt = wait_until(first_stopped, timeout=30, what="the trickling attempt to be stopped")
        assert attempt.error == "stopped after 2 s (FLOWFORGE_NOTIFY_ATTEMPT_SECONDS)"
        assert attempt.retrying is True and attempt.duration_ms < 5000
        time.sleep(1.0)
        # Never two requests at once to the slow endpoint: its deliveries were sent one by one.
        starts = sorted(r["at"] for r in slow.received)
        stops = sorted(a.started_at.timestamp() + a.duration_ms / 1000
                       for a in NotificationAttempt.objects.for_organization(org).exclude(duration_ms=None))
        for i in range(1, len(starts)):
            assert starts[i] >= stops[i - 1] - 0.05, (starts, stops)
        assert len(slow.received) >= 2  # the next delivery went out once the first was stopped
