"""Writes of the notifications' outbox (core_notificationdelivery and its attempts, issue 19):
claim, record, give back, expire. Statements: ``engine/sql/notifications.sql``.

The rows are written by the ``ff_notification_record`` trigger (migration 0028) in the
transaction of the transition that caused them. A claim moves a delivery pending -> sending
with a lease and a bumped ``claim_token``; every later write of that attempt matches the
token, so a worker that outlived its lease (the attempt was expired and maybe claimed again)
changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from engine.repositories.driver import fetch
from engine.sql import queries


@dataclasses.dataclass(frozen=True)
class Backoff:
    """The retry schedule of failed attempts: attempt n (1-based) that failed is tried again
    after ``min(cap_seconds, base_seconds * 2**(n-1))`` seconds times a random factor of 0.5
    to 1 (jitter), while n < ``max_attempts``; after that the delivery is dead-lettered."""

    max_attempts: int
    base_seconds: float
    cap_seconds: float

    def params(self) -> dict[str, Any]:
        return {"max": self.max_attempts, "base": float(self.base_seconds), "cap": float(self.cap_seconds)}


@dataclasses.dataclass(frozen=True)
class ClaimedDelivery:
    """What sending one claimed delivery needs (``notification_delivery_get_claimed``).

    ``attempt`` is this attempt's number (1-based). For a webhook: ``endpoint_id``, ``url``
    and the secrets' ciphertexts (``previous_secret_ciphertext`` only while it still signs);
    for an email: ``recipient_email`` and ``recipient_is_member``."""

    id: uuid.UUID
    organization_id: uuid.UUID
    channel: str
    attempt: int
    event_id: uuid.UUID
    event_type: str
    payload: dict[str, Any]
    event_created_at: dt.datetime
    workflow_run_id: uuid.UUID
    workflow_name: str
    endpoint_id: uuid.UUID | None
    url: str | None
    secret_ciphertext: str | None
    previous_secret_ciphertext: str | None
    recipient_id: uuid.UUID | None
    recipient_email: str | None
    recipient_is_member: bool
    organization_name: str


@dataclasses.dataclass(frozen=True)
class AttemptOutcome:
    """The result of one attempt: ``ok`` (delivered), else ``retryable`` (a network error,
    a timeout, 408, 429 or 5xx; a lost mail server) or not (anything else: dead at once).
    ``status`` is the HTTP status (None without an answer), ``error`` what went wrong
    (empty when ok), ``excerpt`` the start of the answer's body (``truncated`` when cut),
    ``started_at`` and ``duration_ms`` when the attempt ran."""

    ok: bool
    retryable: bool
    started_at: dt.datetime
    duration_ms: int | None
    status: int | None = None
    error: str = ""
    excerpt: str = ""
    truncated: bool = False


def claim(*, limit: int, per_org: int, per_target: int, lease_seconds: float) -> list[tuple[uuid.UUID, int]]:
    """Claim the deliveries that are due, within the in-flight caps (``limit`` deployment-wide,
    ``per_org``, ``per_target``), round robin between organizations (``notification_delivery_claim``,
    after ``notification_claim_lock``, in a transaction of its own). Returns [(delivery id,
    claim token)]. Must not run inside a caller's transaction (it would hold the claim lock)."""
    with transaction.atomic():
        fetch(queries["notification_claim_lock"], {})
        rows = fetch(queries["notification_delivery_claim"], {
            "limit": int(limit), "per_org": int(per_org), "per_target": int(per_target),
            "lease": float(lease_seconds)})
    return [(row[0], int(row[1])) for row in rows]


def get_claimed(*, delivery_id: uuid.UUID, claim_token: int) -> ClaimedDelivery | None:
    """The claimed delivery with its event and target, or None when the claim is no longer
    current (recorded, expired or claimed again)."""
    rows = fetch(queries["notification_delivery_get_claimed"], {"id": delivery_id, "token": claim_token})
    if not rows:
        return None
    (d_id, org_id, channel, attempt, ev_id, ev_type, payload, ev_created, run_id, wf_name,
     endpoint_id, url, secret, previous, previous_valid, recipient_id, email, member, org_name) = rows[0]
    return ClaimedDelivery(
        id=d_id, organization_id=org_id, channel=channel, attempt=int(attempt), event_id=ev_id, event_type=ev_type,
        payload=json.loads(payload) if isinstance(payload, str) else payload, event_created_at=ev_created,
        workflow_run_id=run_id, workflow_name=wf_name, endpoint_id=endpoint_id, url=url, secret_ciphertext=secret,
        previous_secret_ciphertext=previous if previous and previous_valid else None, recipient_id=recipient_id,
        recipient_email=email, recipient_is_member=bool(member), organization_name=org_name,
    )


def record(*, delivery_id: uuid.UUID, claim_token: int, outcome: AttemptOutcome,
           backoff: Backoff) -> tuple[str, dt.datetime | None] | None:
    """Record one attempt's outcome and the delivery's next state (succeeded; pending again
    after the jittered backoff; or dead), with its attempt row, in one statement
    (``notification_delivery_record``). Returns (new state, next attempt time or None), or
    None when the claim is no longer current (nothing written)."""
    rows = fetch(queries["notification_delivery_record"], {
        "id": delivery_id, "token": claim_token, "ok": outcome.ok, "retryable": outcome.retryable,
        "status": outcome.status, "error": outcome.error, "excerpt": outcome.excerpt,
        "truncated": outcome.truncated, "started": outcome.started_at, "ms": outcome.duration_ms,
        **backoff.params(),
    })
    return (rows[0][0], rows[0][1]) if rows else None


def release(claims: Sequence[tuple[uuid.UUID, int]]) -> None:
    """Give back claimed deliveries whose message the broker refused (due now, the attempt
    not counted: ``notification_delivery_release``)."""
    if claims:
        fetch(queries["notification_delivery_release"],
              {"ids": [c[0] for c in claims], "tokens": [int(c[1]) for c in claims]})


def expire(*, limit: int, backoff: Backoff, error: str) -> list[uuid.UUID]:
    """Deliveries whose claim's lease expired before an outcome was recorded (the worker
    was lost) count that attempt as failed with ``error``: pending again after the
    backoff, or dead at the last attempt (``notification_delivery_expire``, up to
    ``limit``). Returns their ids."""
    rows = fetch(queries["notification_delivery_expire"], {"limit": int(limit), "error": error, **backoff.params()})
    return [row[0] for row in rows]
