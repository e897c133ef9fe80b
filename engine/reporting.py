"""Read models: a run's progress counts and full summary (command line), and the task count
of each workflow version that the API's and the web UI's workflow lists show."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from engine.models import Task, TaskRun, TaskRunEvent, WorkflowRun


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
        TaskRunEvent.objects.for_organization(organization_id).filter(workflow_run=run).order_by("seq")
    )
    return RunSummary(run=run, task_runs=task_runs, events=events)
