"""Every reference from the worker up to the modules above it, in one place.

TO BE REPLACED BY ``engine.dispatch`` (issue 15): that module will own sending messages
by actor name, TASK_QUEUE, ``process_owner`` and ``publish_dispatches``. After merging,
this file becomes a re-export of it (or its importers import ``engine.dispatch``
directly) and the imports inside the functions below go.

No other module of ``engine.worker`` imports ``engine.actors``, ``engine.relay``,
``engine.scheduler`` or ``flowforge.broker``.

- ``process_owner``, ``publish_dispatches`` (engine.scheduler) and
  ``INLINE_PUBLISH_RESERVATION_SECONDS`` (engine.relay) were imported at module level by
  the old ``engine.runtime`` (no cycle): re-exported as they are, so the hot path calls
  the same function objects, with no added call.
- ``send_retry_tick`` and ``send_execute_messages`` import ``engine.actors``,
  ``engine.relay.dispatch_message``, TASK_QUEUE and ``flowforge.broker.enqueue_many``
  inside the function, as the old module did, because ``engine.actors`` imports this
  package's ``execute`` (a cycle at import time otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.relay import INLINE_PUBLISH_RESERVATION_SECONDS
from engine.scheduler import process_owner, publish_dispatches

__all__ = ["INLINE_PUBLISH_RESERVATION_SECONDS", "process_owner", "publish_dispatches", "send_execute_messages",
           "send_retry_tick"]


def send_retry_tick(*, delay_ms: int) -> None:
    """Send a ``schedule_tick`` message delivered after ``delay_ms`` milliseconds (when a
    failed attempt's retry becomes due)."""
    from engine.actors import schedule_tick

    schedule_tick.send_with_options(delay=delay_ms)


def send_execute_messages(pairs: Sequence[tuple[str, int]]) -> list[BaseException | None]:
    """Send each (task_run_id, fencing_token) as its own ``execute_task_run`` message, in
    one broker round trip; returns, per pair, None or the error the broker refused it with."""
    from engine.relay import dispatch_message
    from engine.repositories.types import TASK_QUEUE
    from flowforge.broker import enqueue_many

    return enqueue_many([dispatch_message([pair], TASK_QUEUE) for pair in pairs])
