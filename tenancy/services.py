"""Tenancy actions shared by commands, API and web UI (after Zulip's ``do_*``).

Every function takes the acting ``Actor``, checks the permission matrix
(``tenancy.permissions``) and the membership rules, and changes data in one
transaction. Errors are TenancyError (a rule refused it; 400/409) or Forbidden
(the role may not; 403).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import re
import secrets
import unicodedata

from allauth.account.models import EmailAddress
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from audit import services as audit
from tenancy.actors import Actor
from tenancy.authority import cap_to_grantor
from tenancy.limits import QuotaExceeded
from tenancy.models import ROLE_RANK, ApiKey, Invitation, Membership, Organization, Role, User
from tenancy.permissions import Action, Forbidden, can, require
from tenancy.signals import member_departed

SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")  # \Z: "$" lets a final newline in
# Seconds an invitation stays acceptable.
INVITATION_TTL_SECONDS = 7 * 24 * 3600
# The window of the invitation send limits (FLOWFORGE_INVITATIONS_PER_DAY_PER_*).
INVITATION_LIMIT_WINDOW = dt.timedelta(hours=24)
# An invitation nobody can use any more (expired unused, or revoked) is deleted this long
# after it expired or was revoked (purge_stale_invitations); the audit log keeps its story.
STALE_INVITATION_AGE = dt.timedelta(days=30)
# What an unknown invitation token is told: it may be mistyped, or one purged (above), which
# can no longer be told apart from a guess.
UNKNOWN_INVITATION = ("this invitation link is not valid: check that it was copied whole, or ask for a new one "
                      f"(an invitation that expired or was withdrawn is forgotten {STALE_INVITATION_AGE.days} days "
                      "later)")


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


def organization_slug(slug: str | None) -> str:
    """``slug`` as given; raises TenancyError unless it is 1-63 lowercase letters, digits or
    '-', starting with a letter or digit (it is a URL path segment). Create and the Django
    admin's change form."""
    if not SLUG_RE.match(slug or ""):
        raise TenancyError(f"slug {slug!r}: use 1-63 lowercase letters, digits or '-', starting with a letter or digit")
    return slug


# Characters that show as nothing yet are letters or marks (so a name of them alone would
# look empty): the Hangul fillers, the braille blank and the combining grapheme joiner.
_BLANK_LOOKALIKES = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")
# The zero-width non-joiner and joiner: formatting characters that Persian, Indic scripts
# and emoji sequences need, so the only ones a name may hold.
_JOINERS = frozenset("\u200c\u200d")


def organization_name(name: str | None) -> str:
    """``name`` stripped; raises TenancyError when it is empty, over 200 characters, holds
    a control character (a line break, a tab: it goes into mail subjects and headers, where
    a line break is refused and would start a header of its own), an invisible formatting
    character (Unicode category Cf but the two joiners: a right-to-left override makes
    "elgooG" read "Google", tag characters carry hidden text), or no visible character
    (a letter, digit, punctuation mark or symbol; not a blank look-alike). The rule of every
    way a name is stored: create, rename and the Django admin's change form."""
    name = (name or "").strip()
    if not name:
        raise TenancyError("name must not be empty")
    if len(name) > 200:
        raise TenancyError("name must be 1 to 200 characters")
    if any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in name):
        raise TenancyError("name must not contain control characters such as line breaks or tabs")
    if any((unicodedata.category(c) == "Cf" and c not in _JOINERS) or c in _BLANK_LOOKALIKES for c in name):
        raise TenancyError("name must not contain invisible characters that reorder or hide text (such as "
                           "right-to-left overrides, zero-width spaces or tag characters)")
    if not any(unicodedata.category(c)[0] in "LNPS" for c in name):
        raise TenancyError("name must contain a visible character (a letter, digit, punctuation mark or symbol)")
    return name


def create_organization_for(*, user: User, slug: str, name: str) -> Organization:
    """Create an organization owned by ``user`` (the web UI's "new organization")."""
    slug = organization_slug(slug)
    name = organization_name(name)
    taken = TenancyError(f"an organization with slug {slug!r} already exists")
    if Organization.objects.filter(slug=slug).exists():
        raise taken
    try:
        with transaction.atomic():
            org = Organization.objects.create(slug=slug, name=name)
            Membership.objects.create(organization=org, user=user, role=Role.OWNER)
            audit.record("organization.created", organization=org, user=user, target=org,
                         metadata={"slug": org.slug, "name": org.name})
    except IntegrityError as exc:  # a concurrent create won the slug between the check and the insert
        raise taken from exc
    return org


def rename_organization(*, actor: Actor, name: str) -> Organization:
    """Rename the actor's organization (owners only). Records ``organization.renamed``.
    Raises Forbidden or TenancyError (empty, over 200 characters, or a control character)."""
    require(actor.role, Action.ORG_MANAGE)
    name = organization_name(name)
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
    last owner cannot be demoted. A demotion revokes the member's pending invitations to
    a role above the new one, or all of them when the new role cannot invite
    (``invitation.revoked``, reason ``sender_demoted``).
    Raises Forbidden or TenancyError."""
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
            if ROLE_RANK[role] < ROLE_RANK[before]:
                # A role that can no longer invite withdraws every pending invitation; one
                # that still can withdraws those above it.
                _revoke_invitations_sent_by(actor=actor, membership=current, reason="sender_demoted",
                                            above=role if can(role, Action.MEMBER_MANAGE) else None)
    return current


def remove_member(*, actor: Actor, membership: Membership) -> None:
    """Remove ``membership`` (another member, or the actor leaving). Managing others
    needs member.manage; removing an owner needs an owner; the last owner can neither
    be removed nor leave.

    In the same transaction: the member's pending invitations in the organization are
    revoked (``invitation.revoked``, reason ``sender_removed``/``sender_left``, actor =
    ``actor``), so are the API keys they created there (``api_key.revoked``, reason
    ``creator_removed``/``creator_left``: a re-invited member does not get them back), and
    ``tenancy.signals.member_departed`` is sent (the engine pauses the member's cron
    triggers)."""
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
        # The authority the member delegated leaves with them (issue 14, finding 4): their
        # pending invitations, then their API keys (which a re-invitation must not revive).
        _revoke_invitations_sent_by(actor=actor, membership=current,
                                    reason="sender_left" if leaving else "sender_removed")
        from tenancy.apikeys import revoke_keys_of_departing_member  # (tenancy.apikeys imports this module)

        revoke_keys_of_departing_member(actor=actor, membership=current,
                                        reason="creator_left" if leaving else "creator_removed")
        current.delete()
        member_departed.send(sender=Membership, actor=actor, membership=current,
                             reason="left" if leaving else "removed")


def _revoke_invitations_sent_by(*, actor: Actor, membership: Membership, reason: str,
                                above: str | None = None) -> int:
    """Revoke the pending invitations ``membership.user`` sent in its organization — all of
    them, or with ``above`` only those inviting to a role above it — each with an
    ``invitation.revoked`` record (actor = ``actor``, ``reason`` stated). Called inside the
    transaction of the removal or demotion, with the memberships locked. Returns the count.
    """
    pending = Invitation.objects.for_organization(membership.organization_id).select_for_update().filter(
        invited_by_id=membership.user_id, accepted_at__isnull=True, revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).order_by("created_at", "id")
    now = timezone.now()
    revoked = 0
    for inv in pending:
        if above is not None and ROLE_RANK[inv.role] <= ROLE_RANK[above]:
            continue
        inv.revoked_at = now
        inv.save(update_fields=["revoked_at"])
        audit.record("invitation.revoked", actor=actor, organization=membership.organization_id, target=inv,
                     metadata={"email": inv.email, "role": inv.role, "reason": reason,
                               "invited_by": membership.user.email})
        revoked += 1
    return revoked


def _key_still_usable(api_key_id) -> bool:
    """True when the API key ``api_key_id`` is neither revoked nor expired (read from the
    database, never the verified-key cache)."""
    now = timezone.now()
    return ApiKey.objects.unscoped().filter(pk=api_key_id, revoked_at__isnull=True).exclude(
        expires_at__lte=now).exists()


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invite_member(*, actor: Actor, email: str, role: str = Role.MEMBER) -> tuple[Invitation, str]:
    """Invite ``email`` with ``role``. Returns (invitation, token); the token is shown
    or mailed once and only its hash is stored. A pending invitation to the same
    address is replaced. Raises Forbidden (inviting an owner needs an owner),
    TenancyError (already a member, malformed address) or QuotaExceeded (the send limits
    of ``_check_invitation_limits``); nothing is written when it raises."""
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
    inviter = actor.user or getattr(actor.api_key, "created_by", None)
    with transaction.atomic():
        if Membership.objects.for_organization(org).filter(user__email=email).exists():
            raise TenancyError(f"{email} is already a member")
        now = timezone.now()
        _check_invitation_limits(org, inviter, now, by_api_key=actor.user is None)
        Invitation.objects.for_organization(org).filter(
            email=email, accepted_at__isnull=True, revoked_at__isnull=True
        ).update(revoked_at=now)
        invitation = Invitation.objects.create(
            organization=org,
            email=email,
            role=role,
            token_hash=_token_hash(token),
            # An API key invites on its creator's authority (as the mail says), so the
            # acceptance is capped by that person's role, like the key itself.
            invited_by=inviter,
            invited_by_api_key_id=getattr(actor.api_key, "id", None),
            expires_at=now + dt.timedelta(seconds=INVITATION_TTL_SECONDS),
        )
        audit.record("invitation.sent", actor=actor, target=invitation,
                     metadata={"email": email, "role": role, "expires_at": invitation.expires_at.isoformat()})
    return invitation, token


def _check_invitation_limits(org: Organization, inviter: User | None, now: dt.datetime, *,
                             by_api_key: bool = False) -> None:
    """Refuse a new invitation when ``org`` has sent FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG in
    the last 24 hours, or ``inviter`` (the person, or an API key's creator) has sent
    FLOWFORGE_INVITATIONS_PER_DAY_PER_USER in that time in any organization (0: that limit is
    off): raises QuotaExceeded (limit ``invitations_per_day`` or
    ``invitations_per_day_per_user``) with the seconds until enough counted ones have left the
    window for one more. Counted from the stored invitations, whatever became of them, under
    a transaction lock per organization and per person, so two requests at once cannot both
    take the last one. When both are spent, the one that lasts longer is raised. For an API
    key (``by_api_key``) the per-person refusal does not say how many its creator sent, and
    its wait is rounded up to the hour, so that the key's holder does not learn what its
    creator did in organizations the holder may not see. Call inside the inviting
    transaction, before anything is written."""
    since = now - INVITATION_LIMIT_WINDOW
    # The organization's lock even with its limit off: it also keeps two invitations of the
    # same address at once from both replacing the pending one (uniq_invitation_pending).
    checks = [("invitations_per_day", f"organization:{org.pk}", settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_ORG,
               Invitation.objects.for_organization(org))]
    if inviter is not None:
        checks.append(("invitations_per_day_per_user", f"user:{inviter.pk}",
                       settings.FLOWFORGE_INVITATIONS_PER_DAY_PER_USER,
                       Invitation.objects.unscoped().filter(invited_by=inviter)))
    refusals = []
    for limit, lock, allowed, rows in checks:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"flowforge.invite:{lock}"])
        if allowed <= 0:  # that limit is off
            continue
        recent = rows.filter(created_at__gt=since).order_by("created_at").values_list("created_at", flat=True)
        used = recent.count()
        if used < allowed:
            continue
        retry = max(1.0, (recent[used - allowed] + INVITATION_LIMIT_WINDOW - now).total_seconds())
        sent = f"sent {used} invitation{'s' if used != 1 else ''} in the last 24 hours"
        if limit == "invitations_per_day":
            what = f"this organization has {sent}, the most allowed ({allowed})"
        elif by_api_key:
            # Neither the count nor, closer than the hour, the time of what its creator sent
            # in organizations the key's holder may not see.
            what = f"the person this API key acts for has sent the most invitations one person may in 24 hours ({allowed})"
            used, retry = allowed, math.ceil(retry / 3600) * 3600.0
        else:
            what = f"you have {sent} across your organizations, the most allowed ({allowed})"
        refusals.append((retry, what, limit, allowed, used))
    if refusals:
        # Both spent: the one that lasts longer, so that a retry after Retry-After is let in.
        retry, what, limit, allowed, used = max(refusals)
        raise QuotaExceeded(f"{what}; the next can be sent in {_wait_text(retry)}",
                            limit=limit, allowed=allowed, used=used, retry_after_seconds=retry)


def _wait_text(seconds: float) -> str:
    """``seconds`` (> 0) rounded up to a whole minute, in words: "1 minute", "59 minutes",
    "2 hours", "2 hours 1 minute"."""
    minutes = math.ceil(seconds / 60)
    hours, rest = divmod(minutes, 60)
    parts = ([f"{hours} hour{'s' if hours != 1 else ''}"] if hours else []) + (
        [f"{rest} minute{'s' if rest != 1 else ''}"] if rest or not hours else [])
    return " ".join(parts)


def purge_stale_invitations(*, batch_size: int = 5000, max_batches: int = 200) -> int:
    """Delete the invitations that expired unused, or were revoked, more than
    STALE_INVITATION_AGE ago, in batches of ``batch_size`` (one short transaction each), at
    most ``max_batches`` per call; returns how many were deleted. Accepted ones are kept
    (one per member: who invited whom). Without this an unused invitation stayed forever,
    in every later page of its organization's pending list (read past) and in the send
    limits' counts. For the clock's housekeeping; a system sweep over every organization."""
    cutoff = timezone.now() - STALE_INVITATION_AGE
    stale = Invitation.objects.unscoped().filter(accepted_at__isnull=True).filter(
        Q(revoked_at__lt=cutoff) | Q(revoked_at__isnull=True, expires_at__lt=cutoff))
    total = 0
    for _ in range(max_batches):
        with transaction.atomic():
            ids = list(stale.values_list("id", flat=True)[:batch_size])
            deleted, _ = Invitation.objects.unscoped().filter(pk__in=ids).delete() if ids else (0, {})
        total += deleted
        if len(ids) < batch_size:
            break
    return total


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

    The role given is the invitation's, capped at its sender's *current* role in the
    organization (``tenancy.authority.cap_to_grantor``, the rule API keys follow): a
    sender demoted since sending gives at most their new role; a sender who is no
    longer a member gives nothing and the acceptance is refused. The sender's
    membership is locked first, so a concurrent demotion or removal either happens
    before (and is seen here) or waits until this acceptance has committed.

    Raises TenancyError when the token is unknown, expired, already used or revoked,
    the signed-in address is not the invited one (or not verified), the sender is no
    longer a member or may no longer invite members, or the API key it was sent with
    was revoked or has expired. A refused use of a real invitation is itself recorded
    (``invitation.refused_use``, with the reason), committed even though the
    acceptance is not.
    """
    refusal: tuple[Invitation, str, str] | None = None
    with transaction.atomic():
        found = find_invitation(token)
        if found is None:
            raise TenancyError(UNKNOWN_INVITATION)
        # Lock order memberships -> invitation, as change_role and remove_member take them.
        grant = cap_to_grantor(found.role, organization_id=found.organization_id,
                               grantor_id=found.invited_by_id, lock=True)
        inv = Invitation.objects.unscoped().select_for_update().select_related("organization").get(pk=found.pk)
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
        elif grant is None:
            refusal = (inv, "sender_not_a_member",
                       f"the person who sent this invitation is no longer a member of {inv.organization.name}; "
                       "ask for a new invitation")
        elif not can(grant.membership.role, Action.MEMBER_MANAGE):
            refusal = (inv, "sender_cannot_invite",
                       f"the person who sent this invitation can no longer invite members to "
                       f"{inv.organization.name}; ask for a new invitation")
        elif inv.invited_by_api_key_id is not None and not _key_still_usable(inv.invited_by_api_key_id):
            refusal = (inv, "sender_key_revoked",
                       "the API key this invitation was sent with has been revoked or has expired; "
                       "ask for a new invitation")
        if refusal is None:
            membership, _created = Membership.objects.get_or_create(
                organization_id=inv.organization_id, user=user, defaults={"role": grant.role}
            )
            inv.accepted_at = timezone.now()
            inv.accepted_by = user
            inv.save(update_fields=["accepted_at", "accepted_by"])
            audit.record(
                "invitation.accepted", organization=inv.organization_id, user=user, target=inv,
                metadata={"email": inv.email, "role": membership.role, "invited_role": inv.role,
                          "invited_by": grant.membership.user.email},
            )
            return membership
    inv, reason, message = refusal
    with transaction.atomic():
        audit.record(
            "invitation.refused_use", organization=inv.organization_id, user=user, target=inv,
            metadata={"reason": reason, "email": inv.email},
        )
    raise TenancyError(message)
