"""The home page: where a signed-in user lands. It answers "what is running and what broke?"
for the active organization (frontend.presenters.home), and stays live: the page holds the
organization's run-change stream (``/live/runs/stream/``, frontend.live_org) and, on each
``change``, fetches its sections (``/home/live/``) and swaps them in (org-live.js). The run
list (frontend.views.runs) holds the same stream.
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET

from engine import live_stream
from frontend import live_org
from frontend.organization import organization_required
from frontend.presenters.home import home_sections
from tenancy.models import Membership


def org_live_urls(*, fragment: str, read_at: dt.datetime) -> dict[str, str]:
    """What a page's ``#org-live`` element carries: its fragment's URL, the stream's, and the
    instant its data was read (the stream's ``since``), in ISO 8601 and epoch milliseconds."""
    return {"fragment": fragment, "stream": reverse("frontend:org_stream"), "since": read_at.isoformat(),
            "now_ms": str(int(timezone.now().timestamp() * 1000))}


@require_GET
@organization_required
def home(request: HttpRequest) -> HttpResponse:
    """``/``: the organization's open runs, its recently failed and finished runs, its next
    trigger fire times and its workers' queues; live."""
    membership = request.membership
    org = membership.organization
    member_count = Membership.objects.for_organization(org).count()
    sections = home_sections(org)
    context = {"membership": membership, "member_count": member_count, "h": sections,
               "live": org_live_urls(fragment=reverse("frontend:home_live"), read_at=sections.read_at)}
    return render(request, "frontend/home.html", context)


@require_GET
@organization_required
def home_live(request: HttpRequest) -> HttpResponse:
    """``/home/live/``: the home page's sections alone, for its live client."""
    sections = home_sections(request.membership.organization)
    response = render(request, "frontend/home/_sections.html", {"h": sections, "fragment": True})
    response["Cache-Control"] = "no-store"
    return response


@transaction.non_atomic_requests
@require_GET
@organization_required
def org_stream(request: HttpRequest) -> HttpResponse:
    """``/live/runs/stream/?since=<ISO instant>``: server-sent ``change`` events each time a
    run of the active organization is created or changes state (frontend.live_org). Outside
    ATOMIC_REQUESTS: a request-long transaction would hold a snapshot for as long as the
    page is open. 400 for a ``since`` that is not an ISO 8601 instant with its offset; past
    a stream limit a plain-text 429 with Retry-After names the limit (the page then polls)."""
    raw = request.GET.get("since")
    since = None
    if raw:
        since = parse_datetime(raw)
        if since is None or since.tzinfo is None:
            return HttpResponse(f"since: {raw[:64]!r} is not an ISO 8601 instant with its UTC offset",
                                status=400, content_type="text/plain; charset=utf-8")
    org = request.membership.organization
    try:
        lease = live_stream.acquire(organization_id=org.pk, user_id=request.user.pk)
    except live_stream.StreamRefused as exc:
        refused = HttpResponse(str(exc), status=429, content_type="text/plain; charset=utf-8")
        refused["Retry-After"] = str(exc.retry_after)
        return refused
    stream = live_stream.LeasedStream(live_org.org_changes(organization_id=org.pk, since=since, lease=lease), lease)
    response = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response
