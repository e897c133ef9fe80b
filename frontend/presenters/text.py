"""Small presentation helpers of the run pages: durations, sizes, one-line JSON."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from engine.repositories import waiting

#: Joins a number to its unit: the two never land on separate lines.
NBSP = "\u00a0"


def human_duration(seconds: float | None) -> str:
    """``seconds`` as a short human duration ("340 ms", "12.4 s", "3 m 05 s", "2 h 07 m"),
    each number joined to its unit by a no-break space (NBSP: a narrow cell never wraps "2 h"
    / "07 m" as "2" / "h 07 m"); "" for None."""
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}{NBSP}ms"
    if seconds < 60:
        return f"{seconds:.1f}{NBSP}s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}{NBSP}m {s:02d}{NBSP}s"
    h, rem = divmod(int(seconds), 3600)
    return f"{h}{NBSP}h {rem // 60:02d}{NBSP}m"


def retry_at(state: str, not_before: dt.datetime | None, now: dt.datetime) -> dt.datetime | None:
    """When a task run waiting for its next attempt (ready, its retry backoff's
    ``not_before`` still ahead of ``now``) may be claimed again; None for any other."""
    if state == "ready" and not_before is not None and not_before > now:
        return not_before
    return None


def retry_at_html(at: dt.datetime) -> str:
    """"retrying at 14:03:07 UTC" (the date too when not today, UTC), with a ``<time>``
    element carrying the instant."""
    at = at.astimezone(dt.UTC)
    shown = f"{at:%H:%M:%S}" if at.date() == dt.datetime.now(dt.UTC).date() else f"{at:%b} {at.day}, {at:%H:%M:%S}"
    return f'retrying at <time datetime="{at.isoformat(timespec="seconds")}">{shown} UTC</time>'


def run_duration(started_at: dt.datetime | None, finished_at: dt.datetime | None, now: dt.datetime) -> str:
    """How long a run has been going (to ``now``) or went, as ``human_duration``; "—"
    for a run that never started (queued behind its workflow's run limit, or cancelled
    before it started): its time in the queue is no duration."""
    if started_at is None:
        return "—"
    return human_duration(seconds_between(started_at, finished_at or now))


def without_countdown(reason: str) -> str:
    """A wait reason without its trailing countdown (``engine.repositories.waiting``): a
    page refreshed only when the run's events come would show the seconds frozen."""
    return waiting.without_countdown(reason)


def human_bytes(n: int) -> str:
    """``n`` bytes as "812 B", "4.0 KiB", "255.0 KiB", "1.2 MiB" (number and unit joined by
    a no-break space, as ``human_duration``'s)."""
    if n < 1024:
        return f"{n}{NBSP}B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f}{NBSP}KiB"
    return f"{n / (1024 * 1024):.1f}{NBSP}MiB"


def seconds_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    """Seconds from ``start`` to ``end``; None when either is missing."""
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def compact_json(value: Any, *, limit: int) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters with an ellipsis."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def event_detail_text(detail: Any) -> str:
    """An event's detail as ``key: value`` pairs on one line (errors first; a traceback left
    out), at most 240 characters."""
    if not isinstance(detail, dict) or not detail:
        return ""
    # A failed attempt's traceback is the task panel's to show, whole.
    keys = sorted((k for k in detail if k != "traceback"), key=lambda k: (k != "error", k != "reason", k))
    parts = [f"{k}: {compact_json(detail[k], limit=160)}" for k in keys if detail[k] not in (None, "", {})]
    return compact_json("; ".join(parts), limit=240)


def cut(text: str | None, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis; "" for no text or a JSON null."""
    if not text or text == "null":  # no output, or a JSON null
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"
