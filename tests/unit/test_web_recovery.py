"""The run page's recovery actions (frontend.views.recovery): Resume, and a task row's
Retry, Skip and Mark succeeded — shown to who may operate runs and only where the
service would accept them, each a confirmed POST with the CSRF token, refused with 403
for a viewer, and answered with a message on the run page; a resumed run's page says
who resumed it."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from audit.models import AuditLog
from engine.models import TaskRunEvent
from engine.recovery import resume_run
from engine.repositories import task_runs
from engine.services import apply_definition, start_run
from tenancy.actors import Actor
from tenancy.models import Role
from tests import engine_helpers
from tests.unit.test_recovery import DIAMOND, by_key, drive
from tests.unit.test_web_runs import client_for, member, text


def failed(org, fail=("b",)):
    wf = apply_definition(organization=org, document={"name": f"web-{'-'.join(fail)}", "tasks": DIAMOND})
    run = drive(start_run(workflow=wf), fail=set(fail))
    assert run.state == "failed"
    return run


def row_html(body: str, key: str) -> str:
    return re.search(rf'<tr id="task-{key}".*?</tr>', body, flags=re.S).group(0)


def test_a_member_sees_resume_rerun_and_the_actions_each_task_allows(org):
    run = failed(org)
    body = client_for(member(org, Role.MEMBER)).get(f"/runs/{run.pk}/").content.decode()
    assert 'data-action="resume"' in body and 'data-action="retry"' in body
    assert "Re-run as a new run" in body
    # b failed (retry, mark succeeded, skip); c was skipped below it (its dependency did not
    # succeed: mark succeeded only); a and d succeeded (retry).
    rows = {k: row_html(body, k) for k in "abcd"}
    acts = {k: set(re.findall(r'data-action="(\w+)-task"', h)) for k, h in rows.items()}
    assert acts == {"a": {"retry"}, "b": {"retry", "skip", "mark_succeeded"}, "c": {"mark_succeeded"},
                    "d": {"retry"}}
    b = by_key(run)["b"]
    assert f'action="/runs/{run.pk}/tasks/{b.pk}/mark-succeeded/"' in rows["b"]
    assert 'name="csrfmiddlewaretoken"' in rows["b"] and "data-confirm=" in rows["b"]


def test_a_viewer_sees_no_action_and_each_post_is_refused_with_403(org):
    run = failed(org)
    client = client_for(member(org, Role.VIEWER))
    body = client.get(f"/runs/{run.pk}/").content.decode()
    assert "-task\"" not in body and 'data-action="resume"' not in body and "/resume/" not in body
    b = by_key(run)["b"]
    for url in (f"/runs/{run.pk}/resume/", f"/runs/{run.pk}/tasks/{b.pk}/retry/",
                f"/runs/{run.pk}/tasks/{b.pk}/mark-succeeded/", f"/runs/{run.pk}/tasks/{b.pk}/skip/"):
        assert client.post(url, {"output": "1"}).status_code == 403, url
    run.refresh_from_db()
    assert run.state == "failed"
    assert not TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind__in=[
        "resumed", "reset", "marked_succeeded", "marked_skipped"]).exists()


def test_resume_from_the_page_runs_the_failed_task_again_and_the_page_says_who(org):
    user = member(org, Role.MEMBER)
    client = client_for(user)
    run = failed(org)
    resp = client.post(f"/runs/{run.pk}/resume/", follow=True)
    assert resp.status_code == 200
    page = text(resp)
    assert "The run was resumed. 2 tasks will run again: b, c." in page
    run.refresh_from_db()
    assert run.state == "running"
    assert f"resumed by {user.email}, 2 tasks again" in page
    assert 'id="run-live"' in page  # live again
    assert AuditLog.objects.for_organization(org).get(action="run.resumed").actor_user_id == user.pk
    # The CSRF token is required, as for every form.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(f"/runs/{run.pk}/resume/").status_code == 403


def test_mark_succeeded_takes_json_from_the_form_and_refuses_anything_else(org):
    client = client_for(member(org, Role.MEMBER))
    run = failed(org)
    url = f"/runs/{run.pk}/tasks/{by_key(run)['b'].pk}/mark-succeeded/"
    bad = text(client.post(url, {"output": "{rows: 3}"}, follow=True))
    assert "Output is not valid JSON" in bad and "nothing was changed" in bad
    assert by_key(run)["b"].state == "failed"
    good = text(client.post(url, {"output": '{"rows": 3}', "reason": "loaded by hand"}, follow=True))
    assert "Task b was marked succeeded. 1 task will run again: c." in good
    assert (by_key(run)["b"].output, by_key(run)["c"].state) == ({"rows": 3}, "ready")
    assert "marked_succeeded" in good


def test_a_task_marked_succeeded_shows_the_mark_and_the_output_given_in_its_panel(org):
    """The panel showed only the failed attempts, no output anywhere but the events: now the
    mark, who, why and the output given, escaped."""
    user = member(org, Role.MEMBER)
    client = client_for(user)
    run = failed(org)
    b = by_key(run)["b"]
    client.post(f"/runs/{run.pk}/tasks/{b.pk}/mark-succeeded/",
                {"output": '{"status": 200, "note": "<b>manual</b>"}', "reason": "reviewer test"})
    panel = client.get(f"/runs/{run.pk}/tasks/{b.pk}/", headers={"HX-Request": "true"}).content.decode()
    marked = re.search(r'<section class="attempt attempt-marked" data-outcome="marked_succeeded">(.*?)</section>',
                       panel, re.S).group(1)
    assert "<strong>Marked succeeded</strong>" in marked and f"by {user.email}" in marked
    assert '<p class="marked-reason">Reason: reviewer test</p>' in marked
    assert "&lt;b&gt;manual&lt;/b&gt;" in marked and "<b>manual</b>" not in panel
    # c, which ran after it, is not marked.
    c = client.get(f"/runs/{run.pk}/tasks/{by_key(run)['c'].pk}/", headers={"HX-Request": "true"}).content.decode()
    assert "attempt-marked" not in c


def test_attempts_past_the_budget_after_a_resume_say_the_budget_is_each_times(org):
    user = member(org, Role.MEMBER)
    run = failed(org)  # b failed its one attempt (max_attempts 1)
    resume_run(actor=Actor(organization=org, role=Role.MEMBER, user=user, channel="web"), run=run)
    drive(run, fail={"b"})  # and its second, after the resume
    b = by_key(run)["b"]
    panel = client_for(user).get(f"/runs/{run.pk}/tasks/{b.pk}/", headers={"HX-Request": "true"}).content.decode()
    attempts = re.search(r"<dt>Attempts</dt><dd[^>]*>(.*?)</dd>", panel, re.S).group(1)
    assert re.sub(r"<[^>]+>", "", attempts) == "2 (1 each time it is run)"  # not "2/1"


def test_an_action_the_service_refuses_is_a_message_saying_why(org):
    client = client_for(member(org, Role.MEMBER))
    run = failed(org)
    # c's dependency b failed: retrying c alone is refused (the page offers no such button).
    resp = client.post(f"/runs/{run.pk}/tasks/{by_key(run)['c'].pk}/retry/", follow=True)
    assert "Task c cannot be retried: its trigger rule all_success (it runs once every upstream task succeeded) is not met by its upstream tasks (b failed); retry b (its downstream, c included, runs again) or mark it succeeded" in text(resp)
    reason = client.post(f"/runs/{run.pk}/tasks/{by_key(run)['b'].pk}/skip/", {"reason": "r" * 501}, follow=True)
    assert "Reason is 501 characters; at most 500." in text(reason)
    assert by_key(run)["b"].state == "failed"


def test_a_succeeded_run_offers_a_rerun_and_task_retries_but_no_resume(org):
    wf = apply_definition(organization=org, document={"name": "ok", "tasks": DIAMOND})
    run = drive(start_run(workflow=wf))
    body = client_for(member(org, Role.MEMBER)).get(f"/runs/{run.pk}/").content.decode()
    assert 'data-action="resume"' not in body and 'data-action="retry"' in body
    assert set(re.findall(r'data-action="(\w+)-task"', body)) == {"retry"}


def test_a_running_runs_page_offers_actions_only_on_a_failed_task_whose_downstream_finished(org):
    wf = apply_definition(organization=org, document={"name": "branches", "tasks": [
        {"key": "a", "type": "noop"}, {"key": "s", "type": "noop"}]})
    run = start_run(workflow=wf)
    # a fails, s is still ready: the run is running.
    a = by_key(run)["a"]
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[a.pk])
    att = engine_helpers.start_attempt(task_run_id=a.pk, fencing_token=a.fencing_token + 1, owner="t",
                                       lease_seconds=30)
    engine_helpers.complete_attempt(task_run_id=a.pk, fencing_token=att.fencing_token, succeeded=False,
                                    retryable=False, error="x", lease_seconds=30, owner="t", claim=False)
    body = client_for(member(org, Role.MEMBER)).get(f"/runs/{run.pk}/").content.decode()
    assert 'data-action="cancel"' in body and 'data-action="resume"' not in body
    assert set(re.findall(r'data-action="(\w+)-task"', row_html(body, "a"))) == {"retry", "skip", "mark_succeeded"}
    assert "-task\"" not in row_html(body, "s")


@pytest.mark.parametrize("n_resumes", [1, 7])
def test_the_page_lists_the_latest_resumes_newest_first(org, n_resumes):
    user = member(org, Role.MEMBER)
    actor = Actor(organization=org, role=Role.MEMBER, user=user, channel="web")
    run = failed(org)
    for i in range(n_resumes):
        resume_run(actor=actor, run=run, reason=f"try {i}")
        run = drive(run, fail={"b"})
    page = text(client_for(user).get(f"/runs/{run.pk}/"))
    listed = re.findall(r"— try (\d+)", page)
    assert listed == [str(i) for i in range(n_resumes - 1, max(-1, n_resumes - 6), -1)]
