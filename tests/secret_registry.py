"""What the test session created that must never reach the audit log, and what the
audit log was given. Filled by hooks installed in tests/conftest.py; checked by
tests/unit/test_zz_audit_secret_scan.py, which runs last."""

from __future__ import annotations

import secrets as _secrets

# API key secrets and full keys, invitation tokens, passwords, TOTP secrets, organization secrets' values
SECRETS: set[str] = set()
AUDIT_TEXTS: list[str] = []  # every audit record's metadata and free-text fields, as written
_installed = False

_token_urlsafe = _secrets.token_urlsafe


def _recording_token_urlsafe(nbytes=None):
    value = _token_urlsafe(nbytes)
    if len(value) >= 16:  # short tokens are not credentials (and would match by chance)
        SECRETS.add(value)
    return value


def install() -> None:
    """Record every generated token and password, and every audit record's text."""
    global _installed
    if _installed:
        return
    _installed = True
    import json

    from django.db.models.signals import post_save

    from audit.models import AuditLog
    from tenancy.models import User

    _secrets.token_urlsafe = _recording_token_urlsafe

    original_set_password = User.set_password

    def set_password(self, raw_password):
        if raw_password:
            SECRETS.add(raw_password)
        return original_set_password(self, raw_password)

    User.set_password = set_password

    from allauth.mfa.totp.internal import auth as totp_auth

    original_generate = totp_auth.generate_totp_secret

    def generate_totp_secret(length: int = 20) -> str:
        value = original_generate(length)
        SECRETS.add(value)
        return value

    totp_auth.generate_totp_secret = generate_totp_secret

    from tenancy import vault

    original_validate_value = vault.validate_value

    def validate_value(value):
        checked = original_validate_value(value)  # every value set_secret stores passes here
        SECRETS.add(checked)
        return checked

    vault.validate_value = validate_value

    def on_audit_saved(sender, instance, created, **kwargs):
        if created:
            AUDIT_TEXTS.append(json.dumps(instance.metadata, ensure_ascii=False))
            AUDIT_TEXTS.append(" ".join([instance.target_id, instance.user_agent, instance.actor_email,
                                         instance.actor_api_key_prefix, instance.action]))

    post_save.connect(on_audit_saved, sender=AuditLog, dispatch_uid="test_secret_registry", weak=False)
