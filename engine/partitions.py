"""The history tables' partition manager (issue 21; docs/retention.md, "Partitioned history").

``core_taskrunevent`` and ``core_tasklog`` are range-partitioned on ``run_created_at``, the
creation instant of the run a row belongs to (migration 0033), one partition per period of
FLOWFORGE_HISTORY_PARTITION_SECONDS (a day), aligned to the Unix epoch. The clock's
housekeeping calls ``maintain``:

- ``ensure_ahead`` creates the partitions of the current period and of the next
  FLOWFORGE_HISTORY_PARTITIONS_AHEAD periods wherever none covers them, each cut short at
  the next existing one (so a changed period never overlaps an existing partition, and a
  period one pass could not create is created by the next, not left as a gap). There is no DEFAULT partition: a
  run created where no partition exists could not write its first event, so its start fails
  rather than putting rows where no drop can reach them (seed 001). Several managers may run
  at once (every clock replica, ``manage.py``): a creation another one won is reported by
  neither as its own.
- ``drop_expired`` drops the partitions of periods older than the longest retention in
  force (``drop_horizon``) in which no run is kept any more. The retention purge
  (engine.retention) leaves the events and log lines of runs created before that horizon to
  this drop instead of deleting them row by row.

Partitions are made and removed through the migration's SECURITY DEFINER functions, so the
application's role needs no ownership of the tables.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.conf import settings
from django.db import connection, transaction

from engine import sql

log = logging.getLogger(__name__)

#: The partitioned history tables (migration 0033).
PARENTS = ("core_taskrunevent", "core_tasklog")


@dataclasses.dataclass(frozen=True)
class Partition:
    """One partition: its parent table, its name and its period [lo, hi) of run creation."""

    parent: str
    name: str
    lo: dt.datetime
    hi: dt.datetime


@dataclasses.dataclass
class MaintainResult:
    """The partitions one ``maintain`` pass created and dropped (names)."""

    created: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)


def period_seconds() -> int:
    """FLOWFORGE_HISTORY_PARTITION_SECONDS: the span of run creation one partition holds."""
    return int(settings.FLOWFORGE_HISTORY_PARTITION_SECONDS)


def floor(at: dt.datetime, period: int | None = None) -> dt.datetime:
    """The start (UTC) of the period of ``period`` seconds (default: the setting) holding ``at``."""
    period = period or period_seconds()
    epoch = int(at.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % period, tz=dt.UTC)


def partitions() -> list[Partition]:
    """Every partition of the history tables, by parent then period."""
    with connection.cursor() as cur:
        cur.execute(sql.queries["history_partitions"])
        return [Partition(*row) for row in cur.fetchall()]


def create(parent: str, lo: dt.datetime, hi: dt.datetime) -> str | None:
    """Create ``parent``'s partition for runs created in [lo, hi). Returns its name, or None
    when another manager created it (or one overlapping it) first. Raises the database's
    error for a parent that is not a history table or an empty period."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.queries["history_partition_create"], {"parent": parent, "lo": lo, "hi": hi})
        return cur.fetchone()[0]


def ensure_range(lo: dt.datetime, hi: dt.datetime) -> list[str]:
    """Make sure runs created in [lo, hi) have partitions in both tables: one partition per
    gap between existing ones (not one per period: this is for history older than the
    manager, such as a test's runs made to look old). Returns the names created."""
    created = []
    for parent in PARENTS:
        cursor = lo
        for part in [p for p in partitions() if p.parent == parent and p.hi > lo and p.lo < hi]:
            if part.lo > cursor:
                name = create(parent, cursor, part.lo)
                created += [name] if name else []
            cursor = max(cursor, part.hi)
        if cursor < hi:
            name = create(parent, cursor, hi)
            created += [name] if name else []
    return created


def ensure_ahead(*, now: dt.datetime | None = None) -> list[str]:
    """Make sure the period holding ``now`` (default: the database's clock) and the
    FLOWFORGE_HISTORY_PARTITIONS_AHEAD periods after it have partitions in both tables:
    every stretch of that range no partition covers, and that does not end by ``now``, gets
    one per period (cut short at the next existing partition). So a period a pass could not
    create (its parent's lock not had in time, or its name taken by something else) is
    created by a later pass, not left as a gap after which the range continued; and a stretch
    already over (before the first partition, after the period setting was raised) is left
    alone: no run can be created in it any more, and its partition would be dropped again.
    Returns the names this call created (not those a concurrent manager did); a stretch still
    uncovered after the pass is logged as an error (a run created in it could not start).
    One read of the partition catalog for a pass with nothing to do, two otherwise."""
    period = period_seconds()
    now = now or _db_now()
    start = floor(now, period)
    end = start + dt.timedelta(seconds=period * (int(settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD) + 1))
    existing = partitions()
    created = []
    for parent in PARENTS:
        for lo, hi in _uncovered(existing, parent, start, end, now, period):
            name = create(parent, lo, hi)
            if name:
                created.append(name)
    if created:
        log.info("history partitions: created %s", ", ".join(created))
    if created or any(_uncovered(existing, parent, start, end, now, period) for parent in PARENTS):
        existing = partitions()
    for parent in PARENTS:
        for lo, hi in _uncovered(existing, parent, start, end, now, period):
            log.error("history partitions: %s has no partition for runs created in [%s, %s) after this pass; the "
                      "next pass tries again (a name taken by another object, or the table's lock not had)",
                      parent, lo.isoformat(), hi.isoformat())
    return created


def _uncovered(existing: list[Partition], parent: str, start: dt.datetime, end: dt.datetime, now: dt.datetime,
               period: int) -> list[tuple[dt.datetime, dt.datetime]]:
    """The periods [lo, hi) of [start, end) that no partition of ``parent`` in ``existing``
    covers and that end after ``now``: one per period of the grid, each cut short where an
    existing partition begins."""
    mine = sorted((p for p in existing if p.parent == parent and p.hi > start and p.lo < end), key=lambda p: p.lo)
    gaps = []
    lo = start
    while lo < end:
        covering = next((p for p in mine if p.lo <= lo < p.hi), None)
        if covering is not None:
            lo = covering.hi
            continue
        hi = floor(lo, period) + dt.timedelta(seconds=period)  # back onto the grid after a changed period
        hi = min([hi, *(p.lo for p in mine if p.lo > lo)])
        if hi > now:
            gaps.append((lo, hi))
        lo = hi
    return gaps


def drop_horizon(*, now: dt.datetime | None = None) -> dt.datetime | None:
    """The instant before which no run can be kept by any retention in force: the upper end
    of the newest partition (of both tables) entirely older than now minus the longest
    retention. None while some organization, or the deployment's default, keeps runs
    forever, or no partition is that old. A run created before it is removed by the purge
    without its events and log lines, which go with their partition."""
    now = now or _db_now()
    with connection.cursor() as cur:
        cur.execute(sql.queries["history_retention_longest"],
                    {"default_seconds": float(settings.FLOWFORGE_RUN_RETENTION_SECONDS)})
        forever, longest = cur.fetchone()
    if forever:
        return None
    cutoff = now - dt.timedelta(seconds=float(longest))
    ends = {}
    for part in partitions():
        if part.hi <= cutoff:
            ends[part.parent] = max(ends.get(part.parent, part.hi), part.hi)
    if set(ends) != set(PARENTS):
        return None
    return min(ends.values())


def drop_expired(*, now: dt.datetime | None = None) -> list[str]:
    """Drop the partitions (of both tables) that end at or before ``drop_horizon`` and hold
    no kept run's history. Returns the names dropped; a partition whose runs are not all
    gone yet, or whose parent was busy for 200 ms, is left to a later pass."""
    horizon = drop_horizon(now=now)
    if horizon is None:
        return []
    dropped = []
    for part in partitions():
        if part.hi <= horizon:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(sql.queries["history_partition_drop"], {"part": part.name})
                if cur.fetchone()[0]:
                    dropped.append(part.name)
    if dropped:
        log.info("history partitions: dropped %s", ", ".join(dropped))
    return dropped


def maintain() -> MaintainResult:
    """One housekeeping pass: create ahead, then drop what expired."""
    return MaintainResult(created=ensure_ahead(), dropped=drop_expired())


def _db_now() -> dt.datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        return cur.fetchone()[0]
