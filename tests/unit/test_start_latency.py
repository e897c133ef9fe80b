"""Issue 17 in process, against real PostgreSQL and Redis: a new run's roots claimed by its
start's own transaction and published after the commit (never before it, never when it
rolls back, the rest left to the scheduler when the organization has no room), and the
Redis broker whose idle consumers are woken by enqueues and acks
(``flowforge.redis_wakeup``)."""

from __future__ import annotations

import threading
import time
import uuid

import dramatiq
import pytest
from django.db import connection, transaction
from dramatiq.brokers.redis import RedisBroker

import engine.actors  # noqa: F401  (declares the engine's queues)
from engine import dispatch, relay
from engine import services as engine_services
from engine.models import OutboxMessage, TaskRun, TaskRunEvent
from engine.services import apply_definition, start_run
from engine.states import TASK_QUEUE
from flowforge import broker as ff_broker
from flowforge.redis_wakeup import WakingConsumer, WakingRedisBroker, wake_channel
from tenancy.models import Organization


@pytest.fixture
def broker():
    b = ff_broker.broker
    assert isinstance(b, WakingRedisBroker) and dramatiq.get_broker() is b
    b.flush_all()
    yield b
    b.flush_all()


def rows(run) -> dict[str, TaskRun]:
    return {tr.task.key: tr for tr in TaskRun.objects.for_organization(run.organization_id)
            .filter(workflow_run=run).select_related("task")}


def queued_task_runs(broker) -> list[str]:
    return sorted(dramatiq.Message.decode(data).args[0]
                  for data in broker.client.hgetall(f"{broker.namespace}:{TASK_QUEUE}.msgs").values())


# --- claim on start -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_start_claims_its_roots_in_its_transaction_and_publishes_them_after_the_commit(
    org, make_workflow, broker, settings
):
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"},
                             {"key": "c", "type": "noop", "depends_on": ["a", "b"]}])
    with transaction.atomic():
        run = start_run(workflow=wf, claim_roots=True)  # claims although inside a caller's transaction
        inside = rows(run)
        # Claimed in the start's transaction, not yet published: nothing reached the broker.
        assert {k: tr.state for k, tr in inside.items()} == {"a": "running", "b": "running", "c": "pending"}
        assert queued_task_runs(broker) == []
    after = rows(run)
    assert queued_task_runs(broker) == sorted(str(after[k].pk) for k in ("a", "b"))
    for key in ("a", "b"):
        assert after[key].fencing_token == 1 and after[key].lease_owner.startswith("start@")
        (row,) = OutboxMessage.objects.for_organization(org).filter(task_run=after[key])
        assert row.published_at is not None and row.publish_attempts == 1
    claimed = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="claimed")
    assert sorted(e.task_run_id for e in claimed) == sorted(after[k].pk for k in ("a", "b"))
    # The scheduler was not needed: no schedule_tick was sent.
    assert broker.client.hlen(f"{broker.namespace}:flowforge.control.msgs") == 0


@pytest.mark.django_db(transaction=True)
def test_a_start_that_rolls_back_leaves_no_claim_and_publishes_nothing(org, make_workflow, broker, settings):
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    with pytest.raises(RuntimeError), transaction.atomic():
        start_run(workflow=wf, claim_roots=True)
        assert TaskRun.objects.for_organization(org).get().state == "running"  # claimed, then rolled back
        raise RuntimeError("the caller's transaction fails after the start")
    assert TaskRun.objects.for_organization(org).count() == 0
    assert OutboxMessage.objects.for_organization(org).count() == 0
    assert queued_task_runs(broker) == []


@pytest.mark.django_db(transaction=True)
def test_runs_started_together_in_a_callers_transaction_are_claimed_together_after_its_commit(
    org, make_workflow, broker, settings
):
    """A caller starting many runs in one transaction (a cron catch-up, a script) would
    hold the claim lock to its end were each start to claim in turn: their roots stay
    ready until the commit, then this process claims them all in one claim and publishes
    them, without waiting for the scheduler's tick (which under another organization's
    burst waited 12 to 60 ms for a worker thread in make bench)."""
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    with transaction.atomic():
        started = [start_run(workflow=wf) for _ in range(3)]
        # Nothing claimed or published before the commit.
        assert [sorted(tr.state for tr in rows(r).values()) for r in started] == [["ready", "ready"]] * 3
    assert OutboxMessage.objects.for_organization(org).filter(published_at__isnull=True).count() == 0
    after = [rows(r) for r in started]
    assert all(tr.state == "running" and tr.fencing_token == 1 and tr.lease_owner.startswith("start@")
               for run_rows in after for tr in run_rows.values())
    assert queued_task_runs(broker) == sorted(str(tr.pk) for run_rows in after for tr in run_rows.values())
    # One claim for the three runs: the six 'claimed' events share its instant.
    claimed = TaskRunEvent.objects.for_organization(org).filter(kind="claimed")
    assert claimed.count() == 6 and len({e.created_at for e in claimed}) == 1
    # Nothing was left for the scheduler: no schedule_tick was sent.
    assert broker.client.hlen(f"{broker.namespace}:flowforge.control.msgs") == 0


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transactions_starts_are_not_claimed_and_the_next_commit_claims_its_own(
    org, make_workflow, broker, settings
):
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    with pytest.raises(RuntimeError), transaction.atomic():
        start_run(workflow=wf)
        raise RuntimeError("the caller's transaction fails after the start")
    assert TaskRun.objects.for_organization(org).count() == 0
    with transaction.atomic():
        run = start_run(workflow=wf)
        # A new batch: the rolled-back start's run id did not outlive its transaction.
        batch = getattr(connection, engine_services._AFTER_COMMIT_ATTR)
        assert batch.runs == [(run.pk, org.pk)]
    assert rows(run)["a"].state == "running"
    assert queued_task_runs(broker) == [str(rows(run)["a"].pk)]
    assert broker.client.hlen(f"{broker.namespace}:flowforge.control.msgs") == 0


@pytest.mark.django_db(transaction=True)
def test_roots_a_claim_after_commit_has_no_room_for_are_left_to_the_scheduler(org, make_workflow, broker, settings):
    settings.FLOWFORGE_CLAIM_ON_START = True
    Organization.objects.filter(pk=org.pk).update(max_running_task_runs_override=1)
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    with transaction.atomic():
        started = [start_run(workflow=wf) for _ in range(2)]
    assert sorted(rows(r)["a"].state for r in started) == ["ready", "running"]  # the quota is 1
    assert len(queued_task_runs(broker)) == 1
    control = [dramatiq.Message.decode(d).actor_name
               for d in broker.client.hgetall(f"{broker.namespace}:flowforge.control.msgs").values()]
    assert control == ["schedule_tick"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_callers_transaction", [False, True], ids=["own-claim", "claim-after-commit"])
def test_a_starts_claim_takes_the_organizations_higher_priority_work_before_its_roots(
    org, make_workflow, broker, settings, in_callers_transaction
):
    """A start's claim (the API's, outside any transaction; or the one right after a
    caller's commit) is the organization's fair claim: with room for one, an older ready
    run of priority 10 is claimed before the new run of priority -10, whose root stays
    ready for the scheduler (nudged). A claim of the new roots by id would let every new
    start take the place that opens ahead of the older, higher-priority work."""
    settings.FLOWFORGE_CLAIM_ON_START = True
    Organization.objects.filter(pk=org.pk).update(max_running_task_runs_override=1)
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    urgent = start_run(workflow=wf, priority=10, claim_roots=False)  # left ready, waiting for room
    assert rows(urgent)["a"].state == "ready"
    if in_callers_transaction:
        with transaction.atomic():
            low = start_run(workflow=wf, priority=-10)
    else:
        low = start_run(workflow=wf, priority=-10)
    assert rows(urgent)["a"].state == "running" and rows(urgent)["a"].lease_owner.startswith("start@")
    assert rows(low)["a"].state == "ready"
    assert queued_task_runs(broker) == [str(rows(urgent)["a"].pk)]
    # One tick nudged by the first start (claim_roots=False), one by the claim that left
    # the low run's root ready.
    control = [dramatiq.Message.decode(d).actor_name
               for d in broker.client.hgetall(f"{broker.namespace}:flowforge.control.msgs").values()]
    assert control == ["schedule_tick", "schedule_tick"]


@pytest.mark.django_db(transaction=True)
def test_a_claim_after_commit_that_fails_leaves_the_roots_to_the_scheduler(
    org, make_workflow, broker, settings, monkeypatch
):
    """The start has committed: a failing claim is logged and the scheduler nudged, and
    the caller's commit does not raise."""
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])

    def broken(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(engine_services.task_runs, "claim_ready_many", broken)
    with transaction.atomic():
        run = start_run(workflow=wf)
    assert rows(run)["a"].state == "ready"
    control = [dramatiq.Message.decode(d).actor_name
               for d in broker.client.hgetall(f"{broker.namespace}:flowforge.control.msgs").values()]
    assert control == ["schedule_tick"]


@pytest.mark.django_db(transaction=True)
def test_roots_the_organization_has_no_room_for_stay_ready_and_the_scheduler_is_nudged(
    org, make_workflow, broker, settings
):
    settings.FLOWFORGE_CLAIM_ON_START = True
    Organization.objects.filter(pk=org.pk).update(max_running_task_runs_override=1)
    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    run = start_run(workflow=wf)
    states = sorted(tr.state for tr in rows(run).values())
    assert states == ["ready", "running"]  # the quota is 1: the fair claim took one
    assert len(queued_task_runs(broker)) == 1
    # The one left ready is the scheduler's: a schedule_tick was sent.
    control = [dramatiq.Message.decode(d).actor_name
               for d in broker.client.hgetall(f"{broker.namespace}:flowforge.control.msgs").values()]
    assert control == ["schedule_tick"]


@pytest.mark.django_db(transaction=True)
def test_a_run_queued_behind_its_run_limit_claims_nothing(org, make_workflow, broker, settings):
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = apply_definition(organization=org, document={
        "name": "limited", "tasks": [{"key": "a", "type": "noop"}], "concurrency": {"max_running_runs": 1}})
    first = start_run(workflow=wf)
    second = start_run(workflow=wf)
    assert rows(first)["a"].state == "running"
    assert second.state == "pending" and rows(second)["a"].state == "pending"
    assert OutboxMessage.objects.for_organization(org).filter(workflow_run=second).count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_publish_that_fails_after_the_commit_leaves_the_rows_to_the_relay(
    org, make_workflow, broker, settings, monkeypatch
):
    settings.FLOWFORGE_CLAIM_ON_START = True
    wf = make_workflow(org, [{"key": "a", "type": "noop"}])

    def broker_down(messages, broker=None):
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(ff_broker, "enqueue_many", broker_down)
    run = start_run(workflow=wf)  # the start itself succeeds: the run is stored and claimed
    (row,) = OutboxMessage.objects.for_organization(org).filter(workflow_run=run)
    assert row.published_at is None and row.next_attempt_at is not None  # reserved, then the relay's
    monkeypatch.undo()
    OutboxMessage.objects.for_organization(org).filter(pk=row.pk).update(next_attempt_at=None)  # reservation over
    assert relay.relay_pending() == 1
    assert queued_task_runs(broker) == [str(rows(run)["a"].pk)]


def test_the_start_path_is_documented_as_the_settings_say(settings):
    """The knob exists in the deployment's settings with the default on."""
    from flowforge import settings as deployment

    assert deployment.FLOWFORGE_CLAIM_ON_START is True
    assert deployment.FLOWFORGE_BROKER_WAKEUP is True
    assert engine_services._publish_roots.__doc__ and dispatch.INLINE_PUBLISH_RESERVATION_SECONDS > 0


# --- the waking Redis broker ----------------------------------------------------------------------


def test_the_wakeup_setting_selects_upstreams_polling_broker(settings):
    settings.FLOWFORGE_BROKER_WAKEUP = False
    plain = ff_broker.build_broker()
    assert type(plain) is RedisBroker
    settings.FLOWFORGE_BROKER_WAKEUP = True
    assert type(ff_broker.build_broker()) is WakingRedisBroker


def test_an_enqueue_wakes_an_idle_consumer_before_its_poll_would(broker):
    # A queue of the test's own: no other test or process publishes on its wake channel.
    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    consumer = broker.consume(queue, prefetch=2, timeout=30_000)
    try:
        settle_wakeups(broker, consumer)  # the listener's start, when this consume() started it
        got: list = []
        fetched = threading.Event()

        def consume():
            # The first __next__ finds the queue empty and waits (up to its back-off); the
            # enqueue's notification ends the wait, and the next __next__ fetches.
            for _ in range(50):
                message = next(consumer)
                if message is not None:
                    got.append(message)
                    fetched.set()
                    return

        consumer.misses = 12  # backed off to its longest wait (15 to 30 s, the timeout's half to all)
        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while consumer.misses == 12 and time.monotonic() < deadline:
            time.sleep(0.001)
        # Its first fetch found the queue empty (a miss counted), so it waits: only a wake-up
        # ends that wait within the 10 s below.
        assert consumer.misses == 13 and not got
        # Another process's enqueue (a second broker on the same Redis and namespace).
        sender = WakingRedisBroker(url=ff_broker.settings.BROKER_URL, namespace=broker.namespace)
        sender.enqueue(dispatch.message("execute_task_run", args=("woken", 1), queue_name=queue))
        assert fetched.wait(10), "the consumer was not woken by the enqueue"
        assert got[0].args == ("woken", 1)
        thread.join(5)
    finally:
        consumer.close()
        broker.flush(queue)


def settle_wakeups(broker: WakingRedisBroker, consumer: WakingConsumer, timeout: float = 10.0) -> None:
    """Return once the broker's listener has handled every wake-up published so far, then
    clear ``consumer.wake_event``: the test goes on from a known state.

    The event is set, legitimately, by wake-ups that the listener handles after the
    consumer was registered: the notifications of the messages the test enqueued before
    (the listener, started by an earlier test, reads them a few ms later, later still
    under load) and the listener's wake-all once it has subscribed (when this test's
    consume() started it). The event keeps a set until the consumer's next wait, by
    design (a wake-up must not be lost between a fetch and the wait), so either one
    ended the consumer's first held-back wait at once.

    A fence: a wake-up published on a channel of its own, after everything else. The
    listener reads one connection, on which Redis delivers messages in the order it
    executed the PUBLISHes, and it subscribes and wakes all before it reads any: once
    it has handled the fence, it has handled every earlier wake-up (or never got them,
    if it subscribed later). The fence is published again until it arrives (one sent
    before the listener subscribed is lost); ``timeout`` only bounds a failure."""
    fence = broker.consume(f"test-fence-{uuid.uuid4().hex}")
    try:
        deadline = time.monotonic() + timeout
        while True:
            broker.notify([fence.queue_name])
            if fence.wake_event.wait(0.2):
                break
            assert time.monotonic() < deadline, "the broker's wake-up listener did not deliver the fence"
        consumer.wake_event.clear()
    finally:
        fence.close()


def test_an_ack_wakes_a_consumer_held_back_by_its_prefetch(broker):
    # A queue of the test's own: no other test or process publishes on its wake channel.
    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    for i in range(4):
        broker.enqueue(dispatch.message("execute_task_run", args=(f"m{i}", 1), queue_name=queue))
    consumer: WakingConsumer = broker.consume(queue, prefetch=3, timeout=30_000)
    try:
        settle_wakeups(broker, consumer)  # the enqueues' notifications and the listener's start
        held = [next(consumer) for _ in range(3)]
        assert all(m is not None for m in held)
        consumer.misses = 12  # its next wait would be its longest (15 to 30 s)
        got: list = []
        returned_at: list[float] = []

        def wait_held_back():
            got.append(next(consumer))
            returned_at.append(time.monotonic())

        waiting = threading.Thread(target=wait_held_back, daemon=True)
        waiting.start()
        deadline = time.monotonic() + 10
        while not consumer._held_back and waiting.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        # Held back: 3 outstanding = its prefetch, so it waits instead of fetching, and
        # nothing wakes it.
        not_held = "the consumer was woken before any ack (or never waited as held back by its prefetch)"
        assert consumer._held_back and waiting.is_alive(), not_held
        assert not consumer.wake_event.wait(0.3), not_held
        assert consumer._held_back and waiting.is_alive() and not got, not_held
        acked_at = time.monotonic()
        consumer.ack(held[0])  # a place is free: it is woken and fetches the 4th message
        waiting.join(10)  # well under its 15 to 30 s wait: only a wake-up ends it in time
        assert not waiting.is_alive(), "the held-back consumer was not woken by the ack"
        assert got == [None] and returned_at[0] >= acked_at
        assert next(consumer).args == ("m3", 1)
    finally:
        consumer.close()
        broker.flush(queue)


def test_a_message_pushed_to_the_head_is_fetched_by_a_consumer_held_back_by_its_prefetch(broker):
    """A consumer holds its whole prefetch (2 of 4 queued messages); a message pushed to the
    queue's head (the first lane) is announced as such, and the held-back consumer fetches
    it at once, one beyond its prefetch, instead of waiting for an ack. Another message's
    plain wake-up (the tail) does not let it fetch."""
    import flowforge.broker as ff_broker_mod

    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    for i in range(4):
        broker.enqueue(dispatch.message("execute_task_run", args=(f"m{i}", 1), queue_name=queue))
    consumer: WakingConsumer = broker.consume(queue, prefetch=2, timeout=30_000)
    try:
        settle_wakeups(broker, consumer)
        held = [next(consumer) for _ in range(2)]
        assert [m.args[0] for m in held] == ["m0", "m1"]
        consumer.misses = 12  # its next wait would be its longest (15 to 30 s)
        got: list = []

        def wait_held_back():
            while not got or got[-1] is None:
                got.append(next(consumer))

        waiting = threading.Thread(target=wait_held_back, daemon=True)
        waiting.start()
        deadline = time.monotonic() + 10
        while not consumer._held_back and time.monotonic() < deadline:
            time.sleep(0.001)
        assert consumer._held_back and waiting.is_alive()
        # A tail message's wake-up: still held back, nothing fetched.
        broker.enqueue(dispatch.message("execute_task_run", args=("tail", 1), queue_name=queue))
        time.sleep(0.3)
        assert [m for m in got if m is not None] == []
        # The head: fetched well within the consumer's 15 to 30 s wait, with no ack.
        head = dispatch.message("execute_task_run_first", args=("head", 1), queue_name=queue)
        assert ff_broker_mod.enqueue_many([head.copy(options={ff_broker_mod.HEAD_OPTION: True})]) == [None]
        waiting.join(10)
        assert not waiting.is_alive(), "the held-back consumer did not fetch the message pushed to the head"
        assert got[-1].args == ("head", 1)
        assert consumer.outstanding_message_count == 3  # one beyond its prefetch, until an ack
        # Never two beyond: a second head waits for an ack, then is fetched at once.
        got.clear()
        waiting = threading.Thread(target=wait_held_back, daemon=True)
        waiting.start()
        second = dispatch.message("execute_task_run_first", args=("head-2", 1), queue_name=queue)
        assert ff_broker_mod.enqueue_many([second.copy(options={ff_broker_mod.HEAD_OPTION: True})]) == [None]
        time.sleep(0.3)
        assert waiting.is_alive() and [m for m in got if m is not None] == []
        assert consumer.outstanding_message_count == 3
        consumer.ack(held[0])  # back to its prefetch: the pending head may come in
        waiting.join(10)
        assert not waiting.is_alive(), "the second head was not fetched after the ack"
        assert got[-1].args == ("head-2", 1)
    finally:
        consumer.close()
        broker.flush(queue)


def test_two_head_messages_announced_together_reach_an_idle_consumer_beyond_its_prefetch(broker):
    """Two first-lane messages pushed to the head of an empty queue, announced while the
    consumer (prefetch 1: one ordinary thread) is idle: its normal fetch takes one, and the
    other comes in one beyond the prefetch with no ack, for the process's reserved thread
    (a flag cleared by the first fetch left it in Redis until an ack: 2 s behind a 2 s task
    in tests/integration/test_scheduling.py)."""
    import flowforge.broker as ff_broker_mod

    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    consumer: WakingConsumer = broker.consume(queue, prefetch=1, timeout=30_000)
    try:
        settle_wakeups(broker, consumer)
        heads = [dispatch.message("execute_task_run_first", args=(f"head-{i}", 1), queue_name=queue)
                 .copy(options={ff_broker_mod.HEAD_OPTION: True}) for i in range(2)]
        assert ff_broker_mod.enqueue_many(heads) == [None, None]
        settle_wakeups(broker, consumer)  # both announcements counted
        assert consumer.head_pending == 2
        consumer.misses = 12  # a wait would be its longest (15 to 30 s)
        got: list = []

        def take_two():
            while len([m for m in got if m is not None]) < 2:
                got.append(next(consumer))

        taking = threading.Thread(target=take_two, daemon=True)
        taking.start()
        taking.join(10)  # no ack comes: only the count lets the second in
        assert not taking.is_alive(), "the second head message waited for an ack"
        assert sorted(m.args[0] for m in got if m is not None) == ["head-0", "head-1"]
        assert consumer.outstanding_message_count == 2 and consumer.head_pending == 0
    finally:
        consumer.close()
        broker.flush(queue)


def test_a_delay_queue_consumer_comes_back_when_a_message_it_handed_out_is_due(broker):
    """A delayed message (a scheduler nudge for a rate window's next half, 300 ms ahead)
    is held by the worker's consumer thread and enqueued only when the delay queue's
    consumer iteration comes back: the consumer's wait ends at its eta, not at the end of
    a back-off (up to the worker timeout; a review saw second halves 0.4 to 0.5 s late)."""
    from dramatiq.common import dq_name

    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    consumer: WakingConsumer = broker.consume(dq_name(queue), prefetch=10, timeout=30_000)
    try:
        settle_wakeups(broker, consumer)
        broker.enqueue(dispatch.message("execute_task_run", args=("later", 1), queue_name=queue), delay=300)
        held = None
        deadline = time.monotonic() + 10
        while held is None and time.monotonic() < deadline:
            held = next(consumer)
        assert held is not None and held.args == ("later", 1)
        eta = held.options["eta"] / 1000
        # The iteration comes back (a wake-up left from the enqueue may end one wait early:
        # the consumer thread then finds nothing due and iterates again) ...
        back = time.time()
        while back < eta - 0.01:
            consumer.misses = 12  # a wait would be its longest (15 to 30 s)
            assert next(consumer) is None
            back = time.time()
        assert back <= eta + 2.0, (back - eta)  # ... at the eta, not 15 s on
    finally:
        consumer.close()
        broker.flush(queue)


def test_enqueue_many_sends_one_wakeup_per_queue_after_its_messages(broker):
    pubsub = broker.client.pubsub()
    pubsub.subscribe(wake_channel(broker.namespace, TASK_QUEUE))
    try:
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"  # subscribed before the enqueue
        messages = [dispatch.dispatch_message([(f"t{i}", 1)], TASK_QUEUE) for i in range(5)]
        assert ff_broker.enqueue_many(messages) == [None] * 5
        notes = []
        while (item := pubsub.get_message(timeout=0.5)) is not None:
            notes.append(item["channel"])
        assert notes == [wake_channel(broker.namespace, TASK_QUEUE).encode()]
        assert len(queued_task_runs(broker)) == 5
    finally:
        pubsub.close()
