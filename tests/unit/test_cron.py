"""Cron triggers: each instant fires once, DST both ways, catch-up policies."""

from __future__ import annotations

import datetime as dt
import threading
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from engine.cron import GRACE_SECONDS, fire_due_triggers, process_trigger
from engine.models import ScheduledTrigger, TriggerFiring, WorkflowRun
from engine.triggers import TriggerError, create_trigger, next_instant, preview
from tenancy.actors import Actor

BERLIN = ZoneInfo("Europe/Berlin")
UTC = dt.UTC


def make_trigger(org, make_workflow, cron, *, tz="Europe/Berlin", catch_up="latest", name="t"):
    from engine.models import Workflow

    if not Workflow.objects.for_organization(org).filter(name="wf").exists():
        make_workflow(org, [{"key": "a", "type": "noop"}], name="wf")
    return create_trigger(actor=Actor.system(org), data={
        "name": name, "workflow_name": "wf", "cron_expression": cron, "timezone": tz, "catch_up": catch_up,
    })


def fired(trigger) -> list[dt.datetime]:
    return list(TriggerFiring.objects.for_organization(trigger.organization_id).filter(trigger=trigger)
                .order_by("scheduled_for").values_list("scheduled_for", flat=True))


def tick_through(trigger, start: dt.datetime, end: dt.datetime, step_minutes: int = 5):
    """Run the tick every ``step_minutes`` from ``start`` to ``end`` (UTC), as a clock would."""
    ScheduledTrigger.objects.for_organization(trigger.organization_id).filter(pk=trigger.pk).update(
        next_fire_at=next_instant(trigger.cron_expression, trigger.timezone, start))
    now = start
    while now <= end:
        process_trigger(trigger.pk, now)
        now += dt.timedelta(minutes=step_minutes)


@pytest.mark.django_db
def test_a_0230_trigger_fires_once_on_the_spring_forward_day_at_the_shifted_time(org, make_workflow):
    trig = make_trigger(org, make_workflow, "30 2 * * *")
    tick_through(trig, dt.datetime(2026, 3, 28, 23, 0, tzinfo=UTC), dt.datetime(2026, 3, 29, 4, 0, tzinfo=UTC))
    local = [t.astimezone(BERLIN) for t in fired(trig)]
    assert [t.isoformat() for t in local] == ["2026-03-29T03:00:00+02:00"]


@pytest.mark.django_db
def test_a_0230_trigger_fires_once_on_the_fall_back_day(org, make_workflow):
    trig = make_trigger(org, make_workflow, "30 2 * * *")
    tick_through(trig, dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC), dt.datetime(2026, 10, 25, 3, 0, tzinfo=UTC))
    local = [t.astimezone(BERLIN) for t in fired(trig)]
    assert [t.isoformat() for t in local] == ["2026-10-25T02:30:00+02:00"]
    assert WorkflowRun.objects.for_organization(org).filter(trigger=trig).count() == 1


@pytest.mark.django_db
def test_every_15_minutes_across_the_fall_back_hour_fires_every_real_quarter_hour(org, make_workflow):
    trig = make_trigger(org, make_workflow, "*/15 * * * *")
    # 00:00-02:00 UTC on 2026-10-25 covers local 02:00 CEST .. 02:59 CET (the repeated hour, twice).
    tick_through(trig, dt.datetime(2026, 10, 24, 23, 59, tzinfo=UTC), dt.datetime(2026, 10, 25, 2, 0, tzinfo=UTC),
                 step_minutes=1)
    times = fired(trig)
    assert len(times) == 9  # 00:00 .. 02:00 UTC every 15 minutes
    assert all((b - a) == dt.timedelta(minutes=15) for a, b in zip(times, times[1:], strict=False))
    local = [t.astimezone(BERLIN).strftime("%H:%M%z") for t in times]
    assert local[:8] == ["02:00+0200", "02:15+0200", "02:30+0200", "02:45+0200",
                         "02:00+0100", "02:15+0100", "02:30+0100", "02:45+0100"]


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "expected"), [("skip", 0), ("latest", 1), ("all", 10)])
def test_catch_up_policies_after_downtime(org, make_workflow, policy, expected):
    trig = make_trigger(org, make_workflow, "0 * * * *", tz="UTC", catch_up=policy)
    start = dt.datetime(2026, 11, 1, 0, 30, tzinfo=UTC)
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(
        next_fire_at=dt.datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    # Down for ten hours: 01:00 .. 10:00 were missed; the clock comes back at 10:30.
    now = start + dt.timedelta(hours=10)
    assert process_trigger(trig.pk, now) == expected
    times = fired(trig)
    assert len(times) == expected
    if policy == "latest":
        assert times == [dt.datetime(2026, 11, 1, 10, 0, tzinfo=UTC)]
    trig.refresh_from_db()
    assert trig.next_fire_at == dt.datetime(2026, 11, 1, 11, 0, tzinfo=UTC)
    runs = WorkflowRun.objects.for_organization(org).filter(trigger=trig)
    assert runs.count() == expected
    assert all(r.trigger_source == "cron" for r in runs)


@pytest.mark.django_db
def test_skip_still_fires_an_instant_that_is_on_time(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 * * * *", tz="UTC", catch_up="skip")
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(
        next_fire_at=dt.datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    now = dt.datetime(2026, 11, 1, 3, 0, GRACE_SECONDS - 5, tzinfo=UTC)
    assert process_trigger(trig.pk, now) == 1
    assert fired(trig) == [dt.datetime(2026, 11, 1, 3, 0, tzinfo=UTC)]


@pytest.mark.django_db(transaction=True)
def test_two_clocks_racing_fire_each_instant_once(org, make_workflow):
    trig = make_trigger(org, make_workflow, "*/5 * * * *", tz="UTC", catch_up="all")
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(
        next_fire_at=dt.datetime(2026, 11, 1, 0, 0, tzinfo=UTC))
    now = dt.datetime(2026, 11, 1, 1, 0, 30, tzinfo=UTC)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def clock():
        try:
            barrier.wait(timeout=10)
            results.append(fire_due_triggers(now=now))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=clock) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(results) == 13  # 00:00 .. 01:00 every 5 minutes
    assert len(fired(trig)) == 13
    assert WorkflowRun.objects.for_organization(org).filter(trigger=trig).count() == 13


@pytest.mark.django_db
def test_a_trigger_for_a_workflow_without_an_active_version_records_a_failed_firing(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 * * * *", tz="UTC")
    from engine.models import Workflow

    Workflow.objects.for_organization(org).update(state="archived")
    now = trig.next_fire_at + dt.timedelta(seconds=1)
    assert process_trigger(trig.pk, now) == 0
    firing = TriggerFiring.objects.for_organization(org).get(trigger=trig)
    assert firing.outcome == "failed" and "no active version of workflow 'wf'" in firing.detail


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "data", "message"), [
    ("cron_expression", {"cron_expression": "61 * * * *"}, "is not a valid cron expression"),
    ("cron_expression", {"cron_expression": "* * *"}, "must have 5 fields"),
    ("timezone", {"timezone": "Mars/Olympus"}, "is not an IANA time zone"),
    ("workflow_name", {"workflow_name": "nope"}, "no workflow named 'nope'"),
    ("catch_up", {"catch_up": "sometimes"}, "must be one of skip, latest, all"),
])
def test_bad_trigger_fields_are_named(org, make_workflow, field, data, message):
    make_workflow(org, [{"key": "a", "type": "noop"}], name="wf")
    base = {"name": "x", "workflow_name": "wf", "cron_expression": "* * * * *", "timezone": "UTC"}
    with pytest.raises(TriggerError) as excinfo:
        create_trigger(actor=Actor.system(org), data={**base, **data})
    assert excinfo.value.field == field and message in excinfo.value.message
    assert not ScheduledTrigger.objects.for_organization(org).exists()


def test_preview_lists_the_next_five_fire_times_in_the_trigger_zone():
    times = preview("30 2 * * *", "Europe/Berlin", after=dt.datetime(2026, 3, 28, 0, 0, tzinfo=UTC))
    assert [t.isoformat() for t in times] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00", "2026-04-01T02:30:00+02:00",
    ]
