"""Notifications (issue 19): the actions on webhook endpoints and failure subscriptions.

What the API, the web UI and the commands call (after Zulip's ``do_*``): each checks the
actor's role, validates (``engine.webhooks.InvalidWebhook`` naming the field), changes the
rows and writes its audit record in one transaction; side effects (a nudge of the clock's
``notify_tick``) go out on commit.

- Webhook endpoints need ``webhook.manage`` (owners and admins; docs/permissions.md): their
  URLs can carry a receiver's token, so no other role reads them either. At most
  FLOWFORGE_MAX_WEBHOOKS_PER_ORG per organization (QuotaExceeded, ``limit="max_webhooks"``).
  The signing secret is generated here, returned once by ``create_endpoint`` and
  ``rotate_secret``, and stored encrypted (tenancy.vault's keys, FLOWFORGE_SECRET_KEYS,
  bound to the organization and the endpoint). Audit records name the URL by its scheme
  and host only (``webhooks.safe_url``), never the secret.
- Failure subscriptions are each member's own: any role may subscribe itself (a person,
  not an API key) to the failures of a workflow name of its organization, up to
  FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER. A member who leaves loses them
  (``drop_subscriptions_of``, from engine.signals).

What is delivered, and when, is engine.notifier's (the outbox's claim, the POST, the email).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from audit import services as audit
from engine import dispatch, webhooks
from engine.definitions import NAME_RE as WORKFLOW_NAME_RE
from engine.models import (
    FailureSubscription,
    NotificationAttempt,
    NotificationDelivery,
    NotificationType,
    WebhookEndpoint,
    Workflow,
)
from engine.states import DeliveryChannel, DeliveryState
from engine.webhooks import InvalidWebhook
from tenancy import vault
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded
from tenancy.permissions import Action, Forbidden, require

log = logging.getLogger(__name__)

# Longest description of an endpoint, in characters.
MAX_DESCRIPTION_CHARS = 200
# Longest a rotated-out secret may keep signing, in seconds (7 days).
MAX_PREVIOUS_SECRET_SECONDS = 7 * 24 * 3600
EVENT_TYPES: tuple[str, ...] = tuple(NotificationType.values)
# The fields update_endpoint changes.
EDITABLE = ("url", "event_types", "workflow_name", "description", "enabled")

__all__ = [
    "EVENT_TYPES", "InvalidWebhook", "ReplayRefused", "create_endpoint", "decrypt_secrets", "deliveries_of",
    "delete_endpoint",
    "drop_subscriptions_of", "endpoints_of", "failure_subscribed", "nudge_notifier", "replay_delivery",
    "rotate_secret", "set_failure_subscription", "subscribed_workflow_names", "update_endpoint",
]


# --- the secret at rest ---------------------------------------------------------------------------


def _vault_name(endpoint_id: Any) -> str:
    # What the ciphertext is bound to besides the organization (tenancy.vault.encrypt): a
    # token copied to another endpoint's row does not decrypt there.
    return f"webhook-endpoint:{endpoint_id}"


def encrypt_secret(organization_id: Any, endpoint_id: Any, secret: str) -> str:
    """``secret`` encrypted for the endpoint (tenancy.vault: FLOWFORGE_SECRET_KEYS)."""
    return vault.encrypt(organization_id, _vault_name(endpoint_id), secret)


def decrypt_secrets(organization_id: Any, endpoint_id: Any, current: str, previous: str | None) -> list[str]:
    """The endpoint's signing secrets, current first, then the previous one when given (it
    still signs). For engine.notifier only: nothing returns them to a person. Raises
    tenancy.vault.DecryptionError when no configured key decrypts one."""
    out = [vault.decrypt(current, organization_id=organization_id, name=_vault_name(endpoint_id))]
    if previous:
        out.append(vault.decrypt(previous, organization_id=organization_id, name=_vault_name(endpoint_id)))
    return out


def rotate_endpoint_keys(*, batch_size: int = vault.ROTATE_BATCH_SIZE) -> vault.RotationResult:
    """Re-encrypt every endpoint's signing secrets (current and previous) under the first
    key of FLOWFORGE_SECRET_KEYS, ``batch_size`` rows per transaction, like
    tenancy.vault.rotate_keys (idempotent; an undecryptable row is left and listed). Every
    organization's rows: system code (``manage.py rotate_secret_keys``, through
    tenancy.signals.secret_keys_rotated)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    examined = rewritten = 0
    undecryptable: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    while True:
        with transaction.atomic():
            batch = (WebhookEndpoint.objects.unscoped().order_by("id").select_for_update()
                     .only("id", "secret_ciphertext", "previous_secret_ciphertext"))
            if after is not None:
                batch = batch.filter(id__gt=after)
            rows = list(batch[:batch_size])
            changed = []
            for row in rows:
                try:
                    tokens = [vault.reencrypt(row.secret_ciphertext),
                              vault.reencrypt(row.previous_secret_ciphertext) if row.previous_secret_ciphertext
                              else None]
                except vault.DecryptionError:
                    undecryptable.append(row.pk)
                    continue
                if tokens[0] is not None:
                    row.secret_ciphertext = tokens[0]
                if tokens[1] is not None:
                    row.previous_secret_ciphertext = tokens[1]
                if tokens != [None, None]:
                    changed.append(row)
            if changed:
                WebhookEndpoint.objects.unscoped().bulk_update(changed, ["secret_ciphertext",
                                                                         "previous_secret_ciphertext"])
        examined += len(rows)
        rewritten += len(changed)
        if len(rows) < batch_size:
            break
        after = rows[-1].pk
    return vault.RotationResult(examined=examined, rewritten=rewritten, undecryptable=undecryptable)


# --- validation -------------------------------------------------------------------------------------


def validate_event_types(value: Any) -> list[str]:
    """``value`` when it lists at least one of EVENT_TYPES and nothing else (duplicates
    dropped, the order of EVENT_TYPES kept). Raises InvalidWebhook("event_types", ...)."""
    if not isinstance(value, list | tuple) or not value:
        raise InvalidWebhook("event_types", f"required: a list of one or more of {', '.join(EVENT_TYPES)}")
    unknown = [v for v in value if v not in EVENT_TYPES]
    if unknown:
        shown = ", ".join(repr(v)[:80] for v in unknown[:5])
        raise InvalidWebhook("event_types", f"unknown event type {shown}; known: {', '.join(EVENT_TYPES)}")
    return [t for t in EVENT_TYPES if t in value]


def validate_workflow_name(value: Any) -> str:
    """``value`` when it is '' (every workflow) or a workflow name (1-200 letters, digits,
    '_', '.', '-', starting with a letter or digit). Raises InvalidWebhook("workflow_name", ...)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not WORKFLOW_NAME_RE.match(value):
        raise InvalidWebhook("workflow_name", "must be empty (every workflow) or a workflow name: 1-200 letters, "
                             "digits, '_', '.' or '-', starting with a letter or digit")
    return value


def check_workflow_exists(organization_id: Any, name: str) -> None:
    """Refuse a ``workflow_name`` filter that names no workflow of the organization: a typo
    would silently filter out every event. Any version in any state counts (a draft, or an
    archived one: it can be restored, and archiving it cancels runs that notify); '' (every
    workflow) passes. Scoped to the organization, so another organization's workflow is
    refused exactly as a missing one, and its existence is not revealed. Raises
    InvalidWebhook("workflow_name", ...)."""
    if name and not Workflow.objects.for_organization(organization_id).filter(name=name).exists():
        raise InvalidWebhook("workflow_name", f"no workflow named {name[:200]!r} in this organization; give the name "
                             "of one of its workflows (any version, active, draft or archived), or leave it empty "
                             "for every workflow")


def validate_description(value: Any) -> str:
    """``value`` when it is text of at most MAX_DESCRIPTION_CHARS characters without NUL."""
    if value is None:
        return ""
    if not isinstance(value, str) or "\x00" in value:
        raise InvalidWebhook("description", "must be text without NUL characters")
    if len(value) > MAX_DESCRIPTION_CHARS:
        raise InvalidWebhook("description", f"is {len(value)} characters long; at most {MAX_DESCRIPTION_CHARS}")
    return value.strip()


def _validated(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    unknown = sorted(set(data) - set(EDITABLE))
    if unknown:
        raise InvalidWebhook(unknown[0], "is not a field of a webhook endpoint")
    if "url" in data:
        out["url"] = webhooks.validate_url(data["url"])
    if "event_types" in data:
        out["event_types"] = validate_event_types(data["event_types"])
    if "workflow_name" in data:
        out["workflow_name"] = validate_workflow_name(data["workflow_name"])
    if "description" in data:
        out["description"] = validate_description(data["description"])
    if "enabled" in data:
        if not isinstance(data["enabled"], bool):
            raise InvalidWebhook("enabled", "must be true or false")
        out["enabled"] = data["enabled"]
    return out


def _snapshot(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """What an audit record says of an endpoint: never its path, query or secret."""
    return {"url": webhooks.safe_url(endpoint.url), "event_types": list(endpoint.event_types),
            "workflow_name": endpoint.workflow_name, "enabled": endpoint.enabled}


# --- endpoints ---------------------------------------------------------------------------------------


def deliveries_of(organization: Any, endpoint_id: Any) -> QuerySet[NotificationDelivery]:
    """The deliveries to one endpoint of the organization, with their event and their
    attempts (oldest first) fetched in two more queries whatever their number: the delivery
    log's rows. The caller orders and pages them, and checks ``webhook.manage``."""
    attempts = NotificationAttempt.objects.for_organization(organization).order_by("number")
    return (NotificationDelivery.objects.for_organization(organization).filter(endpoint_id=endpoint_id)
            .select_related("event").prefetch_related(Prefetch("attempt_log", queryset=attempts)))


def endpoints_of(organization: Any) -> QuerySet[WebhookEndpoint]:
    """The organization's webhook endpoints, newest first, ciphertexts not loaded. The
    caller checks ``webhook.manage``."""
    return (WebhookEndpoint.objects.for_organization(organization)
            .defer("secret_ciphertext", "previous_secret_ciphertext").order_by("-created_at", "-id"))


def _organization_id(actor: Actor) -> uuid.UUID:
    return getattr(actor.organization, "pk", actor.organization)


def _lock_endpoints(organization_id: Any) -> None:
    # Serializes the changes of one organization's endpoints: the cap's count and the
    # insert cannot interleave with another request's.
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"webhooks:{organization_id}"])


def create_endpoint(*, actor: Actor, url: Any, event_types: Any, workflow_name: Any = "", description: Any = "",
                    enabled: Any = True) -> tuple[WebhookEndpoint, str]:
    """Create a webhook endpoint of ``actor.organization``. Returns (endpoint, its signing
    secret): the only time the secret is returned.

    Raises Forbidden without webhook.manage, InvalidWebhook naming the field (a URL the
    egress policy refuses included), QuotaExceeded (``limit="max_webhooks"``) past
    FLOWFORGE_MAX_WEBHOOKS_PER_ORG. Records ``webhook.created``; nothing is stored when
    anything is refused. A ``workflow_name`` must name a workflow of the organization
    (``check_workflow_exists``)."""
    require(actor.role, Action.WEBHOOK_MANAGE)
    fields = _validated({"url": url, "event_types": event_types, "workflow_name": workflow_name,
                         "description": description, "enabled": enabled})
    organization_id = _organization_id(actor)
    check_workflow_exists(organization_id, fields["workflow_name"])
    secret = webhooks.generate_secret()
    with transaction.atomic():
        _lock_endpoints(organization_id)
        allowed = settings.FLOWFORGE_MAX_WEBHOOKS_PER_ORG
        used = WebhookEndpoint.objects.for_organization(organization_id).count()
        if used >= allowed:
            raise QuotaExceeded(
                f"the organization has {used} webhook endpoints, the most allowed "
                f"(FLOWFORGE_MAX_WEBHOOKS_PER_ORG={allowed}); delete one it no longer needs first",
                limit="max_webhooks", allowed=allowed, used=used)
        endpoint_id = uuid.uuid4()
        now = timezone.now()
        endpoint = WebhookEndpoint.objects.create(
            id=endpoint_id, organization_id=organization_id, created_by=actor.user,
            created_by_api_key_id=actor.api_key.id if actor.api_key is not None else None,
            secret_ciphertext=encrypt_secret(organization_id, endpoint_id, secret), created_at=now, updated_at=now,
            **fields)
        audit.record("webhook.created", actor=actor, target=endpoint, metadata=_snapshot(endpoint))
    return endpoint, secret


def update_endpoint(*, actor: Actor, endpoint: WebhookEndpoint, data: dict[str, Any]) -> WebhookEndpoint:
    """Change some of an endpoint's ``url``, ``event_types``, ``workflow_name``,
    ``description``, ``enabled`` (the same rules as create_endpoint). Deliveries already
    recorded keep going to the endpoint (its new URL); a disabled endpoint gets no new ones
    and its pending ones wait until it is enabled again. A ``workflow_name`` changed to
    another must name a workflow of the organization (``check_workflow_exists``); one left
    as it was is kept even if its workflow has since gone, so the other fields stay
    editable. Returns the changed endpoint. Raises Forbidden, InvalidWebhook (an unknown
    field too). Records ``webhook.updated`` with what changed (when something did)."""
    require(actor.role, Action.WEBHOOK_MANAGE)
    fields = _validated(data)
    with transaction.atomic():
        locked = WebhookEndpoint.objects.for_organization(_organization_id(actor)).select_for_update().get(
            pk=endpoint.pk)
        if "workflow_name" in fields and fields["workflow_name"] != locked.workflow_name:
            check_workflow_exists(_organization_id(actor), fields["workflow_name"])
        before, old_url, old_description = _snapshot(locked), locked.url, locked.description
        for name, value in fields.items():
            setattr(locked, name, value)
        after = _snapshot(locked)
        changed = audit.changes(before, after)
        if locked.url != old_url and "url" not in changed:
            changed["url"] = {"before": before["url"], "after": after["url"] + " (path or query changed)"}
        if locked.description != old_description:
            changed["description"] = {"before": old_description, "after": locked.description}
        if fields:
            locked.updated_at = timezone.now()
            locked.save(update_fields=[*fields, "updated_at"])
        if changed:
            audit.record("webhook.updated", actor=actor, target=locked, metadata={"changes": changed})
    return locked


def delete_endpoint(*, actor: Actor, endpoint: WebhookEndpoint) -> None:
    """Delete an endpoint with its delivery log (deliveries in flight are dropped: their
    outcome matches no row). Raises Forbidden. Records ``webhook.deleted``."""
    require(actor.role, Action.WEBHOOK_MANAGE)
    with transaction.atomic():
        locked = WebhookEndpoint.objects.for_organization(_organization_id(actor)).select_for_update().get(
            pk=endpoint.pk)
        snapshot = _snapshot(locked)
        target = ("webhookendpoint", str(locked.pk))
        locked.delete()
        audit.record("webhook.deleted", actor=actor, target=target, metadata=snapshot)


def rotate_secret(*, actor: Actor, endpoint: WebhookEndpoint,
                  previous_valid_seconds: Any = 0) -> tuple[WebhookEndpoint, str]:
    """Give the endpoint a new signing secret; returns (endpoint, the new secret), the only
    time it is returned. For ``previous_valid_seconds`` (0 to MAX_PREVIOUS_SECRET_SECONDS)
    the replaced secret keeps signing too (a second ``v1=`` in the header), so receivers
    can switch without refusing a delivery; 0 drops it at once. Raises Forbidden,
    InvalidWebhook("previous_valid_seconds", ...). Records ``webhook.secret_rotated``."""
    require(actor.role, Action.WEBHOOK_MANAGE)
    if (not isinstance(previous_valid_seconds, int) or isinstance(previous_valid_seconds, bool)
            or not 0 <= previous_valid_seconds <= MAX_PREVIOUS_SECRET_SECONDS):
        raise InvalidWebhook("previous_valid_seconds", f"must be a whole number of seconds from 0 to "
                             f"{MAX_PREVIOUS_SECRET_SECONDS} (7 days)")
    secret = webhooks.generate_secret()
    organization_id = _organization_id(actor)
    with transaction.atomic():
        locked = WebhookEndpoint.objects.for_organization(organization_id).select_for_update().get(pk=endpoint.pk)
        now = timezone.now()
        if previous_valid_seconds:
            locked.previous_secret_ciphertext = locked.secret_ciphertext
            locked.previous_secret_expires_at = now + dt.timedelta(seconds=previous_valid_seconds)
        else:
            locked.previous_secret_ciphertext = ""
            locked.previous_secret_expires_at = None
        locked.secret_ciphertext = encrypt_secret(organization_id, locked.pk, secret)
        locked.secret_rotated_at = locked.updated_at = now
        locked.save(update_fields=["secret_ciphertext", "previous_secret_ciphertext", "previous_secret_expires_at",
                                   "secret_rotated_at", "updated_at"])
        audit.record("webhook.secret_rotated", actor=actor, target=locked,
                     metadata={"url": webhooks.safe_url(locked.url), "previous_valid_seconds": previous_valid_seconds})
    return locked, secret


class ReplayRefused(Exception):
    """A delivery cannot be replayed now (the message says why): it is still pending or
    being sent, a replay of it is, or its endpoint is disabled."""


def nudge_notifier() -> None:
    """Ask for ``notify_tick`` now rather than at the clock's next tick; a broker that
    refuses is logged (the clock's tick claims the work anyway)."""
    try:
        dispatch.send("notify_tick")
    except Exception as exc:  # the clock's tick is the safety net
        log.warning("could not nudge notify_tick: %s", exc)


def replay_delivery(*, actor: Actor, delivery: NotificationDelivery) -> NotificationDelivery:
    """Deliver a finished (succeeded or dead) delivery's event again to the same endpoint:
    a new delivery (``replay_of`` the original) due now, with the same event id and body.
    Returns it. Raises Forbidden, ReplayRefused (while the delivery or a replay of it is
    pending or being sent, or its endpoint is disabled). Records
    ``webhook.delivery_replayed``; the notifier is nudged on commit."""
    require(actor.role, Action.WEBHOOK_MANAGE)
    organization_id = _organization_id(actor)
    with transaction.atomic():
        # The original's row lock serializes replays of it: the check below sees any
        # replay committed before (a fresh snapshot after the lock).
        original = (NotificationDelivery.objects.for_organization(organization_id).select_for_update(of=("self",))
                    .select_related("endpoint").get(pk=delivery.pk))
        if original.channel != DeliveryChannel.WEBHOOK:
            raise ReplayRefused("only webhook deliveries are replayed")
        if original.state not in (DeliveryState.SUCCEEDED, DeliveryState.DEAD):
            raise ReplayRefused(f"the delivery is {original.state}: replay it once it has succeeded or "
                                "been dead-lettered")
        if not original.endpoint.enabled:
            raise ReplayRefused("the endpoint is disabled: enable it first")
        if (NotificationDelivery.objects.for_organization(organization_id)
                .filter(replay_of=original, state__in=[DeliveryState.PENDING, DeliveryState.SENDING]).exists()):
            raise ReplayRefused("a replay of this delivery is already pending")
        now = timezone.now()
        replay = NotificationDelivery.objects.create(
            organization_id=organization_id, event_id=original.event_id, channel=original.channel,
            endpoint_id=original.endpoint_id, replay_of=original, state=DeliveryState.PENDING, next_attempt_at=now,
            created_at=now)
        audit.record("webhook.delivery_replayed", actor=actor, target=original.endpoint, metadata={
            "delivery": str(original.pk), "replay": str(replay.pk), "event": str(original.event_id)})
        transaction.on_commit(nudge_notifier)
    return replay


# --- failure subscriptions -------------------------------------------------------------------------


def failure_subscribed(organization: Any, user: Any, workflow_name: str) -> bool:
    """Whether ``user`` is emailed when a run of ``workflow_name`` fails (one query)."""
    if user is None:
        return False
    return FailureSubscription.objects.for_organization(organization).filter(
        user=user, workflow_name=workflow_name).exists()


def subscribed_workflow_names(organization: Any, user: Any) -> list[str]:
    """The workflow names ``user`` gets failure emails of, by name."""
    return list(FailureSubscription.objects.for_organization(organization).filter(user=user)
                .order_by("workflow_name").values_list("workflow_name", flat=True))


def set_failure_subscription(*, actor: Actor, workflow_name: str, subscribed: bool) -> bool:
    """Subscribe the acting member to emails about the failed runs of ``workflow_name``
    (``subscribed``), or unsubscribe them. Any role of a member may (READ); an API key may
    not (Forbidden: an email goes to a person). Returns True when something changed
    (idempotent). Raises InvalidWebhook("workflow_name", ...) for a name that is not one,
    QuotaExceeded (``limit="max_failure_subscriptions"``) past
    FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER. Records
    ``notification.failure_subscribed`` / ``notification.failure_unsubscribed``."""
    require(actor.role, Action.READ)
    if actor.user is None or actor.api_key is not None:
        raise Forbidden("failure emails are a member's own: sign in to subscribe")
    if not isinstance(workflow_name, str) or not WORKFLOW_NAME_RE.match(workflow_name):
        raise InvalidWebhook("workflow_name", "is not a workflow name")
    organization_id = _organization_id(actor)
    with transaction.atomic():
        # Serializes one member's changes: the cap's count and the insert.
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                        [f"failure-subscriptions:{organization_id}:{actor.user.pk}"])
        mine = FailureSubscription.objects.for_organization(organization_id).filter(user=actor.user)
        exists = mine.filter(workflow_name=workflow_name).exists()
        if subscribed == exists:
            return False
        if subscribed:
            allowed = settings.FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER
            used = mine.count()
            if used >= allowed:
                raise QuotaExceeded(
                    f"you get failure emails of {used} workflows, the most allowed "
                    f"(FLOWFORGE_MAX_FAILURE_SUBSCRIPTIONS_PER_MEMBER={allowed}); unsubscribe from one first",
                    limit="max_failure_subscriptions", allowed=allowed, used=used)
            row = FailureSubscription.objects.create(organization_id=organization_id, user=actor.user,
                                                     workflow_name=workflow_name)
            audit.record("notification.failure_subscribed", actor=actor, target=row,
                         metadata={"workflow_name": workflow_name})
        else:
            row = mine.get(workflow_name=workflow_name)
            target = ("failuresubscription", str(row.pk))
            row.delete()
            audit.record("notification.failure_unsubscribed", actor=actor, target=target,
                         metadata={"workflow_name": workflow_name})
    return True


def drop_subscriptions_of(*, organization_id: Any, user: Any) -> int:
    """Delete a departed member's failure subscriptions in the organization (in the
    caller's transaction: the removal's). Returns how many there were."""
    deleted, _ = FailureSubscription.objects.for_organization(organization_id).filter(user=user).delete()
    # Their emails already recorded are not sent either: the notifier checks the membership.
    return deleted
