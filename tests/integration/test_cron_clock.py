"""Cron dates with the real clock (``manage.py run_clock``) and real Dramatiq workers
(issue 19, item 5): a trigger whose expression is edited to an equivalent one around an
instant fires that instant exactly once, and its run's task sees the instant; a backfill
goes through the clock's pass and the workers, one run per instant, its
``max_active_runs`` at a time.

The edit test waits for the next minute boundary (cron's resolution is a minute): from
10 to 70 seconds."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import transaction
from django.utils import timezone

from engine.backfill import BackfillConflict, create_backfill
from engine.models import ScheduledTrigger, TaskRun, TriggerBackfill, TriggerFiring, WorkflowRun
from engine.triggers import create_trigger, update_trigger
from flowforge.stack import wait_until
from tenancy.actors import Actor

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

UTC = dt.UTC
SCHEDULE_TASK = [{"key": "when", "type": "python", "config": {"callable": "tests.callables.schedule_of"}}]


def sleep_until(when: dt.datetime) -> None:
    time.sleep(max(0.0, (when - timezone.now()).total_seconds()))


def next_boundary(*, at_least_seconds: float) -> dt.datetime:
    """The first whole minute at least ``at_least_seconds`` from now."""
    earliest = timezone.now() + dt.timedelta(seconds=at_least_seconds)
    boundary = earliest.replace(second=0, microsecond=0)
    return boundary if boundary >= earliest else boundary + dt.timedelta(minutes=1)


def runs_for(trigger, instant) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.for_organization(trigger.organization_id)
                .filter(trigger=trigger, scheduled_for=instant))


def output_of(run) -> dict | None:
    return TaskRun.objects.for_organization(run.organization_id).get(workflow_run=run).output


def test_an_expression_edited_to_an_equivalent_one_around_an_instant_fires_it_exactly_once(
        stack, org, make_workflow):
    make_workflow(org, SCHEDULE_TASK, name="stamp")
    owner = Actor.system(org)

    def trigger(name: str) -> ScheduledTrigger:
        return create_trigger(actor=owner, data={"name": name, "workflow_name": "stamp",
                                                 "cron_expression": "* * * * *", "timezone": "UTC"})

    twin, before, after = trigger("unedited twin"), trigger("edited before"), trigger("edited after")
    stack.env["FLOWFORGE_CLOCK_TRIGGER_SECONDS"] = "1"
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    instant = next_boundary(at_least_seconds=5)  # room for the edit 3 s before it

    # Three seconds before the instant: an equivalent expression.
    sleep_until(instant - dt.timedelta(seconds=3))
    edited = update_trigger(actor=owner, trigger=before, data={"cron_expression": "*/1 * * * *"})
    assert edited.next_fire_at == instant

    # Two seconds after it, before any tick fired it: the row is held from before the instant
    # (the clock's tick passes a locked trigger by), and the edit is saved while it is due.
    # Recomputing next_fire_at from "now" lost exactly this instant.
    sleep_until(instant - dt.timedelta(seconds=2))
    with transaction.atomic():
        ScheduledTrigger.objects.for_organization(org).select_for_update().get(pk=after.pk)
        sleep_until(instant + dt.timedelta(seconds=2))
        edited = update_trigger(actor=owner, trigger=after, data={"cron_expression": "0-59 * * * *"})
        assert edited.next_fire_at == instant

    expected = {"scheduled_for": instant.isoformat(),
                "data_interval_start": (instant - dt.timedelta(minutes=1)).isoformat(),
                "data_interval_end": instant.isoformat()}
    for t in (twin, before, after):
        wait_until(lambda t=t: any(r.state == "succeeded" for r in runs_for(t, instant)),
                   timeout=30, interval=0.2, what=f"{t.name}'s run for {instant}")
    # No tick fires it again (ticks every second; one more minute boundary is not waited for).
    time.sleep(2.5)
    for t in (twin, before, after):
        (run,) = runs_for(t, instant)
        assert run.trigger_source == "cron" and run.state == "succeeded"
        # The handler's context held the instant and its interval (a real worker process).
        assert output_of(run) == expected
        assert TriggerFiring.objects.for_organization(org).filter(trigger=t, scheduled_for=instant).count() == 1
        t.refresh_from_db()
        assert t.next_fire_at >= instant + dt.timedelta(minutes=1)
        assert t.missed_instants is None


def test_a_backfill_goes_through_the_clocks_pass_and_the_workers_one_run_per_instant(stack, org, make_workflow):
    make_workflow(org, SCHEDULE_TASK, name="stamp")
    owner = Actor.system(org)
    trig = create_trigger(actor=owner, data={"name": "daily", "workflow_name": "stamp", "cron_expression": "0 6 * * *",
                                             "timezone": "Europe/Berlin", "enabled": False})
    stack.env["FLOWFORGE_CLOCK_BACKFILL_SECONDS"] = "0.5"
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    backfill = create_backfill(actor=owner, trigger=trig, start="2026-03-01", end="2026-03-31", max_active_runs=8)

    def finished():
        backfill.refresh_from_db()
        return backfill.state != "running" and backfill

    wait_until(finished, timeout=120, interval=0.25, what="the backfill to finish")
    assert (backfill.state, backfill.created_runs, backfill.skipped) == ("succeeded", 31, 0)
    runs = list(WorkflowRun.objects.for_organization(org).filter(trigger=trig).order_by("scheduled_for"))
    wait_until(lambda: all(r.refresh_from_db() or r.is_terminal for r in runs), timeout=60, interval=0.25,
               what="the backfill's runs to finish")
    assert [r.scheduled_for for r in runs] == (
        [dt.datetime(2026, 3, d, 5, tzinfo=UTC) for d in range(1, 29)]
        + [dt.datetime(2026, 3, d, 4, tzinfo=UTC) for d in range(29, 32)])
    assert {r.state for r in runs} == {"succeeded"} and {r.trigger_source for r in runs} == {"backfill"}
    assert output_of(runs[28])["data_interval_start"] == "2026-03-28T05:00:00+00:00"
    # At most max_active_runs (8) of them were going at once: when each was created, at most
    # 7 of those before it had not finished.
    for k, run in enumerate(runs):
        going = [r for r in runs[:k] if r.finished_at > run.created_at]
        assert len(going) <= 7, (run.scheduled_for, [r.scheduled_for for r in going])
    # Again: nothing new; the second backfill is refused (every instant has a run) and none is made.
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=owner, trigger=trig, start="2026-03-01", end="2026-03-31")
    assert excinfo.value.field == "range"
    assert TriggerBackfill.objects.for_organization(org).count() == 1
    assert WorkflowRun.objects.for_organization(org).filter(trigger=trig).count() == 31
