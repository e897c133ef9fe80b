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
  that, every ``FLOWFORGE_BROKER_HEARTBEAT_SECONDS``, runs one script
  (``reclaim_dead``): it writes the process's heartbeat (a live process is never taken
  for dead, even when its threads are all busy and its consumers send nothing) and
  atomically puts every message of a process whose heartbeat is older than the timeout
  back on its queue, as upstream's maintenance would.

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


# One atomic step (a Lua script: no other client runs in between), so that of several
# live processes beating at once exactly one gives back, and reports, each dead
# consumer's messages. It reads like upstream's maintenance (dispatch.lua: the same keys,
# a message goes back with RPUSH only if its body is still stored) without its KEYS scan
# of the whole keyspace: a dead process's heartbeat entry is removed once its ack sets of
# the queues given are empty (processes that acknowledged everything, a web or clock
# process's enqueue-only entries, are removed at the first beat after they went silent).
#   KEYS[1] namespace; ARGV: now (ms), heartbeat timeout (ms), this process's broker id,
#   then the queue names. Returns a flat list: dead broker id, message body, ...
_RECLAIM_LUA = """
local ns = KEYS[1]
local now = tonumber(ARGV[1])
local heartbeats = ns .. ":__heartbeats__"
redis.call("zadd", heartbeats, now, ARGV[3])
local dead = redis.call("zrangebyscore", heartbeats, 0, now - tonumber(ARGV[2]))
local out = {}
for _, worker in ipairs(dead) do
    for i = 4, #ARGV do
        local queue = ns .. ":" .. ARGV[i]
        local acks = ns .. ":__acks__." .. worker .. "." .. ARGV[i]
        for _, id in ipairs(redis.call("smembers", acks)) do
            local body = redis.call("hget", queue .. ".msgs", id)
            if body then
                redis.call("rpush", queue, id)
                out[#out + 1] = worker
                out[#out + 1] = body
            end
        end
        redis.call("del", acks)
    end
    redis.call("zrem", heartbeats, worker)
end
return out
"""


def dead_consumers(broker: RedisBroker) -> list[str]:
    """Broker ids whose last heartbeat is older than the broker's ``heartbeat_timeout``
    (read only; the same rule as upstream's maintenance)."""
    cutoff = _now_ms() - int(broker.heartbeat_timeout)
    ids = broker.client.zrangebyscore(f"{broker.namespace}:__heartbeats__", 0, cutoff)
    return [i.decode() if isinstance(i, bytes) else i for i in ids]


def reclaim_dead(broker: RedisBroker, queue_names: list[str]) -> dict[str, list[Message]]:
    """Beat for this process and give back, in one atomic script (``_RECLAIM_LUA``), the
    fetched and unacknowledged messages of ``queue_names`` of every consumer whose
    heartbeat is older than ``broker.heartbeat_timeout`` ms, to the tail of their queues.
    Returns them, decoded, per dead consumer's broker id (a body this code cannot decode
    is given back all the same, and left out). One round trip; raises redis errors."""
    script = getattr(broker, "_flowforge_reclaim", None)
    if script is None:
        script = broker._flowforge_reclaim = broker.client.register_script(_RECLAIM_LUA)
    flat = script(keys=[broker.namespace],
                  args=[_now_ms(), int(broker.heartbeat_timeout), broker.broker_id, *queue_names])
    out: dict[str, list[Message]] = {}
    for consumer, body in zip(flat[::2], flat[1::2], strict=True):
        consumer_id = consumer.decode() if isinstance(consumer, bytes) else consumer
        try:
            out.setdefault(consumer_id, []).append(Message.decode(body))
        except Exception:  # noqa: BLE001 - given back all the same; only not reported
            out.setdefault(consumer_id, [])
            log.warning("gave back an unreadable message of dead worker process %s", consumer_id)
    if out:
        log.warning("gave %d message(s) of %d dead worker process(es) back to their queues",
                    sum(len(m) for m in out.values()), len(out))
    return out


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

    def after_worker_shutdown(self, broker, worker):
        # After the worker stopped (its running tasks finished, its prefetched messages
        # requeued): a slow graceful shutdown keeps beating, so no peer takes it for dead
        # and delivers its messages again while it still works on them.
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
