"""The outbox relay: publish unpublished OutboxMessages to the broker (seed 000).

A row is stamped ``published_at`` only after the broker accepted the message
(Redis answered, or RabbitMQ confirmed). Rows are locked with ``FOR UPDATE SKIP
LOCKED`` while being published, so several relays never publish the same row at
once; a crash between publish and stamp publishes the row again later, which the
worker's at-most-once start per generation absorbs.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence

import dramatiq
from django.conf import settings
from django.db import connection, transaction

from engine.jsonb import strip_nul

log = logging.getLogger(__name__)

# Publish attempts before a row is dead-lettered (kept, replayable; see OutboxMessage).
MAX_PUBLISH_ATTEMPTS = 10
# Backoff of a failed publish: base * 2**(attempts-1) seconds, capped.
PUBLISH_BACKOFF_BASE_SECONDS = 0.5
PUBLISH_BACKOFF_MAX_SECONDS = 60.0

_PENDING_SQL = """
SELECT id, routing_key, payload FROM core_outboxmessage
WHERE published_at IS NULL AND dead_lettered_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
  {id_filter}
ORDER BY created_at                          -- idx_outbox_pending (partial: published_at IS NULL)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""


def _publish(broker: dramatiq.Broker, routing_key: str, payload: dict | str) -> None:
    if isinstance(payload, str):  # Django's psycopg setup hands jsonb back as text
        payload = json.loads(payload)
    actor = broker.get_actor("execute_task_run")
    message = actor.message_with_options(
        args=(payload["task_run_id"], payload["fencing_token"]),
        queue_name=routing_key,
    )
    broker.enqueue(message)


def relay_batch(*, limit: int, outbox_ids: Sequence[uuid.UUID] | None = None) -> tuple[int, int]:
    """Publish up to ``limit`` deliverable outbox rows (only ``outbox_ids`` when given),
    oldest first, in one transaction. Returns (published, failed).

    A failed publish records the error and schedules the next try with exponential
    backoff; after MAX_PUBLISH_ATTEMPTS the row is dead-lettered.
    """
    from engine import actors  # noqa: F401  (declares execute_task_run on the broker)

    broker = dramatiq.get_broker()
    params: dict = {"limit": limit}
    id_filter = ""
    if outbox_ids is not None:
        if not outbox_ids:
            return (0, 0)
        id_filter = "AND id = ANY(%(ids)s)"
        params["ids"] = list(outbox_ids)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(_PENDING_SQL.format(id_filter=id_filter), params)
            rows = cur.fetchall()
            if not rows:
                return (0, 0)
            ok: list[uuid.UUID] = []
            failed: list[tuple[uuid.UUID, str]] = []
            for outbox_id, routing_key, payload in rows:
                try:
                    _publish(broker, routing_key, payload)
                    ok.append(outbox_id)
                except Exception as exc:  # any broker error: keep the row, retry later
                    log.warning("publishing outbox row %s failed: %s", outbox_id, exc)
                    failed.append((outbox_id, strip_nul(f"{type(exc).__name__}: {exc}")[:2000]))
            if ok:
                cur.execute(
                    "UPDATE core_outboxmessage SET published_at = clock_timestamp(), "
                    "publish_attempts = publish_attempts + 1 WHERE id = ANY(%s)",
                    [ok],
                )
            if failed:
                cur.execute(
                    """
                    UPDATE core_outboxmessage o
                    SET publish_attempts = o.publish_attempts + 1, last_error = f.err,
                        next_attempt_at = clock_timestamp() + make_interval(
                            secs => LEAST(%(cap)s, %(base)s * power(2, o.publish_attempts))),
                        dead_lettered_at = CASE WHEN o.publish_attempts + 1 >= %(max)s
                                                THEN clock_timestamp() ELSE NULL END
                    FROM unnest(%(ids)s::uuid[], %(errs)s::text[]) AS f(id, err)
                    WHERE o.id = f.id
                    """,
                    {
                        "ids": [f[0] for f in failed],
                        "errs": [f[1] for f in failed],
                        "cap": PUBLISH_BACKOFF_MAX_SECONDS,
                        "base": PUBLISH_BACKOFF_BASE_SECONDS,
                        "max": MAX_PUBLISH_ATTEMPTS,
                    },
                )
    return (len(ok), len(failed))


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
