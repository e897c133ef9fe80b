"""Live run pages: a server-sent "this run changed" stream fed by PostgreSQL LISTEN/NOTIFY.

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` at the commit of every event
(seed 001: the trigger is the design, so no writer can forget to announce). The run
page's client (``static/frontend/run-live.js``) listens to ``/runs/<id>/stream/`` and,
on each ``change``, fetches the page's live fragment (``/runs/<id>/live/?after=<seq>``)
and swaps it in. The stream carries no event data, only the run's latest ``seq`` and
state, so it never renders templates and its message size does not grow with the run.

The loop is engine.live_stream's (``stream`` with a ``ChangeFeed``; shared with the
API's event stream); this module holds the page's clock. A stream:

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

import uuid
from collections.abc import Iterator

from engine import live as subscriptions
from engine import live_hub, live_stream
from engine.live_limits import StreamLease

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

message = live_stream.message


def run_changes(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int,
                lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the server-sent events of a run page: ``change`` ({"seq", "state"}) each
    time the run's history passed ``after`` (then the last seq sent), ``end`` once the
    run is terminal or gone, or once ``lease``'s re-authorization fails ({"seq",
    "state": "unauthorized"}). See the module docstring. The run is watched from the
    first ``next()`` until the generator ends or is closed; ``lease`` is released then."""
    timings = live_stream.Timings(heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=POLL_SECONDS,
                                  max_seconds=MAX_STREAM_SECONDS, retry_milliseconds=RETRY_MILLISECONDS,
                                  poll_while_live=False, coalesce_seconds=COALESCE_SECONDS)
    feed = live_stream.ChangeFeed(organization_id=organization_id, run_id=run_id, after=after)
    return live_stream.stream(feed, organization_id=organization_id, run_id=run_id, timings=timings, lease=lease)
