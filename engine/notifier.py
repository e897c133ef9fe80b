"""Delivering notifications (issue 19): the notifications' outbox, claimed and sent.

``tick`` (the ``notify_tick`` actor: the clock every FLOWFORGE_CLOCK_NOTIFY_SECONDS, a
replay's nudge, and each delivery when it ends) takes back claims whose lease expired
(``repositories.notifications.expire``), claims the due deliveries within the in-flight caps
and sends one ``deliver_notification`` message per claim to the notifications queue. The caps
(FLOWFORGE_NOTIFY_IN_FLIGHT deployment-wide, ..._PER_ORG, ..._PER_TARGET) bound the worker
threads deliveries can hold: a slow or hostile receiver holds at most its endpoint's share,
each attempt for at most FLOWFORGE_NOTIFY_ATTEMPT_SECONDS (the actor's time limit).

``deliver`` is one attempt: a webhook POST (engine.webhooks: signed, through the egress
policy, no redirect followed, the answer read bounded) or a failure email (Django's mailer,
to a recipient who is still a member), recorded with a conditional UPDATE on the claim token
(``repositories.notifications.record``): succeeded; retried after a jittered exponential
backoff on a network error, a timeout, 408, 429 or 5xx (or a mail server that failed) while
attempts remain; dead-lettered otherwise. A dead delivery is kept and can be replayed
(engine.notifications.replay_delivery).
"""

from __future__ import annotations

import datetime as dt
import logging
import smtplib
import time
import uuid

from django.conf import settings
from django.core.mail import send_mail
from django.template.loader import render_to_string
from django.utils import timezone
from dramatiq.middleware.time_limit import TimeLimitExceeded

from engine import dispatch, notifications, webhooks
from engine.models import TaskRun
from engine.repositories import notifications as outbox
from engine.repositories.notifications import AttemptOutcome, Backoff, ClaimedDelivery
from engine.states import DeliveryChannel
from tenancy.vault import DecryptionError

log = logging.getLogger(__name__)

# Expired claims taken back per tick.
EXPIRE_BATCH = 100
# A claim's lease beyond the attempt's own limit, in seconds: time to record the outcome.
LEASE_MARGIN_SECONDS = 30.0
LOST_ERROR = "no outcome was recorded before the claim's lease expired (the worker stopped or was lost)"
# Failed tasks listed in a failure email.
EMAIL_FAILED_TASKS = 10


def backoff() -> Backoff:
    """The retry schedule of the settings (FLOWFORGE_NOTIFY_MAX_ATTEMPTS, _BACKOFF_BASE_SECONDS,
    _BACKOFF_MAX_SECONDS)."""
    return Backoff(max_attempts=settings.FLOWFORGE_NOTIFY_MAX_ATTEMPTS,
                   base_seconds=settings.FLOWFORGE_NOTIFY_BACKOFF_BASE_SECONDS,
                   cap_seconds=settings.FLOWFORGE_NOTIFY_BACKOFF_MAX_SECONDS)


def lease_seconds() -> float:
    """How long a claim holds a delivery: the attempt's limit plus LEASE_MARGIN_SECONDS."""
    return float(settings.FLOWFORGE_NOTIFY_ATTEMPT_SECONDS) + LEASE_MARGIN_SECONDS


def claim_and_publish() -> int:
    """Claim the due deliveries there is room for and send a ``deliver_notification``
    message per claim (one pipelined broker round trip). A claim whose message the broker
    refused is given back at once. Returns how many messages went out."""
    claims = outbox.claim(limit=settings.FLOWFORGE_NOTIFY_IN_FLIGHT,
                          per_org=settings.FLOWFORGE_NOTIFY_IN_FLIGHT_PER_ORG,
                          per_target=settings.FLOWFORGE_NOTIFY_IN_FLIGHT_PER_TARGET,
                          lease_seconds=lease_seconds())
    if not claims:
        return 0
    messages = [dispatch.message("deliver_notification", args=(str(delivery_id), token))
                for delivery_id, token in claims]
    errors = dispatch.enqueue_many(messages)
    refused = [claim for claim, error in zip(claims, errors, strict=True) if error is not None]
    if refused:
        log.warning("the broker refused %d notification messages; their deliveries are due again", len(refused))
        outbox.release(refused)
    return len(claims) - len(refused)


def tick() -> int:
    """Take back expired claims (each counts as a failed attempt), then
    ``claim_and_publish``. Returns how many deliveries were sent out."""
    lost = outbox.expire(limit=EXPIRE_BATCH, backoff=backoff(), error=LOST_ERROR)
    if lost:
        log.warning("%d notification deliveries lost their worker; retried or dead-lettered", len(lost))
    return claim_and_publish()


def deliver(delivery_id: str | uuid.UUID, claim_token: int) -> str | None:
    """One attempt of the claimed delivery (``delivery_id``, ``claim_token``), recorded.
    Returns the delivery's new state, or None when the claim was no longer current (another
    attempt took over; nothing is sent). Then claims the next due deliveries."""
    claimed = outbox.get_claimed(delivery_id=uuid.UUID(str(delivery_id)), claim_token=int(claim_token))
    if claimed is None:
        log.info("notification delivery %s: claim %s is no longer current; nothing sent", delivery_id, claim_token)
        return None
    started_at = timezone.now()
    began = time.monotonic()
    try:
        if claimed.channel == DeliveryChannel.WEBHOOK:
            outcome = _send_webhook(claimed, started_at)
        else:
            outcome = _send_email(claimed, started_at)
    except TimeLimitExceeded:
        # The attempt's limit (FLOWFORGE_NOTIFY_ATTEMPT_SECONDS, the actor's time limit):
        # a receiver that answers too slowly is a failed attempt like a timeout.
        outcome = AttemptOutcome(
            ok=False, retryable=True, started_at=started_at, duration_ms=int((time.monotonic() - began) * 1000),
            error=f"stopped after {settings.FLOWFORGE_NOTIFY_ATTEMPT_SECONDS:g} s (FLOWFORGE_NOTIFY_ATTEMPT_SECONDS)")
    result = outbox.record(delivery_id=claimed.id, claim_token=int(claim_token), outcome=outcome, backoff=backoff())
    if result is None:
        log.warning("notification delivery %s: its claim expired before the outcome was recorded", claimed.id)
        state = None
    else:
        state = result[0]
        log.info("notification delivery %s (%s %s, attempt %d): %s%s", claimed.id, claimed.channel,
                 claimed.event_type, claimed.attempt, state,
                 f" ({outcome.error})" if outcome.error else "")
    claim_and_publish()
    return state


def _send_webhook(claimed: ClaimedDelivery, started_at: dt.datetime) -> AttemptOutcome:
    try:
        secrets_ = notifications.decrypt_secrets(claimed.organization_id, claimed.endpoint_id,
                                                 claimed.secret_ciphertext or "", claimed.previous_secret_ciphertext)
    except DecryptionError:
        return AttemptOutcome(ok=False, retryable=True, started_at=started_at, duration_ms=0,
                              error="the endpoint's signing secret is not encrypted under any key of "
                              "FLOWFORGE_SECRET_KEYS; nothing was sent")
    body = webhooks.event_body(event_id=claimed.event_id, event_type=claimed.event_type,
                               created_at=claimed.event_created_at, payload=claimed.payload)
    headers = {
        webhooks.SIGNATURE_HEADER: webhooks.signature_header(secrets_, int(time.time()), body),
        webhooks.EVENT_ID_HEADER: str(claimed.event_id),
        webhooks.EVENT_TYPE_HEADER: claimed.event_type,
        webhooks.DELIVERY_ID_HEADER: str(claimed.id),
        webhooks.ATTEMPT_HEADER: str(claimed.attempt),
    }
    result = webhooks.post(claimed.url or "", body, headers,
                           timeout_seconds=settings.FLOWFORGE_WEBHOOK_TIMEOUT_SECONDS,
                           max_response_bytes=settings.FLOWFORGE_WEBHOOK_RESPONSE_BYTES)
    return AttemptOutcome(ok=result.ok, retryable=result.retryable, started_at=started_at,
                          duration_ms=result.duration_ms, status=result.status, error=result.error,
                          excerpt=result.excerpt, truncated=result.truncated)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def failure_email(claimed: ClaimedDelivery) -> tuple[str, str]:
    """(subject, text) of the email for a ``run.failed`` notification: the workflow, the
    run, its error, its failed tasks (at most EMAIL_FAILED_TASKS, with their errors' first
    lines) and, with FLOWFORGE_PUBLIC_URL, a link to the run's page."""
    data = claimed.payload
    run, workflow = data.get("run") or {}, data.get("workflow") or {}
    failed = list(TaskRun.objects.for_organization(claimed.organization_id)
                  .filter(workflow_run_id=claimed.workflow_run_id, state="failed")
                  .select_related("task").order_by("finished_at", "id")[:EMAIL_FAILED_TASKS])
    base = settings.FLOWFORGE_PUBLIC_URL
    context = {
        "organization_name": claimed.organization_name,
        "workflow": workflow,
        "run": run,
        "failed": [{"key": t.task.key, "attempt": t.attempt,
                    "error": (t.error.strip().splitlines() or [""])[-1][:300]} for t in failed],
        "run_url": f"{base}/runs/{claimed.workflow_run_id}/" if base else "",
        "workflow_name": claimed.workflow_name,
    }
    subject = _one_line(f"[FlowForge] {claimed.organization_name}: a run of {claimed.workflow_name} failed")[:250]
    return subject, render_to_string("engine/email/run_failed.txt", context)


def _send_email(claimed: ClaimedDelivery, started_at: dt.datetime) -> AttemptOutcome:
    began = time.monotonic()
    if not claimed.recipient_is_member:
        return AttemptOutcome(ok=False, retryable=False, started_at=started_at, duration_ms=0,
                              error="the recipient is no longer a member of the organization; nothing was sent")
    subject, text = failure_email(claimed)
    try:
        send_mail(subject, text, None, [claimed.recipient_email])
    except (smtplib.SMTPException, OSError) as exc:
        return AttemptOutcome(ok=False, retryable=True, started_at=started_at,
                              duration_ms=int((time.monotonic() - began) * 1000),
                              error=f"{type(exc).__name__}: {exc}"[:1000])
    return AttemptOutcome(ok=True, retryable=False, started_at=started_at,
                          duration_ms=int((time.monotonic() - began) * 1000))
