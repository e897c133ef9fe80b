"""Every audited action, performed through its real entry point — a page (the Django
test client, allauth's pages and the admin included), the REST API with an API key,
a management command, or the engine's clock — records exactly one audit record with
the right actor, organization, action and target (and its channel or before/after
values where it has them). A rolled-back change, and an API request that fails after
writing, leave no record.

Each test takes a snapshot of the audit log after its set-up (``Since``) and looks only
at the records written afterwards.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from django.core import mail
from django.core.cache import cache
from django.core.management import call_command
from django.db import transaction
from django.forms import MultiWidget
from django.test import Client
from django.utils import timezone

from audit.models import ActorType, AuditLog
from engine.models import RunState, ScheduledTrigger, Workflow, WorkflowRun, WorkflowState
from engine.services import apply_definition, archive_workflow, cancel_run, start_run
from engine.triggers import create_trigger
from tenancy import apikeys
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import ApiKey, Invitation, Membership, Organization, Role, User
from tenancy.services import change_role, invite_member
from tests.unit.test_identity import PASSWORD, current_totp_code, fresh_client, unique_email

TASKS = [{"key": "extract", "type": "noop"}, {"key": "load", "type": "noop", "depends_on": ["extract"]}]
DOCUMENT = {"name": "etl", "tasks": TASKS}
USER, API_KEY, SYSTEM = ActorType.USER, ActorType.API_KEY, ActorType.SYSTEM


# --- the audit log since a point in time ---------------------------------------------------------


class Since:
    """The audit records written after this object was made."""

    def __init__(self) -> None:
        self.seen = set(AuditLog.objects.unscoped().values_list("id", flat=True))

    def new(self, action: str | None = None) -> list[AuditLog]:
        qs = AuditLog.objects.unscoped().exclude(id__in=self.seen)
        if action is not None:
            qs = qs.filter(action=action)
        return list(qs.order_by("created_at", "seq"))

    def one(self, action: str) -> AuditLog:
        rows = self.new(action)
        assert len(rows) == 1, (action, [(r.action, r.metadata) for r in self.new()])
        return rows[0]


def check(row: AuditLog, *, actor_type: str, organization=None, user=None, api_key=None, target=None) -> None:
    """``row`` has this actor, organization (None: an account-level record) and target
    (a model instance or a (type, id) pair)."""
    got = (row.actor_type, row.actor_user_id, row.actor_api_key_id, row.organization_id)
    want = (str(actor_type), getattr(user, "pk", None), getattr(api_key, "pk", None),
            getattr(organization, "pk", None))
    assert got == want, (row.action, got, want)
    if user is not None:
        assert row.actor_email == user.email
    if api_key is not None:
        assert row.actor_api_key_prefix == api_key.prefix
    if target is not None:
        if not isinstance(target, tuple):
            target = (target._meta.model_name, target.pk)
        assert (row.target_type, row.target_id) == (target[0], str(target[1])), row.action


# --- people, organizations, keys -----------------------------------------------------------------


def owner_of(org) -> Membership:
    return Membership.objects.for_organization(org).select_related("user", "organization").get(role=Role.OWNER)


def add_member(org, role: str = Role.MEMBER) -> Membership:
    user = User.objects.create_user(email=unique_email(role))
    return Membership.objects.create(organization=org, user=user, role=role)


def verified_user(email: str | None = None, password: str | None = PASSWORD) -> User:
    """A user allauth lets sign in (verified address), with ``password``."""
    email = email or unique_email()
    user = User.objects.create_user(email=email, password=password)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def client_for(user) -> Client:
    client = fresh_client()
    client.force_login(user)
    return client


def bearer(full_key: str) -> dict:
    return {"Authorization": f"Bearer {full_key}"}


class Api:
    """The REST API as an API key of an organization sees it."""

    def __init__(self, org, full_key: str, row: ApiKey) -> None:
        self.org, self.full_key, self.key, self.client = org, full_key, row, Client()

    def call(self, method: str, path: str, body=None):
        kwargs = {"headers": bearer(self.full_key)}
        if body is not None or method in ("post", "patch"):
            kwargs.update(data=json.dumps(body if body is not None else {}), content_type="application/json")
        return getattr(self.client, method)(path, **kwargs)


@pytest.fixture
def prefixes():
    """Prefixes of keys a test made; their cache entries are dropped afterwards."""
    made: list[str] = []
    yield made
    cache.delete_many([k for p in made for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


def make_key(org, prefixes, *, role: str = Role.OWNER, name: str = "ops") -> tuple[ApiKey, str]:
    row, full = create_api_key(actor=actor_for_membership(owner_of(org), channel="cli"), name=name, role=role)
    prefixes.append(row.prefix)
    return row, full


@pytest.fixture
def api(org, prefixes) -> Api:
    row, full = make_key(org, prefixes)
    return Api(org, full, row)


@pytest.fixture
def owner(org) -> Membership:
    return owner_of(org)


@pytest.fixture
def wf(org):
    return apply_definition(organization=org, document=DOCUMENT)


# --- account events (organization NULL) ----------------------------------------------------------


def test_sign_in(db):
    user = verified_user()
    client = fresh_client()
    since = Since()
    resp = client.post("/accounts/login/", {"login": user.email, "password": PASSWORD})
    assert resp.status_code == 302, resp.content.decode()[:500]
    check(since.one("account.login"), actor_type=USER, user=user, organization=None, target=user)


def test_failed_sign_in_with_an_existing_address(db):
    user = verified_user()
    since = Since()
    resp = fresh_client().post("/accounts/login/", {"login": user.email, "password": "not the password 1"})
    assert resp.status_code == 200
    row = since.one("account.login_failed")
    check(row, actor_type=USER, user=user, organization=None, target=user)
    assert row.metadata == {"attempted_email": user.email}
    assert not since.new("account.login")


def test_failed_sign_in_with_an_unknown_address(db):
    email = unique_email("nobody")
    since = Since()
    resp = fresh_client().post("/accounts/login/", {"login": email, "password": "whatever it is 12"})
    assert resp.status_code == 200
    row = since.one("account.login_failed")
    check(row, actor_type=USER, user=None, organization=None, target=("", ""))
    assert row.actor_email == email and row.metadata == {"attempted_email": email}


def test_sign_out(db):
    user = verified_user()
    client = client_for(user)
    since = Since()
    assert client.post("/accounts/logout/").status_code == 302
    check(since.one("account.logout"), actor_type=USER, user=user, organization=None, target=user)


def test_password_change(db):
    user = verified_user()
    client = client_for(user)
    since = Since()
    new = "a brand new passphrase 88"
    resp = client.post("/accounts/password/change/", {"oldpassword": PASSWORD, "password1": new, "password2": new})
    assert resp.status_code == 302, resp.content.decode()[:500]
    assert User.objects.get(pk=user.pk).check_password(new)
    check(since.one("account.password_changed"), actor_type=USER, user=user, organization=None, target=user)
    assert since.new("account.password_set") == [] and since.new("account.password_reset") == []


def test_password_reset_through_the_emailed_link(db):
    user = verified_user()
    client = fresh_client()
    mail.outbox.clear()
    since = Since()
    resp = client.post("/accounts/password/reset/", {"email": user.email})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/password/reset/done/"
    assert since.new() == []  # asking for a link changes nothing
    link = re.search(r"http://testserver(/accounts/password/reset/key/\S+/)", mail.outbox[-1].body).group(1)
    page = client.get(link, follow=True)  # allauth moves the key into the session, then shows the form
    assert page.status_code == 200
    final = "reset passphrase number 55"
    resp = client.post(page.redirect_chain[-1][0], {"password1": final, "password2": final})
    assert resp.status_code == 302
    assert User.objects.get(pk=user.pk).check_password(final)
    check(since.one("account.password_reset"), actor_type=USER, user=user, organization=None, target=user)
    assert since.new("account.password_changed") == []


def enable_totp(client: Client, user: User) -> Authenticator:
    """Sign in, confirm the password on allauth's re-authentication page (enrolling a
    factor asks for it), then enrol TOTP through allauth's page."""
    resp = client.post("/accounts/login/", {"login": user.email, "password": PASSWORD})
    assert resp.status_code == 302
    resp = client.get("/accounts/2fa/totp/activate/")
    if resp.status_code == 302 and resp["Location"].startswith("/accounts/reauthenticate/"):
        resp = client.post(resp["Location"], {"password": PASSWORD})
        assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/totp/activate/"
    page = client.get("/accounts/2fa/totp/activate/")
    assert page.status_code == 200, page.get("Location")
    secret = page.context["form"].secret
    resp = client.post("/accounts/2fa/totp/activate/", {"code": current_totp_code(secret)})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/recovery-codes/"
    return Authenticator.objects.get(user=user, type=Authenticator.Type.TOTP)


def test_mfa_on(db):
    user = verified_user()
    client = fresh_client()
    since = Since()
    totp = enable_totp(client, user)
    row = since.one("account.mfa_enabled")
    check(row, actor_type=USER, user=user, organization=None, target=totp)
    assert row.metadata == {"type": "totp"}
    # The recovery codes made with it are their own record, not a second "MFA on".
    codes = Authenticator.objects.get(user=user, type=Authenticator.Type.RECOVERY_CODES)
    check(since.one("account.recovery_codes_generated"), actor_type=USER, user=user, organization=None, target=codes)


def test_mfa_off(db):
    user = verified_user()
    client = fresh_client()
    totp = enable_totp(client, user)
    since = Since()
    resp = client.post("/accounts/2fa/totp/deactivate/")
    assert resp.status_code == 302, resp.content.decode()[:500]
    assert not Authenticator.objects.filter(user=user).exists()
    row = since.one("account.mfa_disabled")
    check(row, actor_type=USER, user=user, organization=None, target=("authenticator", totp.pk))
    assert row.metadata == {"type": "totp"}
    assert len(since.new("account.recovery_codes_removed")) == 1


# --- organizations -------------------------------------------------------------------------------


def test_organization_created_on_the_page(db):
    user = verified_user()
    client = client_for(user)
    since = Since()
    resp = client.post("/orgs/new/", {"name": "Acme Data", "slug": "acme-data-audit"})
    assert resp.status_code == 302, resp.content.decode()[:500]
    org = Organization.objects.get(slug="acme-data-audit")
    row = since.one("organization.created")
    check(row, actor_type=USER, user=user, organization=org, target=org)
    assert row.metadata == {"slug": "acme-data-audit", "name": "Acme Data"}


def test_organization_renamed_on_the_settings_page(org, owner):
    client = client_for(owner.user)
    before = org.name
    since = Since()
    resp = client.post("/settings/", {"name": "Renamed Inc"})
    assert resp.status_code == 302, resp.content.decode()[:500]
    row = since.one("organization.renamed")
    check(row, actor_type=USER, user=owner.user, organization=org, target=org)
    assert row.metadata == {"name": {"before": before, "after": "Renamed Inc"}}


# --- invitations ---------------------------------------------------------------------------------


def test_invitation_sent_on_the_page(org, owner):
    client = client_for(owner.user)
    email = unique_email("invitee")
    since = Since()
    resp = client.post("/members/invite/", {"email": email, "role": Role.MEMBER})
    assert resp.status_code == 302, resp.content.decode()[:500]
    invitation = Invitation.objects.for_organization(org).get(email=email)
    row = since.one("invitation.sent")
    check(row, actor_type=USER, user=owner.user, organization=org, target=invitation)
    assert (row.metadata["email"], row.metadata["role"]) == (email, Role.MEMBER)


def test_invitation_sent_through_the_api(api):
    email = unique_email("invitee")
    since = Since()
    resp = api.call("post", "/api/v1/invitations/", {"email": email, "role": Role.ADMIN})
    assert resp.status_code == 201, resp.content
    invitation = Invitation.objects.for_organization(api.org).get(email=email)
    row = since.one("invitation.sent")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=invitation)
    assert (row.metadata["email"], row.metadata["role"]) == (email, Role.ADMIN)


def invite(org, email: str) -> tuple[Invitation, str]:
    return invite_member(actor=actor_for_membership(owner_of(org)), email=email, role=Role.MEMBER)


def test_invitation_accepted_on_the_page(org):
    user = verified_user()
    invitation, token = invite(org, user.email)
    client = client_for(user)
    since = Since()
    resp = client.post(f"/invitations/{token}/")
    assert resp.status_code == 302, resp.content.decode()[:500]
    assert Membership.objects.for_organization(org).filter(user=user).exists()
    row = since.one("invitation.accepted")
    check(row, actor_type=USER, user=user, organization=org, target=invitation)
    assert (row.metadata["email"], row.metadata["role"]) == (user.email, Role.MEMBER)


def test_a_refused_use_of_an_expired_invitation_on_the_page(org):
    user = verified_user()
    invitation, token = invite(org, user.email)
    Invitation.objects.for_organization(org).filter(pk=invitation.pk).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1))
    client = client_for(user)
    since = Since()
    resp = client.post(f"/invitations/{token}/")
    assert resp.status_code == 400
    assert not Membership.objects.for_organization(org).filter(user=user).exists()
    row = since.one("invitation.refused_use")
    check(row, actor_type=USER, user=user, organization=org, target=invitation)
    assert row.metadata == {"reason": "expired", "email": user.email}
    assert since.new("invitation.accepted") == []


# --- memberships ---------------------------------------------------------------------------------


def test_role_changed_on_the_page(org, owner):
    target = add_member(org, Role.MEMBER)
    client = client_for(owner.user)
    since = Since()
    resp = client.post(f"/members/{target.pk}/role/", {"role": Role.ADMIN})
    assert resp.status_code == 302
    row = since.one("member.role_changed")
    check(row, actor_type=USER, user=owner.user, organization=org, target=target)
    assert row.metadata == {"user": target.user.email, "role": {"before": Role.MEMBER, "after": Role.ADMIN}}


def test_role_changed_through_the_api(api):
    target = add_member(api.org, Role.VIEWER)
    since = Since()
    resp = api.call("patch", f"/api/v1/members/{target.pk}/", {"role": Role.MEMBER})
    assert resp.status_code == 200, resp.content
    row = since.one("member.role_changed")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=target)
    assert row.metadata["role"] == {"before": Role.VIEWER, "after": Role.MEMBER}


def test_member_removed_on_the_page(org, owner):
    target = add_member(org, Role.MEMBER)
    client = client_for(owner.user)
    since = Since()
    resp = client.post(f"/members/{target.pk}/remove/")
    assert resp.status_code == 302
    assert not Membership.objects.for_organization(org).filter(pk=target.pk).exists()
    row = since.one("member.removed")
    check(row, actor_type=USER, user=owner.user, organization=org, target=("membership", target.pk))
    assert row.metadata == {"user": target.user.email, "role": Role.MEMBER}
    assert since.new("member.left") == []


def test_member_removed_through_the_api(api):
    target = add_member(api.org, Role.ADMIN)
    since = Since()
    resp = api.call("delete", f"/api/v1/members/{target.pk}/")
    assert resp.status_code == 204, resp.content
    row = since.one("member.removed")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=("membership", target.pk))
    assert row.metadata == {"user": target.user.email, "role": Role.ADMIN}


def test_member_left_on_the_page(org):
    me = add_member(org, Role.MEMBER)
    client = client_for(me.user)
    since = Since()
    resp = client.post("/members/leave/")
    assert resp.status_code == 302
    assert not Membership.objects.for_organization(org).filter(pk=me.pk).exists()
    row = since.one("member.left")
    check(row, actor_type=USER, user=me.user, organization=org, target=("membership", me.pk))
    assert since.new("member.removed") == []


# --- API keys ------------------------------------------------------------------------------------


def test_api_key_created_on_the_page(org, owner, prefixes):
    client = client_for(owner.user)
    page = client.get("/api-keys/").content.decode()
    token = re.search(r'name="form_token" value="([^"]+)"', page).group(1)
    since = Since()
    resp = client.post("/api-keys/", {"name": "deploys", "role": Role.MEMBER, "form_token": token})
    assert resp.status_code == 201, resp.content.decode()[:500]
    key = ApiKey.objects.for_organization(org).get(name="deploys")
    prefixes.append(key.prefix)
    row = since.one("api_key.created")
    check(row, actor_type=USER, user=owner.user, organization=org, target=key)
    assert (row.metadata["name"], row.metadata["role"], row.metadata["prefix"]) == ("deploys", Role.MEMBER, key.prefix)


def test_api_key_created_through_the_api(org, owner, prefixes):
    # A key cannot mint keys: the API creates them for a signed-in user (session).
    client = client_for(owner.user)
    since = Since()
    resp = client.post("/api/v1/api-keys/", {"name": "ci", "role": Role.MEMBER}, content_type="application/json")
    assert resp.status_code == 201, resp.content
    key = ApiKey.objects.for_organization(org).get(pk=resp.json()["id"])
    prefixes.append(key.prefix)
    row = since.one("api_key.created")
    check(row, actor_type=USER, user=owner.user, organization=org, target=key)
    assert row.metadata["prefix"] == key.prefix


def test_api_key_revoked_on_the_page(org, owner, prefixes):
    key, _full = make_key(org, prefixes, name="old")
    client = client_for(owner.user)
    since = Since()
    resp = client.post(f"/api-keys/{key.pk}/revoke/")
    assert resp.status_code == 302
    row = since.one("api_key.revoked")
    check(row, actor_type=USER, user=owner.user, organization=org, target=key)
    assert row.metadata == {"name": "old", "prefix": key.prefix}


def test_api_key_revoked_through_the_api(api, prefixes):
    other, _full = make_key(api.org, prefixes, name="leaked")
    since = Since()
    resp = api.call("post", f"/api/v1/api-keys/{other.pk}/revoke/")
    assert resp.status_code == 200, resp.content
    row = since.one("api_key.revoked")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=other)
    assert row.metadata == {"name": "leaked", "prefix": other.prefix}


def test_a_failed_authentication_by_a_known_prefix(api):
    wrong = f"ffk_{api.key.prefix}_{'x' * 43}"
    since = Since()
    resp = api.client.get("/api/v1/runs/", headers=bearer(wrong))
    assert resp.status_code == 401
    # Kept although the request failed: the record is the whole point of the request's transaction.
    row = since.one("api_key.auth_failed")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=api.key)
    assert row.metadata == {"reason": "wrong_secret", "prefix": api.key.prefix, "failures_this_minute": 1}


# --- workflows -----------------------------------------------------------------------------------


def test_workflow_version_created_through_the_api(api):
    since = Since()
    resp = api.call("post", "/api/v1/workflows/", DOCUMENT)
    assert resp.status_code == 201, resp.content
    wf = Workflow.objects.for_organization(api.org).get(pk=resp.json()["id"])
    row = since.one("workflow.version_created")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=wf)
    assert row.metadata == {"name": "etl", "version": 1, "state": "active", "tasks": 2, "channel": "api"}


def test_workflow_version_created_by_the_apply_workflow_command(org, tmp_path):
    path = tmp_path / "etl.json"
    path.write_text(json.dumps(DOCUMENT))
    apply_definition(organization=org, document=DOCUMENT)  # version 1 exists: the command makes version 2
    since = Since()
    call_command("apply_workflow", str(path), "--org", org.slug, stdout=_Sink(), stderr=_Sink())
    wf = Workflow.objects.for_organization(org).get(name="etl", version=2)
    row = since.one("workflow.version_created")
    check(row, actor_type=SYSTEM, organization=org, target=wf)
    assert (row.metadata["version"], row.metadata["channel"]) == (2, "cli")


def test_workflow_archived_through_the_api(api, wf):
    since = Since()
    resp = api.call("post", f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": wf.name})
    assert resp.status_code == 200, resp.content
    row = since.one("workflow.archived")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=wf)
    assert row.metadata["state"] == {"before": "active", "after": "archived"}
    # Archiving it again changes nothing and records nothing.
    assert api.call("post", f"/api/v1/workflows/{wf.pk}/archive/", {"confirm": wf.name}).status_code == 200
    assert len(since.new("workflow.archived")) == 1


def test_workflow_restored_through_the_api(api, wf):
    archive_workflow(actor=Actor.system(api.org), workflow=wf, confirm=wf.name)
    since = Since()
    resp = api.call("post", f"/api/v1/workflows/{wf.pk}/restore/")
    assert resp.status_code == 200, resp.content
    row = since.one("workflow.restored")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=wf)
    assert row.metadata["state"] == {"before": "archived", "after": "active"}


def test_workflow_archived_and_restored_by_the_set_workflow_state_command(org, wf):
    run = start_run(workflow=wf)
    since = Since()
    call_command("set_workflow_state", wf.name, "archived", "--org", org.slug, stdout=_Sink())
    archived = since.one("workflow.archived")
    check(archived, actor_type=SYSTEM, organization=org, target=wf)
    assert archived.metadata["runs_cancelled"] == 1
    check(since.one("run.cancelled"), actor_type=SYSTEM, organization=org, target=run)
    call_command("set_workflow_state", wf.name, "active", "--org", org.slug, stdout=_Sink())
    check(since.one("workflow.restored"), actor_type=SYSTEM, organization=org, target=wf)


# --- runs ----------------------------------------------------------------------------------------


def the_run(org, **filters) -> WorkflowRun:
    return WorkflowRun.objects.for_organization(org).get(**filters)


def test_run_started_through_the_api(api, wf):
    since = Since()
    resp = api.call("post", "/api/v1/runs/", {"workflow": "etl", "input": {"day": "mon"}})
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]
    row = since.one("run.started")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=("workflowrun", run_id))
    assert (row.metadata["channel"], row.metadata["workflow"], row.metadata["version"]) == ("api", "etl", 1)


def test_run_started_on_the_page(org, owner, wf):
    client = client_for(owner.user)
    since = Since()
    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": '{"day": "tue"}'})
    assert resp.status_code == 302, resp.content.decode()[:500]
    run = the_run(org, workflow=wf)
    row = since.one("run.started")
    check(row, actor_type=USER, user=owner.user, organization=org, target=("workflowrun", run.pk))
    assert row.metadata["channel"] == "web"


def test_run_started_by_the_start_run_command(org, wf):
    since = Since()
    call_command("start_run", "etl", "--org", org.slug, "--input", '{"day": "wed"}', stdout=_Sink())
    run = the_run(org, workflow=wf)
    row = since.one("run.started")
    check(row, actor_type=SYSTEM, organization=org, target=("workflowrun", run.pk))
    assert row.metadata["channel"] == "cli"


def test_run_started_by_the_clocks_cron_tick(org, wf):
    from engine.actors import fire_triggers

    trigger = create_trigger(actor=Actor.system(org), data={
        "name": "every minute", "workflow_name": "etl", "cron_expression": "* * * * *", "timezone": "UTC"})
    ScheduledTrigger.objects.for_organization(org).filter(pk=trigger.pk).update(
        next_fire_at=timezone.now() - dt.timedelta(seconds=5))
    since = Since()
    fire_triggers.fn()  # the clock's actor, in this process
    run = the_run(org, trigger=trigger)
    row = since.one("run.started")
    check(row, actor_type=SYSTEM, organization=org, target=("workflowrun", run.pk))
    assert (row.metadata["channel"], row.metadata["trigger"]) == ("cron", "every minute")


def test_run_cancelled_through_the_api(api, wf):
    run = start_run(workflow=wf)
    since = Since()
    resp = api.call("post", f"/api/v1/runs/{run.pk}/cancel/")
    assert resp.status_code == 200, resp.content
    row = since.one("run.cancelled")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=run)
    assert row.metadata["channel"] == "api"


def test_run_cancelled_on_the_page(org, owner, wf):
    run = start_run(workflow=wf)
    since = Since()
    resp = client_for(owner.user).post(f"/runs/{run.pk}/cancel/")
    assert resp.status_code == 302
    assert the_run(org, pk=run.pk).state == RunState.CANCELLED
    row = since.one("run.cancelled")
    check(row, actor_type=USER, user=owner.user, organization=org, target=run)
    assert row.metadata["channel"] == "web"


def finished_run(wf) -> WorkflowRun:
    run = start_run(workflow=wf, run_input={"n": 1})
    assert cancel_run(run=run)
    return run


def test_run_retried_through_the_api(api, wf):
    run = finished_run(wf)
    since = Since()
    resp = api.call("post", f"/api/v1/runs/{run.pk}/retry/")
    assert resp.status_code == 201, resp.content
    new_id = resp.json()["id"]
    row = since.one("run.retried")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=run)
    assert (row.metadata["new_run"], row.metadata["channel"]) == (new_id, "api")
    started = since.one("run.started")  # the new run, once
    check(started, actor_type=API_KEY, api_key=api.key, organization=api.org, target=("workflowrun", new_id))
    assert started.metadata["retry_of"] == str(run.pk)


def test_run_retried_on_the_page(org, owner, wf):
    run = finished_run(wf)
    since = Since()
    resp = client_for(owner.user).post(f"/runs/{run.pk}/retry/")
    assert resp.status_code == 302
    new = the_run(org, retry_of=run)
    row = since.one("run.retried")
    check(row, actor_type=USER, user=owner.user, organization=org, target=run)
    assert (row.metadata["new_run"], row.metadata["channel"]) == (str(new.pk), "web")
    check(since.one("run.started"), actor_type=USER, user=owner.user, organization=org,
          target=("workflowrun", new.pk))


# --- cron triggers -------------------------------------------------------------------------------

TRIGGER = {"name": "nightly", "workflow_name": "etl", "cron_expression": "30 2 * * *", "timezone": "Europe/Berlin"}


@pytest.fixture
def trigger(api, wf):
    return create_trigger(actor=Actor.system(api.org), data=TRIGGER)


def test_trigger_created_through_the_api(api, wf):
    since = Since()
    resp = api.call("post", "/api/v1/triggers/", TRIGGER)
    assert resp.status_code == 201, resp.content
    trigger = ScheduledTrigger.objects.for_organization(api.org).get(pk=resp.json()["id"])
    row = since.one("trigger.created")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=trigger)
    assert (row.metadata["name"], row.metadata["cron_expression"], row.metadata["enabled"]) == (
        "nightly", "30 2 * * *", True)


def test_trigger_changed_through_the_api(api, trigger):
    since = Since()
    resp = api.call("patch", f"/api/v1/triggers/{trigger.pk}/", {"cron_expression": "0 6 * * 1-5"})
    assert resp.status_code == 200, resp.content
    row = since.one("trigger.changed")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=trigger)
    assert row.metadata == {"changes": {"cron_expression": {"before": "30 2 * * *", "after": "0 6 * * 1-5"}}}


def test_trigger_paused_through_the_api(api, trigger):
    since = Since()
    resp = api.call("post", f"/api/v1/triggers/{trigger.pk}/pause/")
    assert resp.status_code == 200, resp.content
    row = since.one("trigger.paused")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=trigger)
    assert row.metadata == {"changes": {"enabled": {"before": True, "after": False}}}
    assert since.new("trigger.changed") == []


def test_trigger_resumed_through_the_api(api, trigger):
    ScheduledTrigger.objects.for_organization(api.org).filter(pk=trigger.pk).update(enabled=False)
    since = Since()
    resp = api.call("post", f"/api/v1/triggers/{trigger.pk}/resume/")
    assert resp.status_code == 200, resp.content
    row = since.one("trigger.resumed")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=trigger)
    assert row.metadata == {"changes": {"enabled": {"before": False, "after": True}}}


def test_trigger_deleted_through_the_api(api, trigger):
    since = Since()
    resp = api.call("delete", f"/api/v1/triggers/{trigger.pk}/")
    assert resp.status_code == 204, resp.content
    assert not ScheduledTrigger.objects.for_organization(api.org).filter(pk=trigger.pk).exists()
    row = since.one("trigger.deleted")
    check(row, actor_type=API_KEY, api_key=api.key, organization=api.org, target=("scheduledtrigger", trigger.pk))
    assert row.metadata["name"] == "nightly"


# --- the staff admin -----------------------------------------------------------------------------


def admin_form_data(page) -> dict:
    """The POST data of an admin change page's form, as the browser would send it unchanged."""
    form = page.context["adminform"].form
    data: dict = {"_save": "Save"}
    for name in form.fields:
        bound = form[name]
        value = bound.value()
        widget = bound.field.widget
        if isinstance(widget, MultiWidget):
            for i, part in enumerate(widget.decompress(value)):
                data[f"{name}_{i}"] = "" if part is None else str(part)
        elif value is not None:
            data[name] = [str(v) for v in value] if isinstance(value, list | tuple) else str(value)
    return data


@pytest.fixture
def staff(db) -> User:
    return User.objects.create_superuser(email=unique_email("staff"), password=PASSWORD)


def test_a_staff_change_of_a_membership_in_the_admin(org, staff):
    target = add_member(org, Role.MEMBER)
    client = client_for(staff)
    url = f"/admin/tenancy/membership/{target.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    since = Since()
    resp = client.post(url, {**admin_form_data(page), "role": Role.VIEWER})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Membership.objects.for_organization(org).get(pk=target.pk).role == Role.VIEWER
    row = since.one("admin.membership.changed")
    check(row, actor_type=USER, user=staff, organization=org, target=target)
    assert "Role" in row.metadata["change"]


def test_a_staff_change_of_a_users_name_in_the_admin(staff):
    person = verified_user()
    client = client_for(staff)
    url = f"/admin/tenancy/user/{person.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    since = Since()
    resp = client.post(url, {**admin_form_data(page), "name": "Ada Lovelace"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert User.objects.get(pk=person.pk).name == "Ada Lovelace"
    row = since.one("admin.user.changed")
    check(row, actor_type=USER, user=staff, organization=None, target=person)
    assert "Name" in row.metadata["change"]


def test_a_staff_bulk_delete_in_the_admin_records_each_object(org, staff):
    doomed = [add_member(org, Role.VIEWER) for _ in range(2)]
    client = client_for(staff)
    since = Since()
    resp = client.post("/admin/tenancy/membership/", {
        "action": "delete_selected", "post": "yes", "_selected_action": [str(m.pk) for m in doomed]})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert not Membership.objects.for_organization(org).filter(pk__in=[m.pk for m in doomed]).exists()
    rows = since.new("admin.membership.deleted")
    assert sorted(r.target_id for r in rows) == sorted(str(m.pk) for m in doomed)
    for row in rows:
        check(row, actor_type=USER, user=staff, organization=org)


# --- commands of the tenancy app -----------------------------------------------------------------


def test_api_key_created_by_the_createapikey_command(org, owner, prefixes):
    since = Since()
    call_command("createapikey", org.slug, "--name", "cron box", stdout=_Sink(), stderr=_Sink())
    key = ApiKey.objects.for_organization(org).get(name="cron box")
    prefixes.append(key.prefix)
    check(since.one("api_key.created"), actor_type=USER, user=owner.user, organization=org, target=key)


def test_organization_created_by_the_createorganization_command(db):
    email = unique_email("founder")
    since = Since()
    call_command("createorganization", "cli-made", "CLI Made", email, stdout=_Sink(), stderr=_Sink())
    org = Organization.objects.get(slug="cli-made")
    user = User.objects.get(email=email)
    check(since.one("organization.created"), actor_type=USER, user=user, organization=org, target=org)


# --- rollbacks -----------------------------------------------------------------------------------


def test_a_rolled_back_service_call_leaves_no_record(org, owner):
    target = add_member(org, Role.MEMBER)
    actor = actor_for_membership(owner_of(org))
    since = Since()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            change_role(actor=actor, membership=target, role=Role.ADMIN)
            apply_definition(actor=actor, document={"name": "doomed", "tasks": TASKS})
            assert len(since.new()) == 2  # both were recorded inside the transaction...
            raise RuntimeError("the change failed after both services returned")
    assert since.new() == []  # ...and went with it
    assert Membership.objects.for_organization(org).get(pk=target.pk).role == Role.MEMBER
    assert not Workflow.objects.for_organization(org).filter(name="doomed").exists()


def test_an_archive_whose_record_fails_is_not_committed_without_it(org, wf, monkeypatch):
    """Outside a request (the command), the archive, its cancellations and its record are
    one transaction: when recording fails, nothing of the archive is left."""
    from engine import services

    run = start_run(workflow=wf)
    real = services.audit.record

    def record(action, **kwargs):
        if action == "workflow.archived":
            raise RuntimeError("the audit log is unavailable")
        return real(action, **kwargs)

    monkeypatch.setattr(services.audit, "record", record)
    since = Since()
    with pytest.raises(RuntimeError):
        call_command("set_workflow_state", wf.name, "archived", "--org", org.slug, stdout=_Sink())
    assert Workflow.objects.for_organization(org).get(pk=wf.pk).state == WorkflowState.ACTIVE
    assert the_run(org, pk=run.pk).state != RunState.CANCELLED
    assert since.new() == []


def test_a_409_retry_of_a_running_run_leaves_no_record(api, wf):
    run = start_run(workflow=wf)
    runs = WorkflowRun.objects.for_organization(api.org).count()
    since = Since()
    resp = api.call("post", f"/api/v1/runs/{run.pk}/retry/")
    assert resp.status_code == 409, resp.content
    assert since.new() == []
    assert WorkflowRun.objects.for_organization(api.org).count() == runs


def test_an_api_request_that_fails_after_writing_leaves_no_partial_record(api, wf, monkeypatch):
    """The retry's new run and both its records are written, then the request fails (a
    409 raised while building the response): the request's transaction takes the run
    and the records with it."""
    from api import views_runs
    from api.exceptions import Conflict

    run = finished_run(wf)
    runs = WorkflowRun.objects.for_organization(api.org).count()
    written: list[str] = []
    since = Since()

    def fail(organization, run_id):
        written.extend(sorted(r.action for r in since.new()))
        raise Conflict("failed after writing")

    monkeypatch.setattr(views_runs, "_run_detail", fail)
    resp = api.call("post", f"/api/v1/runs/{run.pk}/retry/")
    assert resp.status_code == 409, resp.content
    assert written == ["run.retried", "run.started"]  # they were there before the failure
    assert since.new() == []
    assert WorkflowRun.objects.for_organization(api.org).count() == runs


class _Sink:
    """A command's stdout/stderr that keeps nothing (the full key of createapikey included)."""

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass
