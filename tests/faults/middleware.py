"""Broker middleware that injects faults, loaded through FLOWFORGE_BROKER_MIDDLEWARE."""

from __future__ import annotations

import uuid

from dramatiq.middleware import Middleware


class DuplicateDelivery(Middleware):
    """Deliver every execute message twice: after each enqueue, enqueue a copy with a
    new message id (the copy is marked so it is not copied again)."""

    def after_enqueue(self, broker, message, delay):
        if (message.actor_name not in ("execute_task_run", "execute_task_run_first", "execute_task_runs")
                or message.options.get("ff_duplicate")):
            return
        copy = message.copy(message_id=str(uuid.uuid4()), options={**message.options, "ff_duplicate": True})
        broker.enqueue(copy, delay=delay)


class KillBeforeExecuteEnqueue(Middleware):
    """Kill this process (``os._exit``, as a SIGKILL would: no cleanup, no later hook)
    the first time it is about to enqueue an execute message: a web process that
    committed a start (and its roots' claim) and dies before publishing them."""

    def before_enqueue(self, broker, message, delay):
        if message.actor_name in ("execute_task_run", "execute_task_run_first", "execute_task_runs"):
            import os

            os._exit(137)
