"""The ``Idempotency-Key`` request header of POST /api/v1/runs/ (the HTTP half; the
database half is engine.services.start_run_idempotent).

A client that may retry a start (a timeout, a lost response) sends a key of its
choosing; a repeat with the same key and the same body returns the first run (200,
``Idempotent-Replayed: true``) instead of starting another, the same key with a
different body is a 409. Keys belong to their caller (a user, or one API key) within
the organization and are kept for at least 24 hours.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from engine.services import IDEMPOTENCY_KEY_MAX_LENGTH

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
# Visible ASCII and spaces: what an HTTP header can carry without encoding questions.
_KEY_RE = re.compile(rf"^[\x20-\x7e]{{1,{IDEMPOTENCY_KEY_MAX_LENGTH}}}\Z")  # \Z: "$" lets a final newline in


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key (surrounding spaces removed), or None without one.

    Raises ValidationError naming ``Idempotency-Key`` when it is empty, longer than
    IDEMPOTENCY_KEY_MAX_LENGTH or holds anything but visible ASCII and spaces.
    """
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    key = raw.strip()
    if not _KEY_RE.match(key):
        raise ValidationError({HEADER: [
            f"must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} visible ASCII characters (a UUID is a good choice)"
        ]})
    return key


def request_hash(validated: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of a validated start request: keys sorted, no
    whitespace, so two bodies that mean the same start hash alike whatever their
    formatting or key order (an omitted ``input`` equals ``{}``, an omitted ``priority``
    equals 0, and a priority of 0 hashes as the bodies before priorities existed did)."""
    body = {"workflow": validated["workflow"], "version": validated.get("version"), "input": validated.get("input", {})}
    if validated.get("priority"):
        body["priority"] = validated["priority"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
