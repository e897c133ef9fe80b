"""A long organization name wraps instead of widening the page: with a name of 120 "W"s (one
unbroken word) or a name with a 40-character word, the dashboard, the runs, workflows,
triggers, members, settings, API keys, audit and organizations pages are no wider than the
window at 1280 px and on a 390 px phone, with and without a workflow, a trigger and a run.

A review found /runs/ 1,865 px wide at 1280 px with the 120-"W" name: the subtitle "Every run
of WWW…" did not wrap; a 40-character word overflowed at 390 px.
Screenshots: test-artifacts/screenshots/long-name-<page>-<width>.png.

No Dramatiq worker is needed: only the pages' layout is looked at.
"""

from __future__ import annotations

import pytest

from engine.services import apply_definition, start_run
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm, session_for, signed_in_page

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# The organization's name (one unbroken word of 120 characters; a name with a word of 40) and
# whether it has a workflow, a trigger and a run (else the pages show their empty states, which
# name the organization too).
CASES = {"w120": ("W" * 120, True), "word40": ("Acme Pneumonoultramicroscopicsilicovolcanocon Labs", True),
         "w120-empty": ("W" * 120, False)}
PAGES = {"dashboard": "/", "runs": "/runs/", "workflows": "/workflows/", "triggers": "/triggers/",
         "members": "/members/", "settings": "/settings/", "api-keys": "/api-keys/", "audit": "/audit/",
         "orgs": "/orgs/"}
# The widest element whose right edge is past the window, to say what overflows.
WIDEST = """(() => {
  const w = document.documentElement.clientWidth;
  let worst = null;
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.right > w + 0.5 && (!worst || r.right > worst.right))
      worst = {right: Math.round(r.right), tag: e.tagName, cls: e.className, text: (e.textContent || '').trim().slice(0, 40)};
  }
  return {scrollWidth: document.documentElement.scrollWidth, worst};
})()"""


def setup(name: str, filled: bool) -> str:
    """The owner's session of an organization named ``name``; if ``filled``, with a workflow, a
    trigger and a run, so the pages have their tables as well as their headings."""
    org, owner, _ = create_organization(slug="long", name=name, owner_email="ada@long.example")
    if filled:
        actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
        wf = apply_definition(actor=actor, document={"name": "daily-report", "tasks": [{"key": "report", "type": "noop"}]})
        create_trigger(actor=actor, data={"name": "nightly", "workflow_name": "daily-report",
                                          "cron_expression": "0 6 * * *", "timezone": "UTC"})
        start_run(workflow=wf)
    return session_for(owner, org)


@pytest.mark.parametrize("kind", list(CASES))
def test_a_long_organization_name_wraps_on_every_page(live_server, browser, screenshots, kind):
    base = live_server.url
    page = signed_in_page(browser, base, orm(lambda: setup(*CASES[kind])))
    # The dashboard's and runs page's live stream would hold a server thread (and a connection to
    # the test database) past the test: refused, the pages poll their fragment instead.
    page.route("**/stream/**", lambda route: route.abort())
    too_wide = []
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 800})
        for label, path in PAGES.items():
            page.goto(base + path)
            page.wait_for_load_state("load")
            assert page.locator("main h1").count() == 1, path
            found = page.evaluate(WIDEST)
            if found["scrollWidth"] > width:
                too_wide.append((width, path, found))
            page.screenshot(path=str(screenshots / f"long-name-{kind}-{label}-{width}.png"), full_page=True)
    assert not too_wide, "\n".join(map(str, too_wide))
    page.context.close()
