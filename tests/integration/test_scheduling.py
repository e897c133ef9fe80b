"""Issue 16's "Done when" scenarios with real PostgreSQL, Redis and Dramatiq worker
processes: fairness between organizations, concurrency limits (with a worker SIGKILLed
mid-run, and a key templated from the run input), a rate limit, priorities.

Every figure is read from the event log (``core_taskrunevent.created_at``, the database's
clock) through tests/integration/timeline.py. Speed is never asserted against a wall
clock constant: a latency is a ratio to the same latency measured idle in the same test,
a throughput a ratio to the same throughput measured alone on the same workers.

The fairness scenario runs ``FF_FAIRNESS_TASKS`` tasks of A (400 here, so the suite stays
fast; ``make fairness`` runs the issue's 2,000). Leases are 3 s, heartbeats 0.5 s, the
clock's reaper and scheduler tick every 0.5 s (tests/integration/conftest.py).
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import time

import pytest
from django.db import connection

from engine.models import TaskRun, TaskRunEvent
from engine.services import cancel_run, start_run
from flowforge.stack import wait_until
from tests.integration.conftest import LEASE_SECONDS, wait_for_run_terminal
from tests.integration.helpers import owner_pid, signal_pid, wait_worker_children
from tests.integration.timeline import (
    epoch,
    event_rows,
    holds,
    max_overlap,
    opened_windows,
    runs,
    seconds_between,
)

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.django_db(transaction=True)]

FAIRNESS_TASKS = int(os.environ.get("FF_FAIRNESS_TASKS", "400"))
TASK_SECONDS = 0.05  # the "tasks of 50 ms"
REAP_SECONDS = 0.5  # FLOWFORGE_CLOCK_REAP_SECONDS in conftest's stack_env
SCHEDULE_SECONDS = 0.5  # FLOWFORGE_CLOCK_SCHEDULE_SECONDS in conftest's stack_env


def sleep_tasks(n: int, seconds: float, prefix: str = "t", **extra) -> list[dict]:
    return [{"key": f"{prefix}{i:04d}", "type": "sleep", "config": {"seconds": seconds}, **extra} for i in range(n)]


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def events_of(run):
    return TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run_id=run.pk)


def task_runs_of(run):
    return TaskRun.objects.for_organization(run.organization_id).filter(workflow_run_id=run.pk)


def count_events(run, kind: str) -> int:
    return events_of(run).filter(kind=kind).count()


def task_states(run) -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT state, count(*) FROM core_taskrun WHERE workflow_run_id = %s GROUP BY state", [run.pk])
        return dict(cur.fetchall())


def first_start_latency(run) -> float:
    """Seconds from the run's creation (its row's created_at) to its first 'started' event."""
    started = events_of(run).filter(kind="started").order_by("created_at").first()
    assert started is not None, f"run {run.pk} has no started event"
    run.refresh_from_db(fields=["created_at"])
    return seconds_between(run.created_at, started.created_at)


def throughput(run) -> tuple[int, float, float]:
    """(succeeded tasks, seconds from the first 'claimed' to the last 'succeeded' event, tasks/s),
    as bench/live.py's engine_window measures it."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE kind = 'succeeded'), min(created_at) FILTER (WHERE kind = 'claimed'), "
            "max(created_at) FILTER (WHERE kind = 'succeeded') FROM core_taskrunevent WHERE workflow_run_id = %s",
            [run.pk],
        )
        n, first, last = cur.fetchone()
    seconds = seconds_between(first, last)
    return n, seconds, n / seconds


# --- 1. fairness between organizations ------------------------------------------------------------


@pytest.mark.timeout(600)
def test_one_organizations_burst_does_not_starve_another_and_costs_no_throughput(stack, make_org, make_workflow):
    """A starts FAIRNESS_TASKS tasks of 50 ms, then B starts one-task runs, one after another.

    - B's start latency (run created -> its task's 'started' event) under A's burst: the
      median of up to 5 samples, each taken while some of A's tasks have not started, is
      within 3x B's idle start latency (median of 5 idle samples, same workers, same test;
      issue 16's target). Each worker process has a reserved thread
      (FLOWFORGE_WORKER_RESERVED_THREADS, 1) that takes only first-lane generations and
      control actors, so B's first task does not wait for one of A's to finish; every
      sample is also at most idle + two of A's task durations (what B would wait with
      every thread busy and no reserved one);
    - A's throughput with B present is >= 0.9x A's throughput alone. "Alone" is measured
      once before and once after the A+B round and averaged, so a drift of the shared
      machine's load during the test hits both sides alike.
    """
    # A deployment's dispatch lease (300 s), not conftest's 3 s: a generation waiting its
    # turn in the broker is not a lost message, and reaping it would cost A throughput
    # for a reason this scenario does not test.
    stack.env["FLOWFORGE_DISPATCH_LEASE_SECONDS"] = "300"
    # As the bench's workers (bench/run.py): an idle consumer polls again within 100 ms
    # rather than backing off up to Dramatiq's default second, which would inflate B's
    # idle latency, the baseline of the ratio, with a polling artifact.
    stack.env["dramatiq_worker_timeout"] = "100"
    org_a, org_b = make_org("fair-a"), make_org("fair-b")
    wf_a = make_workflow(org_a, sleep_tasks(FAIRNESS_TASKS, TASK_SECONDS), name="burst")
    wf_b = make_workflow(org_b, sleep_tasks(1, TASK_SECONDS), name="one")
    threads = 4
    workers = [stack.start_worker(f"w{i}", processes=1, threads=threads) for i in (1, 2)]
    wait_worker_children(workers)
    stack.start_clock()

    def b_alone() -> float:
        run = start_run(workflow=wf_b)
        assert wait_for_run_terminal(run, timeout=30) == "succeeded"
        return first_start_latency(run)

    def a_alone() -> tuple[int, float, float]:
        run = start_run(workflow=wf_a)
        assert wait_for_run_terminal(run, timeout=300) == "succeeded"
        return throughput(run)

    b_alone()  # warm-up: first connections, first imports in each worker process
    idle = [b_alone() for _ in range(5)]
    idle_latency = statistics.median(idle)
    alone_before = a_alone()

    run_a = start_run(workflow=wf_a)
    # B starts once A's burst is in flight: every worker thread busy with A, A's backlog
    # claimed and dispatched as far as the scheduler lets it.
    wait_until(lambda: count_events(run_a, "started") >= 4 * threads, timeout=60, interval=0.01,
               what="A's burst to occupy the workers")
    runs_b = []
    for i in range(5):
        if i and count_events(run_a, "started") >= FAIRNESS_TASKS:
            break  # A's backlog has run out: a further sample would not be under load
        runs_b.append(start_run(workflow=wf_b))
        assert wait_for_run_terminal(runs_b[-1], timeout=300) == "succeeded"
    assert wait_for_run_terminal(run_a, timeout=300) == "succeeded"
    loaded = [first_start_latency(run) for run in runs_b]
    loaded_latency = statistics.median(loaded)
    with_b = throughput(run_a)
    alone_after = a_alone()

    alone_rate = (alone_before[2] + alone_after[2]) / 2
    figures = (
        f"B idle start latency {[round(x * 1000, 1) for x in idle]} ms, median {idle_latency * 1000:.1f} ms; "
        f"under A's burst {[round(x * 1000, 1) for x in loaded]} ms, median {loaded_latency * 1000:.1f} ms "
        f"(ratio {loaded_latency / idle_latency:.2f}, target <= 3; worst {max(loaded) / idle_latency:.2f}); "
        f"A alone {alone_before[2]:.1f} and {alone_after[2]:.1f} tasks/s, with B {with_b[2]:.1f} tasks/s "
        f"(ratio {with_b[2] / alone_rate:.3f}, target >= 0.9); {FAIRNESS_TASKS} tasks of {TASK_SECONDS} s, "
        f"2 worker processes x {threads} threads (+1 reserved each)"
    )
    print("\nfairness:", figures)
    # B raced A's backlog: most of A's tasks started after B's first sample did.
    b_started = events_of(runs_b[0]).get(kind="started").created_at
    a_after_b = events_of(run_a).filter(kind="started", created_at__gt=b_started).count()
    assert loaded_latency <= 3 * idle_latency, figures
    assert max(loaded) <= idle_latency + 2 * TASK_SECONDS, figures
    assert a_after_b >= FAIRNESS_TASKS // 2, f"only {a_after_b} of A's tasks started after B's: {figures}"
    assert with_b[0] == alone_before[0] == alone_after[0] == FAIRNESS_TASKS
    assert with_b[2] >= 0.9 * alone_rate, figures


def test_another_organizations_first_task_starts_on_the_reserved_thread_while_the_ordinary_ones_are_busy(
    stack, make_org, make_workflow
):
    """One worker process of 1 ordinary thread and 1 reserved one (the default). A starts
    3 tasks of 2 s: its first 2 go to the first lane (FLOWFORGE_DISPATCH_FIRST), one on
    each thread, the third waits in the bulk lane for the ordinary thread. While that one
    runs, B starts a task: it starts on the reserved thread, long before A's third ends
    (with no reserved thread it would wait the whole 2 s for the only thread)."""
    org_a, org_b = make_org("busy-a"), make_org("busy-b")
    wf_a = make_workflow(org_a, sleep_tasks(3, 2.0, "a"), name="slow")
    wf_b = make_workflow(org_b, sleep_tasks(1, 0.05, "b"), name="quick")
    wait_worker_children([stack.start_worker(processes=1, threads=1)])
    stack.start_clock()
    # A warm worker first: one still importing misses the announcements of A's first-lane
    # messages (its wake-up listener is not subscribed yet) and fetches only its prefetch.
    assert wait_for_run_terminal(start_run(workflow=wf_b), timeout=60) == "succeeded"
    run_a = start_run(workflow=wf_a)
    wait_until(lambda: count_events(run_a, "started") >= 3, timeout=60, interval=0.01,
               what="A's third task to start on the ordinary thread")
    run_b = start_run(workflow=wf_b)
    assert wait_for_run_terminal(run_b, timeout=30) == "succeeded"
    assert wait_for_run_terminal(run_a, timeout=30) == "succeeded"
    a_started = sorted(e.created_at for e in events_of(run_a) if e.kind == "started")
    a_done = sorted(e.created_at for e in events_of(run_a) if e.kind == "succeeded")
    b_started = events_of(run_b).get(kind="started").created_at
    # A's first two ran side by side (one thread each), the third after one of them.
    assert seconds_between(a_started[0], a_started[1]) < 1.0, a_started
    assert a_started[2] >= a_done[0], (a_started, a_done)
    assert a_started[2] < b_started < a_done[2], (a_started, b_started, a_done)
    assert first_start_latency(run_b) < 1.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("root_type", ["noop", "fail"])
def test_another_organizations_5000_way_fan_out_does_not_hold_up_a_chain(stack, make_org, make_workflow, root_type):
    """B's workflow: one root and 4,999 dependents (the definition limit). Its root's
    success promotes them (task_run_promote_dependents), its failure skips them
    (task_run_skip_descendants), each in one statement. A's 4-step chain of 0.3 s sleeps,
    started just after B's run, takes at most 2x its time alone (a review measured 20.98 s
    against 1.25 s: the upstream checks read the run's task runs once per dependent, and
    that statement held the worker process's batch, A's completions with it, for 20 s)."""
    org_a, org_b = make_org("chain-a"), make_org("fan-b")
    chain = [{"key": "c0", "type": "sleep", "config": {"seconds": 0.3}}] + [
        {"key": f"c{i}", "type": "sleep", "config": {"seconds": 0.3}, "depends_on": [f"c{i - 1}"]} for i in range(1, 4)]
    wf_a = make_workflow(org_a, chain, name="chain")
    root = {"key": "root", "type": root_type, **({"max_attempts": 1} if root_type == "fail" else {})}
    wf_b = make_workflow(org_b, [root] + [{"key": f"t{i:04d}", "type": "noop", "depends_on": ["root"]}
                                          for i in range(4999)], name="wide")
    # One worker process: A's completions share its batch with B's (a worker process's
    # threads share one transaction at a time for their starts and successes).
    wait_worker_children([stack.start_worker(processes=1, threads=4)])
    stack.start_clock()

    def took(run) -> float:
        assert wait_for_run_terminal(run, timeout=120) == "succeeded"
        run.refresh_from_db(fields=["created_at", "finished_at"])
        return seconds_between(run.created_at, run.finished_at)

    took(start_run(workflow=wf_a))  # warm-up: first connections and imports in each worker process
    alone = took(start_run(workflow=wf_a))
    run_b = start_run(workflow=wf_b)
    time.sleep(0.2)
    beside = took(start_run(workflow=wf_a))
    assert wait_for_run_terminal(run_b, timeout=240) == ("succeeded" if root_type == "noop" else "failed")
    settled = task_runs_of(run_b).exclude(task__key="root").filter(
        state="succeeded" if root_type == "noop" else "skipped").count()
    print(f"\nfan-out ({root_type} root): A's chain alone {alone:.2f} s, beside B's 4,999 dependents {beside:.2f} s")
    assert settled == 4999
    assert beside <= 2 * alone, (alone, beside)


# --- 2. concurrency limits ------------------------------------------------------------------------


def _limited(n: int, seconds: float, key: str, limit: int, prefix: str = "c", **extra) -> list[dict]:
    return sleep_tasks(n, seconds, prefix, concurrency={"key": key, "limit": limit}, **extra)


def test_twenty_tasks_with_limit_three_never_run_more_than_three_at_once(stack, org, make_workflow):
    wf = make_workflow(org, _limited(20, 0.3, "k", 3), name="limited")
    stack.start_worker(processes=1, threads=8)  # 8 threads: only the limit can hold tasks back
    stack.start_clock()
    run = start_run(workflow=wf)
    assert wait_for_run_terminal(run, timeout=90) == "succeeded"

    events = event_rows(run_ids=[run.pk])
    # Holding (claimed -> out of running) and executing (started -> out of running): at
    # most 3, and exactly 3 at some instant (8 free threads, 20 tasks: the limit is used).
    assert max_overlap(holds(events))[0] == 3
    assert max_overlap(runs(events))[0] == 3
    assert set(task_runs_of(run).values_list("concurrency_key", flat=True)) == {"k"}
    assert task_states(run) == {"succeeded": 20}


def test_a_key_is_shared_by_every_workflow_of_the_organization_that_names_it(stack, org, make_workflow):
    wf_x = make_workflow(org, _limited(10, 0.3, "shared", 3, prefix="x"), name="uses-shared-x")
    wf_y = make_workflow(org, _limited(10, 0.3, "shared", 3, prefix="y"), name="uses-shared-y")
    stack.start_worker(processes=1, threads=8)
    stack.start_clock()
    run_x, run_y = start_run(workflow=wf_x), start_run(workflow=wf_y)
    assert wait_for_run_terminal(run_x, timeout=90) == "succeeded"
    assert wait_for_run_terminal(run_y, timeout=90) == "succeeded"
    assert max_overlap(holds(event_rows(run_ids=[run_x.pk, run_y.pk])))[0] == 3


def test_limit_holds_when_a_worker_is_killed_mid_run_and_the_permit_comes_back_within_a_lease(
    stack, org, make_workflow
):
    """A killed attempt holds its permit until its lease_expired event (it may still be
    running somewhere, for all the engine knows), and the permit comes back then: the
    lease is at most LEASE_SECONDS old when the worker dies (renewed every heartbeat), the
    reaper runs every REAP_SECONDS, so the hold ends within LEASE + REAP (+ margin for a
    loaded machine) of the kill, and the freed permit is claimed again within the next
    scheduler tick (SCHEDULE_SECONDS + margin)."""
    lease, reap, margin = float(LEASE_SECONDS), REAP_SECONDS, 1.5
    wf = make_workflow(org, _limited(20, 1.5, "k", 3, max_attempts=3, retry_backoff_seconds=0.1), name="killed")
    w1 = stack.start_worker("w1", processes=1, threads=4)
    w2 = stack.start_worker("w2", processes=1, threads=4)
    wait_worker_children([w1, w2])
    stack.start_clock()
    run = start_run(workflow=wf)

    def three_started():
        started = [
            tr for tr in task_runs_of(run).filter(state="running")
            if tr.started_fencing_token == tr.fencing_token and (tr.lease_owner or "").startswith("worker@")
        ]
        return started if len(started) >= 3 else None

    victim = wait_until(three_started, timeout=30, interval=0.05, what="three holders to start")[0]
    killed_at = db_now()
    signal_pid(owner_pid(victim.lease_owner), signal.SIGKILL)
    assert wait_for_run_terminal(run, timeout=120) == "succeeded"

    events = event_rows(run_ids=[run.pk])
    hs = holds(events)
    assert max_overlap(hs)[0] == 3
    assert max_overlap(runs(events))[0] <= 3
    lost = [h for h in hs if h.closed_by in ("lease_expired", "dispatch_expired")]
    assert any(h.task_run_id == victim.pk and h.closed_by == "lease_expired" for h in lost), lost
    print(f"\nkill: {len(lost)} hold(s) lost; permits back {[round(seconds_between(killed_at, h.end), 2) for h in lost]} s "
          f"after the kill (bound {lease + reap + margin} s)")
    for h in lost:
        assert h.start <= killed_at, h  # only the kill loses holds
        returned = seconds_between(killed_at, h.end)
        assert returned <= lease + reap + margin, f"permit of {h} came back {returned:.2f} s after the kill"
    # The freed permits are used again: a claim follows the last lost hold's end within a tick.
    last_return = max(h.end for h in lost)
    next_claim = min((h.start for h in hs if h.start >= last_return), default=None)
    assert next_claim is not None
    print(f"kill: next claim {seconds_between(last_return, next_claim):.3f} s after the last permit came back")
    assert seconds_between(last_return, next_claim) <= SCHEDULE_SECONDS + margin
    assert task_states(run) == {"succeeded": 20}


def test_a_templated_key_limits_each_value_separately(stack, org, make_workflow):
    wf = make_workflow(org, _limited(6, 0.4, "customer-{{ input.customer_id }}", 2), name="per-customer")
    stack.start_worker(processes=1, threads=8)
    stack.start_clock()
    run_1 = start_run(workflow=wf, run_input={"customer_id": "c1"})
    run_2 = start_run(workflow=wf, run_input={"customer_id": "c2"})
    assert wait_for_run_terminal(run_1, timeout=60) == "succeeded"
    assert wait_for_run_terminal(run_2, timeout=60) == "succeeded"

    for run, key in ((run_1, "customer-c1"), (run_2, "customer-c2")):
        assert set(task_runs_of(run).values_list("concurrency_key", flat=True)) == {key}
        assert max_overlap(holds(event_rows(run_ids=[run.pk])))[0] == 2
    # Two values, two limits of 2, 8 threads: both customers run at their limit together.
    assert max_overlap(holds(event_rows(run_ids=[run_1.pk, run_2.pk])))[0] == 4


# --- 3. rate limit --------------------------------------------------------------------------------


def test_rate_limit_ten_per_second_spreads_claims_over_fixed_windows_without_holding_threads(
    stack, org, make_workflow
):
    """100 noop tasks with rate_limit {key: r, per_second: 10}.

    The bucket's windows are fixed, 1 s long, each opening at the first claim after the
    last one closed, with at most 10 claims each and at most 5 in its first half: claim i
    (from 0) comes at least 0.5 s x floor(i / 5) after the first, so the last at least
    9.5 s after it, and the run, from its start to its end, takes longer still (issue 16:
    >= 9.5 s, none early).

    No worker thread waits for the window: a waiting task is 'ready' (never claimed early),
    and a probe run of 8 sleeping tasks started mid-wait gets all 8 worker threads at once.
    """
    wf = make_workflow(org, [{"key": f"r{i:03d}", "type": "noop", "rate_limit": {"key": "r", "per_second": 10}}
                             for i in range(100)], name="rate-limited")
    probe_wf = make_workflow(org, sleep_tasks(8, 0.5, "p"), name="probe")
    wait_worker_children([stack.start_worker(processes=1, threads=8)])
    stack.start_clock()
    # A warm worker first: claims sitting in the broker while the process imports would
    # hide whether the probe finds every thread free.
    assert wait_for_run_terminal(start_run(workflow=probe_wf), timeout=60) == "succeeded"
    run = start_run(workflow=wf)

    samples: list[tuple[float, dict[str, int]]] = []
    probe = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = task_states(run)
        samples.append((epoch(db_now()), states))
        if probe is None and states.get("succeeded", 0) >= 20:
            probe = start_run(workflow=probe_wf)  # mid-wait: most of the 100 are still waiting
        run.refresh_from_db(fields=["state"])
        if run.is_terminal:
            break
        time.sleep(0.1)
    assert run.state == "succeeded"
    assert probe is not None
    assert wait_for_run_terminal(probe, timeout=30) == "succeeded"

    claims = [e.created_at for e in event_rows(run_ids=[run.pk]) if e.kind == "claimed"]
    assert len(claims) == 100
    windows = opened_windows(claims, 1.0)
    assert max(n for _, n in windows) <= 10, windows
    stamps = sorted(epoch(c) for c in claims)
    for opened, _ in windows:
        assert sum(opened <= t < opened + 0.5 for t in stamps) <= 5, (opened, windows)
    assert len(windows) >= 10
    # None early: the claim's events carry the instant its bucket counted it at, exactly.
    for i, t in enumerate(stamps):
        assert t - stamps[0] >= 0.5 * (i // 5) - 1e-6, (i, t - stamps[0])
    first, last = min(claims), max(claims)
    assert seconds_between(first, last) >= 9.5, (first, last)
    run.refresh_from_db(fields=["created_at", "finished_at"])
    took = seconds_between(run.created_at, run.finished_at)
    assert took >= seconds_between(first, last) >= 9.5, (took, first, last)
    print(f"\nrate limit: run took {took:.2f} s; first to last claim {seconds_between(first, last):.2f} s over "
          f"{len(windows)} windows, claims per window {[n for _, n in windows]}")
    # Never claimed early, as the states showed meanwhile: by a sample's time, at most 5
    # claims per half window since the first claim; the rest were 'ready'.
    for at, states in samples:
        claimed = states.get("running", 0) + states.get("succeeded", 0)
        assert claimed <= 5 * max(0, math.floor(2 * (at - epoch(first))) + 1), (at, states)
        assert claimed + states.get("ready", 0) == 100, states
    # The probe ran while rate-limited work waited, on every thread at once.
    probe_events = event_rows(run_ids=[probe.pk])
    assert max(e.created_at for e in probe_events if e.kind == "succeeded") < last
    assert max_overlap(runs(probe_events))[0] == 8


# --- 4. priorities --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["run", "task"])
def test_a_higher_priority_run_starts_before_the_remaining_backlog_of_its_organization(
    stack, org, make_workflow, where
):
    """200 tasks of priority 0 are queued first on one worker thread; then a run of
    priority 5 (set at start: ``where == "run"``; or by its tasks' definition: "task").
    Every backlog task claimed after the high run was created starts after every one of
    the high run's tasks."""
    # The backlog waits in the broker longer than conftest's 3 s dispatch lease on one
    # thread; a deployment's 300 s keeps the reaper from re-dispatching it meanwhile.
    stack.env["FLOWFORGE_DISPATCH_LEASE_SECONDS"] = "300"
    low_wf = make_workflow(org, sleep_tasks(200, TASK_SECONDS, "l"), name="backlog")
    high_tasks = sleep_tasks(3, TASK_SECONDS, "h", **({"priority": 5} if where == "task" else {}))
    high_wf = make_workflow(org, high_tasks, name="urgent")
    stack.start_worker(processes=1, threads=1)
    stack.start_clock()
    low = start_run(workflow=low_wf)
    wait_until(lambda: count_events(low, "started") >= 5, timeout=60, interval=0.02, what="the backlog to start")
    waiting = task_runs_of(low).filter(state="ready").count()
    high = start_run(workflow=high_wf, **({"priority": 5} if where == "run" else {}))
    assert wait_for_run_terminal(high, timeout=120) == "succeeded"
    high.refresh_from_db()
    assert set(task_runs_of(high).values_list("priority", flat=True)) == {5}

    high_started = max(e.created_at for e in event_rows(run_ids=[high.pk]) if e.kind == "started")
    low_events = event_rows(run_ids=[low.pk])
    claimed_after = {e.task_run_id for e in low_events if e.kind == "claimed" and e.created_at > high.created_at}
    early = [e for e in low_events if e.kind == "started" and e.task_run_id in claimed_after
             and e.created_at < high_started]
    cancel_run(run=low)
    print(f"\npriority ({where}): {waiting} backlog tasks ready when the high run started; high run's last start "
          f"{seconds_between(high.created_at, high_started):.2f} s after its creation; {len(early)} started early")
    assert early == []
    # Meaningful only if a backlog was still unclaimed when the high run came: of 200, a
    # few (5 and what ran since) started, at most FLOWFORGE_DISPATCH_AHEAD (128) were
    # claimed ahead, so at least 200 - 128 - 10 = 62 were ready.
    assert waiting >= 62, waiting
