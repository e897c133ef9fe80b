"""Run input schemas through the REST API (issue 19, item 7): a definition's bad
``input_schema`` is a 400 naming its path; a start whose input breaks the schema is a 400
listing each violation (JSON pointer + message) with nothing stored, on every channel that
starts runs (plain and idempotent starts, a retry, a trigger's firing); defaults are filled
in; a trigger's input is checked when it is created or changed, and a trigger whose
workflow's new version refuses its input is flagged (``input_rejected``, the audit record
``trigger.input_rejected``, the firing's failure) instead of failing silently.
Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditLog
from engine.cron import process_trigger
from engine.models import IdempotencyKey, ScheduledTrigger, TaskRun, TriggerFiring, Workflow, WorkflowRun
from engine.services import apply_definition, cancel_run, restore_workflow
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem, bearer
from tests.unit.test_api_workflows import Api, new_api_factory

TASKS = [{"key": "extract", "type": "noop"}]
SCHEMA = {
    "type": "object",
    "properties": {
        "region": {"enum": ["eu", "us"], "title": "Region"},
        "day": {"type": "string", "format": "date"},
        "limit": {"type": "integer", "minimum": 1, "default": 100},
        "customer": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^c-[0-9]+$"}},
                     "required": ["id"]},
    },
    "required": ["region", "day"],
    "additionalProperties": False,
}
VALID = {"region": "eu", "day": "2026-03-01"}


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


@pytest.fixture
def wf(api):
    return apply_definition(organization=api.org, document={"name": "etl", "tasks": TASKS, "input_schema": SCHEMA})


def start(api: Api, body, *, key: str | None = None):
    headers = bearer(api.keys[Role.MEMBER])
    if key is not None:
        headers["Idempotency-Key"] = key
    return api.client.post("/api/v1/runs/", json.dumps(body), content_type="application/json", headers=headers)


def nothing_started(org) -> bool:
    return (not WorkflowRun.objects.for_organization(org).exists()
            and not TaskRun.objects.for_organization(org).exists()
            and not AuditLog.objects.for_organization(org).filter(action="run.started").exists())


# --- definition time ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/workflows/", "/api/v1/workflows/validate/"])
def test_a_bad_input_schema_is_a_400_naming_its_path_and_nothing_is_stored(api, path):
    doc = {"name": "etl", "tasks": TASKS, "input_schema": {
        "properties": {"day": {"type": "date"}, "limit": {"minimum": "one"}}}}
    body = assert_problem(api.post(path, doc, role=Role.MEMBER), 400)
    assert body["code"] == "invalid_definition"
    assert body["errors"] == [
        {"path": "input_schema.properties.day.type", "message": "'date' is not valid under any of the given schemas"},
        {"path": "input_schema.properties.limit.minimum", "message": "'one' is not of type 'number'"},
    ]
    doc["input_schema"] = {"properties": {"who": {"$ref": "https://schemas.example/who.json"}}}
    body = assert_problem(api.post(path, doc, role=Role.MEMBER), 400)
    assert [e["path"] for e in body["errors"]] == ["input_schema.properties.who.$ref"]
    assert "only references inside this schema are allowed" in body["errors"][0]["message"]
    assert not Workflow.objects.for_organization(api.org).exists()


def test_a_workflow_shows_its_input_schema_with_its_properties_in_the_order_written(api):
    ordered = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"},
                                                "middle_name": {"type": "boolean"}}}
    created = api.post("/api/v1/workflows/", {"name": "etl", "tasks": TASKS, "input_schema": ordered})
    assert created.status_code == 201, created.content
    assert list(created.json()["input_schema"]["properties"]) == ["zeta", "alpha", "middle_name"]
    detail = api.get(f"/api/v1/workflows/{created.json()['id']}/").json()
    assert detail["input_schema"] == ordered
    assert list(detail["input_schema"]["properties"]) == ["zeta", "alpha", "middle_name"]
    plain = api.post("/api/v1/workflows/", {"name": "plain", "tasks": TASKS}).json()
    assert plain["input_schema"] is None


# --- starts ---------------------------------------------------------------------------------------


def test_an_input_that_breaks_the_schema_is_a_400_listing_each_violation_and_nothing_is_stored(api, wf):
    response = start(api, {"workflow": "etl", "input": {
        "region": "mars", "limit": 0, "customer": {"id": "7"}, "colour": "red"}})
    body = assert_problem(response, 400)
    assert body["code"] == "invalid"
    assert body["violations"] == [
        {"path": "", "keyword": "additionalProperties",
         "message": "additional properties are not allowed ('colour' was unexpected)"},
        {"path": "/customer/id", "keyword": "pattern", "message": "does not match the pattern '^c-[0-9]+$'"},
        {"path": "/day", "keyword": "required", "message": "a value is required"},
        {"path": "/limit", "keyword": "minimum", "message": "0 is less than the minimum of 1"},
        {"path": "/region", "keyword": "enum", "message": "'mars' is not one of ['eu', 'us']"},
    ]
    assert body["errors"] == {"input": [
        "(input): additional properties are not allowed ('colour' was unexpected)",
        "/customer/id: does not match the pattern '^c-[0-9]+$'",
        "/day: a value is required",
        "/limit: 0 is less than the minimum of 1",
        "/region: 'mars' is not one of ['eu', 'us']",
    ]}
    assert nothing_started(api.org)


def test_a_valid_start_stores_the_input_with_the_schemas_defaults(api, wf):
    response = start(api, {"workflow": "etl", "input": VALID})
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {**VALID, "limit": 100}
    run = WorkflowRun.objects.for_organization(api.org).get()
    assert run.input == {**VALID, "limit": 100}


def test_an_idempotent_start_with_an_invalid_input_keeps_no_key_and_stores_nothing(api, wf):
    body = assert_problem(start(api, {"workflow": "etl", "input": {"region": "eu"}}, key="order-42"), 400)
    assert [v["path"] for v in body["violations"]] == ["/day"]
    assert nothing_started(api.org)
    assert not IdempotencyKey.objects.for_organization(api.org).exists()
    # The key was not used up: the corrected request starts the run.
    fixed = start(api, {"workflow": "etl", "input": VALID}, key="order-42")
    assert fixed.status_code == 201, fixed.content
    again = start(api, {"workflow": "etl", "input": VALID}, key="order-42")
    assert (again.status_code, again.json()["id"]) == (200, fixed.json()["id"])


def test_a_retry_validates_the_stored_input_again_and_keeps_its_defaults(api, wf):
    first = start(api, {"workflow": "etl", "input": VALID}).json()
    run = WorkflowRun.objects.for_organization(api.org).get(pk=first["id"])
    cancel_run(run=run, actor=Actor.system(api.org))
    retried = api.post(f"/api/v1/runs/{run.pk}/retry/", role=Role.MEMBER)
    assert retried.status_code == 201, retried.content
    assert retried.json()["input"] == {**VALID, "limit": 100}


def test_a_version_without_a_schema_accepts_any_object_as_before(api):
    apply_definition(organization=api.org, document={"name": "free", "tasks": TASKS})
    response = start(api, {"workflow": "free", "input": {"anything": [1, {"goes": True}]}})
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {"anything": [1, {"goes": True}]}


# --- triggers -------------------------------------------------------------------------------------


def trigger_body(**overrides) -> dict:
    return {"name": "nightly", "workflow_name": "etl", "cron_expression": "0 2 * * *", "timezone": "UTC",
            "input": VALID, **overrides}


def test_a_trigger_whose_input_breaks_the_schema_is_refused_on_create_and_on_change(api, wf):
    body = assert_problem(api.post("/api/v1/triggers/", trigger_body(input={"region": "mars"})), 400)
    assert body["violations"] == [
        {"path": "/day", "keyword": "required", "message": "a value is required"},
        {"path": "/region", "keyword": "enum", "message": "'mars' is not one of ['eu', 'us']"},
    ]
    assert body["errors"] == {"input": ["/day: a value is required", "/region: 'mars' is not one of ['eu', 'us']"]}
    assert not ScheduledTrigger.objects.for_organization(api.org).exists()

    created = api.post("/api/v1/triggers/", trigger_body())
    assert created.status_code == 201, created.content
    assert created.json()["input_rejected"] is None
    trigger_id = created.json()["id"]
    changed = api.client.patch(f"/api/v1/triggers/{trigger_id}/", json.dumps({"input": {"day": "tomorrow"}}),
                               content_type="application/json", headers=bearer(api.keys[Role.OWNER]))
    problem = assert_problem(changed, 400)
    assert [(v["path"], v["keyword"]) for v in problem["violations"]] == [("/day", "format"), ("/region", "required")]
    assert ScheduledTrigger.objects.for_organization(api.org).get().input == VALID


def test_a_trigger_whose_workflows_new_version_refuses_its_input_fails_visibly(api):
    org = api.org
    apply_definition(organization=org, document={"name": "etl", "tasks": TASKS})
    owner = Actor.system(org)
    stale = create_trigger(actor=owner, data=trigger_body(input={"region": "eu"}))
    fine = create_trigger(actor=owner, data=trigger_body(name="fine", input=VALID))

    v2 = apply_definition(organization=org, document={"name": "etl", "tasks": TASKS, "input_schema": SCHEMA})

    # An event on the trigger, in the organization's audit log (paths and keywords, no values).
    [record] = AuditLog.objects.for_organization(org).filter(action="trigger.input_rejected")
    assert (record.target_type, record.target_id) == ("scheduledtrigger", str(stale.pk))
    assert record.metadata == {"name": "nightly", "workflow": "etl", "version": v2.version,
                               "violations": [{"path": "/day", "keyword": "required"}], "violation_count": 1}
    # The trigger says so in the API, until its input is fixed.
    shown = api.get(f"/api/v1/triggers/{stale.pk}/").json()["input_rejected"]
    assert shown == {"version": 2, "message": "its input does not match the input schema of etl v2: "
                     "/day: a value is required",
                     "violations": [{"path": "/day", "keyword": "required", "message": "a value is required"}]}
    listed = {t["name"]: t["input_rejected"] for t in api.get("/api/v1/triggers/").json()["results"]}
    assert listed == {"nightly": shown, "fine": None}

    # Its firing fails, recorded with the reason, and starts nothing.
    assert process_trigger(stale.pk, stale.next_fire_at + dt.timedelta(seconds=1)) == 0
    firing = TriggerFiring.objects.for_organization(org).get(trigger=stale)
    assert (firing.outcome, firing.workflow_run_id) == ("failed", None)
    assert firing.detail == ("input: does not match the input schema of etl v2 (1 violation): "
                             "/day: a value is required")
    assert not WorkflowRun.objects.for_organization(org).exists()
    # The other trigger's input fits: its firing starts a run with the defaults filled in.
    assert process_trigger(fine.pk, fine.next_fire_at + dt.timedelta(seconds=1)) == 1
    assert WorkflowRun.objects.for_organization(org).get().input == {**VALID, "limit": 100}


def test_restoring_a_version_whose_schema_refuses_a_trigger_records_it(api):
    org = api.org
    strict = apply_definition(organization=org, document={"name": "etl", "tasks": TASKS, "input_schema": SCHEMA},
                              state="draft")
    create_trigger(actor=Actor.system(org), data=trigger_body(input={"anything": 1}))
    assert not AuditLog.objects.for_organization(org).filter(action="trigger.input_rejected").exists()
    restore_workflow(actor=Actor.system(org), workflow=strict)
    [record] = AuditLog.objects.for_organization(org).filter(action="trigger.input_rejected")
    assert record.metadata["violation_count"] == 3  # /anything unexpected, /day and /region missing


def test_the_trigger_list_checks_every_input_in_a_constant_number_of_queries(api, wf):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get("/api/v1/triggers/").status_code == 200
        return len(captured)

    create_trigger(actor=Actor.system(api.org), data=trigger_body(name="t0"))
    queries()  # the API key's cache entry filled
    few = queries()
    for i in range(1, 6):
        create_trigger(actor=Actor.system(api.org), data=trigger_body(name=f"t{i}"))
    assert queries() == few


def test_a_concurrency_key_may_use_a_field_the_schema_defaults(api):
    org = api.org
    apply_definition(organization=org, document={
        "name": "etl", "input_schema": {"properties": {"region": {"type": "string", "default": "eu"}}},
        "tasks": [{"key": "extract", "type": "noop", "concurrency": {"key": "r-{{ input.region }}", "limit": 1}}]})
    trigger = create_trigger(actor=Actor.system(org), data=trigger_body(input={}))
    created = start(api, {"workflow": "etl", "input": {}})
    assert created.status_code == 201, created.content
    assert created.json()["task_runs"][0]["concurrency_key"] == "r-eu"
    assert process_trigger(trigger.pk, trigger.next_fire_at + dt.timedelta(seconds=1)) == 1
