"""The workers page: the organization's own worker queues (depth, oldest waiting task,
running tasks, live workers) and the workers seen polling each (docs/workers.md), for
every member (``read``). Two statements (engine.repositories.worker_queues), whatever
the number of queues and workers.

It lists the live workers and those seen within WORKERS_PAGE_RECENT_SECONDS (a worker
process that stopped stays listed a day, then only ``GET /api/v1/workers/`` shows it),
at most WORKERS_PAGE_LIMIT of them and QUEUES_PAGE_LIMIT queues; a note says when more
exist. Live: FLOWFORGE_WORKER_LIVE_SECONDS (engine.worker_queues.live_seconds).
"""

from __future__ import annotations

import dataclasses

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from engine import worker_queues
from engine.repositories import worker_queues as worker_rows
from frontend.organization import organization_required
from frontend.presenters.text import human_duration
from frontend.views.workflows import authorize
from tenancy.permissions import Action, can

#: Workers not live any more stay on the page this long after their last poll, in seconds.
WORKERS_PAGE_RECENT_SECONDS = 24 * 3600
#: Most workers and queues the page lists (the API pages through all of them).
WORKERS_PAGE_LIMIT = 500
QUEUES_PAGE_LIMIT = 500


@dataclasses.dataclass
class QueueBlock:
    """One queue on the page: its summary and its workers."""

    summary: worker_rows.QueueSummary
    workers: list[dict]

    @property
    def oldest_waiting(self) -> str:
        age = self.summary.oldest_ready_age_seconds
        return "" if age is None else human_duration(age)

    @property
    def starved(self) -> bool:
        """Tasks wait on it and no worker is live: nothing will take them."""
        return self.summary.ready > 0 and self.summary.live_workers == 0


@require_GET
@organization_required
def worker_list(request: HttpRequest) -> HttpResponse:
    """``/workers/``: the queues and their workers (see the module docstring)."""
    authorize(request.actor.role, Action.READ)
    org = request.membership.organization
    live_seconds = worker_queues.live_seconds()
    queues = worker_rows.queue_summaries(organization_id=org.pk, live_within_seconds=live_seconds,
                                         limit=QUEUES_PAGE_LIMIT + 1)
    workers = worker_rows.workers(organization_id=org.pk, live_within_seconds=live_seconds,
                                  limit=WORKERS_PAGE_LIMIT + 1, seen_within_seconds=WORKERS_PAGE_RECENT_SECONDS)
    now = timezone.now()
    by_queue: dict[str, list[dict]] = {}
    for w in workers[:WORKERS_PAGE_LIMIT]:
        by_queue.setdefault(w.queue, []).append({
            "w": w, "last_seen": human_duration((now - w.last_seen_at).total_seconds()) + " ago"})
    blocks = [QueueBlock(summary=q, workers=by_queue.get(q.queue, [])) for q in queues[:QUEUES_PAGE_LIMIT]]
    context = {
        "organization": org,
        "queues": blocks,
        "starved": [b.summary.queue for b in blocks if b.starved],
        "any_workers": any(b.workers for b in blocks),
        "more_queues": len(queues) > QUEUES_PAGE_LIMIT,
        "more_workers": len(workers) > WORKERS_PAGE_LIMIT,
        "live_seconds": f"{live_seconds:g}",
        "recent_hours": WORKERS_PAGE_RECENT_SECONDS // 3600,
        "can_manage_keys": can(request.actor.role, Action.APIKEY_MANAGE),
    }
    return render(request, "frontend/workers/list.html", context)
