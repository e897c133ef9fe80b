"""Serializers of the REST API v1. Read shapes are explicit field lists; nothing is
writable through a ModelSerializer (writes go through the service functions).

Input serializers (``*InputSerializer``, ``*FilterSerializer``) only parse and check the
request; the rules of the domain stay in the services. List bodies are
``{"results": [...], "next": url | null}`` (api.pagination).
"""

from __future__ import annotations

import json
from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from engine.models import (
    RunLimitPolicy,
    RunState,
    SkipReason,
    TaskRun,
    TaskRunEvent,
    TriggerRule,
    Workflow,
    WorkflowRun,
    WorkflowState,
)
from engine.outputs import output_or_summary
from engine.states import PRIORITY_MAX, PRIORITY_MIN, priority_problem
from flowforge.instants import InstantError, storable_instant
from tenancy.apikeys import NAME_MAX_LENGTH
from tenancy.models import ApiKey, KeyRole, Role

# Deepest nesting of a JSON value the API accepts (run input, a definition document).
# Far beyond any real document, far below Python's recursion limit (the values are
# walked recursively on their way to the database).
MAX_JSON_DEPTH = 64
INT32_MAX = 2**31 - 1


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests objects/arrays deeper than ``limit`` (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def storable_json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as JSON (too deep, NaN/Infinity, not JSON), or None."""
    if json_depth_exceeds(value):
        return f"is nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return "contains NaN or Infinity (or a number too large for a float), which JSON cannot store"
    except TypeError:
        return "is not JSON"
    return None


class InstantField(serializers.DateTimeField):
    """An ISO 8601 instant of a query filter, in UTC; 400 naming the field when its UTC
    offset is beyond ±15:59 (PostgreSQL refuses those: flowforge.instants) or it leaves
    the calendar once in UTC."""

    def enforce_timezone(self, value):
        try:  # before DRF converts it, so the offset as sent is what is checked
            value = storable_instant(value)
        except InstantError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return super().enforce_timezone(value)


# --- workflows ----------------------------------------------------------------------------------


class RejectUnknownFields:
    """A serializer mixin: a body field the serializer does not know is a 400 naming it,
    with the fields it takes (DRF drops unknown fields, so a typo such as ``inputs`` for
    ``input`` started a run with an empty input and a 201)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(str(k) for k in data if k not in self.fields)
            if unknown:
                allowed = ", ".join(self.fields)
                raise serializers.ValidationError({k[:100]: [f"unknown field; this body takes {allowed}"]
                                                   for k in unknown[:20]})
        return super().to_internal_value(data)


class VersionCreatorFields(serializers.Serializer):
    """Who stored a workflow version: a user's email, or the public prefix of the API key
    that stored it, the other null; both null for a version the system stored (a
    management command) or whose user account was deleted. A former member's email and a
    revoked key's prefix still show. Expects ``created_by`` and ``created_by_api_key``
    selected (no query per row)."""

    created_by = serializers.SerializerMethodField(help_text="The email of the user who stored this version in "
                                                   "the UI (null when an API key or the system did, or the user "
                                                   "account was deleted).")
    created_by_api_key = serializers.SerializerMethodField(help_text="The public prefix of the API key that "
                                                           "stored this version, if one did.")

    def get_created_by(self, workflow) -> str | None:
        return workflow.created_by.email if workflow.created_by_id else None

    def get_created_by_api_key(self, workflow) -> str | None:
        return workflow.created_by_api_key.prefix if workflow.created_by_api_key_id else None


class WorkflowListSerializer(VersionCreatorFields, serializers.ModelSerializer):
    """One workflow version in a list (``task_count`` is annotated by the view; expects
    ``created_by`` and ``created_by_api_key`` selected)."""

    task_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Workflow
        fields = ["id", "name", "version", "state", "description", "task_count", "created_at", "created_by",
                  "created_by_api_key"]
        read_only_fields = fields


class PositionSerializer(serializers.Serializer):
    x = serializers.IntegerField()
    y = serializers.IntegerField()


class TaskConcurrencySerializer(serializers.Serializer):
    """A task's ``concurrency`` as its definition wrote it (docs/scheduling.md)."""

    key = serializers.CharField(help_text="The key as written: its `{{ input.<path> }}` placeholders are "
                                "filled from each run's input (a task run's `concurrency_key`).")
    limit = serializers.IntegerField(min_value=1, help_text="Task runs of this task holding the key at once, at most.")


class TaskRateLimitSerializer(serializers.Serializer):
    """A task's ``rate_limit`` as its definition wrote it: ``key`` and exactly one of
    ``per_second`` / ``per_minute`` (claims per fixed window of 1 s or 60 s)."""

    key = serializers.CharField()
    per_second = serializers.IntegerField(required=False, min_value=1, help_text="Present for a 1 s window.")
    per_minute = serializers.IntegerField(required=False, min_value=1, help_text="Present for a 60 s window.")


class WorkflowConcurrencySerializer(serializers.Serializer):
    """A workflow's ``concurrency`` block as the definition document spells it; an unset
    limit is null. Both limits count every version of the workflow's name."""

    max_running_tasks = serializers.IntegerField(allow_null=True, min_value=1,
                                                 help_text="Task runs claimed or running at once, at most.")
    max_running_runs = serializers.IntegerField(allow_null=True, min_value=1,
                                                help_text="Runs going at once, at most.")
    policy = serializers.ChoiceField(choices=RunLimitPolicy.choices,
                                     help_text="What a start over max_running_runs does.")


def task_concurrency(task) -> dict[str, Any] | None:
    """``{"key", "limit"}`` of a Task (the key as written), or None when it has none."""
    if task.concurrency_key is None:
        return None
    return {"key": task.concurrency_key, "limit": task.concurrency_limit}


def task_rate_limit(task) -> dict[str, Any] | None:
    """``{"key", "per_second": N}`` or ``{"key", "per_minute": N}`` of a Task, or None."""
    if task.rate_key is None:
        return None
    window = "per_second" if task.rate_window_seconds == 1 else "per_minute"
    return {"key": task.rate_key, window: task.rate_limit}


def workflow_concurrency(workflow) -> dict[str, Any] | None:
    """A Workflow's ``{"max_running_tasks", "max_running_runs", "policy"}``, or None when
    no limit is set and the policy is the default (what a document without the block
    stores: the block as applied, in the document's field names)."""
    if (workflow.max_running_tasks is None and workflow.max_running_runs is None
            and workflow.run_limit_policy == RunLimitPolicy.QUEUE):
        return None
    return {"max_running_tasks": workflow.max_running_tasks, "max_running_runs": workflow.max_running_runs,
            "policy": workflow.run_limit_policy}


class TaskSerializer(serializers.Serializer):
    """One task of a workflow version: its type and config, its upstream task keys, its
    retry settings (``max_attempts``, ``retry_backoff_seconds``: attempt n waits
    base × 2^(n-1) seconds; ``timeout_seconds`` per attempt), its canvas position and its
    scheduling settings (``priority``, ``concurrency``, ``rate_limit``: null when not set),
    its ``trigger_rule`` and ``condition``, in the definition document's field names."""

    id = serializers.UUIDField()
    key = serializers.CharField()
    type = serializers.CharField()
    config = serializers.JSONField()
    depends_on = serializers.SerializerMethodField()
    max_attempts = serializers.IntegerField()
    retry_backoff_seconds = serializers.FloatField()
    timeout_seconds = serializers.FloatField(allow_null=True)
    position = serializers.SerializerMethodField()
    priority = serializers.IntegerField(help_text="-10 to 10, added to each run's priority (default 0).")
    concurrency = serializers.SerializerMethodField()
    rate_limit = serializers.SerializerMethodField()
    trigger_rule = serializers.ChoiceField(
        choices=TriggerRule.choices,
        help_text="When it runs by its upstream task runs' outcomes (docs/api.md, \"Trigger rules and conditions\"); "
        "all_success by default.")
    condition = serializers.CharField(
        help_text="A CEL expression on `input` and `upstream` evaluated before its handler: false skips it; "
        "'' for none.")

    def get_depends_on(self, task) -> list[str]:
        # Filled by WorkflowDetailSerializer from the prefetched edges (no query per task).
        return sorted(self.context["depends_on"].get(task.pk, []))

    @extend_schema_field(PositionSerializer(allow_null=True))
    def get_position(self, task) -> dict[str, int] | None:
        if task.position_x is None or task.position_y is None:
            return None
        return {"x": task.position_x, "y": task.position_y}

    @extend_schema_field(TaskConcurrencySerializer(allow_null=True))
    def get_concurrency(self, task) -> dict[str, Any] | None:
        return task_concurrency(task)

    @extend_schema_field(TaskRateLimitSerializer(allow_null=True))
    def get_rate_limit(self, task) -> dict[str, Any] | None:
        return task_rate_limit(task)


class EdgeSerializer(serializers.Serializer):
    """An edge of the DAG: ``to`` runs after ``from`` succeeded; ``label`` is its caption.
    Expects ``task`` and ``depends_on`` loaded. (``from`` is a Python keyword, hence the
    field renamed in get_fields.)"""

    from_ = serializers.CharField(help_text="The upstream task's key.")
    to = serializers.CharField(help_text="The downstream task's key.")
    label = serializers.CharField()

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return {"from": fields["from"], "to": fields["to"], "label": fields["label"]}

    def to_representation(self, edge) -> dict[str, str]:
        return {"from": edge.depends_on.key, "to": edge.task.key, "label": edge.label}


class WorkflowDetailSerializer(VersionCreatorFields, serializers.ModelSerializer):
    """One workflow version with its tasks and its labelled edges.

    Expects ``tasks`` and ``dependencies`` (with ``task`` and ``depends_on``) prefetched,
    and ``created_by`` and ``created_by_api_key`` selected.
    """

    concurrency = serializers.SerializerMethodField()
    input_schema = serializers.SerializerMethodField(
        help_text="The JSON Schema (Draft 2020-12) every run input of this version must satisfy, properties in "
        "the order written; null when the version declares none (any JSON object is accepted).")
    tasks = serializers.SerializerMethodField()
    edges = serializers.SerializerMethodField()

    class Meta:
        model = Workflow
        fields = ["id", "name", "version", "state", "description", "created_at", "created_by", "created_by_api_key",
                  "concurrency", "input_schema", "tasks", "edges"]
        read_only_fields = fields

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_input_schema(self, workflow) -> dict[str, Any] | None:
        return json.loads(workflow.input_schema_json) if workflow.input_schema_json else None

    @extend_schema_field(WorkflowConcurrencySerializer(allow_null=True))
    def get_concurrency(self, workflow) -> dict[str, Any] | None:
        return workflow_concurrency(workflow)

    @extend_schema_field(TaskSerializer(many=True))
    def get_tasks(self, workflow) -> list[dict]:
        depends_on: dict = {}
        for edge in workflow.dependencies.all():
            depends_on.setdefault(edge.task_id, []).append(edge.depends_on.key)
        tasks = sorted(workflow.tasks.all(), key=lambda t: t.key)
        return TaskSerializer(tasks, many=True, context={**self.context, "depends_on": depends_on}).data

    @extend_schema_field(EdgeSerializer(many=True))
    def get_edges(self, workflow) -> list[dict[str, str]]:
        edges = sorted(workflow.dependencies.all(), key=lambda e: (e.depends_on.key, e.task.key))
        return [EdgeSerializer(e).data for e in edges]


class WorkflowAppliedSerializer(WorkflowDetailSerializer):
    """The answer of POST /workflows/: the version stored (201), or, for a document identical
    to the name's latest version, that version (200) with ``unchanged`` true."""

    unchanged = serializers.SerializerMethodField(
        help_text="True when the document was identical to the name's latest version (the same normalized "
        "definition and input schema, and that version active): nothing was stored, and this is that version "
        "(status 200). False for a new version (status 201).")

    class Meta(WorkflowDetailSerializer.Meta):
        fields = [*WorkflowDetailSerializer.Meta.fields, "unchanged"]
        read_only_fields = fields

    def get_unchanged(self, workflow) -> bool:
        return bool(self.context.get("unchanged"))


class WorkflowFilterSerializer(serializers.Serializer):
    """Query parameters of GET /workflows/."""

    name = serializers.CharField(required=False, max_length=200)
    state = serializers.ChoiceField(choices=WorkflowState.choices, required=False)


class ArchiveInputSerializer(RejectUnknownFields, serializers.Serializer):
    """Body of POST /workflows/<id>/archive/: the workflow's name, typed out as a confirmation."""

    confirm = serializers.CharField(max_length=200, trim_whitespace=False)


class ArchiveResultSerializer(serializers.Serializer):
    workflow = WorkflowDetailSerializer()
    runs_cancelled = serializers.IntegerField()


class ValidateResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    normalized = serializers.JSONField()


class DefinitionDocumentSerializer(serializers.Serializer):
    """A workflow definition document (schema only: engine.definitions validates it)."""

    name = serializers.CharField()
    description = serializers.CharField(required=False)
    tasks = serializers.ListField(child=serializers.DictField())
    input_schema = serializers.DictField(
        required=False, help_text="A JSON Schema (Draft 2020-12) for the run input: every start (API, web form, "
        "trigger, retry) is validated against it, and its properties' defaults are filled in. References must "
        "stay inside the schema ('#/$defs/...'); at most 64 KiB and 32 levels; patterns run on RE2. See "
        "docs/api.md, \"Run input schemas\".")


# --- runs ---------------------------------------------------------------------------------------


WAITING_REASON_HELP = (
    "Why it is not running yet, or null: for a ready task run, the first limit that holds it back "
    "(`waiting: concurrency stripe 5/5`, `waiting: rate limit github 10/10 per second, next window in 0.4 s`, "
    "`waiting: workflow limit 3/3 running tasks`, `waiting: organization quota 100/100 running`, "
    "`waiting: organization's share of the workers (64 dispatched, not started)`, "
    "`waiting: retry backoff, 3.2 s`) or `waiting: for a worker`; for a run queued by its workflow's "
    "run limit, `waiting: workflow run limit 2/2`. See docs/scheduling.md.")


class _WaitingReasonMixin(serializers.Serializer):
    """``waiting_reason``: the object's ``waiting_reason`` attribute, set by the view from
    ``engine.repositories.waiting`` (null when it was not set: not waiting)."""

    waiting_reason = serializers.SerializerMethodField(help_text=WAITING_REASON_HELP)

    def get_waiting_reason(self, obj) -> str | None:
        return getattr(obj, "waiting_reason", None)


class WorkflowRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    version = serializers.IntegerField()


class _RunFieldsMixin(_WaitingReasonMixin):
    workflow = serializers.SerializerMethodField()
    resumed_at = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="When a person last sent the finished run back to running (a resume, or an action on one of its "
        "task runs: docs/recovery.md; the run's `resumed` events say who and what); null if never.")
    priority = serializers.IntegerField(read_only=True, help_text="-10 to 10, set at start (a retry keeps the "
                                        "original's); each task run's is this plus its task's.")
    triggered_by = serializers.SerializerMethodField()
    started_by_api_key = serializers.SerializerMethodField(
        help_text="The public prefix of the API key that started the run (`ffk_<prefix>_…`); null for a run a "
        "person, a trigger or the system started.")
    scheduled_for = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="The cron instant the run is for (a trigger's or a backfill's run, and their retries); null for "
        "other runs. Not part of `input`.")
    data_interval_start = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="The data interval the run covers: from the schedule's previous instant (included) ...")
    data_interval_end = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="... to `scheduled_for` (excluded). Null for other runs.")

    @extend_schema_field(WorkflowRefSerializer)
    def get_workflow(self, run) -> dict[str, Any]:
        wf = run.workflow
        return {"id": str(wf.pk), "name": wf.name, "version": wf.version}

    def get_triggered_by(self, run) -> str | None:
        return run.triggered_by.email if run.triggered_by_id else None

    def get_started_by_api_key(self, run) -> str | None:
        # A key row is never deleted apart from its organization (revoked keys stay).
        return run.api_key.prefix if run.api_key_id and run.api_key else None


RUN_FIELDS = ["id", "workflow", "state", "priority", "trigger_source", "trigger", "scheduled_for",
              "data_interval_start", "data_interval_end", "triggered_by", "started_by_api_key", "retry_of", "error",
              "created_at",
              "started_at", "finished_at", "resumed_at", "waiting_reason"]


class RunListSerializer(_RunFieldsMixin, serializers.ModelSerializer):
    """A run in a list (no input, no task runs). Expects ``workflow``, ``triggered_by`` and ``api_key`` selected."""

    class Meta:
        model = WorkflowRun
        fields = RUN_FIELDS
        read_only_fields = fields


SKIP_REASON_HELP = (
    "Why a skipped task run was skipped: upstream_failed (a failure upstream; its dependents' trigger rules "
    "count it as a failure), trigger_rule (its rule could not be met otherwise), condition_false (its condition "
    "was false), marked (a person skipped it; its marked_skipped event says who and why); '' when it was not "
    "skipped.")


class TaskRunSerializer(_WaitingReasonMixin, serializers.ModelSerializer):
    """A task run of a run's detail. Expects the task runs from
    ``engine.outputs.with_output_sizes``: an output over FLOWFORGE_INLINE_OUTPUT_BYTES is
    then a summary ``{"truncated": true, "bytes": <size of its JSON text>, "url": <GET
    for the whole output>}`` instead of the output, and the output is never loaded.
    ``context["request"]``, when given, makes the URL absolute."""

    key = serializers.CharField(source="task.key", read_only=True)
    task_id = serializers.UUIDField(read_only=True)
    priority = serializers.IntegerField(read_only=True, help_text="Its run's priority plus its task's.")
    concurrency_key = serializers.CharField(
        read_only=True, allow_null=True,
        help_text="Its task's concurrency key rendered with the run's input (it holds the key's permit while "
        "running); null when its task has none.")
    output = serializers.SerializerMethodField(
        help_text="The output; or, over FLOWFORGE_INLINE_OUTPUT_BYTES, a summary with the URL of the whole output.")
    queue = serializers.CharField(
        read_only=True, help_text="The queue of the organization's own workers it waits on (a `worker` task, "
        "docs/workers.md); '' for a task of the shared workers.")
    queue_live_workers = serializers.SerializerMethodField(
        help_text="For a ready task run of a worker queue: the live workers of its queue (polled within "
        "FLOWFORGE_WORKER_LIVE_SECONDS, or holding a task of it); 0 means none will take it until a worker "
        "with a worker key polls the queue. Null otherwise.")
    skip_reason = serializers.ChoiceField(choices=SkipReason.choices, read_only=True, help_text=SKIP_REASON_HELP)

    class Meta:
        model = TaskRun
        fields = ["id", "key", "task_id", "state", "attempt", "priority", "concurrency_key", "output", "error",
                  "created_at", "started_at", "finished_at", "waiting_reason", "queue", "queue_live_workers",
                  "skip_reason"]
        read_only_fields = fields

    def get_queue_live_workers(self, task_run) -> int | None:
        # Set by the view (engine.worker_queues.attach_live_workers); absent: not computed.
        return getattr(task_run, "queue_live_workers", None)

    @extend_schema_field(OpenApiTypes.ANY)
    def get_output(self, task_run) -> Any:
        if not hasattr(task_run, "output_bytes"):  # a task run read without with_output_sizes
            return task_run.output
        path = reverse("api:run-task-output", kwargs={"run_id": task_run.workflow_run_id, "pk": task_run.pk})
        request = self.context.get("request")
        return output_or_summary(task_run, url=request.build_absolute_uri(path) if request is not None else path)


class RunSerializer(_RunFieldsMixin, serializers.ModelSerializer):
    """A run with its input and task runs. Expects ``workflow``/``triggered_by`` selected
    and ``task_runs__task`` prefetched. ``retry_of`` is the run this one retries,
    ``trigger`` the cron trigger that started it (ids, or null)."""

    task_runs = TaskRunSerializer(many=True, read_only=True)

    class Meta:
        model = WorkflowRun
        fields = RUN_FIELDS[:3] + ["input"] + RUN_FIELDS[3:] + ["task_runs"]
        read_only_fields = fields


class StrictPriorityField(serializers.IntegerField):
    """A priority: a JSON integer from PRIORITY_MIN to PRIORITY_MAX (not a string, a boolean
    or a float), refused in ``engine.states.priority_problem``'s words whatever is wrong
    with it (the UI's and a definition's: "must be a whole number from -10 to 10, got 11").
    The bounds stay on the field for the OpenAPI schema."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=PRIORITY_MIN, max_value=PRIORITY_MAX, **kwargs)

    def to_internal_value(self, data: Any) -> int:
        problem = priority_problem(data)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return super().to_internal_value(data)


class RunStartInputSerializer(RejectUnknownFields, serializers.Serializer):
    """Body of POST /runs/: which workflow (a name, or a version's id), optionally which
    version of a name (default: the latest active one), and the run's input object. Any
    other field is a 400 naming it (``RejectUnknownFields``)."""

    workflow = serializers.CharField(max_length=200)
    version = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=INT32_MAX)
    input = serializers.JSONField(required=False, default=dict)
    priority = StrictPriorityField(required=False, default=0,
                                   help_text="-10 to 10, default 0: higher is claimed first within the "
                                   "organization's share; each task run's is this plus its task's.")

    def validate_input(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        problem = storable_json_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class RunFilterSerializer(serializers.Serializer):
    """Query parameters of GET /runs/ (times in ISO 8601; both bounds exclusive)."""

    workflow = serializers.CharField(required=False, max_length=200)
    state = serializers.ChoiceField(choices=RunState.choices, required=False)
    created_after = InstantField(required=False)
    created_before = InstantField(required=False)

    def validate(self, attrs: dict) -> dict:
        after, before = attrs.get("created_after"), attrs.get("created_before")
        if after is not None and before is not None and after >= before:
            raise serializers.ValidationError({"created_before": ["must be later than created_after"]})
        return attrs


class RunEventSerializer(serializers.ModelSerializer):
    """One event of a run's history. ``seq`` is gap-free per run and is the order;
    ``task_run``/``task_key`` are null for run-level events (run_started, run_finished)."""

    task_run = serializers.UUIDField(source="task_run_id", read_only=True, allow_null=True)
    task_key = serializers.SerializerMethodField()

    class Meta:
        model = TaskRunEvent
        fields = ["seq", "kind", "task_run", "task_key", "from_state", "to_state", "attempt", "fencing_token",
                  "detail", "created_at"]
        read_only_fields = fields

    def get_task_key(self, event) -> str | None:
        return event.task_run.task.key if event.task_run_id else None


# --- pages and problems (for the OpenAPI document) ----------------------------------------------


def page_of(item: type[serializers.Serializer], name: str) -> type[serializers.Serializer]:
    """A serializer class describing ``{"results": [item], "next": url | null}``."""
    return type(name, (serializers.Serializer,), {
        "results": item(many=True),
        "next": serializers.URLField(allow_null=True, help_text="The next page's full URL; null on the last page."),
        "__doc__": f"A page of {item.__name__.removesuffix('Serializer')} (keyset-paginated).",
    })


WorkflowPageSerializer = page_of(WorkflowListSerializer, "WorkflowPageSerializer")
RunPageSerializer = page_of(RunListSerializer, "RunPageSerializer")
RunEventPageSerializer = page_of(RunEventSerializer, "RunEventPageSerializer")


class DefinitionErrorSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Where the problem is: tasks[extract].config, name, ...")
    message = serializers.CharField()


class DefinitionProblemSerializer(serializers.Serializer):
    """The 400 of an invalid workflow definition: a problem document whose ``errors`` lists
    every problem found, each with the path of the task (and field) it concerns."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="`invalid_definition` (or `parse_error` for a body that is not JSON)")
    errors = DefinitionErrorSerializer(many=True, required=False,
                                       help_text="Every problem of the definition; absent when the body was not JSON.")


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
    role = serializers.ChoiceField(choices=KeyRole.choices, default=Role.MEMBER)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
