"""The engine's tables: definitions and executions (seed 000, "Data Model").

Definitions (Workflow, Task, TaskDependency) are the template; executions
(WorkflowRun, TaskRun, TaskRunEvent, OutboxMessage) are one instantiation of it.
Constraint and index names are the seed's, written out. State and event-kind columns
are varchar + CHECK, never native enums (seed 000, "Why varchar + CHECK"); their
values are the enums of ``engine.states``.

No state change is written by ``save()``: every transition is one conditional
UPDATE in ``engine/repositories/`` (statements in ``engine/sql/``).
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import F, Func, Q
from django.db.models.functions import Coalesce, Length, Now
from django.db.models.lookups import Exact, LessThanOrEqual

# The vocabulary lives in engine.states; these names are re-exported for the imports
# that name engine.models.
from engine.states import (  # noqa: F401
    PRIORITY_MAX,
    PRIORITY_MIN,
    RUN_TERMINAL_STATES,
    TASK_TERMINAL_STATES,
    BackfillState,
    DeliveryChannel,
    DeliveryState,
    EventKind,
    NotificationType,
    RunState,
    SkipReason,
    TaskRunState,
    TriggerRule,
)
from tenancy.models import Organization
from tenancy.scoping import OrganizationScopedManager


class WorkflowState(models.TextChoices):
    """Definition lifecycle (seed 003): draft -> active -> archived (-> active on restore)."""

    DRAFT = "draft"
    ACTIVE = "active"
    ARCHIVED = "archived"


class RunLimitPolicy(models.TextChoices):
    """What a start does when its workflow already has ``max_running_runs`` runs going
    (issue 16; after Hatchet's and Temporal's overlap policies)."""

    #: The new run waits (state pending, nothing ready) until one finishes, oldest first.
    QUEUE = "queue"
    #: The new run is recorded and cancelled at once.
    CANCEL_NEWEST = "cancel_newest"
    #: The oldest running run is cancelled to make room for the new one.
    CANCEL_OLDEST = "cancel_oldest"




class TriggerSource(models.TextChoices):
    """Through which channel a run was started."""

    # Acronyms get explicit labels: the default (the name title-cased) reads "Cli", "Api".
    CLI = "cli", "CLI"
    API = "api", "API"
    WEB = "web"
    CRON = "cron"
    RETRY = "retry"
    #: Started by a backfill of a cron trigger (engine.backfill) for a past instant.
    BACKFILL = "backfill"


def _in(field: str, values) -> Q:
    return Q(**{f"{field}__in": list(values)})


#: Characters of a task's condition: engine.conditions.MAX_CONDITION_CHARS (this module
#: does not import the CEL library; tests/unit/test_trigger_rules.py checks they agree).
TASK_CONDITION_MAX_CHARS = 2000


class Workflow(models.Model):
    """One version of a workflow definition. Unique on (organization, name, version)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    version = models.IntegerField(default=1)
    description = models.TextField(blank=True, default="")
    state = models.CharField(max_length=20, choices=WorkflowState.choices, default=WorkflowState.ACTIVE)
    # The document this version was created from, normalized; kept for diffs and export.
    definition = models.JSONField(default=dict)
    # The definition's input_schema (issue 19, engine.input_schema) as JSON text, or NULL
    # without one: text, not jsonb, because jsonb reorders an object's keys and the start
    # form shows the properties in the order the schema lists them. Every start validates
    # its input against it.
    input_schema_json = models.TextField(null=True, blank=True)
    # Bound on a whole run, in seconds; the stuck-run sweep fails a run that exceeds it.
    run_timeout_seconds = models.FloatField(null=True, blank=True)
    # Concurrency limits (definition's "concurrency"), counted across every version of the
    # name: task runs claimed or running at once, and runs going at once (with the policy
    # for a start over that limit).
    max_running_tasks = models.IntegerField(null=True, blank=True)
    max_running_runs = models.IntegerField(null=True, blank=True)
    run_limit_policy = models.CharField(max_length=20, choices=RunLimitPolicy.choices,
                                        db_default=RunLimitPolicy.QUEUE)
    created_by = models.ForeignKey(
        "tenancy.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The API key that stored this version (created_by is then NULL): the version page says
    # which key, as the audit log does, instead of no one.
    created_by_api_key = models.ForeignKey(
        "tenancy.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_workflow"
        constraints = [
            # Seed 000 names (name, version); its tenancy table scopes it by organization.
            models.UniqueConstraint(fields=["organization", "name", "version"], name="uniq_workflow_name_version"),
            models.CheckConstraint(condition=Q(version__gte=1), name="workflow_version_positive"),
            models.CheckConstraint(condition=_in("state", WorkflowState.values), name="workflow_state_valid"),
            models.CheckConstraint(
                condition=Q(run_timeout_seconds__isnull=True) | Q(run_timeout_seconds__gt=0),
                name="workflow_run_timeout_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_running_tasks__isnull=True) | Q(max_running_tasks__gte=1),
                name="workflow_max_running_tasks_positive",
            ),
            models.CheckConstraint(
                condition=Q(max_running_runs__isnull=True) | Q(max_running_runs__gte=1),
                name="workflow_max_running_runs_positive",
            ),
            models.CheckConstraint(condition=_in("run_limit_policy", RunLimitPolicy.values),
                                   name="workflow_run_limit_policy_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class Task(models.Model):
    """One step of a workflow version. Unique on (workflow, key)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="tasks")
    key = models.CharField(max_length=100)
    type = models.CharField(max_length=50)
    config = models.JSONField(default=dict, blank=True)
    max_attempts = models.IntegerField(default=1)
    # Base of the exponential retry backoff: attempt n waits base * 2**(n-1) seconds.
    retry_backoff_seconds = models.FloatField(default=1.0)
    # Bound on one attempt, start to close; NULL means no bound beyond the lease.
    timeout_seconds = models.FloatField(null=True, blank=True)
    # Optional canvas position for drawing the DAG (seed 003).
    position_x = models.IntegerField(null=True, blank=True)
    position_y = models.IntegerField(null=True, blank=True)
    # Added to its run's priority (PRIORITY_MIN..PRIORITY_MAX).
    priority = models.SmallIntegerField(db_default=0)
    # A named concurrency key of the organization (may hold "{{ input.path }}" placeholders,
    # rendered per run) and the most task runs holding it at once.
    concurrency_key = models.CharField(max_length=200, null=True, blank=True)
    concurrency_limit = models.IntegerField(null=True, blank=True)
    # A named rate-limit bucket of the organization: at most rate_limit claims per
    # fixed window of rate_window_seconds (1 or 60), ceil(rate_limit / 2) in its first half.
    rate_key = models.CharField(max_length=200, null=True, blank=True)
    rate_limit = models.IntegerField(null=True, blank=True)
    rate_window_seconds = models.IntegerField(null=True, blank=True)
    # The queue of the organization's own workers a ``worker`` task waits on; '' for every
    # other type (the shared workers' tasks). Copied onto each task run at start.
    queue = models.CharField(max_length=64, blank=True, db_default="")
    # When it runs, by its upstream task runs' outcomes (TriggerRule; the promotion and
    # skip statements of engine/sql/task_runs.sql read it).
    trigger_rule = models.CharField(max_length=20, choices=TriggerRule.choices, db_default=TriggerRule.ALL_SUCCESS)
    # A CEL expression on the run input and upstream outputs (engine.conditions), evaluated
    # by the worker before the handler: false skips the task run. '' for none.
    condition = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_task"
        indexes = [
            # Whether a queue is known to an organization (a worker's poll of a queue no task
            # names is refused: worker_queue_known); partial: the shared workers' tasks stay out.
            models.Index(fields=["organization", "queue"], name="idx_task_org_queue", condition=~Q(queue="")),
        ]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "key"], name="uniq_task_workflow_key"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="task_max_attempts_positive"),
            models.CheckConstraint(
                condition=Q(retry_backoff_seconds__gte=0), name="task_retry_backoff_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(timeout_seconds__isnull=True) | Q(timeout_seconds__gt=0),
                name="task_timeout_positive",
            ),
            models.CheckConstraint(condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                                   name="task_priority_range"),
            models.CheckConstraint(
                condition=Q(concurrency_key__isnull=True, concurrency_limit__isnull=True)
                | Q(concurrency_key__isnull=False, concurrency_limit__isnull=False, concurrency_limit__gte=1),
                name="task_concurrency_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(rate_key__isnull=True, rate_limit__isnull=True, rate_window_seconds__isnull=True)
                | Q(rate_key__isnull=False, rate_limit__isnull=False, rate_limit__gte=1,
                    rate_window_seconds__isnull=False, rate_window_seconds__in=[1, 60]),
                name="task_rate_limit_valid",
            ),
            models.CheckConstraint(condition=_in("trigger_rule", TriggerRule.values), name="task_trigger_rule_valid"),
            models.CheckConstraint(condition=LessThanOrEqual(Length("condition"), TASK_CONDITION_MAX_CHARS),
                                   name="task_condition_length"),
        ]

    def __str__(self) -> str:
        return self.key


class TaskDependency(models.Model):
    """An edge of the DAG: ``task`` runs after ``depends_on`` succeeded. Both in ``workflow``.

    ``label`` is the edge's caption when drawn (seed 003). The advance step reads
    edges by ``depends_on`` (the dependents of a finished task) and by ``task``
    (a dependent's remaining prerequisites); the foreign-key indexes serve both.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="dependencies")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="upstream_edges")
    depends_on = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="downstream_edges")
    label = models.CharField(max_length=100, blank=True, default="")

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_taskdependency"
        constraints = [
            models.UniqueConstraint(fields=["task", "depends_on"], name="uniq_taskdep_edge"),
            models.CheckConstraint(condition=~Q(task=F("depends_on")), name="taskdep_no_self_edge"),
        ]

    def __str__(self) -> str:
        return f"{self.depends_on_id} -> {self.task_id}"


class WorkflowRun(models.Model):
    """One execution of one workflow version."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="runs")
    state = models.CharField(max_length=20, choices=RunState.choices, default=RunState.PENDING)
    input = models.JSONField(default=dict, blank=True)
    trigger_source = models.CharField(max_length=20, choices=TriggerSource.choices, default=TriggerSource.CLI)
    triggered_by = models.ForeignKey(
        "tenancy.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The API key that started the run (NULL for a person, a trigger or the system): the
    # runs list and the run page name it (issue 20). Neither index nor constraint: no query
    # selects runs by key, and a key row is deleted only with its organization (revoked
    # keys stay), whose runs go with it; with a constraint, that deletion would have Django
    # look for the key's runs (an update of this large table by a column no index holds).
    # A label whose key row is gone joins to nothing (select_related reads None).
    api_key = models.ForeignKey(
        "tenancy.ApiKey", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+", db_index=False,
        db_constraint=False,
    )
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    # The cron trigger that started this run, if one did.
    trigger = models.ForeignKey(
        "engine.ScheduledTrigger", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    # The cron instant this run is for and the data interval it covers, in UTC
    # (engine.states.RunSchedule: [previous instant, scheduled_for)); NULL for a run no
    # trigger or backfill started. A retry keeps its original's. No CHECK ties the three
    # together: adding one would scan this (hot, large) table under an exclusive lock;
    # run_insert is their only writer.
    scheduled_for = models.DateTimeField(null=True, blank=True)
    data_interval_start = models.DateTimeField(null=True, blank=True)
    data_interval_end = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # PRIORITY_MIN..PRIORITY_MAX, set at start; each task run's is this plus its task's.
    priority = models.SmallIntegerField(db_default=0)
    # Last per-run event sequence number handed out; the row lock on this run is
    # what makes TaskRunEvent.seq gap-free and commit-ordered (seed 001).
    last_event_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When a person last sent the finished run back to running (engine.recovery: a resume or
    # a task action); NULL if never. Its workflow's run timeout counts from then.
    resumed_at = models.DateTimeField(null=True, blank=True)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_workflowrun"
        constraints = [
            models.CheckConstraint(condition=_in("state", RunState.values), name="wfrun_state_valid"),
            # A biconditional: terminal state <=> finished_at set (seed 000).
            models.CheckConstraint(
                condition=(
                    Q(state__in=RUN_TERMINAL_STATES, finished_at__isnull=False)
                    | (~Q(state__in=RUN_TERMINAL_STATES) & Q(finished_at__isnull=True))
                ),
                name="wfrun_finished_at_matches_state",
            ),
            models.CheckConstraint(condition=Q(last_event_seq__gte=0), name="wfrun_event_seq_non_negative"),
            models.CheckConstraint(condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                                   name="wfrun_priority_range"),
        ]
        indexes = [
            # "the last N runs of this workflow" (seed 000): GET /api/v1/runs/?workflow=<id>.
            models.Index(F("workflow"), F("created_at").desc(), name="idx_wfrun_wf_recent"),
            # GET /api/v1/runs/ unfiltered: WHERE organization_id = $1 AND created_at <= $t
            # AND (created_at < $t OR id < $id) ORDER BY created_at DESC, id DESC LIMIT n+1 —
            # the keyset page (api.pagination). Equality on the tenant first, then the sort
            # key in the sort's own direction, so every page is one index range scan with
            # no sort, page 500 costing what page 1 costs (bench/bench_api_pagination.py).
            # idx_wfrun_wf_recent cannot serve it (it leads with workflow), nor can
            # idx_wfrun_state_age (leads with state, ascending).
            models.Index(F("organization"), F("created_at").desc(), F("id").desc(), name="idx_wfrun_org_recent"),
            # stuck-run sweep: state = 'running' AND created_at < now() - interval (seed 000).
            models.Index(fields=["state", "created_at"], name="idx_wfrun_state_age"),
            # Run limits (issue 16): a workflow's runs still going, oldest first (count, admit,
            # cancel the oldest), without reading its finished history.
            models.Index(fields=["workflow", "created_at"], name="idx_wfrun_open_by_workflow",
                         condition=Q(state__in=["pending", "running"])),
            # The home page (issue 20, frontend.presenters.home): the organization's open runs,
            # its recently finished ones and its recently failed ones, newest first (migration 0030).
            models.Index(F("organization"), F("created_at").desc(), name="idx_wfrun_org_open",
                         condition=Q(state__in=["pending", "running"])),
            models.Index(F("organization"), F("finished_at").desc(), name="idx_wfrun_org_finished",
                         condition=Q(finished_at__isnull=False)),
            models.Index(F("organization"), F("finished_at").desc(), name="idx_wfrun_org_failed",
                         condition=Q(state="failed")),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in RUN_TERMINAL_STATES


class TaskRun(models.Model):
    """One task of one run. Retries reuse the row: ``attempt`` counts them and each
    claim bumps ``fencing_token`` (a new generation)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index: every query of task runs names their run (idx_taskrun_run_state); an index on
    # the tenant alone served none and cost each transition an index entry (migration 0013).
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    # No index of its own: idx_taskrun_run_state and uniq_taskrun_per_run_task lead with it
    # (seed 000, "Implicit indexes and a known redundancy"; migration 0011).
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="task_runs", db_index=False)
    # No index of its own: idx_taskrun_task_run leads with it, and serves WHERE task_id = ?
    # as the foreign key's own index did (seed 000, "TaskRun.task_id is not redundant").
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="task_runs", db_index=False)
    state = models.CharField(max_length=20, choices=TaskRunState.choices, default=TaskRunState.PENDING)
    attempt = models.IntegerField(default=1)
    # Attempts used before a person last reopened the task run (engine.recovery: resume,
    # retry): ``attempt`` counts on across a reset, and the task's max_attempts and retry
    # backoff apply to ``attempt - attempt_base`` (0 until a reset).
    attempt_base = models.IntegerField(db_default=0)
    fencing_token = models.BigIntegerField(default=0)
    # The generation (fencing token) whose handler has started; at most one start per generation.
    started_fencing_token = models.BigIntegerField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Retry backoff: a ready row is not claimed before this time.
    not_before = models.DateTimeField(null=True, blank=True)
    # Run priority + task priority: higher is claimed first within the organization.
    priority = models.SmallIntegerField(db_default=0)
    # The task's concurrency key, rendered with the run's input: while running, this task
    # run holds one of the key's permits (leased with it: released by every transition out
    # of running, the reaper's included).
    concurrency_key = models.CharField(max_length=400, null=True, blank=True)
    # When it last became ready (start, promotion, retry backoff's end, requeue): claim wait.
    ready_at = models.DateTimeField(null=True, blank=True)
    # Why it is not claimed yet, as the scheduler last saw it ('' when it was not held back).
    wait_reason = models.CharField(max_length=200, blank=True, db_default="")
    # Its task's queue (denormalized, written once at insert, never updated, like seed 001's
    # taskType on TaskQueues): '' for the shared workers, else the queue of the organization's
    # own workers that claim it over the API. Leads idx_taskrun_ready_claim.
    queue = models.CharField(max_length=64, blank=True, db_default="")
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # Why a skipped task run was skipped (SkipReason; '' otherwise): its rule could not be
    # met because of a failure upstream (which its own dependents' rules count as a
    # failure), or for another reason, or its condition was false. Read only while skipped.
    skip_reason = models.CharField(max_length=20, blank=True, choices=SkipReason.choices, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_taskrun"
        constraints = [
            models.UniqueConstraint(fields=["workflow_run", "task"], name="uniq_taskrun_per_run_task"),
            models.CheckConstraint(condition=_in("state", TaskRunState.values), name="taskrun_state_valid"),
            models.CheckConstraint(condition=Q(attempt__gte=1), name="taskrun_attempt_positive"),
            # Every reset leaves the task run an attempt of its own to make (engine.recovery);
            # an attempt below 1 is taskrun_attempt_positive's to report.
            models.CheckConstraint(condition=Q(attempt_base__gte=0) & (Q(attempt__lt=1) | Q(attempt_base__lt=F("attempt"))),
                                   name="taskrun_attempt_base_valid"),
            models.CheckConstraint(condition=Q(fencing_token__gte=0), name="taskrun_fencing_non_negative"),
            models.CheckConstraint(
                condition=(
                    Q(finished_at__isnull=True)
                    | Q(started_at__isnull=True)
                    | Q(finished_at__gte=F("started_at"))
                ),
                name="taskrun_finished_after_started",
            ),
            # state = 'running' <=> lease_expires_at IS NOT NULL (seed 000): the reaper sees every running row.
            models.CheckConstraint(
                condition=(
                    Q(state="running", lease_expires_at__isnull=False)
                    | (~Q(state="running") & Q(lease_expires_at__isnull=True))
                ),
                name="taskrun_lease_iff_running",
            ),
            models.CheckConstraint(condition=_in("skip_reason", SkipReason.values), name="taskrun_skip_reason_valid"),
        ]
        indexes = [
            # The scheduler's "oldest ready task first" claim (seed 000).
            models.Index(fields=["state", "created_at"], name="idx_taskrun_state_age"),
            # Run progress and terminal-state derivation: GROUP BY state for one run (seed 000).
            models.Index(fields=["workflow_run", "state"], name="idx_taskrun_run_state"),
            # A task's task runs (WHERE task_id = ?: the foreign key's index, seed 000), with
            # the run beside it: a hop's probe by (run, task) reads one entry through this index
            # or uniq_taskrun_per_run_task alike. With task_id alone, a generic plan made under
            # statistics that price both at one row took it and read an entry for every run of
            # the task (migration 0036).
            models.Index(fields=["task", "workflow_run"], name="idx_taskrun_task_run"),
            # The lease reaper: WHERE state = 'running' AND lease_expires_at < now() (seed 000).
            models.Index(fields=["lease_expires_at"], name="idx_taskrun_lease_expiry", condition=Q(state="running")),
            # The fair claim: per queue ('' for the shared workers) and organization, highest
            # priority then oldest ready first (seed 001's dequeue index: partial, so claimed
            # rows leave it). The queue leads, so the shared claim never scans past a worker
            # queue's backlog, and an organization's worker poll reads its queue alone.
            models.Index(F("queue"), F("organization"), F("priority").desc(), F("created_at"),
                         name="idx_taskrun_ready_claim", condition=Q(state="ready")),
            # Permits and quotas: running (claimed or started) task runs per organization
            # and per concurrency key; the holders are the task runs themselves.
            models.Index(fields=["organization", "concurrency_key"], name="idx_taskrun_running_org",
                         condition=Q(state="running")),
        ]

    def __str__(self) -> str:
        return f"task run {self.id} ({self.state}, attempt {self.attempt}, token {self.fencing_token})"


class TaskRunEvent(models.Model):
    """Append-only history of a run: every transition, start, heartbeat loss and
    rejected stale write. ``seq`` is gap-free per run and allocated in the
    database (seed 001), so the order never depends on a clock. ``task_run`` is
    NULL for run-level events (run started, finished, cancelled)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Copied in SQL from the task run or run the row is written for (engine/sql/), so
    # neither a database constraint nor an index: the constraint's check locked the
    # organization's row for every row written, from every worker at once, and no query
    # reads these rows by tenant alone (migration 0013); they go with their run.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    # Neither has an index of its own: uniq_event_run_seq leads with workflow_run and
    # idx_event_taskrun_created with task_run (migration 0011). No database constraint
    # either (migration 0033): the table is partitioned, its rows are written only by the
    # engine's statements from the rows they belong to, and the rows of a period about to
    # be dropped outlive their run until the drop (engine.partitions).
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="events", db_index=False,
                                     db_constraint=False)
    task_run = models.ForeignKey(TaskRun, null=True, blank=True, on_delete=models.CASCADE, related_name="events",
                                 db_index=False, db_constraint=False)
    # The run's created_at, copied by every statement that writes an event: the partition
    # key (range, FLOWFORGE_HISTORY_PARTITION_SECONDS per partition; migration 0033), so all
    # of a run's history is in one partition.
    run_created_at = models.DateTimeField()
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=40, choices=EventKind.choices)
    from_state = models.CharField(max_length=20, blank=True, default="")
    to_state = models.CharField(max_length=20, blank=True, default="")
    attempt = models.IntegerField(null=True, blank=True)
    fencing_token = models.BigIntegerField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_taskrunevent"
        constraints = [
            # A run's event log in order, and the ?after= cursor (seed 001's (workflowId, seq)).
            # The partition key is part of it, as a unique index on a partitioned table must
            # be (seed 001's trap); run_created_at is one value per run, so (run, seq) is
            # still unique (tests/unit/test_partitions.py).
            models.UniqueConstraint(fields=["workflow_run", "seq", "run_created_at"], name="uniq_event_run_seq"),
            # Every kind the engine writes (engine.states.EventKind), and nothing else: a
            # typo in a statement fails its transaction instead of writing an event no
            # reader knows (migration 0014).
            models.CheckConstraint(condition=_in("kind", EventKind.values), name="taskrunevent_kind_valid"),
        ]
        indexes = [
            # A task run's event log: WHERE task_run_id = ? ORDER BY created_at (seed 000).
            models.Index(fields=["task_run", "created_at"], name="idx_event_taskrun_created"),
        ]

    def __str__(self) -> str:
        return f"event {self.seq} {self.kind} of run {self.workflow_run_id}"


class RateLimitBucket(models.Model):
    """One named rate-limit bucket of an organization, per window size (seed 001's
    RateLimitBuckets): ``count`` claims in its window [window_start, window_start +
    window_seconds). A window opens at the first claim after the previous one closed
    (fixed, not sliding); its first half admits ceil(limit / 2) of a task's limit, the
    whole window the limit (task_run_claim_fair). One upsert per bucket per claim
    statement; idle buckets are pruned by housekeeping."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=200)
    window_seconds = models.IntegerField()
    window_start = models.DateTimeField()
    count = models.IntegerField(db_default=0)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_ratelimitbucket"
        constraints = [
            models.UniqueConstraint(fields=["organization", "key", "window_seconds"], name="uniq_ratelimit_bucket"),
            models.CheckConstraint(condition=Q(count__gte=0), name="ratelimit_count_non_negative"),
        ]
        indexes = [models.Index(fields=["window_start"], name="idx_ratelimit_window_start")]

    def __str__(self) -> str:
        return f"{self.key} @ {self.window_start} ({self.count})"


class OutboxMessage(models.Model):
    """One dispatch of one task-run generation, written in the claim's transaction
    and published by the relay (seed 000). ``published_at`` is stamped only after
    the broker accepted the message."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Copied in SQL from the task run or run the row is written for (engine/sql/), so
    # neither a database constraint nor an index: the constraint's check locked the
    # organization's row for every row written, from every worker at once, and no query
    # reads these rows by tenant alone (migration 0013); they go with their run.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    # No index of its own: uniq_outbox_per_taskrun_generation leads with it (migration 0011).
    task_run = models.ForeignKey(TaskRun, on_delete=models.CASCADE, related_name="outbox_messages", db_index=False)
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="outbox_messages")
    exchange = models.CharField(max_length=100, default="")
    routing_key = models.CharField(max_length=200)
    payload = models.JSONField()
    fencing_token_snapshot = models.BigIntegerField()
    attempt_snapshot = models.IntegerField()
    # Delivery bookkeeping (seed 001's outbox): publish attempts, next try, last error.
    publish_attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    dead_lettered_at = models.DateTimeField(null=True, blank=True)
    # When `manage.py outbox_replay` last re-dispatched this dead letter's task run.
    replayed_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_outboxmessage"
        constraints = [
            # Exactly one dispatch per live generation: the constraint, not a lock, picks a race's winner.
            models.UniqueConstraint(
                fields=["task_run", "fencing_token_snapshot"], name="uniq_outbox_per_taskrun_generation"
            ),
            models.CheckConstraint(condition=Q(publish_attempts__gte=0), name="outbox_attempts_non_negative"),
        ]
        indexes = [
            # The relay drain: WHERE published_at IS NULL ORDER BY created_at ... SKIP LOCKED (seed 000).
            models.Index(fields=["created_at"], name="idx_outbox_pending", condition=Q(published_at__isnull=True)),
            # Dead letters, kept for staff and replay, and the reaper's scan for their task runs (seed 001).
            models.Index(fields=["dead_lettered_at"], name="idx_outbox_dead_letter",
                         condition=Q(dead_lettered_at__isnull=False)),
            # Housekeeping's removal of published rows (outbox_purge_published: created_at <
            # cutoff). BRIN: rows arrive in created_at order, and its upkeep on the hot
            # path's insert is next to nothing (a B-tree would add an index insert per task).
            BrinIndex(fields=["created_at"], name="idx_outbox_created_brin"),
        ]

    def __str__(self) -> str:
        return f"outbox {self.id} (task run {self.task_run_id}, token {self.fencing_token_snapshot})"


class CatchUpPolicy(models.TextChoices):
    """What a cron trigger does with instants missed while nothing was ticking."""

    SKIP = "skip"  # fire none of the missed instants
    LATEST = "latest"  # fire the most recent missed instant once
    ALL = "all"  # fire each missed instant (bounded)


class ScheduledTrigger(models.Model):
    """A cron trigger: starts a run of the latest active version of ``workflow_name``."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    workflow_name = models.CharField(max_length=200)
    cron_expression = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    input = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=10, choices=CatchUpPolicy.choices, default=CatchUpPolicy.LATEST)
    # The priority of the runs it starts (PRIORITY_MIN..PRIORITY_MAX).
    priority = models.SmallIntegerField(db_default=0)
    # The next instant to fire, in UTC; the tick's query reads enabled rows due now.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    # The last time the clock found instants it did not fire (catch-up past MAX_CATCH_UP,
    # or by its policy): engine.cron.missed_note's object, shown on the trigger; NULL
    # when it never happened.
    missed_instants = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey(
        "tenancy.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_scheduledtrigger"
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="uniq_trigger_org_name"),
            models.CheckConstraint(condition=_in("catch_up", CatchUpPolicy.values), name="trigger_catch_up_valid"),
            models.CheckConstraint(condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                                   name="trigger_priority_range"),
        ]
        indexes = [
            # The cron tick: WHERE enabled AND next_fire_at <= now() ORDER BY next_fire_at.
            models.Index(fields=["next_fire_at"], name="idx_trigger_due", condition=Q(enabled=True)),
        ]

    def __str__(self) -> str:
        return f"trigger {self.name} ({self.cron_expression} {self.timezone})"


class IdempotencyKey(models.Model):
    """A client-chosen key that makes a repeated start return the first run (seed 000,
    seed 001's ``IdempotencyKeys``).

    Unique on (organization, user, key) per seed 000, NULLS NOT DISTINCT, so the
    constraint also holds between callers without a user. Who the caller is:

    - a signed-in user: ``user`` set, ``api_key`` NULL, ``key`` the client's key as sent;
    - an API key: ``user`` NULL, ``api_key`` set, and ``key`` stored namespaced as
      ``"<api key id>:<client key>"``. The seed's constraint has no api-key column and
      every API-key row has ``user`` NULL, so without the prefix two keys of one
      organization that happened to pick the same client key (``"order-42"``) would
      collide and one would be handed the other's run. The API key id is a UUID and
      holds no ':' of its own, so the namespaced values of two keys can never be equal,
      and no user's row can equal one either (its ``user`` is not NULL).

    The row is inserted before the run, in the run's transaction: the unique constraint
    picks the winner of concurrent starts with one key (the others wait for its commit
    and return its run). ``request_hash`` is the SHA-256 of the canonical request body;
    the same key with another body is a conflict. Rows are kept until ``expires_at`` (at
    least 24 hours) and then removed by ``engine.services.purge_expired_idempotency_keys``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey("tenancy.User", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # The API key that sent the start (NULL for a signed-in user); see the class docstring.
    # Its foreign-key index serves the cascade when an API key row is deleted.
    api_key = models.ForeignKey("tenancy.ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # SHA-256 of the canonical request body: the same key with another body is a conflict.
    request_hash = models.CharField(max_length=64)
    workflow_run = models.ForeignKey(WorkflowRun, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_idempotencykey"
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "user", "key"], name="uniq_idempotency_org_user_key", nulls_distinct=False
            ),
        ]
        indexes = [
            # Expiry sweep: WHERE expires_at < now().
            models.Index(fields=["expires_at"], name="idx_idempotency_expiry"),
        ]

    def __str__(self) -> str:
        return f"idempotency key {self.key!r}"


class TriggerFiring(models.Model):
    """One scheduled instant of a cron trigger, fired at most once: the unique
    (trigger, scheduled_for) is what lets several clocks race without creating two runs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    trigger = models.ForeignKey(ScheduledTrigger, on_delete=models.CASCADE, related_name="firings")
    scheduled_for = models.DateTimeField()
    workflow_run = models.ForeignKey(WorkflowRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The backfill that fired this instant (NULL: the clock did). Indexed by idx_firing_backfill.
    backfill = models.ForeignKey("engine.TriggerBackfill", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="firings", db_index=False)
    outcome = models.CharField(max_length=20, default="started")
    detail = models.TextField(blank=True, default="")
    fired_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_triggerfiring"
        constraints = [
            models.UniqueConstraint(fields=["trigger", "scheduled_for"], name="uniq_triggerfiring_instant"),
            models.CheckConstraint(
                condition=Q(outcome__in=["started", "skipped", "failed"]), name="triggerfiring_outcome_valid"
            ),
        ]
        indexes = [
            # A backfill's firings: its runs still going (max_active_runs), its page's list.
            models.Index(fields=["backfill", "scheduled_for"], name="idx_firing_backfill",
                         condition=Q(backfill__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"firing of {self.trigger_id} for {self.scheduled_for}"


class TriggerBackfill(models.Model):
    """A backfill of a cron trigger: one run per instant of the trigger's schedule in
    [range_start, range_end] (UTC, both inclusive), oldest first (engine.backfill).

    The schedule (``cron_expression``, ``timezone``) is the trigger's when the backfill was
    made, so the instants are the ones its preview counted. Each instant is claimed through
    the trigger's firings (``uniq_triggerfiring_instant``), the key the clock's firings use
    too, so an instant never gets two runs, whoever fires it. ``next_instant`` is the next
    instant to fire (NULL once finished); ``not_before`` when the backfill may go on (its
    ``max_active_runs`` runs are going, or the organization's start quota is full).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    # Indexed by idx_backfill_trigger_recent (it leads with the trigger).
    trigger = models.ForeignKey(ScheduledTrigger, on_delete=models.CASCADE, related_name="backfills",
                                db_index=False)
    state = models.CharField(max_length=20, choices=BackfillState.choices, default=BackfillState.RUNNING)
    range_start = models.DateTimeField()
    range_end = models.DateTimeField()
    cron_expression = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64)
    # How many of its runs may be going (pending or running) at once (1..BACKFILL_MAX_ACTIVE_RUNS).
    max_active_runs = models.SmallIntegerField()
    # The priority of the runs it starts (PRIORITY_MIN..PRIORITY_MAX).
    priority = models.SmallIntegerField(default=0)
    # Runs it set out to start: the range's instants without a run when it was made (a range
    # with none is refused); runs it started; instants it passed because they had a run.
    total = models.IntegerField()
    created_runs = models.IntegerField(default=0)
    skipped = models.IntegerField(default=0)
    next_instant = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(db_default=Now())
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        "tenancy.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_triggerbackfill"
        constraints = [
            models.CheckConstraint(condition=_in("state", BackfillState.values), name="backfill_state_valid"),
            models.CheckConstraint(condition=Q(range_start__lte=F("range_end")), name="backfill_range_ordered"),
            models.CheckConstraint(condition=Q(max_active_runs__gte=1), name="backfill_max_active_runs_positive"),
            models.CheckConstraint(condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                                   name="backfill_priority_range"),
            # One backfill going per trigger: its instants are fired in one order.
            models.UniqueConstraint(fields=["trigger"], condition=Q(state="running"),
                                    name="uniq_backfill_running_per_trigger"),
            # running <=> not finished.
            models.CheckConstraint(
                condition=(Q(state="running", finished_at__isnull=True)
                           | (~Q(state="running") & Q(finished_at__isnull=False))),
                name="backfill_finished_at_matches_state",
            ),
        ]
        indexes = [
            # The clock's pass: WHERE state = 'running' AND not_before <= now() ORDER BY not_before.
            models.Index(fields=["not_before"], name="idx_backfill_due", condition=Q(state="running")),
            # A trigger's backfills, newest first (its page, GET /triggers/<id>/backfills/).
            models.Index(F("trigger"), F("created_at").desc(), name="idx_backfill_trigger_recent"),
        ]

    def __str__(self) -> str:
        return f"backfill {self.id} of {self.trigger_id} ({self.state})"


class RunSubscription(models.Model):
    """A live listener of one run's events (an SSE stream or a live run page).

    The NOTIFY trigger on core_taskrunevent announces an event only while its run has
    an unexpired subscription: PostgreSQL serializes the commits of every transaction
    that notified, so notifying for runs nobody watches would cap the engine's commit
    rate for nothing. Listeners refresh ``expires_at`` while they stream and delete
    their row when they stop; an abandoned row expires on its own.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+", db_index=False)
    expires_at = models.DateTimeField()

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_runsubscription"
        indexes = [
            # The trigger's probe, once per event: WHERE workflow_run_id = ? AND expires_at > now().
            models.Index(fields=["workflow_run", "expires_at"], name="idx_runsub_run_expiry"),
        ]

    def __str__(self) -> str:
        return f"subscription to {self.workflow_run_id} until {self.expires_at}"


class WorkerConnection(models.Model):
    """A worker process of an organization, as last seen polling one of its queues
    (issue 18: the workers page and the run page's "no live worker" warning).

    One row per (organization, worker id, queue): the worker id is the process's own
    (``worker.id`` of a poll, docs/workers.md). ``last_seen_at`` is stamped by its polls,
    at most once per WORKER_SEEN_RESOLUTION_SECONDS (engine.repositories.worker_queues), so
    an idle worker's long polls cost the database one claim per poll, not a write too.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    worker_id = models.CharField(max_length=64)
    queue = models.CharField(max_length=64)
    name = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=200, blank=True, default="")
    sdk = models.CharField(max_length=200, blank=True, default="")
    concurrency = models.IntegerField(null=True, blank=True)
    # The worker key it polled with (a revoked key's workers stop being seen).
    api_key = models.ForeignKey("tenancy.ApiKey", null=True, on_delete=models.SET_NULL, related_name="+")
    first_seen_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_workerconnection"
        constraints = [
            # The poll's upsert target; also the workers page's (organization, queue) listing.
            models.UniqueConstraint(fields=["organization", "queue", "worker_id"], name="uniq_worker_org_queue_id"),
            models.CheckConstraint(condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                                   name="worker_concurrency_positive"),
        ]
        indexes = [
            # The housekeeping purge of workers not seen for a week (worker_connection_purge_batch).
            models.Index(fields=["last_seen_at"], name="idx_workerconn_last_seen"),
        ]

    def __str__(self) -> str:
        return f"worker {self.worker_id} on {self.queue}"


class TaskLog(models.Model):
    """A log line of one attempt (generation) of a task run (seed 001's TaskLogs): one a
    worker of the organization sent (issue 18; written only while the sender holds the
    generation), or one a shared worker captured while the handler ran (issue 19: its
    ``logging`` records, stdout and stderr, the http task's request summary). Secret values
    are redacted before a line is stored, and each attempt's lines are capped
    (FLOWFORGE_TASK_LOG_MAX_LINES / _MAX_BYTES) behind a ``system`` line saying so. Read by
    task run, oldest first (idx_tasklog_taskrun); ``id`` is the order."""

    class Level(models.TextChoices):
        DEBUG = "debug"
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    class Stream(models.TextChoices):
        """Where a line came from."""

        #: Sent by an organization's own worker (POST /api/v1/worker/tasks/{id}/logs/).
        WORKER = "worker"
        #: A ``logging`` record the handler emitted (its logger's name leads the message).
        LOGGING = "logging"
        #: What the handler printed to stdout, one line each.
        STDOUT = "stdout"
        #: What the handler wrote to stderr, one line each.
        STDERR = "stderr"
        #: The http task's request summary (method, URL with secrets redacted, status, duration).
        HTTP = "http"
        #: Written by FlowForge about the log itself: the truncation markers.
        SYSTEM = "system"

    id = models.BigAutoField(primary_key=True)
    # No database constraints (migration 0033), as for TaskRunEvent: partitioned, written
    # only by the engine's statements.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    task_run = models.ForeignKey(TaskRun, on_delete=models.CASCADE, related_name="logs", db_index=False,
                                 db_constraint=False)
    # The run's created_at: the partition key, as TaskRunEvent.run_created_at.
    run_created_at = models.DateTimeField()
    attempt = models.IntegerField()
    fencing_token = models.BigIntegerField()
    level = models.CharField(max_length=10, choices=Level.choices)
    # Lines written before issue 19 were all sent by workers: the default.
    stream = models.CharField(max_length=10, choices=Stream.choices, db_default="worker")
    message = models.TextField()
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_tasklog"
        constraints = [
            models.CheckConstraint(condition=_in("level", ["debug", "info", "warning", "error"]),
                                   name="tasklog_level_valid"),
            models.CheckConstraint(condition=_in("stream", ["worker", "logging", "stdout", "stderr", "http", "system"]),
                                   name="tasklog_stream_valid"),
        ]
        indexes = [
            # A task run's lines in order (the run page); the run's deletion cascades by it too.
            models.Index(fields=["task_run", "id"], name="idx_tasklog_taskrun"),
            models.Index(fields=["workflow_run"], name="idx_tasklog_run"),
        ]

    def __str__(self) -> str:
        return f"{self.level}: {self.message[:40]}"


class AttemptSecrets(models.Model):
    """The secret values one generation of a worker task run was handed at its poll,
    encrypted (tenancy.vault, bound to the organization and the generation): what its log
    lines, output and error are redacted of, even after the secret was rotated or deleted
    while the worker held it (issue 18). One row per task run, replaced by the next
    generation's; only for an input that references a secret. Rows of generations no
    longer running are deleted by the clock (``attempt_secrets_purge_batch``)."""

    task_run = models.OneToOneField(TaskRun, on_delete=models.CASCADE, primary_key=True, related_name="+")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    fencing_token = models.BigIntegerField()
    values_encrypted = models.TextField()
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_attemptsecrets"

    def __str__(self) -> str:
        return f"secrets handed to {self.task_run_id}/{self.fencing_token}"


# --- notifications (issue 19): webhooks and failure emails ------------------------------------------


class WebhookEndpoint(models.Model):
    """An organization's webhook endpoint: FlowForge POSTs the notifications it subscribes
    to (``event_types``, optionally only for runs of ``workflow_name``) to ``url``, signed
    with its secret (engine.webhooks: Stripe's scheme, HMAC-SHA256 of "{timestamp}.{body}").

    The secret is generated by the server, shown once, and stored encrypted
    (``secret_ciphertext``: tenancy.vault's Fernet keys, FLOWFORGE_SECRET_KEYS, bound to the
    organization and this endpoint). After a rotation the previous secret also signs until
    ``previous_secret_expires_at`` (a second ``v1=`` in the signature header), so receivers
    can switch without a gap. The URL passes the egress policy when it is stored and again
    at every connection. Owners and admins manage endpoints (``webhook.manage``).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: idx_webhook_org_enabled leads with it, and the list reads by it.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    url = models.CharField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    # A JSON array of NotificationType values, at least one, no other (webhook_event_types_valid).
    event_types = models.JSONField()
    # '' = runs of every workflow; else only runs of the workflow of this name.
    workflow_name = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    secret_ciphertext = models.TextField()
    previous_secret_ciphertext = models.TextField(blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey("tenancy.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The API key that created it (created_by is then NULL).
    created_by_api_key = models.ForeignKey("tenancy.ApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                           related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_webhookendpoint"
        constraints = [
            models.CheckConstraint(
                condition=Q(Exact(Func(F("event_types"), function="jsonb_typeof", output_field=models.CharField()),
                                  "array"))
                & Q(event_types__contained_by=NotificationType.values) & ~Q(event_types=[]),
                name="webhook_event_types_valid",
            ),
            models.CheckConstraint(condition=Q(url__startswith="http://") | Q(url__startswith="https://"),
                                   name="webhook_url_http"),
        ]
        indexes = [
            # The notification trigger's probe, once per finished run or failed task run:
            # WHERE organization_id = $1 AND enabled (migration 0028); also the list page.
            models.Index(fields=["organization", "created_at"], name="idx_webhook_org_enabled",
                         condition=Q(enabled=True)),
            models.Index(fields=["organization", "created_at"], name="idx_webhook_org_created"),
        ]

    def __str__(self) -> str:
        return f"webhook {self.id} ({self.url[:60]})"


class FailureSubscription(models.Model):
    """A member's wish to be emailed when a run of ``workflow_name`` fails (issue 19): one
    row per (organization, workflow name, user). Only members of the organization get the
    email (checked when it is sent); a member who leaves loses their subscriptions."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    user = models.ForeignKey("tenancy.User", on_delete=models.CASCADE, related_name="+")
    workflow_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_failuresubscription"
        constraints = [
            # Also the notification trigger's probe (organization) and its fan-out
            # (organization, workflow name).
            models.UniqueConstraint(fields=["organization", "workflow_name", "user"],
                                    name="uniq_failuresub_org_workflow_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} on failures of {self.workflow_name}"


class NotificationEvent(models.Model):
    """One notification, recorded in the transaction of the transition that caused it (the
    ``ff_notification_record`` trigger on core_taskrunevent, migration 0028) and only when
    the organization has an enabled endpoint subscribed to its type or, for ``run.failed``,
    a member subscribed to the workflow's failures. ``id`` is the stable event id receivers
    deduplicate by (every attempt and replay of it carries the same id and body);
    ``payload`` is a snapshot of the run (and task run) as they were then."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    type = models.CharField(max_length=32, choices=NotificationType.choices)
    # The run's deletion takes its notifications with it (the foreign key's index).
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+")
    # No foreign key: a snapshot's reference (a constraint would make every task run's
    # deletion probe this table).
    task_run_id = models.UUIDField(null=True, blank=True)
    workflow_name = models.CharField(max_length=200)
    # The seq of the run event it was recorded from (core_taskrunevent).
    run_event_seq = models.BigIntegerField()
    payload = models.JSONField()
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_notificationevent"
        constraints = [
            models.CheckConstraint(condition=Q(type__in=NotificationType.values), name="notifevent_type_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


class NotificationDelivery(models.Model):
    """One delivery of a notification to one target: a webhook endpoint or a member's
    email. The notifications' outbox: written with its event in the transition's
    transaction, claimed by the clock's ``notify_tick`` (pending -> sending: a lease and a
    bumped ``claim_token``, at most FLOWFORGE_NOTIFY_IN_FLIGHT* at once deployment-wide,
    per organization and per endpoint), sent by ``deliver_notification``, and recorded
    with a conditional UPDATE on (state, claim_token). A failure to be retried goes back to
    pending with exponential backoff and jitter; the last one (or one not retried) is
    dead-lettered (state dead), kept, and replayable as a new delivery (``replay_of``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    event = models.ForeignKey(NotificationEvent, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=DeliveryChannel.choices)
    # No index of its own: idx_notifdelivery_endpoint leads with it.
    endpoint = models.ForeignKey(WebhookEndpoint, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="deliveries", db_index=False)
    recipient = models.ForeignKey("tenancy.User", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    replay_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replays")
    state = models.CharField(max_length=10, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.IntegerField(default=0)
    claim_token = models.BigIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_lettered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_notificationdelivery"
        constraints = [
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values), name="notifdelivery_state_valid"),
            models.CheckConstraint(
                condition=Q(channel=DeliveryChannel.WEBHOOK, endpoint__isnull=False, recipient__isnull=True)
                | Q(channel=DeliveryChannel.EMAIL, endpoint__isnull=True, recipient__isnull=False),
                name="notifdelivery_channel_target",
            ),
            # A claimed row holds a lease, no other does; a pending row knows when it is due.
            models.CheckConstraint(
                condition=(Q(state=DeliveryState.SENDING, lease_expires_at__isnull=False)
                           | (~Q(state=DeliveryState.SENDING) & Q(lease_expires_at__isnull=True))),
                name="notifdelivery_lease_iff_sending",
            ),
            models.CheckConstraint(condition=~Q(state=DeliveryState.PENDING) | Q(next_attempt_at__isnull=False),
                                   name="notifdelivery_pending_due"),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="notifdelivery_attempts_non_negative"),
            # Each event reaches each endpoint and each recipient once (replays aside).
            models.UniqueConstraint(fields=["event", "endpoint"], name="uniq_notifdelivery_event_endpoint",
                                    condition=Q(replay_of__isnull=True, endpoint__isnull=False)),
            models.UniqueConstraint(fields=["event", "recipient"], name="uniq_notifdelivery_event_recipient",
                                    condition=Q(replay_of__isnull=True, recipient__isnull=False)),
        ]
        indexes = [
            # The claim's loose scan over targets with pending rows, then each target's due
            # rows oldest first (notification_delivery_claim): a target is the endpoint, or
            # the recipient of an email.
            models.Index(Coalesce("endpoint", "recipient"), F("next_attempt_at"), name="idx_notifdelivery_pending",
                         condition=Q(state=DeliveryState.PENDING)),
            # Rows being sent: the claim's counts of what is in flight, and the expired leases.
            models.Index(fields=["lease_expires_at"], name="idx_notifdelivery_sending",
                         condition=Q(state=DeliveryState.SENDING)),
            # An endpoint's delivery log, newest first (keyset pages).
            models.Index(F("endpoint"), F("created_at").desc(), F("id").desc(),
                         name="idx_notifdelivery_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} delivery {self.id} ({self.state})"


class NotificationAttempt(models.Model):
    """One attempt of a delivery: when, how long, what came back (the HTTP status and the
    first FLOWFORGE_WEBHOOK_RESPONSE_BYTES of the body, or the error). Written with the
    delivery's outcome in one statement (notification_delivery_record)."""

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False,
                                     db_constraint=False)
    # No index of its own: uniq_notifattempt_delivery_number leads with it.
    delivery = models.ForeignKey(NotificationDelivery, on_delete=models.CASCADE, related_name="attempt_log",
                                 db_index=False)
    number = models.IntegerField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    # Whether the delivery will be tried again after this attempt.
    retrying = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    duration_ms = models.IntegerField(null=True, blank=True)
    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    response_excerpt = models.TextField(blank=True, default="")
    response_truncated = models.BooleanField(default=False)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_notificationattempt"
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="uniq_notifattempt_delivery_number"),
            models.CheckConstraint(condition=Q(outcome__in=["succeeded", "failed"]), name="notifattempt_outcome_valid"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}: {self.outcome}"


class OffloadedPayload(models.Model):
    """A task run's output kept outside the task-run row (issue 21): one generation's output
    over FLOWFORGE_MAX_OUTPUT_BYTES, written whole to the "offload" storage
    (``engine.offload``) under ``storage_key`` before its completion. The row's ``output``
    then holds only a summary (``engine.offload.REF``), and the API reads the whole value
    from here — looked up by the task run's own id and current fencing token, so an output
    that merely looks like a summary never reaches another task's payload. Removed with its
    run (``engine.retention``, files first)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+", db_index=False)
    workflow_run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="+", db_index=False)
    task_run = models.ForeignKey(TaskRun, on_delete=models.CASCADE, related_name="+", db_index=False)
    fencing_token = models.BigIntegerField()
    # Where the bytes are in the "offload" storage (built from the ids above, never from task data).
    storage_key = models.CharField(max_length=255)
    # Size in bytes of the JSON text, and its SHA-256 (hex): checked when it is read back.
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now())

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_offloadedpayload"
        constraints = [
            # One payload per generation: the API reads the one of the task run's current token.
            models.UniqueConstraint(fields=["task_run", "fencing_token"], name="uniq_offloadedpayload_generation"),
        ]
        indexes = [
            # Retention: a run's payloads (WHERE workflow_run_id = ANY(...)), files then rows.
            models.Index(fields=["workflow_run"], name="idx_offloadedpayload_run"),
        ]

    def __str__(self) -> str:
        return f"{self.storage_key} ({self.size_bytes} bytes)"
