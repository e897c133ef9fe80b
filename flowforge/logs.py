"""Structured logging: JSON lines in production (python-json-logger), with the ids of
what the line is about — organization, run, task run, attempt, request — taken from
context variables that the request middleware and the worker set and reset.

Secret values in use are kept out of every log line: while an attempt runs with the
values of the organization's secrets (engine.worker.execute), ``redacting(pattern)``
makes every record created in that context — by the engine, httpx, a task callable,
any logger, whatever handler takes it — carry its message and traceback with each
match of ``pattern`` replaced by ``[redacted]`` (a log record factory), and the
console handler's filter does the same for the record's other text fields.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
from collections.abc import Iterator
from typing import Any

_fields: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("flowforge_log_fields", default={})  # noqa: B039
# The pattern of the secret values in use in this context (None: nothing to redact).
_redaction: contextvars.ContextVar[re.Pattern[str] | None] = contextvars.ContextVar("flowforge_log_redaction",
                                                                                   default=None)
REDACTED = "[redacted]"
# Record attributes that are never free text (the rest may carry a value: redacted).
_STRUCTURAL = frozenset({"name", "levelname", "pathname", "filename", "module", "funcName", "threadName",
                         "processName", "taskName"})

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


@contextlib.contextmanager
def redacting(pattern: re.Pattern[str] | None) -> Iterator[None]:
    """Inside the block, every log record created in this context has each match of
    ``pattern`` in its message and traceback replaced by ``[redacted]`` (reset in a
    ``finally``). ``None`` redacts nothing more than the enclosing block does."""
    if pattern is None:
        yield
        return
    token = _redaction.set(pattern)
    try:
        yield
    finally:
        _redaction.reset(token)


_base_factory = logging.getLogRecordFactory()


def _redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """The log record factory: the previous factory's record, its message (arguments
    merged in) and traceback redacted when a ``redacting`` block is active."""
    record = _base_factory(*args, **kwargs)
    pattern = _redaction.get()
    if pattern is not None:
        _redact_record(record, pattern)
    return record


def _redact_record(record: logging.LogRecord, pattern: re.Pattern[str]) -> None:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: keep the template, drop the arguments
        message = str(record.msg)
    record.msg, record.args = pattern.sub(REDACTED, message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = pattern.sub(REDACTED, record.exc_text)
    if record.stack_info:
        record.stack_info = pattern.sub(REDACTED, record.stack_info)


# Installed when this module is imported: settings.LOGGING names its filter, so every
# process that configures logging (web, worker, clock, commands, tests) imports it.
if logging.getLogRecordFactory() is not _redacting_factory:
    logging.setLogRecordFactory(_redacting_factory)


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (``record.task_run_id`` ...), and the
    request id from the audit request context; inside a ``redacting`` block, redacts
    the record's other text fields too (``extra=`` values)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from audit.context import current_request

        pattern = _redaction.get()
        if pattern is not None:
            for key, value in list(vars(record).items()):
                if isinstance(value, str) and key not in _STRUCTURAL:
                    setattr(record, key, pattern.sub(REDACTED, value))

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
