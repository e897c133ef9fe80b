"""Dramatiq middleware shared by every actor."""

from __future__ import annotations

import threading

from django import db
from dramatiq.middleware import Middleware

from flowforge import logs


class DjangoConnectionMiddleware(Middleware):
    """Drop unusable or expired database connections around each message.

    A worker thread keeps its Django connection between messages; after a
    PostgreSQL restart that connection is dead, and ``close_old_connections`` (with
    ``CONN_HEALTH_CHECKS``) replaces it instead of failing every later message.
    """

    def before_process_message(self, broker, message):
        db.close_old_connections()

    def after_process_message(self, broker, message, *, result=None, exception=None):
        db.close_old_connections()

    def after_skip_message(self, broker, message):
        db.close_old_connections()

    def before_worker_thread_shutdown(self, broker, thread):
        db.connection.close()


class LogContextMiddleware(Middleware):
    """Bind the task run and generation of an execute message to the thread's log lines
    (flowforge.logs), and reset them when the message is done."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before_process_message(self, broker, message):
        self._local.token = None
        if message.actor_name in ("execute_task_run", "execute_task_run_first") and len(message.args) >= 2:
            ctx_fields = {"task_run_id": message.args[0], "fencing_token": message.args[1]}
            self._local.token = logs._fields.set({**logs._fields.get(), **{k: str(v) for k, v in ctx_fields.items()}})

    def _reset(self):
        token = getattr(self._local, "token", None)
        if token is not None:
            logs._fields.reset(token)
            self._local.token = None

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self._reset()

    def after_skip_message(self, broker, message):
        self._reset()


class WorkQueueProbe(Middleware):
    """Keeps a reference to this worker process's work queue (Dramatiq's priority queue of
    fetched messages waiting for a thread), so ``urgent_message_waiting`` can look at it."""

    def before_worker_boot(self, broker, worker):
        global _work_queue
        _work_queue = worker.work_queue


_work_queue = None


def urgent_message_waiting(below_priority: int) -> bool:
    """True when this worker process has fetched a message of Dramatiq priority lower
    (more urgent) than ``below_priority`` that waits for a free thread; False otherwise,
    and outside a worker process (no work queue).

    Reads the head of the priority queue's heap without its lock: a racy peek, which can
    only be stale by the item a thread takes meanwhile (the caller then yields for a
    message another thread took, which costs a hand-off, never correctness)."""
    queue = _work_queue
    if queue is None:
        return False
    try:
        head = queue.queue[0]
    except IndexError:
        return False
    return head.priority < below_priority
