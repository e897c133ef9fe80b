"""The invitation accept page, reached from the emailed link ``/invitations/<token>/``.

GET shows the organization and role (to anyone holding the link: the token is the
credential). POST accepts it for the signed-in user; an anonymous visitor signs in or
signs up first and comes back through ``?next=``.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from tenancy.authority import cap_to_grantor
from tenancy.context import choose_organization
from tenancy.models import Invitation
from tenancy.services import UNKNOWN_INVITATION, TenancyError, accept_invitation, find_invitation


def _refusal(invitation: Invitation | None, user) -> str | None:
    """Why ``user`` cannot accept ``invitation``, for the GET page only.

    The POST takes its answer from accept_invitation itself; this mirrors its checks
    (and their wording) so the page does not offer an Accept button that would fail.
    """
    if invitation is None:
        return UNKNOWN_INVITATION
    if invitation.accepted_at is not None:
        return "this invitation has already been used"
    if invitation.revoked_at is not None:
        return "this invitation was withdrawn"
    if invitation.expires_at <= timezone.now():
        return "this invitation has expired; ask for a new one"
    if user.is_authenticated and invitation.email != user.email.lower():
        return f"this invitation is for {invitation.email}; sign in with that address to accept it"
    if cap_to_grantor(invitation.role, organization_id=invitation.organization_id,
                      grantor_id=invitation.invited_by_id) is None:
        return (f"the person who sent this invitation is no longer a member of {invitation.organization.name}; "
                "ask for a new invitation")
    return None


@never_cache
@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """Accept an invitation. On success its organization becomes the session's active one.

    Refusals (unknown, expired, used, withdrawn, another address) render the reason
    with status 400.
    """
    invitation = find_invitation(token)
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        try:
            membership = accept_invitation(token=token, user=request.user)
        except TenancyError as exc:
            return render(
                request, "frontend/invitation.html", {"invitation": invitation, "error": str(exc)}, status=400
            )
        choose_organization(request, membership)
        messages.success(
            request, f"You joined {invitation.organization.name} as {membership.get_role_display()}."
        )
        return redirect("frontend:home")

    error = _refusal(invitation, request.user)
    return render(
        request,
        "frontend/invitation.html",
        {"invitation": invitation, "error": error},
        status=400 if error else 200,
    )
