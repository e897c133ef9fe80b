"""The workflow grid (issue 20): a page of one workflow version's runs × its tasks, each
cell a task run colored by its state and linking to its task panel.

Cost does not grow with the workflow's history: the runs are one keyset page
(flowforge.cursors.newest_first_page over ``idx_wfrun_wf_recent`` (workflow,
created_at DESC): an index range scan of the page's rows, never OFFSET and never a
sort of the whole history), and their task runs one query by
``uniq_taskrun_per_run_task`` (workflow_run, task) for exactly those runs. Tasks come
from one query of the version's tasks, ordered by the definition's layers (a task
after everything it depends on), then the definition's order. Four queries whatever
the number of runs shown or stored (tests/unit/test_workflow_grid.py counts them;
bench/bench_grid.py measures 1,000 against 1,000,000 runs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from engine.models import Task, TaskRun, Workflow, WorkflowRun
from flowforge.cursors import Page, newest_first_page

# Runs per grid page: the default, and the most ``?runs=`` may ask for.
DEFAULT_RUNS = 25
MAX_RUNS = 100
# Task rows per grid page (a 5,000-task workflow is shown in windows of this many).
TASK_WINDOW = 200


class GridParamError(ValueError):
    """A query parameter of the grid that is not usable: ``param`` names it, the message says why."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(frozen=True)
class GridCell:
    """One task run of one run: its id (None when the run has no task run for this task),
    state, attempt and, while it waits for its next attempt, when that may start."""

    task_run_id: uuid.UUID | None
    state: str
    attempt: int = 0
    not_before: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class GridRow:
    key: str
    cells: list[tuple[WorkflowRun, GridCell]]


@dataclasses.dataclass(frozen=True)
class Grid:
    """``runs`` oldest first (left to right, as they happened); ``rows`` one per task of
    the window; ``older``/``newer`` the keyset cursors of the adjacent run pages (None at
    an end); ``task_from``/``task_count`` the window of tasks shown and their total."""

    workflow: Workflow
    runs: list[WorkflowRun]
    rows: list[GridRow]
    older: str | None
    newer: str | None
    task_from: int
    task_to: int
    task_count: int
    runs_per_page: int


def ordered_task_keys(definition: dict[str, Any]) -> list[str]:
    """The definition's task keys by layer (its longest chain of dependencies from a root),
    then the order written: every task after all it depends on. Linear in tasks + edges
    (a definition is validated acyclic; a dangling name counts as a root)."""
    tasks = [t for t in (definition or {}).get("tasks", []) if isinstance(t, dict) and "key" in t]
    written = {t["key"]: n for n, t in enumerate(tasks)}
    deps = {t["key"]: [d for d in (t.get("depends_on") or []) if d in written] for t in tasks}
    depth: dict[str, int] = {}
    for start in deps:
        stack = [start]
        while stack:  # iterative: a 5,000-task chain is deeper than Python's recursion
            key = stack[-1]
            if key in depth:
                stack.pop()
                continue
            pending = [d for d in deps[key] if d not in depth]
            if pending:
                stack.extend(pending)
                continue
            depth[key] = 1 + max((depth[d] for d in deps[key]), default=-1)
            stack.pop()
    return sorted(deps, key=lambda k: (depth[k], written[k]))


def whole_param(raw: str | None, *, param: str, default: int, low: int, high: int) -> int:
    """``raw`` as a whole number in [low, high] (``default`` when absent or empty); GridParamError otherwise."""
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or not low <= int(text) <= high:
        raise GridParamError(param, f"{param} must be a whole number from {low} to {high}, not {raw[:40]!r}.")
    return int(text)


def build_grid(workflow: Workflow, *, older_than: str | None, newer_than: str | None, runs: int,
               task_from: int) -> Grid:
    """The grid of ``workflow`` (already read in the caller's organization): the page of
    ``runs`` runs past the cursor (flowforge.cursors.newest_first_page: BadCursor for a
    cursor this site did not issue) and the tasks from index ``task_from`` (GridParamError
    past the last task). Three queries: tasks, runs, task runs."""
    org = workflow.organization_id
    order = {key: n for n, key in enumerate(ordered_task_keys(workflow.definition))}
    tasks = sorted(Task.objects.for_organization(org).filter(workflow=workflow).values_list("id", "key"),
                   key=lambda t: (order.get(t[1], len(order)), t[1]))
    if task_from and task_from >= len(tasks):
        raise GridParamError("task_from", f"task_from must be below the workflow's {len(tasks)} tasks, "
                                          f"not {task_from}.")
    window = tasks[task_from:task_from + TASK_WINDOW]
    page: Page = newest_first_page(
        WorkflowRun.objects.for_organization(org).filter(workflow=workflow)
        .only("id", "state", "created_at", "trigger_source", "workflow_id"),
        older_than=older_than, newer_than=newer_than, size=runs)
    page_runs = page.rows[::-1]  # oldest first: time runs left to right
    found: dict[tuple[uuid.UUID, uuid.UUID], GridCell] = {}
    if page_runs and window:
        task_runs = TaskRun.objects.for_organization(org).filter(workflow_run_id__in=[r.pk for r in page_runs])
        if len(window) < len(tasks):
            task_runs = task_runs.filter(task_id__in=[t[0] for t in window])
        for pk, run_id, task_id, state, attempt, not_before in task_runs.values_list(
                "id", "workflow_run_id", "task_id", "state", "attempt", "not_before"):
            found[(run_id, task_id)] = GridCell(pk, state, attempt, not_before)
    empty = GridCell(None, "none")
    rows = [GridRow(key, [(run, found.get((run.pk, task_id), empty)) for run in page_runs])
            for task_id, key in window]
    return Grid(workflow=workflow, runs=page_runs, rows=rows, older=page.older, newer=page.newer,
                task_from=task_from, task_to=task_from + len(window), task_count=len(tasks), runs_per_page=runs)
