"""Live run pages: a server-sent "this run changed" stream fed by PostgreSQL LISTEN/NOTIFY.

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` at the commit of every event
(seed 001: the trigger is the design, so no writer can forget to announce). The run
page's client (``static/frontend/run-live.js``) listens to ``/runs/<id>/stream/`` and,
on each ``change``, fetches the page's live fragment (``/runs/<id>/live/?after=<seq>``)
and swaps it in. The stream carries no event data, only the run's latest ``seq`` and
state, so it never renders templates and its message size does not grow with the run.

A stream:

1. is admitted by the view only within the limits of engine.live_limits (per process,
   per user, per organization: a plain-text 429 with Retry-After beyond them, after which
   the page polls the fragment instead), and holds its StreamLease until it ends;
2. watches the run through the process's listener hub (``engine.live_hub``: one LISTEN
   connection per process, which keeps the run's subscription — the trigger notifies
   only for runs someone watches) *before* its first read, so an event committed
   between the read and the subscription is not missed;
3. reads the run (``core_workflowrun`` by id and organization) on its thread's Django
   connection and closes that connection before each wait, so it holds no connection and
   no transaction while it waits;
4. sends ``change`` (``id: <seq>``) whenever the run's ``last_event_seq`` passed what it
   last sent, coalescing a burst of notifications (a 200-task fan-out commits many
   events at once) into one message;
5. waits for the hub to announce its run, at most HEARTBEAT_SECONDS (POLL_SECONDS while
   the hub cannot deliver notifications), and re-reads — the notification only says
   "look", so a dropped one costs latency, never a change;
6. re-authorizes at least every FLOWFORGE_SSE_REAUTH_SECONDS (the user is still active
   and a member of the run's organization); when that fails it sends ``end`` and stops;
7. sends ``end`` and stops once the run is terminal (the client then closes, so the
   browser does not reconnect), and stops after MAX_STREAM_SECONDS (the browser
   reconnects with Last-Event-ID, the last seq it was told about);
8. stops watching and releases its slots whatever the reason it ends, including the
   client going away (the WSGI server closes the response on its next write; a
   keep-alive comment every HEARTBEAT_SECONDS makes that write happen).

Each open stream holds one web worker thread for its duration: serve the web with
threads (``gunicorn --worker-class gthread --threads N``) and keep
FLOWFORGE_SSE_PER_PROCESS below N.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

from engine import live as subscriptions
from engine import live_hub
from engine.live_limits import StreamLease
from engine.models import RUN_TERMINAL_STATES, WorkflowRun

CHANNEL = subscriptions.CHANNEL  # the trigger's channel

# Seconds without output after which a keep-alive comment is sent (and a re-read made).
HEARTBEAT_SECONDS = 15.0
# Longest wait, in seconds, while notifications cannot be relied on (no subscription yet, hub reconnecting).
POLL_SECONDS = 5.0
# Seconds after which a stream ends; the browser reconnects with Last-Event-ID.
MAX_STREAM_SECONDS = 300.0
# Seconds a notification waits for others of the same burst before the re-read.
COALESCE_SECONDS = 0.05
# Reconnection delay suggested to EventSource clients, in milliseconds.
RETRY_MILLISECONDS = 1500
# application_name of the process's one LISTEN connection (engine.live_hub; visible in pg_stat_activity).
APPLICATION_NAME = live_hub.APPLICATION_NAME


def message(event: str, data: dict, *, event_id: int | None = None) -> str:
    """One server-sent event. JSON has no raw newlines, so ``data`` is a single line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def run_changes(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int,
                lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the server-sent events of a run page: ``change`` ({"seq", "state"}) each
    time the run's history passed ``after`` (then the last seq sent), ``end`` once the
    run is terminal or gone, or once ``lease``'s re-authorization fails ({"seq",
    "state": "unauthorized"}). See the module docstring. The run is watched from the
    first ``next()`` until the generator ends or is closed; ``lease`` is released then."""
    watch = None
    try:
        # Watched (LISTEN + subscription, on the hub's connection) before the first read:
        # an event committed later is announced, one committed earlier is in the first read.
        watch = live_hub.watch(organization_id=organization_id, run_id=run_id)
        started = last_output = time.monotonic()
        cursor = after
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        runs = WorkflowRun.objects.for_organization(organization_id).filter(pk=run_id)
        while True:
            if lease is not None and not lease.still_allowed():
                yield message("end", {"seq": cursor, "state": "unauthorized"})
                return
            row = runs.values_list("state", "last_event_seq").first()
            if row is None:
                yield message("end", {"seq": cursor, "state": "gone"})
                return
            state, seq = row
            if seq > cursor:
                cursor = seq
                yield message("change", {"seq": seq, "state": state}, event_id=seq)
                last_output = time.monotonic()
            if state in RUN_TERMINAL_STATES:
                yield message("end", {"seq": seq, "state": state}, event_id=seq)
                return
            now = time.monotonic()
            if now - started >= MAX_STREAM_SECONDS:
                return
            wait = min(HEARTBEAT_SECONDS - (now - last_output), MAX_STREAM_SECONDS - (now - started))
            if not watch.live:
                wait = min(wait, POLL_SECONDS)
            if lease is not None:
                wait = min(wait, lease.seconds_to_next_check())
            if not watch.pending:
                live_hub.release_connection()  # hold no connection while waiting
            if watch.wait(wait):
                # Let the rest of a burst arrive, then read once for all of it.
                time.sleep(COALESCE_SECONDS)
                watch.wait(0)
            elif time.monotonic() - last_output >= HEARTBEAT_SECONDS - 0.01:
                yield ": keep-alive\n\n"
                last_output = time.monotonic()
    finally:
        if watch is not None:
            watch.close()
        if lease is not None:
            lease.release()
