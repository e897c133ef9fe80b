"""Which tenancy Action an API request needs, and the check (the matrix itself is
tenancy.permissions; this module only maps HTTP methods onto it)."""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework.exceptions import PermissionDenied

from tenancy.actors import Actor
from tenancy.permissions import Action, can, who_may

# Methods whose handlers a view must give a required action (OPTIONS and HEAD are derived).
HANDLED_METHODS = ("get", "post", "put", "patch", "delete")


def action_for_method(required_action: Mapping[str, Action], method: str) -> Action | None:
    """The action ``method`` needs under ``required_action`` (keys are upper-case
    method names). HEAD needs what GET needs; OPTIONS needs READ. None when the view
    declares nothing for the method (the caller refuses)."""
    method = method.upper()
    if method == "HEAD":
        method = "GET"
    if method == "OPTIONS":
        return Action.READ
    return required_action.get(method)


def require_action(actor: Actor, action: Action | None) -> None:
    """Raise PermissionDenied (403) unless ``actor``'s effective role allows ``action``.

    A method without a declared action is refused (fail closed); api.base also
    refuses such a view class when it is defined.
    """
    if action is None:
        raise PermissionDenied("This method is not allowed for any role.")
    if not can(actor.role, action):
        raise PermissionDenied(f"Your role ({actor.role or 'none'}) may not do this: it needs {who_may(action)}.")
