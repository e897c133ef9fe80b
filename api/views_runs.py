"""REST API v1: runs (list, start, get, cancel, retry, a task's output) and their events
(a page of history, the live stream).

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself. One run (or task run) is read through
engine.access (404 alike for a missing id and another organization's); lists start
from ``Model.objects.for_organization(self.organization)``, are keyset-paginated
(api.pagination) and fetch their relations in a constant number of queries.
"""

from __future__ import annotations

import json
import uuid

from django.db import transaction
from django.db.models import Prefetch, Q
from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from api import idempotency, streaming
from api.base import OrganizationAPIView, validated_query
from api.examples import EVENT_EXAMPLE, PAGE_PARAMETERS, RUN_EXAMPLE, RUN_SUMMARY_EXAMPLE
from api.exceptions import PROBLEM_CONTENT_TYPE, Conflict, Gone
from api.pagination import non_negative_int, page, paginate_by_int, paginate_newest_first
from api.schema import problem, problem_example
from api.serializers import (
    RunEventPageSerializer,
    RunEventSerializer,
    RunFilterSerializer,
    RunListSerializer,
    RunPageSerializer,
    RunSerializer,
    RunStartInputSerializer,
)
from engine import live_stream, offload, worker_queues
from engine.access import access_run, access_task_run
from engine.models import TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.outputs import with_output_sizes
from engine.repositories import waiting
from engine.services import (
    IdempotencyConflict,
    RunNotFinished,
    WorkflowNotStartable,
    cancel_run,
    resolve_workflow,
    retry_run,
    start_run,
    start_run_idempotent,
)
from tenancy.access import organization_id_of
from tenancy.models import without_credentials
from tenancy.permissions import Action


def _who(actor) -> str:
    """The actor as a run's cancel reason names it (an email or a key's public prefix)."""
    if actor.api_key is not None:
        return f"API key {actor.api_key.prefix}"
    return actor.user.email


def _run_url(request, run) -> str:
    return request.build_absolute_uri(reverse("api:run-detail", kwargs={"pk": run.pk}))


def _run_detail(organization, pk) -> WorkflowRun:
    """The run ``pk`` with what RunSerializer reads: the run (with workflow and user), its
    task runs with their tasks — two queries; ObjectNotFound (a 404) otherwise. Task
    outputs are not loaded: their sizes are, and the outputs small enough to inline
    (engine.outputs.with_output_sizes)."""
    organization = organization_id_of(organization)  # an Actor, an Organization or its id
    run = access_run(organization, pk, shape=lambda qs: without_credentials(qs, "workflow", "triggered_by", "api_key").prefetch_related(
        Prefetch(
            "task_runs",
            queryset=with_output_sizes(
                TaskRun.objects.for_organization(organization).select_related("task").order_by("created_at", "id")
            ),
        )
    ))
    # waiting_reason of ready task runs and a queued run: one more query only when any waits.
    waiting.attach(run)
    # queue_live_workers of ready worker task runs: one more query only when any waits on a queue.
    worker_queues.attach_live_workers(run.task_runs.all(), organization_id=organization)
    return run


def _run_id_only(qs):
    """Only what the event views need of the run: its id, and its created_at (its history's
    partition, migration 0033)."""
    return qs.only("id", "organization_id", "created_at")


class _RunView(OrganizationAPIView):
    def get_scoped_queryset(self):
        return WorkflowRun.objects.for_organization(self.organization)


class OwnTransactions:
    """A view outside ATOMIC_REQUESTS whose service calls commit their own transactions:
    ``cancel_run`` (durable, retried on a deadlock) and ``start_run`` (its on-commit
    publish of the roots it claimed goes out before the response body is read and
    rendered, not after it). An error's rollback (DRF's set_rollback) stays inside a
    transaction of its own, as in a request transaction."""

    @classmethod
    def as_view(cls, **initkwargs):
        return transaction.non_atomic_requests(super().as_view(**initkwargs))

    def handle_exception(self, exc):
        with transaction.atomic():
            return super().handle_exception(exc)


class RunListView(OwnTransactions, OrganizationAPIView):
    """GET /runs/ — the organization's runs, newest first; POST /runs/ — start one."""

    required_action = {"GET": Action.READ, "POST": Action.RUN_OPERATE}

    def get_scoped_queryset(self):
        return without_credentials(WorkflowRun.objects.for_organization(self.organization), "workflow", "triggered_by",
                                   "api_key")

    @extend_schema(
        operation_id="runs_list",
        summary="List runs",
        description="Runs newest first (by creation time, then id), keyset-paginated: follow `next` (a full "
        "URL; null on the last page). Runs started while you page never make you skip or repeat one.",
        parameters=[
            OpenApiParameter("workflow", str, description="A workflow name (every version) or a version's id."),
            OpenApiParameter("state", str, enum=["pending", "running", "succeeded", "failed", "cancelled"]),
            OpenApiParameter("created_after", OpenApiTypes.DATETIME,
                             description="ISO 8601; only runs created after it (exclusive). Encode `+` as `%2B`."),
            OpenApiParameter("created_before", OpenApiTypes.DATETIME,
                             description="ISO 8601; only runs created before it (exclusive)."),
            *PAGE_PARAMETERS,
        ],
        responses={200: RunPageSerializer},
        examples=[OpenApiExample("page", response_only=True, value={
            "results": [RUN_SUMMARY_EXAMPLE],
            "next": "https://flowforge.example/api/v1/runs/?cursor=eyJ0IjoiMjAyNi0wMS0wNVQxMDowMDowMC4wMDAwMDErMDA6MDAiLCJpZCI6IjNmMmE4YzFlLTdiNmQtNGU1Zi05YTBiLTFjMmQzZTRmNWE2YiJ9"})],
    )
    def get(self, request):
        filters = validated_query(request, RunFilterSerializer)
        qs = self.get_queryset()
        if "workflow" in filters:
            ref = filters["workflow"]
            try:
                as_id = uuid.UUID(ref)
            except ValueError:
                as_id = None
            # A name means every version; one query, then workflow_id = ANY(...) (idx_wfrun_wf_recent).
            match = Q(name=ref) | Q(pk=as_id) if as_id else Q(name=ref)
            ids = list(Workflow.objects.for_organization(self.organization).filter(match).values_list("pk", flat=True))
            qs = qs.filter(workflow_id__in=ids)
        if "state" in filters:
            qs = qs.filter(state=filters["state"])
        if "created_after" in filters:
            qs = qs.filter(created_at__gt=filters["created_after"])
        if "created_before" in filters:
            qs = qs.filter(created_at__lt=filters["created_before"])
        rows, next_url = paginate_newest_first(qs, request)
        waiting.attach_runs(rows)
        return Response(page(RunListSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="runs_create",
        summary="Start a run",
        description="Start a run of a workflow: by name (the given `version`, else the latest active one) or by a "
        "version's id. Send an `Idempotency-Key` header to make retries safe: a repeat with the same key and "
        "body returns the first run with 200 (and `Idempotent-Replayed: true`) instead of starting another; the "
        "same key with a different body is a 409. Keys are per caller (user or API key) and kept 24 hours. "
        "NUL characters in `input` strings are removed (PostgreSQL's jsonb cannot store them). `priority` "
        "(-10 to 10, default 0) orders the run's task runs within the organization's share. Over the "
        "organization's runs-per-minute quota (max_runs_per_minute, every channel counted) the start is a 429 "
        "`quota_exceeded` with `Retry-After`. A workflow with a run limit (`concurrency.max_running_runs`) "
        "queues the run (state `pending`), cancels it, or cancels its oldest runs, as its policy says. A "
        "version with an `input_schema` validates `input` against it (JSON Schema 2020-12) after filling in "
        "its properties' defaults; the run stores the input with those defaults.",
        parameters=[OpenApiParameter(idempotency.HEADER, str, OpenApiParameter.HEADER,
                                     description="1 to 200 visible ASCII characters chosen by the client "
                                     "(a UUID is a good choice).")],
        request=RunStartInputSerializer,
        responses={
            201: RunSerializer,
            200: OpenApiResponse(RunSerializer, description="A repeat of an earlier start with the same "
                                 "Idempotency-Key and body: the first run."),
            **problem(400, "Invalid body: `workflow` names no workflow of the organization, `input` is not a JSON "
                      "object (or holds NaN/Infinity, or lacks a field a task's concurrency key needs, or breaks "
                      "the version's `input_schema`: then `errors.input` has one entry per violation and "
                      "`violations` lists each as {path: JSON pointer into the input, message, keyword}; "
                      "nothing is stored), `priority` is not a whole number from -10 to 10, or the "
                      "Idempotency-Key is malformed.",
                      problem_example(400, "The request is invalid; see errors.", "invalid", errors={
                          "input": ["/date: a value is required", "/source: 'mars' is not one of ['eu', 'us']"]},
                          violations=[{"path": "/date", "message": "a value is required", "keyword": "required"},
                                      {"path": "/source", "message": "'mars' is not one of ['eu', 'us']",
                                       "keyword": "enum"}])),
            **problem(409, "The workflow is a draft or archived, or the Idempotency-Key was used with another body.",
                      problem_example(409, "workflow etl v2 is archived; only active workflows can start runs",
                                      "conflict")),
        },
        examples=[OpenApiExample("start", request_only=True,
                                 value={"workflow": "etl", "input": {"date": "2026-01-04", "source": "eu"}}),
                  OpenApiExample("started", response_only=True, status_codes=["201"],
                                 value={**RUN_EXAMPLE, "state": "running", "finished_at": None})],
    )
    def post(self, request):
        payload = RunStartInputSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        key = idempotency.idempotency_key(request)
        workflow = self._resolve(data)
        try:
            if key is None:
                run, created = start_run(workflow=workflow, run_input=data["input"], actor=self.actor,
                                         priority=data["priority"]), True
            else:
                run, created = start_run_idempotent(
                    actor=self.actor, key=key, request_hash=idempotency.request_hash(data), workflow=workflow,
                    run_input=data["input"], priority=data["priority"])
        except (WorkflowNotStartable, IdempotencyConflict) as exc:
            raise Conflict(str(exc)) from exc
        headers = {"Location": _run_url(request, run)}
        if not created:
            headers[idempotency.REPLAYED_HEADER] = "true"
        body = RunSerializer(_run_detail(self.organization, run.pk), context={"request": request}).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK, headers=headers)

    def _resolve(self, data) -> Workflow:
        try:
            workflow = resolve_workflow(organization=self.organization, workflow=data["workflow"],
                                        version=data.get("version"))
        except Workflow.DoesNotExist as exc:
            raise ValidationError({"workflow": [str(exc)]}) from exc
        if data.get("version") is not None and workflow.version != data["version"]:
            raise ValidationError({"version": [
                f"workflow {data['workflow']} is version {workflow.version}; omit version when naming an id"]})
        return workflow


class RunDetailView(_RunView):
    """GET /runs/<id>/ — a run with its task runs."""

    required_action = {"GET": Action.READ}

    @extend_schema(
        operation_id="runs_retrieve",
        summary="Get a run",
        description="A run with its input and its task runs (key, state, attempt, output, error, times); "
        "`retry_of` is the run it retries, `trigger` the cron trigger that started it. An output larger than "
        "FLOWFORGE_INLINE_OUTPUT_BYTES (4 KiB by default) of JSON is not inlined: its place holds "
        "`{\"truncated\": true, \"bytes\": <size>, \"url\": <runs_task_output URL>}`.",
        responses={200: RunSerializer},
        examples=[OpenApiExample("run", response_only=True, value=RUN_EXAMPLE)],
    )
    def get(self, request, pk):
        return Response(RunSerializer(_run_detail(self.actor, pk), context={"request": request}).data)


class RunCancelView(OwnTransactions, _RunView):
    """POST /runs/<id>/cancel/ — cancel a run; 409 when it had already finished."""

    required_action = {"POST": Action.RUN_OPERATE}

    @extend_schema(
        operation_id="runs_cancel",
        summary="Cancel a run",
        description="Cancel every open task of the run, then the run. A running task's worker finds out at its "
        "next heartbeat and its result is discarded.",
        request=None,
        responses={200: RunSerializer, **problem(409, "The run had already finished.", problem_example(
            409, "The run has already finished (succeeded).", "conflict"))},
        examples=[OpenApiExample("cancelled", response_only=True, value={
            **RUN_EXAMPLE, "state": "cancelled", "error": "cancelled via the API by API key 3k9x0q1w2e4r",
            "task_runs": []})],
    )
    def post(self, request, pk):
        run = _run_detail(self.actor, pk)
        changed = cancel_run(run=run, actor=self.actor, reason=f"cancelled via the API by {_who(self.actor)}")
        run = _run_detail(self.actor, pk)
        if not changed:
            raise Conflict(f"The run has already finished ({run.state}).")
        return Response(RunSerializer(run, context={"request": request}).data)


class RunRetryView(_RunView):
    """POST /runs/<id>/retry/ — re-run as a new run: the same workflow version and input, every
    task again (``/resume/`` re-runs only what did not succeed, in place: api.views_recovery)."""

    required_action = {"POST": Action.RUN_OPERATE}

    @extend_schema(
        operation_id="runs_retry",
        summary="Re-run a run as a new run",
        description="Start a new run of the same workflow version with the same input, linked to this one by "
        "`retry_of`: every task runs again, succeeded ones included. Only a finished run can be re-run. To run "
        "again only what did not succeed, in this same run, use `POST /runs/{id}/resume/`.",
        request=None,
        responses={201: RunSerializer, **problem(
            409, "The run is still going, or its workflow version is no longer active.",
            problem_example(409, "run 3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b is running; only a finished run can "
                            "be retried", "conflict"))},
        examples=[OpenApiExample("retried", response_only=True, status_codes=["201"], value={
            **RUN_EXAMPLE, "id": "7c8d9e0f-1a2b-4c3d-8e4f-5a6b7c8d9e0f", "state": "running",
            "trigger_source": "retry", "retry_of": RUN_EXAMPLE["id"], "finished_at": None})],
    )
    def post(self, request, pk):
        try:
            new = retry_run(actor=self.actor, run=access_run(self.actor, pk, shape=lambda qs: qs.select_related(
                "workflow")))
        except (RunNotFinished, WorkflowNotStartable) as exc:
            raise Conflict(str(exc)) from exc
        return Response(RunSerializer(_run_detail(self.organization, new.pk), context={"request": request}).data,
                        status=status.HTTP_201_CREATED,
                        headers={"Location": _run_url(request, new)})


class RunTaskOutputView(OrganizationAPIView):
    """GET /runs/<run_id>/task-runs/<id>/output/ — one task run's whole output (the URL a
    run's detail gives for an output too large to inline)."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return TaskRun.objects.for_organization(self.organization).filter(workflow_run_id=self.kwargs["run_id"])

    @extend_schema(
        operation_id="runs_task_output",
        summary="Get a task run's output",
        description="The whole output of one task run of the run: `output` is null while the task has none. "
        "An output over FLOWFORGE_MAX_OUTPUT_BYTES was kept in the offload storage (up to "
        "FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES) and is returned whole here, with `offloaded: true`; "
        "410 when its stored bytes are gone or damaged.",
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="`{id, key, state, output, offloaded}`."),
                   **problem(410, "The offloaded output's bytes are gone from the storage or do not match their "
                             "SHA-256.", problem_example(410, "the offloaded output outputs/... cannot be read "
                                                              "([Errno 2] No such file or directory)", "gone"))},
        examples=[OpenApiExample("output", response_only=True, value={
            "id": "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a", "key": "extract", "state": "succeeded",
            "output": {"rows": 1200}, "offloaded": False})],
    )
    def get(self, request, run_id, pk):
        task_run = access_task_run(self.actor, run_id, pk, shape=lambda qs: qs.select_related("task").only(
            "id", "organization_id", "workflow_run_id", "state", "output", "fencing_token", "task__key"))
        output = task_run.output
        payload = offload.payload_of(task_run) if offload.is_ref(output) else None
        if payload is not None:
            try:
                output = json.loads(offload.read_payload(payload))
            except offload.PayloadUnavailable as exc:
                raise Gone(str(exc)) from None
        return Response({"id": str(task_run.pk), "key": task_run.task.key, "state": task_run.state,
                         "output": output, "offloaded": payload is not None})


# --- run events -----------------------------------------------------------------------------------


class RunEventListView(OrganizationAPIView):
    """GET /runs/<id>/events/ — the run's history in ``seq`` order."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return WorkflowRun.objects.for_organization(self.organization).only("id", "organization_id")

    @extend_schema(
        operation_id="runs_events",
        summary="List a run's events",
        description="The run's history in `seq` order (gap-free per run, assigned in commit order; never a "
        "clock). `?after=<seq>` returns only later events; `next` is this URL with `after` set to the page's last "
        "`seq`, and null when no more events exist yet — to follow a live run, ask again with `after` = the last "
        "seq you saw, or use the stream.",
        parameters=[OpenApiParameter("after", int, description="Only events with a greater seq."),
                    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500},
                                     description="Rows per page, 1 to 500 (default 50).")],
        responses={200: RunEventPageSerializer},
        examples=[OpenApiExample("events", response_only=True, value={"results": [EVENT_EXAMPLE], "next": None})],
    )
    def get(self, request, pk):
        run = access_run(self.actor, pk, shape=_run_id_only)
        events = TaskRunEvent.objects.for_organization(self.organization).filter(
            workflow_run=run, run_created_at=run.created_at).select_related("task_run__task")  # one partition
        rows, next_url = paginate_by_int(events, request, field="seq", param="after", descending=False)
        return Response(page(RunEventSerializer(rows, many=True).data, next_url))


class RunEventStreamView(OrganizationAPIView):
    """GET /runs/<id>/events/stream/ — the run's events as server-sent events, live,
    until its ``run_finished`` event (api.streaming). Outside ATOMIC_REQUESTS."""

    required_action = {"GET": Action.READ}
    renderer_classes = [JSONRenderer, streaming.EventStreamRenderer]

    @classmethod
    def as_view(cls, **initkwargs):
        # Outside ATOMIC_REQUESTS: the stream can last an hour and must not run inside
        # (or be rolled back with) a request transaction (api.streaming).
        return transaction.non_atomic_requests(super().as_view(**initkwargs))

    def dispatch(self, request, *args, **kwargs):
        # Authentication, the permission check and the run lookup in one short transaction
        # of their own, so an error's rollback (DRF's set_rollback) stays inside it; the
        # stream is iterated after this returns, in autocommit.
        with transaction.atomic():
            return super().dispatch(request, *args, **kwargs)

    def get_scoped_queryset(self):
        return WorkflowRun.objects.for_organization(self.organization).only("id", "organization_id")

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response):
            # An error is a problem+json document even when the client asked for an event stream.
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
            if response.status_code >= 400:
                response.content_type = PROBLEM_CONTENT_TYPE
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        operation_id="runs_events_stream",
        summary="Stream a run's events",
        description="Server-sent events (`text/event-stream`): each event is `id: <seq>` and `data: <event JSON>`. "
        "Starts after `Last-Event-ID` (sent by a reconnecting EventSource) or `?after=`, sends every later event "
        "as it is committed, and ends after the run's `run_finished` event (at once if that was already sent). "
        "A comment line (`: heartbeat`) is sent after 15 s without events. The stream ends after an hour; "
        "reconnect with Last-Event-ID. It also ends, without a last message, once the key is revoked or expired "
        "(checked at least every FLOWFORGE_SSE_REAUTH_SECONDS, 30 s by default). Open streams are limited per key "
        "(or user), per organization and per server process: past a limit, 429 with Retry-After.",
        parameters=[
            OpenApiParameter("after", int, description="Start after this seq (default 0: the whole history)."),
            OpenApiParameter("Last-Event-ID", int, OpenApiParameter.HEADER,
                             description="Resume after this seq; wins over `after`."),
        ],
        responses={(200, "text/event-stream"): OpenApiResponse(
            OpenApiTypes.STR, description="The event stream.",
            examples=[OpenApiExample("stream", response_only=True, media_type="text/event-stream", value=(
                'retry: 2000\n\nid: 4\ndata: {"seq":4,"run":"3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b","kind":'
                '"succeeded","task_key":"extract","from_state":"running","to_state":"succeeded"}\n\n'))])},
    )
    def get(self, request, pk):
        run = access_run(self.actor, pk, shape=_run_id_only)
        header = request.headers.get("Last-Event-ID")
        if header is not None and header.strip() != "":
            after = non_negative_int(header, field="Last-Event-ID")
        else:
            after = non_negative_int(request.query_params.get("after"), field="after")
        if request.method == "HEAD":  # the headers only: no LISTEN, no worker held until the run ends
            stream = iter(())
        else:
            lease = streaming.acquire_stream(request, organization_id=self.organization.pk)  # 429 past a limit
            stream = live_stream.LeasedStream(
                streaming.run_event_stream(organization_id=self.organization.pk, run_id=run.pk, after=after or 0,
                                           lease=lease),
                lease)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response
