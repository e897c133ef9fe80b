"""Encrypt the MFA secrets allauth stored in clear before tenancy.mfa.EncryptingMFAAdapter
(issue 14, finding 7): a TOTP row's ``data.secret``, a recovery-codes row's ``data.seed``
and ``data.migrated_codes``, under FLOWFORGE_ENCRYPTION_KEYS (flowforge.crypto).

Reversible: the reverse decrypts them back to clear text (for a downgrade to code that
stores them in clear). Either direction skips values already in the target form, so
running it twice changes nothing.
"""

from django.db import migrations

from flowforge import crypto

TOTP = "totp"
RECOVERY_CODES = "recovery_codes"


def _convert(value, *, encrypting: bool):
    if isinstance(value, list):
        return [_convert(item, encrypting=encrypting) for item in value]
    if not isinstance(value, str):
        return value
    encrypted = crypto.is_encrypted(value)
    if encrypting:
        return value if encrypted else crypto.encrypt(value)
    return crypto.decrypt(value) if encrypted else value


def _rewrite(apps, *, encrypting: bool) -> None:
    Authenticator = apps.get_model("mfa", "Authenticator")
    fields = {TOTP: ("secret",), RECOVERY_CODES: ("seed", "migrated_codes")}
    for row in Authenticator.objects.filter(type__in=fields).iterator():
        data = dict(row.data)
        for name in fields[row.type]:
            if name in data:
                data[name] = _convert(data[name], encrypting=encrypting)
        if data != row.data:
            row.data = data
            row.save(update_fields=["data"])


def encrypt_mfa_secrets(apps, schema_editor):
    _rewrite(apps, encrypting=True)


def decrypt_mfa_secrets(apps, schema_editor):
    _rewrite(apps, encrypting=False)


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0002_invitations_api_keys"),
        ("mfa", "0003_authenticator_type_uniq"),
    ]

    operations = [
        migrations.RunPython(encrypt_mfa_secrets, decrypt_mfa_secrets, elidable=False),
    ]
