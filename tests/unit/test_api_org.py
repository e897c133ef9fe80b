"""Organization administration through the REST API (Django's test client, real
PostgreSQL and Redis): cron triggers, members, invitations, API keys and the audit
log — behaviour, role checks, another organization's objects (404), and constant
query counts for the lists."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import secrets
import uuid
from zoneinfo import ZoneInfo

import pytest
from django.core import mail
from django.core.cache import cache
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.pagination import encode_cursor
from audit import services as audit
from audit.models import AuditLog
from engine.models import ScheduledTrigger
from engine.triggers import create_trigger
from tenancy import apikeys
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.limits import QuotaExceeded
from tenancy.models import ApiKey, Invitation, Membership, Role, User
from tenancy.services import invite_member

PROBLEM = "application/problem+json"
ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]
TASKS = [{"key": "extract", "type": "noop"}, {"key": "load", "type": "noop", "depends_on": ["extract"]}]


# --- fixtures and helpers -----------------------------------------------------------------------


def bearer(full_key: str) -> dict:
    return {"Authorization": f"Bearer {full_key}"}


def data_queries(captured) -> list[str]:
    """Captured SQL minus transaction control (ATOMIC_REQUESTS adds a savepoint per request)."""
    return [q["sql"] for q in captured.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT"))]


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["status"] == status and body["type"] == "about:blank"
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def actor_of(m: Membership, channel: str = "cli"):
    m = Membership.objects.for_organization(m.organization_id).select_related("organization", "user").get(pk=m.pk)
    return actor_for_membership(m, channel=channel)


@dataclasses.dataclass
class Org:
    org: object
    members: dict  # role -> Membership
    keys: dict  # role -> full key, created by the owner
    key_rows: dict  # role -> ApiKey

    def as_(self, role: str) -> dict:
        return bearer(self.keys[role])

    def actor(self, role: str = Role.OWNER):
        return actor_of(self.members[role])


@pytest.fixture
def org_factory(make_org, make_workflow):
    prefixes: list[str] = []

    def make(workflow_name: str = "nightly-report") -> Org:
        org = make_org()
        members = {Role.OWNER: Membership.objects.for_organization(org).get(role=Role.OWNER)}
        for role in (Role.ADMIN, Role.MEMBER, Role.VIEWER):
            user = User.objects.create_user(email=f"{role}-{secrets.token_hex(3)}@{org.slug}.example")
            members[role] = Membership.objects.create(organization=org, user=user, role=role)
        keys, rows = {}, {}
        for role in ROLES:
            row, full_key = create_api_key(actor=actor_of(members[Role.OWNER]), name=f"{role} key", role=role)
            keys[role], rows[role] = full_key, row
            prefixes.append(row.prefix)
        make_workflow(org, TASKS, name=workflow_name)
        return Org(org=org, members=members, keys=keys, key_rows=rows)

    yield make
    cache.delete_many([k for p in prefixes for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


@pytest.fixture
def acme(org_factory) -> Org:
    return org_factory()


@pytest.fixture
def other(org_factory) -> Org:
    return org_factory()


@pytest.fixture
def client() -> Client:
    return Client()


def trigger_body(**overrides) -> dict:
    body = {"name": "nightly report", "workflow_name": "nightly-report", "cron_expression": "30 2 * * *",
            "timezone": "Europe/Berlin", "input": {"region": "eu"}, "catch_up": "latest", "enabled": True}
    body.update(overrides)
    return body


def post(client, path, body, headers):
    return client.post(path, body, content_type="application/json", headers=headers)


def patch(client, path, body, headers):
    return client.patch(path, body, content_type="application/json", headers=headers)


def make_trigger(o: Org, name: str = "t", **data):
    return create_trigger(actor=o.actor(), data={"name": name, "workflow_name": "nightly-report",
                                                 "cron_expression": "0 3 * * *", **data})


def fetch_all(client, path: str, headers: dict, *, page_size: int) -> list[dict]:
    """Every row of a keyset-paginated list, following ``next``; asserts each page's size."""
    rows, url, pages = [], f"{path}?page_size={page_size}", 0
    while url:
        response = client.get(url, headers=headers)
        assert response.status_code == 200, response.content
        body = response.json()
        assert len(body["results"]) <= page_size
        rows += body["results"]
        url = body["next"]
        pages += 1
        assert pages < 100
    return rows


def count_queries(client, path: str, headers: dict) -> int:
    client.get(path, headers=headers)  # warm the key cache
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path, headers=headers).status_code == 200
    return len(data_queries(queries))


# --- cron triggers --------------------------------------------------------------------------------


def test_creating_a_trigger_returns_its_next_fire_times_in_its_time_zone(client, acme):
    response = post(client, "/api/v1/triggers/", trigger_body(), acme.as_(Role.MEMBER))
    assert response.status_code == 201, response.content
    body = response.json()
    assert {k: body[k] for k in ("name", "workflow_name", "cron_expression", "timezone", "input", "catch_up",
                                 "enabled")} == trigger_body()
    times = [dt.datetime.fromisoformat(t) for t in body["next_fire_times"]]
    assert len(times) == 5 and times == sorted(times) and len(set(times)) == 5
    berlin = ZoneInfo("Europe/Berlin")
    for t in times:
        assert t.utcoffset() == t.astimezone(berlin).utcoffset()  # written in Berlin time
        assert (t.hour, t.minute) == (2, 30) or t.astimezone(berlin).hour == 3  # 02:30 (or DST-shifted)
    next_fire_at = dt.datetime.fromisoformat(body["next_fire_at"].replace("Z", "+00:00"))
    assert next_fire_at == times[0] and next_fire_at > timezone.now()
    # An API key acts for its creator (the owner who made every key of this fixture).
    assert body["created_by"] == acme.members[Role.OWNER].user.email
    assert AuditLog.objects.for_organization(acme.org).filter(action="trigger.created", target_id=body["id"]).exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cron_expression", "61 * * * *", "is not a valid cron expression"),
    ("cron_expression", "* * * *", "must have 5 fields"),
    ("cron_expression", "0 0 30 2 *", "never fires"),
    # croniter wraps a backwards range around ('1-0' fired every minute); cron refuses it.
    ("cron_expression", "1-0 * * * *", "the minute range '1-0' runs backwards (1 is after 0); a range goes from "
                                       "low to high: write one across the end as two, e.g. 1-59,0-0"),
    ("cron_expression", "0 22-2 * * *", "the hour range '22-2' runs backwards (22 is after 2)"),
    ("cron_expression", "0 0 * NOV-FEB *", "the month range 'NOV-FEB' runs backwards (11 is after 2)"),
    ("cron_expression", "0 9 * * FRI-MON", "the day-of-week range 'FRI-MON' runs backwards (5 is after 1)"),
    ("cron_expression", "30-10/5 * * * *", "the minute range '30-10' runs backwards"),
    ("timezone", "Mars/Olympus_Mons", "is not an IANA time zone"),
    ("workflow_name", "no-such-workflow", "no workflow named"),
    ("catch_up", "sometimes", "is not a valid choice"),
    ("input", ["not", "an", "object"], "Must be a JSON object"),
    ("enabled", "yes", "Must be a valid boolean"),
    ("name", 42, "Must be a string"),
    ("name", "bad\u0000name", "NUL"),
])
def test_an_invalid_trigger_is_a_400_naming_the_field(client, acme, field, value, message):
    response = post(client, "/api/v1/triggers/", trigger_body(**{field: value}), acme.as_(Role.ADMIN))
    body = assert_problem(response, 400)
    assert list(body["errors"]) == [field]
    assert message in " ".join(body["errors"][field]), body
    assert not ScheduledTrigger.objects.for_organization(acme.org).exists()


@pytest.mark.parametrize("expression", ["0 9-17 * * MON-FRI", "0 0 * * 1-7", "0-30/5 * * * *", "0 0 1-1 * *"])
def test_a_range_from_low_to_high_is_taken(client, acme, expression):
    response = post(client, "/api/v1/triggers/", trigger_body(cron_expression=expression), acme.as_(Role.ADMIN))
    assert response.status_code == 201, response.content
    assert response.json()["cron_expression"] == expression


def test_a_patch_with_a_bad_time_zone_names_it_and_changes_nothing(client, acme):
    trigger = make_trigger(acme, timezone="UTC")
    body = assert_problem(patch(client, f"/api/v1/triggers/{trigger.pk}/", {"timezone": "Nowhere/Special"},
                                acme.as_(Role.MEMBER)), 400)
    assert body["errors"] == {"timezone": ["'Nowhere/Special' is not an IANA time zone (e.g. 'Europe/Berlin')"]}
    trigger.refresh_from_db()
    assert trigger.timezone == "UTC"


def test_trigger_input_is_stored_but_only_its_digest_reaches_the_audit_log(client, acme):
    response = post(client, "/api/v1/triggers/", trigger_body(input={"token": "abc-secret-value"}),
                    acme.as_(Role.MEMBER))
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {"token": "abc-secret-value"}
    record = AuditLog.objects.for_organization(acme.org).get(action="trigger.created", target_id=response.json()["id"])
    assert "abc-secret-value" not in str(record.metadata) and len(record.metadata["input_sha256"]) == 64


def test_a_deeply_nested_trigger_input_is_a_400(client, acme):
    nested: dict = {}
    for _ in range(40):
        nested = {"a": nested}
    response = post(client, "/api/v1/triggers/", trigger_body(input=nested), acme.as_(Role.MEMBER))
    assert "nested" in assert_problem(response, 400)["errors"]["input"][0]


def test_a_taken_trigger_name_is_a_409_naming_it(client, acme):
    make_trigger(acme, name="nightly report")
    other = make_trigger(acme, name="other")
    body = assert_problem(post(client, "/api/v1/triggers/", trigger_body(), acme.as_(Role.MEMBER)), 409)
    assert body["code"] == "conflict" and "already exists" in body["errors"]["name"][0]
    body = assert_problem(patch(client, f"/api/v1/triggers/{other.pk}/", {"name": "nightly report"},
                                acme.as_(Role.MEMBER)), 409)
    assert list(body["errors"]) == ["name"]
    # Its own name is no conflict.
    assert patch(client, f"/api/v1/triggers/{other.pk}/", {"name": "other"}, acme.as_(Role.MEMBER)).status_code == 200


def test_patching_the_schedule_recomputes_next_fire_at(client, acme):
    trigger = make_trigger(acme, cron_expression="0 3 * * *", timezone="UTC")
    response = patch(client, f"/api/v1/triggers/{trigger.pk}/",
                     {"cron_expression": "15 6 * * *", "timezone": "America/New_York"}, acme.as_(Role.MEMBER))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["cron_expression"], body["timezone"], body["name"]) == ("15 6 * * *", "America/New_York", "t")
    first = dt.datetime.fromisoformat(body["next_fire_times"][0])
    local = first.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (6, 15)
    assert dt.datetime.fromisoformat(body["next_fire_at"].replace("Z", "+00:00")) == first
    trigger.refresh_from_db()
    assert trigger.next_fire_at == first


def test_pause_and_resume_flip_enabled_and_are_audited(client, acme):
    trigger = make_trigger(acme)
    key = acme.as_(Role.MEMBER)
    paused = client.post(f"/api/v1/triggers/{trigger.pk}/pause/", headers=key)
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    assert client.post(f"/api/v1/triggers/{trigger.pk}/pause/", headers=key).json()["enabled"] is False
    resumed = client.post(f"/api/v1/triggers/{trigger.pk}/resume/", headers=key)
    assert resumed.status_code == 200 and resumed.json()["enabled"] is True
    actions = list(AuditLog.objects.for_organization(acme.org).filter(target_id=str(trigger.pk))
                   .order_by("seq").values_list("action", flat=True))
    assert actions == ["trigger.created", "trigger.paused", "trigger.resumed"]


def test_deleting_a_trigger_is_a_204_and_then_a_404(client, acme):
    trigger = make_trigger(acme)
    response = client.delete(f"/api/v1/triggers/{trigger.pk}/", headers=acme.as_(Role.MEMBER))
    assert response.status_code == 204 and response.content == b""
    assert not ScheduledTrigger.objects.for_organization(acme.org).filter(pk=trigger.pk).exists()
    assert_problem(client.get(f"/api/v1/triggers/{trigger.pk}/", headers=acme.as_(Role.MEMBER)), 404)


def test_viewers_read_triggers_but_only_members_and_up_change_them(client, acme):
    trigger = make_trigger(acme)
    viewer = acme.as_(Role.VIEWER)
    assert client.get("/api/v1/triggers/", headers=viewer).json()["results"][0]["id"] == str(trigger.pk)
    assert client.get(f"/api/v1/triggers/{trigger.pk}/", headers=viewer).status_code == 200
    assert_problem(post(client, "/api/v1/triggers/", trigger_body(), viewer), 403)
    assert_problem(patch(client, f"/api/v1/triggers/{trigger.pk}/", {"enabled": False}, viewer), 403)
    assert_problem(client.post(f"/api/v1/triggers/{trigger.pk}/pause/", headers=viewer), 403)
    assert_problem(client.delete(f"/api/v1/triggers/{trigger.pk}/", headers=viewer), 403)
    trigger.refresh_from_db()
    assert trigger.enabled


def test_another_organizations_trigger_is_404_for_every_method(client, acme, other):
    theirs = make_trigger(other)
    key = acme.as_(Role.OWNER)
    base = f"/api/v1/triggers/{theirs.pk}/"
    missing = f"/api/v1/triggers/{uuid.uuid4()}/"
    for method, suffix in (("get", ""), ("patch", ""), ("delete", ""), ("post", "pause/"), ("post", "resume/")):
        got = getattr(client, method)(base + suffix, headers=key)
        assert_problem(got, 404)
        assert got.content == getattr(client, method)(missing + suffix, headers=key).content
    assert client.get("/api/v1/triggers/", headers=key).json() == {"results": [], "next": None}
    theirs.refresh_from_db()
    assert theirs.enabled


def test_the_trigger_list_pages_by_name(client, acme):
    for name in ("delta", "alpha", "echo", "charlie", "bravo"):
        make_trigger(acme, name=name)
    rows = fetch_all(client, "/api/v1/triggers/", acme.as_(Role.VIEWER), page_size=2)
    assert [r["name"] for r in rows] == ["alpha", "bravo", "charlie", "delta", "echo"]


# --- members ---------------------------------------------------------------------------------------


def test_every_role_lists_the_members_with_email_role_and_join_time(client, acme, other):
    body = client.get("/api/v1/members/", headers=acme.as_(Role.VIEWER)).json()
    got = {m["email"]: m["role"] for m in body["results"]}
    assert got == {m.user.email: role for role, m in acme.members.items()}
    assert body["next"] is None
    row = next(m for m in body["results"] if m["role"] == Role.ADMIN)
    admin = acme.members[Role.ADMIN]
    assert row["id"] == str(admin.pk) and row["user_id"] == str(admin.user_id)
    assert dt.datetime.fromisoformat(row["joined_at"].replace("Z", "+00:00")) == admin.created_at


def test_an_admin_changes_a_members_role(client, acme):
    target = acme.members[Role.MEMBER]
    response = patch(client, f"/api/v1/members/{target.pk}/", {"role": "viewer"}, acme.as_(Role.ADMIN))
    assert response.status_code == 200 and response.json()["role"] == "viewer"
    target.refresh_from_db()
    assert target.role == Role.VIEWER
    assert AuditLog.objects.for_organization(acme.org).filter(action="member.role_changed",
                                                              target_id=str(target.pk)).exists()


def test_only_an_owner_grants_the_owner_role(client, acme):
    target = acme.members[Role.MEMBER]
    body = assert_problem(patch(client, f"/api/v1/members/{target.pk}/", {"role": "owner"}, acme.as_(Role.ADMIN)),
                          403)
    assert "owner" in body["detail"]
    response = patch(client, f"/api/v1/members/{target.pk}/", {"role": "owner"}, acme.as_(Role.OWNER))
    assert response.status_code == 200 and response.json()["role"] == "owner"


def test_the_last_owner_cannot_be_demoted_or_removed(client, acme):
    owner = acme.members[Role.OWNER]
    session = Client()
    session.force_login(owner.user)
    body = assert_problem(patch(session, f"/api/v1/members/{owner.pk}/", {"role": "admin"}, {}), 400)
    assert "last owner" in body["errors"]["role"][0]
    body = assert_problem(session.delete(f"/api/v1/members/{owner.pk}/"), 400)
    assert "last owner" in body["detail"]
    owner.refresh_from_db()
    assert owner.role == Role.OWNER


def test_an_invalid_role_is_a_400_naming_it(client, acme):
    target = acme.members[Role.MEMBER]
    body = assert_problem(patch(client, f"/api/v1/members/{target.pk}/", {"role": "emperor"}, acme.as_(Role.ADMIN)),
                          400)
    assert list(body["errors"]) == ["role"]
    # A PATCH without fields changes nothing.
    response = patch(client, f"/api/v1/members/{target.pk}/", {}, acme.as_(Role.ADMIN))
    assert response.status_code == 200 and response.json()["role"] == Role.MEMBER


def test_members_and_viewers_cannot_manage_members(client, acme):
    target = acme.members[Role.VIEWER]
    for role in (Role.MEMBER, Role.VIEWER):
        assert_problem(patch(client, f"/api/v1/members/{target.pk}/", {"role": "member"}, acme.as_(role)), 403)
        assert_problem(client.delete(f"/api/v1/members/{target.pk}/", headers=acme.as_(role)), 403)
    assert Membership.objects.for_organization(acme.org).filter(pk=target.pk, role=Role.VIEWER).exists()


def test_an_admin_removes_a_member_but_not_an_owner(client, acme):
    target = acme.members[Role.MEMBER]
    response = client.delete(f"/api/v1/members/{target.pk}/", headers=acme.as_(Role.ADMIN))
    assert response.status_code == 204
    assert not Membership.objects.for_organization(acme.org).filter(pk=target.pk).exists()
    assert AuditLog.objects.for_organization(acme.org).filter(action="member.removed").exists()
    owner = acme.members[Role.OWNER]
    assert "owner" in assert_problem(client.delete(f"/api/v1/members/{owner.pk}/", headers=acme.as_(Role.ADMIN)),
                                     403)["detail"]


def test_another_organizations_member_is_404(client, acme, other):
    theirs = other.members[Role.MEMBER]
    key = acme.as_(Role.OWNER)
    for method, body in (("get", None), ("patch", {"role": "viewer"}), ("delete", None)):
        kwargs = {"content_type": "application/json", "data": body} if body else {}
        got = getattr(client, method)(f"/api/v1/members/{theirs.pk}/", headers=key, **kwargs)
        missing = getattr(client, method)(f"/api/v1/members/{uuid.uuid4()}/", headers=key, **kwargs)
        assert_problem(got, 404)
        assert got.content == missing.content
    assert Membership.objects.for_organization(other.org).filter(pk=theirs.pk, role=Role.MEMBER).exists()


# --- invitations -----------------------------------------------------------------------------------


ACCEPT_LINK_RE = re.compile(r"http://testserver/invitations/([A-Za-z0-9_-]+)/")


def test_inviting_mails_the_link_and_says_so_and_never_returns_the_token(client, acme):
    mail.outbox.clear()
    response = post(client, "/api/v1/invitations/", {"email": "Linus@Example.com", "role": "member"},
                    acme.as_(Role.ADMIN))
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["email"], body["role"], body["state"], body["email_sent"]) == (
        "linus@example.com", "member", "pending", True)
    assert set(body) == {"id", "email", "role", "state", "invited_by", "created_at", "expires_at", "accepted_at",
                         "revoked_at", "email_sent"}
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["linus@example.com"]
    token = ACCEPT_LINK_RE.search(message.body).group(1)
    assert token not in response.content.decode()
    # An API key invites on behalf of its creator, whom the email names.
    assert acme.members[Role.OWNER].user.email in message.body
    invitation = Invitation.objects.for_organization(acme.org).get(pk=body["id"])
    assert invitation.role == Role.MEMBER and invitation.is_pending


@pytest.mark.django_db(transaction=True)
def test_the_invitation_mail_goes_out_after_the_invitation_committed_and_outside_any_transaction(
        client, acme, monkeypatch):
    """No request transaction: the send limits' locks are not held while a mail server answers."""
    import tenancy.mail

    seen = {}
    real = tenancy.mail.send_mail

    def send(*args, **kwargs):
        seen["in_transaction"] = connection.in_atomic_block
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
            seen["advisory_locks"] = cur.fetchone()[0]
        seen["committed"] = Invitation.objects.unscoped().filter(email="late@example.com").exists()
        return real(*args, **kwargs)

    monkeypatch.setattr(tenancy.mail, "send_mail", send)
    response = post(client, "/api/v1/invitations/", {"email": "late@example.com"}, acme.as_(Role.ADMIN))
    assert response.status_code == 201 and response.json()["email_sent"] is True
    assert seen == {"in_transaction": False, "advisory_locks": 0, "committed": True}


def test_a_mail_that_fails_is_email_sent_false_with_the_invitation_kept(client, acme, monkeypatch, caplog):
    """Before: the mail went out after the response was built (on commit), and a client got
    201 with no way to know its invitee received nothing."""
    import tenancy.mail

    def broken(*args, **kwargs):
        raise RuntimeError("mailer bug")

    monkeypatch.setattr(tenancy.mail, "send_mail", broken)
    response = post(client, "/api/v1/invitations/", {"email": "late@example.com"}, acme.as_(Role.ADMIN))
    assert response.status_code == 201, response.content
    assert response.json()["email_sent"] is False
    assert Invitation.objects.for_organization(acme.org).get(pk=response.json()["id"]).is_pending
    assert "invitation email for invitation" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_read_failing_after_the_invitation_committed_does_not_make_a_500(client, acme, monkeypatch):
    """Found by review: the response re-read the committed invitation; a dropped connection
    there made a 500 of an invitation that existed and was mailed (and a retry revoked it
    with a second mail). It is answered from the invitation in hand."""
    from django.db import OperationalError

    import api.views_org

    def gone(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(api.views_org, "_invitation", gone)
    mail.outbox.clear()
    response = post(client, "/api/v1/invitations/", {"email": "victim@example.com"}, acme.as_(Role.ADMIN))
    assert response.status_code == 201, response.content
    assert (response.json()["state"], response.json()["email_sent"]) == ("pending", True)
    assert len(mail.outbox) == 1
    assert Invitation.objects.for_organization(acme.org).get(email="victim@example.com").is_pending


@pytest.mark.django_db(transaction=True)
def test_an_invitation_superseded_while_its_mail_was_sent_is_answered_as_it_was_created(
        client, acme, monkeypatch):
    """Found by review: A's invitation, re-read after its mail, came back "revoked" (with
    email_sent true) when B invited the same address meanwhile. A's answer is what A created;
    B's invitation replaces it, as any re-invitation does."""
    import threading

    import tenancy.mail

    real = tenancy.mail.send_mail
    a_in_mail, b_done = threading.Event(), threading.Event()

    def send(*args, **kwargs):
        if not a_in_mail.is_set():
            a_in_mail.set()
            assert b_done.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(tenancy.mail, "send_mail", send)
    key = acme.as_(Role.ADMIN)
    answers = {}

    def invite_a():
        try:
            answers["a"] = post(Client(), "/api/v1/invitations/", {"email": "dup@example.com"}, key)
        finally:
            connections.close_all()

    thread = threading.Thread(target=invite_a)
    thread.start()
    assert a_in_mail.wait(30)
    answers["b"] = post(client, "/api/v1/invitations/", {"email": "dup@example.com"}, key)
    b_done.set()
    thread.join(30)
    for name in ("a", "b"):
        assert answers[name].status_code == 201, answers[name].content
        assert (answers[name].json()["state"], answers[name].json()["email_sent"]) == ("pending", True)
    stored = Invitation.objects.for_organization(acme.org).filter(email="dup@example.com")
    assert {str(i.pk): i.is_pending for i in stored} == {answers["a"].json()["id"]: False,
                                                         answers["b"].json()["id"]: True}


def test_a_session_user_invites_in_their_own_name(acme):
    session = Client()
    admin = acme.members[Role.ADMIN].user
    session.force_login(admin)
    mail.outbox.clear()
    response = post(session, "/api/v1/invitations/", {"email": "ada@example.com"}, {})
    assert response.status_code == 201 and response.json()["invited_by"] == admin.email
    assert response.json()["role"] == "member"
    assert f"{admin.email} invited you" in mail.outbox[0].body


def test_invitation_rules_are_problems(client, acme):
    key = acme.as_(Role.ADMIN)
    member_email = acme.members[Role.MEMBER].user.email
    body = assert_problem(post(client, "/api/v1/invitations/", {"email": member_email.upper()}, key), 409)
    assert body["code"] == "conflict" and "already a member" in body["errors"]["email"][0]
    body = assert_problem(post(client, "/api/v1/invitations/", {"email": "not-an-address"}, key), 400)
    assert list(body["errors"]) == ["email"]
    body = assert_problem(post(client, "/api/v1/invitations/", {"email": "x@example.com", "role": "owner"}, key), 403)
    assert "owner" in body["detail"]
    assert_problem(post(client, "/api/v1/invitations/", {"email": "x@example.com"}, acme.as_(Role.MEMBER)), 403)
    assert_problem(client.get("/api/v1/invitations/", headers=acme.as_(Role.MEMBER)), 403)
    assert not Invitation.objects.for_organization(acme.org).exists()


def test_an_organization_may_send_a_limited_number_of_invitations_a_day(acme, settings):
    """Invitations are mail to any address: anyone who signs up could use the deployment to
    spam (there was no limit but the API's request rate, 2,400 a minute per organization).
    A refused one writes nothing: the pending invitation it would replace stays pending."""
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = 3
    actor = acme.actor(Role.ADMIN)
    first, _ = invite_member(actor=actor, email="a@example.com")
    invite_member(actor=actor, email="b@example.com")
    invite_member(actor=actor, email="a@example.com")  # a re-sent invitation counts again
    audit_rows = AuditLog.objects.for_organization(acme.org).count()
    with pytest.raises(QuotaExceeded) as refused:
        invite_member(actor=actor, email="b@example.com")
    assert (refused.value.limit, refused.value.allowed, refused.value.used) == ("invitations_per_day", 3, 3)
    assert str(refused.value) == ("this organization has sent 3 invitations in the last 24 hours, the most "
                                  "allowed (3); the next can be sent in 24 hours")
    assert 24 * 3600 - 60 < refused.value.retry_after_seconds <= 24 * 3600
    rows = Invitation.objects.for_organization(acme.org)
    assert rows.count() == 3 and AuditLog.objects.for_organization(acme.org).count() == audit_rows
    assert rows.get(email="b@example.com").is_pending  # not revoked by the refused re-send
    # The window is the last 24 hours: once the oldest leaves it, the next one may go.
    Invitation.objects.for_organization(acme.org).filter(pk=first.pk).update(
        created_at=timezone.now() - dt.timedelta(hours=23, minutes=30))
    with pytest.raises(QuotaExceeded) as refused:
        invite_member(actor=actor, email="c@example.com")
    assert 29 * 60 < refused.value.retry_after_seconds <= 30 * 60
    assert refused.value.args[0].endswith("the next can be sent in 30 minutes")
    Invitation.objects.for_organization(acme.org).filter(pk=first.pk).update(
        created_at=timezone.now() - dt.timedelta(hours=24, seconds=1))
    invitation, _ = invite_member(actor=actor, email="c@example.com")
    assert invitation.is_pending


def test_a_person_may_send_a_limited_number_of_invitations_a_day_across_organizations(acme, other, settings):
    """A second organization of one's own does not double it; an API key sends on its
    creator's behalf and counts for that person."""
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 2
    owner = acme.members[Role.OWNER].user
    elsewhere = Membership.objects.create(organization=other.org, user=owner, role=Role.OWNER)
    invite_member(actor=acme.actor(Role.OWNER), email="a@example.com")
    invite_member(actor=actor_of(elsewhere), email="b@example.com")
    with pytest.raises(QuotaExceeded) as refused:
        invite_member(actor=acme.actor(Role.OWNER), email="c@example.com")
    assert (refused.value.limit, refused.value.used) == ("invitations_per_day_per_user", 2)
    assert str(refused.value) == ("you have sent 2 invitations in the last 24 hours across your organizations, "
                                  "the most allowed (2); the next can be sent in 24 hours")
    # acme's keys were created by its owner: the same person's budget. The key's holder is not
    # told what its creator sent in organizations the holder cannot see.
    Invitation.objects.unscoped().filter(organization=other.org).update(created_at=timezone.now())
    invitation_in_other = Invitation.objects.unscoped().get(organization=other.org)
    assert invitation_in_other.invited_by == owner
    body = assert_problem(Client().post("/api/v1/invitations/", {"email": "d@example.com"},
                                        content_type="application/json", headers=acme.as_(Role.ADMIN)), 429)
    assert (body["code"], body["limit"], body["allowed"], body["used"]) == (
        "quota_exceeded", "invitations_per_day_per_user", 2, 2)
    assert body["detail"] == ("the person this API key acts for has sent the most invitations one person may in "
                              "24 hours (2); the next can be sent in 24 hours")
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 1  # lowered: 2 sent, 1 allowed
    body = assert_problem(Client().post("/api/v1/invitations/", {"email": "d@example.com"},
                                        content_type="application/json", headers=acme.as_(Role.ADMIN)), 429)
    assert (body["allowed"], body["used"]) == (1, 1)
    # Another person of the organization has a budget of their own.
    invitation, _ = invite_member(actor=acme.actor(Role.ADMIN), email="c@example.com")
    assert invitation.is_pending


def test_an_invitation_limit_of_0_is_no_limit(acme, settings):
    """0 turned every invitation into a 500 (an IndexError) before."""
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = 0
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 0
    for n in range(3):
        invitation, _ = invite_member(actor=acme.actor(Role.ADMIN), email=f"n{n}@example.com")
        assert invitation.is_pending


def test_with_both_invitation_limits_spent_the_later_wait_is_given(acme, other, settings):
    """A fresh review saw the organization's 1-hour wait while the person's limit held for
    24 hours: a client that waited Retry-After was refused again."""
    owner = acme.members[Role.OWNER].user
    elsewhere = Membership.objects.create(organization=other.org, user=owner, role=Role.OWNER)
    first, _ = invite_member(actor=acme.actor(Role.OWNER), email="a@example.com")
    invite_member(actor=acme.actor(Role.OWNER), email="b@example.com")
    invite_member(actor=actor_of(elsewhere), email="c@example.com")
    Invitation.objects.for_organization(acme.org).filter(pk=first.pk).update(
        created_at=timezone.now() - dt.timedelta(hours=23))
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = 2
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 2
    with pytest.raises(QuotaExceeded) as refused:
        invite_member(actor=acme.actor(Role.OWNER), email="d@example.com")
    # The organization's 2 leave room in 1 hour (its oldest is 23 hours old); the person's 3
    # against 2 in about 24 (their second-oldest was sent just now).
    assert refused.value.limit == "invitations_per_day_per_user"
    assert 24 * 3600 - 60 < refused.value.retry_after_seconds <= 24 * 3600


def test_through_an_api_key_the_per_person_wait_is_given_to_the_hour(acme, other, settings):
    """Its exact value would tell the key's holder when its creator invited someone in an
    organization the holder cannot see."""
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 1
    owner = acme.members[Role.OWNER].user
    elsewhere = Membership.objects.create(organization=other.org, user=owner, role=Role.OWNER)
    sent, _ = invite_member(actor=actor_of(elsewhere), email="a@example.com")
    Invitation.objects.unscoped().filter(pk=sent.pk).update(
        created_at=timezone.now() - dt.timedelta(hours=5, minutes=17))
    response = Client().post("/api/v1/invitations/", {"email": "b@example.com"}, content_type="application/json",
                             headers=acme.as_(Role.ADMIN))
    body = assert_problem(response, 429)
    assert body["retry_after_seconds"] == 19 * 3600.0 and response["Retry-After"] == str(19 * 3600)
    assert body["detail"].endswith("the next can be sent in 19 hours")
    # A session user sees their own wait to the minute.
    with pytest.raises(QuotaExceeded) as refused:
        invite_member(actor=acme.actor(Role.OWNER), email="b@example.com")
    assert str(refused.value).endswith("the next can be sent in 18 hours 43 minutes")


@pytest.mark.django_db
def test_the_organizations_invitation_lock_is_taken_with_its_limit_off(acme, settings):
    """Two invitations of one address at once both replaced the pending one and the second
    insert failed (uniq_invitation_pending: a 500); the organization's lock keeps them apart,
    and with its limit at 0 it was not taken."""
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = 0
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER = 0
    invite_member(actor=acme.actor(Role.ADMIN), email="a@example.com")
    with connection.cursor() as cur:  # still this test's transaction: its locks are held
        cur.execute("""
            WITH k AS (SELECT hashtextextended(%s, 0) AS k)
            SELECT count(*) FROM pg_locks, k
            WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1
              AND classid::bigint = ((k.k >> 32) & 4294967295) AND objid::bigint = (k.k & 4294967295)""",
                    [f"flowforge.invite:organization:{acme.org.pk}"])
        assert cur.fetchone()[0] == 1


@pytest.mark.parametrize("name", ["FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG", "FLOWFORGE_INVITATIONS_PER_DAY_PER_USER"])
def test_a_negative_invitation_limit_is_refused_at_start_up(name):
    import subprocess
    import sys

    env = {**os.environ, name: "-1", "DJANGO_SETTINGS_MODULE": "flowforge.settings"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert f"{name} (-1) must be 0 (no limit) or more" in done.stderr


def test_the_wait_is_said_in_hours_and_minutes():
    from tenancy.services import _wait_text

    assert [_wait_text(s) for s in (0.3, 59, 61, 3600, 119 * 60, 7200, 7201, 7260, 86400)] == [
        "1 minute", "1 minute", "2 minutes", "1 hour", "1 hour 59 minutes", "2 hours", "2 hours 1 minute",
        "2 hours 1 minute", "24 hours"]


def test_over_the_invitation_limit_the_api_answers_429_with_retry_after(client, acme, settings):
    settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG = 1
    key = acme.as_(Role.ADMIN)
    assert post(client, "/api/v1/invitations/", {"email": "a@example.com"}, key).status_code == 201
    response = post(client, "/api/v1/invitations/", {"email": "b@example.com"}, key)
    body = assert_problem(response, 429)
    assert (body["code"], body["limit"], body["allowed"], body["used"]) == ("quota_exceeded", "invitations_per_day", 1, 1)
    assert 24 * 3600 - 60 < int(response["Retry-After"]) <= 24 * 3600
    assert not Invitation.objects.for_organization(acme.org).filter(email="b@example.com").exists()


def test_the_invitation_list_shows_pending_ones_only(client, acme):
    actor = acme.actor()
    pending, _ = invite_member(actor=actor, email="pending@example.com", role=Role.VIEWER)
    revoked, _ = invite_member(actor=actor, email="revoked@example.com")
    expired, _ = invite_member(actor=actor, email="expired@example.com")
    Invitation.objects.for_organization(acme.org).filter(pk=revoked.pk).update(revoked_at=timezone.now())
    Invitation.objects.for_organization(acme.org).filter(pk=expired.pk).update(expires_at=timezone.now())
    body = client.get("/api/v1/invitations/", headers=acme.as_(Role.ADMIN)).json()
    assert [(i["id"], i["email"], i["state"]) for i in body["results"]] == [
        (str(pending.pk), "pending@example.com", "pending")]
    assert body["results"][0]["invited_by"] == acme.members[Role.OWNER].user.email


def test_revoking_an_invitation_twice_is_a_409(client, acme):
    invitation, _ = invite_member(actor=acme.actor(), email="linus@example.com")
    key = acme.as_(Role.ADMIN)
    response = client.post(f"/api/v1/invitations/{invitation.pk}/revoke/", headers=key)
    assert response.status_code == 200 and response.json()["state"] == "revoked"
    body = assert_problem(client.post(f"/api/v1/invitations/{invitation.pk}/revoke/", headers=key), 409)
    assert body["code"] == "conflict" and "revoked" in body["detail"]


def test_another_organizations_invitation_is_404(client, acme, other):
    theirs, _ = invite_member(actor=other.actor(), email="linus@example.com")
    key = acme.as_(Role.OWNER)
    got = client.post(f"/api/v1/invitations/{theirs.pk}/revoke/", headers=key)
    assert_problem(got, 404)
    assert got.content == client.post(f"/api/v1/invitations/{uuid.uuid4()}/revoke/", headers=key).content
    assert Invitation.objects.for_organization(other.org).get(pk=theirs.pk).revoked_at is None
    assert client.get("/api/v1/invitations/", headers=key).json()["results"] == []


# --- API keys --------------------------------------------------------------------------------------


def test_a_created_key_is_shown_once_and_listed_by_prefix(acme):
    session = Client()
    session.force_login(acme.members[Role.ADMIN].user)
    response = post(session, "/api/v1/api-keys/", {"name": "deploy", "role": "member"}, {})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    created = response.json()
    assert re.fullmatch(r"ffk_[a-z0-9]{12}_[A-Za-z0-9_-]{43}", created["key"])
    assert created["key"].startswith(f"ffk_{created['prefix']}_")
    listed = session.get("/api/v1/api-keys/").json()["results"]
    row = next(k for k in listed if k["id"] == created["id"])
    assert (row["prefix"], row["name"], row["role"], row["last_used_at"]) == (created["prefix"], "deploy", "member",
                                                                               None)
    # The secret may itself contain "_" (base64url): split off the prefix only.
    secret = created["key"].split("_", 2)[2]
    assert len(secret) == 43
    assert "key" not in row and secret not in session.get("/api/v1/api-keys/").content.decode()
    # Used once, the key shows when.
    assert Client().get("/api/v1/members/", headers=bearer(created["key"])).status_code == 200
    row = next(k for k in session.get("/api/v1/api-keys/").json()["results"] if k["id"] == created["id"])
    assert row["last_used_at"] is not None


def test_a_key_rule_refusal_names_the_field(acme):
    session = Client()
    session.force_login(acme.members[Role.ADMIN].user)
    body = assert_problem(post(session, "/api/v1/api-keys/", {"name": "old", "expires_at": "2001-01-01T00:00:00Z"},
                               {}), 400)
    assert body["errors"] == {"expires_at": ["expires_at must be in the future"]}
    assert_problem(post(session, "/api/v1/api-keys/", {"name": "big", "role": "owner"}, {}), 403)


def test_a_key_name_that_postgres_cannot_store_is_a_400(acme):
    session = Client()
    session.force_login(acme.members[Role.ADMIN].user)
    for name in ("a\u0000b", 7):
        body = assert_problem(post(session, "/api/v1/api-keys/", {"name": name}, {}), 400)
        assert list(body["errors"]) == ["name"]
    raw = b'{"name": "half a pair \\ud800"}'
    response = session.post("/api/v1/api-keys/", raw, content_type="application/json")
    assert list(assert_problem(response, 400)["errors"]) == ["name"]


API_KEY_FIELDS = {"id", "prefix", "name", "role", "created_by", "created_at", "last_used_at", "expires_at",
                  "revoked_at"}


def test_the_api_key_list_answers_one_page_envelope_newest_first(client, acme):
    response = client.get("/api/v1/api-keys/", headers=acme.as_(Role.ADMIN))
    assert response.status_code == 200, response.content
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"results", "next"}
    assert body["next"] is None
    assert [set(row) for row in body["results"]] == [API_KEY_FIELDS] * 4
    assert {row["id"] for row in body["results"]} == {str(r.pk) for r in acme.key_rows.values()}
    order = [(row["created_at"], row["id"]) for row in body["results"]]
    assert order == sorted(order, reverse=True)


def test_api_key_paging_returns_every_key_once_even_when_created_at_ties(client, acme):
    actor = acme.actor(Role.ADMIN)
    made = [create_api_key(actor=actor, name=f"tie-{i}", role=Role.VIEWER)[0] for i in range(9)]
    create_api_key(actor=actor, name="newest", role=Role.VIEWER)
    # Nine keys in one microsecond, between the fixture's four and the newest: every page
    # boundary of page_size=2 but one falls inside the tie, where only the id orders them.
    tie = timezone.now() - dt.timedelta(minutes=1)
    ApiKey.objects.for_organization(acme.org).filter(pk__in=[k.pk for k in made]).update(created_at=tie)
    ApiKey.objects.for_organization(acme.org).filter(pk__in=[r.pk for r in acme.key_rows.values()]).update(
        created_at=tie - dt.timedelta(minutes=1))
    key = acme.as_(Role.ADMIN)
    first = client.get("/api/v1/api-keys/?page_size=2", headers=key).json()
    assert len(first["results"]) == 2 and first["next"].startswith("http://testserver/api/v1/api-keys/?")
    assert "page_size=2" in first["next"] and "cursor=" in first["next"]
    rows = fetch_all(client, "/api/v1/api-keys/", key, page_size=2)
    ids = [row["id"] for row in rows]
    expected = {str(pk) for pk in ApiKey.objects.for_organization(acme.org).values_list("pk", flat=True)}
    assert len(ids) == len(set(ids)) == len(expected) == 14 and set(ids) == expected
    assert rows[0]["name"] == "newest"
    assert [row["id"] for row in rows[1:10]] == sorted((str(k.pk) for k in made), reverse=True)
    assert {row["name"] for row in rows[10:]} == {f"{role} key" for role in ROLES}
    order = [(row["created_at"], uuid.UUID(row["id"])) for row in rows]
    assert order == sorted(order, reverse=True)
    # One page holding them all agrees with the pages.
    whole = client.get("/api/v1/api-keys/?page_size=500", headers=key).json()
    assert [row["id"] for row in whole["results"]] == ids and whole["next"] is None


@pytest.mark.parametrize(("query", "field"), [
    ("page_size=abc", "page_size"),
    ("page_size=0", "page_size"),
    ("page_size=501", "page_size"),
    ("page_size=-1", "page_size"),
    ("page_size=2.5", "page_size"),
    ("cursor=not-a-cursor", "cursor"),
    ("cursor=eyJ0IjoiMjAyNi0wMS0xNSJ9", "cursor"),  # {"t": "2026-01-15"}: no id
])
def test_a_bad_api_key_page_parameter_is_a_400_naming_it_as_on_other_lists(client, acme, query, field):
    key = acme.as_(Role.ADMIN)
    body = assert_problem(client.get(f"/api/v1/api-keys/?{query}", headers=key), 400)
    assert list(body["errors"]) == [field] and body["code"] == "invalid"
    if field == "page_size":
        assert body["errors"] == {"page_size": ["must be a whole number from 1 to 500"]}
    members = assert_problem(client.get(f"/api/v1/members/?{query}", headers=key), 400)
    assert body["errors"] == members["errors"]


def test_the_api_key_list_shows_only_the_organizations_keys_and_never_a_hash_or_secret(client, acme, other):
    create_api_key(actor=other.actor(), name="theirs", role=Role.MEMBER)
    key = acme.as_(Role.OWNER)
    pages, url = [], "/api/v1/api-keys/?page_size=1"
    while url:
        response = client.get(url, headers=key)
        assert response.status_code == 200, response.content
        pages.append(response.content.decode())
        url = response.json()["next"]
    ids = [row["id"] for text in pages for row in json.loads(text)["results"]]
    assert sorted(ids) == sorted(str(r.pk) for r in acme.key_rows.values())
    everything = "".join(pages)
    for theirs in ApiKey.objects.for_organization(other.org):
        assert str(theirs.pk) not in everything and theirs.prefix not in everything
    for mine in ApiKey.objects.for_organization(acme.org):
        assert mine.hashed_key not in everything
    for full_key in acme.keys.values():
        assert full_key.split("_", 2)[2] not in everything
    assert "hashed_key" not in everything and "$argon2" not in everything
    # A cursor made from another organization's key pages this organization's keys only.
    theirs = ApiKey.objects.for_organization(other.org).order_by("-created_at").first()
    cursor = encode_cursor(theirs.created_at + dt.timedelta(days=1), theirs.pk)
    listed = client.get(f"/api/v1/api-keys/?cursor={cursor}", headers=key).json()
    assert sorted(r["id"] for r in listed["results"]) == sorted(str(r.pk) for r in acme.key_rows.values())


# --- audit events ----------------------------------------------------------------------------------


def test_the_audit_log_is_for_owners_and_admins(client, acme):
    for role in (Role.OWNER, Role.ADMIN):
        assert client.get("/api/v1/audit-events/", headers=acme.as_(role)).status_code == 200
    for role in (Role.MEMBER, Role.VIEWER):
        assert_problem(client.get("/api/v1/audit-events/", headers=acme.as_(role)), 403)


def test_audit_events_are_the_organizations_newest_first_without_account_records(client, acme, other):
    owner = acme.members[Role.OWNER].user
    audit.record("user.signed_in", user=owner)  # account-level: no organization
    make_trigger(acme, name="mine")
    make_trigger(other, name="theirs")
    body = client.get("/api/v1/audit-events/", headers=acme.as_(Role.ADMIN)).json()
    events = body["results"]
    expected = list(AuditLog.objects.for_organization(acme.org).order_by("-created_at", "-id")
                    .values_list("id", flat=True))
    assert [e["id"] for e in events] == [str(pk) for pk in expected]
    assert events[0]["action"] == "trigger.created" and events[0]["metadata"]["name"] == "mine"
    assert "user.signed_in" not in {e["action"] for e in events}
    assert "theirs" not in client.get("/api/v1/audit-events/", headers=acme.as_(Role.ADMIN)).content.decode()
    assert body["next"] is None


def test_audit_events_filter_by_action_actor_and_time(client, acme):
    key = acme.as_(Role.ADMIN)
    admin_key_prefix = acme.key_rows[Role.ADMIN].prefix
    post(client, "/api/v1/triggers/", trigger_body(name="by key"), key)  # recorded with the admin key
    make_trigger(acme, name="by owner")  # recorded with the owner (cli actor)
    owner_email = acme.members[Role.OWNER].user.email

    def actions(query: str) -> list[str]:
        response = client.get(f"/api/v1/audit-events/?{query}", headers=key)
        assert response.status_code == 200, response.content
        return [e["action"] for e in response.json()["results"]]

    assert actions("action=trigger.created") == ["trigger.created", "trigger.created"]
    assert set(actions("action=api_key.")) == {"api_key.created"}
    assert len(actions("action=api_key.")) == 4
    assert actions("action=api_key") == []  # exact, not a prefix, without the dot
    assert actions(f"actor=ffk_{admin_key_prefix}") == ["trigger.created"]
    assert actions(f"actor={admin_key_prefix}") == ["trigger.created"]
    by_owner = actions(f"actor={owner_email.upper()}")
    assert by_owner[0] == "trigger.created" and "organization.created" in by_owner
    newest = AuditLog.objects.for_organization(acme.org).order_by("-created_at").first()
    after = newest.created_at.isoformat().replace("+00:00", "Z")
    assert actions(f"created_after={after.replace('Z', '%2B00:00')}") == [newest.action]
    before = actions(f"created_before={after}")
    assert len(before) == AuditLog.objects.for_organization(acme.org).count() - 1


@pytest.mark.parametrize(("query", "field"), [
    ("created_after=yesterday", "created_after"),
    ("created_before=2026-13-01T00:00:00Z", "created_before"),
    ("page_size=0", "page_size"),
    ("page_size=ten", "page_size"),
    ("cursor=not-a-cursor", "cursor"),
    ("action=" + "a" * 101, "action"),
    ("actor=x%00y", "actor"),
])
def test_a_bad_audit_filter_is_a_400_naming_it(client, acme, query, field):
    body = assert_problem(client.get(f"/api/v1/audit-events/?{query}", headers=acme.as_(Role.ADMIN)), 400)
    assert list(body["errors"]) == [field]


def test_audit_paging_returns_every_record_once_even_when_timestamps_tie(client, acme):
    tie = timezone.now() - dt.timedelta(minutes=5)
    for seq in range(1, 13):  # twelve rows in one microsecond, in their own chain
        AuditLog(organization=acme.org, actor_type="system", action=f"test.tie{seq}", created_at=tie,
                 chain=f"t-{acme.org.pk}", seq=seq, prev_hash="0" * 64, row_hash="0" * 64).save(force_insert=True)
    rows = fetch_all(client, "/api/v1/audit-events/", acme.as_(Role.ADMIN), page_size=5)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == AuditLog.objects.for_organization(acme.org).count()
    assert sorted(r["action"] for r in rows if r["action"].startswith("test.")) == sorted(
        f"test.tie{i}" for i in range(1, 13))
    keys = [(r["created_at"], r["id"]) for r in rows]
    assert keys == sorted(keys, reverse=True)


# --- query counts ----------------------------------------------------------------------------------


def test_lists_take_a_constant_number_of_queries(client, acme, org_factory):
    key = acme.as_(Role.OWNER)
    paths = ["/api/v1/triggers/", "/api/v1/members/", "/api/v1/invitations/", "/api/v1/api-keys/",
             "/api/v1/audit-events/"]
    make_trigger(acme, name="first")
    invite_member(actor=acme.actor(), email="first@example.com")
    before = {p: count_queries(client, p, key) for p in paths}
    for i in range(6):
        make_trigger(acme, name=f"more-{i}")
        invite_member(actor=acme.actor(Role.ADMIN), email=f"more-{i}@example.com")
        user = User.objects.create_user(email=f"extra-{i}@{acme.org.slug}.example")
        Membership.objects.create(organization=acme.org, user=user, role=Role.MEMBER)
        create_api_key(actor=acme.actor(Role.ADMIN), name=f"extra-{i}", role=Role.VIEWER)
    after = {p: count_queries(client, p, key) for p in paths}
    assert after == before
    sizes = {p: client.get(p, headers=key).json() for p in paths}
    assert len(sizes["/api/v1/triggers/"]["results"]) == 7
    assert len(sizes["/api/v1/members/"]["results"]) == 10
    assert len(sizes["/api/v1/invitations/"]["results"]) == 7
    assert len(sizes["/api/v1/api-keys/"]["results"]) == 10
    assert len(sizes["/api/v1/audit-events/"]["results"]) > 20
    assert ApiKey.objects.for_organization(acme.org).count() == 10
