"""Keyset pagination over (created_at, id), never OFFSET (seed 001).

The cursor is opaque (base64url of JSON) and carries ``created_at`` as text at full
microsecond precision plus the id; the comparison casts both sides explicitly
(``timestamptz`` and ``uuid``), so a row sharing a millisecond with the page's last
row is neither skipped nor repeated, and page 500 costs what page 1 costs (an index
range scan on an index ending in ``created_at DESC, id DESC`` or ``created_at DESC``).
Rows inserted while a client pages are newer than its cursor, so they never shift
what the client has yet to see.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from typing import Any

from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def encode_cursor(created_at: dt.datetime, pk: uuid.UUID) -> str:
    raw = json.dumps({"t": created_at.astimezone(dt.UTC).isoformat(timespec="microseconds"), "id": str(pk)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """Decode a cursor; raise ValidationError({"cursor": ...}) when it is not one of ours."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        created_at = dt.datetime.fromisoformat(data["t"])
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, uuid.UUID(data["id"])
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValidationError({"cursor": ["is not a cursor this API issued; use the `next` link of a page"]}) from exc


def page_size(request: Request) -> int:
    raw = request.query_params.get("page_size")
    if raw in (None, ""):
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise ValidationError({"page_size": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}"]}) from None
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValidationError({"page_size": [f"must be a whole number from 1 to {MAX_PAGE_SIZE}"]})
    return size


def paginate_newest_first(queryset: QuerySet, request: Request) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` ordered by (created_at DESC, id DESC), after the
    request's ``cursor``. Returns (rows, full URL of the next page or None)."""
    size = page_size(request)
    cursor = request.query_params.get("cursor")
    qs = queryset.order_by("-created_at", "-id")
    if cursor:
        created_at, pk = decode_cursor(cursor)
        # (created_at, id) < (cursor.created_at, cursor.id), both sides of an explicit type.
        qs = qs.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=pk))
    rows = list(qs[: size + 1])
    next_url = None
    if len(rows) > size:
        rows = rows[:size]
        last = rows[-1]
        next_url = replace_query_param(request.build_absolute_uri(), "cursor", encode_cursor(last.created_at, last.pk))
    return rows, next_url
