"""What the run list shows: its filter form, the page's runs and their progress bars.

Queries: one for the page of runs (keyset over ``idx_wfrun_org_recent``, never OFFSET:
frontend.paging), one for the page's task-run counts (``progress_by_run``), one for
the workflow filter (in the view).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django import forms
from django.db.models import Count, QuerySet

from engine.models import RunState, TaskRun, WorkflowRun
from frontend.paging import DateBound, lower_bound, upper_bound
from tenancy.models import without_credentials


class RunFilterForm(forms.Form):
    """The run list's filters: a workflow (name or version id), a state, a creation window."""

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
    """One run of the list, with its progress and its duration so far."""

    run: WorkflowRun
    progress: Progress
    duration: str


def run_list_queryset(org, data: dict[str, Any]) -> QuerySet:
    """The organization's runs matching the filter form's cleaned ``data`` (unordered)."""
    qs = (
        # Who started a run is shown by name: the user's password hash and the key's hash
        # stay unread (without_credentials).
        without_credentials(WorkflowRun.objects.for_organization(org), "workflow", "triggered_by", "trigger", "api_key")
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


def progress_by_run(org, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Progress]:
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
