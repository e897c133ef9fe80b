"""Server-sent events of one run's history, fed by PostgreSQL LISTEN/NOTIFY (seed 001).

A trigger on core_taskrunevent (engine migration 0006) raises
``pg_notify('flowforge_run_events', '<run id>:<seq>')`` for every event, at commit. A
stream:

1. opens its own autocommit psycopg connection and LISTENs *before* its first read, so
   an event committed between the read and the LISTEN cannot be missed;
2. reads the run's events after its cursor (``seq``, never a clock) through the
   organization-scoped manager and sends each as ``id: <seq>`` / ``data: <json>``;
3. waits for a notification naming its run, at most POLL_SECONDS, then reads again from
   its own cursor — the notification only says "look"; a dropped one costs at most
   POLL_SECONDS of latency, never an event;
4. ends right after sending the run's terminal ``run_finished`` event (or at once when
   resumed past it), and after MAX_STREAM_SECONDS (the client reconnects with
   Last-Event-ID); it closes its LISTEN connection whatever the reason it ends,
   including the client going away (the WSGI server closes the generator).

When nothing was sent for HEARTBEAT_SECONDS it sends a comment line, so proxies and
clients can tell a quiet run from a dead connection.

The view that serves this is outside ATOMIC_REQUESTS (api.views_engine): a request-long
transaction would hold a snapshot, and locks, for as long as the client listens.
Each stream holds a gunicorn worker (sync) or thread (gthread) while it lasts.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator

import psycopg
from rest_framework.renderers import BaseRenderer

from engine import live
from engine.models import RUN_TERMINAL_STATES, TaskRunEvent, WorkflowRun

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


LISTENER_APPLICATION_NAME = "flowforge-run-listener"


def format_event(event_id: int, data: dict) -> str:
    """One SSE message. JSON has no raw newlines, so ``data`` is a single line."""
    return f"id: {event_id}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def listen_connection() -> psycopg.Connection:
    """This module's LISTEN connection (engine.live.listen_connection). The caller closes it."""
    from engine.live import listen_connection as listen

    return listen(application_name=LISTENER_APPLICATION_NAME)


def wait_for_run(conn: psycopg.Connection, run_id: uuid.UUID, *, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a notification about ``run_id``; True if one came.
    Notifications about other runs are skipped (each is a few bytes)."""
    prefix = f"{run_id}:"
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for notify in conn.notifies(timeout=remaining):
            if notify.payload.startswith(prefix):
                return True
        # notifies() returned at its timeout (or on a spurious wake-up): loop re-checks the deadline.


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


def run_event_stream(*, organization_id: uuid.UUID, run_id: uuid.UUID, after: int) -> Iterator[str]:
    """Yield the SSE text of ``run_id``'s events after ``after``, then its new events as
    they are committed, until the run's ``run_finished`` event (see the module docstring).

    Opens its LISTEN connection on the first ``next()`` and closes it when the generator
    finishes or is closed. Reads are scoped to ``organization_id``.
    """
    conn = listen_connection()
    sub_id = None
    try:
        # Subscribed after LISTEN and before the first read: an event committed later
        # is announced; one committed earlier is in the first read.
        try:
            sub_id = live.subscribe(conn, organization_id=organization_id, run_id=run_id)
        except psycopg.Error as exc:  # e.g. the run is not committed yet: fall back to polling
            log.debug("no live subscription for run %s (%s); polling every %ss", run_id, exc, POLL_SECONDS)
        renewed = time.monotonic()
        started = last_output = time.monotonic()
        cursor = after
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        events = TaskRunEvent.objects.for_organization(organization_id).filter(workflow_run_id=run_id)
        runs = WorkflowRun.objects.for_organization(organization_id).filter(pk=run_id)
        while True:
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
            if sub_id is not None and now - renewed >= live.RENEW_SECONDS:
                live.renew(conn, sub_id)
                renewed = now
            wait = min(POLL_SECONDS, HEARTBEAT_SECONDS - (now - last_output), MAX_STREAM_SECONDS - (now - started))
            if not wait_for_run(conn, run_id, timeout=wait) and time.monotonic() - last_output >= HEARTBEAT_SECONDS:
                yield ": heartbeat\n\n"
                last_output = time.monotonic()
    finally:
        try:
            if sub_id is not None and not conn.closed:
                live.unsubscribe(conn, sub_id)
        except psycopg.Error:
            pass  # it expires on its own
        conn.close()
