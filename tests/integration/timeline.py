"""Read what the workers did from the event log: holding and running intervals of task
runs, their largest overlap, claims per fixed window, and start latencies.

Pure functions over ``(task_run_id, seq, kind, from_state, to_state, created_at)`` rows
(``event_rows`` reads them), so the arithmetic is unit-tested on hand-made timelines
(tests/unit/test_timeline.py) apart from the scenarios that use it.

Interval conventions (the brief's permit rule: a task run holds its permit while its
state is ``running``):

- a *hold* opens at an event that enters ``running`` from another state (``claimed``)
  and closes at the next event of the same task run that leaves ``running`` (succeeded,
  attempt_failed, attempt_timed_out, lease_expired, dispatch_expired, cancelled, ...).
  A killed attempt therefore holds until its ``lease_expired`` event.
- a *run* (handler executing) opens at ``started`` and closes at the same leaving event.

Intervals are half-open: at equal timestamps a close counts before an open (the next
claim reads the release's commit, so it cannot precede it; equal stamps are two
statements in the same microsecond).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from django.db import connection


class Event(NamedTuple):
    task_run_id: object
    seq: int
    kind: str
    from_state: str | None
    to_state: str | None
    created_at: dt.datetime


class Interval(NamedTuple):
    task_run_id: object
    start: dt.datetime
    end: dt.datetime | None  # None: still open when the events were read
    closed_by: str | None  # the kind of the event that closed it


def event_rows(*, run_ids: Sequence, task_keys: Sequence[str] | None = None) -> list[Event]:
    """Task-run events of these runs (optionally only of tasks with these keys), in each
    run's ``seq`` order. Run-level events (no task run) are left out."""
    sql = (
        "SELECT e.task_run_id, e.seq, e.kind, e.from_state, e.to_state, e.created_at "
        "FROM core_taskrunevent e JOIN core_taskrun t ON t.id = e.task_run_id "
        "JOIN core_task k ON k.id = t.task_id "
        "WHERE e.workflow_run_id = ANY(%s)"
    )
    params: list = [list(run_ids)]
    if task_keys is not None:
        sql += " AND k.key = ANY(%s)"
        params.append(list(task_keys))
    sql += " ORDER BY e.workflow_run_id, e.seq"
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [Event(*row) for row in cur.fetchall()]


def _leaves_running(e: Event) -> bool:
    return e.from_state == "running" and e.to_state != "running"


def holds(events: Iterable[Event]) -> list[Interval]:
    """Permit-holding intervals: entering ``running`` to leaving it, per task run."""
    return _intervals(events, opens=lambda e: e.to_state == "running" and e.from_state != "running")


def runs(events: Iterable[Event]) -> list[Interval]:
    """Executing intervals: ``started`` to leaving ``running``, per task run."""
    return _intervals(events, opens=lambda e: e.kind == "started")


def _intervals(events: Iterable[Event], *, opens) -> list[Interval]:
    by_task: dict[object, list[Event]] = {}
    for e in events:
        by_task.setdefault(e.task_run_id, []).append(e)
    out: list[Interval] = []
    for task_run_id, evs in by_task.items():
        evs.sort(key=lambda e: e.seq)
        start = None
        for e in evs:
            if start is None and opens(e):
                start = e.created_at
            elif start is not None and _leaves_running(e):
                out.append(Interval(task_run_id, start, e.created_at, e.kind))
                start = None
        if start is not None:
            out.append(Interval(task_run_id, start, None, None))
    return out


def max_overlap(intervals: Iterable[Interval]) -> tuple[int, dt.datetime | None]:
    """The largest number of intervals open at one instant, and the first instant it was
    reached (None for no intervals). Open-ended intervals count to the end."""
    points = []
    for i in intervals:
        points.append((i.start, 1))
        if i.end is not None:
            points.append((i.end, -1))
    points.sort(key=lambda p: (p[0], p[1]))  # -1 (close) before +1 (open) at one instant
    best, at, now = 0, None, 0
    for when, delta in points:
        now += delta
        if now > best:
            best, at = now, when
    return best, at


def epoch(ts: dt.datetime) -> float:
    return ts.timestamp()


def per_window(stamps: Iterable[dt.datetime], seconds: int) -> Counter:
    """Count of stamps per fixed window ``[k*seconds, (k+1)*seconds)`` of epoch time, keyed by k."""
    return Counter(math.floor(epoch(s) / seconds) for s in stamps)


def opened_windows(stamps: Iterable[dt.datetime], seconds: float) -> list[tuple[float, int]]:
    """The rate bucket's windows over claim ``stamps`` (engine/sql/task_runs.sql): a window
    opens at the first stamp after the last window closed and is open ``seconds``; returns
    (opened at, epoch seconds; stamps in it), in order."""
    windows: list[tuple[float, int]] = []
    for t in sorted(epoch(s) for s in stamps):
        if windows and t < windows[-1][0] + seconds:
            windows[-1] = (windows[-1][0], windows[-1][1] + 1)
        else:
            windows.append((t, 1))
    return windows


def seconds_between(a: dt.datetime, b: dt.datetime) -> float:
    return (b - a).total_seconds()
