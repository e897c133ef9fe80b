"""The interval arithmetic the scheduling scenarios read from events (tests/integration/timeline.py),
on hand-made timelines whose answers are worked out in each test."""

from __future__ import annotations

import datetime as dt

from tests.integration.timeline import Event, holds, max_overlap, per_window, runs

T0 = dt.datetime(2024, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def life(task, start: float, begin: float, end: float, end_kind: str = "succeeded", seq0: int = 1):
    """claimed at start, started at begin, leaves running at end."""
    return [
        Event(task, seq0, "claimed", "ready", "running", at(start)),
        Event(task, seq0 + 1, "started", "running", "running", at(begin)),
        Event(task, seq0 + 2, end_kind, "running", "succeeded" if end_kind == "succeeded" else "ready", at(end)),
    ]


def test_three_back_to_back_holders_never_overlap_more_than_one():
    # a holds [0, 1), b [1, 2), c [2, 3): touching ends do not overlap, so 1.
    events = life("a", 0, 0.1, 1) + life("b", 1, 1.1, 2) + life("c", 2, 2.1, 3)
    assert max_overlap(holds(events))[0] == 1


def test_overlap_counts_claimed_not_started_holders():
    # a holds [0, 5); b [1, 4); c claimed at 2, started at 3.9, ends 6.
    # At 2.5: a, b, c hold (3); only a and b run (c has not started): runs overlap 2 until 3.9,
    # then a, b, c run together until 4 -> runs overlap 3 at 3.9.
    events = life("a", 0, 0.5, 5) + life("b", 1, 1.5, 4) + life("c", 2, 3.9, 6)
    assert max_overlap(holds(events)) == (3, at(2))
    assert max_overlap(runs(events)) == (3, at(3.9))


def test_killed_attempt_holds_until_its_lease_expired_event_then_retry_is_a_new_hold():
    # a: claimed 0, started 0.1, lease_expired at 4 (running -> ready), claimed again 4.2,
    # started 4.3, succeeded 5. b holds [1, 3). Holds of a: [0, 4) and [4.2, 5).
    events = life("a", 0, 0.1, 4, end_kind="lease_expired") + life("a", 4.2, 4.3, 5, seq0=4) + life("b", 1, 1.1, 3)
    hs = sorted(holds(events), key=lambda i: i.start)
    assert [(i.task_run_id, i.start, i.end, i.closed_by) for i in hs] == [
        ("a", at(0), at(4), "lease_expired"), ("b", at(1), at(3), "succeeded"), ("a", at(4.2), at(5), "succeeded"),
    ]
    assert max_overlap(hs)[0] == 2


def test_open_interval_counts_to_the_end():
    events = life("a", 0, 0.1, 1)[:2] + life("b", 5, 5.1, 6)
    hs = holds(events)
    assert {(i.task_run_id, i.end) for i in hs} == {("a", None), ("b", at(6))}
    assert max_overlap(hs) == (2, at(5))


def test_fixed_windows_are_aligned_to_epoch_seconds():
    # T0 is a whole second: 0.0 and 0.999 fall in window k, 1.0 in k + 1, 2.5 in k + 2.
    k = int(T0.timestamp())
    assert per_window([at(0), at(0.999), at(1.0), at(2.5)], 1) == {k: 2, k + 1: 1, k + 2: 1}
