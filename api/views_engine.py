"""REST API v1: workflows, runs and run events.

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself. Every read starts from
``Model.objects.for_organization(self.organization)``, so another organization's id
answers 404 like a missing one. Lists are keyset-paginated (api.pagination) and fetch
their relations in a constant number of queries, whatever the page holds.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Count, OuterRef, Prefetch, Q, Subquery
from django.db.models.functions import Coalesce
from django.http import StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from api import idempotency, streaming
from api.base import OrganizationAPIView
from api.exceptions import PROBLEM_CONTENT_TYPE, Conflict, InvalidRequest, problem_exception_handler
from api.pagination import non_negative_int, page, paginate_by_int, paginate_by_name, paginate_newest_first
from api.schema import problem, problem_example
from api.serializers import (
    MAX_JSON_DEPTH,
    ArchiveInputSerializer,
    ArchiveResultSerializer,
    DefinitionDocumentSerializer,
    DefinitionProblemSerializer,
    RunEventPageSerializer,
    RunEventSerializer,
    RunFilterSerializer,
    RunListSerializer,
    RunPageSerializer,
    RunSerializer,
    RunStartInputSerializer,
    ValidateResultSerializer,
    WorkflowDetailSerializer,
    WorkflowFilterSerializer,
    WorkflowListSerializer,
    WorkflowPageSerializer,
    json_depth_exceeds,
)
from engine import live_limits
from engine.definitions import DefinitionError, validate_document
from engine.models import Task, TaskDependency, TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.outputs import with_output_sizes
from engine.services import (
    ConfirmationRequired,
    IdempotencyConflict,
    RunNotFinished,
    WorkflowNotStartable,
    apply_definition,
    archive_workflow,
    cancel_run,
    resolve_workflow,
    restore_workflow,
    retry_run,
    start_run,
    start_run_idempotent,
)
from tenancy.permissions import Action

# --- helpers --------------------------------------------------------------------------------------


class InvalidDefinition(InvalidRequest):
    """400: a workflow definition was rejected; the problem's ``errors`` lists {path, message}."""

    default_detail = "The workflow definition is invalid; see errors."
    default_code = "invalid_definition"


def _who(actor) -> str:
    """The actor as a run's cancel reason names it (an email or a key's public prefix)."""
    if actor.api_key is not None:
        return f"API key {actor.api_key.prefix}"
    return actor.user.email


def _query(request, serializer_class):
    """The request's query parameters validated by ``serializer_class`` (empty values
    count as absent); ValidationError (400 naming the parameter) otherwise."""
    data = {k: v for k, v in request.query_params.items() if v != ""}
    filters = serializer_class(data=data)
    filters.is_valid(raise_exception=True)
    return filters.validated_data


def _document(request) -> dict:
    """The request body as a definition document; DefinitionError when it is not a JSON object."""
    data = request.data
    if not isinstance(data, dict) or hasattr(data, "getlist"):  # a QueryDict is form data, not JSON
        raise DefinitionError([{"path": "document", "message": "the body must be a JSON object with name and tasks"}])
    if json_depth_exceeds(data):
        raise DefinitionError([{"path": "document", "message": f"is nested deeper than {MAX_JSON_DEPTH} levels"}])
    return data


def _definition_problem(view, exc: DefinitionError) -> Response:
    """The 400 problem of a rejected definition, ``errors`` being DefinitionError.errors."""
    response = problem_exception_handler(InvalidDefinition(), view.get_exception_handler_context())
    response.data["errors"] = exc.errors
    return response


def _run_url(request, run) -> str:
    return request.build_absolute_uri(reverse("api:run-detail", kwargs={"pk": run.pk}))


def _workflow_queryset(organization):
    """Workflow versions of ``organization`` with what WorkflowDetailSerializer reads
    prefetched: three queries, whatever the number of tasks and edges."""
    return Workflow.objects.for_organization(organization).prefetch_related(
        Prefetch("tasks", queryset=Task.objects.for_organization(organization)),
        Prefetch(
            "dependencies",
            queryset=TaskDependency.objects.for_organization(organization).select_related("task", "depends_on"),
        ),
    )


def _with_task_counts(queryset, organization):
    task_counts = (
        Task.objects.for_organization(organization)
        .filter(workflow=OuterRef("pk"))
        .order_by()
        .values("workflow")
        .annotate(n=Count("id"))
        .values("n")
    )
    # A correlated count (DISTINCT ON cannot be combined with GROUP BY in the ORM).
    return queryset.annotate(task_count=Coalesce(Subquery(task_counts), 0))


def _run_detail(organization, pk) -> WorkflowRun:
    return _run_queryset(organization).get(pk=pk)


def _run_queryset(organization):
    """Runs with what RunSerializer reads: the run (with workflow and user), its task runs
    with their tasks — two queries. Task outputs are not loaded: their sizes are, and
    the outputs small enough to inline (engine.outputs.with_output_sizes)."""
    return (
        WorkflowRun.objects.for_organization(organization)
        .select_related("workflow", "triggered_by")
        .prefetch_related(
            Prefetch(
                "task_runs",
                queryset=with_output_sizes(
                    TaskRun.objects.for_organization(organization).select_related("task").order_by("created_at", "id")
                ),
            )
        )
    )


PAGE_PARAMETERS = [
    OpenApiParameter("cursor", str, description="The cursor of the next page: follow the `next` link."),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500},
                                     description="Rows per page, 1 to 500 (default 50)."),
]
DEFINITION_EXAMPLE = {
    "name": "etl",
    "description": "Nightly extract and load.",
    "tasks": [
        {"key": "extract", "type": "http", "config": {"url": "https://example.com/data.json"},
         "max_attempts": 3, "retry_backoff_seconds": 2, "position": {"x": 0, "y": 0}},
        {"key": "load", "type": "noop", "depends_on": ["extract"], "edge_labels": {"extract": "rows"},
         "position": {"x": 200, "y": 0}},
    ],
}
WORKFLOW_EXAMPLE = {
    "id": "0b7c1f43-5a4e-4f7e-9a51-6f1b2f7f3d10", "name": "etl", "version": 2, "state": "active",
    "description": "Nightly extract and load.", "created_at": "2026-01-05T09:30:00.123456Z",
    "tasks": [
        {"id": "5d6d3b5e-8e47-4a51-8f0c-0d6f1c2a9b01", "key": "extract", "type": "http",
         "config": {"url": "https://example.com/data.json", "method": "GET"}, "depends_on": [],
         "max_attempts": 3, "retry_backoff_seconds": 2.0, "timeout_seconds": None, "position": {"x": 0, "y": 0}},
        {"id": "9a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "key": "load", "type": "noop", "config": {},
         "depends_on": ["extract"], "max_attempts": 1, "retry_backoff_seconds": 1.0, "timeout_seconds": None,
         "position": {"x": 200, "y": 0}},
    ],
    "edges": [{"from": "extract", "to": "load", "label": "rows"}],
}
WORKFLOW_SUMMARY_EXAMPLE = {k: WORKFLOW_EXAMPLE[k] for k in ("id", "name", "version", "state", "description")}
WORKFLOW_SUMMARY_EXAMPLE |= {"task_count": 2, "created_at": WORKFLOW_EXAMPLE["created_at"]}
RUN_SUMMARY_EXAMPLE = {
    "id": "3f2a8c1e-7b6d-4e5f-9a0b-1c2d3e4f5a6b",
    "workflow": {"id": WORKFLOW_EXAMPLE["id"], "name": "etl", "version": 2},
    "state": "succeeded", "trigger_source": "api", "trigger": None, "triggered_by": None, "retry_of": None,
    "error": "", "created_at": "2026-01-05T10:00:00.000001Z", "started_at": "2026-01-05T10:00:00.000001Z",
    "finished_at": "2026-01-05T10:00:03.250000Z",
}
RUN_EXAMPLE = {
    **{k: v for k, v in RUN_SUMMARY_EXAMPLE.items() if k in ("id", "workflow", "state")},
    "input": {"date": "2026-01-04"},
    **{k: v for k, v in RUN_SUMMARY_EXAMPLE.items() if k not in ("id", "workflow", "state")},
    "task_runs": [
        {"id": "aa2f0c55-1d1e-4c4e-8f7a-2b3c4d5e6f70", "key": "extract", "task_id": WORKFLOW_EXAMPLE["tasks"][0]["id"],
         "state": "succeeded", "attempt": 1, "output": {"status": 200, "body": {"rows": 42}, "truncated": False},
         "error": "", "created_at": "2026-01-05T10:00:00.000001Z", "started_at": "2026-01-05T10:00:00.5Z",
         "finished_at": "2026-01-05T10:00:01.75Z"},
    ],
}
EVENT_EXAMPLE = {
    "seq": 4, "kind": "succeeded", "task_run": "aa2f0c55-1d1e-4c4e-8f7a-2b3c4d5e6f70", "task_key": "extract",
    "from_state": "running", "to_state": "succeeded", "attempt": 1, "fencing_token": 1, "detail": {},
    "created_at": "2026-01-05T10:00:01.750000Z",
}
DEFINITION_PROBLEM = {
    (400, PROBLEM_CONTENT_TYPE): OpenApiResponse(
        DefinitionProblemSerializer,
        description="The definition is invalid: `errors` lists every problem with the task and field it concerns.",
        examples=[OpenApiExample("invalid_definition", response_only=True, status_codes=["400"],
                                 media_type=PROBLEM_CONTENT_TYPE, value={
            "type": "about:blank", "title": "Bad Request", "status": 400,
            "detail": "The workflow definition is invalid; see errors.", "code": "invalid_definition",
            "errors": [{"path": "tasks[load].depends_on", "message": "unknown dependency 'extrakt'"},
                       {"path": "tasks[extract].type", "message": "unknown task type 'htp'; known types: fail, "
                        "http, noop, python, sleep"}]})],
    )
}


# --- workflows ------------------------------------------------------------------------------------


class WorkflowListView(OrganizationAPIView):
    """GET /workflows/ — the latest version of each workflow name, by name;
    POST /workflows/ — store a definition as the next version of its name."""

    required_action = {"GET": Action.READ, "POST": Action.WORKFLOW_EDIT}

    def get_scoped_queryset(self):
        # DISTINCT ON (name) with the highest version first: one row per name
        # (uniq_workflow_name_version (organization, name, version) serves it).
        return Workflow.objects.for_organization(self.organization).order_by("name", "-version").distinct("name")

    @extend_schema(
        operation_id="workflows_list",
        summary="List workflows",
        description="The latest version of each workflow name, in name order. `state` keeps the versions in "
        "that state before the latest is picked (so `?state=active` gives each name's latest active version, "
        "the one a start by name runs).",
        parameters=[OpenApiParameter("name", str, description="Only this workflow name."),
                    OpenApiParameter("state", str, enum=["draft", "active", "archived"]), *PAGE_PARAMETERS],
        responses={200: WorkflowPageSerializer},
        examples=[OpenApiExample("page", response_only=True,
                                 value={"results": [WORKFLOW_SUMMARY_EXAMPLE], "next": None})],
    )
    def get(self, request):
        filters = _query(request, WorkflowFilterSerializer)
        qs = self.get_queryset()
        if "name" in filters:
            qs = qs.filter(name=filters["name"])
        if "state" in filters:
            qs = qs.filter(state=filters["state"])
        rows, next_url = paginate_by_name(_with_task_counts(qs, self.organization), request)
        return Response(page(WorkflowListSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="workflows_create",
        summary="Create a workflow version",
        description="Validate a definition document and store it as the next version of its name (version 1 "
        "for a new name), active.",
        request=DefinitionDocumentSerializer,
        responses={201: WorkflowDetailSerializer, **DEFINITION_PROBLEM},
        examples=[OpenApiExample("definition", request_only=True, value=DEFINITION_EXAMPLE),
                  OpenApiExample("created", response_only=True, status_codes=["201"], value=WORKFLOW_EXAMPLE)],
    )
    def post(self, request):
        try:
            workflow = apply_definition(document=_document(request), actor=self.actor)
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        body = WorkflowDetailSerializer(_workflow_queryset(self.organization).get(pk=workflow.pk)).data
        location = request.build_absolute_uri(reverse("api:workflow-detail", kwargs={"pk": workflow.pk}))
        return Response(body, status=status.HTTP_201_CREATED, headers={"Location": location})


class WorkflowValidateView(OrganizationAPIView):
    """POST /workflows/validate/ — validate a definition without storing anything."""

    required_action = {"POST": Action.READ}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization).none()

    @extend_schema(
        operation_id="workflows_validate",
        summary="Validate a definition",
        description="Check a definition document as POST /workflows/ would, and return its normalized form "
        "(defaults filled in). Stores nothing.",
        request=DefinitionDocumentSerializer,
        responses={200: ValidateResultSerializer, **DEFINITION_PROBLEM},
        examples=[OpenApiExample("definition", request_only=True, value=DEFINITION_EXAMPLE),
                  OpenApiExample("valid", response_only=True, value={"valid": True, "normalized": {
                      "name": "etl", "description": "", "tasks": [
                          {"key": "extract", "type": "noop", "config": {}, "depends_on": [], "max_attempts": 1,
                           "retry_backoff_seconds": 1.0, "timeout_seconds": None}]}})],
    )
    def post(self, request):
        try:
            normalized = validate_document(_document(request))
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        return Response({"valid": True, "normalized": normalized})


class WorkflowDetailView(OrganizationAPIView):
    """GET /workflows/<id>/ — one version with its tasks and edges (three queries)."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return _workflow_queryset(self.organization)

    @extend_schema(
        operation_id="workflows_retrieve",
        summary="Get a workflow version",
        description="One version with its tasks (type, config, upstream keys, retry settings, canvas position) "
        "and its labelled edges.",
        responses={200: WorkflowDetailSerializer},
        examples=[OpenApiExample("workflow", response_only=True, value=WORKFLOW_EXAMPLE)],
    )
    def get(self, request, pk):
        return Response(WorkflowDetailSerializer(self.get_object()).data)


class WorkflowVersionsView(OrganizationAPIView):
    """GET /workflows/<id>/versions/ — every version of that workflow's name, newest first."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization)

    @extend_schema(
        operation_id="workflows_versions",
        summary="List a workflow's versions",
        description="Every version of the named workflow (any state), newest first. Paginated by version: "
        "`next` carries `?before=<version>`.",
        parameters=[OpenApiParameter("before", int, description="Only versions below this one (the `next` link)."),
                    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 500},
                                     description="Rows per page, 1 to 500 (default 50).")],
        responses={200: WorkflowPageSerializer},
        examples=[OpenApiExample("versions", response_only=True, value={"results": [
            WORKFLOW_SUMMARY_EXAMPLE, {**WORKFLOW_SUMMARY_EXAMPLE, "version": 1, "state": "archived",
                                       "id": "c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f"}], "next": None})],
    )
    def get(self, request, pk):
        workflow = self.get_object()
        qs = _with_task_counts(self.get_queryset().filter(name=workflow.name), self.organization)
        rows, next_url = paginate_by_int(qs, request, field="version", param="before", descending=True)
        return Response(page(WorkflowListSerializer(rows, many=True).data, next_url))


class WorkflowArchiveView(OrganizationAPIView):
    """POST /workflows/<id>/archive/ — archive the version (confirm with its name); its
    running runs are cancelled."""

    required_action = {"POST": Action.WORKFLOW_EDIT}

    def get_scoped_queryset(self):
        return _workflow_queryset(self.organization)

    @extend_schema(
        operation_id="workflows_archive",
        summary="Archive a workflow version",
        description="Archive the version: it refuses new runs and its pending or running runs are cancelled. "
        "`confirm` must be the workflow's name.",
        request=ArchiveInputSerializer,
        responses={200: ArchiveResultSerializer, **problem(
            400, "`confirm` is missing or is not the workflow's name.",
            problem_example(400, "The request is invalid; see errors.", "invalid", errors={
                "confirm": ["archiving cancels the running runs of etl v2; send confirm='etl' to proceed"]}))},
        examples=[OpenApiExample("confirm", request_only=True, value={"confirm": "etl"}),
                  OpenApiExample("archived", response_only=True, value={
                      "workflow": {**WORKFLOW_EXAMPLE, "state": "archived"}, "runs_cancelled": 3})],
    )
    def post(self, request, pk):
        workflow = self.get_object()
        payload = ArchiveInputSerializer(data=request.data if isinstance(request.data, dict) else {})
        payload.is_valid(raise_exception=True)
        try:
            workflow, cancelled = archive_workflow(actor=self.actor, workflow=workflow,
                                                   confirm=payload.validated_data["confirm"])
        except ConfirmationRequired as exc:
            raise ValidationError({"confirm": [str(exc)]}) from exc
        body = {"workflow": WorkflowDetailSerializer(self.get_object()).data, "runs_cancelled": cancelled}
        return Response(body)


class WorkflowRestoreView(OrganizationAPIView):
    """POST /workflows/<id>/restore/ — make an archived version active again, after
    re-validating its definition."""

    required_action = {"POST": Action.WORKFLOW_EDIT}

    def get_scoped_queryset(self):
        return _workflow_queryset(self.organization)

    @extend_schema(
        operation_id="workflows_restore",
        summary="Restore a workflow version",
        description="Make the version active again. Its stored definition is validated against today's task "
        "types first; a definition that no longer validates is a 400 listing why.",
        request=None,
        responses={200: WorkflowDetailSerializer, **DEFINITION_PROBLEM},
        examples=[OpenApiExample("restored", response_only=True, value=WORKFLOW_EXAMPLE)],
    )
    def post(self, request, pk):
        try:
            restore_workflow(actor=self.actor, workflow=self.get_object())
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        return Response(WorkflowDetailSerializer(self.get_object()).data)


# --- runs -----------------------------------------------------------------------------------------


class _RunView(OrganizationAPIView):
    def get_scoped_queryset(self):
        return _run_queryset(self.organization)


class RunListView(OrganizationAPIView):
    """GET /runs/ — the organization's runs, newest first; POST /runs/ — start one."""

    required_action = {"GET": Action.READ, "POST": Action.RUN_OPERATE}

    def get_scoped_queryset(self):
        return WorkflowRun.objects.for_organization(self.organization).select_related("workflow", "triggered_by")

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
        filters = _query(request, RunFilterSerializer)
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
        return Response(page(RunListSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="runs_create",
        summary="Start a run",
        description="Start a run of a workflow: by name (the given `version`, else the latest active one) or by a "
        "version's id. Send an `Idempotency-Key` header to make retries safe: a repeat with the same key and "
        "body returns the first run with 200 (and `Idempotent-Replayed: true`) instead of starting another; the "
        "same key with a different body is a 409. Keys are per caller (user or API key) and kept 24 hours. "
        "NUL characters in `input` strings are removed (PostgreSQL's jsonb cannot store them).",
        parameters=[OpenApiParameter(idempotency.HEADER, str, OpenApiParameter.HEADER,
                                     description="1 to 200 visible ASCII characters chosen by the client "
                                     "(a UUID is a good choice).")],
        request=RunStartInputSerializer,
        responses={
            201: RunSerializer,
            200: OpenApiResponse(RunSerializer, description="A repeat of an earlier start with the same "
                                 "Idempotency-Key and body: the first run."),
            **problem(400, "Invalid body: `workflow` names no workflow of the organization, `input` is not a JSON "
                      "object (or holds NaN/Infinity), or the Idempotency-Key is malformed.",
                      problem_example(400, "The request is invalid; see errors.", "invalid", errors={
                          "workflow": ["no workflow 'etl' in organization 'acme'"]})),
            **problem(409, "The workflow is a draft or archived, or the Idempotency-Key was used with another body.",
                      problem_example(409, "workflow etl v2 is archived; only active workflows can start runs",
                                      "conflict")),
        },
        examples=[OpenApiExample("start", request_only=True,
                                 value={"workflow": "etl", "input": {"date": "2026-01-04"}}),
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
                run, created = start_run(workflow=workflow, run_input=data["input"], actor=self.actor), True
            else:
                run, created = start_run_idempotent(
                    actor=self.actor, key=key, request_hash=idempotency.request_hash(data), workflow=workflow,
                    run_input=data["input"])
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
        return Response(RunSerializer(self.get_object(), context={"request": request}).data)


class RunCancelView(_RunView):
    """POST /runs/<id>/cancel/ — cancel a run; 409 when it had already finished."""

    required_action = {"POST": Action.RUN_OPERATE}

    @classmethod
    def as_view(cls, **initkwargs):
        # Outside ATOMIC_REQUESTS: cancel_run owns its transaction (durable, retried on a deadlock).
        return transaction.non_atomic_requests(super().as_view(**initkwargs))

    def handle_exception(self, exc):
        # An error's rollback (DRF's set_rollback) stays inside a transaction of its own,
        # as in a request transaction: it never reaches one the caller holds.
        with transaction.atomic():
            return super().handle_exception(exc)

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
        run = self.get_object()
        changed = cancel_run(run=run, actor=self.actor, reason=f"cancelled via the API by {_who(self.actor)}")
        run = self.get_object()
        if not changed:
            raise Conflict(f"The run has already finished ({run.state}).")
        return Response(RunSerializer(run, context={"request": request}).data)


class RunRetryView(_RunView):
    """POST /runs/<id>/retry/ — start a new run with the same workflow version and input."""

    required_action = {"POST": Action.RUN_OPERATE}

    @extend_schema(
        operation_id="runs_retry",
        summary="Retry a run",
        description="Start a new run of the same workflow version with the same input, linked to this one by "
        "`retry_of`. Only a finished run can be retried.",
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
            new = retry_run(actor=self.actor, run=self.get_object())
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
        return TaskRun.objects.for_organization(self.organization).filter(
            workflow_run_id=self.kwargs["run_id"]).select_related("task").only(
            "id", "organization_id", "workflow_run_id", "state", "output", "task__key")

    @extend_schema(
        operation_id="runs_task_output",
        summary="Get a task run's output",
        description="The whole output of one task run of the run (at most FLOWFORGE_MAX_OUTPUT_BYTES of JSON): "
        "`output` is null while the task has none.",
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="`{id, key, state, output}`.")},
        examples=[OpenApiExample("output", response_only=True, value={
            "id": "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a", "key": "extract", "state": "succeeded",
            "output": {"rows": 1200}})],
    )
    def get(self, request, run_id, pk):
        task_run = self.get_object()
        return Response({"id": str(task_run.pk), "key": task_run.task.key, "state": task_run.state,
                         "output": task_run.output})


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
        run = self.get_object()
        events = TaskRunEvent.objects.for_organization(self.organization).filter(workflow_run=run).select_related(
            "task_run__task")
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
        run = self.get_object()
        header = request.headers.get("Last-Event-ID")
        if header is not None and header.strip() != "":
            after = non_negative_int(header, field="Last-Event-ID")
        else:
            after = non_negative_int(request.query_params.get("after"), field="after")
        if request.method == "HEAD":  # the headers only: no LISTEN, no worker held until the run ends
            stream = iter(())
        else:
            lease = streaming.acquire_stream(request, organization_id=self.organization.pk)  # 429 past a limit
            stream = live_limits.LeasedStream(
                streaming.run_event_stream(organization_id=self.organization.pk, run_id=run.pk, after=after or 0,
                                           lease=lease),
                lease)
        response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response
