"""The web's newest-first lists: page links and date-bound filters (runs, audit log).

The keyset queries and cursors are flowforge.cursors' (the API's too); a cursor that
is not ours raises flowforge.cursors.BadCursor, which a view answers with a notice and
the newest page.
"""

from __future__ import annotations

import datetime as dt

from django import forms
from django.http import HttpRequest

from flowforge.cursors import BadCursor, Page, newest_first_page
from flowforge.instants import InstantError, storable_instant

__all__ = ["BadCursor", "DateBound", "Page", "lower_bound", "newest_first_page", "page_links", "upper_bound"]


def page_links(request: HttpRequest, page: Page) -> dict[str, str | None]:
    """Query strings of the older/newer pages: the request's filters plus the cursor."""

    def link(param: str, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        query = request.GET.copy()
        query.pop("older_than", None)
        query.pop("newer_than", None)
        query[param] = cursor
        return "?" + query.urlencode()

    return {"older": link("older_than", page.older), "newer": link("newer_than", page.newer)}


class DateBound(forms.Field):
    """A date (``2025-06-01``) or a date and time (``2025-06-01T14:30``), in UTC unless it
    names its offset (``+02:00``, at most ±15:59: flowforge.instants); a form error otherwise."""

    def to_python(self, value: str | None) -> dt.datetime | dt.date | None:
        value = (value or "").strip()
        if not value:
            return None
        try:
            if "T" in value or " " in value:
                parsed = dt.datetime.fromisoformat(value)
                # An offset beyond ±15:59 would reach PostgreSQL and fail there (a 500).
                return storable_instant(parsed) if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
            return dt.date.fromisoformat(value)
        except InstantError as exc:
            raise forms.ValidationError(str(exc)) from None
        except ValueError:
            raise forms.ValidationError("Enter a date as YYYY-MM-DD.") from None


def lower_bound(value: dt.datetime | dt.date | None) -> dt.datetime | None:
    """The first instant a "from" bound includes (a date: its midnight, UTC)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value, dt.time.min, tzinfo=dt.UTC)


def upper_bound(value: dt.datetime | dt.date | None) -> dt.datetime | None:
    """The first instant a "to" bound excludes (a date: the next midnight, so the day is included)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value + dt.timedelta(days=1), dt.time.min, tzinfo=dt.UTC)
