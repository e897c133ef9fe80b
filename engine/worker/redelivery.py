"""What the engine records when a dead worker process's messages go back to their queue
(``flowforge.broker_recovery``, issue 22): a ``redelivered`` event on each generation
they carried that is still claimed and not started, so the run page shows which
generations waited for a dead process and how long, and the wait in
``flowforge_redelivery_wait_seconds``."""

from __future__ import annotations

import logging
import uuid

import dramatiq

from engine import metrics
from engine.repositories import events
from engine.repositories.driver import autocommit_retry

log = logging.getLogger(__name__)

#: The execute actors and how their arguments carry generations (engine.actors).
_SINGLE = ("execute_task_run", "execute_task_run_first")
_MANY = "execute_task_runs"


def generations_of(messages: list[dramatiq.Message]) -> list[tuple[uuid.UUID, int]]:
    """The (task run id, fencing token) generations the execute messages among
    ``messages`` carry; other actors' messages, and malformed arguments, carry none."""
    out: list[tuple[uuid.UUID, int]] = []
    for message in messages:
        try:
            if message.actor_name in _SINGLE:
                out.append((uuid.UUID(str(message.args[0])), int(message.args[1])))
            elif message.actor_name == _MANY:
                out.extend((uuid.UUID(str(tr)), int(token)) for tr, token in message.args[0])
        except (IndexError, TypeError, ValueError):
            log.warning("message %s of %s: arguments carry no generation", message.message_id, message.actor_name)
    return out


def record_redelivered(messages: list[dramatiq.Message], *, consumer: str) -> int:
    """Record the generations of ``messages`` (given back after worker process
    ``consumer`` died) that are still waiting for their start: a ``redelivered`` event
    each and their waits since the claim. Returns how many were recorded. Raises database
    errors (after retrying a deadlock or a lost connection)."""
    generations = generations_of(messages)
    if not generations:
        return 0
    written = autocommit_retry(lambda: events.append_redelivered(generations, consumer=consumer),
                               connection_attempts=3)
    for _task_run_id, waited in written:
        if waited is not None:
            metrics.observe("flowforge_redelivery_wait_seconds", waited)
    return len(written)
