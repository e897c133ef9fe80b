"""Members of the active organization: list, invite, change role, remove, leave,
withdraw an invitation.

Every object id in a URL is looked up in the active organization only, before any
permission check, so another organization's id is a 404 and never a 403.
Permission refusals (tenancy.permissions.Forbidden) are a 403 page; rule refusals
(tenancy.services.TenancyError) are shown as a message and change nothing.
"""

from __future__ import annotations

import dataclasses
import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from frontend.forms import InviteForm, RoleForm, offered_roles
from frontend.organization import organization_required
from frontend.templatetags.frontend import sentence
from tenancy.access import access_invitation, access_membership
from tenancy.limits import QuotaExceeded
from tenancy.mail import send_invitation_email
from tenancy.models import Invitation, Membership, Role, without_credentials
from tenancy.permissions import Action, Forbidden, can, require
from tenancy.services import TenancyError, change_role, invite_member, remove_member, revoke_invitation


@dataclasses.dataclass(frozen=True)
class MemberRow:
    """One line of the member list, with the controls the viewer may use on it."""

    membership: Membership
    is_self: bool
    can_change_role: bool
    can_remove: bool


def _authorize(role: str | None, action: Action) -> None:
    """Raise PermissionDenied (the 403 page, with the reason) unless ``role`` may ``action``."""
    try:
        require(role, action)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None


def _membership_or_404(request: HttpRequest, membership_id: uuid.UUID) -> Membership:
    """The active organization's membership (tenancy.access: a 404 for a missing or foreign id)."""
    return access_membership(request.membership.organization, membership_id)


def _render_members(
    request: HttpRequest, *, invite_form: InviteForm | None = None, status: int = 200
) -> HttpResponse:
    me = request.membership
    org = me.organization
    manage = can(me.role, Action.MEMBER_MANAGE)
    owner = me.role == Role.OWNER
    rows = []
    for m in without_credentials(Membership.objects.for_organization(org), "user").order_by("user__email"):
        # Only an owner touches an owner's membership (tenancy.services enforces it too).
        reachable = manage and (m.role != Role.OWNER or owner)
        rows.append(
            MemberRow(
                membership=m,
                is_self=m.pk == me.pk,
                can_change_role=reachable,
                can_remove=reachable and m.pk != me.pk,
            )
        )
    invitations = list(
        without_credentials(Invitation.objects.for_organization(org)
                            .filter(accepted_at__isnull=True, revoked_at__isnull=True), "invited_by")
        .order_by("-created_at")
    )
    if manage and invite_form is None:
        invite_form = InviteForm(actor_role=me.role)
    context = {
        "membership": me,
        "organization": org,
        "rows": rows,
        "invitations": invitations,
        "can_manage": manage,
        "role_choices": offered_roles(me.role),
        "invite_form": invite_form if manage else None,
    }
    return render(request, "frontend/members.html", context, status=status)


@require_GET
@organization_required
def member_list(request: HttpRequest) -> HttpResponse:
    return _render_members(request)


@transaction.non_atomic_requests
@require_POST
@organization_required
def member_invite(request: HttpRequest) -> HttpResponse:
    """Invite an address with a role and mail it the accept link, once the invitation has
    committed: not inside the request's transaction, whose locks (the invitation send
    limits' per organization and per person) a slow mail server would otherwise hold."""
    actor = request.actor
    _authorize(actor.role, Action.MEMBER_MANAGE)
    form = InviteForm(request.POST, actor_role=actor.role)
    if form.is_valid():
        try:
            invitation, token = invite_member(
                actor=actor, email=form.cleaned_data["email"], role=form.cleaned_data["role"]
            )
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except TenancyError as exc:
            form.add_error("role" if str(exc).startswith("role") else "email", str(exc))
        except QuotaExceeded as exc:  # the invitation send limits
            form.add_error(None, sentence(str(exc)))
        else:
            # invite_member has committed: the mail goes out for an invitation that exists.
            if send_invitation_email(request, invitation=invitation, token=token):
                messages.success(
                    request, f"Invitation sent to {invitation.email} as {invitation.get_role_display()}."
                )
            else:
                messages.warning(
                    request,
                    f"The invitation for {invitation.email} was created but the email could not be sent; "
                    "invite the address again to send a new link (each invitation counts toward the daily "
                    "invitation limits).",
                )
            return redirect("frontend:members")
    return _render_members(request, invite_form=form, status=400)


@require_POST
@organization_required
def member_change_role(request: HttpRequest, membership_id: uuid.UUID) -> HttpResponse:
    target = _membership_or_404(request, membership_id)
    _authorize(request.actor.role, Action.MEMBER_MANAGE)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles owner, admin, member or viewer.")
        return redirect("frontend:members")
    try:
        changed = change_role(actor=request.actor, membership=target, role=form.cleaned_data["role"])
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except TenancyError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{target.user.email} is now {changed.get_role_display()}.")
    return redirect("frontend:members")


def _remove(request: HttpRequest, target: Membership) -> HttpResponse:
    leaving = target.user_id == request.user.pk
    if not leaving:
        _authorize(request.actor.role, Action.MEMBER_MANAGE)
    try:
        remove_member(actor=request.actor, membership=target)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except TenancyError as exc:
        messages.error(request, str(exc))
        return redirect("frontend:members")
    if leaving:
        messages.success(request, f"You left {request.membership.organization.name}.")
        return redirect("frontend:orgs")
    messages.success(request, f"{target.user.email} was removed from {request.membership.organization.name}.")
    return redirect("frontend:members")


def _confirm(request: HttpRequest, *, title: str, lines: list[str], button: str) -> HttpResponse:
    """The confirmation step of a destructive action (a page, no JavaScript needed): its
    button posts to the same URL, which acts; Cancel goes back to the member list. Without
    a ``button`` the page only explains why the action cannot be taken."""
    from django.urls import reverse

    return render(request, "frontend/confirm.html", {
        "title": title, "lines": lines, "button": button, "action": request.path,
        "cancel": reverse("frontend:members")})


def _confirm_remove(request: HttpRequest, target: Membership) -> HttpResponse:
    org = request.membership.organization
    if target.user_id == request.user.pk:
        if target.role == Role.OWNER and not Membership.objects.for_organization(org).filter(
                role=Role.OWNER).exclude(pk=target.pk).exists():
            # Said before the button, not after it: leaving would be refused.
            return _confirm(request, title=f"You cannot leave {org.name} yet", button="", lines=[
                f"You are {org.name}'s only owner, and an organization always keeps one.",
                "Make another member an owner first (on the members page), then leave."])
        return _confirm(request, title=f"Leave {org.name}?", button="Leave organization", lines=[
            f"You lose access to {org.name}'s workflows, runs and settings at once; only a new "
            "invitation brings you back.",
            "Invitations you sent that are still pending are withdrawn, and cron triggers you "
            "created are paused."])
    _authorize(request.actor.role, Action.MEMBER_MANAGE)
    return _confirm(request, title=f"Remove {target.user.email} from {org.name}?", button="Remove member", lines=[
        f"{target.user.email} ({target.get_role_display()}) loses access to {org.name} at once; "
        "their pending invitations are withdrawn and the cron triggers they created are paused."])


@require_http_methods(["GET", "POST"])
@organization_required
def member_remove(request: HttpRequest, membership_id: uuid.UUID) -> HttpResponse:
    """GET: ask to confirm; POST: remove a member (or leave, when the id is the signed-in user's own)."""
    target = _membership_or_404(request, membership_id)
    if request.method == "GET":
        return _confirm_remove(request, target)
    return _remove(request, target)


@require_http_methods(["GET", "POST"])
@organization_required
def member_leave(request: HttpRequest) -> HttpResponse:
    """GET: ask to confirm; POST: leave the active organization (any role; the last owner cannot)."""
    if request.method == "GET":
        return _confirm_remove(request, request.membership)
    return _remove(request, request.membership)


@require_http_methods(["GET", "POST"])
@organization_required
def invitation_revoke(request: HttpRequest, invitation_id: uuid.UUID) -> HttpResponse:
    """GET: ask to confirm; POST: withdraw a pending invitation."""
    invitation = access_invitation(request.membership.organization, invitation_id)
    _authorize(request.actor.role, Action.MEMBER_MANAGE)
    if request.method == "GET" and invitation.accepted_at is None and invitation.revoked_at is None:
        return _confirm(request, title=f"Withdraw the invitation for {invitation.email}?",
                        button="Withdraw invitation", lines=[
                            f"Its link stops working at once; {invitation.email} can only join with a new invitation."])
    # revoke_invitation is a silent no-op for an invitation that is no longer pending;
    # say so rather than claim it was withdrawn.
    if invitation.accepted_at is not None:
        messages.error(request, f"The invitation for {invitation.email} has already been accepted.")
        return redirect("frontend:members")
    if invitation.revoked_at is not None:
        messages.info(request, f"The invitation for {invitation.email} was already withdrawn.")
        return redirect("frontend:members")
    try:
        revoke_invitation(actor=request.actor, invitation=invitation)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, f"The invitation for {invitation.email} was withdrawn.")
    return redirect("frontend:members")
