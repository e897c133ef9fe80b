"""The one live-event loop of a run, for the API's event stream and the run page's change stream.

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` at the commit of every event of a
run someone watches (a RunSubscription row, migration 0007). ``stream()`` is the loop
both web apps serve; what it sends is a Feed's business:

- EventFeed (api.streaming): every event after the cursor as ``id: <seq>`` /
  ``data: <event JSON>``, ending right after the run's ``run_finished`` event;
- ChangeFeed (frontend.live): one ``change`` ({"seq", "state"}) whenever the run's
  ``last_event_seq`` passed what was last sent — a burst of events is one message, and
  the page fetches what changed — and ``end`` once the run is terminal or gone.

The loop, for either feed:

1. is admitted by its view only within the limits of engine.live_limits (``acquire``
   here: per process, per API key or user, per organization) and holds the StreamLease
   until it ends;
2. watches its run through the process's listener hub (engine.live_hub: one LISTEN
   connection per process, which subscribes the run) *before* its first read, so an
   event committed between the read and the subscription cannot be missed;
3. reads (the feed's ``read``) from its own cursor — ``seq``, never a clock — through
   the organization-scoped managers on its thread's Django connection;
4. releases that Django connection before each wait (unless a notification is already
   waiting), so a waiting stream holds no PostgreSQL connection and no transaction,
   and waits for the hub to announce its run, at most ``timings.poll_seconds`` (always,
   or only while the hub cannot deliver: ``timings.poll_while_live``), then reads again
   — the notification only says "look": a dropped one costs latency, never an event;
   ``timings.coalesce_seconds`` lets the rest of a burst arrive before that read;
5. re-authorizes before a read at least every FLOWFORGE_SSE_REAUTH_SECONDS (the lease's
   check) and stops when that fails (after the feed's ``refused`` message, if any);
6. sends a comment line after ``timings.heartbeat_seconds`` without output, so proxies
   and clients can tell a quiet run from a dead connection (and the WSGI server notices
   a client that went away on that write);
7. stops after ``timings.max_seconds`` (the client resumes with Last-Event-ID), and
   whatever the reason it ends — including the client going away (the WSGI server
   closes the response, which closes the generator) — closes its watch and releases its
   slots.

Each stream holds a gunicorn thread (gthread) while it lasts: FLOWFORGE_SSE_PER_PROCESS
keeps some threads of every process for ordinary requests.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from typing import Protocol

from engine import live_hub, live_limits
from engine.live_limits import LeasedStream, StreamLease, StreamRefused
from engine.models import RUN_TERMINAL_STATES, TaskRunEvent, WorkflowRun
from tenancy import reauthorization

__all__ = ["ChangeFeed", "EventFeed", "LeasedStream", "StreamRefused", "Timings", "acquire", "stream"]

# A heartbeat is due this many seconds early: a wait may return a little before its timeout.
HEARTBEAT_SLACK_SECONDS = 0.01


@dataclasses.dataclass(frozen=True)
class Timings:
    """The loop's clock, in seconds (``retry_milliseconds`` is EventSource's reconnection delay)."""

    heartbeat_seconds: float
    poll_seconds: float
    max_seconds: float
    retry_milliseconds: int
    # True: never wait longer than poll_seconds; False: only while notifications cannot be relied on.
    poll_while_live: bool = True
    coalesce_seconds: float = 0.0


class Feed(Protocol):
    """What a stream sends. ``cursor`` is the last seq sent (or the client's start)."""

    cursor: int
    #: The comment line sent after heartbeat_seconds of silence.
    heartbeat: str

    def read(self) -> Iterator[str]:
        """The messages due since ``cursor`` (advancing it); sets ``finished`` when the stream should end."""

    @property
    def finished(self) -> bool: ...

    def refused(self) -> Iterator[str]:
        """The last messages when re-authorization failed (may be none)."""


def acquire(*, organization_id: uuid.UUID, api_key_id: uuid.UUID | None = None, user_id=None) -> StreamLease:
    """The slots of a new stream for an API key (``api_key_id``) or a signed-in user
    (``user_id``) of ``organization_id`` (engine.live_limits), with the matching
    re-authorization: the key is still active and its organization exists, or the user
    is still an active member. Raises live_limits.StreamRefused (message and
    ``retry_after`` seconds) past a limit, holding nothing."""
    if api_key_id is not None:
        def reauthorize() -> bool:
            return reauthorization.api_key_still_valid(key_id=api_key_id, organization_id=organization_id)

        return live_limits.acquire(organization_id=organization_id, api_key_id=api_key_id, reauthorize=reauthorize)

    def reauthorize() -> bool:
        return reauthorization.member_still_active(user_id=user_id, organization_id=organization_id)

    return live_limits.acquire(organization_id=organization_id, user_id=user_id, reauthorize=reauthorize)


def stream(feed: Feed, *, organization_id: uuid.UUID, run_id: uuid.UUID, timings: Timings,
           lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the server-sent text of ``feed`` for ``run_id`` until the feed finishes, the
    lease's re-authorization fails or ``timings.max_seconds`` pass (module docstring).

    The first item is the ``retry:`` line. The run is watched from the first ``next()``
    until the generator finishes or is closed; ``lease`` (from ``acquire``) is re-checked
    before every read and released at the end."""
    watch = None
    try:
        # Watched (LISTEN + subscription, on the hub's connection) before the first read:
        # an event committed later is announced; one committed earlier is in the first read.
        watch = live_hub.watch(organization_id=organization_id, run_id=run_id)
        started = last_output = time.monotonic()
        yield f"retry: {timings.retry_milliseconds}\n\n"
        while True:
            if lease is not None and not lease.still_allowed():
                yield from feed.refused()  # the key was revoked or expired, or the member left
                return
            for message in feed.read():
                yield message
                last_output = time.monotonic()
            if feed.finished:
                return
            now = time.monotonic()
            if now - started >= timings.max_seconds:
                return
            wait = min(timings.heartbeat_seconds - (now - last_output), timings.max_seconds - (now - started))
            if timings.poll_while_live or not watch.live:
                wait = min(wait, timings.poll_seconds)
            if lease is not None:
                wait = min(wait, lease.seconds_to_next_check())
            if not watch.pending:
                live_hub.release_connection()  # hold no connection while waiting
            if watch.wait(wait):
                if timings.coalesce_seconds:
                    # Let the rest of a burst arrive, then read once for all of it.
                    time.sleep(timings.coalesce_seconds)
                    watch.wait(0)
            elif time.monotonic() - last_output >= timings.heartbeat_seconds - HEARTBEAT_SLACK_SECONDS:
                yield feed.heartbeat
                last_output = time.monotonic()
    finally:
        if watch is not None:
            watch.close()
        if lease is not None:
            lease.release()


# --- the API's feed: every event -------------------------------------------------------------------

# Events read per query.
EVENT_BATCH = 500


def format_event(event_id: int, data: dict) -> str:
    """One SSE message without an event name. JSON has no raw newlines, so ``data`` is one line."""
    return f"id: {event_id}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def event_data(event: TaskRunEvent, run_id: uuid.UUID) -> dict:
    """The JSON object of one event as the API's stream sends it (task_run__task loaded)."""
    return {
        "seq": event.seq,
        "run": str(run_id),
        "kind": event.kind,
        "task_run": str(event.task_run_id) if event.task_run_id else None,
        "task_key": event.task_run.task.key if event.task_run_id else None,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "attempt": event.attempt,
        "fencing_token": event.fencing_token,
        "detail": event.detail,
        "created_at": event.created_at.isoformat(),
    }


class EventFeed:
    """Every event of the run after ``after`` (``id: <seq>`` / ``data: <json>``), then the
    new ones as they commit; finished right after its last ``run_finished`` (one followed by
    a ``resumed`` event is not the end), or at once when the run is gone or terminal with
    nothing left to send (a client resuming past the end)."""

    heartbeat = ": heartbeat\n\n"

    def __init__(self, *, organization_id: uuid.UUID, run_id: uuid.UUID, after: int):
        self.cursor = after
        self.finished = False
        self._run_id = run_id
        self._events = TaskRunEvent.objects.for_organization(organization_id).filter(workflow_run_id=run_id)
        self._runs = WorkflowRun.objects.for_organization(organization_id).filter(pk=run_id)

    def read(self) -> Iterator[str]:
        while True:
            # Everything after the cursor, in seq order (uniq_event_run_seq serves the range).
            while True:
                batch = list(self._events.filter(seq__gt=self.cursor).select_related("task_run__task")
                             .order_by("seq")[:EVENT_BATCH])
                for event in batch:
                    yield format_event(event.seq, event_data(event, self._run_id))
                    self.cursor = event.seq
                    if event.kind == "run_finished" and not self._resumed_after(event.seq):
                        self.finished = True
                        return
                if len(batch) < EVENT_BATCH:
                    break
            state = self._runs.values_list("state", "last_event_seq").first()
            if state is None:
                self.finished = True  # the run is gone
                return
            if state[0] not in RUN_TERMINAL_STATES:
                return
            if state[1] <= self.cursor:
                self.finished = True  # resumed after run_finished: nothing more will come
                return
            # Terminal, and its last events committed after our read: read them now.

    def _resumed_after(self, seq: int) -> bool:
        """Whether the run was resumed after its ``run_finished`` event ``seq`` (engine.recovery):
        its history goes on, and so does the stream (uniq_event_run_seq serves the range)."""
        return self._events.filter(seq__gt=seq, kind="resumed").exists()

    def refused(self) -> Iterator[str]:
        return iter(())  # nothing more, not even a last message


# --- the run page's feed: "this run changed" -------------------------------------------------------


def message(event: str, data: dict, *, event_id: int | None = None) -> str:
    """One named server-sent event. JSON has no raw newlines, so ``data`` is a single line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class ChangeFeed:
    """``change`` ({"seq", "state"}, ``id: <seq>``) each time the run's history passed the
    cursor, ``end`` once the run is terminal or gone, or when re-authorization fails
    ({"seq", "state": "unauthorized"}). Carries no event data: the page fetches its live
    fragment on ``change``, so messages never grow with the run."""

    heartbeat = ": keep-alive\n\n"

    def __init__(self, *, organization_id: uuid.UUID, run_id: uuid.UUID, after: int):
        self.cursor = after
        self.finished = False
        self._runs = WorkflowRun.objects.for_organization(organization_id).filter(pk=run_id)

    def read(self) -> Iterator[str]:
        row = self._runs.values_list("state", "last_event_seq").first()
        if row is None:
            self.finished = True
            yield message("end", {"seq": self.cursor, "state": "gone"})
            return
        state, seq = row
        if seq > self.cursor:
            self.cursor = seq
            yield message("change", {"seq": seq, "state": state}, event_id=seq)
        if state in RUN_TERMINAL_STATES:
            self.finished = True
            yield message("end", {"seq": seq, "state": state}, event_id=seq)

    def refused(self) -> Iterator[str]:
        yield message("end", {"seq": self.cursor, "state": "unauthorized"})
