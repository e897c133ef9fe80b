"""What the repositories take and return: requests, claimed generations, started
attempts, completion outcomes."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from engine.states import TASK_QUEUE, RunSchedule


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """A claimed task-run generation and its outbox row (``outbox_id`` is None when
    another claimer already wrote the row for this generation)."""

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    organization_id: uuid.UUID
    attempt: int
    fencing_token: int
    outbox_id: uuid.UUID | None
    #: Seconds from when it became claimable (ready, past any backoff) to its claim.
    waited_seconds: float | None = None
    #: The queue its message goes to (its outbox row's routing_key): the bulk lane, or the
    #: first lane for one of its organization's first generations waiting for a worker.
    queue: str = TASK_QUEUE
    #: True when the claim counted it into a rate-limit bucket (its task has a rate_limit).
    rate_limited: bool = False


@dataclasses.dataclass(frozen=True)
class StartedAttempt:
    """What a worker needs to run one attempt of one task run."""

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    organization_id: uuid.UUID
    task_key: str
    task_type: str
    config: dict[str, Any]
    attempt: int
    max_attempts: int
    fencing_token: int
    timeout_seconds: float | None
    run_input: dict[str, Any]
    # Each dependency's output by task key. Outputs are handed whole, by key in order,
    # while their running total of JSON text stays within FLOWFORGE_MAX_UPSTREAM_BYTES;
    # each one past it is a summary instead:
    # {"$ref": "task_output", "task": <key>, "bytes": <size of its JSON>, "truncated": true}.
    upstream: dict[str, Any]
    # Seconds from this generation's claim to its start (None if the claim event is gone).
    dispatch_latency_seconds: float | None = None
    # Whether any task depends on this one (a success then has dependents to promote).
    has_dependents: bool = True
    # The task's condition (a CEL expression, engine.conditions), '' for none: evaluated
    # before the handler; false skips the task run (task_runs.skip_for_condition).
    condition: str = ""
    # The cron instant and data interval of the run (None for a run no trigger or backfill started).
    schedule: RunSchedule | None = None


@dataclasses.dataclass(frozen=True)
class CompletionResult:
    """Outcome of a completion. ``accepted`` is False for a stale or duplicate
    completion (recorded as an event, nothing else changed). ``state`` is the task
    run's new state; ``dispatches`` the dependents claimed in the same transaction;
    ``run_state`` the run's state when this completion finished it, else None;
    ``run_limited`` True when it finished the run and the run's workflow has
    max_running_runs (a queued run may be admitted now: nudge the scheduler);
    ``retry_in_seconds`` the backoff when the attempt will be retried; ``promoted`` the
    task runs its advance made ready and left for the scheduler to claim."""

    accepted: bool
    state: str | None = None
    dispatches: tuple[Dispatch, ...] = ()
    run_state: str | None = None
    retry_in_seconds: float | None = None
    run_limited: bool = False
    # Task runs this completion's advance made ready without claiming them (a failure's or
    # a skip's dependents with a rule that runs on it): nudge the scheduler to claim them.
    promoted: int = 0


@dataclasses.dataclass(frozen=True)
class StartRequest:
    """One delivered execute message: start generation ``fencing_token`` as ``owner``."""

    task_run_id: uuid.UUID
    fencing_token: int
    owner: str
    # The generation's outbox row when no message was sent for it (a worker continuing
    # with a dependent its own success claimed): stamped as delivered if the start succeeds.
    outbox_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True)
class SuccessRequest:
    """A handler that returned: generation ``fencing_token`` succeeded with ``output``."""

    task_run_id: uuid.UUID
    fencing_token: int
    output: Any = None
    # False when no task depends on this one (``StartedAttempt.has_dependents``): a batch
    # of such successes skips the promote-and-claim statement.
    has_dependents: bool = True
    # ``output`` already encoded as JSON text (``engine.worker.output.encode_output``): stored
    # as it is instead of encoding ``output`` again.
    output_json: str | None = None
