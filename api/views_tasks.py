"""REST API v1: one task run of a run in detail (issue 19) — GET /runs/{run_id}/task-runs/{id}/.

Reads only (``read``: every member role, viewers included). The task run is read through
``engine.task_detail.load`` (engine.access: another organization's task run, or one of
another run, is a 404 like a missing one), in a constant number of queries whatever its
attempts, events, dependencies and log lines.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.examples import EVENT_EXAMPLE
from api.serializers_tasks import TaskRunDetailSerializer
from engine import task_detail
from engine.models import TaskRun
from tenancy.permissions import Action

_RUN = "3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b"
_TASK_RUN = "aa2f0c55-1d1e-4c4e-8f7a-2b3c4d5e6f70"
_BASE = f"https://flowforge.example/api/v1/runs/{_RUN}/task-runs/{_TASK_RUN}"
TRACEBACK_EXAMPLE = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/etl/tasks.py", line 42, in load\n'
    "    rows = fetch(input[\"date\"], token)\n"
    '  File "/srv/app/etl/tasks.py", line 17, in fetch\n'
    "    raise ValueError(f\"no rows for {day}\")\n"
    "ValueError: no rows for 2026-01-04\n"
)
TASK_DETAIL_EXAMPLE = {
    "id": _TASK_RUN, "key": "load", "task_id": "9a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "type": "python",
    "state": "failed", "attempt": 2, "max_attempts": 2, "priority": 0, "concurrency_key": None, "queue": "",
    "error": "ValueError: no rows for 2026-01-04", "created_at": "2026-01-05T10:00:00.000001Z",
    "started_at": "2026-01-05T10:00:03.100000Z", "finished_at": "2026-01-05T10:00:03.410000Z",
    "waiting_reason": None,
    "config": {"callable": "etl.tasks.load", "params": {"token": "{{ secrets.WAREHOUSE_TOKEN }}"}},
    "output": None,
    "upstream": [{"key": "extract", "label": "rows", "task_run_id": "5d6d3b5e-8e47-4a51-8f0c-0d6f1c2a9b01",
                  "state": "succeeded", "output": {"rows": 1200}}],
    "attempts": [
        {"attempt": 1, "fencing_token": 1, "worker": "worker@box-3:4121:139872", "started_at":
         "2026-01-05T10:00:01.000000Z", "finished_at": "2026-01-05T10:00:01.300000Z", "outcome": "retried",
         "error": "ValueError: no rows for 2026-01-04", "traceback": TRACEBACK_EXAMPLE, "output": None,
         "logs": {"lines": [{"id": 881, "stream": "logging", "level": "info",
                             "message": "etl.tasks: loading 2026-01-04 with token [redacted]",
                             "created_at": "2026-01-05T10:00:01.010000Z"},
                            {"id": 882, "stream": "stdout", "level": "info", "message": "0 rows",
                             "created_at": "2026-01-05T10:00:01.200000Z"}],
                  "more": False, "url": f"{_BASE}/logs/?fencing_token=1"}},
        {"attempt": 2, "fencing_token": 2, "worker": "worker@box-4:4188:140021", "started_at":
         "2026-01-05T10:00:03.100000Z", "finished_at": "2026-01-05T10:00:03.410000Z", "outcome": "failed",
         "error": "ValueError: no rows for 2026-01-04", "traceback": TRACEBACK_EXAMPLE, "output": None,
         "logs": {"lines": [], "more": False, "url": f"{_BASE}/logs/?fencing_token=2"}},
    ],
    "events": [{**EVENT_EXAMPLE, "task_run": _TASK_RUN, "task_key": "load", "kind": "attempt_failed",
                "to_state": "failed", "attempt": 2, "fencing_token": 2,
                "detail": {"error": "ValueError: no rows for 2026-01-04", "retry_at": None}}],
    "events_truncated": False,
    "logs_url": f"{_BASE}/logs/",
}


class RunTaskDetailView(OrganizationAPIView):
    """GET /runs/<run_id>/task-runs/<id>/ — one task run with its attempts, logs, input and upstream."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return TaskRun.objects.for_organization(self.organization).filter(workflow_run_id=self.kwargs["run_id"])

    @extend_schema(
        operation_id="runs_task_retrieve",
        summary="Get a task run in detail",
        description=(
            "One task run of the run: its state, its task's config as configured (secret references as written, "
            "never their values), its dependencies' task runs with their outputs, every attempt (start and end, "
            "worker, outcome, error, the handler's full traceback, its last 500 log lines with the URL of all of "
            "them, and the output of the one that succeeded) and its latest events. Log lines and tracebacks are "
            "redacted of the attempt's secret values before they are stored, and capped per attempt "
            "(FLOWFORGE_TASK_LOG_MAX_LINES, FLOWFORGE_TASK_LOG_MAX_BYTES: a `system` line says when a log was "
            "truncated). A running attempt's lines appear as it writes them (within "
            "FLOWFORGE_TASK_LOG_FLUSH_SECONDS on the shared workers). Another organization's task run, or one of "
            "another run, is a 404."),
        responses={200: TaskRunDetailSerializer},
        examples=[OpenApiExample("failed task", response_only=True, value=TASK_DETAIL_EXAMPLE)],
    )
    def get(self, request, run_id, pk):
        detail = task_detail.load(self.actor, run_id, pk)
        return Response(TaskRunDetailSerializer(detail, context={"request": request}).data)
