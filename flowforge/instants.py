"""Instants (timezone-aware datetimes) that came from a request, made safe to store or
compare in PostgreSQL.

Python's ISO 8601 parser accepts any UTC offset under 24 hours (``+20:00``), but
PostgreSQL's ``timestamptz`` refuses an offset beyond ±15:59 ("time zone displacement
out of range"), so such a value reached the database and became a 500. No time zone
has an offset beyond ±14:00; every parser of a client's instant (API cursors and
filters, the web pages' page links and date filters) goes through ``storable_instant``.
"""

from __future__ import annotations

import datetime as dt

# PostgreSQL's limit for a timestamptz's offset (src/include/datatype/timestamp.h: TZDISP_LIMIT).
MAX_UTC_OFFSET = dt.timedelta(hours=15, minutes=59)
OFFSET_MESSAGE = "The UTC offset must be between -15:59 and +15:59."
RANGE_MESSAGE = "The instant is out of range once converted to UTC."


class InstantError(ValueError):
    """An instant PostgreSQL cannot take; ``str()`` is a sentence for the client."""


def storable_instant(value: dt.datetime) -> dt.datetime:
    """``value`` (timezone-aware) converted to UTC.

    Raises InstantError(OFFSET_MESSAGE) when its UTC offset is beyond ±15:59, and
    InstantError(RANGE_MESSAGE) when it leaves Python's calendar once in UTC (year 1
    with a positive offset, year 9999 with a negative one). A naive ``value`` is
    returned unchanged (callers decide what a naive instant means).
    """
    offset = value.utcoffset()
    if offset is None:
        return value
    if abs(offset) > MAX_UTC_OFFSET:
        raise InstantError(OFFSET_MESSAGE)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise InstantError(RANGE_MESSAGE) from None
