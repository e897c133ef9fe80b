"""django-allauth's MFA adapter for FlowForge: MFA secrets encrypted at rest.

allauth passes every secret it stores on an Authenticator row (the TOTP secret, the
recovery codes' seed) through the adapter's ``encrypt`` and reads it back through
``decrypt``; the default stores them in clear. Here they are Fernet tokens under
FLOWFORGE_ENCRYPTION_KEYS (flowforge.crypto), so a copy of the database alone does
not let anyone compute a user's codes. Rows written before this adapter are
encrypted by tenancy/migrations/0003_encrypt_mfa_secrets.py.
"""

from __future__ import annotations

from allauth.mfa.adapter import DefaultMFAAdapter

from flowforge import crypto


class EncryptingMFAAdapter(DefaultMFAAdapter):
    """settings.MFA_ADAPTER: allauth's adapter with encrypt/decrypt through flowforge.crypto."""

    def encrypt(self, text: str) -> str:
        """``text`` as a Fernet token under the first FLOWFORGE_ENCRYPTION_KEYS key."""
        return crypto.encrypt(text)

    def decrypt(self, encrypted_text: str) -> str:
        """The secret in ``encrypted_text``; raises flowforge.crypto.DecryptionError when
        no configured key decrypts it (fail closed: never read a stored value as the secret)."""
        return crypto.decrypt(encrypted_text)
