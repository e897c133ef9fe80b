"""Template context for the header shown on every page (allauth's included)."""

from __future__ import annotations

from functools import cached_property

from django.http import HttpRequest

from frontend.organization import my_memberships
from tenancy.context import OrganizationNotFound, OrganizationRequired, resolve_membership
from tenancy.models import Membership, Role
from tenancy.permissions import Action, can


class Navigation:
    """The signed-in user's active membership and the organizations to switch to.

    Lazy: nothing is queried until a template asks, and a page whose view already
    resolved the membership (``request.membership``) reuses it.
    """

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        user = getattr(request, "user", None)
        self._user = user if user is not None and user.is_authenticated else None

    @cached_property
    def membership(self) -> Membership | None:
        """The active membership, or None (signed out, or no organization chosen)."""
        if hasattr(self._request, "membership"):  # the view resolved it already (maybe to None)
            return self._request.membership
        if self._user is None:
            return None
        try:
            return resolve_membership(self._request, self._user)
        except (OrganizationRequired, OrganizationNotFound):
            return None

    @cached_property
    def memberships(self) -> list[Membership]:
        """Every membership of the signed-in user (empty when signed out)."""
        return [] if self._user is None else list(my_memberships(self._user))

    @cached_property
    def can(self) -> dict[str, bool]:
        """What the active membership's role may do, by action (tenancy.permissions.Action's
        member names in lower case): ``{% if nav.can.audit_read %}``. All False without an
        active membership. The header shows a section's link only where its page would open:
        the pages still check the permission themselves."""
        role = self.membership.role if self.membership is not None else None
        return {action.name.lower(): can(role, action) for action in Action}

    @property
    def can_manage_members(self) -> bool:
        return self.membership is not None and can(self.membership.role, Action.MEMBER_MANAGE)

    @property
    def is_owner(self) -> bool:
        return self.membership is not None and self.membership.role == Role.OWNER


def navigation(request: HttpRequest) -> dict[str, Navigation]:
    """``nav``: see Navigation."""
    return {"nav": Navigation(request)}
