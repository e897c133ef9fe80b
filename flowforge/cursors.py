"""Keyset cursors and newest-first pages, never OFFSET (seed 001), for the API and the web UI.

A page is "the rows past the cursor", found by an index range scan, so page 500 costs
what page 1 costs, and rows inserted while a client pages never shift what it has yet
to see (with OFFSET a newer row pushes every later row one place down, and the client
sees one twice or skips one).

Cursor shapes (each opaque: base64url of a small JSON object):

- (created_at, id), newest first: ``created_at`` as text at full microsecond precision
  plus the id. A millisecond-precision cursor would sort before the row it came from
  and skip every row sharing that millisecond (seed 001: "paging 12 executions returned
  9"). The predicate ``created_at <= t AND (created_at < t OR id < pk)`` makes its first
  conjunct an index condition on ``(…, created_at DESC, id DESC)``; the second only
  discards the few rows sharing ``t``. Parameters are typed (``timestamptz`` and
  ``uuid``), never compared as text, which would order UUIDs lexically;
- a name (alphabetical lists): the last name; two texts (workers by queue and id): the last pair;
- whole numbers (``version``, ``seq``) are not encoded: ``whole_number`` parses them.

Malformed cursors raise BadCursor; the API turns it into a 400 naming the parameter
(api.pagination), the web UI into a notice and the first page.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import json
import uuid
from typing import Any

from django.db.models import Q, QuerySet

from flowforge.instants import InstantError, storable_instant

# Digits a whole-number cursor may have: 18 always fits PostgreSQL's bigint.
MAX_WHOLE_NUMBER_DIGITS = 18
#: The largest number of that many digits (what ``whole_number`` takes at most).
MAX_WHOLE_NUMBER = 10**MAX_WHOLE_NUMBER_DIGITS - 1


class BadCursor(ValueError):
    """A cursor this site did not issue (malformed, naive, or an offset PostgreSQL cannot
    take). ``reason`` says what was wrong when that is worth telling the client, else ""."""

    def __init__(self, cursor: str, *, reason: str = ""):
        super().__init__(cursor)
        self.reason = reason


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def _unb64(cursor: str) -> dict[str, Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (binascii.Error, ValueError, UnicodeError) as exc:
        raise BadCursor(cursor) from exc
    if not isinstance(data, dict):
        raise BadCursor(cursor)
    return data


def encode_cursor(created_at: dt.datetime, pk: uuid.UUID) -> str:
    """The cursor of the row (created_at, pk): both at full precision."""
    return _b64({"t": created_at.astimezone(dt.UTC).isoformat(timespec="microseconds"), "id": str(pk)})


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """Decode a (created_at, id) cursor into (created_at in UTC, id). Raises BadCursor when
    it is not one of ours (malformed, naive, or a UTC offset PostgreSQL cannot take:
    flowforge.instants; ``reason`` then says so)."""
    data = _unb64(cursor)
    try:
        created_at = dt.datetime.fromisoformat(data["t"])
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        # Ours are UTC; a forged offset beyond ±15:59 would reach PostgreSQL and fail there (a 500).
        return storable_instant(created_at), uuid.UUID(data["id"])
    except InstantError as exc:
        raise BadCursor(cursor, reason=str(exc)) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadCursor(cursor) from exc


def encode_name_cursor(name: str) -> str:
    """The cursor of a name-ordered list after ``name``."""
    return _b64({"n": name})


def decode_name_cursor(cursor: str) -> str:
    """Decode a name cursor; BadCursor when it is not one of ours."""
    name = _unb64(cursor).get("n")
    if not isinstance(name, str) or "\x00" in name:
        raise BadCursor(cursor)
    return name


def encode_pair_cursor(first: str, second: str) -> str:
    """The cursor of a list ordered by two texts (a worker's queue and id) after (first, second)."""
    return _b64({"a": first, "b": second})


def decode_pair_cursor(cursor: str) -> tuple[str, str]:
    """Decode a two-text cursor; BadCursor when it is not one of ours."""
    data = _unb64(cursor)
    first, second = data.get("a"), data.get("b")
    if not isinstance(first, str) or not isinstance(second, str) or "\x00" in first + second:
        raise BadCursor(cursor)
    return first, second


def whole_number(raw: str | None) -> int | None:
    """``raw`` (surrounding spaces allowed) as an int of at most MAX_WHOLE_NUMBER_DIGITS
    digits; None when absent or not such a number (the caller decides whether that is
    an error)."""
    if raw is None:
        return None
    raw = raw.strip()
    if not raw or not raw.isascii() or not raw.isdigit() or len(raw) > MAX_WHOLE_NUMBER_DIGITS:
        return None
    return int(raw)


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a newest-first list: ``older``/``newer`` are the cursors of the
    adjacent pages (None when there is none, as far as one query can tell)."""

    rows: list[Any]
    older: str | None
    newer: str | None


def _optional(raw: str | None) -> tuple[dt.datetime, uuid.UUID] | None:
    return decode_cursor(raw) if raw else None


def newest_first_page(qs: QuerySet, *, older_than: str | None, newer_than: str | None, size: int) -> Page:
    """One page of ``qs`` ordered by (created_at DESC, id DESC), in either direction.

    ``older_than``: the rows after that cursor (the next, older page); ``newer_than``
    (wins when both are given): the rows before it (the previous, newer page). One
    query, fetching one row more than ``size`` to know whether the page has a
    neighbour on that side. Raises BadCursor for a cursor this site did not issue.
    """
    newer_cursor = _optional(newer_than)
    older_cursor = None if newer_cursor else _optional(older_than)
    if newer_cursor is not None:
        t, pk = newer_cursor
        # (created_at, id) > (t, pk), spelled so that ``created_at >= t`` is an index condition.
        rows = list(
            qs.filter(Q(created_at__gte=t) & (Q(created_at__gt=t) | Q(id__gt=pk))).order_by("created_at", "id")[
                : size + 1
            ]
        )
        more = len(rows) > size
        rows = rows[:size][::-1]
        if not rows:
            return Page(rows=[], older=None, newer=None)
        return Page(
            rows=rows,
            older=encode_cursor(rows[-1].created_at, rows[-1].pk),  # the cursor's own row is older
            newer=encode_cursor(rows[0].created_at, rows[0].pk) if more else None,
        )
    qs = qs.order_by("-created_at", "-id")
    if older_cursor is not None:
        t, pk = older_cursor
        # (created_at, id) < (t, pk), spelled so that ``created_at <= t`` is an index condition.
        qs = qs.filter(Q(created_at__lte=t) & (Q(created_at__lt=t) | Q(id__lt=pk)))
    rows = list(qs[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return Page(
        rows=rows,
        older=encode_cursor(rows[-1].created_at, rows[-1].pk) if more else None,
        newer=encode_cursor(rows[0].created_at, rows[0].pk) if older_cursor is not None and rows else None,
    )


def rows_after(qs: QuerySet, *, after: Any, field: str, size: int, descending: bool = False) -> tuple[list[Any], bool]:
    """Up to ``size`` rows of ``qs`` ordered by ``field`` (descending or not), strictly
    past ``after`` (None: from the start). Returns (rows, whether more exist). One query,
    fetching one row more than ``size``."""
    qs = qs.order_by(f"-{field}" if descending else field)
    if after is not None:
        qs = qs.filter(**{f"{field}__{'lt' if descending else 'gt'}": after})
    rows = list(qs[: size + 1])
    return rows[:size], len(rows) > size
