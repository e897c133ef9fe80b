"""The start form generated from a workflow's input schema, in real Chromium (issue 19,
item 7): the fields (date, select, number, checkbox, a fieldset for the nested object, a
JSON textarea for the array) with their titles, descriptions and required markers; the
browser itself refuses a missing required field; a value the schema refuses comes back
from the server next to its field with what was typed kept; the corrected form starts the
run, whose input is typed and holds the schema's defaults. No page breaks the CSP.
Screenshots: test-artifacts/screenshots/start-form.png, start-form-errors.png.

No Dramatiq worker is needed: the run is started and its page shown; nobody runs it."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.models import WorkflowRun
from engine.services import apply_definition
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 1000}
SCHEMA = {
    "type": "object",
    "properties": {
        "day": {"type": "string", "format": "date", "title": "Day to load",
                "description": "Orders of this day (UTC) are loaded."},
        "warehouse": {"type": "string", "pattern": "^[A-Z]{3}$", "title": "Warehouse code",
                      "description": "Three capital letters, e.g. BER."},
        "region": {"enum": ["eu", "us", "apac"], "default": "eu", "title": "Region"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 500, "title": "Row limit"},
        "dry_run": {"type": "boolean", "default": False, "title": "Dry run"},
        "customer": {"type": "object", "title": "Only one customer", "properties": {
            "id": {"type": "string", "title": "Customer id"},
            "tier": {"enum": ["free", "pro"], "title": "Tier"}}, "required": ["id"]},
        "tags": {"type": "array", "items": {"type": "string"}, "title": "Tags",
                 "description": "A JSON array of strings."},
    },
    "required": ["day", "warehouse"],
}


def setup() -> dict:
    org, owner, _ = create_organization(slug="acme", name="Acme Retail", owner_email="ada@acme.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    workflow = apply_definition(actor=actor, document={
        "name": "load-orders", "description": "Load one day of orders into the warehouse.",
        "tasks": [{"key": "extract", "type": "noop"}, {"key": "load", "type": "noop", "depends_on": ["extract"]}],
        "input_schema": SCHEMA})
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"org": org, "workflow": workflow, "session": session.session_key}


def test_the_start_form_is_generated_from_the_schema_and_shows_server_errors_next_to_fields(
        live_server, browser, screenshots):
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    page.route("**/stream/**", lambda route: route.abort())  # no live stream: see test_browser_workers
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(f"{base}/workflows/{data['workflow'].pk}/")
    form = page.locator("form[action$='/start/']")
    day = form.get_by_label("Day to load")
    assert day.get_attribute("type") == "date" and day.get_attribute("required") is not None
    assert form.get_by_label("Region").evaluate("e => e.tagName") == "SELECT"
    assert form.get_by_label("Region").input_value() == '"eu"'  # the default
    assert form.get_by_label("Row limit").input_value() == "500"
    assert form.get_by_label("Dry run").get_attribute("type") == "checkbox"
    assert form.locator("fieldset legend").inner_text().strip() == "Only one customer"
    assert form.get_by_label("Tags").evaluate("e => e.tagName") == "TEXTAREA"
    assert "Three capital letters, e.g. BER." in form.inner_text()
    assert form.locator("label", has_text="Warehouse code").locator(".req").count() == 1
    assert form.locator("label", has_text="Row limit").locator(".req").count() == 0
    page.screenshot(path=str(screenshots / "start-form.png"), full_page=True)

    # The browser refuses a form without its required date: nothing is sent.
    form.get_by_label("Warehouse code").fill("BER")
    form.get_by_role("button", name="Start run").click()
    assert day.evaluate("e => e.validity.valueMissing") is True
    assert re.search(r"/workflows/[0-9a-f-]{36}/$", page.url)

    # What only the schema knows (a pattern, a fieldset's required id) comes back from the server.
    day.fill("2026-03-01")
    form.get_by_label("Warehouse code").fill("berlin")
    form.get_by_label("Region").select_option(label="us")
    form.get_by_label("Row limit").fill("250")
    form.get_by_label("Tier").select_option(label="pro")
    form.get_by_label("Tags").fill('["nightly", 7]')
    form.get_by_role("button", name="Start run").click()
    page.wait_for_load_state()
    assert re.search(r"/workflows/[0-9a-f-]{36}/start/$", page.url)
    warehouse_errors = page.locator("#id_in-1_errors")
    assert warehouse_errors.inner_text() == "Does not match the pattern '^[A-Z]{3}$'"
    assert page.locator("#id_in-5-0_errors").inner_text() == "A value is required"
    assert page.locator("#id_in-6_errors").inner_text() == "/1: 7 is not of type 'string'"
    # Each message sits in the field it is about, and what was typed is kept.
    field = page.locator(".field", has=page.locator("#id_in-1"))
    assert field.locator(".errorlist").inner_text() == warehouse_errors.inner_text()
    assert page.get_by_label("Warehouse code").input_value() == "berlin"
    assert page.get_by_label("Region").input_value() == '"us"'
    assert orm(lambda: WorkflowRun.objects.for_organization(data["org"]).count()) == 0
    page.locator("#id_in-1").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "start-form-errors.png"), full_page=True)

    # Corrected, the form starts the run with typed values and the defaults.
    page.get_by_label("Warehouse code").fill("BER")
    page.get_by_label("Customer id").fill("c-42")
    page.get_by_label("Tags").fill('["nightly", "eu-west"]')
    page.get_by_label("Dry run").check()
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}/$"))
    run = orm(lambda: WorkflowRun.objects.for_organization(data["org"]).get())
    assert page.url.endswith(f"/runs/{run.pk}/")
    assert run.input == {"day": "2026-03-01", "warehouse": "BER", "region": "us", "limit": 250, "dry_run": True,
                         "customer": {"id": "c-42", "tier": "pro"}, "tags": ["nightly", "eu-west"]}
    assert not csp, csp
    context.close()
