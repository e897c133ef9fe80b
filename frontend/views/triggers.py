"""Cron triggers: list, create, edit, pause/resume, delete, and the schedule preview
(the next five firings in the trigger's time zone, fetched by htmx as the cron field
changes).

Views parse and authorize, then call engine.triggers; a TriggerError is shown next
to the field it names. Another organization's trigger id is a 404.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from zoneinfo import ZoneInfo

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from engine.access import access_trigger
from engine.models import ScheduledTrigger, Workflow
from engine.triggers import (
    TriggerError,
    create_trigger,
    delete_trigger,
    input_rejections,
    preview,
    set_enabled,
    update_trigger,
)
from frontend.cron_words import describe_cron
from frontend.forms_workflows import TriggerForm
from frontend.organization import organization_required
from frontend.views.workflows import authorize
from tenancy.permissions import Action, Forbidden, can

PREVIEW_COUNT = 5
# What the preview says instead of the schedule's error when that error is shown under its field.
SCHEDULE_ERROR_HINT = "Correct the schedule (see the form) to see when it fires."


def _trigger_or_404(request: HttpRequest, trigger_id: uuid.UUID) -> ScheduledTrigger:
    """The active organization's trigger (engine.access: a 404 for a missing or foreign id)."""
    return access_trigger(request.membership.organization, trigger_id)


def _latest_versions(org) -> dict[str, uuid.UUID]:
    """Workflow name -> id of its latest version (one query)."""
    return dict(
        Workflow.objects.for_organization(org)
        .order_by("name", "-version")
        .distinct("name")
        .values_list("name", "id")
    )


@dataclasses.dataclass(frozen=True)
class TriggerRow:
    trigger: ScheduledTrigger
    description: str
    next_fire: str
    last_fired: str
    workflow_id: uuid.UUID | None
    # Why every firing will fail: the latest active version's input schema refuses the input.
    input_rejected: str = ""


def _local(when: dt.datetime | None, zone: str) -> dt.datetime | None:
    if when is None:
        return None
    try:
        return when.astimezone(ZoneInfo(zone))
    except (ValueError, KeyError):
        return when


def when_text(when: dt.datetime | None) -> str:
    """A local time as "Mon 3 Jun 2024, 02:00 CEST" (formatted here: the template's date
    filter would turn it back into the site's zone)."""
    if when is None:
        return ""
    return f"{when:%a} {when.day} {when:%b %Y, %H:%M} {when.tzname() or ''}".rstrip()


@require_GET
@organization_required
def trigger_list(request: HttpRequest) -> HttpResponse:
    """Every trigger of the organization, each flagged when its workflow's input schema
    refuses its input (three queries whatever their number)."""
    org = request.membership.organization
    latest = _latest_versions(org)
    trigger_list = list(ScheduledTrigger.objects.for_organization(org).order_by("name"))
    rejected = input_rejections(org, trigger_list)
    rows = [
        TriggerRow(
            trigger=t,
            description=describe_cron(t.cron_expression),
            next_fire=when_text(_local(t.next_fire_at, t.timezone)) if t.enabled else "",
            last_fired=when_text(_local(t.last_fired_at, t.timezone)),
            workflow_id=latest.get(t.workflow_name),
            input_rejected=rejected[t.pk].message() if t.pk in rejected else "",
        )
        for t in trigger_list
    ]
    context = {
        "organization": org,
        "rows": rows,
        "can_edit": can(request.actor.role, Action.WORKFLOW_EDIT),
        "has_workflows": bool(latest),
    }
    return render(request, "frontend/triggers/list.html", context)


def _preview_context(cron_expression: str, timezone_name: str) -> dict:
    """What the preview fragment shows: the description and next firings, or the error."""
    expression = " ".join((cron_expression or "").split())
    zone = timezone_name or "UTC"
    context: dict = {"expression": expression, "zone": zone, "times": [], "error": None, "description": "",
                     "pending": ""}
    if not expression:
        context["error"] = "Type a cron expression to see when it fires."
        return context
    try:
        context["times"] = [when_text(t) for t in preview(expression, zone, count=PREVIEW_COUNT)]
    except TriggerError as exc:
        context["error"] = exc.message[:1].upper() + exc.message[1:]
        context["error_field"] = exc.field
    else:
        context["description"] = describe_cron(expression)
    return context


@require_GET
@organization_required
def trigger_preview(request: HttpRequest) -> HttpResponse:
    """The schedule preview fragment for ``?cron_expression=&timezone=``."""
    context = _preview_context(request.GET.get("cron_expression", ""), request.GET.get("timezone", "UTC"))
    return render(request, "frontend/triggers/_preview.html", context)


def _form_page(
    request: HttpRequest,
    form: TriggerForm,
    *,
    trigger: ScheduledTrigger | None,
    workflow_names: list[str],
    status: int = 200,
) -> HttpResponse:
    preview = _preview_context(form["cron_expression"].value() or "", form["timezone"].value() or "UTC")
    field = preview.get("error_field")
    if form.is_bound and preview["error"] and field in form.fields:
        # A submitted schedule's error is shown once, under the field it concerns: there
        # already when the service refused it (the rest of the form was valid), added here
        # when another field's error kept the service from seeing it. The preview beside
        # the form then points to the field instead of repeating the message.
        if not form.errors.get(field):
            form.add_error(field, preview["error"])
        preview = {**preview, "error": None, "pending": SCHEDULE_ERROR_HINT}
    context = {
        "form": form,
        "trigger": trigger,
        "has_workflows": bool(workflow_names),
        "preview": preview,
    }
    return render(request, "frontend/triggers/form.html", context, status=status)


def _save(request: HttpRequest, *, trigger: ScheduledTrigger | None) -> HttpResponse:
    """Create (``trigger`` None) or change a trigger from the POSTed form."""
    org = request.membership.organization
    names = sorted(_latest_versions(org))
    if request.method == "POST":
        form = TriggerForm(request.POST, workflow_names=names)
        if form.is_valid():
            try:
                if trigger is None:
                    saved = create_trigger(actor=request.actor, data=form.service_data())
                else:
                    saved = update_trigger(actor=request.actor, trigger=trigger, data=form.service_data())
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            except TriggerError as exc:
                message = exc.message[:1].upper() + exc.message[1:]
                form.add_error(exc.field if exc.field in form.fields else None, message)
            else:
                messages.success(request, f"Saved trigger {saved.name}.")
                return redirect("frontend:triggers")
        return _form_page(request, form, trigger=trigger, workflow_names=names, status=400)
    if trigger is None:
        initial = {"cron_expression": "0 * * * *", "timezone": "UTC", "input": "{}", "enabled": True}
        if request.GET.get("workflow") in names:
            initial["workflow_name"] = request.GET["workflow"]
    else:
        initial = {
            "name": trigger.name,
            "workflow_name": trigger.workflow_name,
            "cron_expression": trigger.cron_expression,
            "timezone": trigger.timezone,
            "input": json.dumps(trigger.input, indent=2),
            "catch_up": trigger.catch_up,
            "enabled": trigger.enabled,
            "priority": trigger.priority,
        }
        if trigger.workflow_name not in names:  # shown as is, even if its workflow is gone
            names.append(trigger.workflow_name)
    return _form_page(
        request, TriggerForm(initial=initial, workflow_names=names), trigger=trigger, workflow_names=names
    )


@require_http_methods(["GET", "POST"])
@organization_required
def trigger_new(request: HttpRequest) -> HttpResponse:
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    return _save(request, trigger=None)


@require_http_methods(["GET", "POST"])
@organization_required
def trigger_edit(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    trigger = _trigger_or_404(request, trigger_id)
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    return _save(request, trigger=trigger)


def _set_enabled(request: HttpRequest, trigger_id: uuid.UUID, *, enabled: bool) -> HttpResponse:
    trigger = _trigger_or_404(request, trigger_id)
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    try:
        changed = set_enabled(actor=request.actor, trigger=trigger, enabled=enabled)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    if enabled:
        when = when_text(_local(changed.next_fire_at, changed.timezone))
        at = f" Next firing: {when}." if when else ""
        messages.success(request, f"Resumed {changed.name}.{at}")
    else:
        messages.success(request, f"Paused {changed.name}; it will not fire until it is resumed.")
    return redirect("frontend:triggers")


@require_POST
@organization_required
def trigger_pause(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    return _set_enabled(request, trigger_id, enabled=False)


@require_POST
@organization_required
def trigger_resume(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    return _set_enabled(request, trigger_id, enabled=True)


@require_http_methods(["GET", "POST"])
@organization_required
def trigger_delete(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    """GET: the confirmation page; POST: delete (the runs it started are kept)."""
    trigger = _trigger_or_404(request, trigger_id)
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    if request.method == "GET":
        context = {"trigger": trigger, "description": describe_cron(trigger.cron_expression)}
        return render(request, "frontend/triggers/delete.html", context)
    try:
        delete_trigger(actor=request.actor, trigger=trigger)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, f"Deleted trigger {trigger.name}.")
    return redirect("frontend:triggers")
