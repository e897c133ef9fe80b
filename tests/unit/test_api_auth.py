"""The REST API's foundation over HTTP (Django's test client, real PostgreSQL and
Redis): API key and session authentication, organization resolution, the role
matrix, tenant isolation (404, never 403), problem+json errors, the base view's
guarantees and query counts."""

from __future__ import annotations

import dataclasses
import datetime as dt
import secrets
import uuid
from http import HTTPStatus

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import URLPattern, get_resolver
from django.utils import timezone
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from api import base as api_base
from api.authentication import INVALID_KEY_MESSAGE, ApiKeyPrincipal
from api.base import OrganizationAPIView
from engine.models import RunState, WorkflowRun
from engine.services import start_run
from tenancy import apikeys
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.context import actor_for_membership
from tenancy.models import ApiKey, Membership, Role, User
from tenancy.permissions import Action
from tenancy.services import change_role, remove_member

TASKS = [
    {"key": "extract", "type": "noop"},
    {"key": "load", "type": "noop", "depends_on": ["extract"]},
]
ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]
PROBLEM = "application/problem+json"


# --- fixtures -----------------------------------------------------------------------------------


def data_queries(captured) -> list[str]:
    """The captured SQL minus transaction control (ATOMIC_REQUESTS adds a savepoint per request)."""
    return [q["sql"] for q in captured.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT"))]


def url(name: str, pk=None) -> str:
    paths = {
        "workflows": "/api/v1/workflows/",
        "workflow": f"/api/v1/workflows/{pk}/",
        "run": f"/api/v1/runs/{pk}/",
        "cancel": f"/api/v1/runs/{pk}/cancel/",
        "keys": "/api/v1/api-keys/",
        "revoke": f"/api/v1/api-keys/{pk}/revoke/",
    }
    return paths[name]


def bearer(full_key: str) -> dict:
    return {"Authorization": f"Bearer {full_key}"}


def membership(org, role: str) -> Membership:
    user = User.objects.create_user(email=f"{role}-{secrets.token_hex(4)}@{org.slug}.example")
    return Membership.objects.create(organization=org, user=user, role=role)


def actor_of(m: Membership):
    m = Membership.objects.for_organization(m.organization_id).select_related("organization", "user").get(pk=m.pk)
    return actor_for_membership(m, channel="cli")


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert body["status"] == status
    assert body["title"] == HTTPStatus(status).phrase
    assert body["type"] == "about:blank"
    assert isinstance(body["detail"], str) and body["detail"]
    return body


@dataclasses.dataclass
class Tenant:
    org: object
    members: dict  # role -> Membership
    keys: dict  # role -> full key (created by the owner)
    key_rows: dict  # role -> ApiKey
    workflow: object
    run: object


@pytest.fixture
def tenant_factory(make_org, make_workflow):
    prefixes: list[str] = []

    def make(workflow_name: str = "pipeline") -> Tenant:
        org = make_org()
        members = {Role.OWNER: Membership.objects.for_organization(org).get(role=Role.OWNER)}
        for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
            members[role] = membership(org, role)
        keys, rows = {}, {}
        for role in ROLES:
            row, full_key = create_api_key(actor=actor_of(members[Role.OWNER]), name=f"{role}-key", role=role)
            keys[role], rows[role] = full_key, row
            prefixes.append(row.prefix)
        make_workflow(org, TASKS, name=workflow_name)
        workflow = make_workflow(org, TASKS + [{"key": "report", "type": "noop", "depends_on": ["load"]}],
                                 name=workflow_name)
        run = start_run(workflow=workflow, trigger_source="api")
        return Tenant(org=org, members=members, keys=keys, key_rows=rows, workflow=workflow, run=run)

    yield make
    cache.delete_many([k for p in prefixes for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


@pytest.fixture
def tenant(tenant_factory) -> Tenant:
    return tenant_factory("pipeline")


@pytest.fixture
def other(tenant_factory) -> Tenant:
    return tenant_factory("other-tenants-secret-pipeline")


@pytest.fixture
def client() -> Client:
    return Client()


# --- API key authentication ---------------------------------------------------------------------


def test_bearer_key_reads_the_keys_organization(client, tenant, other):
    response = client.get(url("workflows"), headers=bearer(tenant.keys[Role.VIEWER]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()["results"]
    assert [(w["name"], w["version"], w["task_count"]) for w in body] == [("pipeline", 2, 3)]
    assert body[0]["id"] == str(tenant.workflow.pk)


def test_every_kind_of_key_failure_gets_the_identical_401(client, tenant):
    good = tenant.keys[Role.MEMBER]
    prefix = apikeys.parse_key(good)[0]
    expired_row, expired = create_api_key(
        actor=actor_of(tenant.members[Role.OWNER]), name="expired", role=Role.MEMBER,
        expires_at=timezone.now() + dt.timedelta(hours=1))
    ApiKey.objects.for_organization(tenant.org).filter(pk=expired_row.pk).update(expires_at=timezone.now())
    revoked = tenant.keys[Role.VIEWER]
    assert client.get(url("workflows"), headers=bearer(revoked)).status_code == 200  # cached now
    revoke_api_key(actor=actor_of(tenant.members[Role.OWNER]), api_key=tenant.key_rows[Role.VIEWER])
    departed_admin = tenant.members[Role.ADMIN]
    _row, orphan = create_api_key(actor=actor_of(departed_admin), name="orphan", role=Role.MEMBER)
    remove_member(actor=actor_of(tenant.members[Role.OWNER]), membership=departed_admin)

    failures = {
        "unknown prefix": f"ffk_{apikeys._new_prefix()}_{secrets.token_urlsafe(32)}",
        "wrong secret": f"ffk_{prefix}_{secrets.token_urlsafe(32)}",
        "expired": expired,
        "revoked": revoked,
        "creator left": orphan,
        "malformed": "ffk_nope",
        "not ascii": "ffk_é",
    }
    responses = {kind: client.get(url("workflows"), headers=bearer(raw)) for kind, raw in failures.items()}
    responses["two tokens"] = client.get(url("workflows"), headers={"Authorization": f"Bearer {good} extra"})
    bodies = set()
    for kind, response in responses.items():
        body = assert_problem(response, 401)
        assert response["WWW-Authenticate"].startswith("Bearer"), kind
        assert body["detail"] == INVALID_KEY_MESSAGE, kind
        bodies.add(response.content)
    assert len(bodies) == 1, bodies
    assert client.get(url("workflows"), headers=bearer(good)).status_code == 200


def test_no_credentials_is_a_401_that_asks_for_a_bearer_token(client, db):
    response = client.get(url("workflows"))
    assert_problem(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_no_credentials_says_none_were_provided(client, db):
    body = assert_problem(client.get(url("workflows")), 401)
    assert (body["detail"], body["code"]) == ("Authentication credentials were not provided.", "not_authenticated")


@pytest.mark.parametrize(
    ("header", "scheme"),
    [("Token {key}", "Token"), ("Basic dXNlcjpwYXNz", "Basic"), ("token  {key}", "token"),
     ("X" * 41 + " y", "X" * 40 + "…")],
    ids=["token", "basic", "lower-case", "long"],
)
def test_another_scheme_is_a_401_that_names_it_and_asks_for_bearer(client, tenant, header, scheme):
    key = tenant.keys[Role.VIEWER]
    response = client.get(url("workflows"), headers={"Authorization": header.format(key=key)})
    body = assert_problem(response, 401)
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert body["code"] == "not_authenticated"
    assert body["detail"] == (
        f"Unsupported authorization scheme {scheme.format(key=key)!r}; "
        "send the API key as 'Authorization: Bearer <key>'."
    )


@pytest.mark.parametrize("header", ["{key}", "{key} x", "Token", "secret-token"], ids=["bare-key", "key-first", "scheme-only", "one-word"])
def test_an_authorization_header_without_scheme_and_key_is_called_malformed_without_echoing_it(client, tenant, header):
    key = tenant.keys[Role.VIEWER]
    response = client.get(url("workflows"), headers={"Authorization": header.format(key=key)})
    body = assert_problem(response, 401)
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert body["detail"] == (
        "Malformed Authorization header: expected a scheme and a key; send the API key as 'Authorization: Bearer <key>'."
    )


def test_a_session_still_works_with_no_authorization_header_or_another_scheme(tenant):
    client = Client(enforce_csrf_checks=True)
    client.force_login(tenant.members[Role.MEMBER].user)
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Token abc"}):
        response = client.get(url("workflows"), headers=headers)
        assert response.status_code == 200, (headers, response.content)
        assert [w["name"] for w in response.json()["results"]] == ["pipeline"]
    # Unsafe methods still need the CSRF token, whatever the Authorization header.
    basic = {"Authorization": "Basic dXNlcjpwYXNz"}
    body = assert_problem(client.post(url("cancel", tenant.run.pk), content_type="application/json", headers=basic),
                          403)
    assert "CSRF" in body["detail"]
    token = secrets.token_hex(16)
    client.cookies["csrftoken"] = token
    response = client.post(url("cancel", tenant.run.pk), content_type="application/json",
                           headers={**basic, "X-CSRFToken": token})
    assert response.status_code == 200 and response.json()["state"] == RunState.CANCELLED


def test_the_public_schema_ignores_another_scheme(client, db):
    assert client.get("/api/schema/", headers={"Authorization": "Basic dXNlcjpwYXNz"}).status_code == 200


def test_a_revoked_key_is_refused_on_the_very_next_request(client, tenant, django_capture_on_commit_callbacks):
    doomed = tenant.keys[Role.MEMBER]
    row = tenant.key_rows[Role.MEMBER]
    assert client.get(url("workflows"), headers=bearer(doomed)).status_code == 200
    assert cache.get(apikeys._entry_key(row.prefix)) is not None
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("revoke", row.pk), headers=bearer(tenant.keys[Role.ADMIN]))
    assert response.status_code == 200
    assert response.json()["revoked_at"] is not None
    assert_problem(client.get(url("workflows"), headers=bearer(doomed)), 401)
    # Even when a racing reader puts the pre-revocation entry back.
    stale = {"v": 1, "sha256": apikeys._sha256(apikeys.parse_key(doomed)[1]), "id": str(row.pk),
             "org": str(tenant.org.pk), "role": row.role, "creator": str(row.created_by_id), "name": row.name,
             "exp": None}
    cache.set(apikeys._entry_key(row.prefix), stale, apikeys.CACHE_TTL_SECONDS)
    assert_problem(client.get(url("workflows"), headers=bearer(doomed)), 401)


def test_a_cached_key_costs_one_redis_round_trip_and_one_membership_query(client, tenant):
    key = tenant.keys[Role.VIEWER]
    client.get(url("workflows"), headers=bearer(key))  # verified with Argon2, cached
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url("workflows"), headers=bearer(key)).status_code == 200
    sqls = data_queries(queries)
    assert len(sqls) == 2, sqls  # the creator's membership (with org and user), the workflows
    # The key's row is read only for whether it is unrevoked, inside the membership query.
    assert "core_membership" in sqls[0] and "core_apikey" in sqls[0] and "revoked_at" in sqls[0], sqls
    assert not any("hashed_key" in s for s in sqls), sqls


def test_the_key_wins_over_a_session_cookie_and_needs_no_csrf_token(tenant):
    client = Client(enforce_csrf_checks=True)
    client.force_login(tenant.members[Role.OWNER].user)
    response = client.post(url("cancel", tenant.run.pk), headers=bearer(tenant.keys[Role.VIEWER]))
    assert_problem(response, 403)
    response = client.post(url("cancel", tenant.run.pk), headers=bearer(tenant.keys[Role.MEMBER]))
    assert response.status_code == 200


def test_an_api_key_request_user_is_not_a_user(tenant):
    seen = {}

    class Probe(APIView):
        authentication_classes = OrganizationAPIView.authentication_classes

        def get(self, request):
            seen["user"], seen["auth"] = request.user, request.auth
            return Response({})

    request = APIRequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {tenant.keys[Role.OWNER]}")
    assert Probe.as_view()(request).status_code == 200
    assert isinstance(seen["user"], ApiKeyPrincipal) and not isinstance(seen["user"], User)
    assert seen["user"].pk is None and seen["auth"].organization == tenant.org


# --- roles --------------------------------------------------------------------------------------


EXPECTED = {
    # role: (cancel, list keys, revoke a key, create a key by session)
    Role.VIEWER: (403, 403, 403, 403),
    Role.MEMBER: (200, 403, 403, 403),
    Role.ADMIN: (200, 200, 200, 201),
    Role.OWNER: (200, 200, 200, 201),
}


@pytest.mark.parametrize("role", ROLES)
def test_roles_across_the_endpoints_with_api_keys(client, tenant, role, make_workflow):
    key = bearer(tenant.keys[role])
    cancel, list_keys, revoke, _create = EXPECTED[role]
    for path in (url("workflows"), url("workflow", tenant.workflow.pk), url("run", tenant.run.pk)):
        assert client.get(path, headers=key).status_code == 200, path
    response = client.post(url("cancel", tenant.run.pk), headers=key)
    assert response.status_code == cancel, response.content
    if cancel == 403:
        assert_problem(response, 403)
        assert WorkflowRun.objects.for_organization(tenant.org).get(pk=tenant.run.pk).state != RunState.CANCELLED
    else:
        assert response.json()["state"] == RunState.CANCELLED
        assert all(tr["state"] == "cancelled" for tr in response.json()["task_runs"])
        # A second cancel finds the run finished.
        assert_problem(client.post(url("cancel", tenant.run.pk), headers=key), 409)
    response = client.get(url("keys"), headers=key)
    assert response.status_code == list_keys
    if list_keys == 403:
        assert_problem(response, 403)
    victim = create_api_key(actor=actor_of(tenant.members[Role.OWNER]), name="victim", role=Role.VIEWER)[0]
    response = client.post(url("revoke", victim.pk), headers=key)
    assert response.status_code == revoke
    victim.refresh_from_db()
    assert (victim.revoked_at is not None) == (revoke == 200)
    # Keys are made by signed-in users only, whatever the key's role.
    response = client.post(url("keys"), {"name": "child", "role": "viewer"}, content_type="application/json",
                           headers=key)
    assert_problem(response, 403)


@pytest.mark.parametrize("role", ROLES)
def test_roles_across_the_endpoints_with_a_session(tenant, role):
    client = Client()
    client.force_login(tenant.members[role].user)
    cancel, list_keys, revoke, create = EXPECTED[role]
    for path in (url("workflows"), url("workflow", tenant.workflow.pk), url("run", tenant.run.pk)):
        assert client.get(path).status_code == 200, path
    assert client.post(url("cancel", tenant.run.pk)).status_code == cancel
    assert client.get(url("keys")).status_code == list_keys
    response = client.post(url("keys"), {"name": "ci", "role": "viewer"}, content_type="application/json")
    assert response.status_code == create, response.content
    if create == 201:
        body = response.json()
        assert response["Cache-Control"] == "no-store"
        assert body["key"].startswith(f"ffk_{body['prefix']}_")
        assert body["created_by"] == tenant.members[role].user.email
        assert client.get(url("workflows"), headers=bearer(body["key"])).status_code == 200
        listed = client.get(url("keys")).json()["results"]
        assert body["prefix"] in [k["prefix"] for k in listed]
        assert all("key" not in k and "hashed_key" not in k for k in listed)
        assert body["key"] not in client.get(url("keys")).content.decode()
    else:
        assert_problem(response, 403)


def test_a_session_cannot_create_a_key_above_its_role(tenant):
    client = Client()
    client.force_login(tenant.members[Role.ADMIN].user)
    response = client.post(url("keys"), {"name": "ci", "role": "owner"}, content_type="application/json")
    assert "owner" in assert_problem(response, 403)["detail"]


def test_a_key_of_a_creator_demoted_to_viewer_acts_as_viewer(client, tenant):
    admin = tenant.members[Role.ADMIN]
    _row, full_key = create_api_key(actor=actor_of(admin), name="ci", role=Role.ADMIN)
    assert client.get(url("keys"), headers=bearer(full_key)).status_code == 200  # cached as admin
    change_role(actor=actor_of(tenant.members[Role.OWNER]), membership=admin, role=Role.VIEWER)
    assert client.get(url("workflows"), headers=bearer(full_key)).status_code == 200
    body = assert_problem(client.post(url("cancel", tenant.run.pk), headers=bearer(full_key)), 403)
    assert "viewer" in body["detail"]
    assert_problem(client.get(url("keys"), headers=bearer(full_key)), 403)


def test_a_key_whose_creator_left_the_organization_is_refused(client, tenant):
    admin = tenant.members[Role.ADMIN]
    _row, full_key = create_api_key(actor=actor_of(admin), name="ci", role=Role.MEMBER)
    assert client.get(url("workflows"), headers=bearer(full_key)).status_code == 200
    remove_member(actor=actor_of(tenant.members[Role.OWNER]), membership=admin)
    response = client.get(url("workflows"), headers=bearer(full_key))
    assert assert_problem(response, 401)["detail"] == INVALID_KEY_MESSAGE


# --- tenant isolation ---------------------------------------------------------------------------


def foreign_paths(other: Tenant) -> list[tuple[str, str]]:
    return [
        ("get", url("workflow", other.workflow.pk)),
        ("get", url("run", other.run.pk)),
        ("post", url("cancel", other.run.pk)),
        ("post", url("revoke", other.key_rows[Role.VIEWER].pk)),
    ]


def missing_paths() -> list[tuple[str, str]]:
    pk = uuid.uuid4()
    return [("get", url("workflow", pk)), ("get", url("run", pk)), ("post", url("cancel", pk)),
            ("post", url("revoke", pk))]


def assert_isolated(client: Client, headers: dict, tenant: Tenant, other: Tenant) -> None:
    for (method, path), (_m, missing) in zip(foreign_paths(other), missing_paths(), strict=True):
        response = getattr(client, method)(path, headers=headers)
        assert_problem(response, 404)
        # Byte for byte what an id that exists nowhere gets: nothing confirms the other tenant.
        assert response.content == getattr(client, method)(missing, headers=headers).content, path
    names = [w["name"] for w in client.get(url("workflows"), headers=headers).json()["results"]]
    assert names == ["pipeline"]
    keys = client.get(url("keys"), headers=headers).json()["results"]
    assert {k["prefix"] for k in keys} == {r.prefix for r in tenant.key_rows.values()}
    # Nothing of the other tenant changed.
    assert WorkflowRun.objects.for_organization(other.org).get(pk=other.run.pk).state != RunState.CANCELLED
    assert ApiKey.objects.for_organization(other.org).get(pk=other.key_rows[Role.VIEWER].pk).revoked_at is None


def test_another_organizations_objects_are_404_with_an_api_key(client, tenant, other):
    assert_isolated(client, bearer(tenant.keys[Role.OWNER]), tenant, other)


def test_another_organizations_objects_are_404_with_a_session(client, tenant, other):
    client.force_login(tenant.members[Role.OWNER].user)
    assert_isolated(client, {}, tenant, other)


def test_another_organizations_objects_are_404_for_a_member_of_both_acting_in_one(client, tenant, other):
    user = tenant.members[Role.OWNER].user
    Membership.objects.create(organization=other.org, user=user, role=Role.VIEWER)
    client.force_login(user)
    assert_isolated(client, {"X-Organization": tenant.org.slug}, tenant, other)


# --- session users and their organization -------------------------------------------------------


def test_a_session_user_with_two_memberships_must_choose_an_organization(client, tenant, other):
    user = tenant.members[Role.MEMBER].user
    Membership.objects.create(organization=other.org, user=user, role=Role.VIEWER)
    client.force_login(user)
    body = assert_problem(client.get(url("workflows")), 400)
    assert "X-Organization" in body["detail"]
    assert body["code"] == "organization_required"
    response = client.get(url("workflows"), headers={"X-Organization": tenant.org.slug})
    assert response.status_code == 200 and [w["name"] for w in response.json()["results"]] == ["pipeline"]
    response = client.get(url("workflows"), headers={"X-Organization": str(other.org.pk)})
    assert [w["name"] for w in response.json()["results"]] == ["other-tenants-secret-pipeline"]
    # The role is the one of the chosen organization.
    assert client.post(url("cancel", other.run.pk), headers={"X-Organization": other.org.slug}).status_code == 403


def test_an_organization_the_user_is_not_in_is_404_like_one_that_does_not_exist(client, tenant, other):
    client.force_login(tenant.members[Role.OWNER].user)
    not_mine = client.get(url("workflows"), headers={"X-Organization": other.org.slug})
    nowhere = client.get(url("workflows"), headers={"X-Organization": "no-such-organization"})
    assert_problem(not_mine, 404)
    assert not_mine.content == nowhere.content


def test_a_session_post_without_a_csrf_token_is_403(tenant):
    client = Client(enforce_csrf_checks=True)
    client.force_login(tenant.members[Role.MEMBER].user)
    # An API client posts JSON (the API accepts JSON bodies only; an empty body needs no type).
    body = assert_problem(client.post(url("cancel", tenant.run.pk), content_type="application/json"), 403)
    assert "CSRF" in body["detail"]
    assert WorkflowRun.objects.for_organization(tenant.org).get(pk=tenant.run.pk).state != RunState.CANCELLED
    token = secrets.token_hex(16)  # 32 characters: a CSRF secret
    client.cookies["csrftoken"] = token
    response = client.post(url("cancel", tenant.run.pk), content_type="application/json",
                           headers={"X-CSRFToken": token})
    assert response.status_code == 200 and response.json()["state"] == RunState.CANCELLED


def test_a_user_without_membership_gets_a_400_that_says_how_to_get_one(client, db):
    user = User.objects.create_user(email="lonely@example.com")
    client.force_login(user)
    body = assert_problem(client.get(url("workflows")), 400)
    assert "not a member" in body["detail"]


# --- responses ----------------------------------------------------------------------------------


def test_workflow_detail_has_tasks_with_their_upstream_keys(client, tenant):
    body = client.get(url("workflow", tenant.workflow.pk), headers=bearer(tenant.keys[Role.VIEWER])).json()
    assert (body["name"], body["version"]) == ("pipeline", 2)
    assert {t["key"]: t["depends_on"] for t in body["tasks"]} == {
        "extract": [], "load": ["extract"], "report": ["load"]}


def test_run_detail_has_its_task_runs(client, tenant):
    body = client.get(url("run", tenant.run.pk), headers=bearer(tenant.keys[Role.VIEWER])).json()
    assert body["id"] == str(tenant.run.pk)
    assert body["workflow"] == {"id": str(tenant.workflow.pk), "name": "pipeline", "version": 2}
    assert sorted(tr["key"] for tr in body["task_runs"]) == ["extract", "load", "report"]


def test_a_validation_error_is_a_problem_with_field_errors(tenant):
    client = Client()
    client.force_login(tenant.members[Role.ADMIN].user)
    body = assert_problem(client.post(url("keys"), {"name": "", "role": "boss"}, content_type="application/json"), 400)
    assert set(body["errors"]) == {"name", "role"}


def test_unsupported_methods_are_405_after_authentication(client, tenant):
    assert_problem(client.delete(url("workflows")), 401)
    key = bearer(tenant.keys[Role.OWNER])
    for response in (client.delete(url("workflows"), headers=key), client.options(url("keys"), headers=key),
                     client.put(url("run", tenant.run.pk), headers=key)):
        assert_problem(response, 405)
    assert client.head(url("workflows"), headers=key).status_code == 200


def test_problem_handler_can_be_enabled_for_every_drf_view_through_settings(settings, db):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "EXCEPTION_HANDLER": "api.exceptions.problem_exception_handler"}

    class Plain(APIView):
        authentication_classes = []
        permission_classes = []

        def get(self, request):
            raise NotFound("gone")

    response = Plain.as_view()(APIRequestFactory().get("/"))
    response.render()
    assert response.status_code == 404 and response["Content-Type"] == PROBLEM
    assert response.data == {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "gone",
                             "code": "not_found"}


# --- query counts -------------------------------------------------------------------------------


def count_queries(client, path, headers) -> int:
    client.get(path, headers=headers)  # warm the key cache
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path, headers=headers).status_code == 200
    return len(data_queries(queries))


def test_lists_take_a_constant_number_of_queries(client, tenant, make_workflow):
    key = bearer(tenant.keys[Role.OWNER])
    workflows_before = count_queries(client, url("workflows"), key)
    keys_before = count_queries(client, url("keys"), key)
    run_before = count_queries(client, url("run", tenant.run.pk), key)
    for i in range(5):
        make_workflow(tenant.org, TASKS, name=f"more-{i}")
        make_workflow(tenant.org, TASKS, name=f"more-{i}")
        create_api_key(actor=actor_of(tenant.members[Role.ADMIN]), name=f"extra-{i}", role=Role.VIEWER)
    big = make_workflow(tenant.org, [{"key": f"t{i}", "type": "noop"} for i in range(12)], name="wide")
    big_run = start_run(workflow=big, trigger_source="api")
    assert count_queries(client, url("workflows"), key) == workflows_before
    assert len(client.get(url("workflows"), headers=key).json()["results"]) == 7
    assert count_queries(client, url("keys"), key) == keys_before
    assert len(client.get(url("keys"), headers=key).json()["results"]) == 9
    assert count_queries(client, url("run", big_run.pk), key) == run_before
    assert count_queries(client, url("workflow", big.pk), key) == 4  # membership, workflow, tasks, edges


# --- the base view ------------------------------------------------------------------------------


def all_subclasses(cls) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | all_subclasses(sub)
    return found


def test_no_api_view_overrides_initial_or_any_protected_member():
    import api.urls  # noqa: F401 (imports every view module, registering the subclasses)

    views = all_subclasses(OrganizationAPIView)
    assert len(views) >= 6
    for view in views:
        assert "initial" not in vars(view), view
        assert not (api_base.PROTECTED & set(vars(view))), view


def test_every_api_route_is_served_by_the_base_view():
    resolver = get_resolver()
    (api_include,) = [p for p in resolver.url_patterns if str(p.pattern) == "api/v1/"]
    patterns = [p for p in api_include.url_patterns if isinstance(p, URLPattern)]
    assert patterns
    for pattern in patterns:
        assert issubclass(pattern.callback.view_class, OrganizationAPIView), pattern


def test_a_subclass_overriding_the_pipeline_is_refused_at_definition():
    with pytest.raises(TypeError, match="initial"):
        class Sneaky(OrganizationAPIView):
            required_action = {"GET": Action.READ}

            def initial(self, request, *args, **kwargs):
                pass

    with pytest.raises(TypeError, match="permission_classes"):
        class Open(OrganizationAPIView):
            permission_classes = []

    with pytest.raises(TypeError, match="get_queryset"):
        class Unscoped(OrganizationAPIView):
            def get_queryset(self):
                return WorkflowRun.objects.unscoped()


def test_a_handler_without_a_required_action_is_refused_at_definition():
    with pytest.raises(TypeError, match="DELETE"):
        class Careless(OrganizationAPIView):
            required_action = {"GET": Action.READ}

            def get(self, request):
                pass

            def delete(self, request):
                pass
