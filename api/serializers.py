"""Serializers of the REST API v1. Read shapes are explicit field lists; nothing is
writable through a ModelSerializer (writes go through the service functions)."""

from __future__ import annotations

from rest_framework import serializers

from engine.models import TaskRun, Workflow, WorkflowRun
from tenancy.apikeys import NAME_MAX_LENGTH
from tenancy.models import ApiKey, Role


class WorkflowListSerializer(serializers.ModelSerializer):
    """The latest version of one workflow name (``task_count`` is annotated by the view)."""

    task_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Workflow
        fields = ["id", "name", "version", "state", "description", "task_count", "created_at"]
        read_only_fields = fields


class TaskSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    key = serializers.CharField()
    type = serializers.CharField()
    config = serializers.JSONField()
    max_attempts = serializers.IntegerField()
    retry_backoff_seconds = serializers.FloatField()
    timeout_seconds = serializers.FloatField(allow_null=True)
    depends_on = serializers.SerializerMethodField()

    def get_depends_on(self, task) -> list[str]:
        # Filled by WorkflowDetailSerializer from the prefetched edges (no query per task).
        return sorted(self.context["depends_on"].get(task.pk, []))


class WorkflowDetailSerializer(serializers.ModelSerializer):
    """One workflow version with its tasks and each task's upstream task keys.

    Expects ``tasks`` and ``dependencies`` (with ``depends_on``) prefetched.
    """

    tasks = serializers.SerializerMethodField()

    class Meta:
        model = Workflow
        fields = ["id", "name", "version", "state", "description", "created_at", "tasks"]
        read_only_fields = fields

    def get_tasks(self, workflow) -> list[dict]:
        depends_on: dict = {}
        for edge in workflow.dependencies.all():
            depends_on.setdefault(edge.task_id, []).append(edge.depends_on.key)
        tasks = sorted(workflow.tasks.all(), key=lambda t: t.key)
        return TaskSerializer(tasks, many=True, context={**self.context, "depends_on": depends_on}).data


class TaskRunSerializer(serializers.ModelSerializer):
    task_id = serializers.UUIDField(read_only=True)
    task_key = serializers.CharField(source="task.key", read_only=True)

    class Meta:
        model = TaskRun
        fields = ["id", "task_id", "task_key", "state", "attempt", "output", "error",
                  "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class RunSerializer(serializers.ModelSerializer):
    """A run with its task runs. Expects ``workflow`` selected and ``task_runs__task`` prefetched."""

    workflow = serializers.SerializerMethodField()
    task_runs = TaskRunSerializer(many=True, read_only=True)

    class Meta:
        model = WorkflowRun
        fields = ["id", "workflow", "state", "input", "trigger_source", "error",
                  "created_at", "started_at", "finished_at", "task_runs"]
        read_only_fields = fields

    def get_workflow(self, run) -> dict:
        wf = run.workflow
        return {"id": str(wf.pk), "name": wf.name, "version": wf.version}


class ApiKeySerializer(serializers.ModelSerializer):
    """An API key as lists show it: the public prefix, never the secret or its hash."""

    created_by = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = ["id", "prefix", "name", "role", "created_by", "created_at", "last_used_at",
                  "expires_at", "revoked_at"]
        read_only_fields = fields

    def get_created_by(self, api_key) -> str | None:
        return api_key.created_by.email if api_key.created_by_id else None


class ApiKeyCreateSerializer(serializers.Serializer):
    """Input of POST /api-keys/."""

    name = serializers.CharField(max_length=NAME_MAX_LENGTH)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
