"""REST API v1: the organization's own workers as its members see them (issue 18, item 6):
the workers seen polling its queues, the queues with their depth; and a task run's log
lines (those a worker sent, and, issue 19, those a shared worker captured).

Reads only (``read``: every member role, viewers included; a worker key, which may only
``worker.serve``, gets 403). Each list is keyset-paginated (api.pagination) and scoped to
the caller's organization: another organization's workers, queues and log lines never
appear, and another organization's run or task run is a 404 (engine.access).

A worker is **live** when it polled within FLOWFORGE_WORKER_LIVE_SECONDS (90 s by
default: three missed polls of an idle worker, whose long polls last at most 30 s), or
holds a running task of its queue whose lease is current (a worker whose slots are all
busy does not poll; its heartbeats keep the lease).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from api.base import OrganizationAPIView, validated_query
from api.pagination import (
    decode_name_cursor,
    decode_pair_cursor,
    next_link,
    page,
    page_size,
    paginate_by_int,
)
from api.schema import invalid
from api.schema import page_parameters as schema_page_parameters
from api.serializers import page_of
from api.views_worker import QueueNameField
from engine import worker_queues
from engine.access import access_task_run
from engine.handlers.worker import QUEUE_NAME_FORM
from engine.models import TaskLog, WorkerConnection
from engine.repositories import worker_queues as worker_rows
from flowforge.cursors import encode_name_cursor, encode_pair_cursor
from tenancy.permissions import Action

LIVE_HELP = ("Polled within FLOWFORGE_WORKER_LIVE_SECONDS (90 s by default), or holds a running task of this "
             "queue whose lease is current (a worker whose slots are all busy does not poll).")


class WorkerSerializer(serializers.Serializer):
    """A worker process as seen on one queue (a worker polling two queues is two rows)."""

    queue = serializers.CharField(help_text="The queue it polls.")
    worker_id = serializers.CharField(help_text="The id the worker gave itself (`worker.id` of its polls).")
    name = serializers.CharField(help_text="What its last poll said of it ('' when it said nothing).")
    host = serializers.CharField()
    sdk = serializers.CharField(help_text="Its SDK and version, e.g. `flowforge-python/0.1.0`.")
    concurrency = serializers.IntegerField(allow_null=True, help_text="Its number of slots, as it said.")
    first_seen_at = serializers.DateTimeField(help_text="Its first poll of this queue.")
    last_seen_at = serializers.DateTimeField(
        help_text="Its last poll of this queue, to within 10 s (an idle worker's polls are not each written).")
    live = serializers.BooleanField(help_text=LIVE_HELP)
    tasks_held = serializers.IntegerField(
        help_text="Running task runs of this queue it holds (leased to it: `lease_owner` `worker:<worker_id>`).")


class QueueSerializer(serializers.Serializer):
    """A queue of the organization's own workers: named by a worker task of any workflow
    version, or polled by a worker."""

    queue = serializers.CharField()
    ready = serializers.IntegerField(help_text="Task runs waiting on the queue (state `ready`, retry backoffs "
                                     "included).")
    oldest_ready_at = serializers.DateTimeField(allow_null=True,
                                                help_text="When the longest-waiting one became ready; null when "
                                                "none is ready.")
    oldest_ready_age_seconds = serializers.FloatField(allow_null=True,
                                                      help_text="How long it has waited, in seconds; null when "
                                                      "none is ready.")
    running = serializers.IntegerField(help_text="Task runs of the queue held by workers now.")
    live_workers = serializers.IntegerField(help_text=f"Workers of the queue that are live: {LIVE_HELP}")


class TaskLogSerializer(serializers.Serializer):
    """A log line of one attempt (generation) of a task run, secret values redacted."""

    id = serializers.IntegerField(help_text="Increasing: the order, and the `after` cursor.")
    attempt = serializers.IntegerField()
    fencing_token = serializers.IntegerField(help_text="The generation that wrote it.")
    stream = serializers.ChoiceField(choices=TaskLog.Stream.choices, help_text=(
        "Where it came from: `worker` (sent by the organization's own worker), `logging` (a logging record of "
        "a shared worker's handler, its logger's name first), `stdout`, `stderr`, `http` (the http task's "
        "request summary), `system` (FlowForge's: the attempt's log was truncated)."))
    level = serializers.ChoiceField(choices=TaskLog.Level.choices)
    message = serializers.CharField()
    created_at = serializers.DateTimeField()


class TaskLogFilterSerializer(serializers.Serializer):
    """Query parameters of GET /runs/{run}/task-runs/{id}/logs/ (``after`` and ``page_size``
    are the pagination's)."""

    attempt = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    fencing_token = serializers.IntegerField(required=False, min_value=0, max_value=2**63 - 1)


WorkerPageSerializer = page_of(WorkerSerializer, "WorkerPageSerializer")
QueuePageSerializer = page_of(QueueSerializer, "QueuePageSerializer")
TaskLogPageSerializer = page_of(TaskLogSerializer, "TaskLogPageSerializer")


class WorkerFilterSerializer(serializers.Serializer):
    """Query parameters of GET /workers/."""

    queue = QueueNameField(required=False, max_length=64)
    live = serializers.ChoiceField(choices=["true", "false"], required=False)


WORKER_EXAMPLE = {
    "queue": "images", "worker_id": "3f0c9b1e-7d1a-4c55-9a53-2c7a3f8e9d10", "name": "resizer-1", "host": "box-7",
    "sdk": "flowforge-python/0.1.0", "concurrency": 4, "first_seen_at": "2026-01-05T09:30:00.120000Z",
    "last_seen_at": "2026-01-05T10:02:41.517000Z", "live": True, "tasks_held": 2,
}
QUEUE_EXAMPLE = {
    "queue": "images", "ready": 12, "oldest_ready_at": "2026-01-05T10:01:58.004000Z",
    "oldest_ready_age_seconds": 43.5, "running": 4, "live_workers": 1,
}
LOG_EXAMPLE = {"id": 1042, "attempt": 1, "fencing_token": 1, "stream": "worker", "level": "info",
               "message": "resized 1 of 3", "created_at": "2026-01-05T10:02:40.250000Z"}


class _ReadView(OrganizationAPIView):
    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):  # pragma: no cover - these views read through engine.repositories
        return WorkerConnection.objects.for_organization(self.organization)


class WorkerListView(_ReadView):
    """GET /workers/ — the organization's workers by queue, then worker id."""

    @extend_schema(
        operation_id="workers_list",
        summary="List workers",
        description="The workers of the organization seen polling its queues (docs/workers.md), by queue then "
        "worker id, keyset-paginated: follow `next`. A worker polling two queues is listed once per queue. "
        f"`live`: {LIVE_HELP} Workers that stopped stay listed with `live` false; `?live=true` lists only the "
        "live ones.",
        parameters=[
            OpenApiParameter("queue", str, description="Only the workers of this queue."),
            OpenApiParameter("live", str, enum=["true", "false"], description="Only the live workers, or only "
                             "the others."),
            *schema_page_parameters("the queue and worker id of the previous page's last worker"),
        ],
        responses={200: WorkerPageSerializer,
                   **invalid("A filter, the cursor or the page size is malformed; `errors` names it.",
                             {"queue": [f"not a queue name: use {QUEUE_NAME_FORM}"]})},
        examples=[OpenApiExample("page", response_only=True, value={"results": [WORKER_EXAMPLE], "next": None})],
    )
    def get(self, request):
        filters = validated_query(request, WorkerFilterSerializer)
        size = page_size(request)
        cursor = request.query_params.get("cursor")
        after = decode_pair_cursor(cursor) if cursor else None
        live = {"true": True, "false": False}.get(filters.get("live", ""))
        rows = worker_rows.workers(
            organization_id=self.organization.pk, live_within_seconds=worker_queues.live_seconds(),
            limit=size + 1, queue=filters.get("queue"), after=after, live=live)
        next_url = None
        if len(rows) > size:
            rows = rows[:size]
            next_url = next_link(request, "cursor", encode_pair_cursor(rows[-1].queue, rows[-1].worker_id))
        return Response(page(WorkerSerializer(rows, many=True).data, next_url))


class QueueListView(_ReadView):
    """GET /queues/ — the organization's worker queues by name, with their depth."""

    @extend_schema(
        operation_id="queues_list",
        summary="List worker queues",
        description="The queues of the organization's own workers (named by a `worker` task of any workflow "
        "version, or polled by a worker), by name, keyset-paginated: follow `next`. Each with its ready task "
        "runs, how long the oldest has waited, its running ones and its live workers. A queue with ready task "
        "runs and no live worker waits until a worker polls it.",
        parameters=schema_page_parameters("the previous page's last queue name"),
        responses={200: QueuePageSerializer,
                   **invalid("The cursor or the page size is malformed; `errors` names it.",
                             {"page_size": ["must be a whole number from 1 to 500"]})},
        examples=[OpenApiExample("page", response_only=True, value={"results": [QUEUE_EXAMPLE], "next": None})],
    )
    def get(self, request):
        size = page_size(request)
        cursor = request.query_params.get("cursor")
        rows = worker_rows.queue_summaries(
            organization_id=self.organization.pk, live_within_seconds=worker_queues.live_seconds(),
            after=decode_name_cursor(cursor) if cursor else "", limit=size + 1)
        next_url = None
        if len(rows) > size:
            rows = rows[:size]
            next_url = next_link(request, "cursor", encode_name_cursor(rows[-1].queue))
        return Response(page(QueueSerializer(rows, many=True).data, next_url))


class TaskRunLogsView(_ReadView):
    """GET /runs/<run_id>/task-runs/<id>/logs/ — the log lines of one task run, oldest
    first (every attempt's, or one's)."""

    @extend_schema(
        operation_id="runs_task_logs",
        summary="List a task run's log lines",
        description="The log lines of this task run, every attempt's (or one's: `attempt`, `fencing_token`), "
        "oldest first, secret values redacted; each names its attempt, its generation (`fencing_token`) and its "
        "`stream`: what a shared worker captured while the handler ran (its `logging` records, `stdout`, "
        "`stderr`, the http task's request summary `http`) or what the organization's own worker sent "
        "(`POST /worker/tasks/{id}/logs/`: `worker`). An attempt keeps at most FLOWFORGE_TASK_LOG_MAX_LINES "
        "lines and FLOWFORGE_TASK_LOG_MAX_BYTES bytes (2,000 and 512 KiB by default); a `system` line says "
        "when its log was truncated. `?after=<id>` returns only later lines; `next` is this URL with `after` "
        "set to the page's last id, null when no more lines exist yet.",
        parameters=[OpenApiParameter("attempt", {"type": "integer", "minimum": 1},
                                     description="Only the lines of this attempt."),
                    OpenApiParameter("fencing_token", {"type": "integer", "minimum": 0},
                                     description="Only the lines of this generation."),
                    OpenApiParameter("after", int, description="Only lines with a greater id."),
                    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500},
                                     description="Rows per page, 1 to 500 (default 50).")],
        responses={200: TaskLogPageSerializer,
                   **invalid("A filter, `after` or `page_size` is malformed; `errors` names it.",
                             {"after": ["must be a whole number from 0 to 999999999999999999 (at most 18 digits)"]})},
        examples=[OpenApiExample("lines", response_only=True, value={"results": [LOG_EXAMPLE], "next": None})],
    )
    def get(self, request, run_id, pk):
        filters = validated_query(request, TaskLogFilterSerializer)
        task_run = access_task_run(self.actor, run_id, pk, shape=lambda qs: qs.only("id", "organization_id",
                                                                                      "workflow_run_id"))
        lines = TaskLog.objects.for_organization(self.organization).filter(task_run=task_run)  # idx_tasklog_taskrun
        if "attempt" in filters:
            lines = lines.filter(attempt=filters["attempt"])
        if "fencing_token" in filters:
            lines = lines.filter(fencing_token=filters["fencing_token"])
        rows, next_url = paginate_by_int(lines, request, field="id", param="after", descending=False)
        return Response(page(TaskLogSerializer(rows, many=True).data, next_url))
