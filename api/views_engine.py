"""REST API v1: workflows and runs.

Views parse and authorize (api.base does the authorization), then call a service
function; no view writes a model itself. Every read starts from
``Model.objects.for_organization(self.organization)``; lists fetch their relations
in a constant number of queries.
"""

from __future__ import annotations

from django.db.models import Count, OuterRef, Prefetch, Subquery
from django.db.models.functions import Coalesce
from rest_framework.response import Response

from api.base import OrganizationAPIView
from api.exceptions import Conflict
from api.serializers import RunSerializer, WorkflowDetailSerializer, WorkflowListSerializer
from engine.models import Task, TaskDependency, TaskRun, Workflow, WorkflowRun
from engine.services import cancel_run
from tenancy.permissions import Action


def _who(actor) -> str:
    """The actor as a run's cancel reason names it (an email or a key's public prefix)."""
    if actor.api_key is not None:
        return f"API key {actor.api_key.prefix}"
    return actor.user.email


class WorkflowListView(OrganizationAPIView):
    """GET /workflows/ — the latest version of each workflow name, by name."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        task_counts = (
            Task.objects.for_organization(self.organization)
            .filter(workflow=OuterRef("pk"))
            .order_by()
            .values("workflow")
            .annotate(n=Count("id"))
            .values("n")
        )
        return (
            Workflow.objects.for_organization(self.organization)
            # DISTINCT ON (name) with the highest version first: one row per name.
            .order_by("name", "-version")
            .distinct("name")
            # A correlated count (DISTINCT ON cannot be combined with GROUP BY in the ORM).
            .annotate(task_count=Coalesce(Subquery(task_counts), 0))
        )

    def get(self, request):
        return Response(WorkflowListSerializer(self.get_queryset(), many=True).data)


class WorkflowDetailView(OrganizationAPIView):
    """GET /workflows/<id>/ — one version with its tasks and edges (three queries)."""

    required_action = {"GET": Action.READ}

    def get_scoped_queryset(self):
        org = self.organization
        return Workflow.objects.for_organization(org).prefetch_related(
            Prefetch("tasks", queryset=Task.objects.for_organization(org)),
            Prefetch(
                "dependencies",
                queryset=TaskDependency.objects.for_organization(org).select_related("depends_on"),
            ),
        )

    def get(self, request, pk):
        return Response(WorkflowDetailSerializer(self.get_object()).data)


class _RunView(OrganizationAPIView):
    def get_scoped_queryset(self):
        org = self.organization
        return (
            WorkflowRun.objects.for_organization(org)
            .select_related("workflow")
            .prefetch_related(
                Prefetch(
                    "task_runs",
                    queryset=TaskRun.objects.for_organization(org).select_related("task").order_by("created_at", "id"),
                )
            )
        )


class RunDetailView(_RunView):
    """GET /runs/<id>/ — a run with its task runs."""

    required_action = {"GET": Action.READ}

    def get(self, request, pk):
        return Response(RunSerializer(self.get_object()).data)


class RunCancelView(_RunView):
    """POST /runs/<id>/cancel/ — cancel a run; 409 when it had already finished."""

    required_action = {"POST": Action.RUN_OPERATE}

    def post(self, request, pk):
        run = self.get_object()
        changed = cancel_run(run=run, actor=self.actor, reason=f"cancelled via the API by {_who(self.actor)}")
        run = self.get_object()
        if not changed:
            raise Conflict(f"The run has already finished ({run.state}).")
        return Response(RunSerializer(run).data)
