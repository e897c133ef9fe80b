"""Organization secrets (issue 18): encryption at rest under FLOWFORGE_SECRET_KEYS and its
rotation, the actions (create, rotate, delete) with their limits, permissions and audit
records, the REST API and the page — and that no value ever comes back out of any of them."""

from __future__ import annotations

import json
import secrets as pysecrets

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditLog
from flowforge.crypto import DecryptionError
from tenancy import vault
from tenancy.access import ObjectNotFound
from tenancy.apikeys import create_api_key
from tenancy.limits import QuotaExceeded
from tenancy.models import Role, Secret
from tenancy.permissions import Forbidden
from tests.unit.test_web_workflows import actor_of, assert_csp_clean, client_for, make_team, text

pytestmark = pytest.mark.django_db


def new_value() -> str:
    """A fresh value (token_urlsafe: the suite's audit scan also looks for it)."""
    return "sk_live_" + pysecrets.token_urlsafe(24)


@pytest.fixture
def team(org):
    return make_team(org)


def owner(team):
    return actor_of(team["owner"])


def secret_rows(org) -> list[Secret]:
    return list(Secret.objects.for_organization(org).order_by("name"))


def audit_rows(org, prefix: str = "secret.") -> list[AuditLog]:
    return list(AuditLog.objects.for_organization(org).filter(action__startswith=prefix).order_by("seq"))


def table_text(table: str) -> str:
    """Every row of ``table`` as text, as PostgreSQL prints it."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT t::text FROM {table} t")  # our own table names, no input
        return "\n".join(r[0] for r in cur.fetchall())


# --- encryption and key rotation -----------------------------------------------------------------


def test_a_value_is_stored_as_a_fernet_token_that_only_the_configured_keys_open(team):
    value = new_value()
    secret, created = vault.set_secret(actor=owner(team), name="API_TOKEN", value=value)
    assert created and secret.version == 1
    stored = Secret.objects.for_organization(team["org"]).get(name="API_TOKEN").ciphertext
    assert value not in stored and value not in table_text("core_secret")
    assert vault.decrypt(stored, organization_id=team["org"].pk, name="API_TOKEN") == value
    assert vault.decrypt_values(team["org"].pk, ["API_TOKEN", "MISSING"]) == {"API_TOKEN": value}


def test_a_token_moved_to_another_organizations_row_is_refused(team, make_org):
    value = new_value()
    vault.set_secret(actor=owner(team), name="API_TOKEN", value=value)
    other = make_org()
    other_owner = make_team(other)["owner"]
    vault.set_secret(actor=actor_of(other_owner), name="API_TOKEN", value=new_value())
    # Someone who can write the database but holds no key copies A's token into B's row:
    token = Secret.objects.for_organization(team["org"]).get(name="API_TOKEN").ciphertext
    Secret.objects.for_organization(other).filter(name="API_TOKEN").update(ciphertext=token)
    with pytest.raises(DecryptionError, match="belongs to another secret"):
        vault.decrypt_values(other.pk, ["API_TOKEN"])
    # ... or into another name of the same organization:
    vault.set_secret(actor=owner(team), name="OTHER", value=new_value())
    Secret.objects.for_organization(team["org"]).filter(name="OTHER").update(ciphertext=token)
    with pytest.raises(DecryptionError, match="belongs to another secret"):
        vault.decrypt_values(team["org"].pk, ["OTHER"])


def test_key_rotation_re_encrypts_every_value_under_the_new_first_key_and_is_idempotent(team, settings):
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FLOWFORGE_SECRET_KEYS = [old_key]
    values = {f"S{i}": new_value() for i in range(5)}
    for name, value in values.items():
        vault.set_secret(actor=owner(team), name=name, value=value)
    before = {s.name: (s.ciphertext, s.version, s.updated_at) for s in secret_rows(team["org"])}

    settings.FLOWFORGE_SECRET_KEYS = [new_key, old_key]  # the new key first: it encrypts, both decrypt
    assert vault.decrypt_values(team["org"].pk, list(values)) == values  # old tokens still open
    vault.set_secret(actor=owner(team), name="S0", value=values["S0"])  # a rotation writes under the new key
    result = vault.rotate_keys(batch_size=2)  # several batches
    assert (result.examined, result.rewritten, result.undecryptable) == (5, 4, [])
    again = vault.rotate_keys(batch_size=2)
    assert (again.examined, again.rewritten) == (5, 0)  # nothing left under the old key

    settings.FLOWFORGE_SECRET_KEYS = [new_key]  # the old key dropped
    assert vault.decrypt_values(team["org"].pk, list(values)) == values
    after = {s.name: (s.ciphertext, s.version, s.updated_at) for s in secret_rows(team["org"])}
    for name in ("S1", "S2", "S3", "S4"):  # value, version and updated_at unchanged; only the token
        assert after[name][0] != before[name][0] and after[name][1:] == before[name][1:]
    with pytest.raises(InvalidToken):  # nothing is left that only the old key opens
        Fernet(old_key.encode()).decrypt(after["S1"][0].encode())


def test_the_rotation_command_reports_values_no_key_opens_and_fails(team, settings):
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FLOWFORGE_SECRET_KEYS = [old_key]
    vault.set_secret(actor=owner(team), name="LOST", value=new_value())
    settings.FLOWFORGE_SECRET_KEYS = [new_key]  # the old key dropped before rotating
    stored = Secret.objects.for_organization(team["org"]).get(name="LOST")
    with pytest.raises(CommandError, match="1 secrets could not be decrypted"):
        call_command("rotate_secret_keys")
    assert Secret.objects.for_organization(team["org"]).get(name="LOST").ciphertext == stored.ciphertext
    settings.FLOWFORGE_SECRET_KEYS = [new_key, old_key]
    from io import StringIO

    out = StringIO()
    call_command("rotate_secret_keys", stdout=out)
    assert out.getvalue().strip() == ("1 secrets examined, 1 re-encrypted under the first key of "
                                      "FLOWFORGE_SECRET_KEYS, 0 already under it")


# --- actions, limits, audit ------------------------------------------------------------------------


def test_create_rotate_delete_each_write_an_audit_record_with_name_and_version_never_the_value(team):
    first, second = new_value(), new_value()
    created, is_new = vault.set_secret(actor=owner(team), name="DB_PASSWORD", value=first)
    rotated, is_new_again = vault.set_secret(actor=owner(team), name="DB_PASSWORD", value=second)
    assert (is_new, is_new_again, rotated.version, rotated.pk) == (True, False, 2, created.pk)
    assert vault.decrypt_values(team["org"].pk, ["DB_PASSWORD"]) == {"DB_PASSWORD": second}
    deleted = vault.delete_secret(actor=owner(team), name="DB_PASSWORD")
    assert deleted.version == 2 and secret_rows(team["org"]) == []

    rows = audit_rows(team["org"])
    assert [(r.action, r.metadata, r.target_type, r.target_id) for r in rows] == [
        ("secret.created", {"name": "DB_PASSWORD", "version": 1}, "secret", str(created.pk)),
        ("secret.rotated", {"name": "DB_PASSWORD", "version": 2}, "secret", str(created.pk)),
        ("secret.deleted", {"name": "DB_PASSWORD", "version": 2}, "secret", str(created.pk)),
    ]
    assert all(r.actor_user_id == team["owner"].user_id for r in rows)
    everything = table_text("core_auditlog")
    assert first not in everything and second not in everything


@pytest.mark.parametrize("name, message", [
    ("", "required: 1-64 letters"),
    ("9LIVES", "'9LIVES' is not a secret name"),
    ("bad-name", "'bad-name' is not a secret name"),
    ("with space", "'with space' is not a secret name"),
    ("TOKEN\n", "'TOKEN\\n' is not a secret name"),
    ("A" * 65, "is not a secret name"),
    ("ÄPFEL", "is not a secret name"),
])
def test_a_bad_name_is_refused_naming_the_field_and_nothing_is_stored(team, name, message):
    with pytest.raises(vault.InvalidSecret) as caught:
        vault.set_secret(actor=owner(team), name=name, value=new_value())
    assert caught.value.field == "name" and message in caught.value.message
    assert secret_rows(team["org"]) == [] and audit_rows(team["org"]) == []


def test_names_of_64_characters_and_underscores_are_accepted(team):
    for name in ("_", "a" * 64, "Token_2", "_private"):
        vault.set_secret(actor=owner(team), name=name, value=new_value())
    assert sorted(s.name for s in secret_rows(team["org"])) == sorted(["_", "a" * 64, "Token_2", "_private"])


@pytest.mark.parametrize("value, message", [
    ("abc", "must be at least 4 characters"),
    ("", "must be at least 4 characters"),
    ("    ", "must be at least 4 characters, not counting spaces"),
    ("  ab  ", "must be at least 4 characters, not counting spaces"),
    ("true", "must not be a JSON literal"),
    (" Null ", "must not be a JSON literal"),
    ("ab\x00cd", "must not contain NUL"),
    ("ab\ud800cd", "unpaired surrogate"),
    (1234, "must be a string"),
    ("x" * (64 * 1024 + 1), "is 65537 bytes of UTF-8; at most 65536 (FLOWFORGE_MAX_SECRET_BYTES)"),
    ("é" * (32 * 1024 + 1), "is 65538 bytes of UTF-8; at most 65536"),
])
def test_a_bad_value_is_refused_naming_the_field_never_quoting_it(team, value, message):
    with pytest.raises(vault.InvalidSecret) as caught:
        vault.set_secret(actor=owner(team), name="TOKEN", value=value)
    assert caught.value.field == "value" and message in caught.value.message
    if isinstance(value, str) and len(value) >= 4:
        assert value not in str(caught.value)
    assert secret_rows(team["org"]) == [] and audit_rows(team["org"]) == []


def test_values_at_the_limits_are_stored_exactly_as_given(team):
    big = "x" * (64 * 1024)
    spaced = "  pass word with\nnewline \t"
    vault.set_secret(actor=owner(team), name="BIG", value=big)
    vault.set_secret(actor=owner(team), name="SPACED", value=spaced)
    vault.set_secret(actor=owner(team), name="SHORT", value="abcd")
    assert vault.decrypt_values(team["org"].pk, ["BIG", "SPACED", "SHORT"]) == {
        "BIG": big, "SPACED": spaced, "SHORT": "abcd"}


def test_the_per_organization_cap_refuses_one_more_and_stores_nothing(team, settings, make_org):
    settings.FLOWFORGE_MAX_SECRETS_PER_ORG = 3
    for i in range(3):
        vault.set_secret(actor=owner(team), name=f"S{i}", value=new_value())
    with pytest.raises(QuotaExceeded) as caught:
        vault.set_secret(actor=owner(team), name="ONE_MORE", value=new_value())
    assert (caught.value.limit, caught.value.allowed, caught.value.used) == ("max_secrets", 3, 3)
    assert "FLOWFORGE_MAX_SECRETS_PER_ORG=3" in str(caught.value)
    assert len(secret_rows(team["org"])) == 3 and len(audit_rows(team["org"])) == 3
    # Rotating one of the three is not one more; another organization has its own count.
    assert vault.set_secret(actor=owner(team), name="S0", value=new_value())[0].version == 2
    other = make_team(make_org())
    assert vault.set_secret(actor=actor_of(other["owner"]), name="ONE_MORE", value=new_value())[1] is True


@pytest.mark.parametrize("role, allowed", [(Role.OWNER, True), (Role.ADMIN, True), (Role.MEMBER, False),
                                           (Role.VIEWER, False)])
def test_only_owners_and_admins_manage_secrets(team, role, allowed):
    vault.set_secret(actor=owner(team), name="EXISTING", value=new_value())
    actor = actor_of(team[role])
    if allowed:
        vault.set_secret(actor=actor, name="MINE", value=new_value())
        vault.set_secret(actor=actor, name="EXISTING", value=new_value())
        vault.delete_secret(actor=actor, name="MINE")
        assert [(s.name, s.version) for s in secret_rows(team["org"])] == [("EXISTING", 2)]
    else:
        with pytest.raises(Forbidden, match="may not do this: it needs secret.manage, which only the owner and admin roles have"):
            vault.set_secret(actor=actor, name="MINE", value=new_value())
        with pytest.raises(Forbidden):
            vault.set_secret(actor=actor, name="EXISTING", value=new_value())
        with pytest.raises(Forbidden):
            vault.delete_secret(actor=actor, name="EXISTING")
        assert [(s.name, s.version) for s in secret_rows(team["org"])] == [("EXISTING", 1)]


def test_deleting_a_missing_or_another_organizations_secret_is_not_found(team, make_org):
    other = make_team(make_org())
    vault.set_secret(actor=actor_of(other["owner"]), name="THEIRS", value=new_value())
    for name in ("THEIRS", "NEVER", "not a name"):
        with pytest.raises(ObjectNotFound):
            vault.delete_secret(actor=owner(team), name=name)
    assert [s.name for s in secret_rows(other["org"])] == ["THEIRS"]


# --- the REST API ----------------------------------------------------------------------------------


def api_client(membership) -> Client:
    client = Client(headers={"X-Organization": membership.organization.slug})
    client.force_login(membership.user)
    return client


def put(client, name: str, body) -> object:
    return client.put(f"/api/v1/secrets/{name}/", json.dumps(body), content_type="application/json")


def test_the_api_creates_rotates_reads_and_deletes_and_never_returns_the_value(team):
    client = api_client(team["admin"])
    first, second = new_value(), new_value()
    bodies = []
    created = put(client, "API_TOKEN", {"value": first})
    assert created.status_code == 201, created.content
    assert created.json() == {**created.json(), "name": "API_TOKEN", "version": 1,
                              "created_by": team["admin"].user.email, "updated_by": team["admin"].user.email,
                              "created_by_api_key": None, "updated_by_api_key": None}
    assert set(created.json()) == {"name", "version", "created_at", "updated_at", "created_by",
                                   "created_by_api_key", "updated_by", "updated_by_api_key"}
    rotated = put(client, "API_TOKEN", {"value": second})
    assert rotated.status_code == 200 and rotated.json()["version"] == 2
    detail = client.get("/api/v1/secrets/API_TOKEN/")
    listing = client.get("/api/v1/secrets/")
    assert detail.status_code == 200 and detail.json() == rotated.json()
    assert listing.json() == {"results": [rotated.json()], "next": None}
    bodies += [created, rotated, detail, listing]
    deleted = client.delete("/api/v1/secrets/API_TOKEN/")
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get("/api/v1/secrets/API_TOKEN/").status_code == 404
    for response in bodies:
        assert first.encode() not in response.content and second.encode() not in response.content
        assert b"ciphertext" not in response.content and b"gAAAA" not in response.content  # no Fernet token
    assert [r.action for r in audit_rows(team["org"])] == ["secret.created", "secret.rotated", "secret.deleted"]
    audit_api = client.get("/api/v1/audit-events/?action=secret.").content
    assert b"API_TOKEN" in audit_api and first.encode() not in audit_api and second.encode() not in audit_api


def test_an_api_key_is_recorded_as_the_secrets_author(team):
    key_row, key = create_api_key(actor=owner(team), name="deploy", role=Role.ADMIN)
    client = Client(headers={"Authorization": f"Bearer {key}"})
    response = put(client, "FROM_CI", {"value": new_value()})
    assert response.status_code == 201
    assert (response.json()["created_by"], response.json()["created_by_api_key"]) == (None, key_row.prefix)
    (record,) = audit_rows(team["org"])
    assert record.actor_api_key_prefix == key_row.prefix


@pytest.mark.parametrize("name, body, field, message", [
    ("bad-name", {"value": "long enough"}, "name", "'bad-name' is not a secret name"),
    ("TOKEN", {"value": "abc"}, "value", "must be at least 4 characters"),
    ("TOKEN", {"value": 12345}, "value", "Must be a string."),
    ("TOKEN", {"value": None}, "value", "This field may not be null."),
    ("TOKEN", {}, "value", "This field is required."),
    ("TOKEN", {"value": "a\u0000bcd"}, "value", "Must not contain NUL"),
    ("TOKEN", {"value": "x" * 70000}, "value", "is 70000 bytes of UTF-8; at most 65536"),
])
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(team, name, body, field, message):
    response = put(api_client(team["owner"]), name, body)
    assert response.status_code == 400, response.content
    problem = response.json()
    assert problem["code"] == "invalid" and message in " ".join(problem["errors"][field])
    assert secret_rows(team["org"]) == [] and audit_rows(team["org"]) == []


def test_the_cap_is_a_422_quota_problem(team, settings):
    settings.FLOWFORGE_MAX_SECRETS_PER_ORG = 1
    client = api_client(team["owner"])
    assert put(client, "ONE", {"value": new_value()}).status_code == 201
    response = put(client, "TWO", {"value": new_value()})
    assert response.status_code == 422
    assert {k: response.json()[k] for k in ("code", "limit", "allowed", "used")} == {
        "code": "quota_exceeded", "limit": "max_secrets", "allowed": 1, "used": 1}


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_read_names_but_cannot_change_secrets(team, role):
    value = new_value()
    vault.set_secret(actor=owner(team), name="SHARED", value=value)
    client = api_client(team[role])
    listing = client.get("/api/v1/secrets/")
    detail = client.get("/api/v1/secrets/SHARED/")
    assert listing.status_code == 200 and [s["name"] for s in listing.json()["results"]] == ["SHARED"]
    assert detail.status_code == 200 and detail.json()["version"] == 1
    assert value.encode() not in listing.content + detail.content
    assert put(client, "SHARED", {"value": new_value()}).status_code == 403
    assert put(client, "NEW_ONE", {"value": new_value()}).status_code == 403
    assert client.delete("/api/v1/secrets/SHARED/").status_code == 403
    assert [(s.name, s.version) for s in secret_rows(team["org"])] == [("SHARED", 1)]
    assert vault.decrypt_values(team["org"].pk, ["SHARED"]) == {"SHARED": value}


def test_another_organizations_secret_answers_like_a_missing_one(team, make_org):
    other = make_team(make_org())
    vault.set_secret(actor=actor_of(other["owner"]), name="THEIRS", value=new_value())
    client = api_client(team["owner"])
    for method in ("get", "delete"):
        foreign = getattr(client, method)("/api/v1/secrets/THEIRS/")
        missing = getattr(client, method)("/api/v1/secrets/NEVER_SET/")
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
    assert client.get("/api/v1/secrets/").json()["results"] == []
    assert [s.name for s in secret_rows(other["org"])] == ["THEIRS"]


def test_the_list_is_paginated_by_name_in_a_constant_number_of_queries(team):
    client = api_client(team["owner"])
    vault.set_secret(actor=owner(team), name="A_1", value=new_value())

    def count(url):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200
        return len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]), response

    one, _ = count("/api/v1/secrets/")
    for i in range(2, 8):
        vault.set_secret(actor=owner(team), name=f"A_{i}", value=new_value())
    seven, response = count("/api/v1/secrets/?page_size=3")
    assert seven == one
    names, url = [s["name"] for s in response.json()["results"]], response.json()["next"]
    while url:
        page = client.get(url).json()
        names += [s["name"] for s in page["results"]]
        url = page["next"]
    assert names == [f"A_{i}" for i in range(1, 8)]


# --- the page --------------------------------------------------------------------------------------


def test_admins_create_rotate_and_delete_on_the_page_and_never_see_a_value(team):
    client = client_for(team["admin"])
    first, second = new_value(), new_value()
    created = client.post("/secrets/", {"name": "WEBHOOK_KEY", "value": first})
    assert created.status_code == 302 and created["Location"] == "/secrets/"
    page = client.get("/secrets/")
    body = text(page)
    assert page.status_code == 200 and "WEBHOOK_KEY" in body and "v1" in body and first not in body
    assert "/secrets/WEBHOOK_KEY/rotate/" in body and "/secrets/WEBHOOK_KEY/delete/" in body
    assert 'name="csrfmiddlewaretoken"' in body and 'href="/secrets/">Secrets</a>' in body
    assert_csp_clean(body)
    # The create form refuses a name that exists (rotating is its own page), without echoing the value.
    again = client.post("/secrets/", {"name": "WEBHOOK_KEY", "value": second})
    assert again.status_code == 400 and "exists already" in text(again) and second not in text(again)
    form = client.get("/secrets/WEBHOOK_KEY/rotate/")
    assert form.status_code == 200 and first not in text(form)
    short = client.post("/secrets/WEBHOOK_KEY/rotate/", {"value": "abc"})
    assert short.status_code == 400 and "Must be at least 4 characters" in text(short)
    rotated = client.post("/secrets/WEBHOOK_KEY/rotate/", {"value": second})
    assert rotated.status_code == 302
    assert "Rotated the secret WEBHOOK_KEY: version 2" in text(client.get("/secrets/"))
    assert vault.decrypt_values(team["org"].pk, ["WEBHOOK_KEY"]) == {"WEBHOOK_KEY": second}
    confirm = client.get("/secrets/WEBHOOK_KEY/delete/")
    assert confirm.status_code == 200 and "no longer exists" in text(confirm)
    assert client.post("/secrets/WEBHOOK_KEY/delete/").status_code == 302
    assert secret_rows(team["org"]) == []
    assert [r.action for r in audit_rows(team["org"])] == ["secret.created", "secret.rotated", "secret.deleted"]


def test_a_form_sent_back_with_errors_does_not_carry_the_value(team):
    client = client_for(team["owner"])
    value = new_value()
    response = client.post("/secrets/", {"name": "bad-name", "value": value})
    assert response.status_code == 400
    assert "is not a secret name" in text(response) and value not in text(response)


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_see_names_only_and_every_change_is_a_403(team, role):
    value = new_value()
    vault.set_secret(actor=owner(team), name="SHARED", value=value)
    client = client_for(team[role])
    page = client.get("/secrets/")
    body = text(page)
    assert page.status_code == 200 and "SHARED" in body and value not in body
    assert "<form" not in body.split("<main", 1)[1] and "/rotate/" not in body and "/delete/" not in body
    assert client.post("/secrets/", {"name": "MINE", "value": new_value()}).status_code == 403
    assert client.get("/secrets/SHARED/rotate/").status_code == 403
    assert client.post("/secrets/SHARED/rotate/", {"value": new_value()}).status_code == 403
    assert client.get("/secrets/SHARED/delete/").status_code == 403
    assert client.post("/secrets/SHARED/delete/").status_code == 403
    assert [(s.name, s.version) for s in secret_rows(team["org"])] == [("SHARED", 1)]


def test_the_page_of_another_organizations_secret_is_a_404(team, make_org):
    other = make_team(make_org())
    vault.set_secret(actor=actor_of(other["owner"]), name="THEIRS", value=new_value())
    client = client_for(team["owner"])
    for path in ("/secrets/THEIRS/rotate/", "/secrets/THEIRS/delete/", "/secrets/not-a-name/delete/"):
        assert client.get(path).status_code == 404
        assert client.post(path, {"value": new_value()}).status_code == 404
    assert [(s.name, s.version) for s in secret_rows(other["org"])] == [("THEIRS", 1)]


@pytest.mark.parametrize("name", ["NUL%00X", "%F0%9F%94%91", "a.b", "..", "%20"])
def test_a_name_that_cannot_be_a_secret_is_a_404_for_reads_and_deletes_and_a_400_for_a_put(team, name):
    client = api_client(team["owner"])
    assert client.get(f"/api/v1/secrets/{name}/").status_code == 404
    assert client.delete(f"/api/v1/secrets/{name}/").status_code == 404
    response = put(client, name, {"value": new_value()})
    assert response.status_code == 400 and "is not a secret name" in response.json()["errors"]["name"][0]
    assert client_for(team["owner"]).get(f"/secrets/{name}/rotate/").status_code == 404
