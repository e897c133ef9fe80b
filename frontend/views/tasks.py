"""The task panel (issue 19): one task run of a run whole — its attempts with their logs,
errors and tracebacks, its input as configured, its upstream outputs, its events — and the
run's input as JSON.

``/runs/<id>/tasks/<task run id>/`` answers an htmx request (the run page opening the
panel, or the panel refreshing itself every POLL_SECONDS while the task is not finished)
with the panel alone, and any other with a page holding it. Read through
engine.task_detail (engine.access: another organization's task run, or one of another run,
is a 404); a constant number of queries (tests/unit/test_task_detail.py counts them).
"""

from __future__ import annotations

import uuid

from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from engine.access import access_run
from frontend.organization import organization_required
from frontend.presenters.task_panel import build_task_panel


@require_GET
@organization_required
def run_task(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/``: the task panel (htmx) or a page with it."""
    panel = build_task_panel(request.membership.organization, run_id, task_run_id)
    if getattr(request, "htmx", False):
        response = render(request, "frontend/runs/_task_panel.html", {"p": panel})
    else:
        response = render(request, "frontend/runs/task.html", {"p": panel})
    response["Cache-Control"] = "no-store"
    return response


@require_GET
@organization_required
def run_input(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/input/``: the run's whole input as JSON (the run page shows it cut)."""
    run = access_run(request.membership.organization, run_id,
                     shape=lambda qs: qs.annotate(input_text=Cast("input", TextField())).only("id", "organization_id"))
    response = HttpResponse(run.input_text or "{}", content_type="application/json")
    response["Content-Disposition"] = f'inline; filename="{run_id}-input.json"'
    return response
