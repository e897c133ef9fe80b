"""The outbox relay: publish unpublished OutboxMessages to the broker (seed 000).

A row is stamped ``published_at`` only after the broker accepted the message
(Redis answered, or RabbitMQ confirmed). Rows are locked with ``FOR UPDATE SKIP
LOCKED`` while being published, so several relays never publish the same row at
once; a crash between publish and stamp publishes the row again later, which the
worker's at-most-once start per generation absorbs.

Below the scheduler, the reaper and the worker, which publish what their claims wrote
through ``publish_dispatches``; above ``engine.dispatch``, which builds the messages.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence

import dramatiq
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction

from engine import sql
from engine.dispatch import dispatch_message, enqueue_many, nudge_scheduler
from engine.repositories import driver
from engine.states import TASK_FIRST_QUEUE
from flowforge.jsonb import strip_nul

log = logging.getLogger(__name__)

# Publish attempts before a row is dead-lettered (kept, replayable; see OutboxMessage).
MAX_PUBLISH_ATTEMPTS = 10
# Backoff of a failed publish: base * 2**(attempts-1) seconds, capped.
PUBLISH_BACKOFF_BASE_SECONDS = 0.5
PUBLISH_BACKOFF_MAX_SECONDS = 60.0

# The relay's statements, whole and by name, are in engine/sql/outbox.sql.
_Q = sql.queries


def group_rows[T](rows: Sequence[T], fanout: int) -> list[list[T]]:
    """Deal ``rows`` (oldest first) into the messages of one publish: one row per message
    while there are at most ``fanout`` rows, otherwise exactly ``fanout`` messages with
    rows dealt round-robin (message i takes rows i, i + fanout, ...), so each message
    holds the oldest rows not yet dealt and their sizes differ by at most one.

    A publish of a claim burst thus costs ``fanout`` broker messages instead of one per
    generation, and never fewer messages than ``fanout``: with ``fanout`` at least the
    number of worker threads, a burst still reaches every thread. ``fanout`` < 1 means
    one row per message. Returns the groups, none empty."""
    if fanout < 1 or len(rows) <= fanout:
        return [[row] for row in rows]
    return [list(rows[i::fanout]) for i in range(fanout)]


def _publish_rows(rows: list[tuple]) -> tuple[list[uuid.UUID], list[tuple[uuid.UUID, str]]]:
    """Publish (outbox_id, routing_key, payload) rows, oldest first, as execute messages
    (several generations per message when there are more rows than
    FLOWFORGE_DISPATCH_FANOUT: ``group_rows``), in one pipelined broker round trip;
    returns (published ids, [(failed id, error)]). A message the broker refused fails
    every row it carried."""
    # Grouped per queue (the bulk lane, TASK_QUEUE, and the first lane, TASK_FIRST_QUEUE).
    by_queue: dict[str, list[tuple[uuid.UUID, tuple[str, int]]]] = {}
    for outbox_id, routing_key, payload in rows:
        if isinstance(payload, str):  # Django's psycopg setup hands jsonb back as text
            payload = json.loads(payload)
        by_queue.setdefault(routing_key, []).append(
            (outbox_id, (str(payload["task_run_id"]), payload["fencing_token"]))
        )
    messages: list[dramatiq.Message] = []
    carried: list[list[uuid.UUID]] = []
    for queue_name, items in by_queue.items():
        # The first lane's messages carry one generation each (dispatch_message).
        fanout = 0 if queue_name == TASK_FIRST_QUEUE else settings.FLOWFORGE_DISPATCH_FANOUT
        for group in group_rows(items, fanout):
            carried.append([outbox_id for outbox_id, _pair in group])
            messages.append(dispatch_message([pair for _id, pair in group], queue_name))
    ok: list[uuid.UUID] = []
    failed: list[tuple[uuid.UUID, str]] = []
    for outbox_ids, error in zip(carried, enqueue_many(messages), strict=True):
        if error is None:
            ok.extend(outbox_ids)
            continue
        # Any broker error: keep the rows, retry later.
        log.warning("publishing outbox rows %s failed: %s", ", ".join(map(str, outbox_ids)), error)
        failed.extend((outbox_id, strip_nul(f"{type(error).__name__}: {error}")[:2000]) for outbox_id in outbox_ids)
    return ok, failed


def _stamp_params(ok: list[uuid.UUID], failed: list[tuple[uuid.UUID, str]]) -> dict:
    """The parameters of the stamp statements for a batch's outcome."""
    params: dict = {"ok": ok}
    if failed:
        params.update(
            failed=[f[0] for f in failed],
            errs=[f[1] for f in failed],
            cap=PUBLISH_BACKOFF_MAX_SECONDS,
            base=PUBLISH_BACKOFF_BASE_SECONDS,
            max=MAX_PUBLISH_ATTEMPTS,
        )
    return params


def _stamp_in_transaction(cur, ok: list[uuid.UUID], failed: list[tuple[uuid.UUID, str]]) -> None:
    """Record a batch's outcome inside the transaction ``cur`` is in (one statement per
    outcome present)."""
    params = _stamp_params(ok, failed)
    if ok:
        cur.execute(_Q["outbox_stamp_published"], params)
    if failed:
        cur.execute(_Q["outbox_stamp_failed"], params)


def _stamp_and_commit(cur, ok: list[uuid.UUID], failed: list[tuple[uuid.UUID, str]]) -> None:
    """Record a batch's outcome and commit the relay's own transaction: one round trip,
    two when some rows were published and others failed."""
    params = _stamp_params(ok, failed)
    if failed:
        if ok:
            cur.execute(_Q["outbox_stamp_published"], params)
        cur.execute(_Q["outbox_stamp_failed_commit"], params)
    else:
        cur.execute(_Q["outbox_stamp_published_commit"], params)


def publish_claimed(dispatches: Sequence) -> tuple[int, int]:
    """Publish the generations a claim just committed (``types.Dispatch``, claimed
    with ``reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS``), then stamp their rows.
    Returns (published, failed).

    The claim reserved its outbox rows for this publish, so the relay's drain does not
    take them meanwhile, and the messages are built from what the claim returned: no
    read of the outbox and no row lock, one broker round trip and one database round
    trip (the stamp, committed without waiting for a WAL flush: a stamp lost in a crash
    only publishes the row again, and a worker starts each generation at most once).
    A row whose publish failed gets the relay's retry bookkeeping (backoff, dead letter);
    if this caller dies before publishing, the drain sends the row once the reservation
    has passed.
    """
    rows = [
        (d.outbox_id, d.queue, {"task_run_id": d.task_run_id, "fencing_token": d.fencing_token})
        for d in dispatches
        if d.outbox_id is not None
    ]
    if not rows:
        return (0, 0)
    ok, failed = _publish_rows(rows)
    if connection.in_atomic_block or not connection.get_autocommit() or failed:
        # Inside a caller's transaction, or the rare failed publish (a plain transaction).
        with transaction.atomic(), connection.cursor() as cur:
            _stamp_in_transaction(cur, ok, failed)
    else:
        with connection.cursor() as cur:
            cur.execute(_Q["outbox_stamp_published_async"], _stamp_params(ok, failed))
    return (len(ok), len(failed))


def relay_batch(*, limit: int, outbox_ids: Sequence[uuid.UUID] | None = None) -> tuple[int, int]:
    """Publish up to ``limit`` deliverable outbox rows (only ``outbox_ids`` when given),
    oldest first, in one transaction. Returns (published, failed).

    The rows stay locked (``FOR UPDATE SKIP LOCKED``) from before the publish until their
    stamp commits. The batch is published in one pipelined broker round trip, and the
    transaction takes two database round trips: ``BEGIN; SELECT ... FOR UPDATE`` and
    ``UPDATE ...; COMMIT`` (inside a caller's transaction, the same statements run in it).
    A failed publish records the error and schedules the next try with exponential
    backoff; after MAX_PUBLISH_ATTEMPTS the row is dead-lettered.
    """
    params: dict = {"limit": limit}
    among = outbox_ids is not None
    if among:
        if not outbox_ids:
            return (0, 0)
        params["ids"] = list(outbox_ids)
    if connection.in_atomic_block or not connection.get_autocommit():
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(_Q["outbox_get_pending_among" if among else "outbox_get_pending"], params)
                rows = cur.fetchall()
                if not rows:
                    return (0, 0)
                ok, failed = _publish_rows(rows)
                _stamp_in_transaction(cur, ok, failed)
        return (len(ok), len(failed))
    with connection.cursor() as cur:
        # Autocommit mode: an explicit transaction that spans the publish, in two round trips.
        try:
            # The stamp need not survive a crash: a row stamped but lost is published
            # again, and a worker starts each generation at most once. So no WAL flush
            # is waited for (the claim that wrote the row was flushed).
            cur.execute(_Q["outbox_begin_get_pending_among" if among else "outbox_begin_get_pending"], params)
            cur.nextset()  # past BEGIN and SET LOCAL to the SELECT's rows
            cur.nextset()
            rows = cur.fetchall()
            if not rows:
                cur.execute("COMMIT")
                return (0, 0)
            ok, failed = _publish_rows(rows)
            _stamp_and_commit(cur, ok, failed)
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except Exception:  # the connection is gone: the server rolled back already
                log.debug("ROLLBACK after a failed relay batch failed", exc_info=True)
            raise
    return (len(ok), len(failed))


def publish_dispatches(dispatches: Sequence, *, reserved: bool = False) -> bool:
    """Publish the outbox rows of freshly claimed generations (``types.Dispatch``,
    after their claim committed): the scheduler's claims, the dependents a worker's
    completion claimed, the retries a reaper's expiry claimed.

    ``reserved``: the claim reserved the rows for this publish (``reserve_seconds``), so
    they are published straight from the claim's result; otherwise they are taken
    through the relay (locked, read, published, stamped).
    Returns False when the publish or the stamp failed (logged, never raised: the rows
    stay unpublished and the relay's drain sends them)."""
    ids = [d.outbox_id for d in dispatches if d.outbox_id is not None]
    published = True
    if ids:
        try:
            if reserved:
                publish_claimed(dispatches)
            else:
                relay_batch(limit=len(ids), outbox_ids=ids)
        except Exception:
            # The rows are committed and unpublished: the relay's periodic drain sends them.
            log.exception("inline publish of %d outbox rows failed; the relay will retry", len(ids))
            published = False
    if any(getattr(d, "rate_limited", False) for d in dispatches):
        # Whoever claimed into a rate window (a start, a worker's completion or refill, the
        # scheduler) has the claim at its next half made on time, not at the clock's tick.
        try:
            nudge_at_next_rate_window()
        except Exception:  # noqa: BLE001 - the clock's next tick claims them
            log.warning("could not look up the next rate window; the clock's tick claims", exc_info=True)
    return published


def relay_pending(*, limit: int | None = None, max_batches: int = 50) -> int:
    """Drain deliverable outbox rows in batches until none is left (or a batch fails).
    Returns how many were published."""
    limit = limit or settings.FLOWFORGE_RELAY_BATCH
    total = 0
    for _ in range(max_batches):
        published, failed = relay_batch(limit=limit)
        total += published
        if failed or published < limit:
            break
    return total


def nudge_at_next_rate_window() -> float | None:
    """When ready task runs of the shared workers wait on an open rate-limit window, send
    one schedule_tick for the moment the first such window reaches its second half or
    closes, whichever is next (``rate_limit_next_window_close``: a window's first half
    admits half its limit), so its bucket's next claims are made then and not at the
    clock's next tick: 100 tasks at 10 per second take 20 half windows, not 20 clock
    periods. Called after each scheduler pass and after any claim into a rate window
    (``publish_dispatches``). One nudge per instant across every process (a Redis key);
    returns the delay in seconds, or None when none was sent. Raises what the database
    read raises."""
    rows = driver.fetch(sql.queries["rate_limit_next_window_close"], {})
    closes, seconds = rows[0] if rows else (None, None)
    if seconds is None or seconds <= 0:
        return None
    try:
        if not cache.add(f"flowforge:rate-window-nudge:{closes:.3f}", 1, timeout=int(seconds) + 2):
            return None  # another scheduler already sent this one
        nudge_scheduler(delay_ms=int(seconds * 1000) + 5)
    except Exception:  # noqa: BLE001 - the clock's next tick claims them anyway
        log.warning("could not schedule the claim at the next rate window; the clock's tick claims")
        return None
    return seconds
