"""Account-level audit records (organization NULL, seen only by staff): sign-in and
sign-out, failed sign-ins, password change and reset, MFA on and off (and the recovery
codes that come and go with it); and staff changes made in the Django admin (in the
organization of the changed object, when it has one).

Requests run in a transaction (ATOMIC_REQUESTS), so each record commits or rolls back
with the change it describes. Only addresses and ids are recorded, never a password,
code or secret.
"""

from __future__ import annotations

import functools

from allauth.account import signals as account_signals
from allauth.mfa.models import Authenticator
from django.contrib.admin.models import LogEntryManager
from django.contrib.auth import signals as auth_signals
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from audit.services import record


@receiver(auth_signals.user_logged_in, dispatch_uid="audit_login")
def on_login(sender, request, user, **kwargs):
    record("account.login", user=user, target=user, metadata={"backend": getattr(user, "backend", "") or ""})


@receiver(auth_signals.user_logged_out, dispatch_uid="audit_logout")
def on_logout(sender, request, user, **kwargs):
    if user is not None:
        record("account.logout", user=user, target=user)


@receiver(auth_signals.user_login_failed, dispatch_uid="audit_login_failed")
def on_login_failed(sender, credentials, request=None, **kwargs):
    # Django has already masked the password in ``credentials``; record the address only.
    attempted = str(credentials.get("email") or credentials.get("username") or "")[:254]
    from tenancy.models import User

    user = User.objects.filter(email=attempted.lower()).first() if attempted else None
    # The address's account, when there is one, is both the claimed actor and the target
    # (like a sign-in); an unknown address is an anonymous user named by actor_email.
    record("account.login_failed", user=user, actor_email=attempted, target=user,
           metadata={"attempted_email": attempted})


@receiver(account_signals.password_changed, dispatch_uid="audit_password_changed")
def on_password_changed(sender, request, user, **kwargs):
    record("account.password_changed", user=user, target=user)


@receiver(account_signals.password_set, dispatch_uid="audit_password_set")
def on_password_set(sender, request, user, **kwargs):
    record("account.password_set", user=user, target=user)


@receiver(account_signals.password_reset, dispatch_uid="audit_password_reset")
def on_password_reset(sender, request, user, **kwargs):
    record("account.password_reset", user=user, target=user)


# Turning MFA on or off is about a factor (TOTP); the recovery codes that allauth creates
# with the first factor, and deletes with the last, are recorded under their own
# actions, so one "MFA on" is one account.mfa_enabled record.
_RECOVERY_CODES = Authenticator.Type.RECOVERY_CODES


@receiver(post_save, sender=Authenticator, dispatch_uid="audit_mfa_added")
def on_authenticator_saved(sender, instance, created, **kwargs):
    if created:
        action = "account.recovery_codes_generated" if instance.type == _RECOVERY_CODES else "account.mfa_enabled"
        record(action, user=instance.user, target=instance, metadata={"type": instance.type})


@receiver(post_delete, sender=Authenticator, dispatch_uid="audit_mfa_removed")
def on_authenticator_deleted(sender, instance, **kwargs):
    action = "account.recovery_codes_removed" if instance.type == _RECOVERY_CODES else "account.mfa_disabled"
    record(action, user=instance.user, target=("authenticator", instance.pk), metadata={"type": instance.type})


@receiver(post_save, sender="admin.LogEntry", dispatch_uid="audit_admin_change")
def on_admin_change(sender, instance, created, **kwargs):
    """A staff change made in the Django admin (Django logs each one as a LogEntry, in
    the same transaction as the change)."""
    if not created:
        return
    verb = {1: "added", 2: "changed", 3: "deleted"}.get(instance.action_flag, "changed")
    model = instance.content_type.model if instance.content_type_id else "object"
    organization = None
    obj_model = instance.content_type.model_class() if instance.content_type_id else None
    # The admin logs a deletion before it deletes, so a deleted object's organization is
    # still there to be found (and the record lands in that organization's log).
    if obj_model is not None:
        from tenancy.models import Organization

        if obj_model is Organization:
            organization = instance.object_id
        elif any(f.name == "organization" for f in obj_model._meta.fields):
            organization = (
                obj_model._base_manager.filter(pk=instance.object_id).values_list("organization_id", flat=True).first()
            )
    record(
        f"admin.{model}.{verb}",
        user=instance.user,
        organization=organization,
        target=(model, instance.object_id or ""),
        metadata={"object": instance.object_repr[:200], "change": instance.get_change_message()[:1000]},
    )


def _also_record_bulk_entries(log_actions):
    """LogEntry.objects.log_actions saves one entry (post_save: recorded above) but
    bulk-creates several — a bulk delete in the admin — and bulk_create sends no
    post_save: record each of those entries here, in the same transaction."""

    @functools.wraps(log_actions)
    def wrapper(self, *args, **kwargs):
        entries = log_actions(self, *args, **kwargs)
        if isinstance(entries, list) and len(entries) > 1:
            for entry in entries:
                on_admin_change(sender=type(entry), instance=entry, created=True)
        return entries

    wrapper.audited = True
    return wrapper


if not getattr(LogEntryManager.log_actions, "audited", False):
    LogEntryManager.log_actions = _also_record_bulk_entries(LogEntryManager.log_actions)
