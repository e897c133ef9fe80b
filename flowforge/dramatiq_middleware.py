"""Dramatiq middleware shared by every actor."""

from __future__ import annotations

from django import db
from dramatiq.middleware import Middleware


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
