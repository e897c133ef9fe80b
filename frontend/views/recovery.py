"""The run page's recovery actions (engine.recovery, issue 19): Resume a failed or
cancelled run, and Retry, Mark succeeded or Skip one of its task runs.

Each is a POST from a form of the run page (with the CSRF token, after the browser's
confirmation: run-page.js ``data-confirm``), like Cancel: the run (or the task run of
that run) is read through engine.access first, so another organization's is a 404 like
a missing one; then the permission (``run.operate``: a viewer gets a 403); then the
service. The answer is a redirect to the run page with a message saying what was done,
or why it was refused. Outside ATOMIC_REQUESTS: the services commit their own
transaction (retried on a deadlock).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from engine import recovery
from engine.access import access_task_run
from engine.models import TaskRun
from frontend.organization import organization_required
from frontend.views.runs import authorize_operate, run_or_404


def _task_run_or_404(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> TaskRun:
    """The task run ``task_run_id`` of the active organization's run ``run_id``, with its
    task's key (an Http404 otherwise)."""
    return access_task_run(request.membership.organization, run_id, task_run_id,
                           shape=lambda qs: qs.select_related("task"))


def _act(request: HttpRequest, run_id: uuid.UUID, call: Callable[[], recovery.ActionResult],
         done: Callable[[recovery.ActionResult], str]) -> HttpResponse:
    """Run the service ``call``: its result said with ``done``, a refusal or a bad argument
    as an error message; then back to the run page."""
    try:
        result = call()
    except recovery.ActionRefused as exc:
        messages.error(request, str(exc))
    except recovery.InvalidAction as exc:
        messages.error(request, f"{exc.field.capitalize()} {exc.message}.")
    else:
        messages.success(request, done(result))
    return redirect("frontend:run_detail", run_id=run_id)


def _again(result: recovery.ActionResult) -> str:
    if not result.reopened:
        return f"The run is {result.run_state}."
    keys = ", ".join(result.reopened[:10]) + (f" and {len(result.reopened) - 10} more" if len(result.reopened) > 10
                                               else "")
    return f"{len(result.reopened)} task{'s' if len(result.reopened) != 1 else ''} will run again: {keys}."


@transaction.non_atomic_requests
@require_POST
@organization_required
def run_resume(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/resume/``: run again what did not succeed, in this run."""
    run = run_or_404(request, run_id)
    authorize_operate(request)
    return _act(request, run.pk, lambda: recovery.resume_run(actor=request.actor, run=run,
                                                             reason=request.POST.get("reason", "")),
                lambda r: f"The run was resumed. {_again(r)}")


@transaction.non_atomic_requests
@require_POST
@organization_required
def run_task_retry(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/retry/``: the task again, and what depends on it."""
    task_run = _task_run_or_404(request, run_id, task_run_id)
    authorize_operate(request)
    return _act(request, run_id, lambda: recovery.retry_task_run(actor=request.actor, task_run=task_run,
                                                                 reason=request.POST.get("reason", "")),
                lambda r: f"Task {task_run.task.key} was retried. {_again(r)}")


@transaction.non_atomic_requests
@require_POST
@organization_required
def run_task_mark_succeeded(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/mark-succeeded/``: the task succeeded with the
    form's ``output`` (JSON text; empty means null)."""
    task_run = _task_run_or_404(request, run_id, task_run_id)
    authorize_operate(request)
    raw = request.POST.get("output", "").strip()
    try:
        output = json.loads(raw) if raw else None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply for json
        messages.error(request, f"Output is not valid JSON ({exc}); nothing was changed.")
        return redirect("frontend:run_detail", run_id=run_id)
    return _act(request, run_id, lambda: recovery.mark_task_run_succeeded(
        actor=request.actor, task_run=task_run, output=output, reason=request.POST.get("reason", "")),
        lambda r: f"Task {task_run.task.key} was marked succeeded. {_again(r)}")


@transaction.non_atomic_requests
@require_POST
@organization_required
def run_task_skip(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/skip/``: the task skipped."""
    task_run = _task_run_or_404(request, run_id, task_run_id)
    authorize_operate(request)
    return _act(request, run_id, lambda: recovery.skip_task_run(actor=request.actor, task_run=task_run,
                                                                reason=request.POST.get("reason", "")),
                lambda r: f"Task {task_run.task.key} was skipped. {_again(r)}")
