"""Dramatiq broker wiring, chosen by ``settings.BROKER_URL``.

``redis://`` (the default) selects the Redis broker; ``amqp://`` selects RabbitMQ
with publisher confirms (``confirm_delivery=True``), so ``enqueue`` returning means
the broker has the message.

Importing this module builds nothing: ``setup()`` builds the broker and makes it
Dramatiq's global one. The engine app's ``ready()`` calls it, so every process that
sets Django up (web, clock, ``manage.py``, tests, and the worker through
``flowforge.worker``) has the configured broker before it declares an actor or
sends a message.
"""

from __future__ import annotations

import importlib
import logging
import os
import uuid
from collections.abc import Sequence

import dramatiq
from django.conf import settings
from dramatiq.common import current_millis
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, ShutdownNotifications, TimeLimit

from flowforge.dramatiq_middleware import DjangoConnectionMiddleware, LogContextMiddleware, WorkQueueLanes


def build_broker(url: str | None = None, *, namespace: str | None = None) -> dramatiq.Broker:
    """Return a broker for ``url`` (default ``settings.BROKER_URL``).

    Raises ValueError naming the URL when its scheme is neither redis(s) nor amqp(s).
    """
    url = url or settings.BROKER_URL
    namespace = namespace or settings.BROKER_NAMESPACE
    middleware = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(max_retries=3, min_backoff=200, max_backoff=5_000),
        DjangoConnectionMiddleware(),
        LogContextMiddleware(),
        # A worker process's work queue with its reserved threads for first-lane and control
        # messages; engine.worker.execute.execute_many yields a several-generation message's
        # thread to a more urgent fetched message (flowforge.dramatiq_middleware).
        WorkQueueLanes(),
    ]
    # Extra middleware by dotted path (fault injection in tests/faults uses this).
    for dotted in filter(None, os.environ.get("FLOWFORGE_BROKER_MIDDLEWARE", "").split(",")):
        module_name, _, attr = dotted.strip().rpartition(".")
        middleware.append(getattr(importlib.import_module(module_name), attr)())
    if url.startswith(("redis://", "rediss://", "unix://")):
        from dramatiq.brokers.redis import RedisBroker

        from flowforge.redis_wakeup import WakingRedisBroker

        # Upstream's Redis broker whose idle consumers are woken by enqueues and acks
        # instead of waiting for their next poll (flowforge.redis_wakeup), unless
        # FLOWFORGE_BROKER_WAKEUP is off.
        cls = WakingRedisBroker if getattr(settings, "FLOWFORGE_BROKER_WAKEUP", True) else RedisBroker
        from flowforge.broker_recovery import ConsumerHeartbeat

        # A worker process beats every FLOWFORGE_BROKER_HEARTBEAT_SECONDS and gives back
        # the messages of processes silent for FLOWFORGE_BROKER_DEAD_AFTER_SECONDS
        # (flowforge.broker_recovery; upstream waits 60 s, then for a random maintenance).
        return cls(url=url, namespace=namespace, middleware=[*middleware, ConsumerHeartbeat()],
                   heartbeat_timeout=int(settings.FLOWFORGE_BROKER_DEAD_AFTER_SECONDS * 1000))
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, confirm_delivery=True, middleware=middleware)
    raise ValueError(f"BROKER_URL {url!r}: expected a redis:// or amqp:// URL")


#: A message option: enqueue this message at the head of its queue, not the tail (Redis;
#: other brokers enqueue it at the tail). The scheduler's first lane (engine.states).
HEAD_OPTION = "flowforge_head"

# Dramatiq's Redis "enqueue" (dramatiq/brokers/redis/dispatch.lua: HSET the message into
# "<namespace>:<queue>.msgs", RPUSH its id onto "<namespace>:<queue>"), at the head: the
# consumers' fetch pops ids from the head, so this message is fetched next.
_ENQUEUE_AT_HEAD = """
redis.call("hset", KEYS[2], ARGV[1], ARGV[2])
redis.call("lpush", KEYS[1], ARGV[1])
return 1
"""


def enqueue_many(messages: Sequence[dramatiq.Message], broker: dramatiq.Broker | None = None) -> list[Exception | None]:
    """Enqueue ``messages``; returns, in order, None for each message the broker accepted
    and the exception for each it did not. A message whose options hold HEAD_OPTION goes to
    the head of its queue on Redis (fetched before every message already waiting there;
    several of one call in the order given), to the tail on other brokers.

    On Redis the whole batch is one pipelined round trip of the same ``enqueue`` script
    ``RedisBroker.enqueue`` runs per message (a result per message, so one refused
    message does not hide the others), followed by one wake-up per queue
    (``flowforge.redis_wakeup``). Other brokers enqueue one by one (RabbitMQ
    confirms each).
    """
    broker = broker or get_broker()
    if not messages:
        return []
    from dramatiq.brokers.redis import RedisBroker

    if not isinstance(broker, RedisBroker):
        results: list[Exception | None] = []
        for message in messages:
            try:
                broker.enqueue(message)
                results.append(None)
            except Exception as exc:  # reported per message, like the Redis path
                results.append(exc)
        return results
    dispatch = broker.scripts["dispatch"]
    head = broker.client.register_script(_ENQUEUE_AT_HEAD)
    pipe = broker.client.pipeline(transaction=False)
    out: list[Exception | None] = [None] * len(messages)
    prepared: list[tuple[int, dramatiq.Message]] = []
    # Head messages are pushed last one first, so that they are fetched in the order given
    # (each LPUSH goes in front of the one before it).
    order = [i for i, m in enumerate(messages) if not m.options.get(HEAD_OPTION)]
    order += [i for i, m in reversed(list(enumerate(messages))) if m.options.get(HEAD_OPTION)]
    for i in order:
        message = messages[i]
        message = message.copy(options={"redis_message_id": str(uuid.uuid4())})
        try:
            broker.emit_before("enqueue", message, None)
        except Exception as exc:  # a middleware refused it, as broker.enqueue would raise
            out[i] = exc
            continue
        if message.options.get(HEAD_OPTION):
            queue_key = f"{broker.namespace}:{message.queue_name}"
            head(keys=[queue_key, f"{queue_key}.msgs"], args=[message.options["redis_message_id"], message.encode()],
                 client=pipe)
        else:
            dispatch(
                keys=[broker.namespace],
                args=["enqueue", current_millis(), message.queue_name, broker.broker_id, broker.heartbeat_timeout,
                      broker.dead_message_ttl, 0, broker._max_unpack_size(),
                      message.options["redis_message_id"], message.encode()],
                client=pipe,
            )
        prepared.append((i, message))
    if not prepared:
        return out
    from flowforge.redis_wakeup import WakingRedisBroker

    if isinstance(broker, WakingRedisBroker):  # one wake-up per queue, after its messages
        broker.notify([m.queue_name for _i, m in prepared], pipeline=pipe,
                      head=[m.queue_name for _i, m in prepared if m.options.get(HEAD_OPTION)])
    try:
        replies = pipe.execute(raise_on_error=False)[: len(prepared)]
    except Exception as exc:  # the connection failed: nothing is known to be accepted
        for i, _message in prepared:
            out[i] = exc
        return out
    for (i, message), reply in zip(prepared, replies, strict=True):
        if isinstance(reply, Exception):
            out[i] = reply
            continue
        try:
            broker.emit_after("enqueue", message, None)
        except Exception:  # accepted all the same; an after-hook cannot take that back
            logging.getLogger(__name__).exception("after_enqueue middleware failed")
    return out


# The broker ``setup()`` built; None before it ran.
broker: dramatiq.Broker | None = None


def setup() -> dramatiq.Broker:
    """Build the broker from the settings and make it Dramatiq's global broker, once per
    process; later calls return the same broker. Returns it.

    Raises ValueError (from ``build_broker``) for a BROKER_URL of an unknown scheme.
    """
    global broker
    if broker is None:
        broker = build_broker()
        dramatiq.set_broker(broker)
    return broker


def get_broker() -> dramatiq.Broker:
    """The broker ``setup()`` built. Raises RuntimeError before ``setup()`` ran, rather
    than letting Dramatiq make a default broker of its own (a Redis on localhost)."""
    if broker is None:
        raise RuntimeError("the broker is not set up: call flowforge.broker.setup() (the engine app's ready() does)")
    return broker
