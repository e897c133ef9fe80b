"""REST API: workflows — create (versions), validate, list (latest per name, keyset
pages), detail (tasks, positions, labelled edges), versions, archive and restore.
Real PostgreSQL and Redis, the Django test client, API keys."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from engine.models import RunState, Workflow, WorkflowRun, WorkflowState
from engine.services import apply_definition, start_run
from tenancy import apikeys
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tests.unit.test_api_auth import actor_of, assert_problem, bearer, data_queries

ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]
DIAMOND = {
    "name": "diamond",
    "description": "fan out, fan in",
    "tasks": [
        {"key": "a", "type": "noop", "position": {"x": 0, "y": 100}},
        {"key": "b", "type": "fail", "config": {"fail_attempts": 1}, "depends_on": ["a"], "max_attempts": 3,
         "retry_backoff_seconds": 0.5, "timeout_seconds": 30, "edge_labels": {"a": "left"},
         "position": {"x": 200, "y": 0}},
        {"key": "c", "type": "sleep", "config": {"seconds": 1}, "depends_on": ["a"]},
        {"key": "d", "type": "noop", "depends_on": ["b", "c"], "edge_labels": {"b": "joined", "c": ""}},
    ],
}


@dataclasses.dataclass
class Api:
    org: object
    keys: dict  # role -> full API key
    client: Client

    def get(self, path, role=Role.OWNER, **kw):
        return self.client.get(path, headers=bearer(self.keys[role]), **kw)

    def post(self, path, body=None, role=Role.OWNER, **kw):
        kw.setdefault("content_type", "application/json")
        return self.client.post(path, body if body is not None else {}, headers=bearer(self.keys[role]), **kw)


def new_api_factory(make_org):
    """Generator behind the ``api_factory`` fixtures (here and in the other API test
    modules): yields make() -> Api, an organization with one API key per role; removes
    the keys' cache entries afterwards."""
    prefixes = []

    def make() -> Api:
        org = make_org()
        owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
        keys = {}
        for role in ROLES:
            row, full = create_api_key(actor=owner, name=f"{role} key", role=role)
            keys[role] = full
            prefixes.append(row.prefix)
        return Api(org=org, keys=keys, client=Client())

    yield make
    cache.delete_many([k for p in prefixes for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def names_and_versions(body) -> list[tuple[str, int]]:
    return [(w["name"], w["version"]) for w in body["results"]]


# --- create ---------------------------------------------------------------------------------------


def test_creating_a_workflow_returns_201_and_the_same_name_makes_the_next_version(api):
    response = api.post("/api/v1/workflows/", DIAMOND, role=Role.MEMBER)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["version"], body["state"]) == ("diamond", 1, "active")
    assert response["Location"].endswith(f"/api/v1/workflows/{body['id']}/")
    assert [t["key"] for t in body["tasks"]] == ["a", "b", "c", "d"]

    again = api.post("/api/v1/workflows/", {**DIAMOND, "description": "v2"})
    assert again.status_code == 201
    assert (again.json()["version"], again.json()["description"]) == (2, "v2")
    stored = Workflow.objects.for_organization(api.org).filter(name="diamond").order_by("version")
    assert [(w.version, str(w.pk)) for w in stored] == [(1, body["id"]), (2, again.json()["id"])]


def test_an_invalid_definition_is_a_400_listing_each_task_path_and_message(api):
    document = {
        "name": "broken",
        "tasks": [
            {"key": "a", "type": "htp"},
            {"key": "b", "type": "noop", "depends_on": ["nope"]},
            {"key": "c", "type": "sleep", "config": {"seconds": "soon"}},
        ],
    }
    body = assert_problem(api.post("/api/v1/workflows/", document), 400)
    assert body["code"] == "invalid_definition"
    paths = {e["path"]: e["message"] for e in body["errors"]}
    assert set(paths) == {"tasks[a].type", "tasks[b].depends_on", "tasks[c].config"}
    assert "unknown task type 'htp'" in paths["tasks[a].type"]
    assert "unknown dependency 'nope'" in paths["tasks[b].depends_on"]
    assert not Workflow.objects.for_organization(api.org).filter(name="broken").exists()


@pytest.mark.parametrize("body", [[1, 2], "just a string", 42, None])
def test_a_definition_that_is_not_an_object_is_a_400_naming_the_document(api, body):
    import json

    response = api.client.post("/api/v1/workflows/", json.dumps(body), content_type="application/json",
                               headers=bearer(api.keys[Role.OWNER]))
    problem = assert_problem(response, 400)
    assert problem["errors"][0]["path"] == "document"


def test_a_deeply_nested_definition_is_a_400_not_a_500(api):
    deep: dict = {}
    node = deep
    for _ in range(300):
        node["x"] = {}
        node = node["x"]
    document = {"name": "deep", "tasks": [{"key": "a", "type": "noop", "config": deep}]}
    body = assert_problem(api.post("/api/v1/workflows/", document), 400)
    assert body["errors"][0]["path"] == "document"
    raw = '{"name": "deeper", "tasks": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = api.client.post("/api/v1/workflows/", raw, content_type="application/json",
                               headers=bearer(api.keys[Role.OWNER]))
    assert_problem(response, 400)


def test_a_viewer_cannot_create_a_workflow(api):
    assert_problem(api.post("/api/v1/workflows/", DIAMOND, role=Role.VIEWER), 403)
    assert not Workflow.objects.for_organization(api.org).exists()


# --- validate -------------------------------------------------------------------------------------


def test_validate_returns_the_normalized_document_and_stores_nothing(api):
    response = api.post("/api/v1/workflows/validate/", DIAMOND, role=Role.VIEWER)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["valid"] is True
    tasks = {t["key"]: t for t in body["normalized"]["tasks"]}
    assert tasks["a"] == {"key": "a", "type": "noop", "config": {}, "depends_on": [], "max_attempts": 1,
                          "retry_backoff_seconds": 1.0, "timeout_seconds": None, "position": {"x": 0, "y": 100}}
    assert not Workflow.objects.for_organization(api.org).exists()

    body = assert_problem(api.post("/api/v1/workflows/validate/", {"name": "x", "tasks": []}), 400)
    assert body["errors"] == [{"path": "tasks", "message": "a workflow needs at least one task"}]


# --- detail, list, versions -----------------------------------------------------------------------


def test_detail_has_tasks_with_type_config_retry_settings_position_and_labelled_edges(api):
    created = api.post("/api/v1/workflows/", DIAMOND).json()
    body = api.get(f"/api/v1/workflows/{created['id']}/", role=Role.VIEWER).json()
    tasks = {t["key"]: t for t in body["tasks"]}
    assert tasks["b"] == {
        "id": tasks["b"]["id"], "key": "b", "type": "fail", "config": {"message": "task failed on purpose",
                                                                       "fail_attempts": 1},
        "depends_on": ["a"], "max_attempts": 3, "retry_backoff_seconds": 0.5, "timeout_seconds": 30.0,
        "position": {"x": 200, "y": 0}, "priority": 0, "concurrency": None, "rate_limit": None,
        "trigger_rule": "all_success", "condition": "",
    }
    assert body["concurrency"] is None
    assert tasks["a"]["position"] == {"x": 0, "y": 100}
    assert tasks["c"]["position"] is None
    assert tasks["d"]["depends_on"] == ["b", "c"]
    assert body["edges"] == [
        {"from": "a", "to": "b", "label": "left"},
        {"from": "a", "to": "c", "label": ""},
        {"from": "b", "to": "d", "label": "joined"},
        {"from": "c", "to": "d", "label": ""},
    ]


SCHEDULED = {
    "name": "charges",
    "concurrency": {"max_running_runs": 2, "policy": "cancel_oldest"},
    "tasks": [
        {"key": "charge", "type": "noop", "priority": -3,
         "concurrency": {"key": "customer-{{ input.customer.id }}", "limit": 2},
         "rate_limit": {"key": "stripe", "per_second": 25}},
        {"key": "mail", "type": "noop", "depends_on": ["charge"], "priority": 7,
         "rate_limit": {"key": "smtp", "per_minute": 600}},
        {"key": "audit", "type": "noop", "depends_on": ["charge"], "concurrency": {"key": "ledger", "limit": 1}},
    ],
}


def test_detail_shows_each_tasks_scheduling_settings_and_the_workflow_concurrency_as_written(api):
    created = api.post("/api/v1/workflows/", SCHEDULED)
    assert created.status_code == 201, created.content
    assert created.json()["concurrency"] == {"max_running_tasks": None, "max_running_runs": 2,
                                             "policy": "cancel_oldest"}
    body = api.get(f"/api/v1/workflows/{created.json()['id']}/", role=Role.VIEWER).json()
    assert body["concurrency"] == {"max_running_tasks": None, "max_running_runs": 2, "policy": "cancel_oldest"}
    settings = {t["key"]: (t["priority"], t["concurrency"], t["rate_limit"]) for t in body["tasks"]}
    assert settings == {
        # The key as written (its placeholder unrendered); a run's task run has it rendered.
        "charge": (-3, {"key": "customer-{{ input.customer.id }}", "limit": 2}, {"key": "stripe", "per_second": 25}),
        "mail": (7, None, {"key": "smtp", "per_minute": 600}),
        "audit": (0, {"key": "ledger", "limit": 1}, None),
    }


def test_a_workflow_concurrency_block_is_null_only_when_nothing_in_it_is_set(api):
    def block(concurrency):
        doc = {"name": "blocks", "tasks": [{"key": "a", "type": "noop"}]}
        if concurrency is not None:
            doc["concurrency"] = concurrency
        created = api.post("/api/v1/workflows/", doc)
        assert created.status_code == 201, created.content
        return api.get(f"/api/v1/workflows/{created.json()['id']}/").json()["concurrency"]

    assert block(None) is None
    assert block({"policy": "queue"}) is None  # the default, the same as no block
    assert block({"max_running_tasks": 5}) == {"max_running_tasks": 5, "max_running_runs": None, "policy": "queue"}
    assert block({"max_running_runs": 1, "policy": "cancel_newest"}) == {
        "max_running_tasks": None, "max_running_runs": 1, "policy": "cancel_newest"}
    # cancel_* without max_running_runs would do nothing: refused, not stored as a block.
    refused = api.post("/api/v1/workflows/", {"name": "blocks", "tasks": [{"key": "a", "type": "noop"}],
                                              "concurrency": {"policy": "cancel_newest"}})
    assert refused.status_code == 400, refused.content
    assert refused.json()["errors"] == [{"path": "concurrency.policy", "message": "policy applies only with "
                                         "max_running_runs; 'cancel_newest' without it would do nothing"}]


def test_a_workflow_read_back_is_a_definition_that_applies_to_the_same_settings(api):
    first = api.get(f"/api/v1/workflows/{api.post('/api/v1/workflows/', SCHEDULED).json()['id']}/").json()
    # The read shape, minus what the server owns, is a definition document again.
    document = {"name": first["name"], "concurrency": first["concurrency"], "tasks": [
        {k: v for k, v in t.items() if k not in ("id", "position") and v is not None} for t in first["tasks"]]}
    second_response = api.post("/api/v1/workflows/", document)
    assert second_response.status_code == 201, second_response.content
    second = second_response.json()
    assert second["version"] == 2
    assert second["concurrency"] == first["concurrency"]
    assert ({t["key"]: (t["priority"], t["concurrency"], t["rate_limit"]) for t in second["tasks"]}
            == {t["key"]: (t["priority"], t["concurrency"], t["rate_limit"]) for t in first["tasks"]})


def test_a_missing_or_foreign_workflow_is_404(api, api_factory):
    other = api_factory()
    foreign = apply_definition(organization=other.org, document={"name": "theirs", "tasks": [{"key": "a", "type": "noop"}]})
    for pk in (foreign.pk, uuid.uuid4()):
        for path in (f"/api/v1/workflows/{pk}/", f"/api/v1/workflows/{pk}/versions/"):
            assert_problem(api.get(path), 404)
        assert_problem(api.post(f"/api/v1/workflows/{pk}/archive/", {"confirm": "theirs"}), 404)
        assert_problem(api.post(f"/api/v1/workflows/{pk}/restore/"), 404)
    assert Workflow.objects.for_organization(other.org).get(pk=foreign.pk).state == WorkflowState.ACTIVE


def test_the_list_is_the_latest_version_of_each_name_filtered_and_paged(api, api_factory):
    one = [{"key": "a", "type": "noop"}]
    for name in ("charlie", "alpha", "echo", "bravo", "delta"):
        apply_definition(organization=api.org, document={"name": name, "tasks": one})
    apply_definition(organization=api.org, document={"name": "alpha", "tasks": one * 1 + [{"key": "b", "type": "noop"}]})
    apply_definition(organization=api.org, document={"name": "bravo", "tasks": one}, state=WorkflowState.DRAFT)
    apply_definition(organization=api_factory().org, document={"name": "alpha-of-another-org", "tasks": one})

    body = api.get("/api/v1/workflows/", role=Role.VIEWER).json()
    assert names_and_versions(body) == [("alpha", 2), ("bravo", 2), ("charlie", 1), ("delta", 1), ("echo", 1)]
    assert body["results"][0]["task_count"] == 2
    assert body["next"] is None

    # Pages of two, following `next` (a full URL).
    seen, url = [], "/api/v1/workflows/?page_size=2"
    while url:
        page = api.get(url).json()
        seen += names_and_versions(page)
        assert len(page["results"]) <= 2
        url = page["next"]
        assert url is None or url.startswith("http://testserver/api/v1/workflows/?")
    assert seen == names_and_versions(body)

    assert names_and_versions(api.get("/api/v1/workflows/?name=alpha").json()) == [("alpha", 2)]
    # state filters before the latest is picked: each name's latest version in that state.
    active = names_and_versions(api.get("/api/v1/workflows/?state=active").json())
    assert active == [("alpha", 2), ("bravo", 1), ("charlie", 1), ("delta", 1), ("echo", 1)]
    assert names_and_versions(api.get("/api/v1/workflows/?state=draft").json()) == [("bravo", 2)]

    assert set(assert_problem(api.get("/api/v1/workflows/?state=retired"), 400)["errors"]) == {"state"}
    assert set(assert_problem(api.get("/api/v1/workflows/?cursor=%%%"), 400)["errors"]) == {"cursor"}
    assert set(assert_problem(api.get("/api/v1/workflows/?page_size=0"), 400)["errors"]) == {"page_size"}
    assert set(assert_problem(api.get("/api/v1/workflows/?name=a%00b"), 400)["errors"]) == {"name"}


def test_versions_are_every_version_of_the_name_newest_first(api):
    one = [{"key": "a", "type": "noop"}]
    made = [apply_definition(organization=api.org, document={"name": "etl", "tasks": one}) for _ in range(5)]
    apply_definition(organization=api.org, document={"name": "other", "tasks": one})
    body = api.get(f"/api/v1/workflows/{made[1].pk}/versions/").json()
    assert [w["version"] for w in body["results"]] == [5, 4, 3, 2, 1]
    assert {w["name"] for w in body["results"]} == {"etl"}

    first = api.get(f"/api/v1/workflows/{made[0].pk}/versions/?page_size=3").json()
    assert [w["version"] for w in first["results"]] == [5, 4, 3]
    second = api.get(first["next"]).json()
    assert [w["version"] for w in second["results"]] == [2, 1] and second["next"] is None
    assert set(assert_problem(api.get(f"/api/v1/workflows/{made[0].pk}/versions/?before=x"), 400)["errors"]) == {
        "before"}


def count_queries(api, path) -> int:
    api.get(path)  # warm the key cache
    with CaptureQueriesContext(connection) as queries:
        assert api.get(path).status_code == 200
    return len(data_queries(queries))


def test_workflow_lists_and_detail_take_a_constant_number_of_queries(api):
    # Stored by a key and by a person: who stored each version is read with the rows.
    first = api.post("/api/v1/workflows/", DIAMOND).json()
    first = Workflow.objects.for_organization(api.org).get(pk=first["id"])
    counts = {p: count_queries(api, p) for p in ("/api/v1/workflows/", f"/api/v1/workflows/{first.pk}/",
                                                   f"/api/v1/workflows/{first.pk}/versions/")}
    many = [{"key": f"t{i}", "type": "noop", "depends_on": [f"t{i - 1}"] if i else []} for i in range(30)]
    owner = actor_of(Membership.objects.for_organization(api.org).get(role=Role.OWNER))
    for i in range(12):
        assert api.post("/api/v1/workflows/", {"name": f"more-{i}", "tasks": many}).status_code == 201
        apply_definition(document={**DIAMOND, "description": f"v{i}"}, actor=owner)
    big = apply_definition(organization=api.org, document={"name": "diamond", "tasks": many})
    assert count_queries(api, "/api/v1/workflows/") == counts["/api/v1/workflows/"] == 2
    assert count_queries(api, f"/api/v1/workflows/{big.pk}/") == counts[f"/api/v1/workflows/{first.pk}/"] == 4
    assert count_queries(api, f"/api/v1/workflows/{big.pk}/versions/") == counts[
        f"/api/v1/workflows/{first.pk}/versions/"] == 3


def test_a_version_names_who_stored_it_a_key_or_a_person(api):
    """created_by / created_by_api_key in the detail, the list and the versions: the key's
    public prefix for a version stored through the API, a person's email for one stored
    in the UI (apply_definition with an actor), never both."""
    stored = api.post("/api/v1/workflows/", DIAMOND, role=Role.MEMBER)
    assert stored.status_code == 201, stored.content
    member_prefix = api.keys[Role.MEMBER].split("_")[1]
    assert (stored.json()["created_by"], stored.json()["created_by_api_key"]) == (None, member_prefix)
    owner = Membership.objects.for_organization(api.org).select_related("user").get(role=Role.OWNER)
    by_person = apply_definition(organization=api.org, document={**DIAMOND, "description": "v2"},
                                 actor=actor_of(owner))
    detail = api.get(f"/api/v1/workflows/{by_person.pk}/").json()
    assert (detail["created_by"], detail["created_by_api_key"]) == (owner.user.email, None)
    first = api.get(f"/api/v1/workflows/{stored.json()['id']}/").json()
    assert (first["created_by"], first["created_by_api_key"]) == (None, member_prefix)
    [latest] = api.get("/api/v1/workflows/").json()["results"]
    assert (latest["version"], latest["created_by"], latest["created_by_api_key"]) == (2, owner.user.email, None)
    versions = api.get(f"/api/v1/workflows/{by_person.pk}/versions/").json()["results"]
    assert [(v["version"], v["created_by"], v["created_by_api_key"]) for v in versions] == [
        (2, owner.user.email, None), (1, None, member_prefix)]
    # Neither the person's password hash nor the key's hash is read to say who it was.
    for path in ("/api/v1/workflows/", f"/api/v1/workflows/{by_person.pk}/",
                 f"/api/v1/workflows/{by_person.pk}/versions/"):
        with CaptureQueriesContext(connection) as queries:
            assert api.get(path).status_code == 200
        reads = [q for q in data_queries(queries) if '"core_workflow"' in q]  # not the key's own check
        assert any("core_apikey" in q and "prefix" in q for q in reads), reads
        assert not any("hashed_key" in q or '"password"' in q for q in reads), reads


# --- archive and restore --------------------------------------------------------------------------


def test_archive_needs_confirm_naming_the_field(api):
    wf = apply_definition(organization=api.org, document=DIAMOND)
    for body in ({}, {"confirm": ""}, {"confirm": "Diamond"}, {"confirm": None}):
        problem = assert_problem(api.post(f"/api/v1/workflows/{wf.pk}/archive/", body), 400)
        assert set(problem["errors"]) == {"confirm"}, body
    assert Workflow.objects.for_organization(api.org).get(pk=wf.pk).state == WorkflowState.ACTIVE
    assert_problem(api.post(f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": "diamond"}, role=Role.VIEWER), 403)


def test_archive_cancels_running_runs_and_refuses_new_ones_until_restored(api):
    wf = apply_definition(organization=api.org, document=DIAMOND)
    runs = [start_run(workflow=wf, trigger_source="api") for _ in range(3)]
    response = api.post(f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": "diamond"}, role=Role.MEMBER)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["runs_cancelled"] == 3
    assert body["workflow"]["state"] == "archived" and body["workflow"]["id"] == str(wf.pk)
    states = set(WorkflowRun.objects.for_organization(api.org).filter(pk__in=[r.pk for r in runs])
                 .values_list("state", flat=True))
    assert states == {RunState.CANCELLED}

    problem = assert_problem(api.post("/api/v1/runs/", {"workflow": str(wf.pk)}), 409)
    assert "archived" in problem["detail"]

    restored = api.post(f"/api/v1/workflows/{wf.pk}/restore/")
    assert restored.status_code == 200 and restored.json()["state"] == "active"
    assert api.post("/api/v1/runs/", {"workflow": str(wf.pk)}).status_code == 201


def test_restore_revalidates_and_answers_400_with_errors_when_the_definition_no_longer_validates(api):
    wf = apply_definition(organization=api.org, document=DIAMOND)
    api.post(f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": "diamond"})
    # A task type that has since been removed from the registry, as an old stored definition would name.
    stale = {**wf.definition, "tasks": [{**wf.definition["tasks"][0], "type": "retired-type"}]}
    Workflow.objects.for_organization(api.org).filter(pk=wf.pk).update(definition=stale)
    body = assert_problem(api.post(f"/api/v1/workflows/{wf.pk}/restore/"), 400)
    assert body["code"] == "invalid_definition"
    assert [e["path"] for e in body["errors"]] == ["tasks[a].type"]
    assert Workflow.objects.for_organization(api.org).get(pk=wf.pk).state == WorkflowState.ARCHIVED
