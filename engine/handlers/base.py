"""What a task handler is: config validation at definition time, execution at run time."""

from __future__ import annotations

import dataclasses
import math
import threading
import uuid
from typing import Any, ClassVar

from engine.states import RunSchedule


class ConfigError(ValueError):
    """A task's ``config`` is not acceptable to its type. The message names the field."""


class PermanentTaskError(Exception):
    """Raised by a handler (or the runtime) for a failure that another attempt cannot
    fix: the task fails at once, whatever attempts remain (a non-retryable error)."""


class LeaseLost(Exception):
    """Raised inside a handler that checks ``context.raise_if_lease_lost()`` after its
    lease was lost (reaped, cancelled or superseded by a newer generation): whatever it
    would return is no longer recorded."""


@dataclasses.dataclass
class TaskContext:
    """Everything a handler may read about the attempt it is running.

    ``input`` is the run's input document; ``upstream`` maps each dependency's task
    key to its output; ``config`` is the task's validated config, its secret references
    replaced by their values (engine.secret_refs), and ``secret_values`` those values: the
    worker redacts them from what the attempt returns or raises, but a handler that cuts a
    text short must redact it first (``secret_refs.redact``, ``redact_tail``), or a cut
    through a value would leave part of it. ``lost`` is set by the worker's heartbeat once
    this attempt's worker lease could not be extended.

    ``schedule`` is set for a run a cron trigger or a backfill started: the instant the run
    is for and the data interval it covers (``engine.states.RunSchedule``: aware UTC
    datetimes, the interval [previous instant of the schedule, ``scheduled_for``)); None
    for any other run. It is not part of ``input``, so it never meets the keys of the
    run's own input.
    """

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    organization_id: uuid.UUID
    task_key: str
    attempt: int
    max_attempts: int
    fencing_token: int
    timeout_seconds: float | None
    config: dict[str, Any]
    input: dict[str, Any]
    upstream: dict[str, Any]
    lost: threading.Event = dataclasses.field(default_factory=threading.Event)
    secret_values: list[str] = dataclasses.field(default_factory=list)
    schedule: RunSchedule | None = None

    @property
    def lease_lost(self) -> bool:
        """True once the worker no longer holds this attempt's lease (the task run was
        reaped, cancelled or superseded): the attempt's outcome will not be recorded."""
        return self.lost.is_set()

    def raise_if_lease_lost(self) -> None:
        """Raise LeaseLost when the lease was lost; long handlers call this between steps."""
        if self.lost.is_set():
            raise LeaseLost(f"task run {self.task_run_id} generation {self.fencing_token} lost its lease")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; returns True early when the lease is lost."""
        return self.lost.wait(seconds)


class TaskHandler:
    """Base class of task types. Subclasses set ``type_name`` and implement both methods."""

    type_name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Return the normalized config, or raise ConfigError naming the bad field."""
        return dict(config)

    def check_new_config(self, config: dict[str, Any]) -> list[tuple[str, str]]:
        """Rules for configs of new definitions only, beyond ``validate_config``: a version
        stored before a rule existed keeps working (it is restored and run without it).
        ``config`` is the normalized config; returns [(field path inside the config,
        message), ...], empty when it passes. The http type refuses literal credentials."""
        return []

    def run(self, context: TaskContext) -> Any:
        """Run one attempt. The return value (JSON-shaped) is the task's output; an
        exception is the attempt's error."""
        raise NotImplementedError


def require_number(config: dict[str, Any], field: str, *, minimum: float = 0, default: Any = None,
                   maximum: float | None = None) -> float:
    """Read a number from ``config[field]`` between ``minimum`` and ``maximum`` (when
    given); raise ConfigError, naming the field and the bound, if it is not one."""
    value = config.get(field, default)
    if value is None:
        raise ConfigError(f"'{field}' is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"'{field}' must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ConfigError(f"'{field}' must be a finite number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"'{field}' must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"'{field}' must be at most {maximum:g}, got {value}")
    return value


def reject_unknown(config: dict[str, Any], allowed: set[str]) -> None:
    """Raise ConfigError for keys of ``config`` outside ``allowed`` (a typo is an error, not a no-op)."""
    unknown = sorted(set(config) - allowed)
    if unknown:
        fields = ", ".join(repr(k) for k in unknown)
        if not allowed:
            raise ConfigError(f"unknown field(s) {fields}; this task type takes no config")
        raise ConfigError(f"unknown field(s) {fields}; allowed: {', '.join(sorted(allowed))}")
