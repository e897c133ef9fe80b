"""REST API: resume a run and act on a task run (api.views_recovery, engine.recovery) —
200 with the run after the action, 403 for a viewer (nothing changed), 404 for another
organization's run or task run, 409 naming why a state does not allow the action, 400
naming a bad ``output`` or ``reason``, each action audited with its API key."""

from __future__ import annotations

import json

import pytest

from audit.models import AuditLog
from engine.models import TaskRun, TaskRunEvent, WorkflowRun
from engine.services import apply_definition, start_run
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_recovery import DIAMOND, by_key, drive

ACTIONS = ("retry", "mark-succeeded", "skip")


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def failed_run(api: Api, fail=("b",)) -> WorkflowRun:
    wf = apply_definition(organization=api.org, document={"name": "diamond", "tasks": DIAMOND})
    run = drive(start_run(workflow=wf), fail=set(fail))
    assert run.state == "failed"
    return run


def task_url(run, key: str, action: str) -> str:
    return f"/api/v1/runs/{run.pk}/task-runs/{by_key(run)[key].pk}/{action}/"


def post(api: Api, path: str, body=None, role=Role.MEMBER):
    return api.post(path, json.dumps(body if body is not None else {}), role=role)


def test_resume_answers_the_run_running_again_with_only_what_did_not_succeed_reopened(api):
    run = failed_run(api)
    response = post(api, f"/api/v1/runs/{run.pk}/resume/", {"reason": "bucket is back"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["state"], body["finished_at"], body["error"]) == (str(run.pk), "running", None, "")
    run.refresh_from_db()
    assert body["resumed_at"] is not None and body["resumed_at"] == run.resumed_at.isoformat().replace("+00:00", "Z")
    assert {t["key"]: (t["state"], t["attempt"]) for t in body["task_runs"]} == {
        "a": ("succeeded", 1), "b": ("ready", 2), "c": ("pending", 1), "d": ("succeeded", 1)}
    entry = AuditLog.objects.for_organization(api.org).get(action="run.resumed")
    assert (entry.actor_type, entry.target_id, entry.metadata["tasks"], entry.metadata["reason"]) == (
        "api_key", str(run.pk), ["b", "c"], "bucket is back")
    assert entry.metadata["channel"] == "api"
    # Nothing more to resume while it runs: a 409 that says so.
    again = assert_problem(post(api, f"/api/v1/runs/{run.pk}/resume/"), 409)
    assert "is running; only a finished run can be resumed" in again["detail"]


def test_mark_succeeded_stores_the_output_and_runs_the_downstream(api):
    run = failed_run(api)
    response = post(api, task_url(run, "b", "mark-succeeded"), {"output": {"rows": 3}, "reason": "by hand"})
    assert response.status_code == 200, response.content
    tasks = {t["key"]: t for t in response.json()["task_runs"]}
    assert (tasks["b"]["state"], tasks["b"]["output"], tasks["c"]["state"]) == ("succeeded", {"rows": 3}, "ready")
    entry = AuditLog.objects.for_organization(api.org).get(action="task_run.marked_succeeded")
    assert (entry.target_type, entry.target_id, entry.metadata["output_bytes"]) == (
        "taskrun", str(by_key(run)["b"].pk), 10)


def test_retry_and_skip_answer_the_run_after_them(api):
    run = failed_run(api)
    response = post(api, task_url(run, "b", "retry"))
    assert response.status_code == 200, response.content
    assert {t["key"]: t["state"] for t in response.json()["task_runs"]}["b"] == "ready"
    run = drive(run, fail={"b"})
    assert run.state == "failed"
    response = post(api, task_url(run, "b", "skip"), {"reason": "not needed"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "succeeded"
    assert {e.action for e in AuditLog.objects.for_organization(api.org).filter(target_id=str(by_key(run)["b"].pk))
            } == {"task_run.retried", "task_run.skipped"}


@pytest.mark.parametrize("path", ["resume", *ACTIONS])
def test_a_viewer_is_refused_with_403_and_nothing_changes(api, path):
    run = failed_run(api)
    url = f"/api/v1/runs/{run.pk}/resume/" if path == "resume" else task_url(run, "b", path)
    seq = run.last_event_seq
    assert_problem(post(api, url, {"output": 1}, role=Role.VIEWER), 403)
    run.refresh_from_db()
    assert (run.state, run.last_event_seq) == ("failed", seq)
    assert not AuditLog.objects.for_organization(api.org).filter(action__startswith="task_run.").exists()
    assert not AuditLog.objects.for_organization(api.org).filter(action="run.resumed").exists()


@pytest.mark.parametrize("path", ["resume", *ACTIONS])
def test_another_organizations_run_or_task_run_is_a_404_like_a_missing_one(api, api_factory, path):
    theirs = failed_run(api_factory())
    url = f"/api/v1/runs/{theirs.pk}/resume/" if path == "resume" else task_url(theirs, "b", path)
    foreign = post(api, url, {"output": 1}, role=Role.OWNER)
    missing = post(api, url.replace(str(theirs.pk), "00000000-0000-4000-8000-000000000000"), role=Role.OWNER)
    assert assert_problem(foreign, 404) == assert_problem(missing, 404)
    theirs.refresh_from_db()
    assert theirs.state == "failed"


def test_a_task_run_of_another_run_is_a_404(api):
    run, other = failed_run(api), failed_run(api)
    url = f"/api/v1/runs/{other.pk}/task-runs/{by_key(run)['b'].pk}/retry/"
    assert_problem(post(api, url), 404)
    assert not TaskRunEvent.objects.for_organization(api.org).filter(kind="reset").exists()


@pytest.mark.parametrize(("action", "key", "detail"), [
    ("retry", "c", "task c cannot be retried: its trigger rule all_success (it runs once every upstream task succeeded) is not met by its upstream tasks (b failed); retry b (its downstream, c included, runs again) or mark it succeeded"),
    ("mark-succeeded", "a", "task a already succeeded"),
    ("skip", "c", "task c was skipped; only a failed or cancelled task can be skipped"),
])
def test_a_state_that_does_not_allow_the_action_is_a_409_saying_why(api, action, key, detail):
    run = failed_run(api)
    body = assert_problem(post(api, task_url(run, key, action)), 409)
    assert detail in body["detail"] and body["code"] == "conflict"


def test_a_bad_output_or_reason_is_a_400_naming_it(api, settings):
    settings.FLOWFORGE_MAX_OUTPUT_BYTES = 32
    run = failed_run(api)
    url = task_url(run, "b", "mark-succeeded")
    big = assert_problem(post(api, url, {"output": "x" * 40}), 400)
    assert big["errors"] == {"output": ["is 42 bytes of JSON text; at most 32 (FLOWFORGE_MAX_OUTPUT_BYTES), as for "
                                        "a task's own output"]}
    # Measured as stored: 1e308 is kept (and served) as 309 digits, 1e-300 as 302 characters.
    settings.FLOWFORGE_MAX_OUTPUT_BYTES = 400
    stored = assert_problem(post(api, url, {"output": [1e308, 1e-300]}), 400)  # [ 309 , 302 ] = 614
    assert stored["errors"] == {"output": ["is 614 bytes of JSON text; at most 400 (FLOWFORGE_MAX_OUTPUT_BYTES), as "
                                           "for a task's own output"]}
    # NaN is not JSON: the body is refused as it is read, naming the value.
    nan = assert_problem(api.post(url, '{"output": NaN}', role=Role.MEMBER), 400)
    assert "NaN" in nan["detail"], nan
    long = assert_problem(post(api, f"/api/v1/runs/{run.pk}/resume/", {"reason": "r" * 501}), 400)
    assert list(long["errors"]) == ["reason"]
    number = assert_problem(post(api, f"/api/v1/runs/{run.pk}/resume/", {"reason": 12}), 400)  # not stored as "12"
    assert number["errors"] == {"reason": ["Must be a string."]}
    assert TaskRun.objects.for_organization(api.org).get(pk=by_key(run)["b"].pk).state == "failed"
