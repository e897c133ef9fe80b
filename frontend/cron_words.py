"""A cron expression in words, for the trigger pages.

The ``cron-descriptor`` library describes every expression; this module puts the
common patterns into the pages' own words first, because the library cannot give the
wording the pages (and tests/unit/test_web_triggers.py) use: it says "At 02:30" where
the page says "At 02:30 every day", "Every hour" for "Every hour, on the hour", "At 5
minutes past the hour" for "Every hour at 5 minutes past", "At 09:30, Monday through
Friday" for "At 09:30 on Monday through Friday", "on day 1 and 15 of the month" for
"on days 1 and 15 of the month", "At 0 minutes past the hour, between 09:00 and 17:59"
for "Every hour from 09:00 through 17:00" — and it has no option for any of these.
Everything else (steps within ranges, ``W``, ``#``...) is the library's.
"""

from __future__ import annotations

from cron_descriptor import get_description

_WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DOW_NAMES = {d[:3].lower(): i for i, d in enumerate(_WEEKDAYS)}
_MONTH_NAMES = {m[:3].lower(): i + 1 for i, m in enumerate(_MONTHS)}


class _Unsupported(Exception):
    """A field this describer does not put into words (the fallback takes over)."""


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _value(token: str, names: dict[str, int] | None = None) -> int:
    if token.isdigit():
        return int(token)
    if names and token.lower() in names:
        return names[token.lower()]
    raise _Unsupported(token)


def _items(field: str, names: dict[str, int] | None = None) -> list[tuple[int, int]]:
    """A list field ("1,3-5") as (first, last) ranges; steps are not handled here."""
    out = []
    for part in field.split(","):
        if "/" in part or part in ("*", "?") or not part:
            raise _Unsupported(field)
        if "-" in part:
            a, b = part.split("-", 1)
            out.append((_value(a, names), _value(b, names)))
        else:
            v = _value(part, names)
            out.append((v, v))
    return out


def _step(field: str) -> int | None:
    """N for "*/N", else None."""
    if field.startswith("*/") and field[2:].isdigit() and int(field[2:]) > 0:
        return int(field[2:])
    return None


def _days(dom: str, month: str, dow: str) -> str:
    parts = []
    if dom not in ("*", "?"):
        if dom.upper() == "L":
            parts.append("on the last day of the month")
        else:
            ranges = _items(dom)
            words = [f"{a}" if a == b else f"{a} to {b}" for a, b in ranges]
            single = len(ranges) == 1 and ranges[0][0] == ranges[0][1]
            parts.append(f"on day{'' if single else 's'} {_and(words)} of the month")
    if dow not in ("*", "?"):
        # 0 and 7 are both Sunday.
        ranges = [(a % 7, a % 7) if a == b else (a % 7, b) for a, b in _items(dow, _DOW_NAMES)]
        words = []
        for a, b in ranges:
            if a == b:
                words.append(_WEEKDAYS[a])
            else:
                words.append(f"{_WEEKDAYS[a]} through {_WEEKDAYS[b % 7]}")
        text = "on " + _and(words)
        parts.append(("or " if parts else "") + text)  # cron: either day field matches
    if month != "*":
        ranges = _items(month, _MONTH_NAMES)
        if not all(1 <= a <= 12 and 1 <= b <= 12 for a, b in ranges):
            raise _Unsupported(month)
        words = [
            _MONTHS[a - 1] if a == b else f"{_MONTHS[a - 1]} through {_MONTHS[b - 1]}" for a, b in ranges
        ]
        parts.append("in " + _and(words))
    return " ".join(parts) if parts else "every day"


def _times(minute: str, hour: str) -> str:
    m_step, h_step = _step(minute), _step(hour)
    if minute == "*" and hour == "*":
        return "Every minute"
    if m_step and hour == "*":
        return "Every minute" if m_step == 1 else f"Every {m_step} minutes"
    if minute.isdigit() and hour == "*":
        return "Every hour, on the hour" if int(minute) == 0 else f"Every hour at {int(minute)} minutes past"
    if minute.isdigit() and h_step:
        at = "on the hour" if int(minute) == 0 else f"at {int(minute)} minutes past"
        return f"Every {h_step} hours, {at}" if h_step > 1 else f"Every hour, {at}"
    if minute == "*" or m_step:
        every = "Every minute" if minute == "*" or m_step == 1 else f"Every {m_step} minutes"
        hours = _items(hour)
        spans = [f"{a:02d}:00 through {b:02d}:59" for a, b in hours]
        return f"{every}, {_and(spans)}"
    hour_ranges = _items(hour)
    if minute.isdigit() and len(hour_ranges) == 1 and hour_ranges[0][0] < hour_ranges[0][1]:
        (a, b), m = hour_ranges[0], int(minute)
        return f"Every hour from {a:02d}:{m:02d} through {b:02d}:{m:02d}"
    minutes = [m for a, b in _items(minute) for m in range(a, b + 1)]
    hours = [h for a, b in hour_ranges for h in range(a, b + 1)]
    if not all(0 <= m <= 59 for m in minutes) or not all(0 <= h <= 23 for h in hours):
        raise _Unsupported(minute + " " + hour)
    times = sorted(f"{h:02d}:{m:02d}" for h in hours for m in minutes)
    if len(times) > 6:
        raise _Unsupported(minute + " " + hour)
    return "At " + _and(times)


def describe_cron(expression: str) -> str:
    """``expression`` (five cron fields) in plain English, e.g. "At 09:30 on Monday
    through Friday" for ``30 9 * * 1-5``; times are in the trigger's own zone.

    Common patterns are put into words here (the module docstring says why); anything
    else is cron-descriptor's description, and when the library refuses the expression
    the fields are named one by one. Returns "" for text that is not five fields (the
    service reports that).
    """
    fields = (expression or "").split()
    if len(fields) != 5:
        return ""
    minute, hour, dom, month, dow = fields
    try:
        times = _times(minute, hour)
        days = _days(dom, month, dow)
    except (_Unsupported, IndexError, ValueError):
        pass
    else:
        if times.startswith("At "):
            return f"{times} {days}"
        return times if days == "every day" else f"{times}, {days}"
    try:
        return str(get_description(" ".join(fields)))
    except Exception:  # noqa: BLE001 - the library refused the expression: name the fields instead
        pass
    return f"Minute {minute}, hour {hour}, day of month {dom}, month {month}, day of week {dow}"
