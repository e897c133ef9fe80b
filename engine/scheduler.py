"""The scheduler: claim ready task runs and dispatch them through the outbox."""

from __future__ import annotations

import logging

from django.conf import settings

from engine.dispatch import INLINE_PUBLISH_RESERVATION_SECONDS, process_owner
from engine.relay import publish_dispatches
from engine.repositories import driver, runs, task_runs

log = logging.getLogger(__name__)


def schedule_once(*, limit: int | None = None, max_batches: int = 20) -> int:
    """Claim ready task runs oldest first, batch by batch, and publish each batch's
    outbox rows right after its commit (no extra broker hop through the relay
    actor; the relay's periodic drain is the safety net if this publish fails).
    Returns how many task runs were claimed. Must not run inside a transaction."""
    runs.admit_queued()  # runs queued behind a workflow's run limit whose turn has come: roots ready
    limit = limit or settings.FLOWFORGE_CLAIM_BATCH
    owner = process_owner("scheduler")
    # A claimed generation holds a dispatch lease until a worker starts it (then the
    # worker lease, FLOWFORGE_LEASE_SECONDS, takes over).
    dispatch_lease_seconds = settings.FLOWFORGE_DISPATCH_LEASE_SECONDS
    total = 0
    for _ in range(max_batches):
        # One statement (claim + outbox + events): its own transaction, one round trip.
        dispatches = driver.autocommit_retry(
            lambda: task_runs.claim_ready_many(
                limit=limit, lease_seconds=dispatch_lease_seconds, owner=owner,
                reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
            )
        )
        total += len(dispatches)
        publish_dispatches(dispatches, reserved=True)
        if len(dispatches) < limit:
            break
    return total
