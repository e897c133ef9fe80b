"""The hash chain of the audit log: canonical encoding and hashing of a row."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

GENESIS = "0" * 64
ACCOUNT_CHAIN = "account"
# The fields covered by a row's hash, in this order. Changing it breaks every chain.
HASHED_FIELDS = (
    "id", "organization_id", "actor_type", "actor_user_id", "actor_email", "actor_api_key_id",
    "actor_api_key_prefix", "action", "target_type", "target_id", "metadata", "ip_address",
    "user_agent", "request_id", "created_at", "chain", "seq", "prev_hash",
)


def _norm(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds")
    if value is None or isinstance(value, (str, int, float, bool, dict, list)):
        return value
    return str(value)  # UUIDs


def canonical(fields: dict[str, Any]) -> bytes:
    """The canonical encoding of a row: its hashed fields as sorted-key compact JSON."""
    return json.dumps(
        {name: _norm(fields[name]) for name in HASHED_FIELDS},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    ).encode()


def row_hash(fields: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical encoding; ``prev_hash`` is among the hashed fields,
    which is what links each row to its predecessor."""
    return hashlib.sha256(canonical(fields)).hexdigest()
