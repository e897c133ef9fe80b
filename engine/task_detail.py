"""One task run in detail (issue 19): what the API's task detail and the run page's task
panel show, read in a constant number of queries.

- **attempts**: one per started generation, from its ``started`` event (when, which
  worker) to the event that ended it (when, outcome, error and the handler's traceback,
  kept in that event's ``detail``), each with the last lines of its log (core_tasklog) and,
  for the attempt that succeeded, the task run's output;
- **the task's input as configured**: its config as the definition stored it, so a secret
  is shown as its reference (``{{ secrets.NAME }}``), never its value, which only the
  attempt ever had;
- **upstream**: the task runs of its dependencies in the same run, with their outputs
  (inline when small, else a summary: ``engine.outputs``);
- **events**: its latest events, the attempts' tracebacks left out (the attempts carry them).

Reads only; ``load`` raises ObjectNotFound for a task run of another organization or run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db.models import F

from engine.access import access_task_run
from engine.models import TaskRun, TaskRunEvent
from engine.outputs import with_output_sizes
from engine.repositories import task_logs, waiting
from engine.repositories.task_logs import StoredLine
from engine.states import EventKind, TaskRunState
from tenancy.access import organization_id_of

#: Log lines shown per attempt (its last ones); the whole log is the logs endpoint's.
ATTEMPT_LOG_LINES = 500
#: Events shown (the latest); the run's event log has them all.
EVENTS_LIMIT = 500

# Event kinds that open and close one attempt (as the run page's timeline pairs them).
_START_KINDS = (EventKind.STARTED.value,)
_END_KINDS = {
    EventKind.SUCCEEDED.value: "succeeded",
    EventKind.ATTEMPT_FAILED.value: "failed",
    EventKind.ATTEMPT_TIMED_OUT.value: "timed_out",
    EventKind.LEASE_EXPIRED.value: "lease_expired",
    EventKind.CANCELLED.value: "cancelled",
    # Its condition was false (evaluated by the worker after the start, before the handler).
    # A skip of a task run that never started has no attempt to close.
    EventKind.SKIPPED.value: "skipped",
}
ATTEMPT_KINDS = (*_START_KINDS, *_END_KINDS)
#: Every outcome an attempt may have: still running; succeeded; failed and retried (another
#: attempt follows); failed (the last); timed out; its worker's lease expired; cancelled;
#: skipped (its condition was false: the handler did not run).
OUTCOMES = ("running", "succeeded", "retried", "failed", "timed_out", "lease_expired", "cancelled", "skipped")


@dataclasses.dataclass
class AttemptDetail:
    """One attempt: its generation (``fencing_token``), the worker that ran it (the lease
    owner its start recorded), its start and end, its outcome (OUTCOMES), error and
    traceback ('' for none), whether it is the attempt whose output the task run holds,
    and the last ATTEMPT_LOG_LINES lines of its log (``logs_more``: older ones exist)."""

    number: int | None
    fencing_token: int
    worker: str
    started_at: dt.datetime
    finished_at: dt.datetime | None = None
    outcome: str = "running"
    error: str = ""
    traceback: str = ""
    logs: list[StoredLine] = dataclasses.field(default_factory=list)
    logs_more: bool = False

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"


@dataclasses.dataclass
class UpstreamDetail:
    """A dependency's task run in the same run: its task key, the edge's label, and the
    task run (from ``with_output_sizes``: its output inline when small)."""

    key: str
    label: str
    task_run: TaskRun


@dataclasses.dataclass
class TaskDetail:
    """Everything one task run's detail shows (module docstring). ``task_run`` has its task
    selected and its output sizes annotated (``with_output_sizes``)."""

    task_run: TaskRun
    attempts: list[AttemptDetail]
    upstream: list[UpstreamDetail]
    events: list[TaskRunEvent]
    events_truncated: bool
    waiting_reason: str | None

    @property
    def config(self) -> dict[str, Any]:
        """The task's config as its definition stored it: secret references as written."""
        return self.task_run.task.config

    @property
    def is_terminal(self) -> bool:
        return self.task_run.state in (TaskRunState.SUCCEEDED, TaskRunState.FAILED, TaskRunState.SKIPPED,
                                       TaskRunState.CANCELLED)


def attempts_from_events(events: list[tuple]) -> list[AttemptDetail]:
    """The attempts of one task run from its (kind, created_at, attempt, fencing_token,
    to_state, detail) events of ATTEMPT_KINDS in ``seq`` order: a ``started`` opens an
    attempt, the next end event of the same generation closes it (an ``attempt_failed``
    that sent the task back to ``ready`` is ``retried``). An end event without an open
    attempt (a task cancelled before it started) opens none."""
    out: list[AttemptDetail] = []
    open_: dict[int, AttemptDetail] = {}
    for kind, created_at, number, token, to_state, detail in events:
        detail = detail if isinstance(detail, dict) else {}
        if kind in _START_KINDS:
            current = AttemptDetail(number=number, fencing_token=token, worker=str(detail.get("worker") or ""),
                                    started_at=created_at)
            open_[token] = current
            out.append(current)
            continue
        # The reaper's expiry and a cancel bump a running generation's token in the
        # statement that writes their event, which then names the next one.
        current = open_.pop(token, None)
        if current is None and token is not None:
            current = open_.pop(token - 1, None)
        if current is None:
            continue
        current.finished_at = created_at
        outcome = _END_KINDS[kind]
        if kind == EventKind.ATTEMPT_FAILED and to_state == TaskRunState.READY:
            outcome = "retried"
        current.outcome = outcome
        if kind not in (EventKind.SUCCEEDED, EventKind.SKIPPED):
            current.error = str(detail.get("error") or detail.get("reason") or "")
            current.traceback = str(detail.get("traceback") or "")
    return out


def load(actor_or_org: Any, run_id: Any, task_run_id: Any, *, log_lines: int = ATTEMPT_LOG_LINES,
         events_limit: int = EVENTS_LIMIT) -> TaskDetail:
    """The detail of task run ``task_run_id`` of run ``run_id`` of the organization (an
    Actor, an Organization or its id). Raises ObjectNotFound (a 404) for any other task run.

    Queries: the task run with its task; its attempts' events; their log lines (one
    statement, none before a first start); its dependencies' task runs; its latest
    ``events_limit`` events; the wait reason when it is ready. None grows with the number
    of attempts, dependencies, events or lines."""
    org_id = organization_id_of(actor_or_org)
    task_run = access_task_run(org_id, run_id, task_run_id,
                               shape=lambda qs: with_output_sizes(qs.select_related("task")))
    attempt_events = list(
        TaskRunEvent.objects.for_organization(org_id)
        .filter(task_run=task_run, kind__in=ATTEMPT_KINDS)  # idx_event_taskrun_created
        .order_by("seq")
        .values_list("kind", "created_at", "attempt", "fencing_token", "to_state", "detail")
    )
    attempts = attempts_from_events(attempt_events)
    tails = task_logs.attempt_tails(organization_id=org_id, task_run_id=task_run.pk,
                                    tokens=[a.fencing_token for a in attempts], limit=log_lines + 1)
    for a in attempts:
        lines = tails.get(a.fencing_token, [])
        a.logs, a.logs_more = lines[-log_lines:], len(lines) > log_lines
    upstream = [
        UpstreamDetail(key=tr.task.key, label=tr.edge_label or "", task_run=tr)
        for tr in with_output_sizes(
            TaskRun.objects.for_organization(org_id)
            # The run's task runs of the tasks this one depends on (uniq_taskrun_per_run_task).
            .filter(workflow_run_id=task_run.workflow_run_id, task__downstream_edges__task_id=task_run.task_id)
            .select_related("task")
            .annotate(edge_label=F("task__downstream_edges__label"))
            .order_by("task__key")
        )
    ]
    latest = list(
        TaskRunEvent.objects.for_organization(org_id).filter(task_run=task_run)  # idx_event_taskrun_created
        .order_by("-seq")[: events_limit + 1]
    )
    for event in latest:
        event.task_run = task_run  # its key without a query per event
        if isinstance(event.detail, dict) and "traceback" in event.detail:
            event.detail = {k: v for k, v in event.detail.items() if k != "traceback"}
    reason = None
    if task_run.state == TaskRunState.READY:
        reason = waiting.reasons(task_run_ids=[task_run.pk]).get(task_run.pk) or None
    return TaskDetail(task_run=task_run, attempts=attempts, upstream=upstream,
                      events=list(reversed(latest[:events_limit])), events_truncated=len(latest) > events_limit,
                      waiting_reason=reason)


__all__ = ["ATTEMPT_LOG_LINES", "EVENTS_LIMIT", "OUTCOMES", "AttemptDetail", "TaskDetail", "UpstreamDetail",
           "attempts_from_events", "load"]
