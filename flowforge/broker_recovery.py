"""Recovery of the messages a dead worker process held (issue 22; Redis brokers).

A Dramatiq worker process fetches messages ahead of its threads (its prefetch); on
Redis each fetched, unacknowledged message id sits in the process's ack set
(``<ns>:__acks__.<broker id>.<queue>``) until it is acked. When the process is
SIGKILLed those messages are gone from every queue: upstream's broker gives them back
only in its random "maintenance" (one command in a thousand), and only once the
process's heartbeat (``<ns>:__heartbeats__``, written by every broker command it sends)
is older than ``heartbeat_timeout`` (60 s by default). Measured: 88 s after a pool
was killed, and generations whose messages were never redelivered waited for their
300 s dispatch lease.

Here, with upstream's own script and layout:

- a worker process's broker is built with ``heartbeat_timeout`` =
  ``FLOWFORGE_BROKER_DEAD_AFTER_SECONDS`` (``flowforge.broker.build_broker``);
- ``ConsumerHeartbeat`` (a Dramatiq middleware) runs a thread in every worker process
  that, every ``FLOWFORGE_BROKER_HEARTBEAT_SECONDS``, sends one command per queue the
  process consumes with upstream's maintenance forced on (``reclaim_dead``). That
  command is the process's heartbeat (a live process is never taken for dead, even
  when its threads are all busy and its consumers send nothing), and the maintenance
  puts every message of a process whose heartbeat is older than the timeout back on
  its queue.

So a dead process's messages are back within DEAD_AFTER + HEARTBEAT seconds of its
death, as soon as any worker process of the deployment is alive (a restarted pool
reclaims at its first beat). A redelivered message whose generation already started is
refused by the start's fencing check (``task_run_start_many``: at most one start per
generation); a started generation of the dead process is retried when its worker lease
expires (the reaper). The dispatch lease (FLOWFORGE_DISPATCH_LEASE_SECONDS) stays the
last safety net, for a message lost any other way.
"""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.message import Message

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


def dead_consumers(broker: RedisBroker) -> list[str]:
    """Broker ids whose last heartbeat is older than the broker's ``heartbeat_timeout``
    (read only; the same rule as upstream's maintenance)."""
    cutoff = _now_ms() - int(broker.heartbeat_timeout)
    ids = broker.client.zrangebyscore(f"{broker.namespace}:__heartbeats__", 0, cutoff)
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


def held_by(broker: RedisBroker, consumer_ids: list[str], queue_names: list[str]) -> dict[str, list[Message]]:
    """The messages each of ``consumer_ids`` fetched from ``queue_names`` and did not
    acknowledge (its ack sets; read only, two pipelined round trips), decoded; a message
    whose body is gone (acked meanwhile) is left out."""
    if not consumer_ids:
        return {}
    pairs = [(c, q) for c in consumer_ids for q in queue_names]
    pipe = broker.client.pipeline(transaction=False)
    for consumer_id, queue_name in pairs:
        pipe.smembers(f"{broker.namespace}:__acks__.{consumer_id}.{queue_name}")
    members = pipe.execute()
    wanted = [(c, q, sorted(ids)) for (c, q), ids in zip(pairs, members, strict=True) if ids]
    for _c, queue_name, ids in wanted:
        pipe.hmget(f"{broker.namespace}:{queue_name}.msgs", ids)
    out: dict[str, list[Message]] = {}
    for (consumer_id, _q, _ids), bodies in zip(wanted, pipe.execute() if wanted else [], strict=True):
        for body in bodies:
            if body is None:
                continue
            try:
                out.setdefault(consumer_id, []).append(Message.decode(body))
            except Exception:  # noqa: BLE001 - a body this code cannot read is still given back
                log.warning("an unreadable message of dead worker process %s", consumer_id)
    return out


def reclaim_dead(broker: RedisBroker, queue_names: list[str]) -> dict[str, list[Message]]:
    """For each queue of ``queue_names``: one command of upstream's dispatch script
    (``qsize``) with its maintenance on, which also refreshes this process's heartbeat.
    The maintenance moves the unacknowledged messages of every dead consumer (heartbeat
    older than ``broker.heartbeat_timeout`` ms) of that queue back onto it. Returns what
    was given back, per dead consumer's broker id (read from its ack sets just before; the
    usual case, nobody dead, costs one ZRANGEBYSCORE more). Raises redis errors."""
    held = held_by(broker, dead_consumers(broker), queue_names)
    dispatch = broker.scripts["dispatch"]
    for queue_name in queue_names:
        # dispatch.lua's arguments: command, timestamp, queue name, this process's broker
        # id, heartbeat timeout, dead message ttl, do_maintenance, max unpack size.
        dispatch(keys=[broker.namespace], args=[
            "qsize", _now_ms(), queue_name, broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, 1, broker._max_unpack_size(),
        ])
    if held:
        log.warning("gave %d message(s) of %d dead worker process(es) back to their queues",
                    sum(len(m) for m in held.values()), len(held))
    return held


class ConsumerHeartbeat(dramatiq.Middleware):
    """In a worker process on a Redis broker: a thread that calls ``reclaim_dead`` for
    the process's queues (and their delay queues) every ``interval_seconds`` (module
    docstring). Counts the messages given back in
    ``flowforge_broker_messages_reclaimed_total`` and records the generations they carried
    (``engine.worker.redelivery``: a ``redelivered`` event each). No-op on other brokers."""

    def __init__(self, interval_seconds: float | None = None):
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker, worker):
        if not isinstance(broker, RedisBroker):
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, args=(broker,), name="flowforge-broker-heartbeat",
                                        daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker, worker):
        self._stop.set()

    def _interval_seconds(self) -> float:
        if self._interval is not None:
            return self._interval
        from django.conf import settings

        return settings.FLOWFORGE_BROKER_HEARTBEAT_SECONDS

    @staticmethod
    def _record(consumer_id: str, messages: list[Message]) -> None:
        """Count what was given back, and record the generations it carried on their runs
        (``engine.worker.redelivery``); a failure is logged: the messages are back anyway."""
        from engine import metrics
        from engine.worker.redelivery import record_redelivered

        metrics.incr("flowforge_broker_messages_reclaimed_total", "dead_worker", amount=len(messages))
        try:
            record_redelivered(messages, consumer=consumer_id)
        except Exception:  # noqa: BLE001 - the record is informational
            log.warning("could not record the redelivered generations of %s", consumer_id, exc_info=True)

    def _beat(self, broker: RedisBroker) -> None:
        while True:
            try:
                queues = sorted(broker.get_declared_queues() | broker.get_declared_delay_queues())
                for consumer_id, messages in reclaim_dead(broker, queues).items():
                    self._record(consumer_id, messages)
            except Exception:  # noqa: BLE001 - Redis away: the next beat tries again
                log.warning("broker heartbeat failed", exc_info=True)
            if self._stop.wait(self._interval_seconds()):
                return
