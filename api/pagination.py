"""Keyset pagination, never OFFSET (seed 001).

Every list of the API answers ``{"results": [...], "next": <full URL> | null}``; ``next``
is null on the last page. A page is "the rows after the cursor", found by an index
range scan, so page 500 costs what page 1 costs, and rows inserted while a client
pages never shift what it has yet to see (with OFFSET they would: a newer row pushes
every later row one place down, and the client sees one twice or skips one).

Three cursor shapes:

- runs, newest first: an opaque cursor (base64url of JSON) holding ``created_at`` as
  text at full microsecond precision plus the id. A millisecond-precision cursor would
  sort before the row it came from and skip every row sharing that millisecond (seed
  001: "paging 12 executions returned 9"). The predicate is
  ``created_at <= t AND (created_at < t OR id < pk)``: the first conjunct is an index
  condition on ``(…, created_at DESC, id DESC)`` / ``(workflow, created_at DESC)``, the
  second only discards the few rows sharing ``t``. Parameters are typed (``timestamptz``
  and ``uuid``), never compared as text, which would order UUIDs lexically;
- workflow names (alphabetical): an opaque cursor holding the last name;
- versions of one workflow and a run's events: plain integers (``version``, ``seq``).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

from flowforge.instants import InstantError, storable_instant

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
CURSOR_MESSAGE = "is not a cursor this API issued; use the `next` link of a page"


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def _unb64(cursor: str, *, field: str = "cursor") -> dict[str, Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (binascii.Error, ValueError, UnicodeError) as exc:
        raise ValidationError({field: [CURSOR_MESSAGE]}) from exc
    if not isinstance(data, dict):
        raise ValidationError({field: [CURSOR_MESSAGE]})
    return data


def encode_cursor(created_at: dt.datetime, pk: uuid.UUID) -> str:
    """The cursor of the row (created_at, pk): both at full precision."""
    return _b64({"t": created_at.astimezone(dt.UTC).isoformat(timespec="microseconds"), "id": str(pk)})


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """Decode a (created_at, id) cursor into (created_at in UTC, id); raise
    ValidationError({"cursor": ...}) when it is not one of ours (malformed, naive, or a
    UTC offset PostgreSQL cannot take: flowforge.instants)."""
    data = _unb64(cursor)
    try:
        created_at = dt.datetime.fromisoformat(data["t"])
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        # Ours are UTC; a forged offset beyond ±15:59 would reach PostgreSQL and fail there (a 500).
        return storable_instant(created_at), uuid.UUID(data["id"])
    except InstantError as exc:
        raise ValidationError({"cursor": [f"{CURSOR_MESSAGE} ({exc})"]}) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValidationError({"cursor": [CURSOR_MESSAGE]}) from exc


def encode_name_cursor(name: str) -> str:
    return _b64({"n": name})


def decode_name_cursor(cursor: str) -> str:
    """Decode a workflow-name cursor; ValidationError({"cursor": ...}) when it is not one of ours."""
    name = _unb64(cursor).get("n")
    if not isinstance(name, str) or "\x00" in name:
        raise ValidationError({"cursor": [CURSOR_MESSAGE]})
    return name


def page_size(request: Request) -> int:
    """``?page_size=`` (1 to MAX_PAGE_SIZE, default DEFAULT_PAGE_SIZE); 400 naming ``page_size`` otherwise."""
    raw = request.query_params.get("page_size")
    if raw in (None, ""):
        return DEFAULT_PAGE_SIZE
    message = f"must be a whole number from 1 to {MAX_PAGE_SIZE}"
    if not raw.isascii() or not raw.isdigit():
        raise ValidationError({"page_size": [message]})
    size = int(raw)
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValidationError({"page_size": [message]})
    return size


def non_negative_int(raw: str | None, *, field: str) -> int | None:
    """Parse an integer cursor such as ``?after=`` (None when absent); 400 naming ``field`` otherwise."""
    if raw is None or raw == "":
        return None
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ValidationError({field: ["must be a whole number of at least 0"]})
    return int(raw)


def next_link(request: Request, param: str, value: str | int) -> str:
    """The full URL of this request with ``param`` set to ``value`` (other parameters kept)."""
    return replace_query_param(request.build_absolute_uri(), param, value)


def _split(rows: Sequence[Any], size: int) -> tuple[list[Any], bool]:
    rows = list(rows)
    return rows[:size], len(rows) > size


def paginate_newest_first(queryset: QuerySet, request: Request) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` ordered by (created_at DESC, id DESC), after the
    request's ``cursor``. Returns (rows, full URL of the next page or None).

    One query: it fetches one row more than the page to know whether a next page exists.
    """
    size = page_size(request)
    cursor = request.query_params.get("cursor")
    qs = queryset.order_by("-created_at", "-id")
    if cursor:
        created_at, pk = decode_cursor(cursor)
        # (created_at, id) < (t, pk), spelled so that ``created_at <= t`` is an index condition.
        qs = qs.filter(Q(created_at__lte=created_at) & (Q(created_at__lt=created_at) | Q(id__lt=pk)))
    rows, more = _split(qs[: size + 1], size)
    if not more:
        return rows, None
    last = rows[-1]
    return rows, next_link(request, "cursor", encode_cursor(last.created_at, last.pk))


def paginate_by_name(queryset: QuerySet, request: Request) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` (one row per name, already ordered by name) after the
    request's name ``cursor``. Returns (rows, next URL or None). One query."""
    size = page_size(request)
    cursor = request.query_params.get("cursor")
    qs = queryset
    if cursor:
        qs = qs.filter(name__gt=decode_name_cursor(cursor))
    rows, more = _split(qs[: size + 1], size)
    if not more:
        return rows, None
    return rows, next_link(request, "cursor", encode_name_cursor(rows[-1].name))


def paginate_by_int(
    queryset: QuerySet, request: Request, *, field: str, param: str, descending: bool
) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` ordered by the integer ``field`` (descending or not),
    strictly past ``?<param>=`` (400 naming ``param`` when it is not a whole number).
    Returns (rows, next URL or None): the next URL carries the last row's value. One query."""
    size = page_size(request)
    after = non_negative_int(request.query_params.get(param), field=param)
    qs = queryset.order_by(f"-{field}" if descending else field)
    if after is not None:
        qs = qs.filter(**{f"{field}__{'lt' if descending else 'gt'}": after})
    rows, more = _split(qs[: size + 1], size)
    if not more:
        return rows, None
    return rows, next_link(request, param, getattr(rows[-1], field))


def page(results: list[Any], next_url: str | None) -> dict[str, Any]:
    """The body of a list response."""
    return {"results": results, "next": next_url}


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "decode_cursor",
    "encode_cursor",
    "non_negative_int",
    "page",
    "page_size",
    "paginate_by_int",
    "paginate_by_name",
    "paginate_newest_first",
]
