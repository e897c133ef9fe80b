"""Messages out, by actor name: the one place the engine builds and sends Dramatiq messages.

Nothing below ``engine.actors`` imports it: a message names its actor (a string) and the
queue the actor is declared on (``ACTOR_QUEUES``), exactly as Dramatiq's own
``Actor.send`` builds it, and goes to the broker ``flowforge.broker.setup()`` built.
``engine.actors`` declares each actor on the queue named here, and
tests/unit/test_dispatch_names.py checks that the two agree.

Below the services, the relay and everything above them; above the repositories. It
imports only the vocabulary (``engine.states``) and the broker (``flowforge.broker``).

Also here, because the scheduler, the relay, the reaper and the worker all need them
and none of those may import another's layer: the lease owner string
(``process_owner``) and how long a claimer's own publish keeps its outbox rows
(``INLINE_PUBLISH_RESERVATION_SECONDS``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

import dramatiq

import flowforge.broker
from engine.states import CONTROL_QUEUE, NOTIFY_QUEUE, TASK_FIRST_QUEUE, TASK_QUEUE

#: Each actor's name -> the queue ``engine.actors`` declares it on.
ACTOR_QUEUES: dict[str, str] = {
    "schedule_tick": CONTROL_QUEUE,
    "relay_outbox": CONTROL_QUEUE,
    "reap_leases": CONTROL_QUEUE,
    "fire_triggers": CONTROL_QUEUE,
    "advance_backfills": CONTROL_QUEUE,
    "sweep_runs": CONTROL_QUEUE,
    "housekeeping": CONTROL_QUEUE,
    "execute_task_run": TASK_QUEUE,
    "execute_task_run_first": TASK_QUEUE,
    "execute_task_runs": TASK_QUEUE,
    "notify_tick": CONTROL_QUEUE,
    "deliver_notification": NOTIFY_QUEUE,
}

# How long a claimer's own publish has the outbox rows of its claim to itself, in
# seconds (see engine.relay.publish_claimed): the relay's drain skips them until then.
INLINE_PUBLISH_RESERVATION_SECONDS = 5.0

_HOSTNAME = socket.gethostname()


def process_owner(role: str) -> str:
    """A lease owner string, ``role@host:pid``, recorded on a claimed row (``lease_owner``)
    and in its events: ``scheduler`` for the scheduler's claims, ``worker`` for the
    dependents a worker's completion claims, ``reaper`` for a reaper's retries, ``start``
    for a new run's roots claimed by the process that started it."""
    return f"{role}@{_HOSTNAME}:{os.getpid()}"


def message(actor_name: str, *, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            queue_name: str | None = None) -> dramatiq.Message:
    """A message for the actor named ``actor_name`` on its queue (``ACTOR_QUEUES``, or
    ``queue_name`` when given), as ``Actor.message`` would build it. Raises KeyError for
    an actor name that is not the engine's and no ``queue_name`` is given."""
    return dramatiq.Message(
        queue_name=queue_name or ACTOR_QUEUES[actor_name],
        actor_name=actor_name,
        args=tuple(args),
        kwargs=kwargs or {},
        options={},
    )


def send(actor_name: str, *, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
         delay_ms: int | None = None) -> dramatiq.Message:
    """Enqueue a message for the actor named ``actor_name`` (after ``delay_ms``
    milliseconds when given), as ``Actor.send_with_options`` does. Returns the message
    the broker took; raises what the broker raises when it refuses it, and RuntimeError
    before ``flowforge.broker.setup()`` ran."""
    return flowforge.broker.get_broker().enqueue(message(actor_name, args=args, kwargs=kwargs), delay=delay_ms)


def enqueue_many(messages: Sequence[dramatiq.Message]) -> list[Exception | None]:
    """``flowforge.broker.enqueue_many``: None per message the broker took, the exception
    per message it refused, in order (one pipelined round trip on Redis). Looked up at
    each call, so a test that replaces it on ``flowforge.broker`` reaches every sender."""
    return flowforge.broker.enqueue_many(messages)


def dispatch_message(pairs: Sequence[tuple[str, int]], queue_name: str = TASK_QUEUE) -> dramatiq.Message:
    """One execute message for (task_run_id, fencing_token) generations on ``queue_name``
    (an outbox row's ``routing_key``): ``execute_task_run(task_run_id, fencing_token)``
    for one, ``execute_task_runs([[task_run_id, fencing_token], ...])`` (run in that
    order by one worker thread) for more; on the first lane (TASK_FIRST_QUEUE),
    ``execute_task_run_first`` for exactly one, on TASK_QUEUE, marked to be enqueued at its
    head (``flowforge.broker.HEAD_OPTION``), whose actor's priority puts it before the
    bulk messages a worker has already fetched too. Raises ValueError for several pairs on the first
    lane (its messages are never grouped)."""
    if queue_name == TASK_FIRST_QUEUE:
        if len(pairs) != 1:
            raise ValueError(f"a first-lane message carries one generation, not {len(pairs)}")
        first = message("execute_task_run_first", args=tuple(pairs[0]), queue_name=TASK_QUEUE)
        return first.copy(options={flowforge.broker.HEAD_OPTION: True})
    if len(pairs) == 1:
        return message("execute_task_run", args=tuple(pairs[0]), queue_name=queue_name)
    return message("execute_task_runs", args=([list(p) for p in pairs],), queue_name=queue_name)


def nudge_scheduler(*, delay_ms: int | None = None) -> None:
    """Send ``schedule_tick`` (after ``delay_ms`` when given), so ready work is claimed now
    rather than at the clock's next tick. Raises what the broker raises; callers that can
    leave the work to the clock catch and log it."""
    send("schedule_tick", delay_ms=delay_ms)


__all__ = [
    "ACTOR_QUEUES",
    "INLINE_PUBLISH_RESERVATION_SECONDS",
    "dispatch_message",
    "enqueue_many",
    "message",
    "nudge_scheduler",
    "process_owner",
    "send",
]
