"""Issue 14, finding 4 and finding 7 (last bullet): authority does not outlive its holder.

Each test is the attack: an admin invites someone as admin, loses their own authority
(removed, left, demoted), and the invitee then accepts — through the accept page a
browser posts, and through ``accept_invitation`` (the one service every accept path
calls; the API has no accept route, only the emailed link's page). And a removed
member's cron trigger, driven at its next due instant, must not start a run.
"""

from __future__ import annotations

import datetime as dt
import html
import re
import secrets

import pytest
from allauth.account.models import EmailAddress
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from audit.models import AuditLog
from engine.cron import fire_due_triggers, process_trigger
from engine.models import WorkflowRun
from engine.triggers import create_trigger
from tenancy import apikeys
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import ApiKey, Invitation, Membership, Role, User
from tenancy.services import TenancyError, accept_invitation

pytestmark = pytest.mark.django_db

ACCEPT_LINK_RE = re.compile(r"http://testserver/invitations/([A-Za-z0-9_-]+)/")
WITHDRAWN = "this invitation was withdrawn"


# --- helpers ---------------------------------------------------------------------------------------


def verified_user(prefix: str) -> User:
    email = f"{prefix}-{secrets.token_hex(3)}@people.example"
    user = User.objects.create_user(email=email)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def member_of(org, role: str, prefix: str | None = None) -> Membership:
    return Membership.objects.create(organization=org, user=verified_user(prefix or role), role=role)


def owner_of(org) -> Membership:
    return Membership.objects.for_organization(org).select_related("user", "organization").get(role=Role.OWNER)


def loaded(m: Membership) -> Membership:
    return Membership.objects.for_organization(m.organization_id).select_related("organization", "user").get(pk=m.pk)


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def shows(resp, message: str) -> bool:
    """The page shows ``message`` (the template starts it with a capital letter)."""
    return message[:1].upper() + message[1:] in text(resp)


def invite_on_the_page(sender: Membership, email: str, role: str) -> str:
    """The sender invites ``email`` as ``role`` on /members/; returns the mailed token."""
    mail.outbox.clear()
    resp = browser(sender.user).post("/members/invite/", {"email": email, "role": role})
    assert resp.status_code == 302, text(resp)[:500]
    (token,) = ACCEPT_LINK_RE.findall(mail.outbox[-1].body)
    return token


@pytest.fixture
def keys():
    """Factory: keys(membership, role) -> full API key created by that member; cache cleaned after."""
    made: list[str] = []

    def make(creator: Membership, role: str) -> dict:
        creator = loaded(creator)
        row, full_key = create_api_key(actor=actor_for_membership(creator), name=f"{role} key", role=role)
        made.append(row.prefix)
        return {"Authorization": f"Bearer {full_key}"}

    yield make
    cache.delete_many([k for p in made for k in (apikeys._entry_key(p), apikeys._tombstone_key(p))])


def revocations(org, invitation) -> list[AuditLog]:
    return list(AuditLog.objects.for_organization(org).filter(action="invitation.revoked",
                                                              target_id=str(invitation.pk)))


def assert_refused_everywhere(org, token: str, invitee: User, message: str) -> None:
    """The invitee's POST on the accept page is a 400 naming ``message``, the service
    raises the same, and the invitee is not a member."""
    resp = browser(invitee).post(f"/invitations/{token}/")
    assert resp.status_code == 400, text(resp)[:500]
    assert shows(resp, message), text(resp)[-800:]
    with pytest.raises(TenancyError, match=re.escape(message)):
        accept_invitation(token=token, user=invitee)
    assert not Membership.objects.for_organization(org).filter(user=invitee).exists()


# --- finding 4: invitations ------------------------------------------------------------------------


def test_an_admin_invitation_from_a_removed_admin_is_revoked_and_refused(org):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    token = invite_on_the_page(admin, invitee.email, Role.ADMIN)

    resp = browser(owner.user).post(f"/members/{admin.pk}/remove/")
    assert resp.status_code == 302

    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    assert invitation.revoked_at is not None and invitation.accepted_at is None
    (record,) = revocations(org, invitation)
    assert record.actor_user_id == owner.user_id
    assert record.metadata == {"email": invitee.email, "role": Role.ADMIN, "reason": "sender_removed",
                               "invited_by": admin.user.email}
    # The page no longer offers to accept it, and accepting is refused on every path.
    page = browser(invitee).get(f"/invitations/{token}/")
    assert page.status_code == 400 and shows(page, WITHDRAWN)
    assert_refused_everywhere(org, token, invitee, WITHDRAWN)


def test_an_invitation_from_an_admin_removed_through_the_api_is_revoked(org, keys):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    token = invite_on_the_page(admin, invitee.email, Role.ADMIN)

    resp = Client().delete(f"/api/v1/members/{admin.pk}/", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 204, resp.content

    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    (record,) = revocations(org, invitation)
    assert (record.actor_type, record.metadata["reason"]) == ("api_key", "sender_removed")
    assert_refused_everywhere(org, token, invitee, WITHDRAWN)


def test_an_invitation_from_an_admin_who_left_is_revoked(org):
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    token = invite_on_the_page(admin, invitee.email, Role.ADMIN)

    resp = browser(admin.user).post("/members/leave/")
    assert resp.status_code == 302
    assert not Membership.objects.for_organization(org).filter(pk=admin.pk).exists()

    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    (record,) = revocations(org, invitation)
    assert (record.actor_user_id, record.metadata["reason"]) == (admin.user_id, "sender_left")
    assert_refused_everywhere(org, token, invitee, WITHDRAWN)



def test_a_removed_members_api_keys_are_revoked_and_a_reinvitation_does_not_revive_them(org, keys):
    """An admin's key stops answering when the admin is removed, the key list says it is
    revoked (not "active"), and inviting the same person back does not make it work again."""
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    admin_key = keys(admin, Role.ADMIN)
    assert Client().get("/api/v1/runs/", headers=admin_key).status_code == 200
    row = ApiKey.objects.for_organization(org).get(created_by=admin.user)

    resp = Client().delete(f"/api/v1/members/{admin.pk}/", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 204, resp.content
    row.refresh_from_db()
    assert row.revoked_at is not None and row.revoked_by_id == owner.user_id
    (record,) = AuditLog.objects.for_organization(org).filter(action="api_key.revoked", target_id=str(row.pk))
    assert record.metadata == {"name": row.name, "prefix": row.prefix, "reason": "creator_removed"}
    listed = Client().get("/api/v1/api-keys/", headers=keys(owner, Role.OWNER)).json()["results"]
    assert next(k for k in listed if k["prefix"] == row.prefix)["revoked_at"] is not None
    assert Client().get("/api/v1/runs/", headers=admin_key).status_code == 401

    # Invited back (as a member) and accepted: the old key stays revoked.
    token = invite_on_the_page(owner, admin.user.email, Role.MEMBER)
    accept_invitation(token=token, user=admin.user)
    assert Membership.objects.for_organization(org).filter(user=admin.user, role=Role.MEMBER).exists()
    assert Client().get("/api/v1/runs/", headers=admin_key).status_code == 401
    assert Client().post("/api/v1/runs/", {"workflow": "none"}, content_type="application/json",
                         headers=admin_key).status_code == 401


def test_a_member_who_leaves_has_their_api_keys_revoked_and_others_keep_theirs(org, keys):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    leaving_key, owner_key = keys(admin, Role.MEMBER), keys(owner, Role.OWNER)

    resp = browser(admin.user).post("/members/leave/")
    assert resp.status_code == 302
    row = ApiKey.objects.for_organization(org).get(created_by=admin.user)
    assert (row.revoked_at is not None, row.revoked_by_id) == (True, admin.user_id)
    (record,) = AuditLog.objects.for_organization(org).filter(action="api_key.revoked", target_id=str(row.pk))
    assert record.metadata["reason"] == "creator_left"
    assert Client().get("/api/v1/runs/", headers=leaving_key).status_code == 401
    # The owner's own key is untouched.
    assert Client().get("/api/v1/runs/", headers=owner_key).status_code == 200
    assert ApiKey.objects.for_organization(org).get(created_by=owner.user).revoked_at is None


def test_keys_of_members_removed_before_this_release_are_revoked_by_a_migration(org, keys):
    """Migration tenancy 0009: a key whose creator had already left its organization (removed
    before keys were revoked with their creator) is revoked; a current member's key is not."""
    import importlib

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    gone_key, owner_key = keys(admin, Role.ADMIN), keys(owner, Role.OWNER)
    Membership.objects.for_organization(org).filter(pk=admin.pk).delete()  # as an earlier release removed
    gone = ApiKey.objects.for_organization(org).get(created_by=admin.user)
    assert gone.revoked_at is None

    name = "0009_revoke_keys_of_former_members"
    state = MigrationExecutor(connection).loader.project_state(("tenancy", name), at_end=True)
    importlib.import_module(f"tenancy.migrations.{name}").revoke_keys_of_former_members(state.apps, None)
    gone.refresh_from_db()
    assert gone.revoked_at is not None and gone.revoked_by_id is None
    assert ApiKey.objects.for_organization(org).get(created_by=owner.user).revoked_at is None
    assert Client().get("/api/v1/runs/", headers=owner_key).status_code == 200
    # Invited back, the creator does not revive it.
    accept_invitation(token=invite_on_the_page(owner, admin.user.email, Role.ADMIN), user=admin.user)
    assert Client().get("/api/v1/runs/", headers=gone_key).status_code == 401

def test_an_invitation_sent_with_an_admins_api_key_is_revoked_when_the_admin_is_removed(
        org, keys, django_capture_on_commit_callbacks):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    with django_capture_on_commit_callbacks(execute=True):  # the mail goes out on commit
        resp = Client().post("/api/v1/invitations/", {"email": invitee.email, "role": Role.ADMIN},
                             content_type="application/json", headers=keys(admin, Role.ADMIN))
    assert resp.status_code == 201, resp.content
    (token,) = ACCEPT_LINK_RE.findall(mail.outbox[-1].body)
    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    # The key invites on its creator's authority, and the invitation says whose.
    assert invitation.invited_by_id == admin.user_id

    resp = Client().delete(f"/api/v1/members/{admin.pk}/", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 204, resp.content
    assert [r.metadata["reason"] for r in revocations(org, invitation)] == ["sender_removed"]
    assert_refused_everywhere(org, token, invitee, WITHDRAWN)


def test_demoting_the_sender_revokes_the_invitations_above_their_new_role_and_keeps_the_rest(org, keys):
    owner = owner_of(org)
    co_owner = member_of(org, Role.OWNER, "co-owner")
    would_be_owner, would_be_admin = verified_user("x"), verified_user("y")
    owner_token = invite_on_the_page(co_owner, would_be_owner.email, Role.OWNER)
    admin_token = invite_on_the_page(co_owner, would_be_admin.email, Role.ADMIN)

    resp = Client().patch(f"/api/v1/members/{co_owner.pk}/", {"role": Role.ADMIN},
                          content_type="application/json", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 200, resp.content

    revoked = Invitation.objects.for_organization(org).get(email=would_be_owner.email)
    (record,) = revocations(org, revoked)
    assert record.metadata["reason"] == "sender_demoted" and record.actor_type == "api_key"
    assert_refused_everywhere(org, owner_token, would_be_owner, WITHDRAWN)

    kept = Invitation.objects.for_organization(org).get(email=would_be_admin.email)
    assert kept.revoked_at is None and revocations(org, kept) == []
    resp = browser(would_be_admin).post(f"/invitations/{admin_token}/")
    assert resp.status_code == 302, text(resp)[:500]
    assert Membership.objects.for_organization(org).get(user=would_be_admin).role == Role.ADMIN


def test_an_admin_demoted_to_member_loses_every_pending_invitation(org, keys):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    would_be_member, would_be_viewer = verified_user("x"), verified_user("y")
    member_token = invite_on_the_page(admin, would_be_member.email, Role.MEMBER)
    viewer_token = invite_on_the_page(admin, would_be_viewer.email, Role.VIEWER)

    resp = Client().patch(f"/api/v1/members/{admin.pk}/", {"role": Role.MEMBER},
                          content_type="application/json", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 200, resp.content

    # A member cannot invite anyone, so nothing they sent as an admin survives.
    for invitee, token in ((would_be_member, member_token), (would_be_viewer, viewer_token)):
        invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
        assert [r.metadata["reason"] for r in revocations(org, invitation)] == ["sender_demoted"]
        assert_refused_everywhere(org, token, invitee, WITHDRAWN)


def test_a_sender_demoted_without_the_hook_gives_at_most_their_current_role(org):
    co_owner = member_of(org, Role.OWNER, "co-owner")
    invitee = verified_user("x")
    token = invite_on_the_page(co_owner, invitee.email, Role.OWNER)
    # The race: the demotion lands between sending and accepting, and no hook ran.
    Membership.objects.for_organization(org).filter(pk=co_owner.pk).update(role=Role.ADMIN)

    resp = browser(invitee).post(f"/invitations/{token}/")
    assert resp.status_code == 302, text(resp)[:500]
    assert Membership.objects.for_organization(org).get(user=invitee).role == Role.ADMIN
    accepted = AuditLog.objects.for_organization(org).get(action="invitation.accepted")
    assert (accepted.metadata["role"], accepted.metadata["invited_role"]) == (Role.ADMIN, Role.OWNER)


def test_a_sender_who_can_no_longer_invite_makes_the_acceptance_refused(org):
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    token = invite_on_the_page(admin, invitee.email, Role.VIEWER)
    # Demoted to viewer without the hook: a viewer cannot invite, so the invitation gives nothing.
    Membership.objects.for_organization(org).filter(pk=admin.pk).update(role=Role.VIEWER)

    message = f"the person who sent this invitation can no longer invite members to {org.name}"
    assert_refused_everywhere(org, token, invitee, message)


def test_an_invitation_sent_with_an_api_key_is_withdrawn_when_the_key_is_revoked(
        org, keys, django_capture_on_commit_callbacks):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    admin_key = keys(admin, Role.ADMIN)
    with django_capture_on_commit_callbacks(execute=True):  # the mail goes out on commit
        resp = Client().post("/api/v1/invitations/", {"email": invitee.email, "role": Role.ADMIN},
                             content_type="application/json", headers=admin_key)
    assert resp.status_code == 201, resp.content
    (token,) = ACCEPT_LINK_RE.findall(mail.outbox[-1].body)
    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    key_id = invitation.invited_by_api_key_id
    assert key_id is not None

    resp = Client().post(f"/api/v1/api-keys/{key_id}/revoke/", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 200, resp.content
    assert [r.metadata["reason"] for r in revocations(org, invitation)] == ["api_key_revoked"]
    assert_refused_everywhere(org, token, invitee, WITHDRAWN)


def test_an_invitation_whose_key_was_revoked_without_the_hook_is_refused(org, keys, django_capture_on_commit_callbacks):
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    with django_capture_on_commit_callbacks(execute=True):
        resp = Client().post("/api/v1/invitations/", {"email": invitee.email, "role": Role.MEMBER},
                             content_type="application/json", headers=keys(admin, Role.ADMIN))
    assert resp.status_code == 201, resp.content
    (token,) = ACCEPT_LINK_RE.findall(mail.outbox[-1].body)
    invitation = Invitation.objects.for_organization(org).get(email=invitee.email)
    # The key is revoked behind the service's back (e.g. by staff in the admin).
    ApiKey.objects.for_organization(org).filter(pk=invitation.invited_by_api_key_id).update(revoked_at=timezone.now())

    message = "the API key this invitation was sent with has been revoked or has expired"
    assert_refused_everywhere(org, token, invitee, message)


def test_a_sender_gone_without_the_hook_makes_the_acceptance_refused(org):
    admin = member_of(org, Role.ADMIN, "admin-a")
    invitee = verified_user("x")
    token = invite_on_the_page(admin, invitee.email, Role.ADMIN)
    # The sender's membership disappears without remove_member (e.g. a staff delete).
    Membership.objects.for_organization(org).filter(pk=admin.pk).delete()

    message = f"the person who sent this invitation is no longer a member of {org.name}"
    page = browser(invitee).get(f"/invitations/{token}/")
    assert page.status_code == 400 and shows(page, message)
    assert_refused_everywhere(org, token, invitee, message)
    reasons = list(AuditLog.objects.for_organization(org).filter(action="invitation.refused_use")
                   .values_list("metadata__reason", flat=True))
    assert reasons == ["sender_not_a_member", "sender_not_a_member"]


# --- finding 7: a removed creator's cron trigger -----------------------------------------------------


def test_a_removed_creators_trigger_does_not_fire_at_its_next_due_instant(org, make_workflow, keys):
    owner = owner_of(org)
    admin = member_of(org, Role.ADMIN, "admin-b")
    creator = member_of(org, Role.MEMBER, "member-m")
    make_workflow(org, [{"key": "a", "type": "noop"}], name="nightly")
    trigger = create_trigger(actor=actor_for_membership(loaded(creator)), data={
        "name": "nightly", "workflow_name": "nightly", "cron_expression": "*/5 * * * *", "timezone": "UTC"})
    assert trigger.created_by_id == creator.user_id and trigger.enabled

    resp = Client().delete(f"/api/v1/members/{creator.pk}/", headers=keys(owner, Role.OWNER))
    assert resp.status_code == 204, resp.content

    trigger.refresh_from_db()
    assert trigger.enabled is False
    paused = AuditLog.objects.for_organization(org).get(action="trigger.paused", target_id=str(trigger.pk))
    assert paused.metadata["reason"] == "creator_removed" and paused.metadata["creator"] == creator.user.email
    assert paused.actor_type == "api_key"

    due = trigger.next_fire_at + dt.timedelta(seconds=1)
    assert process_trigger(trigger.pk, due) == 0
    assert fire_due_triggers(now=due) == 0
    assert not WorkflowRun.objects.for_organization(org).filter(trigger=trigger).exists()

    # An admin resumes it and becomes its creator; from then on it fires.
    resp = Client().post(f"/api/v1/triggers/{trigger.pk}/resume/", headers=keys(admin, Role.ADMIN))
    assert resp.status_code == 200, resp.content
    trigger.refresh_from_db()
    assert trigger.enabled and trigger.created_by_id == admin.user_id
    resumed = AuditLog.objects.for_organization(org).get(action="trigger.resumed", target_id=str(trigger.pk))
    assert resumed.metadata["changes"]["created_by"] == {"before": creator.user.email, "after": admin.user.email}
    assert process_trigger(trigger.pk, trigger.next_fire_at + dt.timedelta(seconds=1)) == 1


def test_a_trigger_of_a_creator_who_left_is_paused_and_others_keep_firing(org, make_workflow):
    owner = owner_of(org)
    leaver = member_of(org, Role.MEMBER, "member-l")
    make_workflow(org, [{"key": "a", "type": "noop"}], name="wf")
    body = {"workflow_name": "wf", "cron_expression": "*/5 * * * *", "timezone": "UTC"}
    theirs = create_trigger(actor=actor_for_membership(loaded(leaver)), data={"name": "theirs", **body})
    ours = create_trigger(actor=actor_for_membership(owner), data={"name": "ours", **body})

    assert browser(leaver.user).post("/members/leave/").status_code == 302

    theirs.refresh_from_db()
    ours.refresh_from_db()
    assert (theirs.enabled, ours.enabled) == (False, True)
    paused = AuditLog.objects.for_organization(org).get(action="trigger.paused")
    assert (paused.target_id, paused.actor_user_id) == (str(theirs.pk), leaver.user_id)
    due = max(theirs.next_fire_at, ours.next_fire_at) + dt.timedelta(seconds=1)
    assert fire_due_triggers(now=due) == 1
    assert list(WorkflowRun.objects.for_organization(org).values_list("trigger_id", flat=True)) == [ours.pk]
