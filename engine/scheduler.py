"""The scheduler: claim ready task runs fairly and dispatch them through the outbox."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from engine import metrics
from engine.dispatch import INLINE_PUBLISH_RESERVATION_SECONDS, process_owner
from engine.relay import nudge_at_next_rate_window, publish_dispatches
from engine.repositories import driver, runs, task_runs, waiting
from engine.repositories.types import Dispatch

log = logging.getLogger(__name__)


def observe_claim_waits(dispatches: list[Dispatch]) -> None:
    """Record each claimed generation's wait (ready to claimed, in seconds) in the
    ``flowforge_claim_wait_seconds`` histogram."""
    for d in dispatches:
        if d.waited_seconds is not None:
            metrics.observe("flowforge_claim_wait_seconds", max(0.0, d.waited_seconds))


def schedule_once(*, limit: int | None = None, max_batches: int = 20) -> int:
    """Claim ready task runs fairly (``task_runs.claim_ready_many``: weighted round robin
    between organizations, each within its room, permits and rate buckets), batch by
    batch, and publish each batch's outbox rows right after its commit (no extra broker
    hop through the relay actor; the relay's periodic drain is the safety net if this
    publish fails). Organizations with ready work are taken CLAIM_ORGS_PER_PASS at a time
    in id order, so every one of them is visited in one call however many there are.
    Returns how many task runs were claimed. Must not run inside a transaction."""
    runs.admit_queued()  # runs queued behind a workflow's run limit whose turn has come: roots ready
    limit = limit or settings.FLOWFORGE_CLAIM_BATCH
    owner = process_owner("scheduler")
    # A claimed generation holds a dispatch lease until a worker starts it (then the
    # worker lease, FLOWFORGE_LEASE_SECONDS, takes over).
    dispatch_lease_seconds = settings.FLOWFORGE_DISPATCH_LEASE_SECONDS
    total = 0
    after = None
    batches = 0
    while batches < max_batches:
        orgs = driver.autocommit_retry(lambda a=after: task_runs.ready_organizations_after(a))
        if not orgs:
            break
        for _ in range(max_batches - batches):
            batches += 1
            # Locks + claim + outbox + events: one transaction.
            dispatches = driver.autocommit_retry(
                lambda o=orgs: task_runs.claim_ready_many(
                    limit=limit, lease_seconds=dispatch_lease_seconds, owner=owner, organizations=o,
                    reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
                )
            )
            total += len(dispatches)
            publish_dispatches(dispatches, reserved=True)
            observe_claim_waits(dispatches)
            if len(dispatches) < limit:
                break
        if len(orgs) < task_runs.CLAIM_ORGS_PER_PASS:
            break
        after = max(orgs)
    nudge_at_next_rate_window()
    return total


# When this process last wrote the wait reasons (time.monotonic()); at most once a second.
_last_noted = 0.0
NOTE_WAITING_EVERY_SECONDS = 1.0
# Held while this process writes them: a call that finds it taken skips, so slow calls under
# load never pile up on the worker threads (the soak saw 16 at once, each slowing the others).
_noting = threading.Lock()


def note_waiting_if_due() -> int:
    """Record why ready task runs wait (``waiting.note_waiting``: ``wait_reason`` and a
    'waiting' event per change), at most once per NOTE_WAITING_EVERY_SECONDS in this
    process whatever the number of ticks and nudges, and never in two of its threads at
    once (a call finding one at it skips). Returns how many changed."""
    global _last_noted
    now = time.monotonic()
    if now - _last_noted < NOTE_WAITING_EVERY_SECONDS:
        return 0
    if not _noting.acquire(blocking=False):
        return 0  # another thread of this process is writing them now
    try:
        _last_noted = now
        return driver.autocommit_retry(waiting.note_waiting)
    finally:
        _noting.release()
