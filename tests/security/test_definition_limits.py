"""Issue 14, finding 3: definition validation is linear and bounded.

The attack: a definition whose one task lists 30,000 unique dependencies took 25-43 s
of CPU per request, and a viewer can send it to POST /api/v1/workflows/validate/ (with an
API key, or signed in to the web UI). Now any task listing more than
FLOWFORGE_MAX_DEPENDENCIES_PER_TASK dependencies is refused with an error that names the
task and the cap, wherever a definition comes in, and nothing is stored. A definition at
the cap and a wide DAG still validate. Linear scaling is shown by bench/bench_validation.py
(no test here depends on wall-clock time).
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from engine.models import Task, TaskDependency, Workflow
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_web_workflows import add_member, client_for, text

ATTACK_DEPENDENCIES = 30_000


@pytest.fixture
def api(make_org) -> Api:
    factory = new_api_factory(make_org)
    yield next(factory)()
    next(factory, None)  # the factory's clean-up


def fan_in(n: int, *, name: str = "fanin", known: bool = False) -> dict:
    """One task ``sink`` depending on ``n`` distinct keys (tasks of their own when ``known``)."""
    deps = [f"d{i}" for i in range(n)]
    tasks = [{"key": k, "type": "noop"} for k in deps] if known else []
    return {"name": name, "tasks": [*tasks, {"key": "sink", "type": "noop", "depends_on": deps}]}


def assert_names_task_and_cap(errors: list[dict], *, task: str = "sink") -> None:
    cap = settings.FLOWFORGE_MAX_DEPENDENCIES_PER_TASK
    mine = [e for e in errors if e["path"] == f"tasks[{task}].depends_on"]
    assert len(mine) == 1, errors[:5]
    message = mine[0]["message"]
    assert f"at most {cap}" in message and "FLOWFORGE_MAX_DEPENDENCIES_PER_TASK" in message, message
    assert f"{ATTACK_DEPENDENCIES} dependencies" in message and repr(task) in message, message
    assert len(errors) <= 201  # one clear error, not 30,000 "unknown dependency" lines


def test_a_viewer_key_validating_30000_unique_dependencies_gets_a_400_naming_the_task_and_the_cap(api):
    response = api.post("/api/v1/workflows/validate/", fan_in(ATTACK_DEPENDENCIES), role=Role.VIEWER)
    body = assert_problem(response, 400)
    assert body["code"] == "invalid_definition"
    assert_names_task_and_cap(body["errors"])


def test_a_signed_in_viewer_validating_30000_unique_dependencies_gets_a_400_naming_the_task_and_the_cap(org):
    viewer = client_for(add_member(org, Role.VIEWER))
    response = viewer.post("/api/v1/workflows/validate/", json.dumps(fan_in(ATTACK_DEPENDENCIES)),
                           content_type="application/json")
    body = assert_problem(response, 400)
    assert_names_task_and_cap(body["errors"])


def test_a_member_applying_30000_unique_dependencies_through_the_api_is_refused_and_nothing_is_stored(api):
    response = api.post("/api/v1/workflows/", fan_in(ATTACK_DEPENDENCIES), role=Role.MEMBER)
    assert_names_task_and_cap(assert_problem(response, 400)["errors"])
    assert not Workflow.objects.for_organization(api.org).exists()
    assert not Task.objects.for_organization(api.org).exists()


def test_a_member_uploading_30000_unique_dependencies_in_the_web_ui_gets_a_form_error_and_nothing_is_stored(org):
    member = client_for(add_member(org, Role.MEMBER))
    response = member.post("/workflows/new/", {"definition": json.dumps(fan_in(ATTACK_DEPENDENCIES)),
                                               "state": "active"})
    assert response.status_code == 400
    page = text(response)
    cap = settings.FLOWFORGE_MAX_DEPENDENCIES_PER_TASK
    assert "tasks[sink].depends_on" in page
    assert f"task 'sink' lists {ATTACK_DEPENDENCIES} dependencies; at most {cap} per task" in page
    assert "unknown dependency" not in page
    assert not Workflow.objects.for_organization(org).exists()


def test_a_fan_in_at_the_cap_validates_and_applies(api):
    cap = settings.FLOWFORGE_MAX_DEPENDENCIES_PER_TASK
    document = fan_in(cap, known=True)
    response = api.post("/api/v1/workflows/validate/", document, role=Role.VIEWER)
    assert response.status_code == 200, response.content[:500]
    (sink,) = [t for t in response.json()["normalized"]["tasks"] if t["key"] == "sink"]
    assert len(sink["depends_on"]) == cap
    created = api.post("/api/v1/workflows/", document, role=Role.MEMBER)
    assert created.status_code == 201, created.content[:500]
    assert TaskDependency.objects.for_organization(api.org).count() == cap


def test_one_past_the_cap_is_refused(api):
    cap = settings.FLOWFORGE_MAX_DEPENDENCIES_PER_TASK
    body = assert_problem(api.post("/api/v1/workflows/validate/", fan_in(cap + 1, known=True), role=Role.VIEWER), 400)
    assert [e["path"] for e in body["errors"]] == ["tasks[sink].depends_on"]
    assert f"lists {cap + 1} dependencies; at most {cap}" in body["errors"][0]["message"]


def test_a_wide_dag_of_2000_tasks_and_19000_edges_validates(api):
    layers, width, fan = 20, 100, 10
    tasks = []
    for layer in range(layers):
        for i in range(width):
            deps = [f"l{layer - 1}t{(i + j) % width}" for j in range(fan)] if layer else []
            tasks.append({"key": f"l{layer}t{i}", "type": "noop", "depends_on": deps})
    response = api.post("/api/v1/workflows/validate/", {"name": "wide", "tasks": tasks}, role=Role.VIEWER)
    assert response.status_code == 200, response.content[:500]
    normalized = response.json()["normalized"]["tasks"]
    assert len(normalized) == 2000
    assert sum(len(t["depends_on"]) for t in normalized) == (layers - 1) * width * fan


def test_the_total_number_of_dependencies_of_a_workflow_is_capped(api, settings):
    settings.FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW = 50
    tasks = [{"key": "root", "type": "noop"}] + [
        {"key": f"t{i}", "type": "noop", "depends_on": ["root"]} for i in range(51)]
    body = assert_problem(api.post("/api/v1/workflows/", {"name": "many", "tasks": tasks}, role=Role.MEMBER), 400)
    assert {"path": "tasks", "message": "the workflow lists 51 dependencies in total; at most 50 "
            "(FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW)"} in body["errors"]
    assert not Workflow.objects.for_organization(api.org).exists()
