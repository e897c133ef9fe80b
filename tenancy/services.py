"""Tenancy actions shared by commands, API and web UI (after Zulip's ``do_*``).

Every function takes the acting ``Actor``, checks the permission matrix
(``tenancy.permissions``) and the membership rules, and changes data in one
transaction. Errors are TenancyError (a rule refused it; 400/409) or Forbidden
(the role may not; 403).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets

from allauth.account.models import EmailAddress
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import services as audit
from tenancy.actors import Actor
from tenancy.models import Invitation, Membership, Organization, Role, User
from tenancy.permissions import Action, Forbidden, require

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Seconds an invitation stays acceptable.
INVITATION_TTL_SECONDS = 7 * 24 * 3600


class TenancyError(ValueError):
    """A tenancy action was refused by a rule; the message says which."""


def create_organization(*, slug: str, name: str, owner_email: str, owner_password: str | None = None):
    """Create an organization with ``owner_email`` as its owner (the user is created
    when missing, with ``owner_password`` or an unusable password).

    Returns (organization, user, user_created). Raises TenancyError for a malformed
    or taken slug or an empty name.
    """
    email = owner_email.strip().lower()
    with transaction.atomic():
        user = User.objects.filter(email=email).first()
        created = user is None
        if created:
            user = User.objects.create_user(email=email, password=owner_password)
        org = create_organization_for(user=user, slug=slug, name=name)
    return org, user, created


def create_organization_for(*, user: User, slug: str, name: str) -> Organization:
    """Create an organization owned by ``user`` (the web UI's "new organization")."""
    if not SLUG_RE.match(slug or ""):
        raise TenancyError(f"slug {slug!r}: use 1-63 lowercase letters, digits or '-', starting with a letter or digit")
    if not name or not name.strip():
        raise TenancyError("name must not be empty")
    taken = TenancyError(f"an organization with slug {slug!r} already exists")
    if Organization.objects.filter(slug=slug).exists():
        raise taken
    try:
        with transaction.atomic():
            org = Organization.objects.create(slug=slug, name=name.strip())
            Membership.objects.create(organization=org, user=user, role=Role.OWNER)
            audit.record("organization.created", organization=org, user=user, target=org,
                         metadata={"slug": org.slug, "name": org.name})
    except IntegrityError as exc:  # a concurrent create won the slug between the check and the insert
        raise taken from exc
    return org


def rename_organization(*, actor: Actor, name: str) -> Organization:
    """Rename the actor's organization (owners only). Records ``organization.renamed``.
    Raises Forbidden or TenancyError (empty or over 200 characters)."""
    require(actor.role, Action.ORG_MANAGE)
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise TenancyError("name must be 1 to 200 characters")
    with transaction.atomic():
        org = Organization.objects.select_for_update().get(pk=actor.organization.pk)
        before = org.name
        if before != name:
            org.name = name
            org.save(update_fields=["name"])
            audit.record("organization.renamed", actor=actor, target=org,
                         metadata={"name": {"before": before, "after": name}})
    return org


def _lock_memberships(org_id) -> list[Membership]:
    # Serializes concurrent role changes in one organization, so two owners demoting
    # each other at once cannot leave it without an owner.
    return list(Membership.objects.for_organization(org_id).select_for_update().order_by("id"))


def _owners(memberships: list[Membership]) -> int:
    return sum(1 for m in memberships if m.role == Role.OWNER)


def change_role(*, actor: Actor, membership: Membership, role: str) -> Membership:
    """Set ``membership``'s role. Only an owner grants or removes the owner role; the
    last owner cannot be demoted. Raises Forbidden or TenancyError."""
    require(actor.role, Action.MEMBER_MANAGE)
    if role not in Role.values:
        raise TenancyError(f"role {role!r}: expected one of {', '.join(Role.values)}")
    with transaction.atomic():
        members = _lock_memberships(membership.organization_id)
        current = next((m for m in members if m.pk == membership.pk), None)
        if current is None:
            raise TenancyError("that membership no longer exists")
        if Role.OWNER in (role, current.role) and actor.role != Role.OWNER:
            raise Forbidden("only an owner can grant or remove the owner role")
        if current.role == Role.OWNER and role != Role.OWNER and _owners(members) == 1:
            raise TenancyError("the last owner cannot be demoted; make someone else an owner first")
        before = current.role
        if before != role:
            current.role = role
            current.save(update_fields=["role"])
            audit.record("member.role_changed", actor=actor, target=current, metadata={
                "user": current.user.email, "role": {"before": before, "after": role}})
    return current


def remove_member(*, actor: Actor, membership: Membership) -> None:
    """Remove ``membership`` (another member, or the actor leaving). Managing others
    needs member.manage; removing an owner needs an owner; the last owner can neither
    be removed nor leave."""
    leaving = actor.user is not None and membership.user_id == actor.user.pk
    if not leaving:
        require(actor.role, Action.MEMBER_MANAGE)
    with transaction.atomic():
        members = _lock_memberships(membership.organization_id)
        current = next((m for m in members if m.pk == membership.pk), None)
        if current is None:
            raise TenancyError("that membership no longer exists")
        if current.role == Role.OWNER:
            if not leaving and actor.role != Role.OWNER:
                raise Forbidden("only an owner can remove an owner")
            if _owners(members) == 1:
                raise TenancyError(
                    "the last owner cannot leave or be removed; make someone else an owner first"
                )
        audit.record("member.left" if leaving else "member.removed", actor=actor, target=current,
                     metadata={"user": current.user.email, "role": current.role})
        current.delete()


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invite_member(*, actor: Actor, email: str, role: str = Role.MEMBER) -> tuple[Invitation, str]:
    """Invite ``email`` with ``role``. Returns (invitation, token); the token is shown
    or mailed once and only its hash is stored. A pending invitation to the same
    address is replaced. Raises Forbidden (inviting an owner needs an owner) or
    TenancyError (already a member, malformed address)."""
    require(actor.role, Action.MEMBER_MANAGE)
    email = (email or "").strip().lower()
    if "@" not in email or len(email) > 254:
        raise TenancyError(f"{email!r} is not an email address")
    if role not in Role.values:
        raise TenancyError(f"role {role!r}: expected one of {', '.join(Role.values)}")
    if role == Role.OWNER and actor.role != Role.OWNER:
        raise Forbidden("only an owner can invite an owner")
    org = actor.organization
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        if Membership.objects.for_organization(org).filter(user__email=email).exists():
            raise TenancyError(f"{email} is already a member")
        now = timezone.now()
        Invitation.objects.for_organization(org).filter(
            email=email, accepted_at__isnull=True, revoked_at__isnull=True
        ).update(revoked_at=now)
        invitation = Invitation.objects.create(
            organization=org,
            email=email,
            role=role,
            token_hash=_token_hash(token),
            invited_by=actor.user,
            expires_at=now + dt.timedelta(seconds=INVITATION_TTL_SECONDS),
        )
        audit.record("invitation.sent", actor=actor, target=invitation,
                     metadata={"email": email, "role": role, "expires_at": invitation.expires_at.isoformat()})
    return invitation, token


def revoke_invitation(*, actor: Actor, invitation: Invitation) -> bool:
    """Withdraw a pending invitation. Returns False when it was no longer pending
    (already accepted or revoked), in which case nothing changed."""
    require(actor.role, Action.MEMBER_MANAGE)
    with transaction.atomic():
        changed = bool(
            Invitation.objects.for_organization(actor.organization)
            .filter(pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True)
            .update(revoked_at=timezone.now())
        )
        if changed:
            audit.record("invitation.revoked", actor=actor, target=invitation, metadata={"email": invitation.email})
    return changed


def find_invitation(token: str) -> Invitation | None:
    """The invitation a token belongs to (any state), or None. Cross-tenant by nature:
    the token is the credential, so this read is unscoped on purpose."""
    return Invitation.objects.unscoped().select_related("organization").filter(token_hash=_token_hash(token)).first()


def accept_invitation(*, token: str, user: User) -> Membership:
    """Accept an invitation as ``user``: creates the membership and consumes the token.

    Raises TenancyError when the token is unknown, expired, already used or revoked,
    or the signed-in address is not the invited one (or not verified). A refused use
    of a real invitation is itself recorded (``invitation.refused_use``, with the
    reason), committed even though the acceptance is not.
    """
    refusal: tuple[Invitation, str, str] | None = None
    with transaction.atomic():
        inv = (
            Invitation.objects.unscoped()
            .select_for_update()
            .filter(token_hash=_token_hash(token))
            .first()
        )
        if inv is None:
            raise TenancyError("this invitation link is not valid")
        if inv.accepted_at is not None:
            refusal = (inv, "reused", "this invitation has already been used")
        elif inv.revoked_at is not None:
            refusal = (inv, "revoked", "this invitation was withdrawn")
        elif inv.expires_at <= timezone.now():
            refusal = (inv, "expired", "this invitation has expired; ask for a new one")
        elif inv.email != user.email.lower():
            refusal = (inv, "wrong_address",
                       f"this invitation is for {inv.email}; sign in with that address to accept it")
        elif not EmailAddress.objects.filter(user=user, email__iexact=inv.email, verified=True).exists():
            refusal = (inv, "unverified_address", f"verify {inv.email} before accepting this invitation")
        if refusal is None:
            membership, _created = Membership.objects.get_or_create(
                organization_id=inv.organization_id, user=user, defaults={"role": inv.role}
            )
            inv.accepted_at = timezone.now()
            inv.accepted_by = user
            inv.save(update_fields=["accepted_at", "accepted_by"])
            audit.record(
                "invitation.accepted", organization=inv.organization_id, user=user, target=inv,
                metadata={"email": inv.email, "role": membership.role},
            )
            return membership
    inv, reason, message = refusal
    with transaction.atomic():
        audit.record(
            "invitation.refused_use", organization=inv.organization_id, user=user, target=inv,
            metadata={"reason": reason, "email": inv.email},
        )
    raise TenancyError(message)
