"""The workflow grid and the members' confirmation steps in real Chromium (issue 20): the
grid shows runs × tasks as colored cells inside its card, a cell opens that task's panel,
"Older"/"Newer" walk the runs; leaving an organization asks first (a page, no script) and
Cancel changes nothing. Screenshots: test-artifacts/screenshots/workflow-grid.png and
var/screenshots/workflow-grid.png, leave-confirm.png."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.services import apply_definition, start_run
from flowforge.stack import BASE_DIR
from tenancy.actors import Actor
from tenancy.models import Membership, Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 1000}
RUNS = 30  # more than a page (25): "Older" has somewhere to go
TASKS = ["extract", "clean", "validate", "load", "report"]


def setup() -> dict:
    from tests.unit.test_web_runs import drive_run

    org, owner, _ = create_organization(slug="gridco", name="Grid Co", owner_email="ops@gridco.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    workflow = apply_definition(actor=actor, document={"name": "daily", "tasks": [
        {"key": "extract", "type": "noop"},
        {"key": "clean", "type": "noop", "depends_on": ["extract"]},
        {"key": "validate", "type": "fail", "depends_on": ["clean"], "config": {"message": "3 rows out of range"}},
        {"key": "load", "type": "noop", "depends_on": ["clean"]},
        {"key": "report", "type": "noop", "depends_on": ["validate", "load"], "trigger_rule": "all_done"}]})
    runs = []
    for i in range(RUNS):
        run = start_run(workflow=workflow, actor=actor)
        # Every third run's validate fails; the newest run stays unstarted (its roots ready).
        runs.append(run if i == RUNS - 1 else drive_run(run, fail={"validate"} if i % 3 == 0 else ()))
    member = Membership.objects.for_organization(org).get(user=owner)
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"workflow": workflow, "runs": runs, "session": session.session_key, "member": member.pk}


def test_the_grid_shows_runs_by_tasks_and_a_cell_opens_the_task_panel(live_server, browser, screenshots):
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(f"{base}/workflows/{data['workflow'].pk}/")
    page.click("a.grid-link")
    page.wait_for_selector("table.wf-grid")
    assert page.url.endswith(f"/workflows/{data['workflow'].pk}/grid/")
    # 25 newest runs x 5 tasks, rows in the DAG's order.
    assert page.locator("th.grid-run").count() == 25
    assert page.locator("th.grid-task code").all_inner_texts() == TASKS
    cells = page.locator("table.wf-grid td a.gc")
    assert cells.count() == 25 * len(TASKS)
    # The newest run (rightmost) has not started: extract ready, the rest pending.
    column = [page.locator(f"table.wf-grid tbody tr:nth-child({i + 1}) td").last.locator("a.gc")
              .get_attribute("data-state") for i in range(len(TASKS))]
    assert column == ["ready", "pending", "pending", "pending", "pending"]
    # The grid is inside its card and the cells are drawn (visible, 16 px squares).
    card = page.locator("section.grid-card").bounding_box()
    table = page.locator("table.wf-grid").bounding_box()
    assert card["x"] <= table["x"] and table["x"] + table["width"] <= card["x"] + card["width"]
    box = cells.first.bounding_box()
    assert box["width"] >= 14 and box["height"] >= 14
    failed = page.locator('table.wf-grid td a.gc[data-state="failed"]')
    assert failed.count() >= 1
    for target in (screenshots / "workflow-grid.png", BASE_DIR / "var" / "screenshots" / "workflow-grid.png"):
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target), full_page=True)

    # A failed cell opens that task's panel, with its error.
    failed.first.click()
    page.wait_for_selector("text=3 rows out of range")
    assert "/tasks/" in page.url

    # Older, then Newer, walk the runs by keyset.
    page.go_back()
    page.click("a[rel=prev]")
    page.wait_for_selector("table.wf-grid")
    assert page.locator("th.grid-run").count() == RUNS - 25
    page.click("a[rel=next]")
    page.wait_for_selector("table.wf-grid")
    assert page.locator("th.grid-run").count() == 25
    assert not csp, csp


def test_leaving_an_organization_asks_first_and_cancel_changes_nothing(live_server, browser):
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT, java_script_enabled=False)  # works without script
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    # The only owner is told first that leaving is refused, with no button that would try.
    page.goto(f"{base}/members/")
    page.click("text=Leave organization")
    page.wait_for_selector("h1:has-text('You cannot leave Grid Co yet')")
    assert page.locator("button:has-text('Leave organization')").count() == 0
    page.click("text=Back to members")
    page.wait_for_selector("h1:has-text('Members of Grid Co')")

    def second_owner():
        from tenancy.models import Organization, User

        org = Organization.objects.get(slug="gridco")
        user = User.objects.create_user(email="second@gridco.example", password="a-long-password-123")
        Membership.objects.create(organization=org, user=user, role=Role.OWNER)

    orm(second_owner)
    page.click("text=Leave organization")
    page.wait_for_selector("h1:has-text('Leave Grid Co?')")
    target = BASE_DIR / "var" / "screenshots" / "leave-confirm.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target))
    page.click("text=Cancel")
    page.wait_for_selector("h1:has-text('Members of Grid Co')")
    assert orm(lambda: Membership.objects.unscoped().filter(pk=data["member"]).exists())
    # The confirmation's own button acts: now the member has left.
    page.click("text=Leave organization")
    page.click("button:has-text('Leave organization')")
    page.wait_for_selector("text=You left Grid Co")
    assert not orm(lambda: Membership.objects.unscoped().filter(pk=data["member"]).exists())
