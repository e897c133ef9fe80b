"""The audit chain's HMAC keys, read from ``FLOWFORGE_AUDIT_KEYS`` (issue 14, finding 5).

The value is a comma-separated list of ``<key id>:<base64 key>`` entries, e.g.
``k2:3q2+7w...=,k1:AAEC...=``. The **first** entry signs every new audit row; the others
only verify rows signed earlier, which is how a key is rotated: put the new key first,
keep the old one after it until no chain you still verify needs it. A key id is 1-32 of
``[A-Za-z0-9_-]`` and is stored on each row (``core_auditlog.key_id``); a key is at least
32 bytes once decoded.

The keys live in the environment, never in the database, so someone who can write the
audit table (the owner, a leaked application role) cannot compute a valid row hash.

With ``DEBUG`` on and no keys set, settings derive a development key (id ``dev``) from
``SECRET_KEY`` (``dev_audit_keys``) — not for production: anyone who knows the secret
key can sign rows with it. With ``DEBUG`` off, settings refuse to start without keys.

This module imports nothing from Django at import time: settings use it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
import secrets

# Key ids are stored on every row; short and plain so they read well in reports.
KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}\Z")  # \Z: "$" lets a final newline in
# Bytes of key material at least (HMAC-SHA256's block is 64; its output 32).
MIN_KEY_BYTES = 32
# Distinct byte values at least: 32 random bytes have fewer than 16 with a chance below 1e-9.
MIN_DISTINCT_BYTES = 16
GENERATE_HINT = "python -c \"import base64,secrets; print(base64.b64encode(secrets.token_bytes(32)).decode())\""
DEV_KEY_ID = "dev"
ENV_NAME = "FLOWFORGE_AUDIT_KEYS"


class AuditKeyError(ValueError):
    """FLOWFORGE_AUDIT_KEYS is malformed; the message names the entry and what is wrong."""


def parse_audit_keys(raw: str) -> tuple[tuple[str, bytes], ...]:
    """Parse a ``FLOWFORGE_AUDIT_KEYS`` value into ((key id, key bytes), ...), signing key first.

    Raises AuditKeyError for an empty value, an entry without ``id:``, a bad id, a
    duplicate id, a value that is not base64, or a key shorter than MIN_KEY_BYTES.
    """
    return _parse(raw or "")


@functools.lru_cache(maxsize=8)
def _parse(raw: str) -> tuple[tuple[str, bytes], ...]:
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    if not entries:
        raise AuditKeyError(f"{ENV_NAME} is empty: set it to 'k1:<base64 of {MIN_KEY_BYTES} random bytes>'")
    out: list[tuple[str, bytes]] = []
    for n, entry in enumerate(entries, start=1):
        key_id, sep, b64 = entry.partition(":")
        if not sep:
            raise AuditKeyError(f"{ENV_NAME} entry {n}: expected '<key id>:<base64 key>', got no ':'")
        if not KEY_ID_RE.match(key_id):
            raise AuditKeyError(f"{ENV_NAME} entry {n}: key id {key_id!r} must be 1-32 of A-Z a-z 0-9 _ -")
        if any(key_id == seen for seen, _ in out):
            raise AuditKeyError(f"{ENV_NAME} entry {n}: key id {key_id!r} appears twice")
        try:
            key = base64.b64decode(b64.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise AuditKeyError(f"{ENV_NAME} entry {n} ({key_id}): the key is not valid base64") from None
        if len(key) < MIN_KEY_BYTES:
            raise AuditKeyError(
                f"{ENV_NAME} entry {n} ({key_id}): the key is {len(key)} bytes; at least {MIN_KEY_BYTES}")
        if len(set(key)) < MIN_DISTINCT_BYTES:
            # Random bytes are almost never this repetitive; a hand-made or placeholder key is.
            raise AuditKeyError(
                f"{ENV_NAME} entry {n} ({key_id}): the key has {len(set(key))} distinct byte values, "
                f"not random: generate one with {GENERATE_HINT}")
        out.append((key_id, key))
    return tuple(out)


def dev_audit_keys(secret_key: str) -> str:
    """A ``FLOWFORGE_AUDIT_KEYS`` value for DEBUG only: key id ``dev``, key derived from
    ``secret_key`` (so every process of one development setup agrees). Not for production."""
    key = hmac.new(secret_key.encode(), b"flowforge audit chain development key", hashlib.sha256).digest()
    return f"{DEV_KEY_ID}:{base64.b64encode(key).decode()}"


def generate_key_spec(key_id: str = "k1") -> str:
    """A fresh ``<key id>:<base64 of 32 random bytes>`` entry (for a new deployment or a rotation)."""
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode()}"


def _configured() -> tuple[tuple[str, bytes], ...]:
    from django.conf import settings

    return parse_audit_keys(settings.FLOWFORGE_AUDIT_KEYS)


def signing_key() -> tuple[str, bytes]:
    """(key id, key) that signs new rows: the first configured entry."""
    return _configured()[0]


def key_for(key_id: str) -> bytes | None:
    """The configured key with id ``key_id``, or None when FLOWFORGE_AUDIT_KEYS does not hold it."""
    return dict(_configured()).get(key_id)
