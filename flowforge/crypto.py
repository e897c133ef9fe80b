"""Encryption at rest for secrets the application must read back (TOTP secrets and
recovery-code seeds; organization secrets use the same helpers with their own keys,
FLOWFORGE_SECRET_KEYS, in tenancy/vault.py).

Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) under a MultiFernet of the
keys in ``settings.FLOWFORGE_ENCRYPTION_KEYS``: the first key encrypts, every key
decrypts, so a key is rotated by putting a new one first; values encrypted under the
old key keep decrypting as long as it stays in the list (``reencrypt`` moves a value to
the first key; drop the old key only once nothing is encrypted under it).

The keys come from the environment (FLOWFORGE_ENCRYPTION_KEYS, comma-separated), never
from the database, so a copy of the database alone does not reveal the secrets.
``keys_from_environment`` is what settings.py calls: with DEBUG on and no keys set it
derives a development key from SECRET_KEY (not for production: anyone with the
SECRET_KEY has it); with DEBUG off it refuses to start without keys.
"""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

GENERATE_KEY_COMMAND = 'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
# Mixed into SECRET_KEY for the development key, so it is not SECRET_KEY's own hash.
_DEV_KEY_CONTEXT = b"flowforge.crypto development key v1\x00"


class DecryptionError(ValueError):
    """A value no configured key decrypts (not encrypted, corrupted, or encrypted under a key since dropped)."""


def development_key(secret_key: str, *, context: bytes = _DEV_KEY_CONTEXT) -> str:
    """A Fernet key derived from ``secret_key`` (SHA-256 of ``context`` + the key): for
    DEBUG only, never production. Each key ring passes its own ``context``, so two rings
    derived from one SECRET_KEY do not share a key."""
    digest = hashlib.sha256(context + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


def missing_keys_message(variable: str, purpose: str) -> str:
    """What a process with DEBUG off says when ``variable`` holds no key (how to make one)."""
    return (
        f"{variable} is not set. With DEBUG off, set it to one or more Fernet keys ({purpose}), "
        "comma-separated (the first encrypts, every one decrypts: put a new key first to rotate). "
        f"Generate a key with: {GENERATE_KEY_COMMAND}"
    )


MISSING_KEYS_MESSAGE = missing_keys_message("FLOWFORGE_ENCRYPTION_KEYS", "TOTP secrets and recovery-code seeds")


def keys_from_environment(raw: str, *, debug: bool, secret_key: str,
                          variable: str = "FLOWFORGE_ENCRYPTION_KEYS",
                          purpose: str = "TOTP secrets and recovery-code seeds",
                          dev_context: bytes = _DEV_KEY_CONTEXT) -> list[str]:
    """The Fernet keys of the environment variable ``variable``'s value ``raw``
    (comma-separated, blanks ignored), first to last.

    Raises ImproperlyConfigured naming ``variable`` when a key is not a Fernet key
    (naming its position, never its value), or when ``raw`` holds none and ``debug`` is
    False (``missing_keys_message(variable, purpose)``, which says how to generate one).
    With ``debug`` True and no keys: ``[development_key(secret_key, context=dev_context)]``.
    """
    keys = [part.strip() for part in raw.split(",") if part.strip()]
    if not keys:
        if not debug:
            raise ImproperlyConfigured(missing_keys_message(variable, purpose))
        return [development_key(secret_key, context=dev_context)]
    for position, key in enumerate(keys, start=1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ImproperlyConfigured(
                f"{variable}: key {position} of {len(keys)} is not a Fernet key "
                f"(32 bytes, url-safe base64). Generate one with: {GENERATE_KEY_COMMAND}"
            ) from None
    return keys


@functools.lru_cache(maxsize=8)
def multi_fernet(keys: tuple[str, ...]) -> MultiFernet:
    """The MultiFernet of ``keys`` (first encrypts, all decrypt), built once per key tuple.
    Callers pass the tuple of their setting's current value, so a test's override of the
    setting takes effect at once."""
    return MultiFernet([Fernet(key) for key in keys])


def _fernet() -> MultiFernet:
    return multi_fernet(tuple(settings.FLOWFORGE_ENCRYPTION_KEYS))


def encrypt(text: str) -> str:
    """``text`` encrypted under the first configured key: a Fernet token (url-safe ASCII,
    about 4/3 of the UTF-8 length plus 73 characters)."""
    return _fernet().encrypt(text.encode()).decode("ascii")


def decrypt(token: str) -> str:
    """The text ``encrypt`` gave ``token`` for, under any configured key. Raises
    DecryptionError when no configured key decrypts it."""
    try:
        return _fernet().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeError) as exc:
        raise DecryptionError("the value is not encrypted under any key of FLOWFORGE_ENCRYPTION_KEYS") from exc


def is_encrypted(value: str) -> bool:
    """True when some configured key decrypts ``value``."""
    try:
        decrypt(value)
    except DecryptionError:
        return False
    return True


def reencrypt(token: str) -> str:
    """``token`` re-encrypted under the first configured key (after a rotation). Raises
    DecryptionError when no configured key decrypts it."""
    try:
        return _fernet().rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError) as exc:
        raise DecryptionError("the value is not encrypted under any key of FLOWFORGE_ENCRYPTION_KEYS") from exc
