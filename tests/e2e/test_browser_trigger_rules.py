"""Trigger rules and conditions on the run page, in real Chromium with a real worker
(issue 19): a run whose CEL condition on an upstream output took the ``full`` branch,
whose ``load`` below it failed, and whose ``always`` cleanup ran anyway. The page shows
the failed task with its error, the cleanup succeeded, the branch not taken (``delta``)
skipped with its reason (its condition false) and ``publish`` below the failure skipped
for it; the skipped branch's panel says why, with its condition. The cleanup's Retry
(its rule is met below the failure) runs it again. Screenshots:
test-artifacts/screenshots/run-trigger-rules.png, run-trigger-rules-skipped-panel.png.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from engine.models import TaskRun, WorkflowRun
from engine.services import apply_definition, start_run
from flowforge.stack import wait_until
from tenancy.actors import Actor
from tenancy.models import Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 1000}
DELTA = 'upstream.check.input.mode == "delta"'


def setup() -> dict:
    """A run (input mode "full") of: check (python: its output carries the run input) ->
    full (condition: mode is full) -> load (fails) -> publish; check -> delta (condition:
    mode is delta); cleanup (always) after load and delta. The owner's session key."""
    org, owner, _ = create_organization(slug="warehouse", name="Warehouse Co", owner_email="ops@warehouse.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    workflow = apply_definition(actor=actor, document={"name": "nightly-sync", "tasks": [
        {"key": "check", "type": "python", "config": {"callable": "tests.callables.echo"}},
        {"key": "full", "type": "noop", "depends_on": ["check"], "condition": 'upstream.check.input.mode == "full"'},
        {"key": "delta", "type": "noop", "depends_on": ["check"], "condition": DELTA},
        {"key": "load", "type": "fail", "depends_on": ["full"], "max_attempts": 1,
         "config": {"message": "disk full"}},
        {"key": "publish", "type": "noop", "depends_on": ["load"]},
        {"key": "cleanup", "type": "noop", "depends_on": ["load", "delta"], "trigger_rule": "always"},
    ]})
    run = start_run(workflow=workflow, actor=actor, run_input={"mode": "full"})
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    ids = dict(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("task__key", "id"))
    return {"run": run.pk, "session": session.session_key, "ids": ids}


def run_state(run_id) -> str:
    return orm(lambda: WorkflowRun.objects.unscoped().get(pk=run_id).state)


def task_states(run_id) -> dict[str, tuple[str, int]]:
    return orm(lambda: {tr.task.key: (tr.state, tr.attempt) for tr in TaskRun.objects.unscoped().filter(
        workflow_run_id=run_id).select_related("task")})


def test_the_run_page_shows_the_failure_the_cleanup_that_ran_and_the_branch_not_taken_with_its_reason(
        live_server, e2e_stack, browser, screenshots):
    data = orm(setup)
    run_id, ids = data["run"], data["ids"]
    base = live_server.url
    wait_until(lambda: run_state(run_id) == "failed", timeout=60, what=f"run {run_id} to fail")

    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    # No live stream: its process-wide LISTEN connection would outlive the test and keep the
    # test database from being dropped (the page polls its fragment instead).
    page.route("**/stream/**", lambda route: route.abort())
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    dialogs: list[str] = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)

    page.goto(f"{base}/runs/{run_id}/")
    assert page.locator("h1 .badge.large.state-failed").is_visible()
    badge = {key: page.locator(f"#task-{key} .badge").inner_text()
             for key in ("check", "full", "delta", "load", "publish", "cleanup")}
    assert badge == {"check": "Succeeded", "full": "Succeeded", "delta": "Skipped", "load": "Failed",
                     "publish": "Skipped", "cleanup": "Succeeded"}
    assert page.locator("#task-load .error-text").inner_text() == "RuntimeError: disk full (attempt 1)"

    # Each skipped task says why: the branch not taken, its condition; publish, the failure.
    delta = page.locator("#task-delta .skip-reason")
    assert delta.is_visible()
    assert (delta.get_attribute("data-skip-reason"), delta.inner_text()) == ("condition_false", "condition false")
    assert delta.get_attribute("title") == f"condition false: {DELTA}"
    publish = page.locator("#task-publish .skip-reason")
    assert (publish.get_attribute("data-skip-reason"), publish.inner_text()) == ("upstream_failed", "upstream failed")
    assert publish.get_attribute("title") == (
        "upstream failed: its trigger rule all_success needs every upstream task succeeded")
    for key in ("check", "full", "load", "cleanup"):
        assert page.locator(f"#task-{key} .skip-reason").count() == 0, key
    # Retry is offered where the task's rule is met: the always cleanup below the failure,
    # not publish (all_success) below it.
    assert page.locator("#task-cleanup button[data-action='retry-task']").is_visible()
    assert page.locator("#task-publish button[data-action='retry-task']").count() == 0
    page.screenshot(path=str(screenshots / "run-trigger-rules.png"), full_page=True)

    # The branch not taken's panel says why, with its condition.
    page.locator("#task-delta a.task-link").click()
    panel = page.locator("#task-panel .task-panel[data-task-key='delta']")
    panel.wait_for(timeout=30_000)
    page.wait_for_url(f"{base}/runs/{run_id}/tasks/{ids['delta']}/")
    reason = panel.locator(".task-skip-reason")
    assert reason.get_attribute("data-skip-reason") == "condition_false"
    assert reason.inner_text() == f"Skipped: condition false ({DELTA} was false)."
    assert panel.locator("code.task-condition").inner_text() == DELTA
    # Its attempt started, and ended skipped: the condition was false, the handler did not run.
    assert panel.locator(".attempt").get_attribute("data-outcome") == "skipped"
    assert panel.locator(".attempt .attempt-error").count() == 0
    page.locator("#task-panel").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "run-trigger-rules-skipped-panel.png"), full_page=True)

    # Retrying the cleanup runs it again; the run fails again (load still failed).
    page.goto(f"{base}/runs/{run_id}/")
    page.locator("#task-cleanup button[data-action='retry-task']").click()
    page.wait_for_load_state()
    assert dialogs and dialogs[-1].startswith("Retry task cleanup?")
    assert "Task cleanup was retried. 1 task will run again: cleanup." in page.locator(".messages").inner_text()
    wait_until(lambda: task_states(run_id)["cleanup"] == ("succeeded", 2) and run_state(run_id) == "failed",
               timeout=60, what="the cleanup to run again and the run to fail again")
    page.reload()
    assert page.locator("h1 .badge.large.state-failed").is_visible()
    assert page.locator("#task-cleanup .badge").inner_text() == "Succeeded"
    assert page.locator("#task-delta .skip-reason").inner_text() == "condition false"
    assert not csp, csp
    context.close()
