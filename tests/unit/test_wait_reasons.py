"""Why a ready task run waits (engine/sql/waiting.sql, engine.repositories.waiting):
each reason computed for a hand-built state, in the brief's words and order, and the
scheduler's `waiting` events: one per change of reason, none when nothing changed."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.db import connection, transaction

from engine.models import RateLimitBucket, Task, TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.repositories import runs, waiting

pytestmark = pytest.mark.django_db

ONE = [{"key": "a", "type": "noop"}]


def db_now() -> dt.datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def start(wf, run_input=None) -> uuid.UUID:
    with transaction.atomic():
        return runs.create_with_task_runs(workflow_id=wf.pk, organization_id=wf.organization_id,
                                          run_input=run_input or {}, trigger_source="cli")


def ready_row(run_id) -> TaskRun:
    return TaskRun.objects.unscoped().get(workflow_run_id=run_id, state="ready")


def set_task(wf, **fields) -> None:
    Task.objects.unscoped().filter(workflow=wf).update(**fields)


def hold(wf, n: int, *, started: bool = True, key: str | None = None) -> list[uuid.UUID]:
    """n running task runs of workflow ``wf`` (one run each): claimed (token 1) and, when
    ``started``, started; each holding concurrency key ``key``."""
    ids = []
    for _ in range(n):
        tr = ready_row(start(wf))
        TaskRun.objects.unscoped().filter(pk=tr.pk).update(
            state="running", fencing_token=1, started_fencing_token=1 if started else None,
            lease_expires_at=db_now() + dt.timedelta(seconds=60), concurrency_key=key)
        ids.append(tr.pk)
    return ids


def reason_of(run_id) -> str:
    tr = ready_row(run_id)
    got = waiting.reasons(run_id=run_id)
    assert set(got) == {tr.pk}
    assert waiting.reasons(task_run_ids=[tr.pk]) == got
    return got[tr.pk]


def test_a_task_run_nothing_holds_back_waits_for_a_worker(org, make_workflow):
    run_id = start(make_workflow(org, ONE))
    assert reason_of(run_id) == "waiting: for a worker"


def test_only_ready_task_runs_have_a_reason(org, make_workflow):
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    run_id = start(wf)
    got = waiting.reasons(run_id=run_id)
    assert list(got.values()) == ["waiting: for a worker"]  # b is pending: no reason
    assert waiting.reasons() == {}


def test_retry_backoff_says_how_long_is_left(org, make_workflow):
    run_id = start(make_workflow(org, ONE))
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(
        not_before=db_now() + dt.timedelta(seconds=3.15))
    assert reason_of(run_id) == "waiting: retry backoff, 3.2 s"


def test_a_concurrency_key_full_of_holders_in_the_organization(org, make_org, make_workflow):
    wf = make_workflow(org, ONE, name="charge")
    other_wf = make_workflow(org, ONE, name="refund")  # another workflow naming the same key
    set_task(wf, concurrency_key="stripe", concurrency_limit=2)
    run_id = start(wf)
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key="stripe")
    hold(other_wf, 1, key="stripe")
    foreign = make_org()
    hold(make_workflow(foreign, ONE), 3, key="stripe")  # another organization's holders never count
    assert reason_of(run_id) == "waiting: for a worker"
    hold(other_wf, 1, key="stripe", started=False)  # a claimed, not started, holder holds it too
    assert reason_of(run_id) == "waiting: concurrency stripe 2/2"


def test_a_templated_key_counts_only_its_own_value(org, make_workflow):
    wf = make_workflow(org, ONE)
    set_task(wf, concurrency_key="customer-{{ input.customer_id }}", concurrency_limit=1)
    run_id = start(wf)
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key="customer-7")
    hold(make_workflow(org, ONE, name="other"), 1, key="customer-8")
    assert reason_of(run_id) == "waiting: for a worker"
    hold(make_workflow(org, ONE, name="third"), 1, key="customer-7")
    assert reason_of(run_id) == "waiting: concurrency customer-7 1/1"


def rated_run(org, make_workflow, *, count: int, opened_ago: float):
    """A run of one task limited to 10 a minute on key github, and the key's bucket with
    ``count`` claims in a window opened ``opened_ago`` seconds ago (the database's clock)."""
    wf = make_workflow(org, ONE)
    set_task(wf, rate_key="github", rate_limit=10, rate_window_seconds=60)
    run_id = start(wf)
    bucket = RateLimitBucket.objects.create(organization=org, key="github", window_seconds=60, count=count,
                                            window_start=db_now() - dt.timedelta(seconds=opened_ago))
    return run_id, bucket


def test_a_full_rate_limit_window_names_the_bucket_and_the_next_window(org, make_workflow):
    # The bucket's window opened 15 s ago: it closes in about 45 s.
    run_id, bucket = rated_run(org, make_workflow, count=10, opened_ago=15)
    reason = reason_of(run_id)
    match = re.fullmatch(r"waiting: rate limit github 10/10 per minute, next window in (\d+\.\d) s", reason)
    assert match, reason
    assert 44.0 <= float(match.group(1)) <= 45.0
    # 9 of 10 in the window's second half: room for one.
    RateLimitBucket.objects.unscoped().update(count=9, window_start=db_now() - dt.timedelta(seconds=35))
    assert reason_of(run_id) == "waiting: for a worker"
    # A full window that has closed holds nothing back: the next claim opens a new one.
    RateLimitBucket.objects.unscoped().filter(pk=bucket.pk).update(
        count=10, window_start=db_now() - dt.timedelta(seconds=61))
    assert reason_of(run_id) == "waiting: for a worker"


def test_a_full_first_half_of_a_rate_window_names_its_cap_and_the_second_half(org, make_workflow):
    """A window's first half admits ceil(limit / 2): 5 of 10 there waits for the second half."""
    # Opened 10 s ago: the second half begins in about 20 s, the window closes in 50 s.
    run_id, bucket = rated_run(org, make_workflow, count=5, opened_ago=10)
    reason = reason_of(run_id)
    match = re.fullmatch(
        r"waiting: rate limit github 5/10 per minute, 5 in a window's first half, second half in (\d+\.\d) s", reason)
    assert match, reason
    assert 19.0 <= float(match.group(1)) <= 20.0
    RateLimitBucket.objects.unscoped().update(count=4)
    assert reason_of(run_id) == "waiting: for a worker"
    # In the second half, 5 claims leave room for 5 more.
    RateLimitBucket.objects.unscoped().filter(pk=bucket.pk).update(
        count=5, window_start=db_now() - dt.timedelta(seconds=31))
    assert reason_of(run_id) == "waiting: for a worker"


def test_a_per_second_rate_limit_says_per_second(org, make_workflow):
    wf = make_workflow(org, ONE)
    set_task(wf, rate_key="github", rate_limit=10, rate_window_seconds=1)
    run_id = start(wf)
    # Opened 0.2 s in the future by the database's clock, so still open whenever the statement runs.
    RateLimitBucket.objects.create(organization=org, key="github", window_seconds=1, count=12,
                                   window_start=db_now() + dt.timedelta(seconds=0.2))
    reason = reason_of(run_id)
    assert re.fullmatch(r"waiting: rate limit github 12/10 per second, next window in (1\.[0-2]) s", reason), reason


def test_the_workflow_task_limit_counts_every_version_of_the_name(org, make_workflow):
    v1 = make_workflow(org, ONE, name="etl")
    v2 = make_workflow(org, ONE, name="etl")
    Workflow.objects.unscoped().filter(pk=v2.pk).update(max_running_tasks=2)
    run_id = start(v2)
    hold(v1, 1)
    hold(make_workflow(org, ONE, name="unrelated"), 3)
    assert reason_of(run_id) == "waiting: for a worker"
    hold(v2, 1)
    assert reason_of(run_id) == "waiting: workflow limit 2/2 running tasks"


def test_the_organization_quota_uses_the_override_else_the_plan(org, make_workflow, settings):
    wf = make_workflow(org, ONE)
    run_id = start(wf)
    hold(make_workflow(org, ONE, name="busy"), 3)
    settings.FLOWFORGE_PLANS = {**settings.FLOWFORGE_PLANS,
                                "team": {**settings.FLOWFORGE_PLANS["team"], "max_running_task_runs": 3}}
    org.plan = "team"
    org.save(update_fields=["plan"])
    assert reason_of(run_id) == "waiting: organization quota 3/3 running"
    org.max_running_task_runs_override = 4
    org.save(update_fields=["max_running_task_runs_override"])
    assert reason_of(run_id) == "waiting: for a worker"


def test_the_organizations_share_counts_dispatched_not_started_times_weight(org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 2
    wf = make_workflow(org, ONE)
    run_id = start(wf)
    busy = make_workflow(org, ONE, name="busy")
    hold(busy, 5, started=True)  # started ones are no longer in front of anyone
    hold(busy, 1, started=False)
    assert reason_of(run_id) == "waiting: for a worker"
    hold(busy, 1, started=False)
    assert reason_of(run_id) == "waiting: organization's share of the workers (2 dispatched, not started)"
    org.weight_override = 2
    org.save(update_fields=["weight_override"])
    assert reason_of(run_id) == "waiting: for a worker"


def test_reasons_are_reported_in_the_briefs_order(org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1
    wf = make_workflow(org, ONE)
    Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_tasks=1)
    set_task(wf, concurrency_key="k", concurrency_limit=1)
    org.max_running_task_runs_override = 1
    org.save(update_fields=["max_running_task_runs_override"])
    run_id = start(wf)
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key="k")
    hold(wf, 1, started=False, key="k")  # holds the key, the workflow limit, the quota and the share
    assert reason_of(run_id) == "waiting: concurrency k 1/1"
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key=None)
    assert reason_of(run_id) == "waiting: workflow limit 1/1 running tasks"
    Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_tasks=None)
    assert reason_of(run_id) == "waiting: organization quota 1/1 running"
    org.max_running_task_runs_override = None
    org.save(update_fields=["max_running_task_runs_override"])
    assert reason_of(run_id) == "waiting: organization's share of the workers (1 dispatched, not started)"
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(
        not_before=db_now() + dt.timedelta(seconds=10))
    assert reason_of(run_id).startswith("waiting: retry backoff, ")


def test_a_queued_run_waits_for_its_workflows_run_limit(org, make_workflow):
    v1 = make_workflow(org, ONE, name="nightly")
    v2 = make_workflow(org, ONE, name="nightly")
    Workflow.objects.unscoped().filter(pk=v2.pk).update(max_running_runs=2)
    start(v1)
    start(v2)  # both running: the limit is reached across versions
    queued = start(v2)
    WorkflowRun.objects.unscoped().filter(pk=queued).update(state="pending")
    TaskRun.objects.unscoped().filter(workflow_run_id=queued).update(state="pending")
    running = start(v2)
    assert waiting.run_reasons([queued, running]) == {queued: "waiting: workflow run limit 3/2"}
    WorkflowRun.objects.unscoped().filter(pk=running).update(state="cancelled", finished_at=db_now())
    assert waiting.run_reasons([queued]) == {queued: "waiting: workflow run limit 2/2"}
    # A ready task run of a pending run (not how start_run leaves one) names the run limit too.
    TaskRun.objects.unscoped().filter(workflow_run_id=queued).update(state="ready")
    assert reason_of(queued) == "waiting: workflow run limit 2/2"


# --- waiting events ---------------------------------------------------------------------------------


def waiting_events(run_id) -> list[tuple[int, str]]:
    return [(e.seq, e.detail["reason"]) for e in
            TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id, kind="waiting").order_by("seq")]


def assert_gap_free(run_id) -> None:
    seqs = list(TaskRunEvent.objects.unscoped().filter(workflow_run_id=run_id)
                .order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert WorkflowRun.objects.unscoped().get(pk=run_id).last_event_seq == len(seqs)


def test_note_waiting_writes_one_event_per_change_and_none_when_unchanged(org, make_workflow):
    wf = make_workflow(org, ONE)
    set_task(wf, concurrency_key="stripe", concurrency_limit=1)
    run_id = start(wf)
    tr = ready_row(run_id)
    TaskRun.objects.unscoped().filter(pk=tr.pk).update(concurrency_key="stripe")
    assert waiting.note_waiting() == 0  # nothing holds it back: no event, wait_reason stays ''
    assert waiting_events(run_id) == []

    holder = hold(make_workflow(org, ONE, name="other"), 1, key="stripe")
    assert waiting.note_waiting() == 1
    assert waiting.note_waiting() == 0
    assert [r for _s, r in waiting_events(run_id)] == ["waiting: concurrency stripe 1/1"]
    tr.refresh_from_db()
    assert tr.wait_reason == "waiting: concurrency stripe 1/1"
    event = TaskRunEvent.objects.unscoped().get(workflow_run_id=run_id, kind="waiting")
    assert (event.task_run_id, event.from_state, event.to_state, event.attempt, event.fencing_token) == (
        tr.pk, "ready", "ready", 1, 0)

    # Another reason: another event.
    TaskRun.objects.unscoped().filter(pk=tr.pk).update(not_before=db_now() + dt.timedelta(seconds=30))
    assert waiting.note_waiting() == 1
    assert waiting.note_waiting() == 0  # the countdown alone is no change
    reasons = [r for _s, r in waiting_events(run_id)]
    assert len(reasons) == 2 and reasons[1].startswith("waiting: retry backoff, ")
    tr.refresh_from_db()
    assert tr.wait_reason == "waiting: retry backoff"

    # Free again: the column is cleared, no event (the claim follows).
    TaskRun.objects.unscoped().filter(pk=tr.pk).update(not_before=None)
    TaskRun.objects.unscoped().filter(pk__in=holder).update(state="succeeded", lease_expires_at=None,
                                                           finished_at=db_now())
    assert waiting.note_waiting() == 0
    tr.refresh_from_db()
    assert tr.wait_reason == ""
    assert len(waiting_events(run_id)) == 2
    assert_gap_free(run_id)


def test_note_waiting_looks_at_most_at_limit_rows_shared_between_organizations(make_org, make_workflow):
    orgs = [make_org() for _ in range(2)]
    run_ids = []
    for o in orgs:
        wf = make_workflow(o, [{"key": f"t{i}", "type": "noop"} for i in range(4)])
        Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_tasks=1)
        hold(make_workflow(o, ONE, name="wf"), 1)  # same name (a new version): the limit is reached
        run_ids.append(start(wf))
    assert waiting.note_waiting(limit=4) == 4
    # An equal share each: two of each organization's four, its first in claim order.
    assert [len(waiting_events(r)) for r in run_ids] == [2, 2]
    assert waiting.note_waiting(limit=100) == 4
    assert [len(waiting_events(r)) for r in run_ids] == [4, 4]
    assert waiting.note_waiting(limit=100) == 0
    assert set(r for run in run_ids for _s, r in waiting_events(run)) == {"waiting: workflow limit 1/1 running tasks"}


def test_the_organizations_running_count_is_made_once_per_organization_not_once_per_waiting_row(org, make_workflow):
    """The soak's finding: inlined, ``orgs`` counted the organization's running task runs
    once per waiting row; materialized, once per organization."""
    from engine.repositories.waiting import _limits_params
    from engine.sql import queries

    wf = make_workflow(org, [{"key": f"t{i}", "type": "noop"} for i in range(40)])
    run_id = start(wf)
    assert len(waiting.reasons(run_id=run_id)) == 40
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + queries["task_run_wait_reasons"],
                    {"run": run_id, "ids": [], **_limits_params()})
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "CTE orgs" in plan, plan
    # The count under orgs runs once (one organization), whatever the number of waiting rows.
    counts = re.findall(r"Aggregate \(actual rows=1 loops=(\d+)\)", plan)
    assert counts and all(int(n) == 1 for n in counts), plan


def test_a_second_thread_skips_writing_the_wait_reasons_while_one_is_at_it(db):
    from engine import scheduler

    scheduler._last_noted = 0.0
    assert scheduler._noting.acquire(blocking=False)
    try:
        assert scheduler.note_waiting_if_due() == 0
        assert scheduler._last_noted == 0.0  # it did not run (nor push the next one back)
    finally:
        scheduler._noting.release()
    scheduler.note_waiting_if_due()
    assert scheduler._last_noted > 0.0  # free again: it runs
