"""Acks written behind (``flowforge.redis_wakeup.AckWriter``), against real Redis: an ack
returns before it reaches the broker, every queued ack is sent, a connection that fails
keeps them queued until it is back, a script the server lost is loaded again, and a
consumer's close sends what is still queued."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import engine.actors  # noqa: F401  (declares the engine's queues)
from engine import dispatch
from engine.states import TASK_QUEUE
from flowforge import broker as ff_broker
from flowforge.redis_wakeup import AckWriter, WakingConsumer, WakingRedisBroker


@pytest.fixture
def own_broker():
    """A broker of this test's own (its own ack writer and broker id) on the test
    namespace; its queue is removed afterwards."""
    b = WakingRedisBroker(url=ff_broker.settings.BROKER_URL, namespace=ff_broker.broker.namespace)
    yield b
    b.close()


def dead_client() -> redis.Redis:
    """A client of a port nothing listens on, that does not retry (each try fails at once)."""
    return redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))


def fill(broker: WakingRedisBroker, queue: str, n: int) -> None:
    for i in range(n):
        broker.enqueue(dispatch.message("execute_task_run", args=(f"m{i}", 1), queue_name=queue))


def take(consumer: WakingConsumer, n: int) -> list:
    got = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        message = next(consumer)
        if message is not None:
            got.append(message)
    assert len(got) == n, f"fetched {len(got)} of {n} messages"
    return got


@contextlib.contextmanager
def fetched(broker: WakingRedisBroker, n: int):
    """``n`` messages enqueued on a queue of the test's own and fetched by a consumer of it
    (prefetch ``n``): yields (queue, consumer, messages); afterwards the consumer is closed
    and the queue removed."""
    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    fill(broker, queue, n)
    consumer = broker.consume(queue, prefetch=n, timeout=100)
    try:
        yield queue, consumer, take(consumer, n)
    finally:
        consumer.close()
        broker.flush(queue)


def unacked(broker: WakingRedisBroker, queue: str, client: redis.Redis | None = None) -> set[str]:
    """The message ids in this broker's ack set of ``queue`` (fetched, not acked), read
    with ``client`` (default the broker's)."""
    key = f"{broker.namespace}:__acks__.{broker.broker_id}.{queue}"
    return {m.decode() for m in (client or broker.client).smembers(key)}


def stored(broker: WakingRedisBroker, queue: str) -> int:
    return broker.client.hlen(f"{broker.namespace}:{queue}.msgs")


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_acks_from_many_threads_are_all_sent_and_free_the_prefetch_at_once(own_broker):
    with fetched(own_broker, 40) as (queue, consumer, messages):
        assert len(unacked(own_broker, queue)) == 40
        threads = [threading.Thread(target=lambda part=messages[i::8]: [consumer.ack(m) for m in part])
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        # Room for the next fetch as soon as ack returns, sent or not.
        assert consumer.outstanding_message_count == 0
        own_broker.acks.flush()
        assert own_broker.acks.pending() == 0
        assert unacked(own_broker, queue) == set()
        assert stored(own_broker, queue) == 0  # the acked messages' bodies are gone too


def test_acks_wait_out_a_lost_connection_and_are_sent_once_it_is_back(own_broker, caplog):
    client = own_broker.client
    with fetched(own_broker, 3) as (queue, consumer, messages):
        try:
            ids = {m.options["redis_message_id"] for m in messages}
            own_broker.client = dead_client()
            for m in messages:
                consumer.ack(m)  # returns: the ack waits in the writer, not in this thread
            time.sleep(3 * AckWriter.RETRY_SECONDS)
            assert own_broker.acks.pending() == 3
            with pytest.raises(redis.ConnectionError):
                own_broker.acks.flush()
            assert own_broker.acks.pending() == 3  # a failed flush loses none of them
            assert unacked(own_broker, queue, client) == ids
            assert "could not send 3 acks" in caplog.text
            own_broker.client = client  # the broker is back: the writer's next try sends them
            assert wait_for(lambda: own_broker.acks.pending() == 0 and not unacked(own_broker, queue))
            assert stored(own_broker, queue) == 0
        finally:
            own_broker.client = client


def test_acks_refused_for_a_script_the_server_lost_are_sent_once_it_is_loaded_again(own_broker):
    script = own_broker.scripts["dispatch"]
    real_sha = script.sha
    with fetched(own_broker, 2) as (queue, consumer, messages):
        try:
            # As after a server restart: the sha the broker holds names no script the server has.
            script.sha = "0" * 40
            for m in messages:
                consumer.ack(m)
            own_broker.acks.flush()
            assert wait_for(lambda: not unacked(own_broker, queue))
            assert stored(own_broker, queue) == 0
            assert script.sha == real_sha
        finally:
            script.sha = real_sha


def test_a_turn_that_fails_unexpectedly_puts_its_acks_back_and_a_later_turn_sends_them(own_broker, monkeypatch):
    writer = own_broker.acks
    real_send = writer._send
    calls = []

    def fails_once(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("not a broker error")
        return real_send(batch)

    monkeypatch.setattr(writer, "_send", fails_once)
    with fetched(own_broker, 3) as (queue, consumer, messages):
        for m in messages:
            consumer.ack(m)
        assert wait_for(lambda: writer.pending() == 0 and not unacked(own_broker, queue))
        assert calls[0] >= 1 and sum(calls[1:]) == 3  # every ack of the failed turn was sent later
        assert writer._thread.is_alive()  # the writer survived the failure
        assert stored(own_broker, queue) == 0


def test_a_consumers_close_sends_the_acks_still_queued(own_broker):
    queue = f"{TASK_QUEUE}.test-{uuid.uuid4().hex}"
    fill(own_broker, queue, 2)
    consumer = own_broker.consume(queue, prefetch=2, timeout=100)
    client = own_broker.client
    try:
        messages = take(consumer, 2)
        own_broker.client = dead_client()
        for m in messages:
            consumer.ack(m)
        time.sleep(2 * AckWriter.RETRY_SECONDS)
        assert own_broker.acks.pending() == 2 and len(unacked(own_broker, queue, client)) == 2
        own_broker.client = client
        consumer.close()  # sends them itself, whether or not the writer's next try came first
        assert own_broker.acks.pending() == 0
        assert unacked(own_broker, queue) == set() and stored(own_broker, queue) == 0
    finally:
        own_broker.client = client
        own_broker.flush(queue)
