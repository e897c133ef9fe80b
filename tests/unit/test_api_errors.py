"""Every error of the REST API is an RFC 9457 problem (application/problem+json),
each status produced by a real request through the whole middleware stack: 400
naming the field, 401, 403, 404, 405, 406, 409, 413, 415, 429 with Retry-After, and
the last-resort 500 — which tests still see as the exception it was."""

from __future__ import annotations

import json
import secrets
from http import HTTPStatus

import pytest
from django.core.cache import cache
from django.core.exceptions import RequestDataTooBig
from django.test import Client
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from api import throttling
from tenancy import apikeys
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role, User
from tenancy.services import invite_member

PROBLEM = "application/problem+json"
ONE_MIB = 1024 * 1024


def bearer(full_key: str) -> dict:
    return {"Authorization": f"Bearer {full_key}"}


def assert_problem(response, status: int) -> dict:
    """The response is a problem document of ``status`` with every RFC 9457 member."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"] == PROBLEM
    body = json.loads(response.content)
    assert body["type"] == "about:blank"
    assert body["title"] == HTTPStatus(status).phrase
    assert body["status"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["code"], str) and body["code"]
    return body


@pytest.fixture
def org_keys(make_org, make_workflow):
    """An organization with one user and one API key per role: (org, {role: key}, {role: Membership})."""
    org = make_org()
    owner = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    members, keys, prefixes = {Role.OWNER: owner}, {}, []
    for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
        user = User.objects.create_user(email=f"{role}-{secrets.token_hex(3)}@{org.slug}.example")
        members[role] = Membership.objects.create(organization=org, user=user, role=role)
    for role in (Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER):
        row, keys[role] = create_api_key(actor=actor_for_membership(owner, channel="cli"), name=role, role=role)
        prefixes.append(row.prefix)
    make_workflow(org, [{"key": "a", "type": "noop"}], name="nightly-report")
    yield org, keys, members
    cache.delete_many([k for p in prefixes for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


@pytest.fixture
def client() -> Client:
    return Client()


# --- 400 -----------------------------------------------------------------------------------------


def test_400_names_the_invalid_field(client, org_keys):
    _org, keys, _ = org_keys
    body = {"name": "t", "workflow_name": "nightly-report", "cron_expression": "99 * * * *"}
    problem = assert_problem(client.post("/api/v1/triggers/", body, content_type="application/json",
                                         headers=bearer(keys[Role.MEMBER])), 400)
    assert problem["code"] == "invalid"
    assert problem["errors"] == {"cron_expression": ["'99 * * * *' is not a valid cron expression"]}


def test_400_for_a_malformed_json_body(client, org_keys):
    _org, keys, _ = org_keys
    response = client.post("/api/v1/triggers/", b'{"name": ', content_type="application/json",
                           headers=bearer(keys[Role.MEMBER]))
    assert assert_problem(response, 400)["code"] == "parse_error"


def test_400_for_json_nested_beyond_the_parsers_recursion_limit(client, org_keys):
    _org, keys, _ = org_keys
    deep = b"[" * 100_000 + b"]" * 100_000
    response = client.post("/api/v1/triggers/", deep, content_type="application/json",
                           headers=bearer(keys[Role.MEMBER]))
    assert "nested too deeply" in assert_problem(response, 400)["detail"]


def test_400_for_a_malformed_content_length(client, org_keys):
    _org, keys, _ = org_keys
    response = client.generic("POST", "/api/v1/triggers/", b"{}", content_type="application/json",
                              headers=bearer(keys[Role.MEMBER]), CONTENT_LENGTH="lots")
    assert_problem(response, 400)


# --- 401 / 403 / 404 / 405 / 406 ---------------------------------------------------------------------


def test_401_without_credentials_and_with_a_bad_key(client, org_keys):
    assert assert_problem(client.get("/api/v1/members/"), 401)["code"] == "not_authenticated"
    response = client.get("/api/v1/members/", headers=bearer("ffk_aaaaaaaaaaaa_" + "b" * 43))
    assert assert_problem(response, 401)["detail"] == "Invalid API key."
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_403_for_a_role_that_may_not(client, org_keys):
    _org, keys, _ = org_keys
    problem = assert_problem(client.get("/api/v1/audit-events/", headers=bearer(keys[Role.MEMBER])), 403)
    assert problem["code"] == "permission_denied" and "audit.read" in problem["detail"]


def test_404_for_an_unknown_object_and_an_unknown_api_path(client, org_keys):
    _org, keys, _ = org_keys
    key = bearer(keys[Role.OWNER])
    assert assert_problem(client.get("/api/v1/triggers/7b1f3a52-0d4e-4f6a-9b8c-1d2e3f4a5b6c/", headers=key),
                          404)["code"] == "not_found"
    # No route at all: Django's 404 page, rewritten by the middleware.
    assert_problem(client.get("/api/v1/no-such-thing/", headers=key), 404)
    assert_problem(client.get("/api/v1/triggers/not-a-uuid/", headers=key), 404)


def test_every_api_404_is_a_not_found_problem_in_the_same_format(client, org_keys, make_org, make_workflow):
    _org, keys, _ = org_keys
    key = bearer(keys[Role.OWNER])
    elsewhere = make_workflow(make_org(), [{"key": "a", "type": "noop"}], name="theirs")
    from engine.services import start_run

    foreign_run = start_run(workflow=elsewhere, trigger_source="api")
    not_found = {"type": "about:blank", "title": "Not Found", "status": 404, "detail": "Not found.", "code": "not_found"}
    # An object of another organization, or none: a neutral detail that names no model.
    for path in (f"/api/v1/runs/{foreign_run.pk}/", f"/api/v1/workflows/{elsewhere.pk}/",
                 "/api/v1/triggers/7b1f3a52-0d4e-4f6a-9b8c-1d2e3f4a5b6c/"):
        response = client.get(path, headers=key)
        assert_problem(response, 404)
        assert response.content == json.dumps(not_found, separators=(",", ":")).encode(), path
    # No route (an unknown path, a malformed id): the middleware's problem, same code and format.
    for path in ("/api/v1/no-such-thing/", "/api/v1/runs/not-a-uuid/"):
        response = client.get(path, headers=key)
        assert_problem(response, 404)
        no_route = {**not_found, "detail": "There is no API endpoint at this path."}
        assert response.content == json.dumps(no_route, separators=(",", ":")).encode(), path


def test_405_is_a_problem_with_allow(client, org_keys):
    _org, keys, _ = org_keys
    response = client.put("/api/v1/members/", {}, content_type="application/json", headers=bearer(keys[Role.OWNER]))
    assert assert_problem(response, 405)["code"] == "method_not_allowed"
    assert "GET" in response["Allow"]


def test_406_for_an_accept_header_the_api_cannot_serve(client, org_keys):
    _org, keys, _ = org_keys
    response = client.get("/api/v1/members/", headers={**bearer(keys[Role.OWNER]), "Accept": "text/csv"})
    assert_problem(response, 406)


# --- 409 -----------------------------------------------------------------------------------------------


def test_409_for_revoking_an_invitation_that_is_no_longer_pending(client, org_keys):
    org, keys, members = org_keys
    invitation, _token = invite_member(actor=actor_for_membership(members[Role.OWNER]), email="x@example.com")
    key = bearer(keys[Role.ADMIN])
    assert client.post(f"/api/v1/invitations/{invitation.pk}/revoke/", headers=key).status_code == 200
    problem = assert_problem(client.post(f"/api/v1/invitations/{invitation.pk}/revoke/", headers=key), 409)
    assert problem["code"] == "conflict"


# --- 413 -----------------------------------------------------------------------------------------------


def test_413_for_a_body_over_one_mebibyte(client, org_keys, settings):
    _org, keys, _ = org_keys
    assert settings.FLOWFORGE_MAX_BODY_BYTES == ONE_MIB
    body = json.dumps({"name": "t", "workflow_name": "nightly-report", "cron_expression": "0 * * * *",
                       "input": {"blob": "x" * ONE_MIB}})
    assert len(body) > ONE_MIB
    response = client.post("/api/v1/triggers/", body, content_type="application/json",
                           headers=bearer(keys[Role.MEMBER]))
    problem = assert_problem(response, 413)
    assert problem["code"] == "payload_too_large" and str(ONE_MIB) in problem["detail"]
    # Just under the limit is read and judged on its merits.
    small = json.dumps({"name": "t", "workflow_name": "nightly-report", "cron_expression": "0 * * * *",
                        "input": {"blob": "x" * (ONE_MIB - 200)}})
    assert len(small) <= ONE_MIB
    assert client.post("/api/v1/triggers/", small, content_type="application/json",
                       headers=bearer(keys[Role.MEMBER])).status_code == 201


def test_413_when_django_refuses_to_read_the_body_that_drfs_parser_gets(client, org_keys, settings):
    """Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE, raising RequestDataTooBig when
    request.body is read) applies to the body DRF's JSON parser reads — here set below
    FLOWFORGE_MAX_BODY_BYTES so the Content-Length check lets the request through."""
    _org, keys, _ = org_keys
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    body = json.dumps({"name": "t" * 150, "workflow_name": "nightly-report", "cron_expression": "0 * * * *"})
    response = client.post("/api/v1/triggers/", body, content_type="application/json",
                           headers=bearer(keys[Role.MEMBER]))
    assert assert_problem(response, 413)["code"] == "payload_too_large"


def test_request_data_too_big_raised_in_a_drf_view_is_a_413_problem(db):
    class ReadsTooMuch(APIView):
        authentication_classes = []
        permission_classes = []

        def post(self, request):
            raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")

    response = ReadsTooMuch.as_view()(APIRequestFactory().post("/api/v1/x/", {}, format="json"))
    response.render()
    assert_problem(response, 413)


# --- 415 -----------------------------------------------------------------------------------------------


def test_415_for_a_body_that_is_not_json(client, org_keys):
    _org, keys, _ = org_keys
    key = bearer(keys[Role.MEMBER])
    response = client.post("/api/v1/triggers/", "name=t", content_type="text/plain", headers=key)
    assert assert_problem(response, 415)["code"] == "unsupported_media_type"
    response = client.post("/api/v1/triggers/", {"name": "t"}, headers=key)  # multipart form
    assert_problem(response, 415)


def test_415_for_a_body_without_a_content_type(client, org_keys):
    _org, keys, _ = org_keys
    response = client.generic("POST", "/api/v1/triggers/", b'{"name": "t"}', content_type="",
                              headers=bearer(keys[Role.MEMBER]))
    assert assert_problem(response, 415)["code"] == "unsupported_media_type"


# --- 429 -----------------------------------------------------------------------------------------------


@pytest.fixture
def pinned_clock(monkeypatch):
    """Pin the rate limiter's clock 17.25 s into a minute, so no window ends mid-test."""
    at = 1_900_000_020 + 17.25  # 1_900_000_020 is a whole minute
    monkeypatch.setattr(throttling, "now", lambda: at)
    return at


def test_429_with_retry_after_when_a_key_spends_its_limit(client, org_keys, settings, pinned_clock):
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 3
    _org, keys, _ = org_keys
    key = bearer(keys[Role.VIEWER])
    for _ in range(3):
        assert client.get("/api/v1/members/", headers=key).status_code == 200
    response = client.get("/api/v1/members/", headers=key)
    problem = assert_problem(response, 429)
    assert problem["code"] == "throttled"
    assert response["Retry-After"] == "43"  # 60 - 17.25, rounded up
    # Another key has a budget of its own.
    assert client.get("/api/v1/members/", headers=bearer(keys[Role.MEMBER])).status_code == 200


def test_429_for_a_session_user(org_keys, settings, pinned_clock):
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 2
    _org, _keys, members = org_keys
    session = Client()
    session.force_login(members[Role.MEMBER].user)
    assert [session.get("/api/v1/members/").status_code for _ in range(2)] == [200, 200]
    response = session.get("/api/v1/triggers/")
    assert_problem(response, 429)
    assert int(response["Retry-After"]) == 43


def test_an_address_that_keeps_failing_api_keys_gets_a_429_before_any_verification(
    client, org_keys, settings, pinned_clock, monkeypatch
):
    """Past FLOWFORGE_API_KEY_FAILURES_PER_MINUTE failed keys from one address, the next
    attempt (even with a valid key) is a 429 with Retry-After and costs no Argon2 check;
    another address is not affected."""
    settings.FLOWFORGE_API_KEY_FAILURES_PER_MINUTE = 3
    _org, keys, _ = org_keys
    ip = f"198.51.100.{secrets.randbelow(250) + 1}"
    bad = bearer("ffk_" + "a" * 12 + "_" + "b" * 40)
    for _ in range(3):
        assert_problem(client.get("/api/v1/members/", headers=bad, REMOTE_ADDR=ip), 401)
    verified = []
    monkeypatch.setattr(apikeys, "authenticate", lambda raw: verified.append(raw))
    for headers in (bad, bearer(keys[Role.VIEWER])):
        response = client.get("/api/v1/members/", headers=headers, REMOTE_ADDR=ip)
        problem = assert_problem(response, 429)
        assert problem["code"] == "throttled"
        assert problem["detail"] == ("Too many failed API key attempts from this address. "
                                     "Expected available in 43 seconds.")  # the wait, said once
        assert response["Retry-After"] == "43"
    assert verified == []
    monkeypatch.undo()
    assert client.get("/api/v1/members/", headers=bearer(keys[Role.VIEWER]), REMOTE_ADDR="198.51.100.251").status_code == 200


def test_the_next_window_has_a_fresh_budget(client, org_keys, settings, monkeypatch):
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 1
    _org, keys, _ = org_keys
    key = bearer(keys[Role.ADMIN])
    monkeypatch.setattr(throttling, "now", lambda: 1_900_000_020 + 59.5)
    assert client.get("/api/v1/members/", headers=key).status_code == 200
    response = client.get("/api/v1/members/", headers=key)
    assert_problem(response, 429)
    assert response["Retry-After"] == "1"
    monkeypatch.setattr(throttling, "now", lambda: 1_900_000_020 + 60.5)
    assert client.get("/api/v1/members/", headers=key).status_code == 200


# --- the last resort -----------------------------------------------------------------------------------


def test_an_unexpected_exception_is_a_500_problem_and_is_rolled_back(org_keys, monkeypatch):
    org, keys, members = org_keys
    invitation, _ = invite_member(actor=actor_for_membership(members[Role.OWNER]), email="x@example.com")
    from api import views_org
    from tenancy.services import revoke_invitation

    def revoke_then_fail(**kwargs):
        revoke_invitation(**kwargs)
        raise RuntimeError("a bug")

    monkeypatch.setattr(views_org, "revoke_invitation", revoke_then_fail)
    client = Client(raise_request_exception=False)
    response = client.post(f"/api/v1/invitations/{invitation.pk}/revoke/", headers=bearer(keys[Role.ADMIN]))
    problem = assert_problem(response, 500)
    assert problem["code"] == "server_error"
    assert problem["request_id"] == response["X-Request-ID"]
    assert "a bug" not in response.content.decode() and "Traceback" not in response.content.decode()
    invitation.refresh_from_db()
    assert invitation.revoked_at is None  # the request's transaction was rolled back


def test_tests_still_see_an_unexpected_exception_as_itself(org_keys, monkeypatch):
    _org, keys, _ = org_keys
    from api import views_org

    monkeypatch.setattr(views_org, "paginate_newest_first", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        Client().get("/api/v1/members/", headers=bearer(keys[Role.OWNER]))


def test_non_api_paths_keep_their_html_errors(client, db):
    response = client.get("/no-such-page-anywhere/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_two_keys_of_one_organization_together_spend_its_budget(client, org_keys, settings, pinned_clock):
    """The per-key limit alone would let each key send 3; the organization's budget of 4
    is shared by its keys and its session users, and names itself in the 429."""
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 3
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG = 4
    _org, keys, members = org_keys
    first, second = bearer(keys[Role.VIEWER]), bearer(keys[Role.MEMBER])
    assert [client.get("/api/v1/members/", headers=h).status_code for h in (first, second, first, second)] == [
        200, 200, 200, 200]
    response = client.get("/api/v1/members/", headers=second)  # the key's 3rd: within its own budget
    problem = assert_problem(response, 429)
    assert problem["code"] == "throttled"
    assert problem["detail"] == ("Request was throttled: the organization's rate limit of 4 requests per minute "
                                 "(all its API keys and users together) is spent. Expected available in 43 seconds.")
    assert response["Retry-After"] == "43"
    session = Client()
    session.force_login(members[Role.OWNER].user)  # a session user of the organization shares it too
    assert_problem(session.get("/api/v1/members/"), 429)


def test_a_keys_own_budget_names_the_key_and_leaves_the_organizations_alone(client, org_keys, settings,
                                                                          pinned_clock):
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 2
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG = 5
    _org, keys, _ = org_keys
    key = bearer(keys[Role.VIEWER])
    assert [client.get("/api/v1/members/", headers=key).status_code for _ in range(2)] == [200, 200]
    for _ in range(4):  # refused by the key's budget: not counted against the organization's
        problem = assert_problem(client.get("/api/v1/members/", headers=key), 429)
        assert problem["detail"] == ("Request was throttled: this API key's rate limit of 2 requests per minute "
                                     "is spent. Expected available in 43 seconds.")
    other = bearer(keys[Role.MEMBER])
    assert [client.get("/api/v1/members/", headers=other).status_code for _ in range(2)] == [200, 200]  # org: 4/5


def test_an_organizations_spent_budget_does_not_touch_another_organization(client, org_keys, make_org, settings,
                                                                          pinned_clock):
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG = 1
    _org, keys, _ = org_keys
    assert client.get("/api/v1/members/", headers=bearer(keys[Role.VIEWER])).status_code == 200
    assert_problem(client.get("/api/v1/members/", headers=bearer(keys[Role.MEMBER])), 429)
    other = make_org()
    owner = Membership.objects.for_organization(other).get(role=Role.OWNER)
    row, full = create_api_key(actor=actor_for_membership(owner, channel="cli"), name="k", role=Role.VIEWER)
    try:
        assert client.get("/api/v1/members/", headers=bearer(full)).status_code == 200
    finally:
        cache.delete_many([apikeys._entry_key(row.prefix), apikeys._tombstone_key(row.prefix)])
