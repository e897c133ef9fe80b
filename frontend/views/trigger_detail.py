"""A cron trigger's page: its schedule, the instants the clock left unfired, its recent
firings, its backfills, and the backfill form (preview first, then start).

``/triggers/<id>/?start=&end=&max_active_runs=`` shows the preview of that range (what
engine.backfill.preview_backfill counts); its button POSTs ``/triggers/<id>/backfill/``
with the count it showed (``expect_runs``), so the backfill started is the one
previewed, or none. Views parse and authorize, then call engine.backfill; a
BackfillError is shown next to the field it names. Another organization's trigger (or
backfill) is a 404.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from zoneinfo import ZoneInfo

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from engine.access import access_backfill, access_trigger
from engine.backfill import BackfillError, BackfillPreview, cancel_backfill, create_backfill, preview_backfill
from engine.models import ScheduledTrigger, TriggerBackfill, TriggerFiring, Workflow
from frontend.cron_words import describe_cron
from frontend.forms_workflows import BackfillForm
from frontend.organization import organization_required
from frontend.views.triggers import when_text
from frontend.views.workflows import authorize
from tenancy.models import without_credentials
from tenancy.permissions import Action, Forbidden, can

# How many of the trigger's firings and backfills its page lists (the most recent).
RECENT_FIRINGS = 20
RECENT_BACKFILLS = 10


@dataclasses.dataclass(frozen=True)
class FiringRow:
    firing: TriggerFiring
    when: str


@dataclasses.dataclass(frozen=True)
class BackfillRow:
    backfill: TriggerBackfill
    range_text: str
    done: int


def _local(when: dt.datetime | None, zone: str) -> dt.datetime | None:
    if when is None:
        return None
    try:
        return when.astimezone(ZoneInfo(zone))
    except (ValueError, KeyError):
        return when


def _local_text(when: dt.datetime | str | None, zone: str) -> str:
    if isinstance(when, str):
        when = dt.datetime.fromisoformat(when)
    return when_text(_local(when, zone))


def _bound(when: str | None, zone: str) -> str:
    """An instant as a backfill form's bound: its wall time in ``zone`` (2026-03-01T06:00)."""
    local = _local(dt.datetime.fromisoformat(when), zone) if when else None
    return local.strftime("%Y-%m-%dT%H:%M") if local is not None else ""


def _missed(trigger: ScheduledTrigger) -> dict | None:
    """The clock's note on instants it left unfired, with local times and the backfill
    range that fires them; None when there is none."""
    note = trigger.missed_instants
    if not note:
        return None
    zone = trigger.timezone
    return {
        **note,
        "at_text": _local_text(note.get("at"), zone),
        "first_text": _local_text(note.get("first_not_fired"), zone),
        "last_text": _local_text(note.get("last_not_fired"), zone),
        "start": _bound(note.get("first_not_fired"), zone),
        "end": _bound(note.get("last_not_fired"), zone),
    }


def _page(request: HttpRequest, trigger: ScheduledTrigger, *, form: BackfillForm,
          preview: BackfillPreview | None = None, status: int = 200) -> HttpResponse:
    org = request.membership.organization
    zone = trigger.timezone
    firings = [
        FiringRow(firing=f, when=_local_text(f.scheduled_for, zone))
        for f in TriggerFiring.objects.for_organization(org).filter(trigger=trigger)
        .order_by("-scheduled_for")[:RECENT_FIRINGS]
    ]
    backfills = [
        BackfillRow(backfill=b, done=b.created_runs,
                    range_text=f"{_local_text(b.range_start, zone)} – {_local_text(b.range_end, zone)}")
        for b in without_credentials(TriggerBackfill.objects.for_organization(org).filter(trigger=trigger), "created_by")
        .order_by("-created_at")[:RECENT_BACKFILLS]
    ]
    workflow_id = (Workflow.objects.for_organization(org).filter(name=trigger.workflow_name)
                   .order_by("-version").values_list("id", flat=True).first())
    context = {
        "trigger": trigger,
        "description": describe_cron(trigger.cron_expression),
        "next_fire": when_text(_local(trigger.next_fire_at, zone)) if trigger.enabled else "",
        "last_fired": when_text(_local(trigger.last_fired_at, zone)),
        "missed": _missed(trigger),
        "firings": firings,
        "backfills": backfills,
        "workflow_id": workflow_id,
        "form": form,
        "preview": preview,
        "preview_range": (f"{when_text(_local(preview.range_start, zone))} – {when_text(_local(preview.range_end, zone))}"
                          if preview is not None else ""),
        # Formatted here: the template's date filter would turn them into the site's zone.
        "preview_first": when_text(preview.first) if preview is not None else "",
        "preview_last": when_text(preview.last) if preview is not None else "",
        "can_edit": can(request.actor.role, Action.WORKFLOW_EDIT),
        "can_operate": can(request.actor.role, Action.RUN_OPERATE),
    }
    return render(request, "frontend/triggers/detail.html", context, status=status)


def _show_refusal(form: BackfillForm, exc: BackfillError) -> None:
    message = exc.message[:1].upper() + exc.message[1:]
    form.add_error(exc.field if exc.field in form.fields else None, message)


@require_GET
@organization_required
def trigger_detail(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    """The trigger's page; with ``start`` and ``end`` in the query, the preview of that backfill."""
    trigger = access_trigger(request.membership.organization, trigger_id, shape=lambda qs: without_credentials(qs, "created_by"))
    if not {"start", "end"} & set(request.GET):
        return _page(request, trigger, form=BackfillForm(initial={"max_active_runs": 10}))
    form = BackfillForm(request.GET)
    preview = None
    if form.is_valid():
        try:
            preview = preview_backfill(actor=request.actor, trigger=trigger, start=form.cleaned_data["start"],
                                       end=form.cleaned_data["end"])
        except BackfillError as exc:
            _show_refusal(form, exc)
    return _page(request, trigger, form=form, preview=preview, status=200 if form.is_valid() and preview else 400)


@require_POST
@organization_required
def trigger_backfill(request: HttpRequest, trigger_id: uuid.UUID) -> HttpResponse:
    """Start the backfill the page previewed (``expect_runs``: the count it showed)."""
    trigger = access_trigger(request.membership.organization, trigger_id)
    authorize(request.actor.role, Action.RUN_OPERATE)
    form = BackfillForm(request.POST)
    if form.is_valid():
        try:
            expect = int(request.POST["expect_runs"]) if request.POST.get("expect_runs", "").isdigit() else None
            backfill = create_backfill(actor=request.actor, trigger=trigger, start=form.cleaned_data["start"],
                                       end=form.cleaned_data["end"],
                                       max_active_runs=form.cleaned_data.get("max_active_runs"), expect_runs=expect)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except BackfillError as exc:
            _show_refusal(form, exc)
        else:
            messages.success(request, f"Backfill of {trigger.name} started: {backfill.total} "
                             f"run{'s' if backfill.total != 1 else ''} to start, oldest first (instants that "
                             "already have a run are passed over).")
            return redirect(f"/triggers/{trigger.pk}/#backfills")
    return _page(request, trigger, form=form, status=400)


@require_POST
@organization_required
def trigger_backfill_cancel(request: HttpRequest, trigger_id: uuid.UUID, backfill_id: uuid.UUID) -> HttpResponse:
    """Stop a backfill (the runs it started go on)."""
    backfill = access_backfill(request.membership.organization, trigger_id, backfill_id)
    authorize(request.actor.role, Action.RUN_OPERATE)
    try:
        cancelled = cancel_backfill(actor=request.actor, backfill=backfill)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    messages.success(request, f"Backfill {'cancelled' if cancelled.state == 'cancelled' else cancelled.state}: "
                     f"{cancelled.created_runs} runs were started.")
    return redirect(f"/triggers/{trigger_id}/#backfills")
