"""A dead worker process's fetched, unacknowledged messages go back to their queue within
FLOWFORGE_BROKER_DEAD_AFTER_SECONDS (flowforge.broker_recovery, issue 22), on real Redis
with upstream Dramatiq's own script; a live process's are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from django.conf import settings
from dramatiq import Message

from flowforge.broker import build_broker
from flowforge.broker_recovery import ConsumerHeartbeat, dead_consumers, reclaim_dead


@pytest.fixture
def namespace():
    ns = f"{settings.BROKER_NAMESPACE}-recovery-{uuid.uuid4().hex[:8]}"
    yield ns
    client = build_broker(namespace=ns).client
    keys = list(client.scan_iter(match=f"{ns}:*"))
    if keys:
        client.delete(*keys)


def _message(i: int) -> Message:
    return Message(queue_name="q", actor_name="noop", args=(i,), kwargs={}, options={})


def test_a_dead_processs_unacked_messages_go_back_and_a_live_ones_stay(namespace):
    dead, live, rescuer = (build_broker(namespace=namespace) for _ in range(3))
    for broker in (dead, live, rescuer):
        broker.declare_queue("q")
    for i in range(6):
        rescuer.enqueue(_message(i))
    assert len(dead.do_fetch("q", 3)) == 3  # prefetched by the process about to die
    assert len(live.do_fetch("q", 2)) == 2
    client = rescuer.client
    heartbeats = f"{namespace}:__heartbeats__"
    # The dead process's last beat: just past the timeout.
    client.zadd(heartbeats, {dead.broker_id: int(time.time() * 1000) - dead.heartbeat_timeout - 1000})
    assert dead_consumers(rescuer) == [dead.broker_id]

    given_back = reclaim_dead(rescuer, ["q"])
    assert list(given_back) == [dead.broker_id]
    assert sorted(m.args[0] for m in given_back[dead.broker_id]) == [0, 1, 2]
    assert client.llen(f"{namespace}:q") == 1 + 3  # the one never fetched, and the dead one's three
    assert client.scard(f"{namespace}:__acks__.{dead.broker_id}.q") == 0
    assert client.scard(f"{namespace}:__acks__.{live.broker_id}.q") == 2
    assert client.zscore(heartbeats, dead.broker_id) is None  # nothing left of it
    assert client.zscore(heartbeats, rescuer.broker_id) is not None  # the call was the rescuer's beat
    # A second pass finds nothing more to give back.
    assert reclaim_dead(rescuer, ["q"]) == {}


def test_of_several_processes_beating_at_once_exactly_one_gives_back_and_reports(namespace):
    import threading

    dead = build_broker(namespace=namespace)
    rescuers = [build_broker(namespace=namespace) for _ in range(4)]
    dead.declare_queue("q")
    for i in range(3):
        dead.enqueue(_message(i))
    assert len(dead.do_fetch("q", 3)) == 3
    client = dead.client
    client.zadd(f"{namespace}:__heartbeats__", {dead.broker_id: int(time.time() * 1000) - dead.heartbeat_timeout - 1000})
    barrier = threading.Barrier(len(rescuers))
    reports: list[dict] = []

    def beat(broker):
        barrier.wait()
        reports.append(reclaim_dead(broker, ["q"]))

    threads = [threading.Thread(target=beat, args=(b,)) for b in rescuers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    reported = [m.args[0] for r in reports for msgs in r.values() for m in msgs]
    assert sorted(reported) == [0, 1, 2]  # once each, whoever won
    assert client.llen(f"{namespace}:q") == 3


def test_a_silent_process_that_held_nothing_leaves_the_heartbeats_at_the_next_beat(namespace):
    web, worker_broker = build_broker(namespace=namespace), build_broker(namespace=namespace)
    web.declare_queue("q")
    web.enqueue(_message(1))  # an enqueue-only process (web, clock) beats too
    heartbeats = f"{namespace}:__heartbeats__"
    client = web.client
    client.zadd(heartbeats, {web.broker_id: int(time.time() * 1000) - web.heartbeat_timeout - 1000})
    assert reclaim_dead(worker_broker, ["q"]) == {}
    assert client.zscore(heartbeats, web.broker_id) is None
    assert client.llen(f"{namespace}:q") == 1  # its message stays where it was, once


def test_the_worker_brokers_timeout_is_the_dead_after_setting():
    broker = build_broker()
    assert broker.heartbeat_timeout == int(settings.FLOWFORGE_BROKER_DEAD_AFTER_SECONDS * 1000)
    assert any(isinstance(m, ConsumerHeartbeat) for m in broker.middleware)


def test_the_heartbeat_thread_beats_and_reclaims_until_shutdown(namespace):
    dead, worker_broker = build_broker(namespace=namespace), build_broker(namespace=namespace)
    for broker in (dead, worker_broker):
        broker.declare_queue("q")
    dead.enqueue(_message(1))
    assert len(dead.do_fetch("q", 1)) == 1
    client = worker_broker.client
    heartbeats = f"{namespace}:__heartbeats__"
    client.zadd(heartbeats, {dead.broker_id: int(time.time() * 1000) - dead.heartbeat_timeout - 1000})

    beat = ConsumerHeartbeat(interval_seconds=0.05)
    beat.after_worker_boot(worker_broker, None)
    beat.before_worker_shutdown(worker_broker, None)  # still beating while the worker stops
    try:
        deadline = time.monotonic() + 5
        while client.llen(f"{namespace}:q") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.llen(f"{namespace}:q") == 1
        first = client.zscore(heartbeats, worker_broker.broker_id)
        time.sleep(0.2)
        assert client.zscore(heartbeats, worker_broker.broker_id) > first  # still beating
    finally:
        beat.after_worker_shutdown(worker_broker, None)
    beat._thread.join(2)
    assert not beat._thread.is_alive()


def test_a_dead_after_shorter_than_three_beats_is_refused():
    env = {"FLOWFORGE_BROKER_HEARTBEAT_SECONDS": "5", "FLOWFORGE_BROKER_DEAD_AFTER_SECONDS": "10"}
    out = subprocess.run([sys.executable, "-c", "import flowforge.settings"], capture_output=True, text=True,
                         env={**os.environ, **env})
    assert out.returncode != 0
    assert "FLOWFORGE_BROKER_DEAD_AFTER_SECONDS (10) must be at least 3 x FLOWFORGE_BROKER_HEARTBEAT_SECONDS (5)" \
        in out.stderr


@pytest.mark.django_db
def test_redelivered_generations_still_waiting_get_an_event_with_their_wait(org, make_workflow):
    from engine.models import TaskRun, TaskRunEvent
    from engine.repositories import types
    from engine.scheduler import schedule_once
    from engine.services import start_run
    from engine.worker.batching import Start, record_batch
    from engine.worker.redelivery import record_redelivered

    wf = make_workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}], name="two")
    run = start_run(workflow=wf)
    assert schedule_once() == 2
    a, b = (TaskRun.objects.for_organization(org).get(workflow_run=run, task__key=k) for k in ("a", "b"))
    assert record_batch([Start(types.StartRequest(b.pk, b.fencing_token, "w"))])[0] is not None  # b started
    messages = [
        Message(queue_name="flowforge.tasks", actor_name="execute_task_run", args=(str(a.pk), a.fencing_token),
                kwargs={}, options={}),
        Message(queue_name="flowforge.tasks", actor_name="execute_task_runs",
                args=([[str(b.pk), b.fencing_token], [str(a.pk), a.fencing_token + 1]],), kwargs={}, options={}),
        Message(queue_name="flowforge.control", actor_name="schedule_tick", args=(), kwargs={}, options={}),
    ]
    # a: still waiting for its start; b: started; a's next token: no such generation.
    assert record_redelivered(messages, consumer="dead-broker-id") == 1
    event = TaskRunEvent.objects.for_organization(org).get(workflow_run=run, kind="redelivered")
    assert (event.task_run_id, event.fencing_token, event.detail["consumer"]) == (a.pk, a.fencing_token,
                                                                                  "dead-broker-id")
    assert 0 <= event.detail["waited_seconds"] < 60
    seqs = list(TaskRunEvent.objects.for_organization(org).filter(workflow_run=run).order_by("seq")
                .values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # numbered in the run's history, no gap
