"""Cron dates (issue 19): a cron run knows the instant it is for and the data interval it
covers; catch-up past its bound says so; editing a schedule never skips an instant that
both the old and the new schedule contain."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from audit.models import AuditLog
from engine.cron import MAX_CATCH_UP, process_trigger
from engine.models import ScheduledTrigger, TaskRunEvent, TriggerFiring, WorkflowRun
from engine.services import retry_run
from engine.states import RunSchedule
from engine.triggers import (
    create_trigger,
    instants_in_range,
    next_fire_after_edit,
    next_instant,
    previous_instant,
    run_schedule,
    update_trigger,
)
from tenancy.actors import Actor
from tests.unit.test_runtime_inprocess import broker, drive, quiet_heartbeater  # noqa: F401 (fixtures)

BERLIN = ZoneInfo("Europe/Berlin")
UTC = dt.UTC


def utc(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def make_trigger(org, make_workflow, cron, *, tz="UTC", catch_up="latest", name="t", tasks=None):
    from engine.models import Workflow

    if not Workflow.objects.for_organization(org).filter(name="wf").exists():
        make_workflow(org, tasks or [{"key": "a", "type": "noop"}], name="wf")
    return create_trigger(actor=Actor.system(org), data={
        "name": name, "workflow_name": "wf", "cron_expression": cron, "timezone": tz, "catch_up": catch_up,
    })


def set_next(trigger, when):
    ScheduledTrigger.objects.for_organization(trigger.organization_id).filter(pk=trigger.pk).update(
        next_fire_at=when, last_fired_at=None)
    trigger.refresh_from_db()


def runs_of(trigger) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.for_organization(trigger.organization_id).filter(trigger=trigger)
                .order_by("scheduled_for"))


# --- the instant and its data interval ---------------------------------------------------------


def test_previous_instant_follows_the_clocks_rules_across_both_dst_changes():
    # Daily 06:00 Berlin: the interval ending on the spring-forward day is 23 hours long.
    assert previous_instant("0 6 * * *", "Europe/Berlin", utc(2026, 3, 29, 4, 0)) == utc(2026, 3, 28, 5, 0)
    # 02:30 does not exist on 2026-03-29 (it fires at 03:00 CEST): the next day's run starts there.
    assert previous_instant("30 2 * * *", "Europe/Berlin", utc(2026, 3, 30, 0, 30)) == utc(2026, 3, 29, 1, 0)
    # 02:30 happens twice on 2026-10-25 and fires once (the first pass): the next day's interval
    # starts at the first pass, not at the second one croniter would name.
    assert previous_instant("30 2 * * *", "Europe/Berlin", utc(2026, 10, 26, 1, 30)) == utc(2026, 10, 25, 0, 30)
    # Every 30 minutes through the repeated hour: each real half hour, the second pass included.
    assert previous_instant("*/30 * * * *", "Europe/Berlin", utc(2026, 10, 25, 1, 0)) == utc(2026, 10, 25, 0, 30)
    # Between two instants: the one before.
    assert previous_instant("0 * * * *", "UTC", utc(2026, 1, 1, 10, 17)) == utc(2026, 1, 1, 10, 0)


@pytest.mark.parametrize("window", [(utc(2026, 3, 22), utc(2026, 4, 5)), (utc(2026, 10, 18), utc(2026, 11, 1))])
def test_previous_instant_and_next_instant_agree_across_a_dst_change(window):
    for expression in ("30 2 * * *", "0 6 * * 1-5", "*/45 1-3 * * *"):
        instants = instants_in_range(expression, "Europe/Berlin", *window, limit=5000)
        for earlier, later in zip(instants, instants[1:], strict=False):
            assert previous_instant(expression, "Europe/Berlin", later) == earlier, (expression, later)


def test_a_daily_runs_data_interval_is_the_day_that_just_ended():
    schedule = run_schedule("0 0 * * *", "Europe/Berlin", utc(2026, 3, 1, 23, 0))  # 2026-03-02 00:00 CET
    assert schedule == RunSchedule(scheduled_for=utc(2026, 3, 1, 23, 0), data_interval_start=utc(2026, 2, 28, 23, 0),
                                   data_interval_end=utc(2026, 3, 1, 23, 0))
    assert schedule.as_dict() == {"scheduled_for": "2026-03-01T23:00:00+00:00",
                                  "data_interval_start": "2026-02-28T23:00:00+00:00",
                                  "data_interval_end": "2026-03-01T23:00:00+00:00"}


@pytest.mark.django_db
def test_a_clock_fired_run_carries_its_instant_and_interval_beside_its_input(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 6 * * *", tz="Europe/Berlin")
    ScheduledTrigger.objects.for_organization(org).filter(pk=trig.pk).update(input={"scheduled_for": "mine"})
    set_next(trig, utc(2026, 3, 29, 4, 0))
    assert process_trigger(trig.pk, utc(2026, 3, 29, 4, 0, 3)) == 1
    (run,) = runs_of(trig)
    assert run.scheduled_for == utc(2026, 3, 29, 4, 0)
    assert (run.data_interval_start, run.data_interval_end) == (utc(2026, 3, 28, 5, 0), utc(2026, 3, 29, 4, 0))
    # The run's input is the trigger's, untouched: its own keys never meet the instant.
    assert run.input == {"scheduled_for": "mine"}
    started = TaskRunEvent.objects.for_organization(org).get(workflow_run=run, kind="run_started")
    assert started.detail["scheduled_for"] == "2026-03-29T04:00:00+00:00"


@pytest.mark.django_db
def test_a_retry_of_a_cron_run_is_for_the_same_instant(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 * * * *")
    set_next(trig, utc(2026, 11, 1, 3, 0))
    process_trigger(trig.pk, utc(2026, 11, 1, 3, 0, 1))
    (run,) = runs_of(trig)
    WorkflowRun.objects.for_organization(org).filter(pk=run.pk).update(state="failed", finished_at=utc(2026, 11, 1, 3, 1))
    run.refresh_from_db()
    again = retry_run(actor=Actor.system(org), run=run)
    assert (again.scheduled_for, again.data_interval_start, again.data_interval_end) == (
        utc(2026, 11, 1, 3, 0), utc(2026, 11, 1, 2, 0), utc(2026, 11, 1, 3, 0))


@pytest.mark.django_db
def test_a_run_started_by_hand_has_no_instant(org, make_workflow):
    from engine.services import start_run

    run = start_run(workflow=make_workflow(org, [{"key": "a", "type": "noop"}], name="plain"))
    assert (run.scheduled_for, run.data_interval_start, run.data_interval_end) == (None, None, None)


@pytest.mark.django_db(transaction=True)
def test_the_handler_context_holds_the_runs_instant(org, make_workflow, broker):  # noqa: F811
    trig = make_trigger(org, make_workflow, "0 6 * * *", tz="Europe/Berlin",
                        tasks=[{"key": "when", "type": "python", "config": {"callable": "tests.callables.schedule_of"}}])
    set_next(trig, utc(2026, 3, 29, 4, 0))
    process_trigger(trig.pk, utc(2026, 3, 29, 4, 0, 1))
    (run,) = runs_of(trig)
    drive(run.pk)
    output = run.task_runs.get().output
    assert output == {"scheduled_for": "2026-03-29T04:00:00+00:00", "data_interval_start": "2026-03-28T05:00:00+00:00",
                      "data_interval_end": "2026-03-29T04:00:00+00:00"}


# A weekday run and a weekend run, chosen by a condition on the run's instant in Berlin
# (CEL's getDayOfWeek: 0 is Sunday), and a task only for runs no trigger started.
BRANCHES = [
    {"key": "weekday", "type": "noop",
     "condition": 'schedule != null && schedule.scheduled_for.getDayOfWeek("Europe/Berlin") in [1, 2, 3, 4, 5]'},
    {"key": "weekend", "type": "noop",
     "condition": 'schedule != null && schedule.scheduled_for.getDayOfWeek("Europe/Berlin") in [0, 6]'},
    {"key": "by_hand", "type": "noop", "condition": "schedule == null"},
    {"key": "first_of_month", "type": "noop",
     "condition": 'schedule != null && schedule.data_interval_end - schedule.data_interval_start == duration("23h") '
                  '&& string(schedule.scheduled_for) == "2026-03-29T04:00:00Z"'},
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("instant", "ran"), [
    # Sunday 29 March 2026, 06:00 in Berlin (04:00 UTC, the day the clocks went forward: the
    # interval since Saturday's 06:00 is 23 hours).
    (utc(2026, 3, 29, 4, 0), {"weekend", "first_of_month"}),
    # Monday 30 March 2026, 06:00 in Berlin.
    (utc(2026, 3, 30, 4, 0), {"weekday"}),
])
def test_a_condition_branches_on_the_cron_runs_instant(org, make_workflow, broker, instant, ran):  # noqa: F811
    trig = make_trigger(org, make_workflow, "0 6 * * *", tz="Europe/Berlin", tasks=BRANCHES)
    set_next(trig, instant)
    process_trigger(trig.pk, instant + dt.timedelta(seconds=1))
    (run,) = runs_of(trig)
    drive(run.pk)
    states = dict(run.task_runs.values_list("task__key", "state"))
    assert states == {key: "succeeded" if key in ran else "skipped" for key in states}
    assert set(states) == {"weekday", "weekend", "by_hand", "first_of_month"}


@pytest.mark.django_db(transaction=True)
def test_a_run_started_by_hand_has_a_null_schedule_in_its_conditions(org, make_workflow, broker):  # noqa: F811
    from engine.services import start_run

    run = start_run(workflow=make_workflow(org, BRANCHES, name="plain"))
    drive(run.pk)
    states = dict(run.task_runs.values_list("task__key", "state"))
    assert states == {"weekday": "skipped", "weekend": "skipped", "by_hand": "succeeded",
                      "first_of_month": "skipped"}


def test_a_conditions_schedule_is_three_timestamps_or_null():
    from engine import conditions

    schedule = RunSchedule(utc(2026, 3, 2, 0, 0), utc(2026, 3, 1, 0, 0), utc(2026, 3, 2, 0, 0))
    assert conditions.evaluate('schedule.scheduled_for == timestamp("2026-03-02T00:00:00Z")', run_input={},
                               upstream={}, schedule=schedule) is True
    assert conditions.evaluate('string(schedule.data_interval_start) == "2026-03-01T00:00:00Z"', run_input={},
                               upstream={}, schedule=schedule) is True
    assert conditions.evaluate("schedule != null", run_input={}, upstream={}, schedule=schedule) is True
    assert conditions.evaluate("schedule == null", run_input={}, upstream={}, schedule=None) is True
    with pytest.raises(conditions.ConditionFailed, match="does not support field selection"):
        conditions.evaluate("schedule.scheduled_for > timestamp('2026-01-01T00:00:00Z')", run_input={},
                            upstream={}, schedule=None)


# --- catch-up past its bound ---------------------------------------------------------------------


@pytest.mark.django_db
def test_catch_up_past_its_bound_says_which_instants_it_did_not_fire(org, make_workflow):
    trig = make_trigger(org, make_workflow, "*/5 * * * *", catch_up="all")
    set_next(trig, utc(2026, 11, 1, 0, 0))
    # Down for 10 hours: 121 instants due (00:00 .. 10:00), the most recent 100 fire.
    now = utc(2026, 11, 1, 10, 0, 30)
    assert process_trigger(trig.pk, now) == MAX_CATCH_UP
    fired = sorted(TriggerFiring.objects.for_organization(org).filter(trigger=trig)
                   .values_list("scheduled_for", flat=True))
    assert fired[0] == utc(2026, 11, 1, 1, 45) and fired[-1] == utc(2026, 11, 1, 10, 0)
    trig.refresh_from_db()
    assert trig.missed_instants == {
        "at": now.isoformat(), "policy": "all", "reason": "catch_up_bound", "due": 121, "fired": 100,
        "not_fired": 21, "first_not_fired": "2026-11-01T00:00:00+00:00",
        "last_not_fired": "2026-11-01T01:40:00+00:00", "max_catch_up": 100,
    }
    (entry,) = AuditLog.objects.for_organization(org).filter(action="trigger.instants_missed")
    assert entry.target_id == str(trig.pk) and entry.actor_type == "system"
    assert entry.metadata["not_fired"] == 21 and entry.metadata["first_not_fired"] == "2026-11-01T00:00:00+00:00"


@pytest.mark.django_db
def test_the_latest_policy_says_how_many_instants_it_left(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 * * * *", catch_up="latest")
    set_next(trig, utc(2026, 11, 1, 1, 0))
    process_trigger(trig.pk, utc(2026, 11, 1, 10, 30))
    trig.refresh_from_db()
    note = trig.missed_instants
    assert (note["reason"], note["due"], note["fired"], note["not_fired"]) == ("catch_up_policy", 10, 1, 9)
    assert (note["first_not_fired"], note["last_not_fired"]) == ("2026-11-01T01:00:00+00:00",
                                                                 "2026-11-01T09:00:00+00:00")


@pytest.mark.django_db
def test_an_on_time_tick_records_nothing_missed(org, make_workflow):
    trig = make_trigger(org, make_workflow, "0 * * * *", catch_up="all")
    set_next(trig, utc(2026, 11, 1, 1, 0))
    process_trigger(trig.pk, utc(2026, 11, 1, 1, 0, 2))
    trig.refresh_from_db()
    assert trig.missed_instants is None
    assert not AuditLog.objects.for_organization(org).filter(action="trigger.instants_missed").exists()


# --- editing a schedule --------------------------------------------------------------------------


def test_an_edit_after_an_instant_came_due_keeps_it_when_the_tick_has_not_fired_it():
    # The probe: due at 02:40:00, the equivalent expression saved at 02:40:01 before
    # the clock's tick. Recomputed from now it became 02:41 and 02:40 was lost.
    pending = utc(2026, 5, 1, 2, 40)
    assert next_fire_after_edit(expression="*/1 * * * *", tz_name="UTC", was_enabled=True, pending=pending,
                                last_fired=utc(2026, 5, 1, 2, 39), now=utc(2026, 5, 1, 2, 40, 1)) == pending
    # Kept even when the new schedule does not contain it: it came due under the old one.
    assert next_fire_after_edit(expression="45 2 * * *", tz_name="UTC", was_enabled=True, pending=pending,
                                last_fired=None, now=utc(2026, 5, 1, 2, 40, 1)) == pending


def test_an_edit_before_an_instant_keeps_it_when_the_new_schedule_has_it():
    assert next_fire_after_edit(expression="*/1 * * * *", tz_name="UTC", was_enabled=True,
                                pending=utc(2026, 5, 1, 2, 40), last_fired=utc(2026, 5, 1, 2, 39),
                                now=utc(2026, 5, 1, 2, 39, 58)) == utc(2026, 5, 1, 2, 40)
    # A new schedule with an earlier instant than the old one's next: the earlier one.
    assert next_fire_after_edit(expression="0 * * * *", tz_name="UTC", was_enabled=True,
                                pending=utc(2026, 5, 2, 0, 0), last_fired=None,
                                now=utc(2026, 5, 1, 2, 39, 58)) == utc(2026, 5, 1, 3, 0)


def test_an_edit_never_moves_next_fire_at_back_to_an_instant_already_fired():
    # A tick fired 02:40 while the edit waited for the row; the edit's clock read 02:39:59.9.
    assert next_fire_after_edit(expression="*/1 * * * *", tz_name="UTC", was_enabled=True,
                                pending=utc(2026, 5, 1, 2, 41), last_fired=utc(2026, 5, 1, 2, 40),
                                now=utc(2026, 5, 1, 2, 39, 59, 900000)) == utc(2026, 5, 1, 2, 41)


def test_a_resume_does_not_fire_the_paused_period():
    assert next_fire_after_edit(expression="0 * * * *", tz_name="UTC", was_enabled=False,
                                pending=utc(2026, 5, 1, 1, 0), last_fired=None,
                                now=utc(2026, 5, 1, 9, 30)) == utc(2026, 5, 1, 10, 0)


@pytest.mark.django_db
def test_an_equivalent_expression_saved_after_the_instant_came_due_fires_it_exactly_once(org, make_workflow):
    trig = make_trigger(org, make_workflow, "* * * * *")
    twin = make_trigger(org, make_workflow, "* * * * *", name="twin")
    due = next_instant("* * * * *", "UTC", dt.datetime.now(UTC) - dt.timedelta(minutes=3))
    set_next(trig, due)
    set_next(twin, due)
    # Saved now, after ``due`` and before any tick processed it.
    edited = update_trigger(actor=Actor.system(org), trigger=trig, data={"cron_expression": "*/1 * * * *"})
    assert edited.next_fire_at == due
    tick = due + dt.timedelta(seconds=2)
    assert process_trigger(trig.pk, tick) == 1 and process_trigger(twin.pk, tick) == 1
    assert process_trigger(trig.pk, tick) == 0  # a second tick finds nothing due
    for t in (trig, twin):
        assert [r.scheduled_for for r in runs_of(t)] == [due]
        t.refresh_from_db()
        assert t.next_fire_at == due + dt.timedelta(minutes=1)
