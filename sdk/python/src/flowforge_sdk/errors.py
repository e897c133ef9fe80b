"""The exceptions of the SDK.

Everything the SDK raises is a :class:`FlowForgeError`. An error answer of the API is an
:class:`ApiError` (a subclass per status) carrying the RFC 9457 problem document the
server sent: ``status``, ``code`` (stable, machine-readable), ``detail`` (for people)
and ``errors`` (the per-field messages of a 400, or the ``[{"path", "message"}]`` list
of a rejected definition). A request that never got an answer is a :class:`NetworkError`.

:class:`NonRetryableError` is the other way round: a task handler raises it to fail
its attempt for good (no retry), whatever attempts are left.

Messages never hold the API key, a request body or a secret's value.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from typing import Any


class FlowForgeError(Exception):
    """Base class of every error the SDK raises."""


class NetworkError(FlowForgeError):
    """The request got no answer: the server could not be reached, the connection broke,
    or it timed out. ``cause`` is the underlying httpx exception."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class ApiError(FlowForgeError):
    """The API answered with an error status.

    ``status``: the HTTP status; ``code``: the problem's stable code (``invalid``,
    ``not_found``, ``conflict``, ``stale_fencing_token``…), or None when the body was not
    a problem document; ``detail``: the human-readable explanation; ``errors``: the
    problem's ``errors`` member (a dict of field → messages, or a list of
    ``{"path", "message"}`` for a rejected definition), or None; ``problem``: the whole
    problem document; ``request_id``: the ``X-Request-ID`` the server gave, when any.
    """

    def __init__(self, status: int, *, code: str | None = None, detail: str = "", errors: Any = None,
                 problem: dict[str, Any] | None = None, method: str = "", url: str = "",
                 request_id: str | None = None) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors
        self.problem: dict[str, Any] = problem or {}
        self.method = method
        self.url = url
        self.request_id = request_id
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"{self.method} {self.url} -> " if self.method else ""
        text = f"{where}{self.status}"
        if self.code:
            text += f" {self.code}"
        if self.detail:
            text += f": {self.detail}"
        if self.errors:
            text += f" {_format_errors(self.errors)}"
        return text


class ValidationError(ApiError):
    """400: a field or the body was refused (``code`` ``invalid``, ``invalid_definition``,
    ``parse_error``); ``errors`` names each bad field."""


class AuthenticationError(ApiError):
    """401: no key, or an unknown, expired or revoked one."""


class PermissionDenied(ApiError):
    """403: the key's role may not do this (a worker key calling anything but the worker
    endpoints, a viewer starting a run…)."""


class NotFound(ApiError):
    """404: no such object in the key's organization (or no such endpoint)."""


class Conflict(ApiError):
    """409: the object's state forbids the request now. For the worker calls ``code`` says
    why the generation is no longer the worker's: ``cancelled``, ``lease_expired`` or
    ``stale_fencing_token``."""


class PayloadTooLarge(ApiError):
    """413: the body (or the field ``errors`` names) is over its limit."""


class RateLimited(ApiError):
    """429: over a rate limit or quota. ``retry_after`` is the number of seconds the
    server asked to wait (its ``Retry-After``), or None when it gave none."""

    def __init__(self, status: int, *, retry_after: float | None = None, **kwargs: Any) -> None:
        self.retry_after = retry_after
        super().__init__(status, **kwargs)


class ServerError(ApiError):
    """5xx: the server (or a proxy in front of it) failed or is unavailable. ``retry_after``:
    the seconds its ``Retry-After`` asked to wait (a 503 ``poll_capacity`` sends one), or
    None when it gave none."""

    def __init__(self, status: int, *, retry_after: float | None = None, **kwargs: Any) -> None:
        self.retry_after = retry_after
        super().__init__(status, **kwargs)


class WaitTimeout(FlowForgeError, TimeoutError):
    """``runs.wait`` ran out of time before the run finished; ``run`` is its last state."""

    def __init__(self, message: str, *, run: Any = None) -> None:
        super().__init__(message)
        self.run = run


class DefinitionError(FlowForgeError, ValueError):
    """A code-first workflow (``flowforge_sdk.Workflow``) is invalid before it is sent:
    a duplicate task key, an unknown dependency, a malformed name. ``errors`` lists
    ``{"path", "message"}`` as the server's ``invalid_definition`` problem does."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['path']}: {e['message']}" for e in errors))


class NonRetryableError(Exception):
    """Raised by a task handler to fail the attempt without a retry: the worker reports
    it with ``retryable: false``, so the task fails whatever attempts are left."""


class TaskCancelled(NonRetryableError):
    """Raised by ``TaskContext.raise_if_cancelled()`` once the server said the worker no
    longer owns the task (``reason``: ``cancelled``, ``lease_expired``,
    ``stale_fencing_token`` or ``not_found``). The worker reports nothing for it."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the task is no longer this worker's ({reason})")
        self.reason = reason


_STATUS_CLASSES: dict[int, type[ApiError]] = {
    400: ValidationError,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}


def error_class(status: int) -> type[ApiError]:
    """The ApiError subclass for an HTTP status (ServerError for 5xx, ApiError otherwise)."""
    if status >= 500:
        return ServerError
    return _STATUS_CLASSES.get(status, ApiError)


def parse_retry_after(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP
    date; None when absent or unreadable. Never negative."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    now = now or dt.datetime.now(dt.timezone.utc)
    return max(0.0, (when - now).total_seconds())


def _format_errors(errors: Any, limit: int = 5) -> str:
    """A short, one-line rendering of a problem's ``errors`` for an exception message."""
    parts: list[str] = []
    if isinstance(errors, dict):
        for field, messages in errors.items():
            if isinstance(messages, list):
                messages = "; ".join(str(m) for m in messages)
            parts.append(f"{field}: {messages}")
    elif isinstance(errors, list):
        for item in errors:
            if isinstance(item, dict) and "path" in item:
                parts.append(f"{item['path']}: {item.get('message', '')}")
            else:
                parts.append(str(item))
    else:
        parts.append(str(errors))
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "[" + " | ".join(parts[:limit]) + more + "]"


__all__ = [
    "ApiError",
    "AuthenticationError",
    "Conflict",
    "DefinitionError",
    "FlowForgeError",
    "NetworkError",
    "NonRetryableError",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "ServerError",
    "TaskCancelled",
    "ValidationError",
    "WaitTimeout",
    "error_class",
    "parse_retry_after",
]
