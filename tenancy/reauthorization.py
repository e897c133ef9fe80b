"""Checks that a long-lived request (a server-sent event stream) may still act as it did
when it was authorized: run again while it lasts (engine.live_limits.StreamLease).

Both read the database directly, never the cache of verified API keys
(tenancy.apikeys): a key revoked a moment ago must fail at once, on every process.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from tenancy.models import ApiKey, Membership


def api_key_still_valid(*, key_id, organization_id) -> bool:
    """True while the API key ``key_id`` of ``organization_id`` would still authenticate:
    not revoked, not expired, its organization still exists (the key row goes with it),
    and its creator is still an active member of that organization
    (tenancy.apikeys.authenticate refuses a key whose creator left)."""
    creator_is_member = Membership.objects.for_organization(organization_id).filter(
        user_id=OuterRef("created_by_id"), user__is_active=True)
    return (
        ApiKey.objects.for_organization(organization_id)
        .filter(pk=key_id, revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .filter(Exists(creator_is_member))
        .exists()
    )


def member_still_active(*, user_id, organization_id) -> bool:
    """True while the user ``user_id`` is active and a member of ``organization_id``
    (a removed member, a deactivated account or a deleted organization: False)."""
    return Membership.objects.for_organization(organization_id).filter(user_id=user_id, user__is_active=True).exists()
