"""Request metadata for audit records, held in a context variable for the length of
one request (set and reset in a ``finally`` by ``flowforge.middleware.RequestContextMiddleware``)."""

from __future__ import annotations

import contextvars
import dataclasses


@dataclasses.dataclass(frozen=True)
class RequestMeta:
    ip_address: str | None = None
    user_agent: str = ""
    request_id: str = ""


current_request: contextvars.ContextVar[RequestMeta | None] = contextvars.ContextVar(
    "flowforge_request_meta", default=None
)
