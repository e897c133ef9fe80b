"""The organization's live pages (issue 20): the home page and the run list hold a
server-sent "the organization's runs changed" stream, fed by PostgreSQL LISTEN/NOTIFY.

The triggers of engine migration 0030 notify ``flowforge_org_runs`` at the commit of every
run created or changing state; engine.org_hub is the process's one listener. A stream
(``/live/runs/stream/``, frontend.views.home):

1. is admitted within the limits of engine.live_limits (the run pages' slots: per process,
   per user, per organization; a plain-text 429 with Retry-After beyond them, after which
   the page polls its fragment) and holds its StreamLease until it ends;
2. registers its wait on the hub *before* its first look, so a change committed after that
   is announced;
3. first looks whether anything changed since the page was rendered (``since``: the
   instant the page's data was read, in the page): a run created, started or finished
   after it (on idx_wfrun_org_open and idx_wfrun_org_finished) — then sends ``change`` at
   once, so a change between the render and the stream is never missed;
4. sends ``change`` ({"at": ISO instant}) for each notification, folding a burst
   (COALESCE_SECONDS) into one; the page then fetches its fragment;
5. sends a keep-alive comment after HEARTBEAT_SECONDS of silence, re-authorizes at least
   every FLOWFORGE_SSE_REAUTH_SECONDS (``end`` {"state": "unauthorized"} and stop when that
   fails), polls every POLL_SECONDS while the hub cannot deliver, and stops after
   MAX_STREAM_SECONDS (the browser reconnects);
6. closes its wait and releases its slots whatever the reason it ends, and holds no
   database connection while it waits.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator

from django.db.models import Q
from django.utils import timezone

from engine import live_hub, live_stream, org_hub
from engine.live_limits import StreamLease
from engine.models import WorkflowRun

HEARTBEAT_SECONDS = 15.0
POLL_SECONDS = 5.0
MAX_STREAM_SECONDS = 300.0
COALESCE_SECONDS = 0.05
RETRY_MILLISECONDS = 1500

message = live_stream.message


def changed_since(organization_id: uuid.UUID, since: dt.datetime) -> bool:
    """Whether a run of the organization was created, started or finished after ``since``
    (two index range scans: idx_wfrun_org_open, idx_wfrun_org_finished)."""
    runs = WorkflowRun.objects.for_organization(organization_id)
    if runs.filter(state__in=("pending", "running")).filter(
            Q(created_at__gt=since) | Q(started_at__gt=since)).exists():
        return True
    return runs.filter(finished_at__gt=since).exists()


def org_changes(*, organization_id: uuid.UUID, since: dt.datetime | None,
                lease: StreamLease | None = None) -> Iterator[str]:
    """Yield the server-sent text of the organization's run changes (module docstring):
    ``retry:``, then ``change`` ({"at"}) at once when anything changed since ``since``
    (always when ``since`` is None), then one per notification or burst."""
    wait = None
    try:
        wait = org_hub.wait_for(organization_id)
        started = last_output = time.monotonic()
        yield f"retry: {RETRY_MILLISECONDS}\n\n"
        if since is None or changed_since(organization_id, since):
            yield message("change", {"at": timezone.now().isoformat()})
            last_output = time.monotonic()
        while True:
            now = time.monotonic()
            if now - started >= MAX_STREAM_SECONDS:
                return
            timeout = min(HEARTBEAT_SECONDS - (now - last_output), MAX_STREAM_SECONDS - (now - started))
            if not wait.live:
                timeout = min(timeout, POLL_SECONDS)
            if lease is not None:
                timeout = min(timeout, lease.seconds_to_next_check())
            live_hub.release_connection()  # hold no connection while waiting
            woken = wait.wait(timeout)
            if lease is not None and not lease.still_allowed():
                yield message("end", {"state": "unauthorized"})
                return
            if woken or not wait.live:
                if woken:
                    time.sleep(COALESCE_SECONDS)  # let the rest of a burst arrive
                    wait.wait(0)
                yield message("change", {"at": timezone.now().isoformat()})
                last_output = time.monotonic()
            elif time.monotonic() - last_output >= HEARTBEAT_SECONDS - live_stream.HEARTBEAT_SLACK_SECONDS:
                yield ": keep-alive\n\n"
                last_output = time.monotonic()
    finally:
        if wait is not None:
            wait.close()
        if lease is not None:
            lease.release()
