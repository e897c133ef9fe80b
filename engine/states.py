"""The engine's vocabulary: run states, task-run states, event kinds and queue names.

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

from django.db import models


class RunState(models.TextChoices):
    """The five WorkflowRun states of seed 000 (``wfrun_state_valid``)."""

    #: Created; its task runs exist and its roots are ready. Becomes running when the
    #: first task run is claimed.
    PENDING = "pending"
    #: At least one task run has been claimed and not every task run has finished.
    RUNNING = "running"
    #: Every task run succeeded (terminal).
    SUCCEEDED = "succeeded"
    #: A task run failed, or the run outlived its workflow's run timeout (terminal).
    FAILED = "failed"
    #: Cancelled by a person, an API key or the system before it finished (terminal).
    CANCELLED = "cancelled"


class TaskRunState(models.TextChoices):
    """The seven TaskRun states of seed 000 (``taskrun_state_valid``)."""

    #: Waiting for its dependencies to succeed.
    PENDING = "pending"
    #: Every dependency succeeded (or it has none): waiting to be claimed, not before
    #: ``not_before`` when a retry backs off.
    READY = "ready"
    #: Claimed: holds a lease (``lease_expires_at``) and a fencing token. The lease is a
    #: dispatch lease until a worker starts the generation, a worker lease after.
    RUNNING = "running"
    #: An attempt succeeded; ``output`` holds its result (terminal).
    SUCCEEDED = "succeeded"
    #: Its last attempt failed, or a failure was not retryable (terminal).
    FAILED = "failed"
    #: An upstream task failed or was cancelled, so this one can never run (terminal).
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
    #: pending -> ready: every dependency of the task run succeeded.
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
    #: An upstream task failed or was cancelled: this one will never run.
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


#: Run states a run never leaves (``wfrun_finished_at_matches_state``: exactly these
#: have ``finished_at``).
RUN_TERMINAL_STATES: tuple[str, ...] = (RunState.SUCCEEDED.value, RunState.FAILED.value, RunState.CANCELLED.value)
#: Run states still going.
RUN_OPEN_STATES: tuple[str, ...] = (RunState.PENDING.value, RunState.RUNNING.value)
#: Task-run states a task run never leaves (a retry reuses the row while it is open).
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
#: of another organization's first task. One queue, so a worker's prefetch stays its own.
TASK_FIRST_QUEUE = "flowforge.tasks.first"


class NotificationType(models.TextChoices):
    """What a notification tells (issue 19): a webhook endpoint subscribes to some of these
    (``webhook_event_types_valid``); a failure email is sent for ``run.failed``. Recorded
    from the run's history by the ``ff_notification_record`` trigger (migration 0023)."""

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

__all__ = [
    "CONTROL_QUEUE",
    "NOTIFY_QUEUE",
    "RUN_OPEN_STATES",
    "RUN_TERMINAL_STATES",
    "TASK_FIRST_QUEUE",
    "TASK_OPEN_STATES",
    "TASK_QUEUE",
    "TASK_TERMINAL_STATES",
    "DeliveryChannel",
    "DeliveryState",
    "EventKind",
    "NotificationType",
    "RunState",
    "TaskRunState",
]
