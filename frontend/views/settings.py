"""Organization settings: everyone sees them, with the organization's plan, limits and
their usage (engine.reporting.quota_report, the API's /org/limits/); owners (org.manage)
rename the organization, and anyone else's POST is refused with a 403."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from engine.reporting import QuotaLine, quota_report
from engine.retention import describe as describe_retention
from frontend.forms_workflows import OrganizationSettingsForm
from frontend.organization import organization_required
from frontend.presenters.text import human_bytes
from frontend.views.workflows import authorize
from tenancy.permissions import Action, Forbidden, can
from tenancy.services import TenancyError, rename_organization


def _amount(line: QuotaLine, value: int | None) -> str:
    """A limit's or a usage's value as the table shows it (bytes as KiB/MiB)."""
    if value is None:
        return "—"
    return human_bytes(value) if line.name == "max_definition_bytes" else f"{value:,}"


def quota_rows(org) -> tuple[str, list[dict]]:
    """The plan and the limits table: description, limit, plan default, used, overridden."""
    report = quota_report(org)
    return report.plan, [
        {"name": line.name, "description": line.description, "limit": _amount(line, line.limit),
         "plan_default": _amount(line, line.plan_default), "used": _amount(line, line.used),
         "overridden": line.overridden,
         "full": line.used is not None and line.used >= line.limit}
        for line in report.lines
    ]


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
    plan, limits = quota_rows(org)
    retention_seconds = (org.run_retention_days * 86400 if org.run_retention_days is not None
                         else settings.FLOWFORGE_RUN_RETENTION_SECONDS)
    context = {
        "plan": plan,
        "limits": limits,
        "organization": org,
        "membership": membership,
        "can_manage": can_manage,
        "form": form if can_manage else None,
        # Run and audit retention (engine.retention, audit.retention).
        "retention_seconds": retention_seconds,
        "retention_text": describe_retention(retention_seconds),
        "retention_overridden": org.run_retention_days is not None,
        "audit_retention_days": settings.FLOWFORGE_AUDIT_RETENTION_DAYS,
    }
    return render(request, "frontend/settings/index.html", context, status=status)
