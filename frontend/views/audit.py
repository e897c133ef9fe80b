"""``/audit/``: the active organization's audit log, for owners and admins (``audit.read``).

Only the organization's own chain is shown: ``for_organization`` filters on its id, so
account-level records (organization NULL: sign-ins, failed key authentications with
an unknown prefix) never appear. Newest first, filtered by action prefix, actor email
and date range, keyset-paged over ``idx_auditlog_org_recent`` (never OFFSET), in a
constant number of queries.
"""

from __future__ import annotations

import dataclasses
import json

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET

from audit.models import AuditLog
from frontend.organization import organization_required
from frontend.paging import BadCursor, DateBound, lower_bound, newest_first_page, page_links, upper_bound
from tenancy.permissions import Action, Forbidden, require

AUDIT_PAGE_SIZE = 50
# Characters of a record's metadata shown in the table (the rest is in its details).
METADATA_PREVIEW_CHARS = 160

# Target types whose pages this site links to: type -> URL name and kwarg.
TARGET_LINKS = {
    "workflowrun": ("frontend:run_detail", "run_id"),
    "workflow": ("frontend:workflow_detail", "workflow_id"),
}
# How a target type is named on the page.
TARGET_LABELS = {"workflowrun": "run", "apikey": "API key", "scheduledtrigger": "trigger"}


class AuditFilterForm(forms.Form):
    action = forms.CharField(required=False, max_length=100)
    actor = forms.CharField(required=False, max_length=254)
    created_after = DateBound(required=False)
    created_before = DateBound(required=False)


@dataclasses.dataclass(frozen=True)
class AuditRow:
    entry: AuditLog
    actor: str
    actor_kind: str
    category: str
    target_label: str
    target_url: str | None
    metadata_preview: str
    metadata_full: str


def _actor_label(entry: AuditLog) -> tuple[str, str]:
    if entry.actor_type == "api_key":
        label = f"API key {entry.actor_api_key_prefix}" if entry.actor_api_key_prefix else "API key"
        return label, "api_key"
    if entry.actor_type == "system":
        return "FlowForge (system)", "system"
    return entry.actor_email or "unknown user", "user"


def _row(entry: AuditLog) -> AuditRow:
    actor, kind = _actor_label(entry)
    target_url = None
    if entry.target_type in TARGET_LINKS and entry.target_id:
        name, kwarg = TARGET_LINKS[entry.target_type]
        try:
            target_url = reverse(name, kwargs={kwarg: entry.target_id})
        except NoReverseMatch:  # not a well-formed id: show it without a link
            target_url = None
    full = json.dumps(entry.metadata, indent=2, sort_keys=True, default=str) if entry.metadata else ""
    preview = json.dumps(entry.metadata, separators=(", ", ": "), sort_keys=True, default=str) if entry.metadata else ""
    if len(preview) > METADATA_PREVIEW_CHARS:
        preview = preview[: METADATA_PREVIEW_CHARS - 1] + "…"
    return AuditRow(entry=entry, actor=actor, actor_kind=kind, category=entry.action.split(".", 1)[0],
                    target_label=TARGET_LABELS.get(entry.target_type, entry.target_type), target_url=target_url,
                    metadata_preview=preview, metadata_full=full)


@require_GET
@organization_required
def audit_list(request: HttpRequest) -> HttpResponse:
    try:
        require(request.actor.role, Action.AUDIT_READ)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    org = request.membership.organization
    form = AuditFilterForm(request.GET)
    valid = form.is_valid()
    data = form.cleaned_data if valid else {}
    status = 200 if valid else 400
    # for_organization: organization_id = the active one, so account-level rows (NULL) never match.
    qs = AuditLog.objects.for_organization(org).defer("prev_hash", "row_hash", "chain")
    if action := (data.get("action") or "").strip():
        qs = qs.filter(action__startswith=action)
    if actor := (data.get("actor") or "").strip():
        qs = qs.filter(actor_email__iexact=actor)
    if (after := lower_bound(data.get("created_after"))) is not None:
        qs = qs.filter(created_at__gte=after)
    if (before := upper_bound(data.get("created_before"))) is not None:
        qs = qs.filter(created_at__lt=before)
    try:
        page = newest_first_page(qs, older_than=request.GET.get("older_than"),
                                 newer_than=request.GET.get("newer_than"), size=AUDIT_PAGE_SIZE)
    except BadCursor:
        messages.warning(request, "That page link has expired or is not valid; showing the newest records.")
        page = newest_first_page(qs, older_than=None, newer_than=None, size=AUDIT_PAGE_SIZE)
        status = 400
    context = {
        "organization": org,
        "form": form,
        "rows": [_row(e) for e in page.rows],
        "links": page_links(request, page),
        "filtered": any(data.get(k) for k in ("action", "actor", "created_after", "created_before")),
        "paged": bool(request.GET.get("older_than") or request.GET.get("newer_than")),
        "action_prefixes": ("run.", "workflow.", "trigger.", "member.", "invitation.", "api_key.", "organization."),
    }
    return render(request, "frontend/audit/list.html", context, status=status)
