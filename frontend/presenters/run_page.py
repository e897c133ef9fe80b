"""What the run page and its live fragment show, loaded in a constant number of queries.

``build_run_view`` reads the run's retries, its task runs with their tasks (as tuples,
not models), the workflow's edges, the attempt events for the timeline and the latest
events for the log (and, for a run with worker tasks, whether their queues have a live
worker and their log lines); the DAG is sent as data (``graph_data``, drawn in the browser)
and a live update resends only its states (``graph_states``, a letter a task), and the rows that grow with the run are built without template loops
(frontend.presenters.run_rows), so a 200-task run's page costs about twice a 5-task
one's (bench/bench_pages.py). ``started_by`` reads the run's ``run.started`` audit row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from urllib.parse import urlencode

from django import forms
from django.db.models import BigIntegerField, Case, F, Func, JSONField, QuerySet, TextField, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Left
from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from audit.models import AuditLog
from engine import offload, trigger_rules, worker_queues
from engine.models import TaskDependency, TaskRun, TaskRunEvent, TriggerSource, WorkflowRun
from engine.outputs import output_bytes_expression
from engine.repositories import waiting
from engine.repositories import worker_queues as worker_rows
from engine.states import (
    FAILURE_HANDLING_RULES,
    RUN_TERMINAL_STATES,
    TASK_TERMINAL_STATES,
    RunState,
    TaskRunState,
)
from frontend.dag import graph_data, longest_path_layers, states_code
from frontend.presenters.run_rows import (
    EventRow,
    render_event_rows,
    render_log_blocks,
    render_task_rows,
    render_timeline_rows,
)
from frontend.presenters.text import cut, event_detail_text, retry_at, run_duration, without_countdown
from frontend.presenters.timeline import (
    TIMELINE_KINDS,
    TaskRow,
    Timeline,
    attempts_from_events,
    build_timeline,
)
from tenancy.models import ApiKey
from tenancy.permissions import Action, can

# Events shown on the run page (the latest ones); the event-log page has them all.
EVENT_LOG_LIMIT = 200
# Characters of a task's output and error shown in the task table.
OUTPUT_PREVIEW_CHARS = 120
ERROR_PREVIEW_CHARS = 300
# Retries of a run linked from its header.
RETRY_LINKS_LIMIT = 20
# Worker log lines shown per task run (its newest generation's last ones; the whole log is
# the task's log page and GET /api/v1/runs/{run}/task-runs/{id}/logs/), and task runs whose
# logs are shown (those with the newest lines).
LOG_LINES_PER_TASK = 200
LOG_TASKS_LIMIT = 20
# Task rows per page of the task table (and rows of the timeline, which shows the same page).
TASK_PAGE_SIZE = 50
# New events a live update carries at most (more: the latest ones, and the log starts afresh).
EVENT_DELTA_LIMIT = 50
# Task runs a live update names as changed at most (more: the whole page is sent again).
CHANGED_TASKS_LIMIT = 1000


class TaskTableForm(forms.Form):
    """The task table's filter and page (issue 20): ``task_state`` (a task-run state),
    ``task_key`` (part of the task's key, any case) and ``task_page`` (1-based). A value
    that is not valid is a 400 naming the parameter; the table is then shown unfiltered."""

    task_state = forms.ChoiceField(
        required=False, choices=[("", "Any state"), *TaskRunState.choices],
        error_messages={"invalid_choice": "task_state: %(value)s is not a task state (one of "
                        + ", ".join(TaskRunState.values) + ")."})
    task_key = forms.CharField(required=False, max_length=200, strip=True,
                               error_messages={"max_length": "task_key: at most %(limit_value)d characters."})
    task_page = forms.IntegerField(
        required=False, min_value=1, max_value=1_000_000,
        error_messages={"invalid": "task_page: a whole number from 1 is expected.",
                        "min_value": "task_page: pages start at 1.",
                        "max_value": "task_page: at most %(limit_value)s."})

    def table_query(self) -> TableQuery:
        """The valid filter (call after ``is_valid()``); the whole table when not valid."""
        if not self.is_valid():
            return TableQuery()
        d = self.cleaned_data
        return TableQuery(state=d.get("task_state") or "", key=d.get("task_key") or "", page=d.get("task_page") or 1)

    @property
    def error_list(self) -> list[str]:
        return [str(e) for errors in self.errors.values() for e in errors]


@dataclasses.dataclass(frozen=True)
class TableQuery:
    """Which task rows the table (and the timeline) shows: a state, part of a key, a page."""

    state: str = ""
    key: str = ""
    page: int = 1

    @property
    def filtered(self) -> bool:
        return bool(self.state or self.key)

    def params(self, **change) -> str:
        """The query string of this filter with ``change`` applied (no leading "?"; page 1 left out)."""
        values = {"task_state": self.state, "task_key": self.key, "task_page": self.page, **change}
        if values["task_page"] == 1:
            del values["task_page"]
        return urlencode({k: v for k, v in values.items() if v not in ("", None)})


@dataclasses.dataclass
class TablePage:
    """The task table's page: its rows, the filtered total, the page number and count."""

    rows: list[TaskRow]
    total: int
    page: int
    pages: int
    query: TableQuery
    sig: str  # digest of the filter and the page's task runs: a live update compares it

    @property
    def first(self) -> int:
        return (self.page - 1) * TASK_PAGE_SIZE + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0

    @property
    def prev_params(self) -> str:
        return self.query.params(task_page=self.page - 1) if self.page > 1 else ""

    @property
    def next_params(self) -> str:
        return self.query.params(task_page=self.page + 1) if self.page < self.pages else ""


def table_page(rows: Sequence[TaskRow], query: TableQuery) -> TablePage:
    """The rows of ``query``'s page (in the table's order), TASK_PAGE_SIZE a page; a page
    past the last is the last."""
    key = query.key.casefold()
    chosen = [r for r in rows if (not query.state or r.state == query.state) and (not key or key in r.key.casefold())]
    pages = max(1, -(-len(chosen) // TASK_PAGE_SIZE))
    page = min(query.page, pages)
    shown = chosen[(page - 1) * TASK_PAGE_SIZE: page * TASK_PAGE_SIZE]
    sig = hashlib.sha256(
        (f"{query.state}|{query.key}|{page}|" + ",".join(str(r.id) for r in shown)).encode()).hexdigest()[:16]
    return TablePage(rows=shown, total=len(chosen), page=page, pages=pages, query=query, sig=sig)


def depth_of(task_ids: Iterable[uuid.UUID], edges: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> dict[uuid.UUID, int]:
    """Each task's longest distance from a root, for ``(task, depends_on)`` edges (the
    DAG drawing's layering: frontend.dag.longest_path_layers)."""
    layers, _ = longest_path_layers(list(task_ids), [(dep, task) for task, dep in edges])
    return layers


@dataclasses.dataclass
class LogBlock:
    """The log lines of one worker task run the run page shows: the last LOG_LINES_PER_TASK
    lines of the generation (attempt ``attempt``, ``fencing_token``) that wrote its newest."""

    task_run_id: uuid.UUID
    key: str
    attempt: int
    fencing_token: int
    lines: list[worker_rows.LogLine]
    truncated: bool  # older lines of that generation are not shown
    url: str  # the task run's whole log, every attempt's (text)


@dataclasses.dataclass
class Resume:
    """One time a person sent the finished run back to running (a ``resumed`` event):
    when, who, which action (on which task) and how many task runs it reopened."""

    seq: int
    at: dt.datetime
    by: str
    action: str
    task: str
    reopened: int
    reason: str

    @property
    def label(self) -> str:
        what = {"resume": "resumed", "retry": f"retried {self.task}", "mark_succeeded": f"marked {self.task} succeeded",
                "skip": f"skipped {self.task}"}.get(self.action, self.action)
        return f"{what} by {self.by}" + (f", {self.reopened} task{'s' if self.reopened != 1 else ''} again"
                                         if self.reopened else "")


#: Failed tasks the failed-run banner names (the task table lists them all).
FAILED_TASKS_NAMED = 5


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
    waiting_reason: str = ""  # a run queued by its workflow's run limit: "waiting: workflow run limit 2/2"
    logs: list[LogBlock] = dataclasses.field(default_factory=list)  # worker task runs' log lines
    logs_more_tasks: bool = False  # more task runs have lines than LOG_TASKS_LIMIT
    has_worker_tasks: bool = False  # a task of the run waits on a queue of the organization's own workers
    resumes: list[Resume] = dataclasses.field(default_factory=list)  # the latest RESUMES_SHOWN, newest first
    csrf_token: str = ""  # for the task table's action forms (rendered in Python, not a template)
    # The task table's page (and the timeline's rows): issue 20's filter and pagination.
    table: TablePage | None = None
    table_errors: list[str] = dataclasses.field(default_factory=list)
    # A live update (``events_after`` given) sends what changed: the task runs touched by the
    # new events (None: all of them), and whether the table and timeline go whole (their page
    # changed, the run finished) or only the changed rows.
    delta: bool = False
    changed: set[uuid.UUID] | None = None
    table_replace: bool = True
    now: dt.datetime | None = None

    @property
    def is_terminal(self) -> bool:
        return self.run.is_terminal

    @property
    def can_resume(self) -> bool:
        """A failed or cancelled run, for someone who may operate runs (engine.recovery.resume_run)."""
        return self.can_operate and self.run.state in (RunState.FAILED, RunState.CANCELLED)

    @property
    def to_rerun(self) -> int:
        """Task runs of the run that did not succeed (a resume runs them again, and their downstream)."""
        return sum(n for state, n in self.counts.items() if state != RunState.SUCCEEDED)

    @property
    def failed_tasks(self) -> list[tuple[TaskRow, str]]:
        """The run's failed task runs for the failed-run banner, at most FAILED_TASKS_NAMED
        of them, each with the key of the failure handler that handled it ('' for none):
        those nothing handled first, each group in the table's order (by depth, then key)."""
        handled = self.handled_by
        failed = [(r, handled.get(r.id, "")) for r in self.rows if r.state == "failed"]
        return sorted(failed, key=lambda item: bool(item[1]))[:FAILED_TASKS_NAMED]

    @property
    def handled_by(self) -> dict[uuid.UUID, str]:
        """Each failed task run that a failure handler handled (the run does not fail for
        it) -> that handler's task key: the rule of runs.sql ``run_finish_if_done`` (docs/
        api.md, "A run's final state"), on the page's rows: a task with trigger rule
        one_failed or all_failed below it, directly or through task runs skipped for it
        (``upstream_failed``), that succeeded, started (or was marked succeeded) after it
        failed. So the banner's list of failed tasks agrees with the run's error, which
        counts only the failures nothing handled."""
        by_task = {r.task_id: r for r in self.rows}
        downstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for task, dep, _label in self.edges:
            downstream[dep].append(task)
        handled: dict[uuid.UUID, str] = {}
        for f in self.rows:
            if f.state != "failed" or f.finished_at is None:
                continue
            carried, todo = {f.task_id}, [f.task_id]
            while todo:
                for t in downstream[todo.pop()]:
                    s = by_task.get(t)
                    if s is not None and s.state == "skipped" and s.skip_reason == "upstream_failed" \
                            and t not in carried:
                        carried.add(t)
                        todo.append(t)
            for x in carried:
                for t in downstream[x]:
                    h = by_task.get(t)
                    when = h and (h.started_at or h.finished_at)
                    if h is not None and h.trigger_rule in FAILURE_HANDLING_RULES and h.state == "succeeded" \
                            and when is not None and when >= f.finished_at:
                        handled[f.id] = h.key
        return handled

    @property
    def failed_task_count(self) -> int:
        return self.counts.get("failed", 0)

    @property
    def failed_tasks_more(self) -> int:
        """Failed task runs the banner does not name."""
        return max(0, self.failed_task_count - FAILED_TASKS_NAMED)

    @property
    def graph_data(self) -> dict:
        """The run's DAG for the graph card (frontend.dag.graph_data): the rows are in the
        graph order already (by depth, then key), each node opens its task's panel."""
        tasks = [{"id": r.task_id, "key": r.key, "type": r.type, "position_x": r.position_x,
                  "position_y": r.position_y} for r in self.rows]
        # frontend.dag takes edges from the upstream task to its dependent.
        return graph_data(tasks, [(dep, task, label) for task, dep, label in self.edges], with_states=True,
                          panel_urls={str(r.task_id): r.panel_url for r in self.rows})

    @property
    def graph_states(self) -> str:
        """The task states in the graph order (frontend.dag.states_code): all a live update sends of the graph."""
        return states_code((r.task_id for r in self.rows), {r.task_id: r.state for r in self.rows})

    @property
    def table_rows(self) -> list[TaskRow]:
        return self.table.rows if self.table is not None else self.rows

    def _changed_rows(self) -> list[TaskRow]:
        return [r for r in self.table_rows if self.changed is None or r.id in self.changed]

    @property
    def task_rows_html(self) -> SafeString:
        return render_task_rows(self.table_rows, csrf_token=self.csrf_token if self.can_operate else None)

    @property
    def changed_task_rows_html(self) -> SafeString:
        """The rows of the table's page that a live update changed (patch mode)."""
        return render_task_rows(self._changed_rows(), csrf_token=self.csrf_token if self.can_operate else None)

    @property
    def timeline_rows_html(self) -> SafeString:
        return render_timeline_rows(self.timeline)

    @property
    def changed_timeline_rows_html(self) -> SafeString:
        keys = {r.key for r in self._changed_rows()}
        return render_timeline_rows(self.timeline, only=keys)

    @property
    def send_logs(self) -> bool:
        """Whether the fragment carries the worker logs: a first load, or a live update that
        touched a worker task run (their lines come with their attempts' events)."""
        if not self.has_worker_tasks:
            return False
        if not self.delta or self.changed is None:
            return True
        return any(r.queue and r.id in self.changed for r in self.rows)

    @property
    def now_ms(self) -> int:
        return int((self.now or timezone.now()).timestamp() * 1000)

    @property
    def event_rows_html(self) -> SafeString:
        return render_event_rows(self.events)

    @property
    def logs_html(self) -> SafeString:
        return render_log_blocks(self.logs)

    @property
    def idle_queues(self) -> list[tuple[str, int]]:
        """(queue, ready task runs of this run waiting on it) for each queue with no live
        worker, by name: the warning above the task table."""
        counts: dict[str, int] = defaultdict(int)
        for r in self.rows:
            if r.queue_live_workers == 0:
                counts[r.queue] += 1
        return sorted(counts.items())


class WithoutTraceback(Func):
    """SQL: an event's detail without its ``traceback`` (issue 19: a failed attempt's, up to
    FLOWFORGE_TASK_TRACEBACK_MAX_CHARS; the task panel shows it, an event row would cut it)."""

    template = "(%(expressions)s - 'traceback')"
    output_field = JSONField()


# The columns of an event-log row, in EventRow's order after ``seq``/``created_at``: read
# from ``with_shown_detail`` (the detail as ``shown_detail``, its traceback left in the database).
EVENT_COLUMNS = ("seq", "created_at", "task_run_id", "kind", "from_state", "to_state", "attempt", "shown_detail")


def with_shown_detail(events: QuerySet) -> QuerySet:
    """``events`` (TaskRunEvents) annotated with ``shown_detail``: EVENT_COLUMNS' last."""
    return events.annotate(shown_detail=WithoutTraceback(F("detail")))


def event_rows(events: Iterable[tuple], keys: dict[uuid.UUID, str]) -> list[EventRow]:
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
            # A waiting event's detail is its reason, in the words the task table shows.
            detail=(detail.get("reason", "") if kind == "waiting" and isinstance(detail, dict)
                    else event_detail_text(detail)),
        )
        for seq, created_at, task_run_id, kind, from_state, to_state, attempt, detail in events
    ]


def build_run_view(
    request: HttpRequest, run: WorkflowRun, *, events_after: int | None = None,
    table: TableQuery | None = None, table_sig: str = "",
) -> RunView:
    """Load and shape what the run page (``events_after`` None) or its fragment shows.

    Queries (constant): retries, task runs with tasks, edges, timeline events, log events,
    the wait reasons of the ready task runs (when any) and of a pending run, the live
    workers of the queues ready worker tasks wait on (when any), and the worker log lines
    (for a run with worker tasks).
    With ``events_after`` the log holds the events after that seq (at most
    EVENT_DELTA_LIMIT; when more are new, the latest ones and ``events_replace``), else
    the latest EVENT_LOG_LIMIT events; and it is a live update (``delta``): one more
    query names the task runs the new events touched (``changed``), and the table goes
    whole only when its page (``table_sig``, the client's) changed or the run finished.
    ``table``: the task table's filter and page (default the first page, unfiltered);
    the timeline shows the same rows.
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
            "task__position_y", "started_at", "finished_at", "concurrency_key",
            # Outputs (up to 256 KiB each) and errors are cut in the database; an output's
            # size is read there too, for the link to the whole output.
            Left(Cast("output", TextField()), OUTPUT_PREVIEW_CHARS + 1),
            Left(F("error"), ERROR_PREVIEW_CHARS + 1),
            output_bytes_expression(),
            "queue",
            "attempt_base",
            "skip_reason",
            "task__trigger_rule",
            "task__condition",
            # An output kept in the offload storage (engine.offload): the whole one's size.
            Case(When(output__contains={"$ref": offload.REF},
                      then=Cast(KeyTextTransform("bytes", "output"), BigIntegerField())), default=None),
            "not_before",
        )
    )
    edges = list(
        TaskDependency.objects.for_organization(org)
        .filter(workflow_id=run.workflow_id)
        .values_list("task_id", "depends_on_id", "label")
    )
    attempt_events = (
        TaskRunEvent.objects.for_organization(org)
        .filter(workflow_run=run, run_created_at=run.created_at, kind__in=TIMELINE_KINDS, task_run__isnull=False,
                seq__lte=run.last_event_seq)
        .order_by("seq")
        # The error as text, read in the database: no JSON decoding of every event's detail.
        .values_list("task_run_id", "kind", "created_at", "attempt", "to_state", KeyTextTransform("error", "detail"))
    )
    attempts = attempts_from_events(attempt_events)
    depth = depth_of((tr[1] for tr in task_runs), ((t, d) for t, d, _ in edges))
    run_path = reverse("frontend:run_detail", kwargs={"run_id": run.pk})  # once, not per row
    rows = [
        TaskRow(
            # Its attempts allowed so far: the task's max_attempts again after each reset (engine.recovery).
            id=tr_id, task_id=task_id, key=key, type=type_, state=state, max_attempts=max_attempts + attempt_base,
            position_x=px, position_y=py, started_at=started_at, finished_at=finished_at,
            depth=depth.get(task_id, 0), attempts=attempts.get(tr_id, []),
            output_preview=cut(output, OUTPUT_PREVIEW_CHARS), error_preview=cut(error, ERROR_PREVIEW_CHARS),
            # A preview that was cut links to the whole output.
            output_bytes=offloaded or output_bytes,
            output_url=f"{run_path}tasks/{tr_id}/output/"
            if output and (len(output) > OUTPUT_PREVIEW_CHARS or offloaded) else "",
            concurrency_key=concurrency_key or "", queue=queue, panel_url=f"{run_path}tasks/{tr_id}/",
            skip_reason=skip_reason, trigger_rule=trigger_rule, condition=condition,
            retry_at=retry_at(state, not_before, now),
        )
        for (tr_id, task_id, key, type_, state, max_attempts, px, py, started_at, finished_at, concurrency_key,
             output, error, output_bytes, queue, attempt_base, skip_reason, trigger_rule, condition,
             offloaded, not_before) in task_runs
    ]
    can_operate = can(request.membership.role, Action.RUN_OPERATE)
    if can_operate:
        task_actions(rows, edges, run_state=run.state, run_path=run_path)
    rows.sort(key=lambda r: (r.depth, r.key))
    # Why ready tasks (and a queued run) wait: one statement each, only when any does.
    ready = [r.id for r in rows if r.state == "ready"]
    if ready:
        reasons = waiting.reasons(task_run_ids=ready)
        for r in rows:
            # Without the seconds: the page is redrawn when the run's events come, not each
            # second, so a countdown would stand still (the API's reason has them).
            r.waiting_reason = without_countdown(reasons.get(r.id, ""))
    run_waiting = waiting.run_reasons([run.pk]).get(run.pk, "") if run.state == "pending" else ""
    # Ready worker tasks: whether any worker is live on their queues (one statement, only when any
    # is ready). Their log lines: one statement, only for a run with worker tasks.
    worker_queues.attach_live_workers(rows, organization_id=org.pk)
    has_worker_tasks = any(r.queue for r in rows)
    logs, more_logs = (log_blocks(org.pk, run, rows, run_path) if has_worker_tasks else ([], False))
    keys = {r.id: r.key for r in rows}
    # Events up to the run's seq as read with the run (frontend.views.runs), before the task runs:
    # the states shown are then at least as new as the last event shown, and the client's
    # cursor (last_seq) never passes an event whose effect the page does not show yet.
    # Newer events are the next fragment's (their notifications come after this read).
    log = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, run_created_at=run.created_at,
                                                            seq__lte=run.last_event_seq)
    replace = events_after is None
    limit = EVENT_LOG_LIMIT
    changed: set[uuid.UUID] | None = None
    if events_after is not None:
        log = log.filter(seq__gt=events_after)
        limit = min(EVENT_LOG_LIMIT, EVENT_DELTA_LIMIT)
        # The task runs the new events touched (uniq_event_run_seq: the range of new seqs).
        touched = list(log.filter(task_run__isnull=False).values_list("task_run_id", flat=True)
                       .order_by("seq")[:CHANGED_TASKS_LIMIT + 1])
        changed = set(touched) if len(touched) <= CHANGED_TASKS_LIMIT else None
    latest = list(
        with_shown_detail(log).order_by("-seq").values_list(*EVENT_COLUMNS)[: limit + 1]  # uniq_event_run_seq, backwards
    )
    truncated = len(latest) > limit
    if truncated and events_after is not None:
        replace = True  # more is new than the log keeps: start it afresh
    events = event_rows(reversed(latest[:limit]), keys)
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r.state] += 1
    page = table_page(rows, table or TableQuery())
    delta = events_after is not None
    # Whole table and timeline: a first load, a page whose rows changed (a filtered row left
    # it), a finished run (its rows' actions appear), or more changes than counted.
    table_replace = (not delta or changed is None or table_sig != page.sig or run.is_terminal)
    return RunView(
        run=run,
        rows=rows,
        edges=edges,
        timeline=build_timeline(run, page.rows, now=now),
        events=events,
        events_replace=replace,
        events_truncated=truncated,
        last_seq=run.last_event_seq,
        counts=dict(counts),
        duration=run_duration(run.started_at, run.finished_at, now),
        retries=retries,
        can_operate=can_operate,
        waiting_reason=run_waiting,
        logs=logs,
        logs_more_tasks=more_logs,
        has_worker_tasks=has_worker_tasks,
        # Only a run a person resumed has any: no query for the others.
        resumes=resumes_of(org, run) if run.resumed_at is not None else [],
        csrf_token=get_token(request) if can_operate else "",
        table=page,
        delta=delta,
        changed=changed,
        table_replace=table_replace,
        now=now,
    )


#: Resumes of a run listed in its header (the event log has them all).
RESUMES_SHOWN = 5


def resumes_of(org, run: WorkflowRun) -> list[Resume]:
    """The run's latest RESUMES_SHOWN ``resumed`` events, newest first (one query, on
    uniq_event_run_seq backwards)."""
    got = (TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, run_created_at=run.created_at,
                                                             kind="resumed")
           .order_by("-seq").values_list("seq", "created_at", "detail")[:RESUMES_SHOWN])
    return [Resume(seq=seq, at=at, by=str(d.get("by", "")), action=str(d.get("action", "")),
                   task=str(d.get("task", "")), reopened=int(d.get("reopened") or 0), reason=str(d.get("reason", "")))
            for seq, at, d in got]


_FINISHED = frozenset(TASK_TERMINAL_STATES)


def task_actions(rows: Sequence[TaskRow], edges, *, run_state: str, run_path: str) -> None:
    """Set each row's ``actions``: what engine.recovery would accept for it now (the
    service decides; this only spares a button it would refuse). On a finished run: retry
    any finished task whose trigger rule its dependencies' outcomes meet
    (engine.trigger_rules.verdict, as the service asks), mark succeeded a failed, skipped or
    cancelled one, skip a failed or cancelled one. On a running run, only for a failed or
    skipped task whose downstream has finished."""
    by_task = {r.task_id: r for r in rows}
    upstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    downstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for task, dep, _label in edges:
        upstream[task].append(dep)
        downstream[dep].append(task)

    def below_finished(task_id: uuid.UUID) -> bool:
        todo, seen = list(downstream[task_id]), set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in by_task and by_task[t].state not in _FINISHED:
                return False
            todo.extend(downstream[t])
        return True

    finished_run = run_state in RUN_TERMINAL_STATES
    for r in rows:
        if r.state not in _FINISHED:
            continue
        if not finished_run and (r.state not in ("failed", "skipped") or not below_finished(r.task_id)):
            continue
        actions = []
        outcomes = [trigger_rules.outcome(by_task[u].state, by_task[u].skip_reason)
                    for u in upstream[r.task_id] if u in by_task]
        if trigger_rules.verdict(r.trigger_rule, outcomes) == trigger_rules.READY:
            actions.append("retry")
        if r.state in ("failed", "skipped", "cancelled"):
            actions.append("mark_succeeded")
        if r.state in ("failed", "cancelled"):
            actions.append("skip")
        r.actions = tuple(actions)
        r.actions_path = f"{run_path}tasks/{r.id}/"


def log_blocks(org_id: uuid.UUID, run: WorkflowRun, rows: Sequence[TaskRow],
               run_path: str) -> tuple[list[LogBlock], bool]:
    """The LogBlocks of the run's worker task runs with log lines (at most LOG_TASKS_LIMIT,
    those with the newest lines first) and whether more task runs have lines. One statement."""
    tails = worker_rows.run_log_tails(organization_id=org_id, run_id=run.pk, tasks=LOG_TASKS_LIMIT + 1,
                                        lines=LOG_LINES_PER_TASK + 1)
    keys = {r.id: r.key for r in rows}
    blocks = [
        LogBlock(task_run_id=tr_id, key=keys.get(tr_id, ""), attempt=lines[-1].attempt,
                 fencing_token=lines[-1].fencing_token, lines=lines[-LOG_LINES_PER_TASK:],
                 truncated=len(lines) > LOG_LINES_PER_TASK, url=f"{run_path}tasks/{tr_id}/logs/")
        for tr_id, lines in tails[:LOG_TASKS_LIMIT]
    ]
    return blocks, len(tails) > LOG_TASKS_LIMIT


def started_by(org, run: WorkflowRun) -> str:
    """Who started ``run``: a person's email, an API key's name and prefix, a cron trigger,
    a backfill of one and the person who made it, or the system. A run an API key started
    names the key (``run.api_key``, one query); runs from before that column fall back to
    the audit entry's prefix."""
    if run.trigger_source == TriggerSource.BACKFILL:
        # Its trigger may be gone (deleted since); whoever made the backfill is kept.
        trigger = f"cron trigger {run.trigger.name}" if run.trigger_id and run.trigger else "a deleted cron trigger"
        by = run.triggered_by.email if run.triggered_by_id and run.triggered_by else ""
        return f"backfill of {trigger}" + (f" by {by}" if by else "")
    if run.trigger_id:
        return f"cron trigger {run.trigger.name}" if run.trigger else "a cron trigger"
    if run.trigger_source == TriggerSource.CRON:
        return "a deleted cron trigger"
    if run.api_key_id:
        key = ApiKey.objects.for_organization(org).filter(pk=run.api_key_id).values_list("name", "prefix").first()
        if key is not None:
            return f"API key {key[0]} (ffk_{key[1]}_…)"
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
