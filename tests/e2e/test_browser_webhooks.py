"""The webhook pages and the failure-email toggle in real Chromium (issue 19, item 6): an owner
adds an endpoint (its secret shown once, and it verifies what is received), sees a failed
run's delivery dead-lettered in the log with each attempt's answer, replays it, reads a
delivery's attempts and body, and switches on failure emails on the workflow page; no page
breaks the CSP. Screenshots: test-artifacts/screenshots/webhooks-*.png.

No Dramatiq worker is needed: the failed run is driven through the engine's transitions and
its deliveries are attempted in this process as the deliver_notification actor would, against
a local receiver (loopback allowed by FLOWFORGE_EGRESS_ALLOW, as a test deployment would)."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.utils import timezone

from engine import notifier, webhooks
from engine.models import NotificationDelivery
from engine.repositories import notifications as outbox
from engine.services import apply_definition, start_run
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm
from tests.unit.test_web_runs import drive_run
from tests.webhook_receiver import receiver_server

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 900}


def setup() -> dict:
    org, owner, _ = create_organization(slug="acme-hooks", name="Acme Hooks", owner_email="ada@acme-hooks.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    workflow = apply_definition(actor=actor, document={"name": "nightly-report", "tasks": [
        {"key": "extract", "type": "noop"},
        {"key": "load", "type": "fail", "depends_on": ["extract"], "config": {"message": "warehouse refused"}}]})
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = django_settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"org": org, "actor": actor, "workflow": workflow, "session": session.session_key}


def fail_a_run(data) -> None:
    run = start_run(workflow=data["workflow"], actor=data["actor"])
    drive_run(run, fail={"load"})


def attempt_due() -> list:
    return [notifier.deliver(i, t) for i, t in outbox.claim(limit=10, per_org=10, per_target=10, lease_seconds=60)]


def test_an_owner_adds_an_endpoint_reads_its_log_and_replays_a_dead_delivery(live_server, browser, screenshots,
                                                                              settings):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS = 2
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": django_settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    with receiver_server(path="/hooks/flowforge") as receiver:
        page.goto(base + "/webhooks/")
        assert page.locator("h1").inner_text().startswith("Webhooks")
        page.fill("#id_url", receiver.url)
        page.check("input[name=event_types][value='task.failed']")
        page.fill("#id_description", "on-call pager")
        page.screenshot(path=str(screenshots / "webhooks-new.png"), full_page=True)
        page.click("button:has-text('Add endpoint')")
        assert "Your new webhook endpoint" in page.locator("h1").inner_text()
        secret = page.locator("#webhook-secret").input_value()
        assert secret.startswith("whsec_")
        page.screenshot(path=str(screenshots / "webhooks-secret.png"), full_page=True)
        page.click("text=I have saved it")

        # A run fails: its task.failed and run.failed are recorded; the receiver answers 500
        # twice, so both are dead-lettered (two attempts allowed here).
        receiver.status, receiver.body = 500, b'{"error": "upstream down"}'
        orm(lambda: fail_a_run(data))
        assert orm(attempt_due) == ["pending", "pending"]
        orm(lambda: NotificationDelivery.objects.for_organization(data["org"]).update(next_attempt_at=timezone.now()))
        assert orm(attempt_due) == ["dead", "dead"]
        page.reload()
        rows = page.locator("tr.delivery")
        assert rows.count() == 2 and page.locator("tr.delivery.state-dead").count() == 2
        assert "HTTP 500" in rows.first.inner_text() and "Dead-lettered" in rows.first.inner_text()
        page.screenshot(path=str(screenshots / "webhooks-log-dead.png"), full_page=True)

        receiver.status, receiver.body = 200, b"ok"
        page.locator("tr.delivery", has_text="run.failed").locator("button:has-text('Replay')").click()
        assert "Replaying the delivery" in page.locator(".messages").inner_text()
        assert orm(attempt_due) == ["succeeded"]
        page.reload()
        assert page.locator("tr.delivery.state-succeeded").count() == 1
        replayed = receiver.received[-1]
        webhooks.verify_signature(secret, replayed["headers"]["flowforge-signature"], replayed["body"])
        page.screenshot(path=str(screenshots / "webhooks-log-replayed.png"), full_page=True)

        page.locator("tr.delivery.state-dead", has_text="run.failed").locator("a").first.click()
        assert page.locator("table.attempts tbody tr").count() == 2
        assert "upstream down" in page.locator("table.attempts").inner_text()
        assert '"type": "run.failed"' in page.locator("pre.body").inner_text()
        page.screenshot(path=str(screenshots / "webhooks-delivery.png"), full_page=True)

    page.goto(f"{base}/workflows/{data['workflow'].pk}/")
    page.click("button:has-text('Email me when it fails')")
    assert "You will get an email at ada@acme-hooks.example" in page.locator(".messages").inner_text()
    assert page.locator(".failure-emails button").inner_text() == "Stop emailing me"
    page.locator(".failure-emails").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "webhooks-workflow-toggle.png"), full_page=False)
    assert not csp, csp
    context.close()
