"""Delegated authority: a role granted by someone is never more than the granter holds now.

An API key and an invitation both carry a role chosen by the member who made them. The
rule for both is one function, ``cap_to_grantor``: what the grant gives *now* is the
lesser of its own role and the granter's **current** role in the grant's organization,
and nothing at all once the granter is no longer an active member of it. A key reads
it on every request; an invitation reads it when it is accepted.
"""

from __future__ import annotations

import dataclasses

from django.db.models import Exists

from tenancy.models import ApiKey, KeyRole, Membership, without_credentials
from tenancy.permissions import Action, can, min_role


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a grant of some role by ``membership.user`` gives now.

    ``membership`` is the granter's current membership (organization and user loaded);
    ``role`` the lesser of the requested role and ``membership.role``.
    """

    membership: Membership
    role: str


def cap_to_grantor(role: str, *, organization_id, grantor_id, lock: bool = False,
                   unrevoked_key_id=None) -> Grant | None:
    """The role a grant of ``role`` made by user ``grantor_id`` in ``organization_id`` gives now.

    Returns None when the granter is unknown (``grantor_id`` None: the user was deleted),
    is not a member of that organization (removed, left; a membership elsewhere does not
    count) or is deactivated, and for a ``worker`` grant when the granter may no longer
    manage API keys (demoted below admin). ``lock=True`` takes a row lock on the granter's membership
    (inside a transaction), so a concurrent role change or removal waits for the caller.
    With ``unrevoked_key_id``, also None when that API key is revoked or gone, read in the
    same query (a cached key's request: tenancy.apikeys).
    """
    if grantor_id is None:
        return None
    memberships = without_credentials(Membership.objects.for_organization(organization_id), "organization", "user")
    if unrevoked_key_id is not None:
        memberships = memberships.annotate(key_unrevoked=Exists(
            ApiKey.objects.unscoped().filter(pk=unrevoked_key_id, revoked_at__isnull=True)))
    if lock:
        memberships = memberships.select_for_update(of=("self",))
    membership = memberships.filter(user_id=grantor_id).first()
    if membership is None or not membership.user.is_active:
        return None
    if unrevoked_key_id is not None and not membership.key_unrevoked:
        return None
    if role == KeyRole.WORKER and not can(membership.role, Action.APIKEY_MANAGE):
        # A worker key acts as a worker whatever its creator's role, and is handed the
        # organization's secrets in its tasks' inputs: it lasts only while its creator may
        # still make one (a demoted admin's worker keys stop, as a removed one's do).
        return None
    return Grant(membership=membership, role=min_role(role, membership.role))
