"""Organization settings: everyone sees them; owners (org.manage) rename the
organization, and anyone else's POST is refused with a 403."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from frontend.forms_workflows import OrganizationSettingsForm
from frontend.organization import organization_required
from frontend.views.workflows import authorize
from tenancy.permissions import Action, Forbidden, can
from tenancy.services import TenancyError, rename_organization


@require_http_methods(["GET", "POST"])
@organization_required
def organization_settings(request: HttpRequest) -> HttpResponse:
    membership = request.membership
    org = membership.organization
    can_manage = can(request.actor.role, Action.ORG_MANAGE)
    status = 200
    if request.method == "POST":
        authorize(request.actor.role, Action.ORG_MANAGE)
        form = OrganizationSettingsForm(request.POST)
        if form.is_valid():
            try:
                renamed = rename_organization(actor=request.actor, name=form.cleaned_data["name"])
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            except TenancyError as exc:
                form.add_error("name", str(exc))
            else:
                messages.success(request, f"The organization is now called {renamed.name}.")
                return redirect("frontend:settings")
        status = 400
    else:
        form = OrganizationSettingsForm(initial={"name": org.name})
    context = {
        "organization": org,
        "membership": membership,
        "can_manage": can_manage,
        "form": form if can_manage else None,
    }
    return render(request, "frontend/settings/index.html", context, status=status)
