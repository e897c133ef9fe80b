"""Account-level audit records (organization NULL, seen only by staff): sign-in and
sign-out, failed sign-ins, password change and reset, MFA on and off.

Requests run in a transaction (ATOMIC_REQUESTS), so each record commits or rolls back
with the change it describes. Only addresses and ids are recorded, never a password,
code or secret.
"""

from __future__ import annotations

from allauth.account import signals as account_signals
from allauth.mfa.models import Authenticator
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
    record("account.login_failed", user=user, actor_email=attempted, metadata={"attempted_email": attempted})


@receiver(account_signals.password_changed, dispatch_uid="audit_password_changed")
def on_password_changed(sender, request, user, **kwargs):
    record("account.password_changed", user=user, target=user)


@receiver(account_signals.password_set, dispatch_uid="audit_password_set")
def on_password_set(sender, request, user, **kwargs):
    record("account.password_set", user=user, target=user)


@receiver(account_signals.password_reset, dispatch_uid="audit_password_reset")
def on_password_reset(sender, request, user, **kwargs):
    record("account.password_reset", user=user, target=user)


@receiver(post_save, sender=Authenticator, dispatch_uid="audit_mfa_added")
def on_authenticator_saved(sender, instance, created, **kwargs):
    if created:
        record("account.mfa_enabled", user=instance.user, target=instance, metadata={"type": instance.type})


@receiver(post_delete, sender=Authenticator, dispatch_uid="audit_mfa_removed")
def on_authenticator_deleted(sender, instance, **kwargs):
    record("account.mfa_disabled", user=instance.user, target=("authenticator", instance.pk),
           metadata={"type": instance.type})


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
    if obj_model is not None and verb != "deleted":
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
