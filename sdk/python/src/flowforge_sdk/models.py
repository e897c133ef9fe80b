"""Typed views of the API's answers.

Each class reads the fields the SDK knows and keeps the whole answer in ``raw`` (so a
field added to the API later is never out of reach). Times are timezone-aware
``datetime`` objects (None when the API has none).

Values that can hold secrets — a worker task's ``input``, ``run_input`` and
``upstream``, a new API key's ``key`` — are left out of ``repr()``, so logging an
object never prints them.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

#: A run's states after which nothing changes any more.
TERMINAL_RUN_STATES = frozenset({"succeeded", "failed", "cancelled"})

_FRACTION_RE = re.compile(r"\.(\d+)")


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 timestamp of the API as an aware datetime (``Z`` accepted, any
    number of fractional digits); None for None or an unreadable value."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python 3.10's fromisoformat takes 3 or 6 fractional digits only.
    text = _FRACTION_RE.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _str(data: dict[str, Any], key: str, default: str = "") -> str:
    value = data.get(key)
    return value if isinstance(value, str) else default


def _opt_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def _int(data: dict[str, Any], key: str, default: int = 0) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _opt_float(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class WorkflowVersion:
    """One stored version of a workflow (``GET /workflows/…``). ``tasks`` and ``edges``
    are filled by a version's detail (``workflows.get``, ``workflows.apply``), empty in
    lists; ``task_count`` only in lists."""

    id: str
    name: str
    version: int
    state: str
    description: str = ""
    created_at: dt.datetime | None = None
    task_count: int | None = None
    concurrency: dict[str, Any] | None = None
    tasks: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # ``workflows.apply`` only: True when the definition was identical to the latest version
    # (nothing stored; this is that version).
    unchanged: bool = False

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> WorkflowVersion:
        count = data.get("task_count")
        return cls(id=str(data.get("id", "")), name=_str(data, "name"), version=_int(data, "version"),
                   state=_str(data, "state"), description=_str(data, "description"),
                   created_at=parse_time(data.get("created_at")),
                   task_count=count if isinstance(count, int) else None,
                   concurrency=data.get("concurrency"), tasks=list(data.get("tasks") or []),
                   edges=list(data.get("edges") or []), raw=data, unchanged=data.get("unchanged") is True)


@dataclass(frozen=True)
class WorkflowRef:
    """The workflow version a run belongs to."""

    id: str
    name: str
    version: int


@dataclass(frozen=True)
class TaskRun:
    """One task of a run (in ``Run.task_runs``). ``output`` is the task's output, or for
    an output too large to inline, ``{"truncated": true, "bytes": n, "url": …}``."""

    id: str
    key: str
    state: str
    attempt: int = 0
    output: Any = None
    error: str | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    waiting_reason: str | None = None
    #: Why a skipped task run was skipped: ``upstream_failed``, ``trigger_rule``,
    #: ``condition_false`` or ``marked`` (a person skipped it); '' when it was not, None from
    #: an older server.
    skip_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> TaskRun:
        return cls(id=str(data.get("id", "")), key=_str(data, "key"), state=_str(data, "state"),
                   attempt=_int(data, "attempt"), output=data.get("output"), error=_opt_str(data, "error"),
                   created_at=parse_time(data.get("created_at")), started_at=parse_time(data.get("started_at")),
                   finished_at=parse_time(data.get("finished_at")), waiting_reason=_opt_str(data, "waiting_reason"),
                   skip_reason=_opt_str(data, "skip_reason"), raw=data)


@dataclass(frozen=True)
class Run:
    """A workflow run. ``input`` and ``task_runs`` are filled by a run's detail
    (``runs.get``, ``runs.start``, ``runs.wait``…), None and empty in lists."""

    id: str
    workflow: WorkflowRef
    state: str
    priority: int = 0
    error: str | None = None
    input: dict[str, Any] | None = field(default=None, repr=False)
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    trigger_source: str | None = None
    retry_of: str | None = None
    waiting_reason: str | None = None
    task_runs: list[TaskRun] = field(default_factory=list)
    #: True when a start with an Idempotency-Key returned an earlier run (200, ``Idempotent-Replayed``).
    replayed: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True once the run is succeeded, failed or cancelled."""
        return self.state in TERMINAL_RUN_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def task(self, key: str) -> TaskRun:
        """The task run of the task ``key``; KeyError naming the keys there are."""
        for task_run in self.task_runs:
            if task_run.key == key:
                return task_run
        raise KeyError(f"run {self.id} has no task {key!r}; it has {', '.join(t.key for t in self.task_runs)}")

    @classmethod
    def from_api(cls, data: dict[str, Any], *, replayed: bool = False) -> Run:
        ref = data.get("workflow")
        if not isinstance(ref, dict):
            ref = {}
        raw_input = data.get("input")
        return cls(id=str(data.get("id", "")),
                   workflow=WorkflowRef(id=str(ref.get("id", "")), name=_str(ref, "name"),
                                        version=_int(ref, "version")),
                   state=_str(data, "state"), priority=_int(data, "priority"), error=_opt_str(data, "error"),
                   input=raw_input if isinstance(raw_input, dict) else None,
                   created_at=parse_time(data.get("created_at")), started_at=parse_time(data.get("started_at")),
                   finished_at=parse_time(data.get("finished_at")), trigger_source=_opt_str(data, "trigger_source"),
                   retry_of=_opt_str(data, "retry_of"), waiting_reason=_opt_str(data, "waiting_reason"),
                   task_runs=[TaskRun.from_api(t) for t in data.get("task_runs") or [] if isinstance(t, dict)],
                   replayed=replayed, raw=data)


@dataclass(frozen=True)
class Event:
    """One event of a run's history; ``seq`` is its place (gap-free, commit order)."""

    seq: int
    kind: str
    task_run: str | None = None
    task_key: str | None = None
    from_state: str | None = None
    to_state: str | None = None
    attempt: int | None = None
    fencing_token: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    created_at: dt.datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Event:
        attempt, token = data.get("attempt"), data.get("fencing_token")
        detail = data.get("detail")
        return cls(seq=_int(data, "seq"), kind=_str(data, "kind"), task_run=_opt_str(data, "task_run"),
                   task_key=_opt_str(data, "task_key"), from_state=_opt_str(data, "from_state"),
                   to_state=_opt_str(data, "to_state"), attempt=attempt if isinstance(attempt, int) else None,
                   fencing_token=token if isinstance(token, int) else None,
                   detail=detail if isinstance(detail, dict) else {}, created_at=parse_time(data.get("created_at")),
                   raw=data)


@dataclass(frozen=True)
class Secret:
    """A secret's metadata; the API never returns a value once it is set."""

    name: str
    version: int = 0
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    #: True when ``secrets.set`` created it (201), False when it rotated an existing one (200).
    created: bool | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], *, created: bool | None = None) -> Secret:
        return cls(name=_str(data, "name"), version=_int(data, "version"), created_at=parse_time(data.get("created_at")),
                   updated_at=parse_time(data.get("updated_at")), created=created, raw=data)


@dataclass(frozen=True)
class ApiKey:
    """An API key as the API lists it. ``key`` (the full ``ffk_…`` secret) is only ever
    set in the answer that created it, and is never shown by ``repr()``."""

    id: str
    prefix: str
    name: str
    role: str
    created_at: dt.datetime | None = None
    expires_at: dt.datetime | None = None
    revoked_at: dt.datetime | None = None
    key: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ApiKey:
        return cls(id=str(data.get("id", "")), prefix=_str(data, "prefix"), name=_str(data, "name"),
                   role=_str(data, "role"), created_at=parse_time(data.get("created_at")),
                   expires_at=parse_time(data.get("expires_at")), revoked_at=parse_time(data.get("revoked_at")),
                   key=_opt_str(data, "key"), raw=data)


@dataclass(frozen=True)
class WorkerTask:
    """A task handed to a worker by ``POST /worker/poll`` (docs/workers.md). The worker
    owns the generation ``fencing_token`` until it completes or fails it, or lets the
    lease run out. ``input`` (secrets resolved), ``run_input`` and ``upstream`` (the
    dependencies' outputs, by task key) are not shown by ``repr()``."""

    task_run_id: str
    fencing_token: int
    attempt: int
    max_attempts: int
    workflow_run_id: str
    workflow: str
    task_key: str
    name: str
    queue: str
    input: dict[str, Any] = field(default_factory=dict, repr=False)
    run_input: dict[str, Any] = field(default_factory=dict, repr=False)
    upstream: dict[str, Any] = field(default_factory=dict, repr=False)
    timeout_seconds: float | None = None
    lease_expires_at: dt.datetime | None = None
    heartbeat_interval_seconds: float = 10.0
    #: The lease the poll's answer gave, in seconds (None when it gave none).
    lease_seconds: float | None = None
    # A cron run's instant and data interval ({"scheduled_for", "data_interval_start",
    # "data_interval_end"}, ISO 8601 UTC strings); None for other runs.
    schedule: dict[str, str] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> WorkerTask:
        def obj(key: str) -> dict[str, Any]:
            value = data.get(key)
            return value if isinstance(value, dict) else {}

        interval = _opt_float(data, "heartbeat_interval_seconds")
        return cls(task_run_id=str(data.get("task_run_id", "")), fencing_token=_int(data, "fencing_token"),
                   attempt=_int(data, "attempt", 1), max_attempts=_int(data, "max_attempts", 1),
                   workflow_run_id=str(data.get("workflow_run_id", "")), workflow=_str(data, "workflow"),
                   task_key=_str(data, "task_key"), name=_str(data, "name") or _str(data, "task_key"),
                   queue=_str(data, "queue"), input=obj("input"), run_input=obj("run_input"),
                   upstream=obj("upstream"), timeout_seconds=_opt_float(data, "timeout_seconds"),
                   lease_expires_at=_lease_end(data), lease_seconds=_opt_float(data, "lease_seconds"),
                   heartbeat_interval_seconds=interval if interval and interval > 0 else 10.0,
                   schedule=data["schedule"] if isinstance(data.get("schedule"), dict) else None, raw=data)


def _lease_end(data: dict[str, Any]) -> dt.datetime | None:
    """When a lease of ``lease_seconds`` (the server's answer: relative, so no clock of the
    server's is compared with this machine's) counted from now ends, by this machine's clock."""
    seconds = _opt_float(data, "lease_seconds")
    if seconds is None:
        return None
    return lease_end(seconds)


def lease_end(seconds: float) -> dt.datetime:
    """Now plus ``seconds`` (a lease the server answered), by this machine's clock, in UTC."""
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)  # dt.UTC is 3.11+


@dataclass(frozen=True)
class PollResult:
    """The answer of one poll: the tasks handed out (possibly none)."""

    tasks: list[WorkerTask]
    wait_seconds: float | None = None


@dataclass(frozen=True)
class FailResult:
    """The answer of a fail call: ``state`` ``ready`` (retried after ``retry_in_seconds``)
    or ``failed``."""

    state: str
    retry_in_seconds: float | None = None


@dataclass(frozen=True)
class WorkerInfo:
    """How a worker process names itself in each poll (``worker`` in docs/workers.md)."""

    id: str
    name: str | None = None
    host: str | None = None
    sdk: str | None = None
    concurrency: int | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        for key in ("name", "host", "sdk"):
            value = getattr(self, key)
            if value:
                out[key] = str(value)[:200]
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        return out
