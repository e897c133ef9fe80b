"""The HTTP layer: one httpx.Client, JSON in and out, problem documents turned into
exceptions (flowforge_sdk.errors), retries of the calls that are safe to repeat.

What is retried, and when (at most ``retries`` more tries, waiting with
flowforge_sdk.backoff.Backoff and at least a server's ``Retry-After``):

- every request, when the connection could not be made (nothing was sent) or the
  answer is a 429 (the server refused it before doing anything);
- an *idempotent* request (GET, PUT, DELETE, and a POST that says it is, such as a run
  start carrying an Idempotency-Key) also when the answer was lost (a read timeout, a
  dropped connection) or is a 502, 503 or 504.

Never logged: the API key (it lives in the client's default headers only), bodies (a
secret's value, a task's input). Debug logs name the method, the path and the status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import httpx

from flowforge_sdk._version import __version__
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.errors import ApiError, NetworkError, RateLimited, error_class, parse_retry_after

logger = logging.getLogger("flowforge_sdk.http")

API_PREFIX = "/api/v1"
USER_AGENT = f"flowforge-python/{__version__}"
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUSES_IDEMPOTENT = frozenset({429, 502, 503, 504})
# httpx errors raised before a byte of the request reached the server.
NOT_SENT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def api_base_url(base_url: str) -> str:
    """``base_url`` with ``/api/v1`` appended unless it ends with it already:
    ``http://127.0.0.1:8000`` and ``http://127.0.0.1:8000/api/v1/`` name one API."""
    url = base_url.strip().rstrip("/")
    if not url:
        raise ValueError("base_url is empty; pass the server's address, e.g. http://127.0.0.1:8000")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}")
    if not parts.path.endswith(API_PREFIX):
        url += API_PREFIX
    return url + "/"


def segment(value: object) -> str:
    """One path segment, percent-encoded (a secret's name, an id)."""
    return quote(str(value), safe="")


def dumps(body: Any) -> bytes:
    """Compact JSON; ValueError for NaN/Infinity (not JSON: the server refuses them), TypeError
    for a value JSON cannot hold."""
    return json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()


class HttpTransport:
    """Sends requests to one API (``base_url``) with one key. Thread-safe (httpx.Client is)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float, retries: int,
                 backoff: Backoff | None = None, transport: httpx.BaseTransport | None = None,
                 user_agent: str | None = None) -> None:
        if not isinstance(api_key, str) or not api_key.strip():
            raise ValueError("api_key is empty: pass an API key (ffk_...)")
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        self.base_url = api_base_url(base_url)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff or Backoff(initial_seconds=0.5, max_seconds=8.0, max_retry_after_seconds=60.0)
        headers = {
            "Authorization": f"Bearer {api_key.strip()}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": f"{user_agent} {USER_AGENT}" if user_agent else USER_AGENT,
        }
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport,
                                  follow_redirects=False, trust_env=True)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None, idempotent: bool | None = None,
                retries: int | None = None, timeout: float | None = None,
                expect: tuple[int, ...] = (200, 201, 204)) -> httpx.Response:
        """Send one request (``path`` relative to the API's base URL) and return the
        response whose status is in ``expect``.

        Raises the ApiError subclass of the status for an error answer (with the problem
        document), NetworkError when no answer came; both after the retries allowed (see
        the module's docstring). ``body`` is sent as JSON (ValueError for NaN/Infinity,
        TypeError for what JSON cannot hold, both before anything is sent).
        """
        method = method.upper()
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS
        tries_left = self.retries if retries is None else retries
        content = None if body is None else dumps(body)
        send_headers = dict(headers or {})
        if content is not None:
            send_headers["Content-Type"] = "application/json"
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        backoff = self.backoff.copy()
        while True:
            try:
                response = self._http.request(method, path, content=content, params=query, headers=send_headers,
                                              timeout=self.timeout if timeout is None else timeout)
            except httpx.HTTPError as exc:
                network_error = NetworkError(f"{method} {self._shown(path)}: no answer from the server "
                                     f"({type(exc).__name__}: {exc})", cause=exc)
                retryable = isinstance(exc, NOT_SENT_ERRORS) or (idempotent and isinstance(exc, httpx.TransportError))
                if tries_left > 0 and retryable:
                    tries_left -= 1
                    delay = backoff.next_delay()
                    logger.debug("%s %s: %s; retrying in %.2f s", method, self._shown(path), type(exc).__name__, delay)
                    time.sleep(delay)
                    continue
                raise network_error from exc
            logger.debug("%s %s -> %s", method, self._shown(path), response.status_code)
            if response.status_code in expect:
                return response
            error = problem_error(response)
            retryable = response.status_code == 429 or (idempotent and response.status_code in RETRY_STATUSES_IDEMPOTENT)
            if tries_left > 0 and retryable:
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                if retry_after is not None and retry_after > backoff.max_retry_after_seconds:
                    raise error  # longer than we would wait: the caller decides
                tries_left -= 1
                delay = backoff.next_delay(retry_after=retry_after)
                logger.debug("%s %s -> %s; retrying in %.2f s", method, self._shown(path), response.status_code, delay)
                time.sleep(delay)
                continue
            raise error

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """``request`` and the decoded JSON body (None for an empty one, a 204)."""
        response = self.request(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def pages(self, path: str, *, params: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Each item of a paginated list (``{"results": [...], "next": url | null}``),
        following ``next`` until it is null (or of a plain JSON list). Only the query string of ``next`` is used,
        against this client's own base URL, so the key is never sent to another host
        (and a proxy that rewrites the scheme or host does not break paging)."""
        query: dict[str, Any] = dict(params or {})
        while True:
            page = self.json("GET", path, params=query)
            if isinstance(page, list):  # a list the API does not paginate (/api-keys/)
                yield from page
                return
            yield from page.get("results", [])
            following = page.get("next")
            if not following:
                return
            query = dict(parse_qsl(urlsplit(following).query, keep_blank_values=True))

    def _shown(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.base_url}{path}"


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def problem_error(response: httpx.Response) -> ApiError:
    """The exception for an error response: its class by status, its fields from the
    RFC 9457 problem document (or the start of the text when the body is not JSON)."""
    problem: dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            problem = parsed
    except ValueError:
        pass
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = problem.get("title") if isinstance(problem.get("title"), str) else response.text[:300].strip()
    code = problem.get("code")
    kwargs: dict[str, Any] = {
        "code": code if isinstance(code, str) else None,
        "detail": detail or response.reason_phrase,
        "errors": problem.get("errors"),
        "problem": problem,
        "method": response.request.method,
        "url": str(response.request.url.copy_with(query=None)),
        "request_id": response.headers.get("X-Request-ID"),
    }
    cls = error_class(response.status_code)
    if cls is RateLimited:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if retry_after is None and isinstance(problem.get("retry_after_seconds"), int | float):
            retry_after = float(problem["retry_after_seconds"])
        return RateLimited(response.status_code, retry_after=retry_after, **kwargs)
    return cls(response.status_code, **kwargs)
