"""Runs: the list, the run page (header, DAG, timeline, tasks, events), its live
fragment and event stream, the full event log, and the Cancel / Retry actions.

Every run id in a URL is looked up in the active organization only, before any
permission check, so another organization's run is a 404 and never a 403. Refused
actions (no ``run.operate``) are a 403. Views parse and authorize; the engine's
services (``engine.services``) change state.

Every page and fragment makes a constant number of queries, whatever the number of
tasks, runs or events (tests/unit/test_web_runs.py counts them):

- the run list: one query for the page of runs (keyset over ``idx_wfrun_org_recent``,
  never OFFSET), one for the page's task-run counts, one for the workflow filter;
- the run page and its live fragment: the run, its retries, who started it (its
  ``run.started`` audit row), its task runs with their tasks (as tuples, not models),
  the workflow's edges, the attempt events for the timeline and the latest events for
  the log. The DAG drawing is cached by workflow version and task states (_dag_svg),
  and the rows that grow with the run are built without template loops (see "row
  markup"), so a 200-task run's page costs about twice a 5-task one's
  (bench/bench_pages.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from html import escape as html_escape
from typing import Any

from django import forms
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Left
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import ValidationError

from api.pagination import decode_cursor, encode_cursor
from audit.models import AuditLog
from engine import live_limits
from engine.models import (
    RunState,
    TaskDependency,
    TaskRun,
    TaskRunEvent,
    Workflow,
    WorkflowRun,
)
from engine.outputs import output_bytes_expression
from engine.services import RunNotFinished, WorkflowNotStartable, cancel_run, retry_run
from flowforge.instants import InstantError, storable_instant
from frontend import live
from frontend.dag import render_dag_svg, render_state_legend
from frontend.organization import organization_required
from tenancy import reauthorization
from tenancy.permissions import Action, Forbidden, can, require

# Runs per page of the run list.
RUN_PAGE_SIZE = 50
# Events shown on the run page (the latest ones); the event-log page has them all.
EVENT_LOG_LIMIT = 200
# Events per page of the event-log page.
EVENT_PAGE_SIZE = 500
# Characters of a task's output and error shown in the task table.
OUTPUT_PREVIEW_CHARS = 120
ERROR_PREVIEW_CHARS = 300
# Retries of a run linked from its header.
RETRY_LINKS_LIMIT = 20

# Event kinds that open and close one attempt of a task run, for the timeline.
ATTEMPT_START_KINDS = ("started",)
ATTEMPT_END_KINDS = ("succeeded", "attempt_failed", "attempt_timed_out", "lease_expired", "cancelled")
TIMELINE_KINDS = ATTEMPT_START_KINDS + ATTEMPT_END_KINDS


# --- small presentation helpers ------------------------------------------------------------


def human_duration(seconds: float | None) -> str:
    """``seconds`` as a short human duration ("340 ms", "12.4 s", "3 m 05 s", "2 h 07 m"); "" for None."""
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m} m {s:02d} s"
    h, rem = divmod(int(seconds), 3600)
    return f"{h} h {rem // 60:02d} m"


def human_bytes(n: int) -> str:
    """``n`` bytes as "812 B", "4.0 KiB", "255.0 KiB", "1.2 MiB"."""
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def compact_json(value: Any, *, limit: int) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters with an ellipsis."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_detail_text(detail: Any) -> str:
    """An event's detail as ``key: value`` pairs on one line (errors first), at most 240 characters."""
    if not isinstance(detail, dict) or not detail:
        return ""
    keys = sorted(detail, key=lambda k: (k != "error", k != "reason", k))
    parts = [f"{k}: {compact_json(detail[k], limit=160)}" for k in keys if detail[k] not in (None, "", {})]
    return compact_json("; ".join(parts), limit=240)


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


# --- keyset pages (created_at DESC, id DESC) --------------------------------------------


class BadCursor(ValueError):
    """A page link's cursor that this site did not issue."""


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a newest-first list: ``older``/``newer`` are cursors for the
    adjacent pages (None when there is none, as far as one query can tell)."""

    rows: list[Any]
    older: str | None
    newer: str | None


def _cursor(raw: str | None) -> tuple[dt.datetime, uuid.UUID] | None:
    if not raw:
        return None
    try:
        return decode_cursor(raw)
    except ValidationError:
        raise BadCursor(raw) from None


def newest_first_page(qs: QuerySet, *, older_than: str | None, newer_than: str | None, size: int) -> Page:
    """One page of ``qs`` ordered by (created_at DESC, id DESC) — the keyset of
    ``api.pagination`` (its opaque cursors), in both directions, never OFFSET.

    ``older_than``: the rows after that cursor (the next, older page); ``newer_than``:
    the rows before it (the previous, newer page). One query, fetching one row more
    than ``size`` to know whether the page has a neighbour on that side. Raises
    BadCursor for a cursor this site did not issue.
    """
    newer_cursor = _cursor(newer_than)
    older_cursor = None if newer_cursor else _cursor(older_than)
    if newer_cursor is not None:
        t, pk = newer_cursor
        # (created_at, id) > (t, pk), spelled so that ``created_at >= t`` is an index condition.
        rows = list(
            qs.filter(Q(created_at__gte=t) & (Q(created_at__gt=t) | Q(id__gt=pk))).order_by("created_at", "id")[
                : size + 1
            ]
        )
        more = len(rows) > size
        rows = rows[:size][::-1]
        if not rows:
            return Page(rows=[], older=None, newer=None)
        return Page(
            rows=rows,
            older=encode_cursor(rows[-1].created_at, rows[-1].pk),  # the cursor's own row is older
            newer=encode_cursor(rows[0].created_at, rows[0].pk) if more else None,
        )
    qs = qs.order_by("-created_at", "-id")
    if older_cursor is not None:
        t, pk = older_cursor
        qs = qs.filter(Q(created_at__lte=t) & (Q(created_at__lt=t) | Q(id__lt=pk)))
    rows = list(qs[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return Page(
        rows=rows,
        older=encode_cursor(rows[-1].created_at, rows[-1].pk) if more else None,
        newer=encode_cursor(rows[0].created_at, rows[0].pk) if older_cursor is not None and rows else None,
    )


def page_links(request: HttpRequest, page: Page) -> dict[str, str | None]:
    """Query strings of the older/newer pages: the request's filters plus the cursor."""

    def link(param: str, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        query = request.GET.copy()
        query.pop("older_than", None)
        query.pop("newer_than", None)
        query[param] = cursor
        return "?" + query.urlencode()

    return {"older": link("older_than", page.older), "newer": link("newer_than", page.newer)}


# --- the run list -----------------------------------------------------------------------


class DateBound(forms.Field):
    """A date (``2025-06-01``) or a date and time (``2025-06-01T14:30``), in UTC unless it
    names its offset (``+02:00``, at most ±15:59: flowforge.instants); a form error otherwise."""

    def to_python(self, value: str | None) -> dt.datetime | dt.date | None:
        value = (value or "").strip()
        if not value:
            return None
        try:
            if "T" in value or " " in value:
                parsed = dt.datetime.fromisoformat(value)
                # An offset beyond ±15:59 would reach PostgreSQL and fail there (a 500).
                return storable_instant(parsed) if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
            return dt.date.fromisoformat(value)
        except InstantError as exc:
            raise forms.ValidationError(str(exc)) from None
        except ValueError:
            raise forms.ValidationError("Enter a date as YYYY-MM-DD.") from None


def lower_bound(value: dt.datetime | dt.date | None) -> dt.datetime | None:
    """The first instant a "from" bound includes (a date: its midnight, UTC)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value, dt.time.min, tzinfo=dt.UTC)


def upper_bound(value: dt.datetime | dt.date | None) -> dt.datetime | None:
    """The first instant a "to" bound excludes (a date: the next midnight, so the day is included)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value + dt.timedelta(days=1), dt.time.min, tzinfo=dt.UTC)


class RunFilterForm(forms.Form):
    workflow = forms.CharField(required=False, max_length=200)
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *RunState.choices])
    created_after = DateBound(required=False)
    created_before = DateBound(required=False)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Task-run counts of one run, for the list's progress bar (SVG widths out of 100)."""

    total: int
    counts: dict[str, int]

    @property
    def done(self) -> int:
        return sum(self.counts.get(s, 0) for s in ("succeeded", "failed", "skipped", "cancelled"))

    @property
    def segments(self) -> list[tuple[str, float, float]]:
        """(state, x, width) of each non-empty state, in a fixed order, on a 0-100 scale."""
        out, x = [], 0.0
        if not self.total:
            return out
        for state in ("succeeded", "failed", "cancelled", "skipped", "running", "ready"):
            n = self.counts.get(state, 0)
            if n:
                width = 100.0 * n / self.total
                out.append((state, round(x, 2), round(width, 2)))
                x += width
        return out


@dataclasses.dataclass(frozen=True)
class RunRow:
    run: WorkflowRun
    progress: Progress
    duration: str


def _run_list_queryset(org, data: dict[str, Any]) -> QuerySet:
    qs = (
        WorkflowRun.objects.for_organization(org)
        .select_related("workflow", "triggered_by", "trigger")
        # A workflow's document and a run's input can be large and are not shown here.
        .defer("input", "workflow__definition", "workflow__description", "trigger__input")
    )
    workflow = (data.get("workflow") or "").strip()
    if workflow:
        try:
            qs = qs.filter(workflow_id=uuid.UUID(workflow))
        except ValueError:
            qs = qs.filter(workflow__name=workflow)
    if data.get("state"):
        qs = qs.filter(state=data["state"])
    if (after := lower_bound(data.get("created_after"))) is not None:
        qs = qs.filter(created_at__gte=after)
    if (before := upper_bound(data.get("created_before"))) is not None:
        qs = qs.filter(created_at__lt=before)
    return qs


def _progress_by_run(org, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Progress]:
    """Task-run counts by state for the page's runs: one GROUP BY (idx_taskrun_run_state)."""
    counts: dict[uuid.UUID, dict[str, int]] = defaultdict(dict)
    if run_ids:
        rows = (
            TaskRun.objects.for_organization(org)
            .filter(workflow_run_id__in=run_ids)
            .values_list("workflow_run_id", "state")
            .annotate(n=Count("id"))
            .order_by()
        )
        for run_id, state, n in rows:
            counts[run_id][state] = n
    return {rid: Progress(total=sum(counts[rid].values()), counts=dict(counts[rid])) for rid in run_ids}


@require_GET
@organization_required
def run_list(request: HttpRequest) -> HttpResponse:
    """``/runs/``: the organization's runs, newest first, filtered, keyset-paged."""
    org = request.membership.organization
    form = RunFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    status = 200 if form.is_valid() else 400
    qs = _run_list_queryset(org, data)
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
    progress = _progress_by_run(org, [r.pk for r in page.rows])
    now = timezone.now()
    rows = [
        RunRow(
            run=r,
            progress=progress[r.pk],
            duration=human_duration(_seconds(r.started_at or r.created_at, r.finished_at or now)),
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
    }
    return render(request, "frontend/runs/list.html", context, status=status)


# --- the run page --------------------------------------------------------------------------


@dataclasses.dataclass
class Attempt:
    """One attempt of one task run, from its ``started`` event to the event that ended it."""

    number: int | None
    start: dt.datetime
    end: dt.datetime | None = None
    outcome: str = "running"  # running, succeeded, failed, retried, timed_out, lease_expired, cancelled
    error: str = ""
    # SVG coordinates on the timeline (set by Timeline).
    x: float = 0.0
    width: float = 0.0

    @property
    def duration(self) -> str:
        return human_duration(_seconds(self.start, self.end)) if self.end else "running"

    @property
    def label(self) -> str:
        outcome = self.outcome.replace("_", " ")
        return f"attempt {self.number or '?'}: {outcome}, {self.duration}"


def attempts_from_events(events: Iterable[tuple]) -> dict[uuid.UUID, list[Attempt]]:
    """Attempts per task run from its (task_run_id, kind, created_at, attempt, to_state,
    error text) events in ``seq`` order: a ``started`` opens an attempt, the next end event
    (succeeded, attempt_failed, attempt_timed_out, lease_expired, cancelled) closes it.

    An ``attempt_failed`` that sent the task back to ``ready`` is a ``retried`` attempt;
    one that failed the task is ``failed``. An attempt with no end event yet is
    ``running``.
    """
    out: dict[uuid.UUID, list[Attempt]] = defaultdict(list)
    open_: dict[uuid.UUID, Attempt] = {}
    for task_run_id, kind, created_at, attempt, to_state, error in events:
        if kind in ATTEMPT_START_KINDS:
            current = Attempt(number=attempt, start=created_at)
            open_[task_run_id] = current
            out[task_run_id].append(current)
            continue
        current = open_.pop(task_run_id, None)
        if current is None:
            continue  # e.g. a pending task cancelled before it ever started
        current.end = created_at
        if kind == "succeeded":
            current.outcome = "succeeded"
        elif kind == "cancelled":
            current.outcome = "cancelled"
        else:
            retried = to_state == "ready"
            current.outcome = {
                "attempt_failed": "retried" if retried else "failed",
                "attempt_timed_out": "timed_out",
                "lease_expired": "lease_expired",
            }[kind]
            current.error = compact_json(error or "", limit=200)
    return out


@dataclasses.dataclass
class TaskRow:
    """One task of the run, as the DAG, the timeline and the task table show it."""

    id: uuid.UUID  # the task run's
    task_id: uuid.UUID
    key: str
    type: str
    state: str
    max_attempts: int
    position_x: int | None
    position_y: int | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    depth: int
    attempts: list[Attempt]
    output_preview: str
    error_preview: str
    output_bytes: int | None = None  # size of the output's JSON text
    output_url: str = ""  # the whole output, when the preview is cut

    @property
    def duration(self) -> str:
        if self.started_at is None:
            return ""
        if self.finished_at is None:
            return human_duration(_seconds(self.started_at, timezone.now())) if self.state == "running" else ""
        return human_duration(_seconds(self.started_at, self.finished_at))


def depth_of(task_ids: Iterable[uuid.UUID], edges: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> dict[uuid.UUID, int]:
    """Each task's longest distance from a root, for ``(task, depends_on)`` edges."""
    ids = list(task_ids)
    upstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    downstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for task, dep in edges:
        upstream[task].append(dep)
        downstream[dep].append(task)
    remaining = {t: len(upstream[t]) for t in ids}
    depth = {t: 0 for t in ids}
    frontier = [t for t in ids if remaining[t] == 0]
    while frontier:
        nxt = []
        for t in frontier:
            for d in downstream[t]:
                if d not in remaining:
                    continue
                depth[d] = max(depth[d], depth[t] + 1)
                remaining[d] -= 1
                if remaining[d] == 0:
                    nxt.append(d)
        frontier = nxt
    return depth


# Timeline geometry, in SVG user units (the SVG scales to its container).
TL_WIDTH = 1000.0
TL_LABEL = 190.0  # left column with the task keys
TL_RIGHT_PAD = 12.0
TL_ROW = 22.0
TL_BAR = 14.0
TL_AXIS = 26.0  # room for the time axis at the top
TL_MIN_BAR = 4.0


@dataclasses.dataclass
class TimelineRow:
    key: str
    y: float
    bar_y: float
    text_y: float
    attempts: list[Attempt]
    state: str


@dataclasses.dataclass
class Timeline:
    """The Gantt chart of every attempt of every task: positions are precomputed
    SVG attributes (x/width), since inline styles are forbidden by the CSP."""

    rows: list[TimelineRow]
    ticks: list[tuple[float, str]]
    height: float
    width: float
    chart_x: float
    chart_end: float
    span_label: str
    has_attempts: bool


def _nice_step(span: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 8:
            return step
    return span / 6


def _tick_label(seconds: float, step: float) -> str:
    if step < 1:
        return f"{seconds:.1f}s"
    if seconds < 60 or step < 60:
        return f"{seconds:.0f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    return f"{seconds / 3600:.1f}h".replace(".0h", "h")


def build_timeline(run: WorkflowRun, rows: Sequence[TaskRow], *, now: dt.datetime) -> Timeline:
    t0 = run.started_at or run.created_at
    end = run.finished_at or now
    starts = [a.start for r in rows for a in r.attempts]
    ends = [a.end or now for r in rows for a in r.attempts]
    if starts:
        t0 = min(t0, *starts)
        end = max(end, *ends)
    span = max((end - t0).total_seconds(), 0.5)
    chart_x = TL_LABEL
    chart_w = TL_WIDTH - TL_LABEL - TL_RIGHT_PAD
    scale = chart_w / span
    out_rows = []
    for i, r in enumerate(rows):
        y = TL_AXIS + i * TL_ROW
        for a in r.attempts:
            a.x = round(chart_x + (a.start - t0).total_seconds() * scale, 2)
            # At least TL_MIN_BAR wide, so a 5 ms attempt is still visible and hoverable.
            a.width = round(max(TL_MIN_BAR, ((a.end or now) - a.start).total_seconds() * scale), 2)
            a.x = min(a.x, TL_WIDTH - TL_RIGHT_PAD - TL_MIN_BAR)
        out_rows.append(
            TimelineRow(
                key=r.key,
                y=y,
                bar_y=y + (TL_ROW - TL_BAR) / 2,
                text_y=y + TL_ROW / 2 + 4,
                attempts=r.attempts,
                state=r.state,
            )
        )
    step = _nice_step(span)
    ticks = []
    t = 0.0
    while t <= span + 1e-9:
        ticks.append((round(chart_x + t * scale, 2), _tick_label(t, step)))
        t += step
    return Timeline(
        rows=out_rows,
        ticks=ticks,
        height=TL_AXIS + max(1, len(rows)) * TL_ROW + 6,
        width=TL_WIDTH,
        chart_x=chart_x,
        chart_end=TL_WIDTH - TL_RIGHT_PAD,
        span_label=human_duration(span),
        has_attempts=bool(starts),
    )


@dataclasses.dataclass
class EventRow:
    seq: int
    created_at: dt.datetime
    task_key: str
    kind: str
    from_state: str
    to_state: str
    attempt: int | None
    detail: str


# --- row markup ----------------------------------------------------------------------------
#
# The three lists that grow with a run (task table, timeline rows, event log) are built
# here rather than in template loops: a Django template row with a dozen variables
# costs ~0.3 ms, so 200 tasks and 200 events would make the page several times slower
# than a 5-task one; these cost a few microseconds a row. Every interpolated text goes
# through ``_esc`` (html.escape, quotes included); the templates insert the results.


def _esc(value: object) -> str:
    return html_escape(str(value), quote=True)


def render_task_rows(rows: Sequence[TaskRow]) -> SafeString:
    """The task table's ``<tr>``s: key, type, state, attempts, duration, error, output."""
    out = []
    for r in rows:
        key, state = _esc(r.key), _esc(r.state)
        error = (f'<span class="error-text" title="{_esc(r.error_preview)}">{_esc(r.error_preview)}</span>'
                 if r.error_preview else "")
        output = f'<code class="output">{_esc(r.output_preview)}</code>' if r.output_preview else ""
        if r.output_url:
            output += (f' <a class="output-link" href="{_esc(r.output_url)}">whole output'
                       f' ({_esc(human_bytes(r.output_bytes or 0))})</a>')
        out.append(
            f'<tr id="task-{key}" class="task-row state-{state}" data-task-key="{key}">'
            f'<td class="mono key">{key}</td><td><span class="type">{_esc(r.type)}</span></td>'
            f'<td><span class="badge state-{state}">{_esc(r.state.capitalize())}</span></td>'
            f'<td class="num">{len(r.attempts)}<span class="muted">/{r.max_attempts}</span></td>'
            f'<td class="num">{_esc(r.duration)}</td><td class="error-cell">{error}</td>'
            f'<td class="output-cell">{output}</td></tr>'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def render_timeline_rows(timeline: Timeline) -> SafeString:
    """The timeline's rows: a band, the task key and one bar (x/width attributes) per attempt."""
    out = []
    width = _num(timeline.width)
    for row in timeline.rows:
        key = _esc(row.key)
        label = _esc(row.key if len(row.key) <= 26 else row.key[:25] + "…")
        bars = "".join(
            f'<rect class="tl-bar outcome-{a.outcome}" x="{_num(a.x)}" y="{_num(row.bar_y)}" '
            f'width="{_num(a.width)}" height="{_num(TL_BAR)}" rx="3"><title>{key} · {_esc(a.label)}'
            + (f" — {_esc(a.error)}" if a.error else "")
            + "</title></rect>"
            for a in row.attempts
        )
        out.append(
            f'<g class="tl-row" data-task-key="{key}"><rect class="tl-band" x="0" y="{_num(row.y)}" '
            f'width="{width}" height="{_num(TL_ROW)}"></rect>'
            f'<text class="tl-label" x="8" y="{_num(row.text_y)}">{label}</text>{bars}</g>'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def render_event_rows(events: Sequence[EventRow]) -> SafeString:
    """The event log's ``<tr>``s: seq, time, task, kind, from → to, detail."""
    out = []
    for e in events:
        kind = _esc(e.kind)
        transition = ""
        if e.from_state or e.to_state:
            transition = (f'<span class="st st-{_esc(e.from_state)}">{_esc(e.from_state or "·")}</span> → '
                          f'<span class="st st-{_esc(e.to_state)}">{_esc(e.to_state or "·")}</span>')
        attempt = f'<span class="muted">#{e.attempt}</span> ' if e.attempt else ""
        stamp = e.created_at.astimezone(dt.UTC)
        out.append(
            f'<tr data-seq="{e.seq}" class="event kind-{kind}"><td class="num mono">{e.seq}</td>'
            f'<td class="mono time" title="{stamp:%Y-%m-%d %H:%M:%S.%f} UTC">{stamp:%H:%M:%S}.{stamp.microsecond // 1000:03d}</td>'
            f'<td class="mono">{_esc(e.task_key or "—")}</td><td><span class="kind">{kind}</span></td>'
            f'<td class="transition">{transition}</td><td class="detail">{attempt}{_esc(e.detail)}</td></tr>\n'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def _num(value: float) -> str:
    """An SVG coordinate: no trailing ".0", at most two decimals."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text or "0"


@dataclasses.dataclass
class RunView:
    """Everything the run page and its live fragment show."""

    run: WorkflowRun
    rows: list[TaskRow]
    edges: list[tuple[uuid.UUID, uuid.UUID, str]]
    timeline: Timeline
    events: list[EventRow]
    events_replace: bool  # the fragment's events replace the log instead of extending it
    events_truncated: bool  # the log shows only the latest EVENT_LOG_LIMIT events
    last_seq: int
    counts: dict[str, int]
    duration: str
    retries: list[WorkflowRun]
    can_operate: bool
    dag_svg: str

    @property
    def is_terminal(self) -> bool:
        return self.run.is_terminal

    @property
    def task_rows_html(self) -> SafeString:
        return render_task_rows(self.rows)

    @property
    def timeline_rows_html(self) -> SafeString:
        return render_timeline_rows(self.timeline)

    @property
    def event_rows_html(self) -> SafeString:
        return render_event_rows(self.events)


def _run_queryset(org) -> QuerySet:
    return (
        WorkflowRun.objects.for_organization(org)
        .select_related("workflow", "triggered_by", "trigger")
        .defer("input", "workflow__definition", "trigger__input")
    )


def run_or_404(request: HttpRequest, run_id: uuid.UUID) -> WorkflowRun:
    """The active organization's run ``run_id``; Http404 for a missing or another organization's run."""
    try:
        return _run_queryset(request.membership.organization).get(pk=run_id)
    except WorkflowRun.DoesNotExist:
        raise Http404("no such run") from None


# The columns of an event-log row, in EventRow's order after ``seq``/``created_at``.
EVENT_COLUMNS = ("seq", "created_at", "task_run_id", "kind", "from_state", "to_state", "attempt", "detail")


def _event_rows(events: Iterable[tuple], keys: dict[uuid.UUID, str]) -> list[EventRow]:
    """EventRows from EVENT_COLUMNS tuples; ``keys`` maps task-run ids to task keys."""
    return [
        EventRow(
            seq=seq,
            created_at=created_at,
            task_key=keys.get(task_run_id, "") if task_run_id else "",
            kind=kind,
            from_state=from_state,
            to_state=to_state,
            attempt=attempt,
            detail=event_detail_text(detail),
        )
        for seq, created_at, task_run_id, kind, from_state, to_state, attempt, detail in events
    ]


# Seconds a drawn DAG is kept in the cache (see _dag_svg).
DAG_CACHE_SECONDS = 24 * 3600


def _dag_svg(rows: Sequence[TaskRow], edges, *, run: WorkflowRun) -> str:
    """The workflow's DAG with each node coloured by its task run's state (frontend.dag);
    a node links to its row in the task table.

    The drawing depends only on the workflow version (immutable) and the task states,
    so it is cached under both (and the organization, like every tenant cache key):
    laying out 200 tasks takes ~50 ms, and a finished run's page, the one most viewed,
    then costs what a 5-task page costs. Pages of active runs draw it afresh on most
    updates (their states change), and viewers of one run share each drawing.
    """
    states = {r.task_id: r.state for r in rows}
    digest = hashlib.sha256(
        "|".join(f"{task_id}={state}" for task_id, state in sorted(states.items(), key=lambda kv: str(kv[0])))
        .encode()
    ).hexdigest()[:32]
    key = f"ff:run-dag:v1:{run.organization_id}:{run.workflow_id}:{digest}"
    svg = cache.get(key)
    if svg is not None:
        return svg
    tasks = [
        {"id": r.task_id, "key": r.key, "type": r.type, "position_x": r.position_x, "position_y": r.position_y}
        for r in rows
    ]
    # frontend.dag takes edges from the upstream task to its dependent.
    edge_list = [(dep, task, label) for task, dep, label in edges]
    svg = str(render_dag_svg(tasks, edge_list, states=states, link=lambda t: f"#task-{t['key']}"))
    cache.set(key, svg, DAG_CACHE_SECONDS)
    return svg


def build_run_view(
    request: HttpRequest, run: WorkflowRun, *, events_after: int | None = None
) -> RunView:
    """Load and shape what the run page (``events_after`` None) or its fragment shows.

    Queries (constant): retries, task runs with tasks, edges, timeline events, log events.
    With ``events_after`` the log holds the events after that seq (at most
    EVENT_LOG_LIMIT; when more are new, the latest EVENT_LOG_LIMIT and
    ``events_replace``), else the latest EVENT_LOG_LIMIT events.
    """
    org = request.membership.organization
    now = timezone.now()
    retries = list(
        WorkflowRun.objects.for_organization(org)
        .filter(retry_of=run)
        .order_by("created_at")
        .only("id", "state", "created_at", "retry_of_id", "organization_id")[:RETRY_LINKS_LIMIT]
    )
    # Plain tuples, not models: 200 task runs with their tasks are 400 model instances otherwise.
    task_runs = list(
        TaskRun.objects.for_organization(org)
        .filter(workflow_run=run)  # idx_taskrun_run_state
        .values_list(
            "id", "task_id", "task__key", "task__type", "state", "task__max_attempts", "task__position_x",
            "task__position_y", "started_at", "finished_at",
            # Outputs (up to 256 KiB each) and errors are cut in the database; an output's
            # size is read there too, for the link to the whole output.
            Left(Cast("output", TextField()), OUTPUT_PREVIEW_CHARS + 1),
            Left(F("error"), ERROR_PREVIEW_CHARS + 1),
            output_bytes_expression(),
        )
    )
    edges = list(
        TaskDependency.objects.for_organization(org)
        .filter(workflow_id=run.workflow_id)
        .values_list("task_id", "depends_on_id", "label")
    )
    attempt_events = (
        TaskRunEvent.objects.for_organization(org)
        .filter(workflow_run=run, kind__in=TIMELINE_KINDS, task_run__isnull=False, seq__lte=run.last_event_seq)
        .order_by("seq")
        # The error as text, read in the database: no JSON decoding of every event's detail.
        .values_list("task_run_id", "kind", "created_at", "attempt", "to_state", KeyTextTransform("error", "detail"))
    )
    attempts = attempts_from_events(attempt_events)
    depth = depth_of((tr[1] for tr in task_runs), ((t, d) for t, d, _ in edges))
    run_path = reverse("frontend:run_detail", kwargs={"run_id": run.pk})  # once, not per row
    rows = [
        TaskRow(
            id=tr_id, task_id=task_id, key=key, type=type_, state=state, max_attempts=max_attempts,
            position_x=px, position_y=py, started_at=started_at, finished_at=finished_at,
            depth=depth.get(task_id, 0), attempts=attempts.get(tr_id, []),
            output_preview=_cut(output, OUTPUT_PREVIEW_CHARS), error_preview=_cut(error, ERROR_PREVIEW_CHARS),
            # A preview that was cut links to the whole output.
            output_bytes=output_bytes,
            output_url=f"{run_path}tasks/{tr_id}/output/" if output and len(output) > OUTPUT_PREVIEW_CHARS else "",
        )
        for (tr_id, task_id, key, type_, state, max_attempts, px, py, started_at, finished_at, output, error,
             output_bytes) in task_runs
    ]
    rows.sort(key=lambda r: (r.depth, r.key))
    keys = {r.id: r.key for r in rows}
    # Events up to the run's seq as read with the run (run_or_404), before the task runs:
    # the states shown are then at least as new as the last event shown, and the client's
    # cursor (last_seq) never passes an event whose effect the page does not show yet.
    # Newer events are the next fragment's (their notifications come after this read).
    log = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, seq__lte=run.last_event_seq)
    replace = events_after is None
    if events_after is not None:
        log = log.filter(seq__gt=events_after)
    latest = list(
        log.order_by("-seq").values_list(*EVENT_COLUMNS)[: EVENT_LOG_LIMIT + 1]  # uniq_event_run_seq, backwards
    )
    truncated = len(latest) > EVENT_LOG_LIMIT
    if truncated and events_after is not None:
        replace = True  # more is new than the log keeps: start it afresh
    events = _event_rows(reversed(latest[:EVENT_LOG_LIMIT]), keys)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r.state] += 1
    return RunView(
        run=run,
        rows=rows,
        edges=edges,
        timeline=build_timeline(run, rows, now=now),
        events=events,
        events_replace=replace,
        events_truncated=truncated,
        last_seq=run.last_event_seq,
        counts=dict(counts),
        duration=human_duration(_seconds(run.started_at or run.created_at, run.finished_at or now)),
        retries=retries,
        can_operate=can(request.membership.role, Action.RUN_OPERATE),
        dag_svg=_dag_svg(rows, edges, run=run),
    )


def _cut(text: str | None, limit: int) -> str:
    if not text or text == "null":  # no output, or a JSON null
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _started_by(org, run: WorkflowRun) -> str:
    """Who started ``run``: a person's email, an API key's prefix, a cron trigger, or the system."""
    if run.trigger_id:
        return f"cron trigger {run.trigger.name}" if run.trigger else "a cron trigger"
    entry = (
        AuditLog.objects.for_organization(org)
        .filter(target_id=str(run.pk), action="run.started")  # idx_auditlog_target_id
        .only("actor_type", "actor_email", "actor_api_key_prefix")
        .first()
    )
    if entry is not None:
        if entry.actor_type == "api_key":
            return f"API key {entry.actor_api_key_prefix}" + (f" ({entry.actor_email})" if entry.actor_email else "")
        if entry.actor_email:
            return entry.actor_email
        if entry.actor_type == "system":
            return "FlowForge (system)"
    if run.triggered_by is not None:
        return run.triggered_by.email
    return "—"


def _live_urls(run: WorkflowRun) -> dict[str, str]:
    return {
        "fragment": reverse("frontend:run_live", kwargs={"run_id": run.pk}),
        "stream": reverse("frontend:run_stream", kwargs={"run_id": run.pk}),
    }


@require_GET
@organization_required
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/``: header, DAG, timeline, tasks and events; live while the run is active."""
    run = run_or_404(request, run_id)
    view = build_run_view(request, run)
    context = {
        "v": view,
        "run": run,
        "workflow_url": _workflow_url(run.workflow),
        "started_by": _started_by(request.membership.organization, run),
        "live": _live_urls(run),
        "state_legend": render_state_legend(),
    }
    return render(request, "frontend/runs/detail.html", context)


@require_GET
@organization_required
def run_live(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """``/runs/<id>/live/?after=<seq>``: the run page's changing parts (summary, DAG,
    timeline, tasks) and the events after ``seq``, for the page's live client."""
    run = run_or_404(request, run_id)
    after_raw = request.GET.get("after", "")
    after = int(after_raw) if after_raw.isascii() and after_raw.isdigit() and len(after_raw) < 18 else None
    view = build_run_view(request, run, events_after=after)
    context = {
        "v": view,
        "run": run,
        "workflow_url": _workflow_url(run.workflow),
        "started_by": _started_by(request.membership.organization, run),
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
    raw = request.headers.get("Last-Event-ID") or request.GET.get("after") or ""
    after = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 18 else 0
    user_id, organization_id = request.user.pk, run.organization_id

    def reauthorize() -> bool:
        return reauthorization.member_still_active(user_id=user_id, organization_id=organization_id)

    try:
        lease = live_limits.acquire(organization_id=organization_id, user_id=user_id, reauthorize=reauthorize)
    except live_limits.StreamRefused as exc:
        # The page's client then polls the live fragment instead (run-page.js).
        refused = HttpResponse(str(exc), status=429, content_type="text/plain; charset=utf-8")
        refused["Retry-After"] = str(exc.retry_after)
        return refused
    stream = live_limits.LeasedStream(
        live.run_changes(organization_id=organization_id, run_id=run.pk, after=after, lease=lease), lease)
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
    raw = request.GET.get("after", "")
    after = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 18 else 0
    events = list(
        TaskRunEvent.objects.for_organization(org)
        .filter(workflow_run=run, seq__gt=after)
        .order_by("seq")
        .values_list(*EVENT_COLUMNS, "task_run__task__key")[: EVENT_PAGE_SIZE + 1]
    )
    more = len(events) > EVENT_PAGE_SIZE
    events = events[:EVENT_PAGE_SIZE]
    keys = {e[2]: e[-1] for e in events if e[2]}
    rows = _event_rows((e[:-1] for e in events), keys)
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
    run = run_or_404(request, run_id)
    found = list(
        TaskRun.objects.for_organization(request.membership.organization)
        .filter(workflow_run=run, pk=task_run_id)
        .values_list(Cast("output", TextField()), flat=True)[:1]
    )
    if not found:
        raise Http404("no such task run")
    response = HttpResponse(found[0] if found[0] is not None else "null", content_type="application/json")
    response["Content-Disposition"] = f'inline; filename="{task_run_id}-output.json"'
    return response


def _authorize_operate(request: HttpRequest) -> None:
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
    _authorize_operate(request)
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
    _authorize_operate(request)
    try:
        new = retry_run(actor=request.actor, run=run)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except (RunNotFinished, WorkflowNotStartable) as exc:
        messages.error(request, str(exc))
        return redirect("frontend:run_detail", run_id=run.pk)
    messages.success(request, "A new run was started with the same input.")
    return redirect("frontend:run_detail", run_id=new.pk)
