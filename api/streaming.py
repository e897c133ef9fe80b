"""The API's server-sent event stream of one run's history (seed 001): every event, live.

The loop is engine.live_stream's (``stream`` with an ``EventFeed``: the hub, the limits,
re-authorization, heartbeats, the maximum duration and the cursor are there, shared with
the run page's stream); this module holds the API's clock and its 429. The constants
are read at each call, so a test can change them.

The view that serves this is outside ATOMIC_REQUESTS (api.views_runs): a request-long
transaction would hold a snapshot, and locks, for as long as the client listens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

from rest_framework import exceptions, status
from rest_framework.renderers import BaseRenderer

from engine import live, live_hub, live_stream
from engine.live_limits import StreamLease, StreamRefused
from tenancy.apikeys import AuthenticatedKey

CHANNEL = live.CHANNEL  # the trigger's channel (engine.live)

# Seconds without output after which a comment line is sent.
HEARTBEAT_SECONDS = 15.0
# Longest wait, in seconds, before re-reading even without a notification.
POLL_SECONDS = 5.0
# Seconds after which a stream ends (the client resumes with Last-Event-ID).
MAX_STREAM_SECONDS = 3600.0
# Reconnection delay suggested to EventSource clients, in milliseconds.
RETRY_MILLISECONDS = 2000
# The application_name of the process's one LISTEN connection (engine.live_hub).
LISTENER_APPLICATION_NAME = live_hub.APPLICATION_NAME

format_event = live_stream.format_event


class EventStreamRenderer(BaseRenderer):
    """Lets content negotiation accept ``Accept: text/event-stream``. The stream itself is
    a StreamingHttpResponse; anything rendered through this (nothing, normally) is JSON."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, bytes | str):
            return data
        return json.dumps(data, default=str)


class TooManyStreams(exceptions.APIException):
    """429: an event stream limit is reached (the detail names it); ``wait`` becomes Retry-After."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_detail = "Too many open event streams."
    default_code = "too_many_streams"

    def __init__(self, detail: str, *, wait: int):
        super().__init__(detail)
        self.wait = wait  # DRF's exception handler sends it as Retry-After


def acquire_stream(request, *, organization_id: uuid.UUID) -> StreamLease:
    """The slots of a new stream for the request's API key (or session user) in
    ``organization_id`` (engine.live_stream.acquire), with the principal's
    re-authorization. Raises TooManyStreams (a 429 problem with Retry-After) past a limit."""
    key = request.auth if isinstance(request.auth, AuthenticatedKey) else None
    try:
        if key is not None:
            return live_stream.acquire(organization_id=organization_id, api_key_id=key.id)
        return live_stream.acquire(organization_id=organization_id, user_id=request.user.pk)
    except StreamRefused as exc:
        raise TooManyStreams(str(exc), wait=exc.retry_after) from None


def run_event_stream(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int,
                     lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the SSE text of ``run_id``'s events after ``after``, then its new events as
    they are committed, until the run's ``run_finished`` event (engine.live_stream).
    Reads are scoped to ``organization_id``; ``lease`` is re-checked before every read
    and released at the end; when its re-authorization fails the stream stops without
    sending anything more."""
    timings = live_stream.Timings(heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=POLL_SECONDS,
                                  max_seconds=MAX_STREAM_SECONDS, retry_milliseconds=RETRY_MILLISECONDS,
                                  poll_while_live=True)
    feed = live_stream.EventFeed(organization_id=organization_id, run_id=run_id, after=after)
    return live_stream.stream(feed, organization_id=organization_id, run_id=run_id, timings=timings, lease=lease)
