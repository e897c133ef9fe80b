"""Run retention (issue 21; docs/retention.md): the database keeps a bounded history.

- **Finished runs** (succeeded, failed, cancelled) whose creation and end are both older
  than their organization's retention — ``Organization.run_retention_days`` (staff, in the
  admin), else FLOWFORGE_RUN_RETENTION_DAYS (30), 0 keeping them forever — are removed with
  everything they own, FLOWFORGE_RETENTION_BATCH_RUNS runs per transaction
  (``run_purge_many``, one statement), at most FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS per
  pass, paced: after each batch it waits FLOWFORGE_RETENTION_PAUSE_FACTOR (4) times as long
  as the batch took, so a backlog never takes the engine's share of the database. Each batch removes its runs' offloaded files first (``engine.offload``), then the
  rows: a crash in between leaves rows whose files are gone (their runs were about to go),
  never files no row points at.
- **Published outbox rows** go FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS (an hour) after
  publishing, not with their run (``outbox_purge_published``).

The clock's housekeeping runs ``purge`` every few minutes; ``manage.py purge_runs
[--preview]`` runs it now. Running runs, and runs a person is resuming (locked: SKIP
LOCKED), are never touched; the statements hold row locks only on the runs they remove and
their children, which the hot path (ready and running work) never waits for.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time

from django.conf import settings
from django.db import connection, transaction

from engine import offload, partitions, sql

log = logging.getLogger(__name__)

#: The longest wait between two batches (FLOWFORGE_RETENTION_PAUSE_FACTOR x the batch's time).
MAX_PAUSE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class OrganizationBacklog:
    """Runs of one organization past its retention: how many, and the oldest one's creation."""

    organization_id: str
    slug: str
    retention_seconds: float
    runs: int
    oldest: dt.datetime


@dataclasses.dataclass
class PurgeResult:
    """What one ``purge`` removed: runs, offloaded files and published outbox rows."""

    runs: int = 0
    files: int = 0
    outbox_rows: int = 0
    #: History partitions dropped after the runs (engine.partitions.drop_expired).
    partitions: list[str] = dataclasses.field(default_factory=list)


def default_seconds() -> float:
    """The deployment's run retention in seconds: FLOWFORGE_RUN_RETENTION_SECONDS when set (a
    soak or a test keeps minutes), else FLOWFORGE_RUN_RETENTION_DAYS × 86,400. 0 keeps runs
    forever unless an organization says otherwise."""
    return float(settings.FLOWFORGE_RUN_RETENTION_SECONDS)


def describe(seconds: float) -> str:
    """A retention for people: "30 days" when it is whole days, else "300 seconds"."""
    if seconds and seconds % 86400 == 0:
        days = int(seconds // 86400)
        return f"{days} day" if days == 1 else f"{days} days"
    return f"{seconds:g} seconds"


def backlog() -> list[OrganizationBacklog]:
    """Each organization with finished runs past its retention (the purge's preview and lag)."""
    with connection.cursor() as cur:
        cur.execute(sql.queries["run_retention_counts"], {"default_seconds": default_seconds()})
        return [OrganizationBacklog(str(i), slug, float(secs), n, oldest) for i, slug, secs, n, oldest in cur.fetchall()]


def purge(*, max_runs: int | None = None, batch_runs: int | None = None) -> PurgeResult:
    """Remove finished runs past their retention (at most ``max_runs``, in batches of
    ``batch_runs``) and published outbox rows past FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS.
    Returns the counts. Each batch is its own transaction; an error in one is raised after
    the batches before it committed."""
    max_runs = settings.FLOWFORGE_RETENTION_MAX_RUNS_PER_PASS if max_runs is None else max_runs
    batch_runs = settings.FLOWFORGE_RETENTION_BATCH_RUNS if batch_runs is None else batch_runs
    if max_runs < 1 or batch_runs < 1:
        raise ValueError("max_runs and batch_runs must be at least 1")
    result = PurgeResult()
    horizon = partitions.drop_horizon()
    pause_factor = float(settings.FLOWFORGE_RETENTION_PAUSE_FACTOR)
    while result.runs < max_runs:
        want = min(batch_runs, max_runs - result.runs)
        began = time.monotonic()
        removed, files = _purge_batch(want, horizon)
        result.runs += removed
        result.files += files
        if removed < want:
            break
        if pause_factor > 0 and result.runs < max_runs:
            # Paced: the purge takes at most 1 / (1 + factor) of one connection's time.
            time.sleep(min((time.monotonic() - began) * pause_factor, MAX_PAUSE_SECONDS))
    result.outbox_rows = purge_published_outbox()
    result.partitions = partitions.drop_expired()
    if result.runs or result.outbox_rows:
        log.info("retention: removed %s runs (%s offloaded files) and %s published outbox rows",
                 result.runs, result.files, result.outbox_rows)
    return result


def _purge_batch(limit: int, horizon: dt.datetime | None) -> tuple[int, int]:
    with connection.cursor() as cur:
        cur.execute(sql.queries["run_retention_candidates"],
                    {"default_seconds": default_seconds(), "per_org": limit, "limit": limit})
        run_ids = [r[0] for r in cur.fetchall()]
    if not run_ids:
        return 0, 0
    return purge_runs(run_ids, horizon=horizon)


def purge_runs(run_ids: list, *, horizon: dt.datetime | None = None) -> tuple[int, int]:
    """Remove the finished runs among ``run_ids`` now, whatever their age (the purge's
    batch; tests), with everything they own — except the events and log lines of runs
    created before ``horizon`` (engine.partitions.drop_horizon), which their partition's
    drop removes. Returns (runs removed, files removed). A run not finished, or locked by
    another transaction, is left."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(sql.queries["run_lock_finished"], {"run_ids": run_ids})
            run_ids = [r[0] for r in cur.fetchall()]
            if not run_ids:
                return 0, 0
            cur.execute(sql.queries["run_payload_keys"], {"run_ids": run_ids})
            payloads = [(str(i), key) for i, key in cur.fetchall()]
        files = offload.delete_payloads(payloads) if payloads else 0
        with connection.cursor() as cur:
            cur.execute(sql.queries["run_purge_many"], {"run_ids": run_ids, "horizon": horizon})
            removed = len(cur.fetchall())
    return removed, files


def purge_published_outbox(*, limit: int = 10_000) -> int:
    """Remove up to ``limit`` outbox rows published more than
    FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS ago. Returns how many."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql.queries["outbox_purge_published"],
                    {"keep_seconds": settings.FLOWFORGE_OUTBOX_KEEP_PUBLISHED_SECONDS, "limit": limit})
        return len(cur.fetchall())
