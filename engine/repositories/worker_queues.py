"""Reads and writes of the organizations' own workers' queues that change no task run's
state (issue 18, docs/workers.md): the workers seen polling (core_workerconnection), when
a queue's next task is due, the scoping of a worker's call to its organization's worker
task runs, and the log lines workers send (core_tasklog); and what members read of them (the queues'
depth, the workers and whether each is live, the run page's log lines). Statements:
``engine/sql/worker_queues.sql``. The claim and the transitions are ``task_runs``'s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from engine.repositories.driver import fetch
from engine.sql import queries

#: Seconds between two writes of a polling worker's last_seen_at (an idle worker's long
#: polls would otherwise write a row each).
WORKER_SEEN_RESOLUTION_SECONDS = 10.0
#: Workers (rows of worker and queue) an organization's polls may record; past it a new
#: worker still polls, and is not listed until rows not seen for seven days are purged.
MAX_WORKERS_PER_ORGANIZATION = 1000


@dataclasses.dataclass(frozen=True)
class WorkerGeneration:
    """What a worker's call on one task run is judged by (``worker_task_run_generation``)."""

    task_run_id: uuid.UUID
    workflow_run_id: uuid.UUID
    state: str
    fencing_token: int
    started_fencing_token: int | None
    #: True while the lease has not expired (False once it has, or with no lease).
    lease_current: bool
    attempt: int
    has_dependents: bool
    config: dict[str, Any]
    queue: str

    def succeeded_as(self, token: int) -> bool:
        """Whether generation ``token`` is the one that completed the task run successfully
        (a completion carrying it again is a replay: a worker that lost the first answer)."""
        return self.state == "succeeded" and self.fencing_token == token and self.started_fencing_token == token

    def refusal(self, token: int) -> str | None:
        """Why a call carrying generation ``token`` is refused (a 409's code:
        ``cancelled``, ``lease_expired``, ``stale_fencing_token``), or None when the
        caller holds the generation: running, started as ``token`` and within its lease."""
        if self.state == "cancelled":
            return "cancelled"
        if self.state == "running" and self.fencing_token == token and self.started_fencing_token == token:
            return None if self.lease_current else "lease_expired"
        return "stale_fencing_token"


def note_worker_seen(
    *, organization_id: uuid.UUID, worker_id: str, queue: str, name: str, host: str, sdk: str,
    concurrency: int | None, api_key_id: uuid.UUID | None,
) -> None:
    """Record that worker ``worker_id`` polls ``queue`` (``worker_seen``: an upsert written
    at most every WORKER_SEEN_RESOLUTION_SECONDS unless what it says of itself changed; a
    new row only while the organization has fewer than MAX_WORKERS_PER_ORGANIZATION).
    Autocommit or the caller's transaction."""
    fetch(queries["worker_seen"], {
        "org": organization_id, "worker_id": worker_id, "queue": queue, "name": name, "host": host, "sdk": sdk,
        "concurrency": concurrency, "api_key": api_key_id, "resolution": WORKER_SEEN_RESOLUTION_SECONDS,
        "cap": MAX_WORKERS_PER_ORGANIZATION,
    })


def queue_known(*, organization_id: uuid.UUID, queue: str) -> bool:
    """Whether a task of the organization (any workflow version) waits on ``queue``
    (``worker_queue_known``)."""
    return bool(fetch(queries["worker_queue_known"], {"org": organization_id, "queue": queue})[0][0])


def workflow_names(run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The workflow name of each run of ``run_ids`` (``worker_run_workflow_names``)."""
    if not run_ids:
        return {}
    return dict(fetch(queries["worker_run_workflow_names"], {"runs": list(set(run_ids))}))


def seconds_until_due(*, organization_id: uuid.UUID, queue: str) -> float | None:
    """Seconds until the first ready task run of the queue may be claimed (<= 0: now, but a
    limit holds it back), or None when none is ready (``worker_queue_next_due``)."""
    rows = fetch(queries["worker_queue_next_due"], {"org": organization_id, "queue": queue})
    return rows[0][0] if rows and rows[0][0] is not None else None


def generation(*, organization_id: uuid.UUID, task_run_id: uuid.UUID) -> WorkerGeneration | None:
    """The WorkerGeneration of ``task_run_id`` when it is a worker task run of the
    organization; None otherwise (another organization's, a shared workers' task, or no
    such row: the caller answers 404 for all three alike)."""
    rows = fetch(queries["worker_task_run_generation"], {"id": task_run_id, "org": organization_id})
    if not rows:
        return None
    r = rows[0]
    config = json.loads(r[7]) if isinstance(r[7], str) else (r[7] or {})
    return WorkerGeneration(task_run_id, r[0], r[1], r[2], r[3], bool(r[4]), r[5], bool(r[6]), config, r[8])


def append_logs(
    *, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int, lines: Sequence[tuple[str, str]],
    max_lines: int, max_bytes: int, marker: str,
) -> int:
    """Append ``lines`` ((level, message) pairs, already validated and redacted) to the
    generation ``fencing_token`` of the task run, in order, only while that generation is
    started and its lease unexpired, and only while the generation's lines stay within
    ``max_lines`` lines and ``max_bytes`` bytes of messages: the first line past either is
    replaced by one ``system`` line saying ``marker``, and it and every later line are
    dropped (``task_log_append``). Returns how many of ``lines`` were kept: 0 when the
    caller no longer holds the generation, or its log is full."""
    if not lines:
        return 0
    rows = fetch(queries["task_log_append"], {
        "id": task_run_id, "org": organization_id, "token": fencing_token,
        "levels": [level for level, _ in lines], "messages": [message for _, message in lines],
        "max_lines": max_lines, "max_bytes": max_bytes, "marker": marker,
    })
    return sum(1 for (stream,) in rows if stream == "worker")


def put_attempt_secrets(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int,
                        values_encrypted: str) -> None:
    """Keep the secret values (encrypted by the caller) handed to generation
    ``fencing_token`` of the task run, replacing an earlier generation's
    (``attempt_secrets_put``)."""
    fetch(queries["attempt_secrets_put"], {"id": task_run_id, "org": organization_id, "token": fencing_token,
                                           "values": values_encrypted})


def attempt_secrets(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int) -> str | None:
    """The encrypted secret values handed to generation ``fencing_token`` of the task run,
    None when none were (``attempt_secrets_get``)."""
    rows = fetch(queries["attempt_secrets_get"], {"id": task_run_id, "org": organization_id, "token": fencing_token})
    return rows[0][0] if rows else None


@dataclasses.dataclass(frozen=True)
class QueueSummary:
    """One queue of an organization (``worker_queue_summary``): its ready task runs, the
    oldest one's ready_at (None when none is ready) and its age in seconds, its running
    task runs, and its live workers."""

    queue: str
    ready: int
    oldest_ready_at: dt.datetime | None
    oldest_ready_age_seconds: float | None
    running: int
    live_workers: int


def queue_summaries(
    *, organization_id: uuid.UUID, live_within_seconds: float, after: str = "", limit: int = 1000,
) -> list[QueueSummary]:
    """The organization's queues (named by a task of any workflow version, or polled by a
    worker) whose names sort after ``after`` ('' for the first), by name, at most
    ``limit``: each one's ready and running task runs, its oldest ready one, and its live
    workers (seen polling within ``live_within_seconds``, or holding a task run of the queue
    whose lease is current). One statement."""
    rows = fetch(queries["worker_queue_summary"], {
        "org": organization_id, "cutoff": live_within_seconds, "after": after, "limit": limit})
    return [QueueSummary(*r) for r in rows]


@dataclasses.dataclass(frozen=True)
class WorkerRow:
    """A worker process as seen on one queue (``worker_list``): what it said of itself in
    its last poll, when it first and last polled, how many running task runs of the queue
    it holds (``lease_owner`` ``worker:<worker_id>``), and whether it is live."""

    queue: str
    worker_id: str
    name: str
    host: str
    sdk: str
    concurrency: int | None
    first_seen_at: dt.datetime
    last_seen_at: dt.datetime
    tasks_held: int
    live: bool


def workers(
    *, organization_id: uuid.UUID, live_within_seconds: float, limit: int, queue: str | None = None,
    after: tuple[str, str] | None = None, live: bool | None = None, seen_within_seconds: float | None = None,
) -> list[WorkerRow]:
    """At most ``limit`` workers of the organization by (queue, worker_id), after
    ``after`` (a (queue, worker_id) pair; None for the first), of ``queue`` only unless
    None. ``live`` True keeps the live ones (seen polling within ``live_within_seconds``,
    or holding a task run of the queue whose lease is current), False the others, None
    both; ``seen_within_seconds`` drops the workers that are not live and were last seen
    longer ago. One statement."""
    rows = fetch(queries["worker_list"], {
        "org": organization_id, "cutoff": live_within_seconds, "limit": limit, "queue": queue,
        "after_queue": after[0] if after else None, "after_id": after[1] if after else None,
        "live": live, "seen_within": seen_within_seconds,
    })
    return [WorkerRow(*r) for r in rows]


def live_workers(*, organization_id: uuid.UUID, queues: Sequence[str], live_within_seconds: float) -> dict[str, int]:
    """``{queue: live workers}`` for each of ``queues`` (the organization's; live as
    ``workers`` says); {} without a statement when ``queues`` is empty."""
    if not queues:
        return {}
    rows = fetch(queries["worker_queue_live"], {
        "org": organization_id, "queues": sorted(set(queues)), "cutoff": live_within_seconds})
    return {queue: int(n) for queue, n in rows}


@dataclasses.dataclass(frozen=True)
class LogLine:
    """One log line a worker sent (core_tasklog)."""

    id: int
    attempt: int
    fencing_token: int
    level: str
    message: str
    created_at: dt.datetime


def run_log_tails(
    *, organization_id: uuid.UUID, run_id: uuid.UUID, tasks: int, lines: int,
) -> list[tuple[uuid.UUID, list[LogLine]]]:
    """The log lines the run page shows (``task_log_run_tail``): for at most ``tasks``
    worker task runs of the run that have lines (those with the newest lines first), the
    last ``lines`` lines of the generation that wrote the task run's newest line, oldest
    first. Returns [(task_run_id, lines)], in that order. One statement."""
    rows = fetch(queries["task_log_run_tail"], {"org": organization_id, "run": run_id, "tasks": tasks,
                                                "limit": lines})
    out: dict[uuid.UUID, list[LogLine]] = {}
    for task_run_id, *line in rows:
        out.setdefault(task_run_id, []).append(LogLine(*line))
    return list(out.items())
