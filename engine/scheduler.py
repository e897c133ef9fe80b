"""The scheduler: claim ready task runs and dispatch them through the outbox."""

from __future__ import annotations

import logging
import os
import socket

from django.conf import settings

from engine.relay import INLINE_PUBLISH_RESERVATION_SECONDS, publish_claimed, relay_batch
from engine.repositories import transitions

log = logging.getLogger(__name__)


_HOSTNAME = socket.gethostname()


def process_owner(role: str) -> str:
    """A lease owner string: role@host:pid (recorded on the row and in events)."""
    return f"{role}@{_HOSTNAME}:{os.getpid()}"


def schedule_once(*, limit: int | None = None, max_batches: int = 20) -> int:
    """Claim ready task runs oldest first, batch by batch, and publish each batch's
    outbox rows right after its commit (no extra broker hop through the relay
    actor; the relay's periodic drain is the safety net if this publish fails).
    Returns how many task runs were claimed. Must not run inside a transaction."""
    limit = limit or settings.FLOWFORGE_CLAIM_BATCH
    owner = process_owner("scheduler")
    total = 0
    for _ in range(max_batches):
        # One statement (claim + outbox + events): its own transaction, one round trip.
        dispatches = transitions.autocommit_retry(
            lambda: transitions.claim_ready(
                limit=limit, lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS, owner=owner,
                reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
            )
        )
        total += len(dispatches)
        publish_dispatches(dispatches, reserved=True)
        if len(dispatches) < limit:
            break
    return total


def publish_dispatches(dispatches, *, reserved: bool = False) -> bool:
    """Publish the outbox rows of freshly claimed generations (after their commit).

    ``reserved``: the claim reserved the rows for this publish (``reserve_seconds``), so
    they are published straight from the claim's result; otherwise they are taken
    through the relay (locked, read, published, stamped).
    Returns False when the publish or the stamp failed (logged; the rows stay
    unpublished and the relay's drain sends them)."""
    ids = [d.outbox_id for d in dispatches if d.outbox_id is not None]
    if ids:
        try:
            if reserved:
                publish_claimed(dispatches)
            else:
                relay_batch(limit=len(ids), outbox_ids=ids)
        except Exception:
            # The rows are committed and unpublished: the relay's periodic drain sends them.
            log.exception("inline publish of %d outbox rows failed; the relay will retry", len(ids))
            return False
    return True
