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
