"""Invitations through the pages: invite from /members/, the emailed link, accepting
as the invited (newly signed-up) user, and every refusal with its message."""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import re

from allauth.account.models import EmailAddress
from django.core import mail
from django.utils import timezone

from tenancy.actors import Actor
from tenancy.context import SESSION_KEY as ORG_SESSION_KEY
from tenancy.models import Invitation, Membership, Role, User
from tenancy.services import find_invitation, invite_member
from tests.unit.test_identity import (
    PASSWORD,
    fresh_client,
    sign_up_and_confirm,
    signed_in_user_id,
    unique_email,
)

ACCEPT_LINK_RE = re.compile(r"http://testserver(/invitations/([A-Za-z0-9_-]+)/)")


def owner_of(org) -> User:
    return Membership.objects.for_organization(org).get(role=Role.OWNER).user


def verified_user(email):
    """A user whose address allauth has verified (accepting an invitation requires it)."""
    user = User.objects.create_user(email=email)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    return user


def client_for(user):
    client = fresh_client()
    client.force_login(user)
    return client


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def invite_through_page(client, email: str, role: str) -> tuple[str, str]:
    """POST the invite form; return (accept path, token) from the email it sent."""
    mail.outbox.clear()
    resp = client.post("/members/invite/", {"email": email, "role": role})
    assert resp.status_code == 302 and resp["Location"] == "/members/"
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == [email]
    match = ACCEPT_LINK_RE.search(message.body)
    assert match, message.body
    return match.group(1), match.group(2)


def pending_invitation(org, email: str) -> Invitation:
    return Invitation.objects.for_organization(org).get(
        email=email, accepted_at__isnull=True, revoked_at__isnull=True
    )


def invite_directly(org, email: str, role: str = Role.MEMBER) -> str:
    owner = owner_of(org)
    _inv, token = invite_member(
        actor=Actor(organization=org, role=Role.OWNER, user=owner), email=email, role=role
    )
    return token


def test_invite_email_signup_and_accept_gives_the_invited_role(org):
    owner_client = client_for(owner_of(org))
    email = unique_email("invitee")
    path, token = invite_through_page(owner_client, email, Role.ADMIN)

    # The success message names the address and role; the page never shows the token.
    page = owner_client.get("/members/")
    assert f"Invitation sent to {email} as Admin." in text(page)
    assert token not in page.content.decode()
    invitation = pending_invitation(org, email)
    assert invitation.role == Role.ADMIN
    assert invitation.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert mail.outbox[0].subject == f"You are invited to join {org.name} on FlowForge"

    # Anonymous: the page shows the organization and role, accepting asks to sign in first.
    invitee = fresh_client()
    page = invitee.get(path)
    assert page.status_code == 200
    assert org.name in text(page) and "Admin" in text(page)
    resp = invitee.post(path)
    assert resp.status_code == 302
    assert resp["Location"] == f"/accounts/login/?next={path}"

    # Sign up with the invited address; confirming the email signs in and comes back.
    resp = sign_up_and_confirm(invitee, email, next_url=path)
    assert resp.status_code == 302 and resp["Location"] == path
    user = User.objects.get(email=email)
    assert signed_in_user_id(invitee) == str(user.pk)
    page = invitee.get(path)
    assert page.status_code == 200 and "Accept invitation" in text(page)

    resp = invitee.post(path)
    assert resp.status_code == 302 and resp["Location"] == "/"
    membership = Membership.objects.for_organization(org).get(user=user)
    assert membership.role == Role.ADMIN
    invitation.refresh_from_db()
    assert invitation.accepted_by_id == user.pk and invitation.accepted_at is not None
    # The accepted organization is now the session's active one.
    assert invitee.session[ORG_SESSION_KEY] == str(org.pk)
    home = invitee.get("/")
    assert home.status_code == 200
    assert f"You joined {org.name} as Admin." in text(home)

    # The link works once.
    resp = invitee.post(path)
    assert resp.status_code == 400
    assert "This invitation has already been used." in text(resp)
    resp = invitee.get(path)
    assert resp.status_code == 400
    assert "This invitation has already been used." in text(resp)
    assert Membership.objects.for_organization(org).filter(user=user).count() == 1


def test_an_existing_user_signs_in_through_next_and_accepts(org):
    email = unique_email("existing")
    user = User.objects.create_user(email=email, password=PASSWORD)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    path = f"/invitations/{invite_directly(org, email, Role.VIEWER)}/"
    client = fresh_client()
    login_url = client.post(path)["Location"]
    assert login_url == f"/accounts/login/?next={path}"
    resp = client.post(login_url, {"login": email, "password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == path
    resp = client.post(path)
    assert resp.status_code == 302
    assert Membership.objects.for_organization(org).get(user=user).role == Role.VIEWER


def test_expired_invitation_is_refused(org):
    email = unique_email("late")
    user = verified_user(email)
    token = invite_directly(org, email)
    Invitation.objects.for_organization(org).filter(email=email).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    client = client_for(user)
    resp = client.get(f"/invitations/{token}/")
    assert resp.status_code == 400
    assert "This invitation has expired; ask for a new one." in text(resp)
    assert "Accept invitation" not in text(resp)
    resp = client.post(f"/invitations/{token}/")
    assert resp.status_code == 400
    assert "This invitation has expired; ask for a new one." in text(resp)
    assert not Membership.objects.for_organization(org).filter(user=user).exists()


def test_invitation_for_another_address_is_refused(org):
    invited = unique_email("invited")
    token = invite_directly(org, invited)
    intruder = User.objects.create_user(email=unique_email("intruder"))
    client = client_for(intruder)
    resp = client.post(f"/invitations/{token}/")
    assert resp.status_code == 400
    assert f"This invitation is for {invited}; sign in with that address to accept it." in text(resp)
    assert not Membership.objects.for_organization(org).filter(user=intruder).exists()
    # Still pending for the right person.
    assert pending_invitation(org, invited).accepted_at is None


def test_withdrawn_invitation_is_refused(org):
    owner_client = client_for(owner_of(org))
    email = unique_email("withdrawn")
    path, _token = invite_through_page(owner_client, email, Role.MEMBER)
    invitation = pending_invitation(org, email)
    resp = owner_client.post(f"/members/invitations/{invitation.pk}/revoke/")
    assert resp.status_code == 302
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None
    user = verified_user(email)
    resp = client_for(user).post(path)
    assert resp.status_code == 400
    assert "This invitation was withdrawn." in text(resp)
    assert not Membership.objects.for_organization(org).filter(user=user).exists()


def test_unknown_token_is_refused(db):
    client = client_for(User.objects.create_user(email=unique_email("guess")))
    resp = client.get("/invitations/not-a-real-token/")
    assert resp.status_code == 400
    assert "This invitation link is not valid: check that it was copied whole" in text(resp)
    resp = client.post("/invitations/not-a-real-token/")
    assert resp.status_code == 400
    assert "This invitation link is not valid: check that it was copied whole" in text(resp)


def test_an_invitation_purged_after_it_expired_says_how_long_one_is_kept(org):
    """Before: a purged invitation's link read only "not valid", as a guessed one does."""
    from tenancy.services import purge_stale_invitations

    email = unique_email("purged")
    user = verified_user(email)
    token = invite_directly(org, email)
    Invitation.objects.for_organization(org).filter(email=email).update(
        expires_at=timezone.now() - dt.timedelta(days=31))
    assert purge_stale_invitations() >= 1
    assert find_invitation(token) is None
    client = client_for(user)
    for resp in (client.get(f"/invitations/{token}/"), client.post(f"/invitations/{token}/")):
        assert resp.status_code == 400
        assert ("or ask for a new one (an invitation that expired or was withdrawn is forgotten 30 days later)."
                in text(resp))
    assert not Membership.objects.for_organization(org).filter(user=user).exists()


def test_inviting_an_existing_member_shows_the_error_on_the_email_field(org):
    owner = owner_of(org)
    client = client_for(owner)
    mail.outbox.clear()
    resp = client.post("/members/invite/", {"email": owner.email, "role": Role.MEMBER})
    assert resp.status_code == 400
    assert f"{owner.email} is already a member" in text(resp)
    assert 'id="id_email_errors"' in resp.content.decode()
    assert mail.outbox == []
    resp = client.post("/members/invite/", {"email": "not-an-address", "role": Role.MEMBER})
    assert resp.status_code == 400
    assert "Enter a valid email address." in text(resp)


def test_another_organizations_invitation_cannot_be_revoked(make_org):
    mine, theirs = make_org(), make_org()
    token = invite_directly(theirs, unique_email("theirs"))
    theirs_invitation = Invitation.objects.for_organization(theirs).get()
    client = client_for(owner_of(mine))
    assert client.post(f"/members/invitations/{theirs_invitation.pk}/revoke/").status_code == 404
    theirs_invitation.refresh_from_db()
    assert theirs_invitation.revoked_at is None
    assert find_invitation(token).pk == theirs_invitation.pk


def test_refused_invitation_requests_do_not_log_the_token(org, caplog):
    email = unique_email("logged")
    token = invite_directly(org, email)
    client = client_for(User.objects.create_user(email=unique_email("other")))
    with caplog.at_level("INFO"):
        assert client.post(f"/invitations/{token}/").status_code == 400
    logged = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert logged == ["Bad Request: /invitations/[redacted]/"]
    assert token not in caplog.text


def test_withdrawing_an_accepted_invitation_says_so_and_changes_nothing(org):
    email = unique_email("fast")
    user = verified_user(email)
    token = invite_directly(org, email)
    assert client_for(user).post(f"/invitations/{token}/").status_code == 302
    invitation = Invitation.objects.for_organization(org).get(email=email)
    resp = client_for(owner_of(org)).post(f"/members/invitations/{invitation.pk}/revoke/", follow=True)
    assert f"The invitation for {email} has already been accepted." in text(resp)
    invitation.refresh_from_db()
    assert invitation.revoked_at is None and invitation.accepted_at is not None


def test_an_unverified_address_cannot_accept_until_verified(org):
    email = unique_email("unverified")
    user = User.objects.create_user(email=email)
    token = invite_directly(org, email)
    resp = client_for(user).post(f"/invitations/{token}/")
    assert resp.status_code == 400
    assert f"verify {email} before accepting this invitation" in text(resp).lower()
    assert not Membership.objects.for_organization(org).filter(user=user).exists()
