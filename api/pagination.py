"""Keyset pagination of the API's lists, never OFFSET (seed 001): the cursors and the
keyset queries are flowforge.cursors (shared with the web UI); this module reads them
from the request and answers a malformed one with a 400 naming its parameter.

Every list of the API answers ``{"results": [...], "next": <full URL> | null}``; ``next``
is null on the last page. Three cursor shapes: runs (and other rows) newest first, an
opaque (created_at, id) cursor; workflow names, an opaque name cursor; versions of one
workflow and a run's events, plain integers (``version``, ``seq``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

from flowforge import cursors
from flowforge.cursors import BadCursor, encode_cursor, encode_name_cursor

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
CURSOR_MESSAGE = "is not a cursor this API issued; use the `next` link of a page"


def _invalid(exc: BadCursor, *, field: str = "cursor") -> ValidationError:
    message = f"{CURSOR_MESSAGE} ({exc.reason})" if exc.reason else CURSOR_MESSAGE
    return ValidationError({field: [message]})


def decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    """flowforge.cursors.decode_cursor, raising ValidationError({"cursor": ...}) (a 400)
    when it is not one of ours."""
    try:
        return cursors.decode_cursor(cursor)
    except BadCursor as exc:
        raise _invalid(exc) from exc


def decode_name_cursor(cursor: str) -> str:
    """Decode a workflow-name cursor; ValidationError({"cursor": ...}) when it is not one of ours."""
    try:
        return cursors.decode_name_cursor(cursor)
    except BadCursor as exc:
        raise _invalid(exc) from exc


def decode_pair_cursor(cursor: str) -> tuple[str, str]:
    """Decode a two-text cursor (workers by queue and id); ValidationError({"cursor": ...}) when it is not one of ours."""
    try:
        return cursors.decode_pair_cursor(cursor)
    except BadCursor as exc:
        raise _invalid(exc) from exc


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
    value = cursors.whole_number(raw)
    if value is None:
        raise ValidationError({field: [f"must be a whole number from 0 to {cursors.MAX_WHOLE_NUMBER} "
                                        f"(at most {cursors.MAX_WHOLE_NUMBER_DIGITS} digits)"]})
    return value


def next_link(request: Request, param: str, value: str | int) -> str:
    """The full URL of this request with ``param`` set to ``value`` (other parameters kept)."""
    return replace_query_param(request.build_absolute_uri(), param, value)


def paginate_newest_first(queryset: QuerySet, request: Request) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` ordered by (created_at DESC, id DESC), after the
    request's ``cursor``. Returns (rows, full URL of the next page or None).

    One query (flowforge.cursors.newest_first_page): it fetches one row more than the
    page to know whether a next page exists.
    """
    try:
        result = cursors.newest_first_page(queryset, older_than=request.query_params.get("cursor") or None,
                                           newer_than=None, size=page_size(request))
    except BadCursor as exc:
        raise _invalid(exc) from exc
    if result.older is None:
        return result.rows, None
    return result.rows, next_link(request, "cursor", result.older)


def paginate_by_name(queryset: QuerySet, request: Request) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` (one row per name, already ordered by name) after the
    request's name ``cursor``. Returns (rows, next URL or None). One query."""
    size = page_size(request)
    cursor = request.query_params.get("cursor")
    qs = queryset
    if cursor:
        qs = qs.filter(name__gt=decode_name_cursor(cursor))
    rows = list(qs[: size + 1])
    if len(rows) <= size:
        return rows, None
    rows = rows[:size]
    return rows, next_link(request, "cursor", encode_name_cursor(rows[-1].name))


def paginate_by_int(
    queryset: QuerySet, request: Request, *, field: str, param: str, descending: bool
) -> tuple[list[Any], str | None]:
    """One page of ``queryset`` ordered by the integer ``field`` (descending or not),
    strictly past ``?<param>=`` (400 naming ``param`` when it is not a whole number).
    Returns (rows, next URL or None): the next URL carries the last row's value. One query."""
    size = page_size(request)
    after = non_negative_int(request.query_params.get(param), field=param)
    rows, more = cursors.rows_after(queryset, after=after, field=field, size=size, descending=descending)
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
    "decode_pair_cursor",
    "encode_cursor",
    "non_negative_int",
    "page",
    "page_size",
    "paginate_by_int",
    "paginate_by_name",
    "paginate_newest_first",
]
