"""Which organization a request acts in (seed 000, "Tenancy and security").

- An API key fixes the organization (the key's own).
- A signed-in user chooses among their memberships: the ``X-Organization`` header
  (slug or id), else the organization chosen in the browser session, else their
  sole membership. When none applies the caller gets a 400 that says how to choose.

An organization the user is not a member of is reported exactly like one that does
not exist (404), so an id or slug never confirms another tenant's existence.
"""

from __future__ import annotations

import uuid

from django.db.models import Q

from tenancy.actors import Actor
from tenancy.models import Membership, without_credentials

SESSION_KEY = "flowforge_organization_id"
HEADER = "X-Organization"


class OrganizationRequired(Exception):
    """No organization could be chosen (400). The message says how to choose one."""


class OrganizationNotFound(Exception):
    """The named organization does not exist or the user is not a member (404)."""


def _membership_q(value: str) -> Q:
    try:
        return Q(organization_id=uuid.UUID(value))
    except ValueError:
        return Q(organization__slug=value)


def resolve_membership(request, user) -> Membership:
    """The membership ``user`` acts through for ``request``.

    Raises OrganizationNotFound when the header or session names an organization the
    user does not belong to, and OrganizationRequired when the user has several
    memberships (or none) and did not choose.
    """
    # A user's own memberships: scoped by the user, across the organizations they belong to.
    mine = without_credentials(Membership.objects.unscoped().filter(user=user), "organization", "user")
    header = (request.headers.get(HEADER) or "").strip()
    if header:
        found = mine.filter(_membership_q(header)).first()
        if found is None:
            raise OrganizationNotFound(f"no organization {header!r}")
        return found
    session = getattr(request, "session", None)
    chosen = session.get(SESSION_KEY) if session is not None else None
    if chosen:
        found = mine.filter(organization_id=chosen).first()
        if found is not None:
            return found
        session.pop(SESSION_KEY, None)  # membership gone: forget the stale choice
    first_two = list(mine.order_by("organization__slug")[:2])
    if len(first_two) == 1:
        return first_two[0]
    if not first_two:
        raise OrganizationRequired("you are not a member of any organization; create one or accept an invitation")
    raise OrganizationRequired(
        f"you belong to several organizations: send the {HEADER} header with an organization's slug or id "
        "(or choose one in the web UI)"
    )


def choose_organization(request, membership: Membership) -> None:
    """Remember ``membership``'s organization as the browser session's active one."""
    request.session[SESSION_KEY] = str(membership.organization_id)


def actor_for_membership(membership: Membership, *, channel: str = "web") -> Actor:
    return Actor(organization=membership.organization, role=membership.role, user=membership.user, channel=channel)
