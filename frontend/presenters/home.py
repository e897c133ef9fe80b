"""What the home page shows for the active organization (issue 20): "what is running and
what broke?".

``home_sections`` reads, in a constant number of statements whatever the organization's
size: its open runs (idx_wfrun_org_open), their task counts (idx_taskrun_run_state, only
when any is open), its recently failed runs (idx_wfrun_org_failed), its recently finished
runs (idx_wfrun_org_finished), its next trigger fire times (the index on organization_id:
an organization's triggers are few) and its own workers' queues (one statement:
``worker_queue_summary``). At most 6 statements.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from engine import worker_queues
from engine.models import ScheduledTrigger, WorkflowRun
from engine.repositories import worker_queues as worker_rows
from frontend.presenters.run_list import Progress, progress_by_run
from frontend.presenters.text import human_duration, run_duration
from tenancy.models import without_credentials

#: Rows of each run section, of the trigger section and of the queue section.
RUNS_SHOWN = 10
TRIGGERS_SHOWN = 8
QUEUES_SHOWN = 20
#: How far back "recently failed" and "recently finished" look.
RECENT_DAYS = 7


@dataclasses.dataclass(frozen=True)
class HomeRun:
    """One run of a home section: the run (workflow, starter loaded), its progress (open
    runs only) and its duration so far or in all."""

    run: WorkflowRun
    progress: Progress | None
    duration: str


@dataclasses.dataclass(frozen=True)
class NextFire:
    """One enabled cron trigger's next instant (UTC) and how far away it is."""

    trigger: ScheduledTrigger
    in_words: str


@dataclasses.dataclass(frozen=True)
class QueueHealth:
    """One queue of the organization's own workers: its summary, and whether tasks wait on
    it with no live worker to take them."""

    summary: worker_rows.QueueSummary

    @property
    def starved(self) -> bool:
        return self.summary.ready > 0 and self.summary.live_workers == 0

    @property
    def oldest_waiting(self) -> str:
        age = self.summary.oldest_ready_age_seconds
        return "" if age is None else human_duration(age)


@dataclasses.dataclass(frozen=True)
class HomeSections:
    """The home page's sections; ``read_at`` is when they were read (the live stream's ``since``)."""

    running: list[HomeRun]
    more_running: bool
    failed: list[HomeRun]
    finished: list[HomeRun]
    triggers: list[NextFire]
    queues: list[QueueHealth]
    read_at: dt.datetime

    @property
    def starved(self) -> list[str]:
        return [q.summary.queue for q in self.queues if q.starved]


def _runs(org) -> QuerySet:
    return (without_credentials(WorkflowRun.objects.for_organization(org), "workflow", "triggered_by", "trigger", "api_key")
            # A run's input and a workflow's document can be large and are not shown.
            .defer("input", "workflow__definition", "workflow__description", "trigger__input"))


def home_sections(org: Any) -> HomeSections:
    """The organization's home sections (module docstring: at most 6 statements)."""
    read_at = now = timezone.now()
    since = now - dt.timedelta(days=RECENT_DAYS)
    # Newest first, on idx_wfrun_org_open (its partial condition is this filter's).
    running = list(_runs(org).filter(state__in=("pending", "running"))
                   .order_by("-created_at")[: RUNS_SHOWN + 1])
    more_running = len(running) > RUNS_SHOWN
    running = running[:RUNS_SHOWN]
    progress = progress_by_run(org, [r.pk for r in running])
    failed = list(_runs(org).filter(state="failed", finished_at__gte=since)
                  .order_by("-finished_at")[:RUNS_SHOWN])  # idx_wfrun_org_failed
    finished = list(_runs(org).filter(finished_at__isnull=False, finished_at__gte=since)
                    .order_by("-finished_at")[:RUNS_SHOWN])  # idx_wfrun_org_finished
    triggers = list(ScheduledTrigger.objects.for_organization(org)
                    .filter(enabled=True, next_fire_at__isnull=False)
                    .only("id", "name", "workflow_name", "cron_expression", "timezone", "next_fire_at",
                          "organization_id")
                    .order_by("next_fire_at", "name")[:TRIGGERS_SHOWN])
    queues = worker_rows.queue_summaries(organization_id=org.pk, live_within_seconds=worker_queues.live_seconds(),
                                         limit=QUEUES_SHOWN)
    return HomeSections(
        running=[HomeRun(run=r, progress=progress[r.pk], duration=run_duration(r.started_at, None, now))
                 for r in running],
        more_running=more_running,
        failed=[HomeRun(run=r, progress=None, duration=run_duration(r.started_at, r.finished_at, now))
                for r in failed],
        finished=[HomeRun(run=r, progress=None, duration=run_duration(r.started_at, r.finished_at, now))
                  for r in finished],
        triggers=[NextFire(trigger=t, in_words=_in_words((t.next_fire_at - now).total_seconds()))
                  for t in triggers],
        queues=[QueueHealth(summary=q) for q in queues],
        read_at=read_at,
    )


def _in_words(seconds: float) -> str:
    """"in 4 m 05 s", or "due" for an instant already past (the clock fires it at its next tick)."""
    return "due" if seconds <= 0 else f"in {human_duration(seconds)}"
