"""The hand-off watchdog: a slow task does not hold up the rest of its message for long;
and the yield: a several-generation message does not hold its thread from a more urgent one.

An ``execute_task_runs`` message carries several generations that one thread runs in
turn (``execute_many``). Its pending generations are a ``Group``; the thread takes them
one by one. One daemon thread per process (``HandOff``) looks at the registered groups
every quarter of FLOWFORGE_GROUP_HANDOFF_SECONDS (0.05 to 0.5 s) and, for each running
longer than that, takes every generation not yet started and sends each back to the
broker as its own ``execute_task_run`` message, once per group. What the broker refuses
is put back for the group's own thread. A handed-off generation is fenced as usual, so
whichever thread starts it first runs it and the other sees a duplicate.

``yield_rest``: between two generations of such a message, when the worker process has
fetched a more urgent message (a first-lane generation of another organization, or a
control actor such as the scheduler's claim) that waits for a thread, the thread hands
the rest of its message back the same way and takes that one next
(``engine.worker.execute.execute_many``). Without it, a fetched first-lane message waits
for a thread to finish a whole message of its neighbour's backlog (8 generations of 50 ms
in ``tests/integration/test_scheduling.py``'s fairness scenario).
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from django.conf import settings

from engine.dispatch import dispatch_message, enqueue_many
from engine.states import TASK_QUEUE

log = logging.getLogger(__name__)


class Group:
    """The generations of one ``execute_task_runs`` message, [(task_run_id, fencing_token),
    ...], that its thread has not started yet (taken one by one by that thread, or all at
    once by ``HandOff``). ``began``: ``time.monotonic()`` when the thread took the message."""

    __slots__ = ("pending", "size", "began", "_lock")

    def __init__(self, dispatches: list[tuple[str, int]]):
        self.pending = collections.deque(dispatches)
        self.size = len(dispatches)
        self.began = time.monotonic()
        self._lock = threading.Lock()

    def take_next(self) -> tuple[str, int] | None:
        """The next generation for the group's thread, or None when none is left."""
        with self._lock:
            return self.pending.popleft() if self.pending else None

    def take_rest(self) -> list[tuple[str, int]]:
        """Every generation not taken yet (the group is left empty)."""
        with self._lock:
            rest = list(self.pending)
            self.pending.clear()
            return rest

    def put_back(self, pairs: list[tuple[str, int]]) -> None:
        """Return ``pairs`` to the front of the group, in their order."""
        with self._lock:
            self.pending.extendleft(reversed(pairs))


class HandOff:
    """One daemon thread per worker process that, every quarter of
    FLOWFORGE_GROUP_HANDOFF_SECONDS (0.05 to 0.5 s), hands the generations not yet
    started of each ``execute_task_runs`` message running longer than that back to the
    broker, once per message. Ones the broker refuses are put back for their thread to run."""

    def __init__(self) -> None:
        self._groups: set[Group] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, group: Group) -> None:
        """Watch ``group`` (a group of one is ignored: nothing could wait behind another)."""
        if group.size < 2:
            return
        with self._lock:
            self._groups.add(group)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flowforge-handoff", daemon=True)
                self._thread.start()

    def unregister(self, group: Group) -> None:
        """Stop watching ``group`` (its thread is done with it)."""
        with self._lock:
            self._groups.discard(group)

    def check(self) -> None:
        """Hand off the waiting generations of every message past the limit, once each.
        Re-raises what sending raised after putting the generations back."""
        limit = settings.FLOWFORGE_GROUP_HANDOFF_SECONDS
        now = time.monotonic()
        with self._lock:
            due = [g for g in self._groups if now - g.began > limit]
            self._groups.difference_update(due)  # one try each: what the broker refuses stays with its thread
        for group in due:
            rest = group.take_rest()
            if not rest:
                continue
            try:
                refused = _hand_off(rest)
            except BaseException:
                group.put_back(rest)  # their thread runs them after all
                raise
            group.put_back(refused)
            log.info("handed %d of %d generations of a message back to the broker after %.1f s",
                     len(rest) - len(refused), group.size, now - group.began)

    def _loop(self) -> None:
        while True:
            time.sleep(min(0.5, max(0.05, settings.FLOWFORGE_GROUP_HANDOFF_SECONDS / 4)))
            try:
                self.check()
            except Exception:
                log.exception("handing generations back to the broker failed; their threads run them")


_hand_off_watchdog: HandOff | None = None


def hand_off_watchdog() -> HandOff:
    """This process's HandOff (created on first use)."""
    global _hand_off_watchdog
    if _hand_off_watchdog is None:
        _hand_off_watchdog = HandOff()
    return _hand_off_watchdog


def yield_rest(group: Group) -> int:
    """Hand every generation of ``group`` not started yet back to the broker (one
    ``execute_task_run`` message each, as ``HandOff`` does), so its thread is free for a
    more urgent message; returns how many went (the ones the broker refused are put back
    for the thread). Re-raises what sending raised after putting them back."""
    rest = group.take_rest()
    if not rest:
        return 0
    try:
        refused = _hand_off(rest)
    except BaseException:
        group.put_back(rest)
        raise
    group.put_back(refused)
    log.info("handed %d of %d generations of a message back to the broker for a more urgent message",
             len(rest) - len(refused), group.size)
    return len(rest) - len(refused)


def _hand_off(dispatches: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Send each generation as its own ``execute_task_run`` message, in one broker round
    trip; returns the ones the broker refused (logged)."""
    refused = []
    for pair, error in zip(dispatches, enqueue_many([dispatch_message([pair], TASK_QUEUE) for pair in dispatches]), strict=True):
        if error is not None:
            log.warning("handing task run %s generation %s back to the broker failed (%s); running it here",
                        pair[0], pair[1], error)
            refused.append(pair)
    return refused
