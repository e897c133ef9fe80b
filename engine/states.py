"""The engine's vocabulary: run states, task-run states, event kinds, queue names, backfill
states and the shape of a cron run's scheduled instant (``RunSchedule``).

Every other module spells these through the names here. The database holds the same
lists as CHECK constraints (seed 000, "Why varchar + CHECK"): ``wfrun_state_valid``,
``taskrun_state_valid`` and ``taskrunevent_kind_valid`` are built from these enums in
``engine.models``, and tests/unit/test_constraints.py checks that each member is
accepted and anything else refused, so the enum and the constraint cannot drift.

The enums are Django ``TextChoices`` (a ``str`` subclass): a member compares equal to
its value, so ``run.state == RunState.SUCCEEDED`` and ``"succeeded" in RUN_TERMINAL_STATES``
both hold, and a member passed as a query parameter is its value.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import models


class RunState(models.TextChoices):
    """The five WorkflowRun states of seed 000 (``wfrun_state_valid``). A finished run
    (succeeded, failed, cancelled) goes back to running only when a person resumes it or
    acts on one of its task runs (engine.recovery), and then finishes again."""

    #: Created; its task runs exist and its roots are ready. Becomes running when the
    #: first task run is claimed.
    PENDING = "pending"
    #: At least one task run has been claimed and not every task run has finished.
    RUNNING = "running"
    #: Every task run finished and no failure was left unhandled (terminal): each task
    #: run succeeded or was skipped, or failed and a ``one_failed``/``all_failed`` task run
    #: because of it succeeded (docs/api.md, "A run's final state").
    SUCCEEDED = "succeeded"
    #: A task run failed and nothing handled it, or the run outlived its workflow's run
    #: timeout (terminal).
    FAILED = "failed"
    #: Cancelled by a person, an API key or the system before it finished (terminal).
    CANCELLED = "cancelled"


class TaskRunState(models.TextChoices):
    """The seven TaskRun states of seed 000 (``taskrun_state_valid``)."""

    #: Waiting for its dependencies' outcomes to decide its trigger rule (TriggerRule).
    PENDING = "pending"
    #: Its trigger rule was met (by default: every dependency succeeded), or it has no
    #: dependency: waiting to be claimed, not before ``not_before`` when a retry backs off.
    READY = "ready"
    #: Claimed: holds a lease (``lease_expires_at``) and a fencing token. The lease is a
    #: dispatch lease until a worker starts the generation, a worker lease after.
    RUNNING = "running"
    #: An attempt succeeded; ``output`` holds its result (terminal).
    SUCCEEDED = "succeeded"
    #: Its last attempt failed, or a failure was not retryable (terminal).
    FAILED = "failed"
    #: Will not run (terminal): its trigger rule can no longer be met by its upstream
    #: outcomes, its condition was false (``skip_reason`` says which, SkipReason), or a
    #: person skipped it (engine.recovery).
    SKIPPED = "skipped"
    #: Its run was cancelled or timed out before it finished (terminal).
    CANCELLED = "cancelled"


class EventKind(models.TextChoices):
    """What a TaskRunEvent records (``taskrunevent_kind_valid``). Run-level events have
    no task run; the others name the task run and, from the claim on, its generation."""

    #: The run and its task runs were created (run level).
    RUN_STARTED = "run_started"
    #: Every task run finished, so the run took its final state (run level; also written
    #: when a cancel or a run timeout closes the run).
    RUN_FINISHED = "run_finished"
    #: pending -> ready: its trigger rule was met by its upstream outcomes (all succeeded,
    #: by default; detail.trigger_rule names any other rule).
    PROMOTED = "promoted"
    #: ready -> running: a claimer bumped the fencing token (a new generation), took a
    #: dispatch lease and wrote the generation's outbox row.
    CLAIMED = "claimed"
    #: A worker started the generation's handler (at most once per generation); the
    #: dispatch lease became a worker lease.
    STARTED = "started"
    #: running -> succeeded: the attempt's completion was recorded.
    SUCCEEDED = "succeeded"
    #: An attempt raised: back to ready for another attempt (after its backoff), or
    #: failed when none is left or the error is not retryable.
    ATTEMPT_FAILED = "attempt_failed"
    #: The reaper found a started attempt past its ``timeout_seconds``.
    ATTEMPT_TIMED_OUT = "attempt_timed_out"
    #: The reaper found a started attempt whose worker lease ran out (the worker
    #: stopped heartbeating).
    LEASE_EXPIRED = "lease_expired"
    #: The reaper found a claimed generation never started before its dispatch lease
    #: ran out (the message was lost): back to ready, no attempt used.
    DISPATCH_EXPIRED = "dispatch_expired"
    #: The generation's outbox row was dead-lettered (the broker refused it every
    #: time): the task run fails without waiting for a message that will not come.
    DISPATCH_DEAD_LETTERED = "dispatch_dead_lettered"
    #: A message arrived for a generation a worker had already started (redelivery).
    DUPLICATE_DELIVERY_IGNORED = "duplicate_delivery_ignored"
    #: A message arrived for a generation that is no longer current (reaped, cancelled
    #: or superseded).
    STALE_DISPATCH_IGNORED = "stale_dispatch_ignored"
    #: A completion came from a generation that is no longer current: not recorded.
    STALE_COMPLETION_REJECTED = "stale_completion_rejected"
    #: The task run will never run: its trigger rule can no longer be met (from pending;
    #: detail.reason ``upstream_failed`` or ``trigger_rule``), or its condition was false
    #: (from running, before the handler; detail.reason ``condition_false``).
    SKIPPED = "skipped"
    #: The task run was cancelled with its run (cancel or run timeout).
    CANCELLED = "cancelled"
    #: A ready task run is held back by a limit (detail.reason, e.g. "concurrency stripe
    #: 5/5"): written when the scheduler first sees that reason (run level when a run waits
    #: for its workflow's run limit).
    WAITING = "waiting"
    #: A queued run (pending: its workflow's max_running_runs was reached) was let in.
    RUN_ADMITTED = "run_admitted"
    #: The claimed generation's message, fetched by a worker process that then died
    #: before starting it, was given back to its queue (flowforge.broker_recovery; detail:
    #: the dead process's broker id and the seconds since the claim).
    REDELIVERED = "redelivered"
    #: A finished run went back to running because a person acted on it (run level; detail:
    #: ``action`` resume / retry / mark_succeeded / skip, ``by``, ``task`` for a per-task
    #: action, ``tasks`` reopened (their keys, at most 100) and ``reopened`` (how many),
    #: ``reason``). Its task runs' own events follow it (engine.recovery).
    RESUMED = "resumed"
    #: A person reopened a finished task run for another attempt (a resume, or a retry of
    #: it or of a task upstream of it): failed / skipped / cancelled / succeeded -> pending
    #: (or ready for a task without dependencies), its fencing token bumped (a new generation:
    #: a late message or completion of an older one is refused) and its attempt budget
    #: renewed (``attempt`` counts on; ``TaskRun.attempt_base``); detail: action, by, reason.
    RESET = "reset"
    #: A person marked a failed, skipped or cancelled task run succeeded with a given output
    #: (its token bumped; detail: by, reason, output_bytes); its dependents then run.
    MARKED_SUCCEEDED = "marked_succeeded"
    #: A person marked a failed or cancelled task run skipped (its token bumped; detail:
    #: by, reason).
    MARKED_SKIPPED = "marked_skipped"


class TriggerRule(models.TextChoices):
    """When a task with dependencies runs, by the outcomes of its upstream task runs
    (Airflow's names; ``task_trigger_rule_valid``; docs/api.md "Trigger rules and
    conditions" has the whole table). An upstream outcome is *success* (succeeded),
    *failure* (failed, or skipped with SkipReason.UPSTREAM_FAILED: a failure further up
    that nothing handled) or *skip* (any other skip, or cancelled). A rule fires, makes
    the task skipped, or waits; one that fires early does not wait for the rest."""

    #: Ready once every upstream succeeded; skipped as soon as one failed (reason
    #: upstream_failed) or was skipped (reason trigger_rule). The default.
    ALL_SUCCESS = "all_success"
    #: Ready once every upstream failed; skipped as soon as one succeeded or was skipped.
    ALL_FAILED = "all_failed"
    #: Ready once every upstream finished, whatever the outcome; never skipped by them.
    ALL_DONE = "all_done"
    #: Ready as soon as one upstream failed; skipped once all finished and none failed.
    ONE_FAILED = "one_failed"
    #: Ready as soon as one upstream succeeded; skipped once all finished and none
    #: succeeded (upstream_failed if one of them failed).
    ONE_SUCCESS = "one_success"
    #: Ready once every upstream finished and none failed (skips are fine); skipped as
    #: soon as one failed (upstream_failed).
    NONE_FAILED = "none_failed"
    #: Ready once every upstream finished, whatever the outcome, like all_done (in
    #: FlowForge a dependency always orders: Airflow's ``always`` would start at once); the
    #: name for a cleanup step.
    ALWAYS = "always"


class SkipReason(models.TextChoices):
    """Why a skipped task run was skipped (``taskrun_skip_reason_valid``). Meaningful only
    while the task run is skipped; every statement that skips sets it."""

    #: Not skipped, or skipped by a statement that gives no reason.
    NONE = "", "none"
    #: Its trigger rule can no longer be met because of a failure upstream. Counts as a
    #: failure for its own dependents' rules (Airflow's ``upstream_failed``), so a
    #: ``one_failed`` task further down still hears of it.
    UPSTREAM_FAILED = "upstream_failed"
    #: Its trigger rule can no longer be met, and no failure upstream is why (an upstream
    #: was skipped, or e.g. ``all_failed`` saw a success). Counts as a skip downstream.
    TRIGGER_RULE = "trigger_rule"
    #: Its condition evaluated to false. Counts as a skip downstream.
    CONDITION_FALSE = "condition_false"
    #: A person marked it skipped (engine.recovery; its 'marked_skipped' event names who and
    #: why). Counts as a skip downstream.
    MARKED = "marked"


#: Trigger rules that exist to react to a failure: a failure that such a task, run
#: because of it, handled successfully does not fail the run (runs.sql run_finish_if_done).
FAILURE_HANDLING_RULES: tuple[str, ...] = (TriggerRule.ONE_FAILED.value, TriggerRule.ALL_FAILED.value)

#: Finished run states (``wfrun_finished_at_matches_state``: exactly these have
#: ``finished_at``). The engine never moves a run out of them; only a person does, by
#: resuming the run or acting on one of its task runs (engine.recovery, a ``resumed`` event).
RUN_TERMINAL_STATES: tuple[str, ...] = (RunState.SUCCEEDED.value, RunState.FAILED.value, RunState.CANCELLED.value)
#: Run states still going.
RUN_OPEN_STATES: tuple[str, ...] = (RunState.PENDING.value, RunState.RUNNING.value)
#: Finished task-run states (a retry reuses the row while it is open). The engine never
#: moves a task run out of them; only a person does (engine.recovery: ``reset``,
#: ``marked_succeeded``, ``marked_skipped`` events).
TASK_TERMINAL_STATES: tuple[str, ...] = (
    TaskRunState.SUCCEEDED.value, TaskRunState.FAILED.value, TaskRunState.SKIPPED.value, TaskRunState.CANCELLED.value,
)
#: Task-run states still open: a cancel takes these.
TASK_OPEN_STATES: tuple[str, ...] = (TaskRunState.PENDING.value, TaskRunState.READY.value, TaskRunState.RUNNING.value)

#: Queue of the clock's and the nudges' actors (schedule, relay, reap, triggers, sweep,
#: housekeeping).
CONTROL_QUEUE = "flowforge.control"
#: Queue of the execute messages (``OutboxMessage.routing_key`` of a dispatch): the bulk lane.
TASK_QUEUE = "flowforge.tasks"
#: The first lane, a routing key and not a queue of its own: the execute message of one of
#: an organization's first few generations waiting for a worker (FLOWFORGE_DISPATCH_FIRST
#: x weight; ``task_run_claim_fair`` picks the lane) goes to the *head* of TASK_QUEUE
#: (``flowforge.broker.HEAD_OPTION``), so one organization's backlog never stands in front
#: of another organization's first task. One queue, so a worker's prefetch stays its own;
#: a consumer whose prefetch is full still fetches one message when told one went to the
#: head (``flowforge.redis_wakeup``), so it does not wait for a long message to end.
TASK_FIRST_QUEUE = "flowforge.tasks.first"
#: Dramatiq priorities of the execute actors (lower runs first among the messages a worker
#: process has fetched; the control actors are at 0): a first-lane message goes before the
#: bulk ones already fetched, as it went before them in the broker's queue.
TASK_FIRST_PRIORITY = 5
TASK_BULK_PRIORITY = 10


class NotificationType(models.TextChoices):
    """What a notification tells (issue 19): a webhook endpoint subscribes to some of these
    (``webhook_event_types_valid``); a failure email is sent for ``run.failed``. Recorded
    from the run's history by the ``ff_notification_record`` trigger (migration 0028)."""

    #: The run finished and every task run succeeded (a 'run_finished' event, to_state succeeded).
    RUN_SUCCEEDED = "run.succeeded"
    #: The run finished failed: a task failed, or it outlived its run timeout.
    RUN_FAILED = "run.failed"
    #: The run was cancelled before it finished.
    RUN_CANCELLED = "run.cancelled"
    #: A task run failed for good (no attempt left, or a failure that is not retried).
    TASK_FAILED = "task.failed"


class DeliveryState(models.TextChoices):
    """Where one delivery of a notification is (``notifdelivery_state_valid``): a row of the
    notifications' outbox (``engine.models.NotificationDelivery``)."""

    #: Waiting for its next attempt (``next_attempt_at``).
    PENDING = "pending"
    #: Claimed by a worker that is sending it (``lease_expires_at``, ``claim_token``).
    SENDING = "sending"
    #: The receiver accepted it (a 2xx answer; the mailer took the email) (terminal).
    SUCCEEDED = "succeeded"
    #: Dead-lettered: refused for good, or its attempts ran out; kept and replayable (terminal).
    DEAD = "dead"


class DeliveryChannel(models.TextChoices):
    """How a notification is delivered (``notifdelivery_channel_target``)."""

    #: An HTTP POST to an organization's webhook endpoint.
    WEBHOOK = "webhook"
    #: An email to a member who subscribed to the workflow's failures.
    EMAIL = "email"


#: Queue of the notification deliveries (``deliver_notification``): their own, so a slow
#: receiver's deliveries never stand in the task queue.
NOTIFY_QUEUE = "flowforge.notifications"

#: Priorities (runs and tasks): higher is claimed first within an organization's share;
#: the range of the CHECK constraints on core_workflowrun, core_task and core_taskrun.
PRIORITY_MIN, PRIORITY_MAX = -10, 10


def priority_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a priority, or None when it is one: a whole number
    (an int: not a bool, not a float even when whole, not a string) from PRIORITY_MIN to
    PRIORITY_MAX. One wording wherever a priority is given: a task's in a definition, a
    run's at its start (API, UI), a trigger's and a backfill's."""
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return f"must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}, got {value!r}"
    return None


__all__ = [
    "CONTROL_QUEUE",
    "FAILURE_HANDLING_RULES",
    "NOTIFY_QUEUE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "RUN_OPEN_STATES",
    "RUN_TERMINAL_STATES",
    "TASK_FIRST_QUEUE",
    "TASK_FIRST_PRIORITY",
    "TASK_BULK_PRIORITY",
    "TASK_OPEN_STATES",
    "TASK_QUEUE",
    "TASK_TERMINAL_STATES",
    "DeliveryChannel",
    "DeliveryState",
    "EventKind",
    "NotificationType",
    "RunState",
    "SkipReason",
    "TaskRunState",
    "TriggerRule",
    "priority_problem",
]


class BackfillState(models.TextChoices):
    """A cron trigger's backfill (``TriggerBackfill``, ``backfill_state_valid``)."""

    #: Starting one run per instant of its range, oldest first (waiting while its
    #: ``max_active_runs`` are going or the organization's start quota is full).
    RUNNING = "running"
    #: Every instant of its range has a run (started by it, or already there).
    SUCCEEDED = "succeeded"
    #: Stopped at an instant no run could start for (``error`` says why); the instants
    #: before it keep their runs, and a new backfill of the range picks up from there.
    FAILED = "failed"
    #: Cancelled by a person or an API key; the runs it started go on.
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class RunSchedule:
    """The cron instant a run is for and the data interval it covers (all UTC, aware).

    ``scheduled_for`` is the instant of the trigger's schedule the run was started for
    (by the clock, or by a backfill); the data interval is the period that ended at that
    instant: from the schedule's previous instant (``data_interval_start``, inclusive) to
    ``scheduled_for`` (``data_interval_end``, exclusive) — Airflow's data interval of a
    cron schedule. A daily ``0 0 * * *`` run scheduled for 2026-03-02 00:00 covers
    2026-03-01, the day that has just ended.
    """

    scheduled_for: dt.datetime
    data_interval_start: dt.datetime
    data_interval_end: dt.datetime

    def as_dict(self) -> dict[str, str]:
        """The three instants as ISO 8601 strings in UTC (``...+00:00``), keyed by name."""
        return {name: getattr(self, name).astimezone(dt.UTC).isoformat()
                for name in ("scheduled_for", "data_interval_start", "data_interval_end")}
