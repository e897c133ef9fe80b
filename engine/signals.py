"""The engine's receivers of tenancy's hooks (tenancy never imports the engine)."""

from __future__ import annotations

from django.dispatch import receiver

from engine.notifications import drop_subscriptions_of, rotate_endpoint_keys
from engine.triggers import pause_triggers_of_departed_member
from tenancy.signals import member_departed, secret_keys_rotated


@receiver(member_departed, dispatch_uid="engine_pause_triggers_of_departed_member")
def on_member_departed(sender, *, actor, membership, reason, **kwargs) -> None:
    """A removed or departed member's cron triggers stop firing (paused, audited)."""
    pause_triggers_of_departed_member(actor=actor, organization_id=membership.organization_id,
                                      user=membership.user)


@receiver(member_departed, dispatch_uid="engine_drop_failure_subscriptions_of_departed_member")
def drop_failure_subscriptions(sender, *, actor, membership, reason, **kwargs) -> None:
    """A removed or departed member gets no more failure emails of the organization."""
    drop_subscriptions_of(organization_id=membership.organization_id, user=membership.user)


@receiver(secret_keys_rotated, dispatch_uid="engine_rotate_webhook_secret_keys")
def rotate_webhook_secret_keys(sender, *, batch_size, **kwargs):
    """The webhook endpoints' signing secrets are under FLOWFORGE_SECRET_KEYS too."""
    return "webhook secrets", rotate_endpoint_keys(batch_size=batch_size)
