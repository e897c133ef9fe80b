"""A cron trigger's page in real Chromium (issue 19, item 5): the clock's note on instants
it did not fire, with a link that fills the backfill form with their range; the form's
preview (the run count, before anything starts); starting the backfill; its progress in
the backfills table; and a run it started showing its instant. No page breaks the CSP.
Screenshots: test-artifacts/screenshots/trigger-backfill-preview.png, trigger-backfilled.png.

No Dramatiq worker is needed: the backfill's pass is run in this process (what the
``advance_backfills`` actor does), and its runs need not execute to be shown."""

from __future__ import annotations

import datetime as dt

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.backfill import advance_backfill
from engine.cron import process_trigger
from engine.models import ScheduledTrigger, TriggerBackfill, WorkflowRun
from engine.services import apply_definition
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 900}
UTC = dt.UTC


def setup() -> dict:
    """An organization with a daily 06:00 Europe/Berlin trigger whose clock was down from
    1 to 3 March 2026 (catch-up "latest": two instants not fired); the owner's session."""
    org, owner, _ = create_organization(slug="acme", name="Acme Reports", owner_email="ada@acme.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    apply_definition(actor=actor, document={"name": "daily-report", "tasks": [{"key": "report", "type": "noop"}]})
    trigger = create_trigger(actor=actor, data={
        "name": "daily report", "workflow_name": "daily-report", "cron_expression": "0 6 * * *",
        "timezone": "Europe/Berlin", "input": {"region": "eu"}, "catch_up": "latest"})
    ScheduledTrigger.objects.for_organization(org).filter(pk=trigger.pk).update(
        next_fire_at=dt.datetime(2026, 3, 1, 5, tzinfo=UTC))
    process_trigger(trigger.pk, dt.datetime(2026, 3, 3, 5, 0, 2, tzinfo=UTC))
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"org": org, "trigger": trigger, "session": session.session_key}


def finish_backfill(org) -> None:
    backfill = TriggerBackfill.objects.for_organization(org).get()
    while backfill.state == "running":
        advance_backfill(backfill.pk)
        backfill.refresh_from_db()


def test_the_trigger_page_previews_starts_and_shows_a_backfill(live_server, browser, screenshots):
    data = orm(setup)
    base, trigger = live_server.url, data["trigger"]
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    page.route("**/stream/**", lambda route: route.abort())
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    # The list flags the trigger; its page says which instants the clock did not fire.
    page.goto(base + "/triggers/")
    assert page.locator("td[data-label=Name] .badge.warn").inner_text() == "missed"
    page.locator("td[data-label=Name] a", has_text="daily report").click()
    page.wait_for_url(f"{base}/triggers/{trigger.pk}/")
    missed = page.locator(".missed-instants")
    assert "2 due instants were not fired" in missed.inner_text()
    assert "Sun 1 Mar 2026, 06:00 CET – Mon 2 Mar 2026, 06:00 CET" in missed.inner_text()

    # "Backfill them" fills the form with that range; the preview counts before anything starts.
    missed.locator("a", has_text="Backfill them").click()
    assert page.locator("#id_start").input_value() == "2026-03-01T06:00"
    assert page.locator("#id_end").input_value() == "2026-03-02T06:00"
    page.fill("#id_start", "2026-03-01")
    page.fill("#id_end", "2026-03-31")
    page.fill("#id_max_active_runs", "31")
    page.locator("button[data-action=preview]").click()
    page.wait_for_load_state()
    preview = page.locator(".backfill-preview")
    assert preview.locator(".backfill-count").inner_text() == "30 runs to start"
    assert "31 instants" in preview.inner_text() and "1 of them already with a run" in preview.inner_text()
    assert orm(lambda: TriggerBackfill.objects.for_organization(data["org"]).count()) == 0
    page.screenshot(path=str(screenshots / "trigger-backfill-preview.png"), full_page=True)

    page.locator("button[data-action=start-backfill]").click()
    page.wait_for_url(f"{base}/triggers/{trigger.pk}/#backfills")
    assert "Backfill of daily report started: 30 runs to start" in page.locator(".messages, .message").first.inner_text()
    row = page.locator("table.backfills tbody tr")
    assert row.count() == 1 and "Running" in row.inner_text()

    orm(lambda: finish_backfill(data["org"]))
    page.reload()
    row = page.locator("table.backfills tbody tr")
    assert "Succeeded" in row.inner_text() and "30 / 30" in row.inner_text()
    assert "runs started; 1 instant passed over: already had a run" in row.inner_text()
    assert page.locator(".missed-instants").count() == 0  # its instants all have runs now
    assert page.locator("table.firings tbody tr").count() == 20
    page.screenshot(path=str(screenshots / "trigger-backfilled.png"), full_page=True)

    # A run it started says which instant it is for.
    run_id = orm(lambda: WorkflowRun.objects.for_organization(data["org"]).get(
        scheduled_for=dt.datetime(2026, 3, 29, 4, tzinfo=UTC)).pk)
    page.goto(f"{base}/runs/{run_id}/")
    assert page.locator(".run-scheduled-for time").get_attribute("datetime") == "2026-03-29T04:00:00+00:00"
    assert page.locator(".run-facts .source").inner_text().lower() == "backfill"
    assert csp == []
    context.close()
