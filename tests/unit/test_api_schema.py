"""The OpenAPI 3 document (drf-spectacular) served at /api/schema/ and the docs page
at /api/docs/: a valid document, generated without warnings, where every operation
has request and response schemas with examples, the problem+json errors reference
the reusable Problem component, and API keys are a Bearer security scheme."""

from __future__ import annotations

import io
import re

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

PROBLEM = "application/problem+json"
METHODS = ("get", "post", "put", "patch", "delete")
ORG_PATHS = (
    "/api/v1/triggers/", "/api/v1/triggers/{id}/", "/api/v1/triggers/{id}/pause/", "/api/v1/triggers/{id}/resume/",
    "/api/v1/members/", "/api/v1/members/{id}/", "/api/v1/invitations/", "/api/v1/invitations/{id}/revoke/",
    "/api/v1/api-keys/", "/api/v1/api-keys/{id}/revoke/", "/api/v1/audit-events/",
    "/api/v1/secrets/", "/api/v1/secrets/{name}/",
)


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema: dict, paths=None):
    for path, item in schema["paths"].items():
        if paths is not None and path not in paths:
            continue
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def test_the_schema_is_served_and_is_a_valid_openapi_3_document(db):
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    assert document["openapi"].startswith("3.")
    validate_schema(document)
    as_json = Client().get("/api/schema/?format=json")
    assert as_json.status_code == 200 and as_json.json()["paths"].keys() == document["paths"].keys()
    assert set(ORG_PATHS) <= set(document["paths"])
    assert not [p for p in document["paths"] if not p.startswith("/api/v1/")]


def test_the_docs_page_is_served_without_inline_script(db):
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "swagger-ui-bundle.js" in page
    # Every script is a file (the site's CSP allows no inline script); the start-up one is ours.
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", page, flags=re.S)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert 'src="/api/docs/?script="' in page
    start_up = Client().get("/api/docs/?script=")
    assert start_up.status_code == 200 and "/api/schema/" in start_up.content.decode()
    policy = response["Content-Security-Policy"]
    script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src"))
    assert "'self'" in script_src and "unsafe-inline" not in script_src


# Warnings that come from settings this module's owner cannot change: the engine's two
# "state" choice sets (workflow and run) need names in SPECTACULAR_SETTINGS
# ["ENUM_NAME_OVERRIDES"]. Once they are named this set can be emptied.
TOLERATED_WARNINGS: tuple[str, ...] = ()


def test_generation_emits_no_errors_and_no_unexpected_warnings():
    GENERATOR_STATS.reset()
    out = io.StringIO()
    try:
        call_command("spectacular", "--validate", stdout=out, stderr=io.StringIO())
        warnings = [w for w in GENERATOR_STATS._warn_cache if not any(t in w for t in TOLERATED_WARNINGS)]
        assert not GENERATOR_STATS._error_cache, dict(GENERATOR_STATS._error_cache)
        assert not warnings, warnings
    finally:
        GENERATOR_STATS.reset()
    assert yaml.safe_load(out.getvalue())["info"]["title"] == "FlowForge API"


def test_api_keys_are_a_bearer_scheme_and_every_operation_requires_authentication(schema):
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerAuth"]["type"] == "http" and schemes["bearerAuth"]["scheme"] == "bearer"
    assert schemes["sessionAuth"] == {**schemes["sessionAuth"], "type": "apiKey", "in": "cookie"}
    for path, method, op in operations(schema):
        assert {"bearerAuth": []} in op["security"], (path, method)
        assert {} not in op["security"], (path, method)


def test_the_problem_component_is_rfc_9457(schema):
    problem = schema["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "code"} <= set(problem["required"])
    assert {"errors", "request_id"} <= set(problem["properties"]) - set(problem["required"])


def test_every_operation_documents_its_success_with_a_schema_and_an_example(schema):
    checked = 0
    for path, method, op in operations(schema):
        assert op.get("operationId"), (path, method)
        successes = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        assert successes, (path, method)
        examples = 0
        for code, response in successes.items():
            for media, content in response.get("content", {}).items():
                assert content.get("schema"), (path, method, code, media)
                examples += bool(content.get("examples"))
        assert examples or set(successes) == {"204"}, (path, method)
        body = op.get("requestBody")
        if body is not None:
            json_body = body["content"]["application/json"]
            assert json_body.get("schema") and json_body.get("examples"), (path, method)
        for code, response in op["responses"].items():
            if code[0] in "45":
                assert list(response["content"]) == [PROBLEM], (path, method, code)
        checked += 1
    assert checked >= 18


LIST_OPERATIONS = {
    "api_keys_list", "audit_events_list", "invitations_list", "members_list", "queues_list", "runs_list",
    "runs_events", "runs_task_logs", "secrets_list", "triggers_list", "trigger_backfills_list", "webhooks_list",
    "webhooks_deliveries_list", "workers_list", "workflows_list", "workflows_versions",
}


def _component(schema: dict, ref: str) -> dict:
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_list_documents_one_page_envelope_with_its_parameters_and_examples(schema):
    """No list answers a bare array (GET /api-keys/ did, with its example wrapped in a
    second array): each documents {"results": [...], "next"}, the page parameters, the
    400 naming them, and examples holding one envelope of objects."""
    lists = set()
    for path, method, op in operations(schema):
        if method != "get":
            continue
        body = op["responses"]["200"]["content"].get("application/json")
        if body is None:  # the event stream
            continue
        assert body["schema"].get("type") != "array", (path, "a list answers {results, next}, not an array")
        page = _component(schema, body["schema"]["$ref"]) if "$ref" in body["schema"] else body["schema"]
        if "results" not in page.get("properties", {}):
            continue
        lists.add(op["operationId"])
        assert set(page["properties"]) == {"results", "next"}, path
        results = page["properties"]["results"]
        assert results["type"] == "array" and "$ref" in results["items"], path
        item_fields = set(_component(schema, results["items"]["$ref"])["properties"])
        names = {p["name"] for p in op["parameters"]}
        assert "page_size" in names and names & {"cursor", "after", "before"}, (path, names)
        assert "400" in op["responses"], path
        assert body["examples"], path
        for name, example in body["examples"].items():
            value = example["value"]
            assert isinstance(value, dict) and set(value) == {"results", "next"}, (path, name, value)
            assert value["results"], (path, name)
            for row in value["results"]:
                assert isinstance(row, dict) and set(row) <= item_fields, (path, name, row)
    assert lists == LIST_OPERATIONS


def test_the_api_key_list_documents_its_page(schema):
    op = schema["paths"]["/api/v1/api-keys/"]["get"]
    body = op["responses"]["200"]["content"]["application/json"]
    assert _component(schema, body["schema"]["$ref"])["properties"]["results"]["items"] == {
        "$ref": "#/components/schemas/ApiKey"}
    params = {p["name"]: p for p in op["parameters"]}
    assert (params["page_size"]["schema"]["minimum"], params["page_size"]["schema"]["maximum"]) == (1, 500)
    assert params["cursor"]["in"] == "query"
    (example,) = body["examples"].values()
    assert set(example["value"]["results"][0]) == set(_component(schema, "#/components/schemas/ApiKey")[
        "properties"])
    invalid = op["responses"]["400"]["content"][PROBLEM]["examples"]
    assert any("page_size" in e["value"].get("errors", {}) for e in invalid.values())


# ProblemAutoSchema is the default schema class, so every operation documents its problems.
PROBLEM_PATHS = None


def test_every_operation_documents_its_problems_with_examples(schema):
    checked = 0
    for path, method, op in operations(schema, PROBLEM_PATHS):
        responses = op["responses"]
        for code in ("400", "401", "403", "404", "406", "429"):
            assert code in responses, (path, method, code)
        for code, response in responses.items():
            if code[0] in "45":
                content = response["content"][PROBLEM]
                # A definition's 400 is a Problem whose errors name each task (DefinitionProblem).
                allowed = [{"$ref": "#/components/schemas/Problem"}]
                if code == "400":
                    allowed.append({"$ref": "#/components/schemas/DefinitionProblem"})
                assert content["schema"] in allowed, (path, method, code)
                assert content["examples"], (path, method, code)
        assert responses["429"]["headers"]["Retry-After"]["schema"]["type"] == "integer"
        if method in ("post", "put", "patch"):
            assert {"413", "415"} <= set(responses), (path, method)
            body = op.get("requestBody")
            if body is not None:
                assert list(body["content"]) == ["application/json"], (path, method)
        assert any(p["name"] == "X-Organization" and p["in"] == "header" for p in op["parameters"])
        for param in op["parameters"]:
            if param["name"] == "page_size":  # its bounds, so that a valid value is never refused
                assert (param["schema"]["minimum"], param["schema"]["maximum"]) == (1, 500), (path, method)
        checked += 1
    # Every operation of /api/v1/ (33rd: runs_task_output, 34th: org_limits_retrieve, 35th-39th:
    # the worker API's poll, heartbeat, logs, complete and fail, 40th-42nd: workers_list,
    # queues_list, runs_task_logs, 43rd-46th: secrets_list, secrets_retrieve, secrets_set,
    # secrets_destroy, 47th-50th: runs_resume, runs_task_retry, runs_task_mark_succeeded, runs_task_skip,
    # 51st: runs_task_retrieve, 52nd-56th: a trigger's backfills: list, create, preview, retrieve, cancel,
    # 57th-65th: webhooks_list, _create, _retrieve, _partial_update, _destroy, _rotate_secret,
    # _deliveries_list, _deliveries_retrieve, _deliveries_replay).
    assert checked == 65


def test_writes_of_organization_administration_declare_their_request_bodies(schema):
    bodies = {(path, method): op.get("requestBody") for path, method, op in operations(schema, ORG_PATHS)
              if method in ("post", "patch")}
    with_body = {k for k, v in bodies.items() if v is not None}
    assert with_body == {
        ("/api/v1/triggers/", "post"), ("/api/v1/triggers/{id}/", "patch"), ("/api/v1/members/{id}/", "patch"),
        ("/api/v1/invitations/", "post"), ("/api/v1/api-keys/", "post"),
    }
    ref = bodies[("/api/v1/triggers/", "post")]["content"]["application/json"]["schema"]["$ref"]
    trigger_request = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"name", "workflow_name", "cron_expression"} <= set(trigger_request["required"])
    assert trigger_request["properties"]["catch_up"]


def test_the_trigger_response_describes_next_fire_times(schema):
    trigger = schema["components"]["schemas"]["Trigger"]["properties"]
    assert trigger["next_fire_times"]["items"] == {"type": "string", "format": "date-time"}
    assert trigger["next_fire_at"]["format"] == "date-time"


def test_workflows_and_runs_describe_their_scheduling_settings(schema):
    components = schema["components"]["schemas"]
    task = components["Task"]["properties"]
    assert task["priority"]["type"] == "integer"
    for field, component in (("concurrency", "TaskConcurrency"), ("rate_limit", "TaskRateLimit")):
        assert task[field]["nullable"] is True
        assert task[field]["allOf"] == [{"$ref": f"#/components/schemas/{component}"}]
    assert set(components["TaskConcurrency"]["required"]) == {"key", "limit"}
    # Exactly one window is present, so neither is required.
    assert components["TaskRateLimit"]["required"] == ["key"]
    assert set(components["TaskRateLimit"]["properties"]) == {"key", "per_second", "per_minute"}
    workflow = components["WorkflowDetail"]["properties"]
    assert workflow["concurrency"]["nullable"] is True
    block = components["WorkflowConcurrency"]
    assert set(block["required"]) == {"max_running_tasks", "max_running_runs", "policy"}
    assert block["properties"]["max_running_runs"]["nullable"] is True
    assert components["RunLimitPolicyEnum"]["enum"] == ["queue", "cancel_newest", "cancel_oldest"]
    for run in ("RunList", "Run"):
        assert components[run]["properties"]["priority"]["type"] == "integer"
    task_run = components["TaskRun"]["properties"]
    assert task_run["priority"]["type"] == "integer"
    assert task_run["concurrency_key"] == {**task_run["concurrency_key"], "type": "string", "nullable": True}


@pytest.mark.django_db(transaction=True)
def test_schema_requests_at_once_generate_one_at_a_time(monkeypatch):
    """drf-spectacular's lazy loading of its extensions is not thread-safe: two threads
    generating a process's first schema at once gave a 500 (an optional extension's target
    set to None while the other read it). The view generates one schema at a time."""
    import threading
    import time

    from django.db import connection

    running, peak, lock = [0], [0], threading.Lock()
    original = SchemaGenerator.get_schema

    def tracked(self, *args, **kwargs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.2)  # long enough for the others to arrive while it runs
            return original(self, *args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(SchemaGenerator, "get_schema", tracked)
    statuses: list[int] = []

    def fetch():
        try:
            statuses.append(Client().get("/api/schema/?format=json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * 4
    assert peak[0] == 1


def test_inviting_documents_its_send_limit_as_a_429_with_retry_after(schema):
    op = schema["paths"]["/api/v1/invitations/"]["post"]
    response = op["responses"]["429"]
    assert "FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG" in response["description"]
    # The request rate limit answers 429 here too.
    assert [e["value"]["code"] for e in response["content"][PROBLEM]["examples"].values()] == [
        "throttled", "quota_exceeded"]
    assert response["headers"]["Retry-After"]["schema"]["type"] == "integer"
