"""The chain of the audit log: canonical encoding of a row and its hash.

Two schemes, told apart by the row's ``key_id``:

- keyed (every row written since migration ``audit/0003_auditlog_key_id``): ``row_hash``
  is HMAC-SHA256 under the key ``key_id`` names (``audit.keys``, from the environment)
  of the canonical encoding of the row, ``key_id`` included. Without the key nobody can
  produce a row hash that verifies, however they reach the table.
- legacy (``key_id`` NULL, rows written before that migration; the table is append-only,
  so they stay as written): ``row_hash`` is the plain SHA-256 of the canonical encoding.
  Anyone can compute it; it shows accidental damage, not a deliberate rewrite.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from typing import Any

GENESIS = "0" * 64
ACCOUNT_CHAIN = "account"
# The fields covered by a legacy row's hash, in this order. Changing it breaks every chain.
HASHED_FIELDS = (
    "id", "organization_id", "actor_type", "actor_user_id", "actor_email", "actor_api_key_id",
    "actor_api_key_prefix", "action", "target_type", "target_id", "metadata", "ip_address",
    "user_agent", "request_id", "created_at", "chain", "seq", "prev_hash",
)
# The fields covered by a keyed row's HMAC: the same plus the id of the signing key.
KEYED_FIELDS = (*HASHED_FIELDS, "key_id")


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds")
    if value is None or isinstance(value, (str, int, float, bool, dict, list)):
        return value
    return str(value)  # UUIDs


def canonical(fields: dict[str, Any], names: tuple[str, ...] = HASHED_FIELDS) -> bytes:
    """The canonical encoding of a row: the ``names`` fields as sorted-key compact JSON."""
    return json.dumps(
        {name: _norm(fields[name]) for name in names},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    ).encode()


def row_hash(fields: dict[str, Any]) -> str:
    """The legacy scheme: SHA-256 (hex) of the canonical encoding; ``prev_hash`` is among
    the hashed fields, which is what links each row to its predecessor."""
    return hashlib.sha256(canonical(fields)).hexdigest()


def row_mac(fields: dict[str, Any], key: bytes) -> str:
    """The keyed scheme: HMAC-SHA256 (hex, 64 characters) under ``key`` of the canonical
    encoding of KEYED_FIELDS (``fields["key_id"]`` names ``key``)."""
    return hmac.new(key, canonical(fields, KEYED_FIELDS), hashlib.sha256).hexdigest()

# The fields a retention checkpoint's signature covers (audit.models.AuditCheckpoint).
CHECKPOINT_FIELDS = ("chain", "seq", "row_hash", "row_created_at", "key_id")


def checkpoint_mac(fields: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) under ``key`` of a retention checkpoint's CHECKPOINT_FIELDS
    (``fields["key_id"]`` names ``key``): written by ``audit.retention``, checked by the walk
    of ``audit.verify`` before it trusts where a chain now starts."""
    return hmac.new(key, canonical(fields, CHECKPOINT_FIELDS), hashlib.sha256).hexdigest()
