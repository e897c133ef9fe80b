"""Organizations: list mine and switch the active one, create a new one."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from frontend.forms import OrganizationForm, SwitchOrganizationForm
from frontend.organization import my_memberships, safe_next
from tenancy.context import (
    OrganizationNotFound,
    OrganizationRequired,
    choose_organization,
    resolve_membership,
)
from tenancy.models import Membership
from tenancy.services import TenancyError, create_organization_for


@login_required
@require_http_methods(["GET", "POST"])
def organization_list(request: HttpRequest) -> HttpResponse:
    """GET: my organizations. POST ``organization=<id>``: make it the active one.

    An organization the user is not a member of is a 404, like one that does not exist.
    """
    if request.method == "POST":
        form = SwitchOrganizationForm(request.POST)
        if not form.is_valid():
            raise Http404("no such organization")
        membership = (
            Membership.objects.for_organization(form.cleaned_data["organization"])
            .select_related("organization")
            .filter(user=request.user)
            .first()
        )
        if membership is None:
            raise Http404("no such organization")
        choose_organization(request, membership)
        messages.success(request, f"You are now working in {membership.organization.name}.")
        return redirect(safe_next(request) or "frontend:home")

    memberships = list(my_memberships(request.user))
    try:
        active = resolve_membership(request, request.user)
    except (OrganizationRequired, OrganizationNotFound):
        active = None
    request.membership = active  # the header reuses it
    return render(
        request,
        "frontend/org_list.html",
        {"memberships": memberships, "active": active, "next": safe_next(request) or ""},
    )


@login_required
@require_http_methods(["GET", "POST"])
def organization_create(request: HttpRequest) -> HttpResponse:
    """Create an organization owned by the signed-in user and make it the active one."""
    form = OrganizationForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            org = create_organization_for(
                user=request.user, slug=form.cleaned_data["slug"], name=form.cleaned_data["name"]
            )
        except TenancyError as exc:
            # The service's messages name the field they are about ("slug ...", "name ...").
            form.add_error("name" if str(exc).startswith("name") else "slug", str(exc))
        else:
            membership = (
                Membership.objects.for_organization(org).select_related("organization").get(user=request.user)
            )
            choose_organization(request, membership)
            messages.success(request, f"Created {org.name}. You are its owner.")
            return redirect("frontend:members")
    return render(request, "frontend/org_new.html", {"form": form}, status=400 if form.errors else 200)
