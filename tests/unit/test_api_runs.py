"""REST API: runs — start (by name, id, version), idempotent starts (replay, conflict,
per-caller keys, 20 concurrent starts with one key), input rules (NUL, NaN, not an
object), the list (filters, newest first, keyset pages), retrieve, retry, and the
expiry of idempotency keys. Real PostgreSQL and Redis."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dramatiq
import pytest
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine.models import IdempotencyKey, OutboxMessage, RunState, TaskRun, WorkflowRun, WorkflowState
from engine.scheduler import schedule_once
from engine.services import apply_definition, cancel_run, purge_expired_idempotency_keys, start_run
from engine.worker import heartbeat
from engine.worker.execute import execute
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tests.unit.test_api_auth import actor_of, assert_problem, bearer, data_queries
from tests.unit.test_api_workflows import Api, new_api_factory

TWO = [{"key": "extract", "type": "noop"}, {"key": "load", "type": "noop", "depends_on": ["extract"]}]


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


@pytest.fixture
def wf(api):
    return apply_definition(organization=api.org, document={"name": "etl", "tasks": TWO})


def start(api: Api, body, *, key: str | None = None, role=Role.MEMBER, raw: bool = False):
    headers = bearer(api.keys[role])
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if raw else json.dumps(body)
    return api.client.post("/api/v1/runs/", data, content_type="application/json", headers=headers)


def runs_of(org) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.for_organization(org).order_by("created_at"))


# --- start ----------------------------------------------------------------------------------------


def test_a_start_by_name_is_201_with_the_run_and_its_task_runs(api, wf):
    response = start(api, {"workflow": "etl", "input": {"day": "2026-01-04"}})
    assert response.status_code == 201, response.content
    body = response.json()
    run = WorkflowRun.objects.for_organization(api.org).get(pk=body["id"])
    assert response["Location"] == f"http://testserver/api/v1/runs/{run.pk}/"
    assert "Idempotent-Replayed" not in response
    assert body["workflow"] == {"id": str(wf.pk), "name": "etl", "version": 1}
    assert (body["state"], body["input"], body["trigger_source"]) == ("running", {"day": "2026-01-04"}, "api")
    assert (body["retry_of"], body["trigger"], body["triggered_by"]) == (None, None, None)
    assert {tr["key"]: (tr["state"], tr["attempt"]) for tr in body["task_runs"]} == {
        "extract": ("ready", 1), "load": ("pending", 1)}
    assert set(body["task_runs"][0]) == {"id", "key", "task_id", "state", "attempt", "priority", "concurrency_key",
                                         "output", "error", "created_at", "started_at", "finished_at",
                                         "waiting_reason", "queue", "queue_live_workers", "skip_reason"}
    # Tasks of the shared workers: no queue of the organization's own workers.
    assert {(tr["queue"], tr["queue_live_workers"]) for tr in body["task_runs"]} == {("", None)}
    assert body["priority"] == 0
    assert {tr["key"]: (tr["priority"], tr["concurrency_key"]) for tr in body["task_runs"]} == {
        "extract": (0, None), "load": (0, None)}


def test_a_start_names_a_version_or_an_id(api, wf):
    v2 = apply_definition(organization=api.org, document={"name": "etl", "tasks": TWO})
    assert start(api, {"workflow": "etl"}).json()["workflow"]["version"] == 2
    assert start(api, {"workflow": "etl", "version": 1}).json()["workflow"]["id"] == str(wf.pk)
    assert start(api, {"workflow": str(v2.pk)}).json()["workflow"]["version"] == 2
    body = assert_problem(start(api, {"workflow": str(v2.pk), "version": 1}), 400)
    assert set(body["errors"]) == {"version"}


@pytest.mark.parametrize("body, field", [
    ({"workflow": "nope"}, "workflow"),
    ({"workflow": str(uuid.uuid4())}, "workflow"),
    ({}, "workflow"),
    ({"workflow": ""}, "workflow"),
    ({"workflow": "etl\u0000"}, "workflow"),
    ({"workflow": "etl", "version": 9}, "workflow"),
    ({"workflow": "etl", "version": 0}, "version"),
    ({"workflow": "etl", "version": "two"}, "version"),
    ({"workflow": "etl", "version": 2**40}, "version"),
    ({"workflow": "etl", "input": [1, 2]}, "input"),
    ({"workflow": "etl", "input": "text"}, "input"),
    ({"workflow": "etl", "input": 3}, "input"),
    ({"workflow": "etl", "input": None}, "input"),
    ({"workflow": "etl", "inputs": {"limit": 5}}, "inputs"),  # a typo: not dropped, started with no input
])
def test_an_invalid_start_is_a_400_naming_the_field(api, wf, body, field):
    problem = assert_problem(start(api, body), 400)
    assert set(problem["errors"]) == {field}, problem
    assert runs_of(api.org) == []


def test_an_unknown_field_is_named_with_the_fields_a_start_takes(api, wf):
    problem = assert_problem(start(api, {"workflow": "etl", "inputs": {}, "extra": 1}), 400)
    assert problem["errors"] == {"extra": ["unknown field; this body takes workflow, version, input, priority"],
                                 "inputs": ["unknown field; this body takes workflow, version, input, priority"]}
    assert runs_of(api.org) == []


@pytest.mark.parametrize("raw", [
    '{"workflow": "etl", "input": {"x": NaN}}',
    '{"workflow": "etl", "input": {"x": Infinity}}',
    '{"workflow": "etl", "input": {"x": -Infinity}}',
    '{"workflow": "etl", "input": {"x": 1e400}}',
    '{"workflow": "etl", "input": {"x": 1' + "0" * 5000 + "}}",
    '{"workflow": "etl", "input": ' + '{"a": ' * 200 + "1" + "}" * 200 + "}",
    '{"workflow": "etl", "input": ' + "[" * 50_000 + "]" * 50_000 + "}",
    "not json",
])
def test_input_json_cannot_store_is_a_400_never_a_500(api, wf, raw):
    assert_problem(start(api, raw, raw=True), 400)
    assert runs_of(api.org) == []


def test_an_input_is_measured_as_stored_with_its_numbers_written_out(api, wf, settings):
    """PostgreSQL stores 1e308 as 309 digits and serves it so: the input limit counts that
    (a 180 KB input of such numbers was stored, and served on every read, as 9.3 MB)."""
    settings.FLOWFORGE_MAX_INPUT_BYTES = 1000
    # {"a":[ + 4 numbers of 309 digits + 3 commas + ]} = 5 + 1 + 1236 + 3 + 2 = 1247 bytes.
    problem = assert_problem(start(api, {"workflow": "etl", "input": {"a": [1e308] * 4}}), 400)
    assert problem["errors"] == {"input": [
        "is 1247 bytes of JSON as stored (numbers are stored without an exponent: 1e308 is 309 digits); at most "
        "1000 (FLOWFORGE_MAX_INPUT_BYTES)"]}
    assert runs_of(api.org) == []
    # Three are 937 bytes: stored, and the stored text is that size (PostgreSQL's own count,
    # less the space it writes after each of the 2 commas and the colon).
    response = start(api, {"workflow": "etl", "input": {"a": [1e308] * 3}})
    assert response.status_code == 201, response.content
    with connection.cursor() as cur:
        cur.execute("SELECT octet_length(input::text) FROM core_workflowrun WHERE id = %s", [response.json()["id"]])
        assert cur.fetchone()[0] - 3 == 937


def test_a_nul_in_the_input_is_stored_without_it(api, wf):
    raw = '{"workflow": "etl", "input": {"text": "a\\u0000b", "k\\u0000ey": ["\\u0000", {"n": "x\\u0000"}]}}'
    response = start(api, raw, raw=True)
    assert response.status_code == 201, response.content
    expected = {"text": "ab", "key": ["", {"n": "x"}]}
    assert response.json()["input"] == expected
    run = WorkflowRun.objects.for_organization(api.org).get(pk=response.json()["id"])
    assert run.input == expected
    with connection.cursor() as cur:
        cur.execute("SELECT input::text FROM core_workflowrun WHERE id = %s", [run.pk])
        assert "\\u0000" not in cur.fetchone()[0]


def test_an_unpaired_surrogate_is_replaced_in_the_input_and_refused_in_the_workflow_name(api, wf):
    response = start(api, '{"workflow": "etl", "input": {"x": "a\\ud800b"}}', raw=True)
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {"x": "a\ufffdb"}
    problem = assert_problem(start(api, '{"workflow": "etl\\ud800"}', raw=True), 400)
    assert set(problem["errors"]) == {"workflow"}


def test_a_draft_or_archived_workflow_is_a_409(api, wf):
    apply_definition(organization=api.org, document={"name": "sketch", "tasks": TWO}, state=WorkflowState.DRAFT)
    assert "draft" in assert_problem(start(api, {"workflow": "sketch"}), 409)["detail"]
    api.post(f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": "etl"})
    assert "archived" in assert_problem(start(api, {"workflow": "etl", "version": 1}), 409)["detail"]
    assert runs_of(api.org) == []


def test_a_viewer_cannot_start_a_run(api, wf):
    assert_problem(start(api, {"workflow": "etl"}, role=Role.VIEWER), 403)
    assert runs_of(api.org) == []


# --- idempotency ----------------------------------------------------------------------------------


def test_a_repeat_with_the_same_key_and_body_returns_the_first_run_with_200(api, wf):
    first = start(api, {"workflow": "etl", "input": {"a": 1, "b": [1, 2]}}, key="order-42")
    assert first.status_code == 201
    # Same meaning, other formatting and key order.
    again = start(api, '{"input": {"b": [1,2], "a": 1},   "workflow": "etl"}', key="order-42", raw=True)
    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert len(runs_of(api.org)) == 1

    conflict = assert_problem(start(api, {"workflow": "etl", "input": {"a": 2}}, key="order-42"), 409)
    assert "different request" in conflict["detail"]
    assert len(runs_of(api.org)) == 1
    # Without a key every start is a new run.
    assert start(api, {"workflow": "etl", "input": {"a": 1, "b": [1, 2]}}).status_code == 201
    assert len(runs_of(api.org)) == 2


def test_keys_belong_to_their_caller(api, wf):
    member_key, admin_key = Role.MEMBER, Role.ADMIN
    a = start(api, {"workflow": "etl"}, key="k1", role=member_key)
    b = start(api, {"workflow": "etl"}, key="k1", role=admin_key)
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    rows = IdempotencyKey.objects.for_organization(api.org).order_by("created_at")
    assert [(r.user_id, r.key.split(":", 1)[1], r.key.split(":", 1)[0] == str(r.api_key_id)) for r in rows] == [
        (None, "k1", True), (None, "k1", True)]
    # A signed-in user's key is its own too, stored as sent.
    user = Membership.objects.for_organization(api.org).get(role=Role.OWNER).user
    session = Client()
    session.force_login(user)
    c = session.post("/api/v1/runs/", {"workflow": "etl"}, content_type="application/json",
                     headers={"Idempotency-Key": "k1"})
    assert c.status_code == 201
    replay = session.post("/api/v1/runs/", {"workflow": "etl"}, content_type="application/json",
                          headers={"Idempotency-Key": "k1"})
    assert (replay.status_code, replay.json()["id"]) == (200, c.json()["id"])
    assert IdempotencyKey.objects.for_organization(api.org).get(user=user).key == "k1"
    assert c.json()["triggered_by"] == user.email
    assert len(runs_of(api.org)) == 3


def test_the_same_key_in_another_organization_is_another_key(api, api_factory, wf):
    other = api_factory()
    apply_definition(organization=other.org, document={"name": "etl", "tasks": TWO})
    assert start(api, {"workflow": "etl"}, key="shared").status_code == 201
    assert start(other, {"workflow": "etl"}, key="shared").status_code == 201


@pytest.mark.parametrize("key", ["", "   ", "x" * 201, "caf\u00e9", "tab\there"])
def test_a_malformed_idempotency_key_is_a_400_naming_the_header(api, wf, key):
    body = assert_problem(start(api, {"workflow": "etl"}, key=key), 400)
    assert set(body["errors"]) == {"Idempotency-Key"}
    assert runs_of(api.org) == []


def test_a_refused_start_does_not_keep_its_key(api, wf):
    api.post(f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": "etl"})
    assert_problem(start(api, {"workflow": str(wf.pk)}, key="retry-me"), 409)
    assert not IdempotencyKey.objects.for_organization(api.org).exists()
    api.post(f"/api/v1/workflows/{wf.pk}/restore/")
    assert start(api, {"workflow": str(wf.pk)}, key="retry-me").status_code == 201


def test_an_expired_key_starts_afresh_and_purge_removes_only_expired_keys(api, wf):
    first = start(api, {"workflow": "etl"}, key="daily").json()
    row = IdempotencyKey.objects.for_organization(api.org).get()
    assert dt.timedelta(hours=23, minutes=59) < row.expires_at - row.created_at <= dt.timedelta(hours=24, seconds=1)
    # Expired an hour ago: the test runs in one transaction, whose now() (what the start compares
    # with) is its beginning, and under load that can be seconds before timezone.now().
    IdempotencyKey.objects.for_organization(api.org).update(expires_at=timezone.now() - dt.timedelta(hours=1))
    second = start(api, {"workflow": "etl", "input": {"other": True}}, key="daily")
    assert second.status_code == 201 and second.json()["id"] != first["id"]

    start(api, {"workflow": "etl"}, key="old")
    IdempotencyKey.objects.for_organization(api.org).filter(key__endswith=":old").update(
        expires_at=timezone.now() - dt.timedelta(hours=1))
    assert purge_expired_idempotency_keys(batch_size=1) == 1
    assert sorted(k.split(":", 1)[1] for k in IdempotencyKey.objects.for_organization(api.org)
                  .values_list("key", flat=True)) == ["daily"]
    assert purge_expired_idempotency_keys() == 0


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_starts_with_one_key_create_exactly_one_run(api_factory):
    api = api_factory()
    apply_definition(organization=api.org, document={"name": "etl", "tasks": TWO})
    barrier = threading.Barrier(20)
    results: list[tuple[int, str, str | None]] = []
    lock = threading.Lock()

    def one():
        try:
            client = Client()
            barrier.wait()
            response = client.post("/api/v1/runs/", {"workflow": "etl", "input": {"order": 7}},
                                   content_type="application/json",
                                   headers={**bearer(api.keys[Role.MEMBER]), "Idempotency-Key": "order-7"})
            with lock:
                results.append((response.status_code, response.json().get("id"),
                                response.headers.get("Idempotent-Replayed")))
        finally:
            connections.close_all()  # this thread's own connection

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 20, results
    runs = runs_of(api.org)
    assert len(runs) == 1
    assert sorted(r[0] for r in results) == [200] * 19 + [201]
    assert {r[1] for r in results} == {str(runs[0].pk)}
    assert sorted(str(r[2]) for r in results) == ["None"] + ["true"] * 19
    assert IdempotencyKey.objects.for_organization(api.org).get().workflow_run_id == runs[0].pk
    # The same key with another body is a conflict.
    conflict = start(api, {"workflow": "etl", "input": {"order": 8}}, key="order-7")
    assert_problem(conflict, 409)


# --- list -----------------------------------------------------------------------------------------


def set_created(run, when):
    with connection.cursor() as cur:
        cur.execute("UPDATE core_workflowrun SET created_at = %s WHERE id = %s", [when, run.pk])


def test_the_list_is_newest_first_with_filters(api, api_factory, wf):
    v2 = apply_definition(organization=api.org, document={"name": "etl", "tasks": TWO})
    other_wf = apply_definition(organization=api.org, document={"name": "other", "tasks": TWO})
    base = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.UTC)
    made = []
    for i, w in enumerate([wf, v2, other_wf, wf, v2]):
        run = start_run(workflow=w, trigger_source="api")
        set_created(run, base + dt.timedelta(minutes=i))
        made.append(run)
    cancel_run(run=made[3])
    foreign = api_factory()
    start_run(workflow=apply_definition(organization=foreign.org, document={"name": "etl", "tasks": TWO}))

    def ids(query=""):
        response = api.get(f"/api/v1/runs/{query}", role=Role.VIEWER)
        assert response.status_code == 200, response.content
        return [r["id"] for r in response.json()["results"]]

    newest_first = [str(r.pk) for r in reversed(made)]
    assert ids() == newest_first
    assert ids("?workflow=etl") == [newest_first[i] for i in (0, 1, 3, 4)]
    assert ids(f"?workflow={wf.pk}") == [str(made[3].pk), str(made[0].pk)]
    assert ids("?workflow=nope") == []
    assert ids("?state=cancelled") == [str(made[3].pk)]
    assert ids("?created_after=2026-01-05T12:01:00Z") == newest_first[:3]
    assert ids("?created_before=2026-01-05T12:01:00%2B00:00") == [str(made[0].pk)]
    assert ids("?created_after=2026-01-05T12:00:00Z&created_before=2026-01-05T12:03:30Z&workflow=etl") == [
        str(made[3].pk), str(made[1].pk)]
    listed = api.get("/api/v1/runs/?page_size=1").json()["results"][0]
    assert listed["workflow"] == {"id": str(v2.pk), "name": "etl", "version": 2}
    assert "input" not in listed and "task_runs" not in listed

    for query, field in [("?created_after=yesterday", "created_after"),
                         ("?created_before=2026-13-01T00:00:00Z", "created_before"),
                         ("?created_after=2026-01-05T12:00:00Z&created_before=2026-01-05T11:00:00Z",
                          "created_before"),
                         ("?state=done", "state"), ("?workflow=%00", "workflow"), ("?cursor=abc", "cursor"),
                         ("?page_size=501", "page_size")]:
        assert set(assert_problem(api.get(f"/api/v1/runs/{query}"), 400)["errors"]) == {field}, query


def count_queries(api, path) -> int:
    api.get(path)
    with CaptureQueriesContext(connection) as queries:
        assert api.get(path).status_code == 200
    return len(data_queries(queries))


def test_run_lists_and_detail_take_a_constant_number_of_queries(api, wf):
    run = start_run(workflow=wf, trigger_source="api")
    paths = ["/api/v1/runs/", "/api/v1/runs/?workflow=etl", f"/api/v1/runs/{run.pk}/"]
    before = [count_queries(api, p) for p in paths]
    wide = apply_definition(organization=api.org, document={"name": "etl", "tasks": [
        {"key": f"t{i}", "type": "noop"} for i in range(25)]})
    for _ in range(30):
        start_run(workflow=wide, trigger_source="api")
    big = start_run(workflow=wide, trigger_source="api")
    after = [count_queries(api, p) for p in paths[:2]] + [count_queries(api, f"/api/v1/runs/{big.pk}/")]
    # The detail's third query: the wait reasons of its ready task runs (one statement for all).
    assert before == after == [2, 3, 4], (before, after)


def test_a_ready_task_run_and_a_queued_run_say_why_they_wait(api, wf):
    from engine.models import Task, Workflow

    # (A task's fields are fixed once its workflow has runs.)
    Task.objects.unscoped().filter(workflow=wf, key="extract").update(concurrency_key="stripe", concurrency_limit=1)
    run = start_run(workflow=wf, trigger_source="api")
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert body["waiting_reason"] is None
    assert {tr["key"]: tr["waiting_reason"] for tr in body["task_runs"]} == {
        "extract": "waiting: for a worker", "load": None}  # load is pending: not waiting for a worker yet

    TaskRun.objects.unscoped().filter(workflow_run=run, task__key="extract").update(concurrency_key="stripe")
    holder = start_run(workflow=wf, trigger_source="api")
    TaskRun.objects.unscoped().filter(workflow_run=holder, task__key="extract").update(
        state="running", fencing_token=1, lease_expires_at=timezone.now() + dt.timedelta(minutes=1),
        concurrency_key="stripe")
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert {tr["key"]: tr["waiting_reason"] for tr in body["task_runs"]} == {
        "extract": "waiting: concurrency stripe 1/1", "load": None}
    held = api.get(f"/api/v1/runs/{holder.pk}/").json()
    assert {tr["key"]: tr["waiting_reason"] for tr in held["task_runs"]} == {"extract": None, "load": None}

    # A run queued by its workflow's run limit says so, in its detail and in the list.
    Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_runs=2)
    WorkflowRun.objects.unscoped().filter(pk=run.pk).update(state="pending")
    TaskRun.objects.unscoped().filter(workflow_run=run).update(state="pending")
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert body["waiting_reason"] == "waiting: workflow run limit 1/2"
    listed = {r["id"]: r["waiting_reason"] for r in api.get("/api/v1/runs/").json()["results"]}
    assert listed == {str(run.pk): "waiting: workflow run limit 1/2", str(holder.pk): None}


@pytest.mark.parametrize("priority", [11, -11, 2.5, "3", True])
def test_a_start_with_a_bad_priority_is_a_400_in_the_words_of_every_other_priority_check(api, priority):
    apply_definition(organization=api.org, document={"name": "p", "tasks": [{"key": "a", "type": "noop"}]})
    response = start(api, {"workflow": "p", "priority": priority})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"priority": [f"must be a whole number from -10 to 10, got {priority!r}"]}
    assert not WorkflowRun.objects.for_organization(api.org).exists()


def test_a_run_shows_its_priority_and_each_task_run_its_priority_and_rendered_concurrency_key(api):
    apply_definition(organization=api.org, document={"name": "charges", "tasks": [
        {"key": "charge", "type": "noop", "priority": 3,
         "concurrency": {"key": "customer-{{ input.customer.id }}:{{ input.region }}", "limit": 2}},
        {"key": "mail", "type": "noop", "depends_on": ["charge"], "priority": -2},
    ]})
    response = start(api, {"workflow": "charges", "priority": -4,
                           "input": {"customer": {"id": 42}, "region": "<eu&>"}})
    assert response.status_code == 201, response.content
    expected = {"charge": (-4 + 3, "customer-42:<eu&>"), "mail": (-4 - 2, None)}
    assert response.json()["priority"] == -4
    assert {tr["key"]: (tr["priority"], tr["concurrency_key"]) for tr in response.json()["task_runs"]} == expected
    body = api.get(f"/api/v1/runs/{response.json()['id']}/", role=Role.VIEWER).json()
    assert body["priority"] == -4
    assert {tr["key"]: (tr["priority"], tr["concurrency_key"]) for tr in body["task_runs"]} == expected
    start(api, {"workflow": "charges", "input": {"customer": {"id": "c-7"}, "region": "us"}})
    listed = api.get("/api/v1/runs/?workflow=charges").json()["results"]
    assert [r["priority"] for r in listed] == [0, -4]  # newest first


# --- retrieve and retry ---------------------------------------------------------------------------


def test_retry_is_409_while_the_run_is_going_and_201_linked_by_retry_of_after(api, wf):
    run = start(api, {"workflow": "etl", "input": {"n": 1}}).json()
    problem = assert_problem(api.post(f"/api/v1/runs/{run['id']}/retry/"), 409)
    assert "only a finished run can be retried" in problem["detail"]
    assert api.post(f"/api/v1/runs/{run['id']}/cancel/").status_code == 200
    assert_problem(api.post(f"/api/v1/runs/{run['id']}/cancel/"), 409)
    retried = api.post(f"/api/v1/runs/{run['id']}/retry/", role=Role.MEMBER)
    assert retried.status_code == 201, retried.content
    body = retried.json()
    assert body["retry_of"] == run["id"] and body["trigger_source"] == "retry"
    assert (body["input"], body["workflow"]) == ({"n": 1}, run["workflow"])
    assert retried["Location"].endswith(f"/api/v1/runs/{body['id']}/")
    detail = api.get(f"/api/v1/runs/{body['id']}/", role=Role.VIEWER).json()
    assert detail["retry_of"] == run["id"]
    assert_problem(api.post(f"/api/v1/runs/{run['id']}/retry/", role=Role.VIEWER), 403)
    for pk in (uuid.uuid4(),):
        assert_problem(api.get(f"/api/v1/runs/{pk}/"), 404)
        assert_problem(api.post(f"/api/v1/runs/{pk}/retry/"), 404)


def test_a_key_acting_in_another_organization_cannot_retry_its_runs(api, api_factory, wf):
    other = api_factory()
    theirs = start_run(workflow=apply_definition(organization=other.org, document={"name": "x", "tasks": TWO}))
    cancel_run(run=theirs)
    assert_problem(api.post(f"/api/v1/runs/{theirs.pk}/retry/"), 404)
    assert WorkflowRun.objects.for_organization(other.org).count() == 1


# --- an http task's NUL, end to end ---------------------------------------------------------------


class _NulServer(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"text": "before\\u0000after", "list": ["\\u0000"]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def nul_server(settings):
    # Loopback is refused by the egress policy unless the deployment allows it.
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NulServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/nul"
    httpd.shutdown()


@pytest.fixture
def broker(monkeypatch):
    import engine.actors  # noqa: F401  (declares the queues)
    from flowforge.broker import broker as b

    assert dramatiq.get_broker() is b
    # A heartbeater that never beats on its own (no background thread holding a connection).
    monkeypatch.setattr(heartbeat, "_heartbeater", heartbeat.Heartbeater(interval_seconds=3600, lease_seconds=30))
    b.flush_all()
    yield b
    b.flush_all()


def drive(run_id, *, rounds: int = 20) -> None:
    """Schedule and execute in this process until the run is finished."""
    done: set = set()
    for _ in range(rounds):
        schedule_once()
        for m in OutboxMessage.objects.unscoped().filter(workflow_run_id=run_id).order_by("created_at"):
            generation = (m.payload["task_run_id"], m.payload["fencing_token"])
            if generation not in done:
                done.add(generation)
                execute(*generation)
        if WorkflowRun.objects.unscoped().get(pk=run_id).is_terminal:
            return
    raise AssertionError(f"run {run_id} did not finish")


@pytest.mark.django_db(transaction=True)
def test_an_http_tasks_output_with_a_nul_is_stored_and_served_without_it(api_factory, nul_server, broker):
    api = api_factory()
    created = api.post("/api/v1/workflows/", {"name": "fetch", "tasks": [
        {"key": "get", "type": "http", "config": {"url": nul_server}}]})
    assert created.status_code == 201, created.content
    run = start(api, {"workflow": "fetch"}, key="fetch-1").json()
    drive(uuid.UUID(run["id"]))
    body = api.get(f"/api/v1/runs/{run['id']}/").json()
    assert body["state"] == "succeeded", body
    (task_run,) = body["task_runs"]
    assert task_run["output"]["body"] == {"text": "beforeafter", "list": [""]}
    stored = TaskRun.objects.for_organization(api.org).get(pk=task_run["id"]).output
    assert stored["body"]["text"] == "beforeafter"


def test_the_run_detail_names_its_trigger_and_creator(api, wf):
    owner = Membership.objects.for_organization(api.org).get(role=Role.OWNER).user
    _row, key = create_api_key(actor=actor_of(Membership.objects.for_organization(api.org).get(role=Role.OWNER)),
                               name="extra", role=Role.MEMBER)
    run = start_run(workflow=wf, actor=actor_of(Membership.objects.for_organization(api.org).get(user=owner)))
    body = api.client.get(f"/api/v1/runs/{run.pk}/", headers=bearer(key)).json()
    assert (body["triggered_by"], body["trigger_source"], body["trigger"]) == (owner.email, "cli", None)
    assert body["state"] == RunState.RUNNING
