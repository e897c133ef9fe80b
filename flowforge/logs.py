"""Structured logging: JSON lines in production (python-json-logger), with the ids of
what the line is about — organization, run, task run, attempt, request — taken from
context variables that the request middleware and the worker set and reset.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any

_fields: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("flowforge_log_fields", default={})  # noqa: B039

CONTEXT_KEYS = ("request_id", "organization_id", "workflow_run_id", "task_run_id", "attempt", "fencing_token")


@contextlib.contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line emitted inside the block (reset in a ``finally``)."""
    token = _fields.set({**_fields.get(), **{k: str(v) for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _fields.reset(token)


def bind(**fields: Any) -> None:
    """Add ``fields`` for the rest of the current context (a ``bound`` block resets them)."""
    _fields.set({**_fields.get(), **{k: str(v) for k, v in fields.items() if v is not None}})


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (``record.task_run_id`` ...), and the
    request id from the audit request context."""

    def filter(self, record: logging.LogRecord) -> bool:
        from audit.context import current_request

        fields = dict(_fields.get())
        meta = current_request.get()
        if meta is not None and meta.request_id:
            fields.setdefault("request_id", meta.request_id)
        for key in CONTEXT_KEYS:
            setattr(record, key, fields.get(key, ""))
        return True


class PlainFormatter(logging.Formatter):
    """Development format: the message, then whichever ids are bound."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        ids = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if getattr(record, k, ""))
        return f"{base} [{ids}]" if ids else base
