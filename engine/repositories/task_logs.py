"""The attempts' log lines (core_tasklog, issue 19): what the shared workers write, and
what the task detail reads. Statements: ``engine/sql/task_logs.sql``. The lines the
organizations' own workers send, and the run page's worker log tails, are
``worker_queues``'s."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

from engine.repositories.driver import fetch
from engine.sql import queries


@dataclasses.dataclass(frozen=True)
class NewLine:
    """A line to write: the attempt it belongs to and what it says (already redacted and capped)."""

    organization_id: uuid.UUID
    workflow_run_id: uuid.UUID
    task_run_id: uuid.UUID
    attempt: int
    fencing_token: int
    stream: str
    level: str
    message: str
    at: dt.datetime


def append_many(lines: Sequence[NewLine]) -> int:
    """Write ``lines`` in one statement, in their order (``task_log_append_many``), in the
    caller's transaction or autocommit. Returns how many were written; no statement for none.
    Raises what the statement raises (e.g. IntegrityError for a task run that is gone)."""
    if not lines:
        return 0
    fetch(queries["task_log_append_many"], {
        "orgs": [x.organization_id for x in lines], "runs": [x.workflow_run_id for x in lines],
        "task_runs": [x.task_run_id for x in lines], "attempts": [x.attempt for x in lines],
        "tokens": [x.fencing_token for x in lines], "streams": [x.stream for x in lines],
        "levels": [x.level for x in lines], "messages": [x.message for x in lines], "ats": [x.at for x in lines],
    })
    return len(lines)


@dataclasses.dataclass(frozen=True)
class StoredLine:
    """A stored log line of one attempt."""

    id: int
    attempt: int
    stream: str
    level: str
    message: str
    created_at: dt.datetime


def attempt_tails(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, tokens: Sequence[int],
                  limit: int) -> dict[int, list[StoredLine]]:
    """The last ``limit`` lines of each generation in ``tokens`` of the organization's task
    run, oldest first, by fencing token (a generation without lines is absent). One
    statement (``task_log_attempt_tails``); none when ``tokens`` is empty."""
    if not tokens:
        return {}
    rows = fetch(queries["task_log_attempt_tails"], {"id": task_run_id, "org": organization_id,
                                                      "tokens": sorted(set(tokens)), "limit": limit})
    out: dict[int, list[StoredLine]] = {}
    for token, *line in rows:
        out.setdefault(token, []).append(StoredLine(*line))
    return out
