"""Backfills of cron triggers (issue 19): one run per instant of a range, in the trigger's
time zone, idempotent with the clock's own firings, within the start quota, with a
preview; through the service, the REST API, the trigger page and the command."""

from __future__ import annotations

import datetime as dt
import io
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit.models import AuditLog
from engine.backfill import (
    BackfillConflict,
    BackfillError,
    advance_backfill,
    advance_backfills,
    cancel_backfill,
    create_backfill,
    preview_backfill,
)
from engine.cron import process_trigger
from engine.models import ScheduledTrigger, TriggerBackfill, TriggerFiring, Workflow, WorkflowRun
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tenancy.models import Organization, Role
from tests.unit.test_api_org import (  # noqa: F401 (fixtures)
    PROBLEM,
    acme,
    assert_problem,
    client,
    org_factory,
    other,
)

UTC = dt.UTC
MARCH = ("2026-03-01", "2026-03-31")


def utc(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def daily_berlin(org, make_workflow=None, *, name="daily", cron="0 6 * * *", workflow="nightly-report"):
    if make_workflow is not None and not Workflow.objects.for_organization(org).filter(name=workflow).exists():
        make_workflow(org, [{"key": "a", "type": "noop"}], name=workflow)
    return create_trigger(actor=Actor.system(org), data={
        "name": name, "workflow_name": workflow, "cron_expression": cron, "timezone": "Europe/Berlin",
        "input": {"region": "eu"}})


def actor(org, role=Role.MEMBER) -> Actor:
    return Actor(organization=org, role=role, channel="cli")


def run_through(backfill: TriggerBackfill) -> TriggerBackfill:
    """Advance ``backfill`` in this process until it is no longer running (as the actor would)."""
    for _ in range(200):
        advance_backfill(backfill.pk)
        backfill.refresh_from_db()
        if backfill.state != "running":
            return backfill
        TriggerBackfill.objects.unscoped().filter(pk=backfill.pk).update(not_before=timezone.now())
    raise AssertionError(f"backfill {backfill.pk} did not finish")


def backfill_runs(trigger) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.for_organization(trigger.organization_id).filter(trigger=trigger)
                .order_by("scheduled_for"))


def march_instants() -> list[dt.datetime]:
    """06:00 in Berlin each day of March 2026: 05:00 UTC until the 28th, 04:00 UTC (CEST) from the 29th."""
    return [utc(2026, 3, d, 5) for d in range(1, 29)] + [utc(2026, 3, d, 4) for d in range(29, 32)]


# --- the service ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_daily_berlin_trigger_backfilled_over_march_2026_starts_31_runs_at_the_right_instants(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    backfill = create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], max_active_runs=100)
    assert (backfill.state, backfill.total, backfill.next_instant) == ("running", 31, utc(2026, 3, 1, 5))
    backfill = run_through(backfill)
    assert (backfill.state, backfill.created_runs, backfill.skipped) == ("succeeded", 31, 0)
    runs = backfill_runs(trig)
    assert [r.scheduled_for for r in runs] == march_instants()
    # Each run covers the day before its instant: 23 hours on the day the clocks go forward.
    assert runs[0].data_interval_start == utc(2026, 2, 28, 5)
    assert runs[28].data_interval_start == utc(2026, 3, 28, 5) and runs[28].data_interval_end == utc(2026, 3, 29, 4)
    assert all(r.data_interval_end == r.scheduled_for for r in runs)
    assert {r.trigger_source for r in runs} == {"backfill"}
    assert all(r.input == {"region": "eu"} for r in runs)
    # Started in order, oldest instant first.
    assert [r.pk for r in sorted(runs, key=lambda r: r.created_at)] == [r.pk for r in runs]
    firings = TriggerFiring.objects.for_organization(org).filter(trigger=trig)
    assert firings.count() == 31 and set(firings.values_list("backfill_id", flat=True)) == {backfill.pk}


@pytest.mark.django_db
def test_backfilling_the_same_range_again_starts_nothing(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    run_through(create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], max_active_runs=100))
    preview = preview_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1])
    assert (preview.instants, preview.existing, preview.runs) == (31, 31, 0)
    # A second backfill has nothing to start: refused (409, naming the range), nothing made.
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1])
    assert (excinfo.value.field, excinfo.value.message) == (
        "range", "every instant of this range already has a run (31 instants): nothing to backfill")
    assert TriggerBackfill.objects.for_organization(org).count() == 1
    assert len(backfill_runs(trig)) == 31


@pytest.mark.django_db
def test_a_backfill_over_a_partly_fired_range_counts_only_the_runs_it_will_start(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-10", end="2026-03-12"))
    backfill = create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], max_active_runs=100)
    assert (backfill.total, backfill.created_runs, backfill.skipped) == (28, 0, 0)
    backfill = run_through(backfill)
    assert (backfill.state, backfill.total, backfill.created_runs, backfill.skipped) == ("succeeded", 28, 28, 3)
    assert len(backfill_runs(trig)) == 31


@pytest.mark.django_db
def test_a_range_holding_no_instant_is_refused_naming_the_range(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    assert preview_backfill(actor=actor(org), trigger=trig, start="2026-03-01T07:00", end="2026-03-01T08:00").instants \
        == 0
    with pytest.raises(BackfillError) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start="2026-03-01T07:00", end="2026-03-01T08:00")
    assert excinfo.value.field == "range" and not isinstance(excinfo.value, BackfillConflict)
    assert excinfo.value.message == "the range holds no instant of '0 6 * * *' (Europe/Berlin): nothing to backfill"
    assert not TriggerBackfill.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_the_first_day_of_1970_in_berlin_is_a_valid_start_and_its_midnight_is_backfilled(org, make_workflow):
    # Local midnight of 1970-01-01 in Berlin is 1969-12-31T23:00Z: the user gave a local day.
    trig = daily_berlin(org, make_workflow, cron="0 0 * * *")
    preview = preview_backfill(actor=actor(org), trigger=trig, start="1970-01-01", end="1970-01-03")
    assert preview.range_start == utc(1969, 12, 31, 23)
    assert [t.isoformat() for t in preview.sample] == [
        "1970-01-01T00:00:00+01:00", "1970-01-02T00:00:00+01:00", "1970-01-03T00:00:00+01:00"]
    backfill = run_through(create_backfill(actor=actor(org), trigger=trig, start="1970-01-01", end="1970-01-03"))
    assert (backfill.state, backfill.created_runs) == ("succeeded", 3)
    assert [r.scheduled_for for r in backfill_runs(trig)] == [utc(1969, 12, 31, 23), utc(1970, 1, 1, 23),
                                                              utc(1970, 1, 2, 23)]
    # An instant given in UTC is read as the day it falls on in Berlin: 1970-01-01 00:30 there.
    assert preview_backfill(actor=actor(org), trigger=trig, start="1969-12-31T23:30:00Z",
                            end="1970-01-03").instants == 2


@pytest.mark.django_db
@pytest.mark.parametrize(("zone", "start"), [
    ("Europe/Berlin", "1969-12-31"),
    ("Europe/Berlin", "1969-12-31T23:59"),
    ("Europe/Berlin", "1969-12-31T22:59:59Z"),  # 23:59:59 on 31 December in Berlin
    ("America/New_York", "1969-12-31T23:59"),
    ("America/New_York", "1970-01-01T04:59:59Z"),  # 23:59:59 on 31 December in New York
    ("Asia/Tokyo", "0001-01-01"),  # before year 1 in UTC: still named, not "out of range"
])
def test_a_start_on_a_day_before_1970_in_the_triggers_zone_is_refused_saying_so(org, make_workflow, zone, start):
    trig = daily_berlin(org, make_workflow)
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(timezone=zone)
    trig.refresh_from_db()
    with pytest.raises(BackfillError) as excinfo:
        preview_backfill(actor=actor(org), trigger=trig, start=start, end="1970-01-05")
    assert (excinfo.value.field, excinfo.value.message) == (
        "start", f"must be 1970-01-01 or later in the trigger's time zone ({zone})")


@pytest.mark.django_db
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Pacific/Kiritimati", "Pacific/Pago_Pago"])
def test_an_end_on_the_last_day_a_date_holds_is_cut_at_now_in_every_zone(org, make_workflow, zone):
    # 9999-12-31 in New York ends after the last instant a UTC datetime holds: still a valid
    # end (after now), not "out of range".
    trig = daily_berlin(org, make_workflow, cron="0 * * * *")
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(timezone=zone)
    trig.refresh_from_db()
    now = timezone.now()
    for end in ("9999-12-31", "9999-12-31T23:59", "9999-12-31T23:59:59-12:00"):
        preview = preview_backfill(actor=actor(org), trigger=trig, start=(now - dt.timedelta(hours=72)).isoformat(),
                                   end=end)
        assert preview.end_cut and now <= preview.range_end <= timezone.now(), end
        assert preview.instants == 72, end  # every hour of the last three days


@pytest.mark.django_db
def test_the_preview_counts_what_a_backfill_would_start_and_starts_nothing(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-10", end="2026-03-12"))
    preview = preview_backfill(actor=actor(org, Role.VIEWER), trigger=trig, start="2026-03-08", end="2026-03-31")
    assert (preview.instants, preview.existing, preview.runs, preview.end_cut) == (24, 3, 21, False)
    assert preview.first.isoformat() == "2026-03-08T06:00:00+01:00"
    assert preview.last.isoformat() == "2026-03-31T06:00:00+02:00"
    assert [t.isoformat() for t in preview.sample] == [f"2026-03-{d:02}T06:00:00+01:00" for d in range(8, 13)]
    # The range's bounds are the days in Berlin: from midnight of the first to the end of the last.
    assert preview.range_start == utc(2026, 3, 7, 23) and preview.range_end == utc(2026, 3, 31, 22) - dt.timedelta(
        microseconds=1)
    assert len(backfill_runs(trig)) == 3


@pytest.mark.django_db
def test_instants_as_bounds_are_read_in_the_triggers_zone_and_both_included(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    p = preview_backfill(actor=actor(org), trigger=trig, start="2026-03-28T06:00", end="2026-03-30T06:00")
    assert p.instants == 3
    p = preview_backfill(actor=actor(org), trigger=trig, start="2026-03-28T05:00:00Z", end="2026-03-30T04:00:00+00:00")
    assert p.instants == 3
    p = preview_backfill(actor=actor(org), trigger=trig, start="2026-03-28T06:00:01", end="2026-03-30T05:59")
    assert p.instants == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("start", "end", "field", "message"), [
    ("yesterday", "2026-03-31", "start", "is not a date (2026-03-01) or an ISO 8601 date and time"),
    ("2026-03-01", "", "end", "required"),
    ("2026-03-10", "2026-03-01", "end", "must not be before start"),
    ("2999-01-01", "2999-02-01", "start", "must be in the past"),
    ("1969-12-01", "1970-01-02", "start", "must be 1970-01-01 or later in the trigger's time zone (Europe/Berlin)"),
])
def test_a_bad_range_is_refused_naming_the_field(org, make_workflow, start, end, field, message):
    trig = daily_berlin(org, make_workflow)
    with pytest.raises(BackfillError) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start=start, end=end)
    assert excinfo.value.field == field and message in excinfo.value.message
    assert not TriggerBackfill.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_a_range_holding_more_instants_than_the_limit_is_refused_naming_end(org, make_workflow, settings):
    settings.FLOWFORGE_BACKFILL_MAX_RUNS = 50
    trig = daily_berlin(org, make_workflow, cron="*/30 * * * *")
    with pytest.raises(BackfillError) as excinfo:
        preview_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-02")
    assert excinfo.value.field == "end"
    assert "holds more than 50 instants of '*/30 * * * *' (FLOWFORGE_BACKFILL_MAX_RUNS)" in excinfo.value.message
    assert preview_backfill(actor=actor(org), trigger=trig, start="2026-03-01T00:00", end="2026-03-01T23:59").runs == 48


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "field"), [({"max_active_runs": 0}, "max_active_runs"),
                                                ({"max_active_runs": 101}, "max_active_runs"),
                                                ({"max_active_runs": True}, "max_active_runs"),
                                                ({"priority": 11}, "priority")])
def test_bad_backfill_options_are_named(org, make_workflow, options, field):
    trig = daily_berlin(org, make_workflow)
    with pytest.raises(BackfillError) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], **options)
    assert excinfo.value.field == field


@pytest.mark.django_db
def test_a_range_ending_after_now_is_cut_at_now(org, make_workflow):
    trig = daily_berlin(org, make_workflow, cron="0 * * * *")
    now = timezone.now()
    preview = preview_backfill(actor=actor(org), trigger=trig, start=(now - dt.timedelta(hours=5)).isoformat(),
                               end=(now + dt.timedelta(days=3)).isoformat())
    assert preview.end_cut and preview.range_end <= timezone.now()
    assert preview.instants == 5


@pytest.mark.django_db
def test_a_backfill_skips_an_instant_the_clock_fired_and_the_clock_skips_one_a_backfill_fired(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(next_fire_at=utc(2026, 3, 5, 5))
    assert process_trigger(trig.pk, utc(2026, 3, 5, 5, 0, 1)) == 1
    backfill = run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-04", end="2026-03-07"))
    assert (backfill.created_runs, backfill.skipped) == (3, 1)
    # The clock coming to an instant the backfill fired starts nothing.
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(next_fire_at=utc(2026, 3, 6, 5))
    assert process_trigger(trig.pk, utc(2026, 3, 6, 5, 0, 1)) == 0
    assert [r.scheduled_for for r in backfill_runs(trig)] == [utc(2026, 3, d, 5) for d in range(4, 8)]
    assert [r.trigger_source for r in backfill_runs(trig)] == ["backfill", "cron", "backfill", "backfill"]


@pytest.mark.django_db
def test_a_backfill_starts_the_run_of_an_instant_whose_firing_failed(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    TriggerFiring.objects.create(organization=org, trigger=trig, scheduled_for=utc(2026, 3, 2, 5), outcome="failed",
                                 detail="no active version of workflow 'nightly-report'")
    preview = preview_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-03")
    assert (preview.instants, preview.existing, preview.runs) == (3, 0, 3)
    backfill = run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-03"))
    assert backfill.created_runs == 3
    firing = TriggerFiring.objects.for_organization(org).get(trigger=trig, scheduled_for=utc(2026, 3, 2, 5))
    assert (firing.outcome, firing.backfill_id) == ("started", backfill.pk)
    assert firing.workflow_run.scheduled_for == utc(2026, 3, 2, 5)


@pytest.mark.django_db
def test_a_backfill_waits_while_its_max_active_runs_are_going(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    backfill = create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-05", max_active_runs=2)
    started, more = advance_backfill(backfill.pk)
    backfill.refresh_from_db()
    assert (started, more, backfill.state, backfill.created_runs) == (2, False, "running", 2)
    assert backfill.not_before > timezone.now()
    assert advance_backfills().started == 0  # not due yet
    WorkflowRun.objects.for_organization(org).filter(trigger=trig).update(state="succeeded",
                                                                         finished_at=timezone.now())
    assert advance_backfills(now=backfill.not_before).started == 2
    backfill.refresh_from_db()
    assert [r.scheduled_for for r in backfill_runs(trig)] == [utc(2026, 3, d, 5) for d in range(1, 5)]


@pytest.mark.django_db
def test_a_full_start_quota_makes_a_backfill_wait_and_then_go_on(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=3)
    backfill = create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-05", max_active_runs=100)
    advance_backfill(backfill.pk)
    backfill.refresh_from_db()
    assert (backfill.state, backfill.created_runs) == ("running", 3)
    assert backfill.not_before > timezone.now() + dt.timedelta(seconds=30)  # the quota's retry_after
    assert not TriggerFiring.objects.for_organization(org).filter(scheduled_for=utc(2026, 3, 4, 5)).exists()
    Organization.objects.filter(pk=org.pk).update(max_runs_per_minute_override=None)
    backfill = run_through(backfill)
    assert (backfill.state, backfill.created_runs) == ("succeeded", 5)


@pytest.mark.django_db
def test_a_backfill_fails_at_an_instant_no_run_can_start_for_and_a_new_one_picks_up(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    Workflow.objects.for_organization(org).update(state="archived")
    backfill = run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-03"))
    assert backfill.state == "failed" and backfill.finished_at is not None
    assert backfill.error == ("no run could start for 2026-03-01T05:00:00+00:00: no active version of workflow "
                              "'nightly-report'")
    assert not TriggerFiring.objects.for_organization(org).exists()  # nothing claimed, nothing half-written
    Workflow.objects.for_organization(org).update(state="active")
    again = run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-03"))
    assert (again.state, again.created_runs) == ("succeeded", 3)


@pytest.mark.django_db
def test_one_backfill_goes_per_trigger_and_the_organization_has_a_limit(org, make_workflow, settings):
    settings.FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG = 2
    first = daily_berlin(org, make_workflow)
    create_backfill(actor=actor(org), trigger=first, start=MARCH[0], end=MARCH[1])
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=actor(org), trigger=first, start="2026-02-01", end="2026-02-02")
    assert excinfo.value.field == "trigger" and "already going" in excinfo.value.message
    create_backfill(actor=actor(org), trigger=daily_berlin(org, name="second"), start=MARCH[0], end=MARCH[1])
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=actor(org), trigger=daily_berlin(org, name="third"), start=MARCH[0], end=MARCH[1])
    assert "FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG" in excinfo.value.message


@pytest.mark.django_db
def test_a_stale_expected_count_is_refused(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], expect_runs=30)
    assert excinfo.value.field == "expect_runs" and "has 31 runs to start, not 30" in excinfo.value.message


@pytest.mark.django_db
def test_cancelling_stops_a_backfill_and_keeps_its_runs(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    backfill = create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1], max_active_runs=100)
    advance_backfill(backfill.pk, batch=4)
    cancelled = cancel_backfill(actor=actor(org), backfill=backfill)
    assert (cancelled.state, cancelled.created_runs, cancelled.next_instant) == ("cancelled", 4, None)
    assert advance_backfills(now=timezone.now() + dt.timedelta(hours=1)).started == 0
    assert len(backfill_runs(trig)) == 4


@pytest.mark.django_db
def test_a_viewer_may_preview_but_not_backfill(org, make_workflow):
    from tenancy.permissions import Forbidden

    trig = daily_berlin(org, make_workflow)
    assert preview_backfill(actor=actor(org, Role.VIEWER), trigger=trig, start=MARCH[0], end=MARCH[1]).runs == 31
    with pytest.raises(Forbidden):
        create_backfill(actor=actor(org, Role.VIEWER), trigger=trig, start=MARCH[0], end=MARCH[1])
    backfill = create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1])
    with pytest.raises(Forbidden):
        cancel_backfill(actor=actor(org, Role.VIEWER), backfill=backfill)


@pytest.mark.django_db
def test_a_backfill_is_audited_and_each_run_it_starts_names_it(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    backfill = run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-02"))
    started = AuditLog.objects.for_organization(org).get(action="trigger.backfill_started")
    assert (started.target_id, started.metadata["runs"], started.metadata["backfill"]) == (
        str(trig.pk), 2, str(backfill.pk))
    assert started.metadata["range_start"] == "2026-02-28T23:00:00+00:00"
    finished = AuditLog.objects.for_organization(org).get(action="trigger.backfill_finished")
    assert (finished.actor_type, finished.metadata["state"], finished.metadata["created_runs"]) == (
        "system", "succeeded", 2)
    runs = AuditLog.objects.for_organization(org).filter(action="run.started").order_by("seq")
    assert [(e.metadata["channel"], e.metadata["backfill"], e.metadata["scheduled_for"]) for e in runs] == [
        ("backfill", str(backfill.pk), "2026-03-01T05:00:00+00:00"),
        ("backfill", str(backfill.pk), "2026-03-02T05:00:00+00:00")]


@pytest.mark.django_db(transaction=True)
def test_a_backfill_and_the_clock_racing_for_one_instant_start_one_run(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    instant = utc(2026, 3, 3, 5)
    for _ in range(3):  # each round a fresh instant the two race for
        ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(next_fire_at=instant)
        day = instant.date().isoformat()
        backfill = create_backfill(actor=actor(org), trigger=trig, start=day, end=day)
        barrier, errors = threading.Barrier(2), []

        def clock(instant=instant, barrier=barrier, errors=errors):
            try:
                barrier.wait(timeout=10)
                process_trigger(trig.pk, instant + dt.timedelta(seconds=1))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        def backfiller(backfill=backfill, barrier=barrier, errors=errors):
            try:
                barrier.wait(timeout=10)
                advance_backfill(backfill.pk)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=clock), threading.Thread(target=backfiller)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert WorkflowRun.objects.for_organization(org).filter(trigger=trig, scheduled_for=instant).count() == 1
        instant += dt.timedelta(days=1)


@pytest.mark.django_db(transaction=True)
def test_a_trigger_deleted_while_its_backfill_goes_on_is_deleted_without_a_deadlock(org, make_workflow):
    from engine.triggers import delete_trigger

    make_workflow(org, [{"key": "a", "type": "noop"}], name="nightly-report")
    for round_ in range(3):
        trig = daily_berlin(org, name=f"t{round_}", cron="0 * * * *")
        backfill = create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-05",
                                   max_active_runs=100)
        going, errors = threading.Event(), []

        def advance(backfill=backfill, going=going, errors=errors):
            try:
                for _ in range(20):
                    advance_backfill(backfill.pk, batch=5)
                    going.set()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        def delete(trig=trig, going=going, errors=errors):
            try:
                going.wait(10)
                delete_trigger(actor=actor(org, Role.OWNER), trigger=trig)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=advance), threading.Thread(target=delete)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert not ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).exists()
        assert not TriggerBackfill.objects.for_organization(org).filter(pk=backfill.pk).exists()


@pytest.mark.django_db
def test_a_backfill_stops_when_its_creator_may_no_longer_start_runs(org, make_workflow):
    from tenancy.models import Membership, User

    trig = daily_berlin(org, make_workflow)
    user = User.objects.create_user(email="temp@example.org")
    member = Membership.objects.create(organization=org, user=user, role=Role.MEMBER)
    person = Actor(organization=org, role=Role.MEMBER, user=user, channel="web")
    backfill = create_backfill(actor=person, trigger=trig, start=MARCH[0], end=MARCH[1], max_active_runs=100)
    advance_backfill(backfill.pk, batch=2)
    assert {r.triggered_by_id for r in backfill_runs(trig)} == {user.pk}  # on the creator's behalf
    Membership.objects.for_organization(org).filter(pk=member.pk).update(role=Role.VIEWER)
    backfill = run_through(backfill)
    assert (backfill.state, backfill.created_runs) == ("cancelled", 2)
    assert "may no longer start runs" in backfill.error
    finished = AuditLog.objects.for_organization(org).get(action="trigger.backfill_finished")
    assert finished.metadata["state"] == "cancelled"


# --- the REST API --------------------------------------------------------------------------------


def api_trigger(team) -> ScheduledTrigger:
    return daily_berlin(team.org)


@pytest.mark.django_db
def test_the_api_previews_starts_lists_and_cancels_a_backfill(client, acme):  # noqa: F811 (fixtures)
    trig = api_trigger(acme)
    base = f"/api/v1/triggers/{trig.pk}/backfills/"
    r = client.get(base + "preview/", {"start": MARCH[0], "end": MARCH[1]}, headers=acme.as_(Role.VIEWER))
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["instants"], body["existing"], body["runs"], body["timezone"]) == (31, 0, 31, "Europe/Berlin")
    assert (body["first"], body["last"]) == ("2026-03-01T06:00:00+01:00", "2026-03-31T06:00:00+02:00")
    r = client.post(base, {"start": MARCH[0], "end": MARCH[1], "expect_runs": 31, "max_active_runs": 100},
                    content_type="application/json", headers=acme.as_(Role.MEMBER))
    assert r.status_code == 201, r.content
    created = r.json()
    assert (created["state"], created["total"], created["remaining"], created["max_active_runs"]) == (
        "running", 31, 31, 100)
    assert created["created_by"] == acme.members[Role.OWNER].user.email  # a key acts for its creator
    run_through(TriggerBackfill.objects.for_organization(acme.org).get(pk=created["id"]))
    r = client.get(base + f"{created['id']}/", headers=acme.as_(Role.VIEWER))
    assert (r.json()["state"], r.json()["created_runs"], r.json()["remaining"]) == ("succeeded", 31, 0)
    r = client.get(base, headers=acme.as_(Role.VIEWER))
    assert [b["id"] for b in r.json()["results"]] == [created["id"]]
    # A run it started shows its instant and interval.
    run = backfill_runs(trig)[28]
    r = client.get(f"/api/v1/runs/{run.pk}/", headers=acme.as_(Role.VIEWER))
    assert {k: r.json()[k] for k in ("trigger_source", "scheduled_for", "data_interval_start", "data_interval_end")} \
        == {"trigger_source": "backfill", "scheduled_for": "2026-03-29T04:00:00Z",
            "data_interval_start": "2026-03-28T05:00:00Z", "data_interval_end": "2026-03-29T04:00:00Z"}
    # The second backfill of March has nothing to start: a 409 naming the range, nothing made.
    body = assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1]}, content_type="application/json",
                                      headers=acme.as_(Role.MEMBER)), 409)
    assert body["errors"] == {"range": ["every instant of this range already has a run (31 instants): nothing to "
                                        "backfill"]}
    assert TriggerBackfill.objects.for_organization(acme.org).count() == 1
    # Cancelling a finished one changes nothing.
    r = client.post(base + f"{created['id']}/cancel/", headers=acme.as_(Role.MEMBER))
    assert r.status_code == 200 and r.json()["state"] == "succeeded"


@pytest.mark.django_db
def test_the_api_answers_a_backfill_of_a_partly_fired_range_with_the_runs_it_will_start(client, acme):  # noqa: F811
    trig = api_trigger(acme)
    base = f"/api/v1/triggers/{trig.pk}/backfills/"
    run_through(create_backfill(actor=actor(acme.org), trigger=trig, start="2026-03-10", end="2026-03-12"))
    r = client.post(base, {"start": MARCH[0], "end": MARCH[1], "expect_runs": 28}, content_type="application/json",
                    headers=acme.as_(Role.MEMBER))
    assert r.status_code == 201, r.content
    assert {k: r.json()[k] for k in ("total", "created_runs", "skipped", "remaining")} == {
        "total": 28, "created_runs": 0, "skipped": 0, "remaining": 28}
    advance_backfill(r.json()["id"], batch=12)  # 1..9 March started, 10..12 passed over
    r = client.get(base + f"{r.json()['id']}/", headers=acme.as_(Role.VIEWER))
    assert {k: r.json()[k] for k in ("state", "total", "created_runs", "skipped", "remaining")} == {
        "state": "running", "total": 28, "created_runs": 9, "skipped": 3, "remaining": 19}


@pytest.mark.django_db
def test_the_api_names_the_field_of_a_refused_backfill(client, acme):  # noqa: F811 (fixtures)
    trig = api_trigger(acme)
    base = f"/api/v1/triggers/{trig.pk}/backfills/"
    body = assert_problem(client.get(base + "preview/", {"start": "soon", "end": "2026-03-31"},
                                     headers=acme.as_(Role.VIEWER)), 400)
    assert "start" in body["errors"]
    body = assert_problem(client.get(base + "preview/", {"start": "2026-03-01"}, headers=acme.as_(Role.VIEWER)), 400)
    assert "end" in body["errors"]
    body = assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1], "max_active_runs": "3"},
                                      content_type="application/json", headers=acme.as_(Role.MEMBER)), 400)
    assert "max_active_runs" in body["errors"]
    for priority in (11, "3"):  # the words of every other priority check (engine.states.priority_problem)
        body = assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1], "priority": priority},
                                          content_type="application/json", headers=acme.as_(Role.MEMBER)), 400)
        assert body["errors"] == {"priority": [f"must be a whole number from -10 to 10, got {priority!r}"]}
    body = assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1], "expect_runs": 5},
                                      content_type="application/json", headers=acme.as_(Role.MEMBER)), 409)
    assert body["errors"] == {"expect_runs": ["the range now has 31 runs to start, not 5; preview it again"]}
    client.post(base, {"start": MARCH[0], "end": MARCH[1]}, content_type="application/json",
                headers=acme.as_(Role.MEMBER))
    body = assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1]}, content_type="application/json",
                                      headers=acme.as_(Role.MEMBER)), 409)
    assert "already going" in body["errors"]["trigger"][0]
    assert TriggerBackfill.objects.for_organization(acme.org).count() == 1


@pytest.mark.django_db
def test_the_api_refuses_a_viewer_and_hides_another_organizations_backfills(client, acme, other):  # noqa: F811 (fixtures)
    trig = api_trigger(acme)
    base = f"/api/v1/triggers/{trig.pk}/backfills/"
    assert_problem(client.post(base, {"start": MARCH[0], "end": MARCH[1]}, content_type="application/json",
                               headers=acme.as_(Role.VIEWER)), 403)
    backfill = create_backfill(actor=acme.actor(), trigger=trig, start=MARCH[0], end=MARCH[1])
    assert_problem(client.post(base + f"{backfill.pk}/cancel/", headers=acme.as_(Role.VIEWER)), 403)
    # Another organization: its key gets 404s for the trigger and the backfill alike, and starts nothing.
    for response in (
        client.get(base + "preview/", {"start": MARCH[0], "end": MARCH[1]}, headers=other.as_(Role.OWNER)),
        client.get(base, headers=other.as_(Role.OWNER)),
        client.post(base, {"start": "2026-01-01", "end": "2026-01-02"}, content_type="application/json",
                    headers=other.as_(Role.OWNER)),
        client.get(base + f"{backfill.pk}/", headers=other.as_(Role.OWNER)),
        client.post(base + f"{backfill.pk}/cancel/", headers=other.as_(Role.OWNER)),
    ):
        assert_problem(response, 404)
    other_trigger = api_trigger(other)
    assert_problem(client.get(f"/api/v1/triggers/{other_trigger.pk}/backfills/{backfill.pk}/",
                              headers=other.as_(Role.OWNER)), 404)
    backfill.refresh_from_db()
    assert backfill.state == "running" and TriggerBackfill.objects.for_organization(acme.org).count() == 1


@pytest.mark.django_db
def test_the_api_shows_a_triggers_missed_instants(client, acme):  # noqa: F811 (fixtures)
    trig = api_trigger(acme)
    ScheduledTrigger.objects.for_organization(acme.org).filter(pk=trig.pk).update(
        next_fire_at=utc(2026, 3, 1, 5), catch_up="latest")
    process_trigger(trig.pk, utc(2026, 3, 4, 6))
    missed = client.get(f"/api/v1/triggers/{trig.pk}/", headers=acme.as_(Role.VIEWER)).json()["missed_instants"]
    assert (missed["not_fired"], missed["first_not_fired"], missed["last_not_fired"], missed["reason"]) == (
        3, "2026-03-01T05:00:00Z", "2026-03-03T05:00:00Z", "catch_up_policy")


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_command_previews_then_starts_a_backfill(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    out = io.StringIO()
    call_command("backfill_trigger", "daily", "--org", org.slug, "--start", MARCH[0], "--end", MARCH[1],
                 "--dry-run", stdout=out)
    assert "31 instants, 0 already have a run: 31 runs to start" in out.getvalue()
    assert not TriggerBackfill.objects.for_organization(org).exists()
    out = io.StringIO()
    call_command("backfill_trigger", "daily", "--org", org.slug, "--start", MARCH[0], "--end", MARCH[1],
                 "--max-active-runs", "1", stdout=out)
    backfill = TriggerBackfill.objects.for_organization(org).get(trigger=trig)
    assert f"backfill {backfill.pk} started" in out.getvalue() and backfill.max_active_runs == 1
    entry = AuditLog.objects.for_organization(org).get(action="trigger.backfill_started")
    assert entry.metadata["channel"] == "cli"
    advance_backfill(backfill.pk, batch=1)
    out = io.StringIO()
    call_command("show_run", str(backfill_runs(trig)[0].pk), "--no-events", stdout=out)
    assert ("scheduled for 2026-03-01T05:00:00+00:00  data interval 2026-02-28T05:00:00+00:00 .. "
            "2026-03-01T05:00:00+00:00  (backfill)") in out.getvalue()
    # 1 March has its run now: backfilling that day is refused, saying why, and makes nothing.
    out = io.StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("backfill_trigger", "daily", "--org", org.slug, "--start", MARCH[0], "--end", MARCH[0],
                     stdout=out)
    assert "1 instants, 1 already have a run: 0 runs to start" in out.getvalue()
    assert str(excinfo.value) == ("--start/--end: every instant of this range already has a run (1 instant): "
                                  "nothing to backfill")
    assert TriggerBackfill.objects.for_organization(org).count() == 1
    with pytest.raises(CommandError, match=r"--end: must not be before start"):
        call_command("backfill_trigger", "daily", "--org", org.slug, "--start", "2026-03-05", "--end", "2026-03-01")
    with pytest.raises(CommandError, match=r"no trigger 'nope'"):
        call_command("backfill_trigger", "nope", "--org", org.slug, "--start", "2026-03-05", "--end", "2026-03-06")


# --- the trigger's page --------------------------------------------------------------------------


def web_team(org, make_workflow):
    from tests.unit.test_web_workflows import make_team

    team = make_team(org)
    return team, daily_berlin(org, make_workflow)


@pytest.mark.django_db
def test_the_trigger_page_previews_then_starts_a_backfill(org, make_workflow):
    from tests.unit.test_web_workflows import assert_csp_clean, client_for, text

    team, trig = web_team(org, make_workflow)
    browser = client_for(team["member"])
    body = text(browser.get(f"/triggers/{trig.pk}/"))
    assert 'data-action="preview"' in body and "No backfill yet." in body
    resp = browser.get(f"/triggers/{trig.pk}/", {"start": MARCH[0], "end": MARCH[1], "max_active_runs": "31"})
    assert resp.status_code == 200
    body = text(resp)
    assert_csp_clean(body)
    assert "31 runs to start" in body and "Start backfill of 31 runs" in body
    assert "First: Sun 1 Mar 2026, 06:00 CET; last: Tue 31 Mar 2026, 06:00 CEST." in body
    assert not TriggerBackfill.objects.for_organization(org).exists()  # a preview starts nothing
    resp = browser.post(f"/triggers/{trig.pk}/backfill/", {"start": MARCH[0], "end": MARCH[1],
                                                           "max_active_runs": "31", "expect_runs": "31"})
    assert resp.status_code == 302 and resp["Location"] == f"/triggers/{trig.pk}/#backfills"
    backfill = TriggerBackfill.objects.for_organization(org).get()
    assert (backfill.total, backfill.max_active_runs, backfill.created_by_id) == (31, 31, team["member"].user_id)
    run_through(backfill)
    body = text(browser.get(f"/triggers/{trig.pk}/"))
    assert "31 / 31" in body and "Succeeded" in body
    assert body.count('<a class="mono" href="/runs/') == 20  # the most recent firings, each linking its run
    # Previewed again, March has nothing to start: no start button, and a start is refused saying why.
    body = text(browser.get(f"/triggers/{trig.pk}/", {"start": MARCH[0], "end": MARCH[1]}))
    assert "0 runs to start" in body and 'data-action="start-backfill"' not in body
    assert "Nothing to backfill: every instant of this range already has a run." in body
    resp = browser.post(f"/triggers/{trig.pk}/backfill/", {"start": MARCH[0], "end": MARCH[1], "expect_runs": "0"})
    assert resp.status_code == 400
    assert "Every instant of this range already has a run (31 instants): nothing to backfill" in text(resp)
    assert TriggerBackfill.objects.for_organization(org).count() == 1
    # A run it started shows its instant on the run page.
    run = backfill_runs(trig)[-1]
    body = text(browser.get(f"/runs/{run.pk}/"))
    assert "Scheduled for" in body and 'datetime="2026-03-31T04:00:00+00:00"' in body and "Data interval" in body


@pytest.mark.django_db
def test_the_trigger_page_names_the_field_of_a_refused_backfill(org, make_workflow):
    from tests.unit.test_web_triggers import field_errors
    from tests.unit.test_web_workflows import client_for, text

    team, trig = web_team(org, make_workflow)
    browser = client_for(team["member"])
    resp = browser.get(f"/triggers/{trig.pk}/", {"start": "2026-03-10", "end": "2026-03-01"})
    assert resp.status_code == 400
    assert "Must not be before start" in field_errors(text(resp), "end")
    resp = browser.post(f"/triggers/{trig.pk}/backfill/", {"start": MARCH[0], "end": MARCH[1], "expect_runs": "7"})
    assert resp.status_code == 400
    assert "The range now has 31 runs to start, not 7" in text(resp)
    assert not TriggerBackfill.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_a_viewer_sees_no_backfill_form_and_gets_403_and_another_organization_404(org, make_org, make_workflow):
    from tests.unit.test_web_workflows import client_for, make_team, text

    team, trig = web_team(org, make_workflow)
    viewer = client_for(team["viewer"])
    body = text(viewer.get(f"/triggers/{trig.pk}/"))
    assert 'data-action="preview"' not in body and trig.name in body
    assert viewer.post(f"/triggers/{trig.pk}/backfill/", {"start": MARCH[0], "end": MARCH[1]}).status_code == 403
    backfill = create_backfill(actor=actor(org), trigger=trig, start=MARCH[0], end=MARCH[1])
    assert viewer.post(f"/triggers/{trig.pk}/backfills/{backfill.pk}/cancel/").status_code == 403
    stranger = client_for(make_team(make_org())["owner"])
    assert stranger.get(f"/triggers/{trig.pk}/").status_code == 404
    assert stranger.post(f"/triggers/{trig.pk}/backfill/", {"start": MARCH[0], "end": MARCH[1]}).status_code == 404
    assert stranger.post(f"/triggers/{trig.pk}/backfills/{backfill.pk}/cancel/").status_code == 404
    backfill.refresh_from_db()
    assert backfill.state == "running"
    member = client_for(team["member"])
    assert member.post(f"/triggers/{trig.pk}/backfills/{backfill.pk}/cancel/").status_code == 302
    backfill.refresh_from_db()
    assert backfill.state == "cancelled"


@pytest.mark.django_db
def test_the_trigger_page_says_which_instants_the_clock_missed_and_offers_their_backfill(org, make_workflow):
    from tests.unit.test_web_workflows import client_for, text

    team, trig = web_team(org, make_workflow)
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(
        next_fire_at=utc(2026, 3, 1, 5), catch_up="latest")
    process_trigger(trig.pk, utc(2026, 3, 4, 6))
    body = text(client_for(team["viewer"]).get("/triggers/"))
    assert ">missed</span>" in body
    browser = client_for(team["member"])
    body = text(browser.get(f"/triggers/{trig.pk}/"))
    assert "3 due instants were not fired" in body
    assert "(Sun 1 Mar 2026, 06:00 CET – Tue 3 Mar 2026, 06:00 CET)" in body
    assert 'href="?start=2026-03-01T06%3A00&end=2026-03-03T06%3A00#backfill"' in body  # (unescaped)
    preview = preview_backfill(actor=actor(org), trigger=trig, start="2026-03-01T06:00", end="2026-03-03T06:00")
    assert (preview.instants, preview.runs) == (3, 3)
    # A backfill of part of the range leaves the note; one of all of it answers it.
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-02"))
    trig.refresh_from_db()
    assert trig.missed_instants is not None
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01T06:00", end="2026-03-03T06:00"))
    trig.refresh_from_db()
    assert trig.missed_instants is None
    assert "not fired" not in text(browser.get(f"/triggers/{trig.pk}/"))


@pytest.mark.django_db
def test_the_trigger_page_takes_a_constant_number_of_queries(org, make_workflow):
    from tests.unit.test_web_workflows import client_for, sql_count

    team, trig = web_team(org, make_workflow)
    browser = client_for(team["member"])
    before, _ = sql_count(browser, f"/triggers/{trig.pk}/")
    for day in ("2026-03-01", "2026-03-05", "2026-03-09"):
        run_through(create_backfill(actor=actor(org), trigger=trig, start=day, end=day))
    after, _ = sql_count(browser, f"/triggers/{trig.pk}/")
    assert after == before


@pytest.mark.django_db
def test_a_refused_backfill_of_a_missed_range_whose_instants_all_have_runs_answers_the_note(org, make_workflow):
    trig = daily_berlin(org, make_workflow)
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(
        next_fire_at=utc(2026, 3, 1, 5), catch_up="latest")
    process_trigger(trig.pk, utc(2026, 3, 4, 6))
    # Two backfills of parts of the missed range give each of its instants a run; the note stays.
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-01", end="2026-03-01"))
    run_through(create_backfill(actor=actor(org), trigger=trig, start="2026-03-02", end="2026-03-03"))
    trig.refresh_from_db()
    assert trig.missed_instants is not None
    # "Backfill them" then has nothing to start: refused, and the note is answered.
    with pytest.raises(BackfillConflict) as excinfo:
        create_backfill(actor=actor(org), trigger=trig, start="2026-03-01T06:00", end="2026-03-03T06:00")
    assert excinfo.value.field == "range"
    trig.refresh_from_db()
    assert trig.missed_instants is None
    assert TriggerBackfill.objects.for_organization(org).count() == 2
