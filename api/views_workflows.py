"""REST API v1: workflow versions (list, create, validate, get, versions, archive, restore).

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself. One version is read through
engine.access.access_workflow (404 alike for a missing id and another organization's);
lists start from ``Workflow.objects.for_organization(self.organization)``, are
keyset-paginated (api.pagination) and fetch their relations in a constant number of
queries, whatever the page holds.
"""

from __future__ import annotations

from django.db.models import Prefetch
from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from api.base import OrganizationAPIView, validated_query
from api.examples import (
    DEFINITION_EXAMPLE,
    DEFINITION_PROBLEM,
    PAGE_PARAMETERS,
    WORKFLOW_EXAMPLE,
    WORKFLOW_SUMMARY_EXAMPLE,
)
from api.exceptions import InvalidRequest, problem_exception_handler
from api.pagination import page, paginate_by_int, paginate_by_name
from api.schema import problem, problem_example
from api.serializers import (
    MAX_JSON_DEPTH,
    ArchiveInputSerializer,
    ArchiveResultSerializer,
    DefinitionDocumentSerializer,
    ValidateResultSerializer,
    WorkflowAppliedSerializer,
    WorkflowDetailSerializer,
    WorkflowFilterSerializer,
    WorkflowListSerializer,
    WorkflowPageSerializer,
    json_depth_exceeds,
)
from engine.access import access_workflow
from engine.definitions import DefinitionError
from engine.models import Task, TaskDependency, Workflow
from engine.reporting import task_count
from engine.services import (
    ConfirmationRequired,
    apply_definition,
    archive_workflow,
    check_definition,
    restore_workflow,
)
from tenancy.access import organization_id_of
from tenancy.models import without_credentials
from tenancy.permissions import Action


class InvalidDefinition(InvalidRequest):
    """400: a workflow definition was rejected; the problem's ``errors`` lists {path, message}."""

    default_detail = "The workflow definition is invalid; see errors."
    default_code = "invalid_definition"


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


def _workflow_detail(organization, pk):
    """The version ``pk`` with what WorkflowDetailSerializer reads prefetched: three
    queries, whatever the number of tasks and edges; ObjectNotFound (a 404) otherwise."""
    organization = organization_id_of(organization)  # an Actor, an Organization or its id
    return access_workflow(organization, pk, shape=lambda qs: _with_creator(qs).prefetch_related(
        Prefetch("tasks", queryset=Task.objects.for_organization(organization)),
        Prefetch(
            "dependencies",
            queryset=TaskDependency.objects.for_organization(organization).select_related("task", "depends_on"),
        ),
    ))


def _with_creator(queryset):
    """Who stored each version (VersionCreatorFields), read with the rows: the user and the
    API key joined, without the user's password hash or the key's hash (never needed to
    show who it was)."""
    return without_credentials(queryset, "created_by", "created_by_api_key")


def _with_task_counts(queryset, organization):
    """The rows WorkflowListSerializer reads: each version's task count, and who stored it."""
    return _with_creator(queryset.annotate(task_count=task_count(organization)))


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
        filters = validated_query(request, WorkflowFilterSerializer)
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
        "for a new name), active: 201 with `unchanged: false`. A document identical to the name's latest version "
        "(the same normalized definition and input schema, that version active) stores nothing: 200 with that "
        "version and `unchanged: true`. Re-applying a file is therefore idempotent.",
        request=DefinitionDocumentSerializer,
        responses={201: WorkflowAppliedSerializer, 200: WorkflowAppliedSerializer, **DEFINITION_PROBLEM,
                   **problem(422, "The organization's stored definitions would exceed its quota "
                             "(max_definition_bytes); the problem's `used` and `allowed` are in bytes.",
                             problem_example(422, "stored definitions quota (max_definition_bytes) exceeded: the "
                                             "organization stores 10485000 bytes of workflow definitions, this "
                                             "version adds 1200, and the limit is 10485760 bytes",
                                             "quota_exceeded"))},
        examples=[OpenApiExample("definition", request_only=True, value=DEFINITION_EXAMPLE),
                  OpenApiExample("created", response_only=True, status_codes=["201"],
                                 value={**WORKFLOW_EXAMPLE, "unchanged": False}),
                  OpenApiExample("unchanged", response_only=True, status_codes=["200"],
                                 value={**WORKFLOW_EXAMPLE, "unchanged": True})],
    )
    def post(self, request):
        try:
            workflow = apply_definition(document=_document(request), actor=self.actor, if_changed=True)
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        body = WorkflowAppliedSerializer(_workflow_detail(self.organization, workflow.pk),
                                         context={"unchanged": workflow.unchanged}).data
        location = request.build_absolute_uri(reverse("api:workflow-detail", kwargs={"pk": workflow.pk}))
        return Response(body, status=status.HTTP_200_OK if workflow.unchanged else status.HTTP_201_CREATED,
                        headers={"Location": location})


class WorkflowValidateView(OrganizationAPIView):
    """POST /workflows/validate/ — validate a definition without storing anything."""

    required_action = {"POST": Action.READ}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization).none()

    @extend_schema(
        operation_id="workflows_validate",
        summary="Validate a definition",
        description="Check a definition document as POST /workflows/ would (secrets it references included), "
        "and return its normalized form (defaults filled in). Stores nothing.",
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
            normalized = check_definition(document=_document(request), organization=self.organization)
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        return Response({"valid": True, "normalized": normalized})


class WorkflowDetailView(OrganizationAPIView):
    """GET /workflows/<id>/ — one version with its tasks and edges (three queries)."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization)

    @extend_schema(
        operation_id="workflows_retrieve",
        summary="Get a workflow version",
        description="One version with its tasks (type, config, upstream keys, retry settings, canvas position) "
        "and its labelled edges.",
        responses={200: WorkflowDetailSerializer},
        examples=[OpenApiExample("workflow", response_only=True, value=WORKFLOW_EXAMPLE)],
    )
    def get(self, request, pk):
        return Response(WorkflowDetailSerializer(_workflow_detail(self.actor, pk)).data)


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
        workflow = access_workflow(self.actor, pk)
        qs = _with_task_counts(self.get_queryset().filter(name=workflow.name), self.organization)
        rows, next_url = paginate_by_int(qs, request, field="version", param="before", descending=True)
        return Response(page(WorkflowListSerializer(rows, many=True).data, next_url))


class WorkflowArchiveView(OrganizationAPIView):
    """POST /workflows/<id>/archive/ — archive the version (confirm with its name); its
    running runs are cancelled."""

    required_action = {"POST": Action.WORKFLOW_EDIT}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization)

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
        workflow = _workflow_detail(self.actor, pk)
        payload = ArchiveInputSerializer(data=request.data if isinstance(request.data, dict) else {})
        payload.is_valid(raise_exception=True)
        try:
            workflow, cancelled = archive_workflow(actor=self.actor, workflow=workflow,
                                                   confirm=payload.validated_data["confirm"])
        except ConfirmationRequired as exc:
            raise ValidationError({"confirm": [str(exc)]}) from exc
        body = {"workflow": WorkflowDetailSerializer(_workflow_detail(self.actor, pk)).data, "runs_cancelled": cancelled}
        return Response(body)


class WorkflowRestoreView(OrganizationAPIView):
    """POST /workflows/<id>/restore/ — make an archived version active again, after
    re-validating its definition."""

    required_action = {"POST": Action.WORKFLOW_EDIT}

    def get_scoped_queryset(self):
        return Workflow.objects.for_organization(self.organization)

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
            restore_workflow(actor=self.actor, workflow=_workflow_detail(self.actor, pk))
        except DefinitionError as exc:
            return _definition_problem(self, exc)
        return Response(WorkflowDetailSerializer(_workflow_detail(self.actor, pk)).data)
