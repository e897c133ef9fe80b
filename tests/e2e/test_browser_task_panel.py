"""The run page's task panel in real Chromium with a real worker (issue 19): the run's input
on the run page; a task's key opens its panel in place (htmx) and the URL names it; a
running task's panel shows its log lines as they come (it refreshes itself) and stops
refreshing once the task ends; a failed task's panel shows each attempt with its error,
full traceback and lines (a secret's value redacted, markup escaped), its input as
configured (the secret as its reference) and its upstream outputs, whose keys open theirs;
the panel's URL is a page of its own; nothing breaks the CSP. Screenshots:
test-artifacts/screenshots/task-panel-running.png, task-panel-failed.png, task-panel-page.png.
"""

from __future__ import annotations

import re
import secrets as pysecrets

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.models import TaskRun, WorkflowRun
from engine.services import apply_definition, start_run
from tenancy import vault
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 1000}


def setup() -> dict:
    """A run of a workflow whose ``tick`` logs a line every 0.1 s for 10 s while ``load``
    (after ``extract``) logs, prints and raises twice; the owner's session key."""
    org, owner, _ = create_organization(slug="nightly", name="Nightly Co", owner_email="oncall@nightly.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    value = "sk_live_" + pysecrets.token_urlsafe(24)
    vault.set_secret(actor=actor, name="WAREHOUSE", value=value)
    workflow = apply_definition(actor=actor, document={"name": "nightly-load", "tasks": [
        {"key": "extract", "type": "noop"},
        {"key": "load", "type": "python", "depends_on": ["extract"], "max_attempts": 2, "retry_backoff_seconds": 0,
         "config": {"callable": "tests.callables.log_print_raise", "params": {"secret": "{{ secrets.WAREHOUSE }}"}}},
        {"key": "tick", "type": "python",
         "config": {"callable": "tests.callables.slow_logger", "params": {"seconds": 10, "every": 0.1}}},
    ]})
    run = start_run(workflow=workflow, actor=actor, run_input={"rows": 31, "note": "<b>not bold</b>"})
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    ids = dict(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("task__key", "id"))
    return {"run": run, "session": session.session_key, "value": value, "ids": ids}


def run_state(run_id) -> str:
    return orm(lambda: WorkflowRun.objects.unscoped().get(pk=run_id).state)


def test_the_task_panel_shows_a_running_tasks_lines_and_a_failed_tasks_attempts_and_traceback(
        live_server, e2e_stack, browser, screenshots):
    data = orm(setup)
    run, ids = data["run"], data["ids"]
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    # No live stream: its process-wide LISTEN connection would outlive the test and keep the
    # test database from being dropped (the page polls its fragment instead).
    page.route("**/stream/**", lambda route: route.abort())
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    run_url = f"{base}/runs/{run.pk}/"
    page.goto(run_url)
    # The run's input, escaped, with the link to the whole of it.
    run_input = page.locator("pre.run-input")
    assert '"note": "<b>not bold</b>"' in run_input.inner_text() and run_input.locator("b").count() == 0
    assert page.locator(f"a[href='/runs/{run.pk}/input/']").count() == 1

    # tick is running: its key opens its panel in place, which shows its lines as they come.
    page.wait_for_selector("#task-tick .badge.state-running", timeout=30_000)
    page.locator("#task-tick a.task-link").click()
    panel = page.locator("#task-panel .task-panel")
    panel.wait_for(timeout=30_000)
    page.wait_for_url(re.compile(rf"/runs/{run.pk}/tasks/{ids['tick']}/$"))
    assert panel.get_attribute("data-task-key") == "tick"
    assert panel.locator(".attempt").get_attribute("data-outcome") == "running"
    assert page.locator("#task-panel .task-panel[hx-trigger]").count() == 1  # it refreshes itself
    first_count = panel.locator(".log-line").count()
    page.wait_for_function(
        "n => document.querySelectorAll('#task-panel .task-panel .attempt-running .log-line').length > n + 5",
        arg=first_count, timeout=30_000)
    assert "tests.callables.slow: tick 1" in panel.locator(".log-lines").inner_text()
    page.locator("#task-panel").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "task-panel-running.png"), full_page=True)
    # Once tick has succeeded its panel says so, and stops refreshing.
    page.wait_for_selector("#task-panel .task-panel[data-terminal='1'] .attempt[data-outcome='succeeded']",
                           timeout=30_000)
    assert page.locator("#task-panel .task-panel[hx-trigger]").count() == 0

    # load failed twice: its panel shows both attempts with their errors, tracebacks and lines.
    for _ in range(300):
        if run_state(run.pk) == "failed":
            break
        page.wait_for_timeout(100)
    assert run_state(run.pk) == "failed"
    page.goto(run_url)
    page.locator("#task-load a.task-link").click()
    page.wait_for_selector("#task-panel .task-panel[data-task-key='load']", timeout=30_000)
    panel = page.locator("#task-panel .task-panel")
    attempts = panel.locator(".attempt")
    assert attempts.count() == 2
    assert [attempts.nth(i).get_attribute("data-outcome") for i in range(2)] == ["retried", "failed"]
    for i in range(2):
        attempt = attempts.nth(i)
        assert attempt.locator(".attempt-error").inner_text() == "ValueError: no rows left after 31 tries"
        trace = attempt.locator(".traceback-text").inner_text()
        assert trace.startswith("Traceback (most recent call last):")
        assert "in _inner_step" in trace and trace.rstrip().endswith("ValueError: no rows left after 31 tries")
        log = attempt.locator(".log-lines").inner_text()
        assert "tests.callables: connecting with token [redacted]" in log
        assert f"attempt {i + 1} printed this" in log and "to stderr" in log
    assert data["value"] not in page.content()
    assert "{{ secrets.WAREHOUSE }}" in panel.locator("pre.task-config").inner_text()
    assert '"rows": 31' not in panel.locator("pre.task-config").inner_text()
    assert panel.locator("tr[data-upstream='extract'] .badge.state-succeeded").count() == 1
    page.locator("#task-panel").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "task-panel-failed.png"), full_page=True)

    # The upstream task's key opens its panel.
    panel.locator("tr[data-upstream='extract'] a").click()
    page.wait_for_selector("#task-panel .task-panel[data-task-key='extract']", timeout=30_000)
    assert page.locator("#task-panel .attempt").get_attribute("data-outcome") == "succeeded"

    # The panel's URL is a page of its own.
    page.goto(f"{base}/runs/{run.pk}/tasks/{ids['load']}/")
    assert page.locator(".task-page .task-panel .attempt").count() == 2
    assert page.locator(f".crumbs a[href='/runs/{run.pk}/']").count() == 1
    page.screenshot(path=str(screenshots / "task-panel-page.png"), full_page=True)
    assert not csp, csp
    context.close()
