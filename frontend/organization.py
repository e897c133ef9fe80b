"""The active organization of a browser request, for the pages (tenancy.context).

``organization_required`` is the one gate every organization page goes through: it
requires a signed-in user, resolves the membership the request acts through (the
session's choice, else the sole membership) and leaves it on the request as
``request.membership`` and ``request.actor``. A user with several memberships and no
choice is sent to the organization picker; a user with none, to "new organization".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from tenancy.context import (
    OrganizationNotFound,
    OrganizationRequired,
    actor_for_membership,
    resolve_membership,
)
from tenancy.models import Membership


def my_memberships(user) -> QuerySet[Membership]:
    """``user``'s memberships in every organization they belong to, by organization name.

    Scoped by the user rather than by one organization: the organization list and the
    switcher are the only places that read across the user's organizations.
    """
    return (
        Membership.objects.unscoped()
        .filter(user=user)
        .select_related("organization")
        .order_by("organization__name", "organization__slug")
    )


def safe_next(request: HttpRequest) -> str | None:
    """The ``next`` parameter (POST, else GET) when it is a path on this site, else None."""
    target = request.POST.get("next") or request.GET.get("next")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return None


def organization_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a page that acts in the active organization (see the module docstring).

    Raises Http404 when the ``X-Organization`` header names an organization the user
    is not a member of (the same answer as one that does not exist).
    """

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            membership = resolve_membership(request, request.user)
        except OrganizationNotFound as exc:
            raise Http404(str(exc)) from None
        except OrganizationRequired:
            if my_memberships(request.user).exists():
                url = reverse("frontend:orgs")
                # Only a GET is worth coming back to; a POST's form is gone by then.
                if request.method == "GET":
                    url = f"{url}?{urlencode({'next': request.get_full_path()})}"
                return HttpResponseRedirect(url)
            return HttpResponseRedirect(reverse("frontend:org_new"))
        # resolve_membership filtered on this user: reuse it instead of loading it again.
        membership.user = request.user
        request.membership = membership
        request.actor = actor_for_membership(membership, channel="web")
        return view(request, *args, **kwargs)

    return wrapper
