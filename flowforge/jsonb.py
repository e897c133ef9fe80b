"""The single funnel for JSONB writes.

PostgreSQL's ``jsonb`` cannot hold a NUL (``\\u0000``) inside a string: the insert
fails with "unsupported Unicode escape sequence" and the task that produced the
value would never reach a terminal state (seed 001, "The NUL byte"). Every JSONB
value the engine writes passes through :func:`jsonb_safe`, which strips the NUL
rather than refusing a result the task already produced.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from psycopg.types.json import Jsonb

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean_str(value: str) -> str:
    if "\x00" in value:
        value = value.replace("\x00", "")
    if not value.isascii() and _LONE_SURROGATE.search(value):
        # A Python str holds a surrogate only unpaired (e.g. from errors="surrogateescape");
        # UTF-8 cannot encode it, so PostgreSQL would refuse the whole value.
        value = _LONE_SURROGATE.sub("\ufffd", value)
    return value


def strip_nul(value: Any) -> Any:
    """Return ``value`` with every NUL character removed from its strings and keys, and
    every unpaired surrogate replaced by U+FFFD (neither can be stored as text or jsonb).

    Accepts any JSON-shaped value (dict, list, tuple, str, number, bool, None);
    tuples come back as lists. Raises nothing.
    """
    if isinstance(value, str):
        return _clean_str(value)
    if isinstance(value, dict):
        return {strip_nul(str(k)): strip_nul(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strip_nul(v) for v in value]
    return value


# A JSON string (skipped whole) or a number written with an exponent (group 1).
_STRING_OR_EXPONENT_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?[eE][+-]?\d+)')
_EXPONENT_HINT = re.compile(r"\d[eE][+-]?\d")


def stored_bytes(text: str) -> int:
    """Bytes of the JSON ``text`` (as ``json.dumps`` writes it) once stored in ``jsonb`` and
    read back: PostgreSQL keeps a number as ``numeric`` and writes it without an exponent, so
    ``1e+308`` (6 characters) comes back as 309 digits and ``1e-300`` as 302 characters,
    and so is every copy the API serves. Size limits (a run's input, a task's output) count
    this, not the text as sent (a 180 KB input of ``1e308`` elements was served as 9.3 MB).
    Returns an int; raises nothing for JSON text."""
    # An unpaired surrogate is stored as U+FFFD (strip_nul), 3 bytes as surrogatepass writes it.
    size = len(text.encode("utf-8", "surrogatepass"))
    if not _EXPONENT_HINT.search(text):
        return size
    for match in _STRING_OR_EXPONENT_NUMBER.finditer(text):
        number = match.group(1)
        if number:
            size += len(format(Decimal(number), "f")) - len(number)
    return size


def jsonb_safe(value: Any) -> Jsonb:
    """Wrap ``value`` for a psycopg JSONB parameter after stripping NULs.

    Raises TypeError (from json) when ``value`` holds something JSON cannot encode,
    and ValueError for NaN or Infinity (JSON has no such numbers; jsonb refuses them).
    """
    cleaned = strip_nul(value)
    try:  # fail here, with the problem named, not inside the driver
        json.dumps(cleaned, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"NaN and Infinity cannot be stored as JSON ({exc})") from exc
    return Jsonb(cleaned)
