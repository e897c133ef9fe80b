"""The fair claim (``task_run_claim_fair`` through ``task_runs.claim_ready_many`` and a
worker batch's claim), against real PostgreSQL: weighted round robin between
organizations, priorities within one, each organization's room (claimed-not-started under
FLOWFORGE_DISPATCH_AHEAD x weight, running under its quota), concurrency permits held by
running task runs and given back by every way out of running, workflow task limits, and
fixed-window rate buckets (issue 16; seed 001's semaphores and rate buckets).

Expected counts are worked out by hand in each test's comments.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from django.db import connection, transaction

from engine.models import RateLimitBucket, Task, TaskRun, Workflow
from engine.repositories import runs, task_runs
from engine.repositories.types import StartRequest, SuccessRequest
from tenancy.models import Organization
from tests import engine_helpers

LEASE = 60.0


def start(wf, priority: int = 0) -> uuid.UUID:
    with transaction.atomic():
        run_id = runs.create_with_task_runs(
            workflow_id=wf.pk, organization_id=wf.organization_id, run_input={}, trigger_source="cli")
    if priority:
        TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(priority=priority)
    return run_id


def claim(limit: int = 500, **kw):
    return task_runs.claim_ready_many(limit=limit, lease_seconds=LEASE, owner="test", **kw)


def start_all(dispatches):
    """Start the claimed generations (a worker's start, without its batch's claim)."""
    return engine_helpers.start_attempts(
        [StartRequest(d.task_run_id, d.fencing_token, "w") for d in dispatches], lease_seconds=LEASE)


def succeed(dispatches, *, claim_after: bool = True):
    """Succeed started generations as one worker batch: returns what its claim took."""
    _results, claimed = engine_helpers.complete_successes(
        [SuccessRequest(d.task_run_id, d.fencing_token, None) for d in dispatches],
        lease_seconds=LEASE, owner="w", claim=claim_after)
    return claimed


def clear_cache(cache) -> None:
    """Delete this suite's cache entries (its key prefix, the broker namespace), not the
    whole Redis db as ``cache.clear()`` would: another suite may share the db under its
    own namespace (scripts/run-suite's live part)."""
    client = cache._cache.get_client(write=True)
    keys = list(client.scan_iter(match=cache.make_key("*")))
    if keys:
        client.delete(*keys)


def wide(make_workflow, org, n: int, name: str = "wide", **task_fields):
    wf = make_workflow(org, [{"key": f"t{i:04d}", "type": "noop"} for i in range(n)], name=name)
    if task_fields:
        Task.objects.unscoped().filter(workflow=wf).update(**task_fields)
    return wf


def limits(org, *, weight=None, max_running=None):
    Organization.objects.filter(pk=org.pk).update(weight_override=weight, max_running_task_runs_override=max_running)


def by_org(dispatches):
    counts: dict = {}
    for d in dispatches:
        counts[d.organization_id] = counts.get(d.organization_id, 0) + 1
    return counts


@pytest.mark.django_db
def test_one_organizations_backlog_does_not_push_another_out_of_a_batch(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a, b = make_org(), make_org()
    limits(a, max_running=10_000)
    start(wide(make_workflow, a, 300))
    start(wide(make_workflow, b, 1))
    # Round robin with equal weights: A's 1st, B's 1st, A's 2nd ... : B's one task is in a
    # batch of 10 although A's 300 were ready first.
    got = claim(limit=10)
    assert by_org(got) == {a.pk: 9, b.pk: 1}


@pytest.mark.django_db
def test_weights_share_a_batch_in_proportion(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a, b = make_org(), make_org()
    limits(a, weight=3, max_running=10_000)
    limits(b, weight=1, max_running=10_000)
    start(wide(make_workflow, a, 100))
    start(wide(make_workflow, b, 100))
    # A's n-th pick sorts at n/3, B's at n/1: of 40, A gets 30 (1/3 .. 30/3 = 10) and B 10.
    got = claim(limit=40)
    assert by_org(got) == {a.pk: 30, b.pk: 10}


@pytest.mark.django_db
def test_an_organization_alone_gets_every_slot(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    limits(a, max_running=10_000)
    start(wide(make_workflow, a, 120))
    assert len(claim(limit=200)) == 120


@pytest.mark.django_db
def test_claimed_not_started_stays_under_dispatch_ahead_times_weight(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 8
    a = make_org()
    limits(a, weight=2, max_running=1000)
    start(wide(make_workflow, a, 100))
    first = claim()
    assert len(first) == 16  # 8 x weight 2
    assert claim() == []  # 16 in the broker: no room
    start_all(first[:5])
    # Five left the broker: five more fit (and only five).
    assert len(claim()) == 5
    assert claim() == []


@pytest.mark.django_db
def test_a_worker_batch_refills_its_organizations_room(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 4
    a = make_org()
    start(wide(make_workflow, a, 20))
    first = claim()
    assert len(first) == 4
    # Starting three as a worker does (its batch claims for the organization after them).
    _started, _results, refill = task_runs.start_and_complete_many(
        starts=[StartRequest(d.task_run_id, d.fencing_token, "w") for d in first[:3]], successes=(),
        worker_lease_seconds=LEASE, dispatch_lease_seconds=LEASE, owner="w")
    assert len(refill) == 3


@pytest.mark.django_db
def test_the_running_quota_holds_claimed_and_started_task_runs(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    limits(a, max_running=5)
    start(wide(make_workflow, a, 30))
    first = claim()
    assert len(first) == 5
    start_all(first)
    assert claim() == []  # 5 running (started): the quota is full
    # Two succeed: their batch's claim takes exactly two more.
    assert len(succeed(first[:2])) == 2
    assert claim() == []


@pytest.mark.django_db
def test_higher_priority_first_within_an_organization(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 5
    a = make_org()
    limits(a, max_running=1000)
    low = start(wide(make_workflow, a, 20, name="low"))
    high = start(wide(make_workflow, a, 3, name="high"), priority=5)
    got = claim()
    # Room for 5: the three priority-5 task runs (started later) first, then the two oldest.
    assert [d.workflow_run_id for d in got[:3]] == [high] * 3
    assert [d.workflow_run_id for d in got[3:]] == [low] * 2


@pytest.mark.django_db
def test_a_concurrency_key_admits_its_limit_and_does_not_block_the_rows_behind_it(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    limits(a, max_running=1000)
    keyed = wide(make_workflow, a, 10, name="keyed", concurrency_key="stripe", concurrency_limit=3)
    keyed_run = start(keyed)
    TaskRun.objects.unscoped().filter(workflow_run_id=keyed_run).update(concurrency_key="stripe")
    free_run = start(wide(make_workflow, a, 4, name="free"))
    got = claim()
    # 3 of the 10 keyed (the limit), and all 4 behind them.
    assert sum(d.workflow_run_id == keyed_run for d in got) == 3
    assert sum(d.workflow_run_id == free_run for d in got) == 4
    assert claim() == []
    held = [d for d in got if d.workflow_run_id == keyed_run]
    start_all(held)
    # One permit comes back with a success (and its batch's claim takes exactly one), ...
    assert [d.workflow_run_id for d in succeed(held[:1])] == [keyed_run]
    assert claim() == []


@pytest.mark.django_db
def test_a_permit_comes_back_when_the_reaper_takes_an_expired_lease(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    keyed = wide(make_workflow, a, 6, name="keyed", concurrency_key="k", concurrency_limit=2, max_attempts=3)
    Task.objects.unscoped().filter(workflow=keyed).update(retry_backoff_seconds=0)
    run_id = start(keyed)
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key="k")
    got = claim()
    assert len(got) == 2
    start_all(got)
    # The worker holding got[0] dies: its lease runs out and the reaper takes it back.
    TaskRun.objects.unscoped().filter(pk=got[0].task_run_id).update(
        lease_expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5))
    assert claim() == []  # still held until reaped
    with transaction.atomic():
        assert task_runs.expire_lease(task_run_id=got[0].task_run_id, fencing_token=got[0].fencing_token).accepted
    again = claim()
    assert len(again) == 1  # the permit it held, and only that one


@pytest.mark.django_db
def test_keys_are_per_value(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    wf = wide(make_workflow, a, 4, name="per", concurrency_key="customer", concurrency_limit=1)
    r1, r2 = start(wf), start(wf)
    TaskRun.objects.unscoped().filter(workflow_run_id=r1).update(concurrency_key="customer-1")
    TaskRun.objects.unscoped().filter(workflow_run_id=r2).update(concurrency_key="customer-2")
    got = claim()
    # One per value.
    assert sorted(str(d.workflow_run_id) for d in got) == sorted([str(r1), str(r2)])


@pytest.mark.django_db
def test_a_workflow_task_limit_counts_every_version_of_the_name(make_org, make_workflow, settings):
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    v1 = wide(make_workflow, a, 5, name="etl")
    v2 = wide(make_workflow, a, 5, name="etl")
    Workflow.objects.unscoped().filter(pk__in=[v1.pk, v2.pk]).update(max_running_tasks=3)
    start(v1)
    start(v2)
    assert len(claim()) == 3


@pytest.mark.django_db
@pytest.mark.parametrize(("limit", "first_half"), [(10, 5), (3, 2), (1, 1)])
def test_a_rate_bucket_admits_half_its_limit_in_a_windows_first_half_and_its_limit_in_the_window(
    make_org, make_workflow, settings, limit, first_half
):
    """A window opens at the first claim after the last one closed; its first half admits
    ceil(limit / 2), the whole window limit (task_run_claim_fair's rate gate)."""
    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    a = make_org()
    limits(a, max_running=1000)
    wf = wide(make_workflow, a, 25, name="rated", rate_key="github", rate_limit=limit, rate_window_seconds=1)
    start(wf)
    assert len(claim()) == first_half  # the first claim opens a 1 s window, in its first half
    assert claim() == []  # the first half is full
    (bucket,) = RateLimitBucket.objects.unscoped().filter(organization=a, key="github")
    assert (bucket.count, bucket.window_seconds) == (first_half, 1)
    opened = bucket.window_start
    # 0.6 s into the window (the database's clock decides): its second half admits the rest.
    RateLimitBucket.objects.unscoped().filter(pk=bucket.pk).update(
        window_start=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=0.6))
    assert len(claim()) == limit - first_half
    assert claim() == []  # the window holds limit
    bucket.refresh_from_db()
    assert bucket.count == limit
    # Once the window closed, the next claim opens a new one, in its first half again.
    RateLimitBucket.objects.unscoped().filter(pk=bucket.pk).update(
        window_start=opened - dt.timedelta(seconds=1.5))
    assert len(claim()) == first_half
    assert claim() == []
    bucket.refresh_from_db()
    assert bucket.count == first_half and bucket.window_start > opened - dt.timedelta(seconds=1.5)


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_a_key_or_the_room(make_org, make_workflow, settings):
    """Two claimers at once (threads, own connections): the claim lock makes the counts exact."""
    import threading

    settings.FLOWFORGE_DISPATCH_AHEAD = 7
    a = make_org()
    limits(a, max_running=1000)
    keyed = wide(make_workflow, a, 40, name="keyed", concurrency_key="k", concurrency_limit=3)
    run_id = start(keyed)
    TaskRun.objects.unscoped().filter(workflow_run_id=run_id).update(concurrency_key="k")
    start(wide(make_workflow, a, 40, name="free"))
    got: list = []
    barrier = threading.Barrier(4)

    def claimer():
        try:
            barrier.wait()
            for _ in range(5):
                got.extend(claim(limit=2))
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Room 7 (nothing started), of which at most 3 keyed.
    assert len(got) == 7
    assert sum(d.workflow_run_id == run_id for d in got) <= 3
    assert TaskRun.objects.unscoped().filter(organization=a, state="running", concurrency_key="k").count() <= 3


@pytest.mark.django_db
def test_housekeeping_prunes_buckets_of_past_windows_only(org):
    from django.utils import timezone

    from engine.services import purge_old_rate_limit_buckets

    now = timezone.now()
    old = RateLimitBucket.objects.create(organization=org, key="idle", window_seconds=60,
                                         window_start=now - dt.timedelta(minutes=5), count=4)
    current = RateLimitBucket.objects.create(organization=org, key="g", window_seconds=60,
                                             window_start=now - dt.timedelta(seconds=30), count=2)
    assert purge_old_rate_limit_buckets() == 1
    assert list(RateLimitBucket.objects.unscoped().values_list("pk", flat=True)) == [current.pk]
    assert not RateLimitBucket.objects.unscoped().filter(pk=old.pk).exists()


def delayed_ticks():
    """The schedule_tick messages waiting in the control queue's delay queue (the real broker)."""
    import dramatiq

    import engine.actors  # noqa: F401  (declares the control queue)
    from flowforge.broker import broker

    raw = broker.client.hgetall(f"{broker.namespace}:flowforge.control.DQ.msgs")
    return [m for m in map(dramatiq.Message.decode, raw.values()) if m.actor_name == "schedule_tick"]


@pytest.mark.django_db
def test_any_claim_into_a_rate_window_schedules_the_claim_at_its_next_half(make_org, make_workflow, settings):
    """Not the scheduler's passes alone: a start's own claim, a worker's completion or
    refill that claims into a rate window publishes its generations with
    ``relay.publish_dispatches``, which sends the tick for the window's second half (else
    that half waited for the clock's next tick: a review saw it claimed 0.4 to 1.1 s late)."""
    from django.core.cache import cache

    from engine import relay
    from flowforge.broker import broker

    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    broker.flush_all()
    clear_cache(cache)
    a = make_org()
    limits(a, max_running=1000)
    rated = wide(make_workflow, a, 15, name="rated", rate_key="gh", rate_limit=10, rate_window_seconds=60)
    plain = wide(make_workflow, a, 2, name="plain")
    start(plain)
    unrated = claim()
    assert len(unrated) == 2 and not any(d.rate_limited for d in unrated)
    try:
        assert relay.publish_dispatches(unrated) is True
        assert delayed_ticks() == []  # nothing rated: no lookup, no tick
        start(rated)
        dispatches = claim()
        assert len(dispatches) == 5 and all(d.rate_limited for d in dispatches)
        assert relay.publish_dispatches(dispatches) is True
        (tick,) = delayed_ticks()
    finally:
        broker.flush_all()
    # Due when the 60 s window's first half ends, about 30 s from now.
    assert 28.0 < tick.options["eta"] / 1000 - time.time() <= 30.5


@pytest.mark.django_db
def test_a_full_window_with_ready_work_behind_it_schedules_one_claim_at_its_next_half(org, make_workflow, settings):
    """The scheduler sends one delayed schedule_tick (to the real broker) for the instant the
    window's first half ends (or, in its second half, the window closes), however many
    times it runs before then."""
    from django.core.cache import cache

    from engine import scheduler
    from flowforge.broker import broker

    settings.FLOWFORGE_DISPATCH_AHEAD = 1000
    broker.flush_all()
    clear_cache(cache)
    wf = wide(make_workflow, org, 15, name="rated", rate_key="gh", rate_limit=10, rate_window_seconds=60)
    start(wf)
    assert scheduler.nudge_at_next_rate_window() is None  # no window open yet
    assert len(claim()) == 5  # opens a 60 s window, whose first half admits 5; 10 wait
    try:
        first = scheduler.nudge_at_next_rate_window()
        again = scheduler.nudge_at_next_rate_window()  # the same instant: not twice
        (tick,) = delayed_ticks()
    finally:
        broker.flush_all()
    assert first is not None and 28.0 < first <= 30.0
    assert again is None
    # Due when the first half ends (eta in epoch milliseconds), give or take the test's run time.
    assert abs(tick.options["eta"] / 1000 - (time.time() + first)) < 2.0
    # 31 s into the window (the database's clock): the next instant is the window's close.
    RateLimitBucket.objects.unscoped().update(window_start=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=31))
    try:
        at_close = scheduler.nudge_at_next_rate_window()
        (tick,) = delayed_ticks()
    finally:
        broker.flush_all()
    assert at_close is not None and 27.0 < at_close <= 29.0
    assert abs(tick.options["eta"] / 1000 - (time.time() + at_close)) < 2.0


@pytest.mark.django_db
def test_a_start_reports_the_seconds_since_its_generations_claim(make_org, make_workflow):
    """StartedAttempt.dispatch_latency_seconds (the flowforge_dispatch_latency_seconds
    metric): from the claim, whose outbox row holds its instant, to the start, in both
    start statements; None for a generation without an outbox row (a worker queue's)."""
    from engine.models import OutboxMessage

    org = make_org()
    start(wide(make_workflow, org, 3))
    first, second, third = sorted(claim(), key=lambda d: str(d.task_run_id))
    time.sleep(0.3)
    (a,) = start_all([first])  # task_run_start_many
    assert 0.3 <= a.dispatch_latency_seconds < 2.3
    time.sleep(0.2)
    # task_run_start_and_succeed_many: first's success and second's start in one statement.
    started, results, _claimed = task_runs.start_and_complete_many(
        starts=[StartRequest(second.task_run_id, second.fencing_token, "w")],
        successes=[SuccessRequest(first.task_run_id, first.fencing_token, None)],
        worker_lease_seconds=LEASE, dispatch_lease_seconds=LEASE, owner="w", claim=False)
    assert results[0].accepted
    assert 0.5 <= started[0].dispatch_latency_seconds < 2.5
    OutboxMessage.objects.unscoped().filter(task_run_id=third.task_run_id).delete()
    (c,) = start_all([third])
    assert c is not None and c.dispatch_latency_seconds is None
