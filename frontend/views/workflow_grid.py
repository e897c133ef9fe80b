"""``/workflows/<id>/grid/``: the workflow grid (issue 20) — a page of the version's runs ×
its tasks, each cell a task run colored by state and linking to its task panel
(frontend.presenters.workflow_grid builds it with keyset queries).

Another organization's workflow id is a 404 (engine.access). A cursor this site did not
issue (``older_than``/``newer_than``) or an unusable ``runs``/``task_from`` is a 400 page
naming the parameter, with a link to the grid's first page; never a 500.
"""

from __future__ import annotations

import uuid

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from engine.access import access_workflow
from flowforge.cursors import BadCursor
from frontend.organization import organization_required
from frontend.presenters.workflow_grid import (
    DEFAULT_RUNS,
    MAX_RUNS,
    TASK_WINDOW,
    GridParamError,
    build_grid,
    whole_param,
)


def _query(runs: int, **params: object) -> str:
    """A grid link's query string: the page size when not the default, plus ``params``."""
    from urllib.parse import urlencode

    items = {"runs": runs} if runs != DEFAULT_RUNS else {}
    items.update({k: v for k, v in params.items() if v not in (None, "", 0)})
    return "?" + urlencode(items) if items else "?"


@require_GET
@organization_required
def workflow_grid(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """The grid page: ``?runs=`` runs per page (1..MAX_RUNS, default DEFAULT_RUNS),
    ``?older_than=``/``?newer_than=`` keyset cursors of the run pages, ``?task_from=``
    the first task row (windows of TASK_WINDOW tasks)."""
    workflow = access_workflow(request.membership.organization, workflow_id)
    older_than = request.GET.get("older_than") or None
    newer_than = request.GET.get("newer_than") or None
    try:
        runs = whole_param(request.GET.get("runs"), param="runs", default=DEFAULT_RUNS, low=1, high=MAX_RUNS)
        task_from = whole_param(request.GET.get("task_from"), param="task_from", default=0, low=0,
                                high=10**6)
        grid = build_grid(workflow, older_than=older_than, newer_than=newer_than, runs=runs, task_from=task_from)
    except GridParamError as exc:
        return render(request, "frontend/workflows/grid.html",
                      {"workflow": workflow, "error": str(exc), "error_param": exc.param}, status=400)
    except BadCursor as exc:
        param = "newer_than" if newer_than else "older_than"
        message = f"{param} is not a page cursor of this grid" + (f": {exc.reason}" if exc.reason else "") + "."
        return render(request, "frontend/workflows/grid.html",
                      {"workflow": workflow, "error": message, "error_param": param}, status=400)
    context = {
        "workflow": workflow,
        "grid": grid,
        "older_link": _query(runs, older_than=grid.older, task_from=task_from) if grid.older else None,
        "newer_link": _query(runs, newer_than=grid.newer, task_from=task_from) if grid.newer else None,
        "newest_link": _query(runs, task_from=task_from) if (older_than or newer_than) else None,
        # The task windows keep the run page being shown: the cursor just past its newest run.
        "tasks_before_link": (_query(runs, task_from=max(0, task_from - TASK_WINDOW),
                                     older_than=older_than, newer_than=newer_than) if task_from else None),
        "tasks_after_link": (_query(runs, task_from=grid.task_to, older_than=older_than, newer_than=newer_than)
                             if grid.task_to < grid.task_count else None),
    }
    response = render(request, "frontend/workflows/grid.html", context)
    response["Cache-Control"] = "no-store"
    return response
