"""Serializers of one task run's detail (issue 19): GET /runs/{run_id}/task-runs/{id}/.

Read shapes only, over ``engine.task_detail.TaskDetail``; outputs (the task run's and its
upstream task runs') are inline up to FLOWFORGE_INLINE_OUTPUT_BYTES, else a summary with
the URL of the whole output (``engine.outputs``), as in a run's detail.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.serializers import SKIP_REASON_HELP, WAITING_REASON_HELP, RunEventSerializer
from engine.models import TaskLog, TaskRunState
from engine.outputs import output_or_summary
from engine.states import SkipReason, TriggerRule
from engine.task_detail import OUTCOMES, AttemptDetail, TaskDetail, UpstreamDetail


def _absolute(context: dict, path: str) -> str:
    request = context.get("request")
    return request.build_absolute_uri(path) if request is not None else path


def output_url(context: dict, task_run) -> str:
    """The URL of a task run's whole output (GET /runs/{run}/task-runs/{id}/output/)."""
    return _absolute(context, reverse("api:run-task-output", kwargs={"run_id": task_run.workflow_run_id,
                                                                      "pk": task_run.pk}))


def logs_url(context: dict, task_run, **filters: Any) -> str:
    """The URL of a task run's log lines (GET /runs/{run}/task-runs/{id}/logs/), filtered."""
    path = reverse("api:run-task-logs", kwargs={"run_id": task_run.workflow_run_id, "pk": task_run.pk})
    return _absolute(context, path + (f"?{urlencode(filters)}" if filters else ""))


class AttemptLogLineSerializer(serializers.Serializer):
    """One log line of an attempt, secret values redacted."""

    id = serializers.IntegerField(help_text="Increasing: the order, and the logs endpoint's `after` cursor.")
    stream = serializers.ChoiceField(choices=TaskLog.Stream.choices, help_text=(
        "Where it came from: `logging` (a logging record of the handler, its logger's name first), `stdout`, "
        "`stderr`, `http` (the http task's request summary), `worker` (sent by the organization's own worker), "
        "`system` (FlowForge's: the log was truncated)."))
    level = serializers.ChoiceField(choices=TaskLog.Level.choices)
    message = serializers.CharField()
    created_at = serializers.DateTimeField(help_text="When it was written (captured, or received from a worker).")


class AttemptLogsSerializer(serializers.Serializer):
    lines = AttemptLogLineSerializer(many=True, help_text="The attempt's last lines (at most 500), oldest first.")
    more = serializers.BooleanField(help_text="Older lines of this attempt exist: `url` pages through them all.")
    url = serializers.URLField(help_text="Every line of this attempt (the logs endpoint for its `fencing_token`).")


class AttemptSerializer(serializers.Serializer):
    """One attempt (a started generation) of the task run."""

    attempt = serializers.IntegerField(source="number", allow_null=True, help_text="Its number, from 1.")
    fencing_token = serializers.IntegerField(help_text="Its generation.")
    worker = serializers.CharField(help_text="Who ran it: the lease owner its start recorded (`worker@host:pid:"
                                   "thread` for the shared workers, `worker:<id>` for the organization's own).")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True, help_text="Null while it runs.")
    outcome = serializers.ChoiceField(choices=OUTCOMES, help_text=(
        "`running`; `succeeded`; `retried` (it failed and another attempt followed); `failed` (it failed and "
        "none followed); `timed_out` (its timeout_seconds passed); `lease_expired` (its worker stopped "
        "heartbeating); `cancelled` (with its run); `skipped` (its condition was false: the handler did not run)."))
    error = serializers.CharField(help_text="`Type: message` of its failure ('' for none), secret values redacted.")
    traceback = serializers.CharField(help_text=(
        "The handler's full traceback when it raised ('' otherwise), secret values redacted, at most "
        "FLOWFORGE_TASK_TRACEBACK_MAX_CHARS characters (16,000 by default: its start and end, a line saying how "
        "much of the middle was cut)."))
    output = serializers.SerializerMethodField(help_text=(
        "The task run's output for the attempt that succeeded (inline, or over FLOWFORGE_INLINE_OUTPUT_BYTES a "
        "summary with the URL of the whole output); null for the others."))
    logs = serializers.SerializerMethodField()

    @extend_schema_field(OpenApiTypes.ANY)
    def get_output(self, attempt: AttemptDetail) -> Any:
        task_run = self.context["task_run"]
        if not attempt.succeeded or task_run.state != TaskRunState.SUCCEEDED:
            return None
        return output_or_summary(task_run, url=output_url(self.context, task_run))

    @extend_schema_field(AttemptLogsSerializer)
    def get_logs(self, attempt: AttemptDetail) -> dict[str, Any]:
        return {"lines": AttemptLogLineSerializer(attempt.logs, many=True).data, "more": attempt.logs_more,
                "url": logs_url(self.context, self.context["task_run"], fencing_token=attempt.fencing_token)}


class UpstreamSerializer(serializers.Serializer):
    """A dependency's task run in the same run."""

    key = serializers.CharField(help_text="The upstream task's key.")
    label = serializers.CharField(help_text="The edge's label ('' for none).")
    task_run_id = serializers.UUIDField()
    state = serializers.CharField()
    output = serializers.JSONField(allow_null=True, help_text=(
        "Its output (what this task's handler receives as `upstream[key]`), or over "
        "FLOWFORGE_INLINE_OUTPUT_BYTES a summary with the URL of the whole output; null while it has none."))

    def to_representation(self, upstream: UpstreamDetail) -> dict[str, Any]:
        tr = upstream.task_run
        return {"key": upstream.key, "label": upstream.label, "task_run_id": str(tr.pk), "state": tr.state,
                "output": output_or_summary(tr, url=output_url(self.context, tr))}


class TaskRunDetailSerializer(serializers.Serializer):
    """One task run in detail: itself, its task's config as configured, its upstream
    outputs, every attempt (logs, error, traceback, output) and its latest events."""

    id = serializers.UUIDField()
    key = serializers.CharField()
    task_id = serializers.UUIDField()
    type = serializers.CharField(help_text="The task type (noop, sleep, fail, python, http, worker).")
    state = serializers.CharField()
    attempt = serializers.IntegerField(help_text="Its current (or last) attempt's number.")
    max_attempts = serializers.IntegerField()
    priority = serializers.IntegerField()
    concurrency_key = serializers.CharField(allow_null=True)
    queue = serializers.CharField(help_text="The queue of the organization's own workers ('' for the shared ones).")
    error = serializers.CharField(help_text="Its last failure's error ('' for none).")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    waiting_reason = serializers.CharField(allow_null=True, help_text=WAITING_REASON_HELP)
    skip_reason = serializers.ChoiceField(choices=SkipReason.choices, help_text=SKIP_REASON_HELP)
    trigger_rule = serializers.ChoiceField(choices=TriggerRule.choices, help_text=(
        "Its task's trigger rule: when it runs, by its upstream task runs' outcomes (docs/api.md, \"Trigger "
        "rules and conditions\")."))
    condition = serializers.CharField(help_text="Its task's CEL condition ('' for none): false skips it.")
    config = serializers.JSONField(help_text=(
        "The task's input as configured: its config as the workflow version stores it. A secret is shown as its "
        "reference (`{{ secrets.NAME }}`), never its value."))
    output = serializers.JSONField(allow_null=True, help_text=(
        "Its output, or over FLOWFORGE_INLINE_OUTPUT_BYTES a summary with the URL of the whole output."))
    upstream = UpstreamSerializer(many=True, help_text="Its dependencies' task runs, by key.")
    attempts = AttemptSerializer(many=True, help_text="Every attempt, oldest first.")
    events = RunEventSerializer(many=True, help_text=(
        "Its latest events (at most 500) in `seq` order; the attempts' tracebacks are in `attempts`."))
    events_truncated = serializers.BooleanField(help_text="Older events exist (the run's event list has them).")
    logs_url = serializers.URLField(help_text="Every log line of every attempt (paginated).")

    def to_representation(self, detail: TaskDetail) -> dict[str, Any]:
        tr = detail.task_run
        context = {**self.context, "task_run": tr}
        return {
            "id": str(tr.pk), "key": tr.task.key, "task_id": str(tr.task_id), "type": tr.task.type,
            "state": tr.state, "attempt": tr.attempt, "max_attempts": tr.task.max_attempts, "priority": tr.priority,
            "concurrency_key": tr.concurrency_key, "queue": tr.queue, "error": tr.error,
            "created_at": serializers.DateTimeField().to_representation(tr.created_at),
            "started_at": serializers.DateTimeField().to_representation(tr.started_at) if tr.started_at else None,
            "finished_at": serializers.DateTimeField().to_representation(tr.finished_at) if tr.finished_at else None,
            "waiting_reason": detail.waiting_reason,
            "skip_reason": tr.skip_reason, "trigger_rule": tr.task.trigger_rule, "condition": tr.task.condition,
            "config": detail.config,
            "output": output_or_summary(tr, url=output_url(context, tr)),
            "upstream": UpstreamSerializer(detail.upstream, many=True, context=context).data,
            "attempts": AttemptSerializer(detail.attempts, many=True, context=context).data,
            "events": RunEventSerializer(detail.events, many=True).data,
            "events_truncated": detail.events_truncated,
            "logs_url": logs_url(context, tr),
        }
