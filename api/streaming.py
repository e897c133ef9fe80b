"""Server-sent events of one run's history, fed by PostgreSQL LISTEN/NOTIFY (seed 001).

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` at the commit of every event of a
run someone watches (a RunSubscription row, migration 0007). A stream:

1. is admitted by its view only within the limits of engine.live_limits (per process, per
   API key or user, per organization: a 429 problem with Retry-After beyond them), and
   holds its StreamLease until it ends;
2. watches its run through the process's listener hub (engine.live_hub: one LISTEN
   connection per process, which subscribes the run) *before* its first read, so an
   event committed between the read and the subscription cannot be missed;
3. reads the run's events after its cursor (``seq``, never a clock) through the
   organization-scoped manager, on its thread's Django connection, and sends each as
   ``id: <seq>`` / ``data: <json>``;
4. closes that Django connection before each wait (unless a notification is already
   waiting), so a waiting stream holds no PostgreSQL connection and no transaction, and
   waits for the hub to announce its run, at most POLL_SECONDS, then reads again from
   its own cursor — the notification only says "look"; a dropped one costs at most
   POLL_SECONDS of latency, never an event;
5. re-authorizes before a read at least every FLOWFORGE_SSE_REAUTH_SECONDS (the lease's
   check: the key is still active and its organization exists, or the session's user is
   still an active member) and stops, sending nothing more, when that fails;
6. ends right after sending the run's terminal ``run_finished`` event (or at once when
   resumed past it), and after MAX_STREAM_SECONDS (the client reconnects with
   Last-Event-ID); whatever the reason it ends, including the client going away (the
   WSGI server closes the response, which closes the generator), it closes its watch and
   releases its slots.

When nothing was sent for HEARTBEAT_SECONDS it sends a comment line, so proxies and
clients can tell a quiet run from a dead connection.

The view that serves this is outside ATOMIC_REQUESTS (api.views_engine): a request-long
transaction would hold a snapshot, and locks, for as long as the client listens.
Each stream holds a gunicorn thread (gthread) while it lasts: FLOWFORGE_SSE_PER_PROCESS
keeps some threads of every process for ordinary requests.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator

from rest_framework import exceptions, status
from rest_framework.renderers import BaseRenderer

from engine import live, live_hub, live_limits
from engine.live_limits import StreamLease
from engine.models import RUN_TERMINAL_STATES, TaskRunEvent, WorkflowRun
from tenancy import reauthorization
from tenancy.apikeys import AuthenticatedKey

log = logging.getLogger(__name__)
CHANNEL = live.CHANNEL  # the trigger's channel (engine.live)


# Seconds without output after which a comment line is sent.
HEARTBEAT_SECONDS = 15.0
# Longest wait, in seconds, before re-reading even without a notification.
POLL_SECONDS = 5.0
# Seconds after which a stream ends (the client resumes with Last-Event-ID).
MAX_STREAM_SECONDS = 3600.0
# Events read per query.
BATCH = 500
# Reconnection delay suggested to EventSource clients, in milliseconds.
RETRY_MILLISECONDS = 2000


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


# The application_name of the process's one LISTEN connection (engine.live_hub).
LISTENER_APPLICATION_NAME = live_hub.APPLICATION_NAME


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
    ``organization_id`` (engine.live_limits), with the principal's re-authorization.
    Raises TooManyStreams (a 429 problem with Retry-After) past a limit."""
    key = request.auth if isinstance(request.auth, AuthenticatedKey) else None
    if key is not None:
        key_id = key.id
        principal = {"api_key_id": key_id}

        def reauthorize() -> bool:
            return reauthorization.api_key_still_valid(key_id=key_id, organization_id=organization_id)
    else:
        user_id = request.user.pk
        principal = {"user_id": user_id}

        def reauthorize() -> bool:
            return reauthorization.member_still_active(user_id=user_id, organization_id=organization_id)
    try:
        return live_limits.acquire(organization_id=organization_id, reauthorize=reauthorize, **principal)
    except live_limits.StreamRefused as exc:
        raise TooManyStreams(str(exc), wait=exc.retry_after) from None


def format_event(event_id: int, data: dict) -> str:
    """One SSE message. JSON has no raw newlines, so ``data`` is a single line."""
    return f"id: {event_id}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _event_data(event: TaskRunEvent, run_id: uuid.UUID) -> dict:
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


def run_event_stream(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int,
                     lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the SSE text of ``run_id``'s events after ``after``, then its new events as
    they are committed, until the run's ``run_finished`` event (see the module docstring).

    Watches the run on the first ``next()`` and stops watching when the generator
    finishes or is closed. Reads are scoped to ``organization_id``. ``lease`` (from
    engine.live_limits.acquire) is re-checked before every read and released at the end;
    when its re-authorization fails the stream stops without sending anything more.
    """
    watch = None
    try:
        # Watched (LISTEN + subscription, on the hub's connection) before the first read:
        # an event committed later is announced; one committed earlier is in the first read.
        watch = live_hub.watch(organization_id=organization_id, run_id=run_id)
        started = last_output = time.monotonic()
        cursor = after
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        events = TaskRunEvent.objects.for_organization(organization_id).filter(workflow_run_id=run_id)
        runs = WorkflowRun.objects.for_organization(organization_id).filter(pk=run_id)
        while True:
            if lease is not None and not lease.still_allowed():
                return  # the key was revoked or expired, or the member left: nothing more
            # Everything after the cursor, in seq order (uniq_event_run_seq serves the range).
            while True:
                batch = list(events.filter(seq__gt=cursor).select_related("task_run__task").order_by("seq")[:BATCH])
                for event in batch:
                    yield format_event(event.seq, _event_data(event, run_id))
                    cursor = event.seq
                    last_output = time.monotonic()
                    if event.kind == "run_finished":
                        return
                if len(batch) < BATCH:
                    break
            state = runs.values_list("state", "last_event_seq").first()
            if state is None:
                return  # the run is gone
            if state[0] in RUN_TERMINAL_STATES:
                if state[1] > cursor:
                    continue  # its last events committed after our read
                return  # resumed after run_finished: nothing more will come
            now = time.monotonic()
            if now - started >= MAX_STREAM_SECONDS:
                return
            wait = min(POLL_SECONDS, HEARTBEAT_SECONDS - (now - last_output), MAX_STREAM_SECONDS - (now - started))
            if lease is not None:
                wait = min(wait, lease.seconds_to_next_check())
            if not watch.pending:
                live_hub.release_connection()  # hold no connection while waiting
            if not watch.wait(wait) and time.monotonic() - last_output >= HEARTBEAT_SECONDS:
                yield ": heartbeat\n\n"
                last_output = time.monotonic()
    finally:
        if watch is not None:
            watch.close()
        if lease is not None:
            lease.release()
