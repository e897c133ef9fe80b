"""Live run pages: a server-sent "this run changed" stream fed by PostgreSQL LISTEN/NOTIFY.

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` at the commit of every event
(seed 001: the trigger is the design, so no writer can forget to announce). The run
page's client (``static/frontend/run-live.js``) listens to ``/runs/<id>/stream/`` and,
on each ``change``, fetches the page's live fragment (``/runs/<id>/live/?after=<seq>``)
and swaps it in. The stream carries no event data, only the run's latest ``seq`` and
state, so it never renders templates and its message size does not grow with the run.

A stream:

1. opens its own autocommit psycopg connection, LISTENs and subscribes to the run
   (``engine.live``: the trigger notifies only for runs someone watches; the stream
   renews the subscription while it lasts and deletes it when it ends) *before* its
   first read, so an event committed between the read and the LISTEN is not missed;
   every read of the stream is on that connection (``core_workflowrun`` by id and
   organization), so it holds no Django connection and no transaction while it waits;
2. sends ``change`` (``id: <seq>``) whenever the run's ``last_event_seq`` passed what it
   last sent, coalescing a burst of notifications (a 200-task fan-out commits many
   events at once) into one message;
3. waits for a notification naming its run, at most HEARTBEAT_SECONDS, and re-reads —
   the notification only says "look", so a dropped one costs latency, never a change;
4. sends ``end`` and stops once the run is terminal (the client then closes, so the
   browser does not reconnect), and stops after MAX_STREAM_SECONDS (the browser
   reconnects with Last-Event-ID, the last seq it was told about);
5. closes its connection whatever the reason it ends, including the client going
   away (the WSGI server closes the generator on its next write; a keep-alive comment
   every HEARTBEAT_SECONDS makes that write happen).

Each open stream holds one web worker thread for its duration: serve the web with
threads (``gunicorn --worker-class gthread --threads N``) rather than sync workers.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator

import psycopg

# The trigger notifies only for runs with a live subscription (engine.models.RunSubscription).
from engine import live as subscriptions
from engine.models import RUN_TERMINAL_STATES

CHANNEL = subscriptions.CHANNEL  # the trigger's channel

# Seconds without output after which a keep-alive comment is sent (and a re-read made).
HEARTBEAT_SECONDS = 15.0
# Seconds after which a stream ends; the browser reconnects with Last-Event-ID.
MAX_STREAM_SECONDS = 300.0
# Seconds a notification waits for others of the same burst before the re-read.
COALESCE_SECONDS = 0.05
# Reconnection delay suggested to EventSource clients, in milliseconds.
RETRY_MILLISECONDS = 1500
# application_name of the LISTEN connections (visible in pg_stat_activity).
APPLICATION_NAME = "flowforge-web-live"

_RUN_SQL = "SELECT state, last_event_seq FROM core_workflowrun WHERE id = %s AND organization_id = %s"


def listen_connection() -> psycopg.Connection:
    """This module's LISTEN connection (engine.live.listen_connection). The caller closes it."""
    from engine.live import listen_connection as listen

    return listen(application_name=APPLICATION_NAME)


def message(event: str, data: dict, *, event_id: int | None = None) -> str:
    """One server-sent event. JSON has no raw newlines, so ``data`` is a single line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def wait_for_run(conn: psycopg.Connection, run_id: uuid.UUID, *, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a notification about ``run_id``; True if one
    came. Then drain the burst it belongs to for COALESCE_SECONDS, so many events
    committed together produce one re-read. Other runs' notifications are skipped."""
    prefix = f"{run_id}:"
    deadline = time.monotonic() + max(0.0, timeout)
    seen = False
    while not seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        # Closed explicitly: the generator holds the connection's lock while suspended.
        with contextlib.closing(conn.notifies(timeout=remaining)) as notifies:
            seen = any(n.payload.startswith(prefix) for n in notifies)
    burst_end = time.monotonic() + COALESCE_SECONDS
    while (remaining := burst_end - time.monotonic()) > 0:
        with contextlib.closing(conn.notifies(timeout=remaining)) as notifies:
            for _ in notifies:
                pass
    return True


def run_changes(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int) -> Iterator[str]:
    """Yield the server-sent events of a run page: ``change`` ({"seq", "state"}) each
    time the run's history passed ``after`` (then the last seq sent), ``end`` once the
    run is terminal or gone. See the module docstring. The LISTEN connection is
    opened on the first ``next()`` and closed when the generator ends or is closed."""
    conn = listen_connection()
    sub_id = None
    try:
        # Subscribed after LISTEN and before the first read: an event committed later is
        # announced, one committed earlier is in the first read.
        try:
            sub_id = subscriptions.subscribe(conn, organization_id=organization_id, run_id=run_id)
        except psycopg.Error:  # e.g. the run is not committed yet: the heartbeat re-reads instead
            sub_id = None
        started = last_output = renewed = time.monotonic()
        cursor = after
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        while True:
            row = conn.execute(_RUN_SQL, (run_id, organization_id)).fetchone()
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
            if sub_id is not None and now - renewed >= subscriptions.RENEW_SECONDS:
                subscriptions.renew(conn, sub_id)
                renewed = now
            wait = min(HEARTBEAT_SECONDS - (now - last_output), MAX_STREAM_SECONDS - (now - started))
            if sub_id is not None:
                wait = min(wait, subscriptions.RENEW_SECONDS - (now - renewed))
            if not wait_for_run(conn, run_id, timeout=wait):
                if time.monotonic() - last_output >= HEARTBEAT_SECONDS - 0.01:
                    yield ": keep-alive\n\n"
                    last_output = time.monotonic()
    finally:
        try:
            if sub_id is not None and not conn.closed:
                subscriptions.unsubscribe(conn, sub_id)
        except psycopg.Error:
            pass  # an abandoned subscription expires on its own
        conn.close()
