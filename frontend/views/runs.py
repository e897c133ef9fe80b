"""Runs: the list, the run page, its live fragment and event stream, the full event log,
a task's whole output and its worker log lines, and the Cancel / Re-run actions (Resume
and the task actions are frontend.views.recovery's).

Views parse, authorize and render; what a page shows is loaded and shaped by the
presenters (frontend.presenters.run_list, run_page, timeline, run_rows), and the engine's
services (``engine.services``) change state. Every run id in a URL is read through
engine.access.access_run for the active organization, before any permission check, so
another organization's run is a 404 like a missing one, never a 403. Refused actions
(no ``run.operate``) are a 403.

Every page and fragment makes a constant number of queries, whatever the number of
tasks, runs or events (tests/unit/test_web_runs.py counts them): the run list three
(frontend.presenters.run_list), the run page and its fragment those of
``build_run_view`` plus the run and who started it.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast, Left
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET, require_POST

from engine import live_stream, offload
from engine.access import access_run, access_task_run
from engine.models import RunState, TaskLog, TaskRunEvent, Workflow, WorkflowRun
from engine.services import RunNotFinished, WorkflowNotStartable, cancel_run, retry_run
from engine.states import TaskRunState
from flowforge.cursors import whole_number
from frontend import live
from frontend.dag import render_state_legend
from frontend.organization import organization_required
from frontend.paging import BadCursor, newest_first_page, page_links
from frontend.presenters.run_list import RunFilterForm, RunRow, progress_by_run, run_list_queryset
from frontend.presenters.run_page import (
    EVENT_COLUMNS,
    LOG_LINES_PER_TASK,
    TaskTableForm,
    build_run_view,
    event_rows,
    started_by,
    with_shown_detail,
)
from frontend.presenters.run_rows import render_event_rows
from frontend.presenters.task_panel import JSON_PREVIEW_CHARS, run_input
from frontend.presenters.text import run_duration
from frontend.views.home import org_live_urls
from tenancy.limits import QuotaExceeded
from tenancy.models import without_credentials
from tenancy.permissions import Action, Forbidden, require

# Runs per page of the run list.
RUN_PAGE_SIZE = 50
# Events per page of the event-log page.
EVENT_PAGE_SIZE = 500
# Lines of a task run's log page (the API pages through the rest).
TASK_LOG_PAGE_LINES = 10_000


def _seq(raw: str | None) -> int:
    """A ``?after=`` / Last-Event-ID seq: 0 when absent or not a whole number."""
    return whole_number(raw) or 0


def _workflow_url(workflow: Workflow) -> str:
    """The workflow version's page (owned by the workflows section), or its list."""
    for name, kwargs in (
        ("frontend:workflow_version", {"workflow_id": workflow.pk}),
        ("frontend:workflow_detail", {"workflow_id": workflow.pk}),
        ("frontend:workflow", {"workflow_id": workflow.pk}),
    ):
        try:
            return reverse(name, kwargs=kwargs)
        except NoReverseMatch:
            continue
    return f"/workflows/{workflow.pk}/"


@require_GET
@organization_required
def run_list(request: HttpRequest) -> HttpResponse:
    """``/runs/``: the organization's runs, newest first, filtered, keyset-paged."""
    org = request.membership.organization
    form = RunFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    status = 200 if form.is_valid() else 400
    read_at = timezone.now()  # before the read: the live stream's ``since``
    qs = run_list_queryset(org, data)
    try:
        page = newest_first_page(
            qs,
            older_than=request.GET.get("older_than"),
            newer_than=request.GET.get("newer_than"),
            size=RUN_PAGE_SIZE,
        )
    except BadCursor:
        messages.warning(request, "That page link has expired or is not valid; showing the newest runs.")
        page = newest_first_page(qs, older_than=None, newer_than=None, size=RUN_PAGE_SIZE)
        status = 400
    progress = progress_by_run(org, [r.pk for r in page.rows])
    now = timezone.now()
    rows = [
        RunRow(
            run=r,
            progress=progress[r.pk],
            duration=run_duration(r.started_at, r.finished_at, now),
        )
        for r in page.rows
    ]
    workflow_names = list(
        Workflow.objects.for_organization(org).order_by("name").values_list("name", flat=True).distinct()
    )
    filtered = any(data.get(k) for k in ("workflow", "state", "created_after", "created_before"))
    context = {
        "organization": org,
        "form": form,
        "rows": rows,
        "links": page_links(request, page),
        "workflow_names": workflow_names,
        "states": RunState.choices,
        "filtered": filtered,
        "paged": bool(request.GET.get("older_than") or request.GET.get("newer_than")),
        "live": org_live_urls(fragment=_list_fragment_url(request), read_at=read_at),
    }
    if request.GET.get("fragment") == "1":
        # The live client's fetch (org-live.js): the table alone, the same filters and page.
        context["fragment"] = True
        response = render(request, "frontend/runs/_list_table.html", context, status=status)
        response["Cache-Control"] = "no-store"
        return response
    return render(request, "frontend/runs/list.html", context, status=status)


def _list_fragment_url(request: HttpRequest) -> str:
    """This run list page's URL (its filters and page) asking for the table alone."""
    query = request.GET.copy()
    query["fragment"] = "1"
    return f"{request.path}?{query.urlencode()}"


def _run_queryset(qs: QuerySet) -> QuerySet:
    """The run with what the page's header shows (not its input or the workflow's document)."""
    return without_credentials(qs, "workflow", "triggered_by", "trigger").defer(
        "input", "workflow__definition", "trigger__input")


def run_or_404(request: HttpRequest, run_id: uuid.UUID) -> WorkflowRun:
    """The active organization's run ``run_id`` (engine.access.access_run: an Http404 for
    a missing or another organization's run)."""
    return access_run(request.membership.organization, run_id, shape=_run_queryset)


def _live_urls(run: WorkflowRun) -> dict[str, str]:
    return {
        "fragment": reverse("frontend:run_live", kwargs={"run_id": run.pk}),
        "stream": reverse("frontend:run_stream", kwargs={"run_id": run.pk}),
    }


@gzip_page  # a big run's page is mostly repeated markup (see run_live)
@require_GET
@organization_required
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/``: header, input, DAG, timeline, tasks (each opening its panel) and
    events; live while the run is active."""
    # The input as JSON text cut in the database: a run input may be 1 MiB.
    run = access_run(request.membership.organization, run_id, shape=lambda qs: _run_queryset(qs).annotate(
        input_text=Left(Cast("input", TextField()), JSON_PREVIEW_CHARS + 1)))
    table = TaskTableForm(request.GET)
    view = build_run_view(request, run, table=table.table_query())
    view.table_errors = table.error_list
    context = {
        "task_states": [(value, f"{label} ({view.counts[value]})" if view.counts.get(value) else label)
                        for value, label in TaskRunState.choices],
        "run_input": run_input(run.input_text, url=reverse("frontend:run_input", kwargs={"run_id": run.pk})),
        "v": view,
        "run": run,
        "workflow_url": _workflow_url(run.workflow),
        "started_by": started_by(request.membership.organization, run),
        "live": _live_urls(run),
        "state_legend": render_state_legend(),
        "log_lines_per_task": LOG_LINES_PER_TASK,
    }
    return render(request, "frontend/runs/detail.html", context, status=400 if table.errors else 200)


# gzip: a live update is mostly repeated markup (a burst of task rows, event rows); HTML
# compresses about 8:1. Django's GZipMiddleware machinery pads each response with random
# bytes against BREACH-style length probes.
@gzip_page
@require_GET
@organization_required
def run_live(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/live/?after=<seq>&sig=<table sig>&task_state=&task_key=&task_page=``:
    what changed on the run page since ``seq`` (frontend.presenters.run_page.build_run_view:
    the summary, the graph's new states, the changed rows of the table's page and of the
    timeline — or that page whole when ``sig`` says its rows changed — and the new events),
    for the page's live client; without ``after``, every region whole. A table filter that
    is not valid is a 400 naming it."""
    run = run_or_404(request, run_id)
    table = TaskTableForm(request.GET)
    if not table.is_valid():
        return HttpResponse("; ".join(table.error_list), status=400, content_type="text/plain; charset=utf-8")
    after = whole_number(request.GET.get("after"))  # None: the whole log, afresh
    view = build_run_view(request, run, events_after=after, table=table.table_query(),
                          table_sig=request.GET.get("sig", "")[:64])
    context = {
        "v": view,
        "run": run,
        "workflow_url": _workflow_url(run.workflow),
        "started_by": started_by(request.membership.organization, run),
        "live": _live_urls(run),
    }
    response = render(request, "frontend/runs/_live.html", context)
    response["Cache-Control"] = "no-store"
    return response


@transaction.non_atomic_requests
@require_GET
@organization_required
def run_stream(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/stream/``: server-sent ``change`` events while the run is active
    (frontend.live), then one ``end``. Outside ATOMIC_REQUESTS: a request-long
    transaction would hold a snapshot for as long as the page is open. Past a stream
    limit (engine.live_limits) a plain-text 429 with Retry-After names the limit."""
    run = run_or_404(request, run_id)
    after = _seq(request.headers.get("Last-Event-ID") or request.GET.get("after"))
    try:
        lease = live_stream.acquire(organization_id=run.organization_id, user_id=request.user.pk)
    except live_stream.StreamRefused as exc:
        # The page's client then polls the live fragment instead (run-page.js).
        refused = HttpResponse(str(exc), status=429, content_type="text/plain; charset=utf-8")
        refused["Retry-After"] = str(exc.retry_after)
        return refused
    stream = live_stream.LeasedStream(
        live.run_changes(organization_id=run.organization_id, run_id=run.pk, after=after, lease=lease), lease)
    response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


@require_GET
@organization_required
def run_events(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/events/?after=<seq>``: the run's whole event log, EVENT_PAGE_SIZE per page
    in seq order (keyset on ``uniq_event_run_seq``)."""
    run = run_or_404(request, run_id)
    org = request.membership.organization
    after = _seq(request.GET.get("after"))
    events = list(
        with_shown_detail(TaskRunEvent.objects.for_organization(org))
        .filter(workflow_run=run, run_created_at=run.created_at, seq__gt=after)
        .order_by("seq")
        .values_list(*EVENT_COLUMNS, "task_run__task__key")[: EVENT_PAGE_SIZE + 1]
    )
    more = len(events) > EVENT_PAGE_SIZE
    events = events[:EVENT_PAGE_SIZE]
    keys = {e[2]: e[-1] for e in events if e[2]}
    rows = event_rows((e[:-1] for e in events), keys)
    context = {
        "run": run,
        "events": rows,
        "events_html": render_event_rows(rows),
        "next_after": rows[-1].seq if more else None,
        "after": after,
    }
    return render(request, "frontend/runs/events.html", context)


@require_GET
@organization_required
def run_task_output(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/output/``: one task run's whole output as JSON
    (the run page shows a cut preview). 404 for a task run not of this run, or another
    organization's."""
    # The output as PostgreSQL writes jsonb, not re-serialized; one query (the run is not read).
    task_run = access_task_run(
        request.membership.organization, run_id, task_run_id,
        shape=lambda qs: qs.annotate(output_text=Cast("output", TextField())).only(
            "id", "organization_id", "fencing_token"))
    text = task_run.output_text
    if text is not None and len(text) < 512 and offload.is_ref(json.loads(text)):
        # Kept in the offload storage (engine.offload): the whole output from there.
        payload = offload.payload_of(task_run)
        if payload is not None:
            try:
                text = offload.read_payload(payload)
            except offload.PayloadUnavailable as exc:
                return HttpResponse(str(exc), status=410, content_type="text/plain; charset=utf-8")
    response = HttpResponse(text if text is not None else "null", content_type="application/json")
    response["Content-Disposition"] = f'inline; filename="{task_run_id}-output.json"'
    return response


@require_GET
@organization_required
def run_task_logs(request: HttpRequest, run_id: uuid.UUID, task_run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/tasks/<task run id>/logs/``: the log lines of one task run, every
    attempt's (or one generation's: ``?fencing_token=``), oldest first, as plain text (the
    run page and the task panel show attempts' last lines); at most TASK_LOG_PAGE_LINES,
    then a line saying where the rest is. 404 for a task run not of this run, or another
    organization's."""
    org = request.membership.organization
    task_run = access_task_run(org, run_id, task_run_id, shape=lambda qs: qs.only("id", "organization_id"))
    lines = TaskLog.objects.for_organization(org).filter(task_run=task_run)  # idx_tasklog_taskrun
    token = whole_number(request.GET.get("fencing_token"))
    if token is not None:
        lines = lines.filter(fencing_token=token)
    lines = list(
        lines.order_by("id").values_list("id", "attempt", "fencing_token", "stream", "level", "message",
                                         "created_at")[: TASK_LOG_PAGE_LINES + 1]
    )
    text = "".join(
        f"{created_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S.%f} attempt {attempt} gen {gen} {stream:7} "
        f"{level.upper():7} {message}\n"
        for _id, attempt, gen, stream, level, message, created_at in lines[:TASK_LOG_PAGE_LINES]
    )
    if len(lines) > TASK_LOG_PAGE_LINES:
        text += (f"... more lines: GET /api/v1/runs/{run_id}/task-runs/{task_run_id}/logs/"
                 f"?after={lines[TASK_LOG_PAGE_LINES - 1][0]}"
                 + (f"&fencing_token={token}" if token is not None else "") + "\n")
    # Plain text (never rendered as HTML: nosniff is set site-wide), shown in the browser.
    response = HttpResponse(text or "(no log lines)\n", content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{task_run_id}-logs.txt"'
    return response


def authorize_operate(request: HttpRequest) -> None:
    """PermissionDenied (a 403) unless the member may operate runs (``run.operate``)."""
    try:
        require(request.actor.role, Action.RUN_OPERATE)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None


# Outside ATOMIC_REQUESTS: cancel_run retries its own transaction on a deadlock with a
# racing completion (engine.db.atomic_retry), which only works as the outermost one.
@transaction.non_atomic_requests
@require_POST
@organization_required
def run_cancel(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = run_or_404(request, run_id)
    authorize_operate(request)
    try:
        changed = cancel_run(run=run, actor=request.actor, reason=f"cancelled in the web UI by {request.user.email}")
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    if changed:
        messages.success(request, "The run was cancelled.")
    else:
        messages.info(request, "The run had already finished; nothing was cancelled.")
    return redirect("frontend:run_detail", run_id=run.pk)


@require_POST
@organization_required
def run_retry(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = run_or_404(request, run_id)
    authorize_operate(request)
    try:
        new = retry_run(actor=request.actor, run=run)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except (RunNotFinished, WorkflowNotStartable, QuotaExceeded, ValueError) as exc:
        messages.error(request, str(exc))
        return redirect("frontend:run_detail", run_id=run.pk)
    messages.success(request, "A new run was started with the same input.")
    return redirect("frontend:run_detail", run_id=new.pk)
