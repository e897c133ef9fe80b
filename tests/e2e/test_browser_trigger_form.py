"""The new-trigger form in real Chromium: after a POST refused for its schedule, editing the
schedule hides the server's error under the field, and the live preview (htmx) speaks for
the new text instead.

A review found the stale error ("'61 * * * *' is not a valid cron expression") still under
the field while the preview said "'0 0 30 2 *' never fires": two different messages at once.
Screenshots: test-artifacts/screenshots/trigger-form-refused.png, trigger-form-edited.png.

No Dramatiq worker is needed: the form and its preview are served by the live server.
"""

from __future__ import annotations

import pytest

from engine.services import apply_definition
from tenancy.services import create_organization
from tests.e2e.conftest import orm, session_for, signed_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FIELD = "#id_cron_expression"
ERRORS = "#id_cron_expression_errors"
PREVIEW = "#cron-preview"


def setup() -> str:
    org, owner, _ = create_organization(slug="acme", name="Acme Reports", owner_email="ada@acme.example")
    apply_definition(organization=org, document={"name": "daily-report", "tasks": [{"key": "report", "type": "noop"}]})
    return session_for(owner, org)


def test_editing_the_schedule_hides_the_stale_server_error(live_server, browser, screenshots):
    base = live_server.url
    page = signed_in_page(browser, base, orm(setup), width=1280, height=900)
    page.goto(base + "/triggers/new/")
    page.wait_for_load_state("load")
    # No name either: that field's error is another one, which stays.
    page.evaluate("document.querySelector('#id_name').removeAttribute('required')")
    page.fill(FIELD, "61 * * * *")
    with page.expect_navigation():
        page.locator("button[type=submit]", has_text="Create trigger").click()

    # The refused POST: the error under the field, the preview pointing to it.
    error = page.locator(ERRORS)
    assert error.is_visible() and page.locator("#id_name_errors").is_visible()
    assert "'61 * * * *' is not a valid cron expression" in error.inner_text()
    assert page.locator(FIELD).get_attribute("aria-invalid") == "true"
    page.screenshot(path=str(screenshots / "trigger-form-refused.png"), full_page=True)

    # Editing the field: the live preview says what the new text does, and the old error is gone.
    page.fill(FIELD, "")
    page.locator(FIELD).press_sequentially("0 0 30 2 *")
    page.locator(PREVIEW, has_text="never fires").wait_for()
    assert "'0 0 30 2 *' never fires" in page.locator(PREVIEW).inner_text()
    assert not error.is_visible()
    assert page.locator(FIELD).get_attribute("aria-invalid") is None
    assert "61 * * * *" not in page.locator("main").inner_text()
    page.screenshot(path=str(screenshots / "trigger-form-edited.png"), full_page=True)

    # The name's error stays: only the edited field's error is stale.
    assert page.locator("#id_name_errors").is_visible()
    assert not [m for m in page.console_messages if "Content Security Policy" in m], page.console_messages
    page.context.close()
