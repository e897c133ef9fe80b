"""Reading one tenant object by id, for the API and the web UI (after Zulip's ``access_*_by_id``).

Every ``access_*`` helper takes the actor (or the organization, or its id) the caller acts
for and an id, and returns the object only when it belongs to that organization. A
missing id, another organization's id and a malformed id all raise the same
ObjectNotFound with the same message, so an id never confirms that another tenant has
it. ObjectNotFound is an Http404: the web UI answers it with its 404 page, the API with
its 404 problem (api.exceptions maps every Http404 to the same body).

``shape`` lets a caller add ``select_related``/``prefetch_related``/``only`` to the
scoped queryset the helper builds; the scoping itself is always the helper's.

This module holds the helper machinery and the tenancy objects (members, invitations,
API keys); engine.access holds the engine's (runs, workflows, task runs, triggers).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import Model, QuerySet
from django.http import Http404

from tenancy.models import ApiKey, Invitation, Membership, without_credentials

# Adds joins, prefetches or column choices to a scoped queryset; must not widen it.
Shape = Callable[[QuerySet], QuerySet]


class ObjectNotFound(Http404):
    """No such object in the caller's organization: missing, another organization's, or
    not an id at all (one error for all three)."""


def organization_id_of(actor_or_org: Any) -> uuid.UUID:
    """The organization id of an Actor (``.organization``), an Organization, or an id.

    Raises ValueError for None: a read with no organization is a bug, not a 404."""
    organization = getattr(actor_or_org, "organization", actor_or_org)
    if organization is None:
        raise ValueError("an access helper needs an actor or an organization")
    return getattr(organization, "pk", organization)


def parse_id(raw: Any) -> uuid.UUID | None:
    """``raw`` as a UUID (a UUID or its text), None when it is not one."""
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except (TypeError, ValueError, AttributeError):
        return None


def access_by_id[M: Model](model: type[M], actor_or_org: Any, object_id: Any, *, what: str,
                 shape: Shape | None = None, **filters: Any) -> M:
    """The ``model`` row ``object_id`` of the caller's organization, also matching
    ``filters`` (e.g. the run a task run must belong to).

    Raises ObjectNotFound("no such <what>") when it does not exist, belongs to another
    organization, fails ``filters`` or ``object_id`` is not a UUID. One query."""
    pk = parse_id(object_id)
    if pk is None:
        raise ObjectNotFound(f"no such {what}")
    qs = model.objects.for_organization(organization_id_of(actor_or_org))
    if shape is not None:
        qs = shape(qs)
    try:
        return qs.filter(**filters).get(pk=pk)
    except model.DoesNotExist:
        raise ObjectNotFound(f"no such {what}") from None


def access_membership(actor_or_org: Any, membership_id: Any, *, shape: Shape | None = None) -> Membership:
    """The membership ``membership_id`` of the organization, with its user; ObjectNotFound otherwise."""
    return access_by_id(Membership, actor_or_org, membership_id, what="member",
                        shape=lambda qs: without_credentials(shape(qs) if shape else qs, "user"))


def access_invitation(actor_or_org: Any, invitation_id: Any, *, shape: Shape | None = None) -> Invitation:
    """The invitation ``invitation_id`` of the organization (any state); ObjectNotFound otherwise."""
    return access_by_id(Invitation, actor_or_org, invitation_id, what="invitation", shape=shape)


def access_api_key(actor_or_org: Any, api_key_id: Any, *, shape: Shape | None = None) -> ApiKey:
    """The API key ``api_key_id`` of the organization (active or not), with its creator;
    ObjectNotFound otherwise."""
    return access_by_id(ApiKey, actor_or_org, api_key_id, what="API key",
                        shape=lambda qs: without_credentials(shape(qs) if shape else qs, "created_by"))
