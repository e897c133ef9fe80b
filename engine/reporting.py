"""Read models: a run's progress counts and full summary (command line), the task count
of each workflow version that the API's and the web UI's workflow lists show, and an
organization's quotas with their usage (the API's /org/limits/ and the settings page)."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter

from django.db import connection
from django.db.models import BigIntegerField, Count, Func, OuterRef, Subquery, Sum, TextField
from django.db.models.functions import Cast, Coalesce

from engine.models import Task, TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.sql import queries
from tenancy.limits import effective_limits, plans


def task_count(organization) -> Coalesce:
    """An annotation for a Workflow queryset: the version's number of tasks (0 for none).

    A correlated count, because DISTINCT ON (the lists show the latest version of each
    name) cannot be combined with GROUP BY in the ORM."""
    counts = (
        Task.objects.for_organization(organization)
        .filter(workflow=OuterRef("pk"))
        .order_by()
        .values("workflow")
        .annotate(n=Count("id"))
        .values("n")
    )
    return Coalesce(Subquery(counts), 0)


@dataclasses.dataclass
class RunSummary:
    """A run with its task runs (ordered by key) and events (ordered by seq)."""

    run: WorkflowRun
    task_runs: list[TaskRun]
    events: list[TaskRunEvent]

    @property
    def duration_seconds(self) -> float | None:
        if self.run.started_at and self.run.finished_at:
            return (self.run.finished_at - self.run.started_at).total_seconds()
        return None


def state_counts(run_id: uuid.UUID, organization_id: uuid.UUID) -> Counter:
    """Task-run states of one run, counted (``idx_taskrun_run_state``)."""
    rows = (
        TaskRun.objects.for_organization(organization_id)
        .filter(workflow_run_id=run_id)
        .values_list("state")
        .order_by()
    )
    return Counter(state for (state,) in rows)


def load_summary(run_id: uuid.UUID, organization_id: uuid.UUID) -> RunSummary:
    """Load a run, its task runs and its events in three queries. Raises
    WorkflowRun.DoesNotExist when the run is not in the organization."""
    run = WorkflowRun.objects.for_organization(organization_id).select_related("workflow").get(pk=run_id)
    task_runs = list(
        TaskRun.objects.for_organization(organization_id)
        .filter(workflow_run=run)
        .select_related("task")
        .order_by("task__key")
    )
    events = list(
        TaskRunEvent.objects.for_organization(organization_id)
        .filter(workflow_run=run, run_created_at=run.created_at).order_by("seq")  # its partition only
    )
    return RunSummary(run=run, task_runs=task_runs, events=events)


# --- quotas and their usage (issue 16) --------------------------------------------------------------

#: What each limit is, in the words the API and the settings page use.
LIMIT_DESCRIPTIONS = {
    "weight": "Share of the workers against other organizations with ready work",
    "max_running_task_runs": "Task runs claimed or running at once",
    "max_runs_per_minute": "Runs started in the last 60 s (every channel)",
    "max_definition_bytes": "Bytes of stored workflow definitions (every version, JSON text)",
}

# The window of max_runs_per_minute, in seconds.
RUNS_PER_MINUTE_WINDOW_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class QuotaLine:
    """One limit of an organization: its effective value, its plan's default, whether
    staff overrode it, and what is in use now (None for the weight, which is no quota)."""

    name: str
    description: str
    limit: int
    plan_default: int
    overridden: bool
    used: int | None


@dataclasses.dataclass(frozen=True)
class QuotaReport:
    plan: str
    lines: list[QuotaLine]


def definition_bytes(organization) -> int:
    """Bytes of the organization's stored workflow definitions: the JSON text of every
    version (what max_definition_bytes limits)."""
    size = Func(Cast("definition", TextField()), function="octet_length", output_field=BigIntegerField())
    total = Workflow.objects.for_organization(organization).aggregate(n=Sum(size))["n"]
    return int(total or 0)


def quota_report(organization) -> QuotaReport:
    """The organization's plan and, per limit (``tenancy.limits.LIMIT_NAMES``), its
    effective value and usage: running task runs (claimed or started), runs created in
    the last 60 s, stored definition bytes, counted as the quota checks count them. One
    query (``organization_usage``)."""
    limits = effective_limits(organization)
    table = plans()
    defaults = table.get(organization.plan) or table["free"]
    with connection.cursor() as cur:
        cur.execute(queries["organization_usage"], {"org": organization.pk, "window": RUNS_PER_MINUTE_WINDOW_SECONDS})
        running, recent, stored = cur.fetchone()
    used = {"weight": None, "max_running_task_runs": int(running), "max_runs_per_minute": int(recent),
            "max_definition_bytes": int(stored)}
    lines = [
        QuotaLine(name=name, description=LIMIT_DESCRIPTIONS[name], limit=getattr(limits, name),
                  plan_default=int(defaults[name]),
                  overridden=getattr(organization, f"{name}_override") is not None, used=used[name])
        for name in LIMIT_DESCRIPTIONS
    ]
    return QuotaReport(plan=limits.plan, lines=lines)
