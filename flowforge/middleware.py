"""Django middleware shared by the web process."""

from __future__ import annotations

import ipaddress
import re
import uuid

from audit.context import RequestMeta, current_request

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{8,64}\Z")  # \Z: "$" lets a final newline in


def client_ip(request) -> str | None:
    """The client's address: REMOTE_ADDR (a proxy in front must set it, e.g. gunicorn's
    --forwarded-allow-ips with X-Forwarded-For handled by the proxy). None if unparsable."""
    raw = request.META.get("REMOTE_ADDR") or ""
    try:
        return ipaddress.ip_address(raw).compressed
    except ValueError:
        return None


class RequestContextMiddleware:
    """Give every request an id (the caller's ``X-Request-ID`` when well-formed, else a
    new one), echo it in the response, and expose id, client IP and user agent to the
    audit log through a context variable that is reset in a ``finally``, so nothing
    leaks into the next request served by this thread."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        supplied = request.headers.get("X-Request-ID", "")
        request_id = supplied if _REQUEST_ID_RE.match(supplied) else uuid.uuid4().hex
        request.request_id = request_id
        token = current_request.set(
            RequestMeta(
                ip_address=client_ip(request),
                user_agent=request.headers.get("User-Agent", "")[:500],
                request_id=request_id,
            )
        )
        try:
            response = self.get_response(request)
        finally:
            current_request.reset(token)
        response["X-Request-ID"] = request_id
        return response
