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
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import httpx

from flowforge_sdk._version import __version__
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.errors import (
    ApiError,
    NetworkError,
    RateLimited,
    ServerError,
    error_class,
    parse_retry_after,
)

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
        self._headers = {
            "Authorization": f"Bearer {api_key.strip()}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": f"{user_agent} {USER_AGENT}" if user_agent else USER_AGENT,
        }
        self._custom_transport = transport
        self._http = self._new_client(transport)

    def _new_client(self, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self.timeout, transport=transport,
                            follow_redirects=False, trust_env=True)

    def separate_client(self) -> httpx.Client | None:
        """A client of this API with a connection pool of its own (PollChannel's), or None
        when a custom transport was given: a client closes its transport, so it cannot be shared."""
        return None if self._custom_transport is not None else self._new_client(None)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None, idempotent: bool | None = None,
                retries: int | None = None, timeout: float | None = None,
                expect: tuple[int, ...] = (200, 201, 204), client: httpx.Client | None = None,
                extensions: Mapping[str, Any] | None = None) -> httpx.Response:
        """Send one request (``path`` relative to the API's base URL) and return the
        response whose status is in ``expect``.

        Raises the ApiError subclass of the status for an error answer (with the problem
        document), NetworkError when no answer came; both after the retries allowed (see
        the module's docstring). ``body`` is sent as JSON (ValueError for NaN/Infinity,
        TypeError for what JSON cannot hold, both before anything is sent). ``client``:
        send it through that client (a PollChannel's) instead of this transport's own;
        ``extensions``: httpx request extensions (the channel's ``trace``).
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
        http = client or self._http
        while True:
            try:
                response = http.request(method, path, content=content, params=query, headers=send_headers,
                                        timeout=self.timeout if timeout is None else timeout,
                                        extensions=dict(extensions) if extensions else None)
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
        following ``next`` until it is null. Only the query string of ``next`` is used,
        against this client's own base URL, so the key is never sent to another host
        (and a proxy that rewrites the scheme or host does not break paging)."""
        query: dict[str, Any] = dict(params or {})
        while True:
            page = self.json("GET", path, params=query)
            yield from page.get("results", [])
            following = page.get("next")
            if not following:
                return
            query = dict(parse_qsl(urlsplit(following).query, keep_blank_values=True))

    def _shown(self, path: str) -> str:
        return path if path.startswith("http") else f"{self.base_url}{path}"


class PollChannel:
    """Long polls (``POST /worker/poll``) on a connection pool of their own, which
    ``cancel()`` cuts off: how a worker asked to stop stops in about ``grace_seconds``
    rather than at the end of a wait of up to 30 s.

    A long poll blocks its thread in a socket read until the server answers. Closing the
    socket from another thread does not wake that read (not on Linux); shutting it down
    does. So the channel keeps the sockets of its connections (httpcore's ``trace``
    extension reports each one it opens), and after ``cancel()`` a thread of the channel:

    1. half-closes them (``SHUT_WR``) at once: the server sees the client gone and claims
       nothing more for the poll (it checks the peer before each claim), while an answer
       already on its way, holding tasks it started, can still be read and its tasks run;
    2. shuts them down (``SHUT_RDWR``) ``grace_seconds`` later: a poll still waiting
       raises NetworkError.

    A cancelled channel refuses new requests (NetworkError, nothing sent). ``cancel()``
    only sets a flag under a reentrant lock: safe from any thread and from a signal
    handler. With a custom transport (tests' httpx.MockTransport) there is no socket to
    cut: the polls go through the transport's own client and ``cancel()`` only refuses
    new ones. ``close()`` when done (it cancels too).
    """

    #: httpcore trace events whose ``return_value`` is the connection's new network stream.
    STREAM_EVENTS = frozenset({"connection.connect_tcp.complete", "connection.start_tls.complete"})

    def __init__(self, transport: HttpTransport, *, grace_seconds: float = 1.0) -> None:
        if grace_seconds < 0:
            raise ValueError("grace_seconds must be 0 or more")
        self.grace_seconds = grace_seconds
        self._transport = transport
        self._client = transport.separate_client()
        # Replaced whole, never changed in place: the cutter thread iterates over a list a
        # requesting thread may be replacing meanwhile.
        self._sockets: list[socket.socket] = []
        # Reentrant: a signal handler's cancel() may run in a thread that holds it already
        # (the main thread, in close()); a threading.Event's lock would deadlock there.
        self._cond = threading.Condition(threading.RLock())
        self._cancelled = False
        self._closed = False
        self._cutter = threading.Thread(target=self._cut_when_cancelled, name="flowforge-poll-cutter", daemon=True)
        self._cutter.start()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``HttpTransport.request`` through the channel; NetworkError at once once cancelled."""
        if self._cancelled:
            raise NetworkError(f"{method} {path}: not sent, the poll channel was cancelled (the worker is stopping)")
        if self._client is None:
            return self._transport.request(method, path, **kwargs)
        return self._transport.request(method, path, client=self._client, extensions={"trace": self._trace}, **kwargs)

    def cancel(self) -> None:
        """Cut off the poll in flight (see the class's docstring) and refuse new ones."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def close(self) -> None:
        """Cancel, cut what is left at once, and close the channel's connections."""
        with self._cond:
            self._cancelled = self._closed = True
            self._cond.notify_all()
        self._cutter.join(timeout=5)
        if self._client is not None:
            self._client.close()

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event not in self.STREAM_EVENTS:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        # Closed sockets (an earlier connection's, or the plain one a TLS socket took over) are forgotten.
        self._sockets = [s for s in self._sockets if s.fileno() != -1] + [sock]
        if self._cancelled:  # cancelled while connecting: nothing was sent, cut it now
            _shutdown(sock, socket.SHUT_RDWR)

    def _cut_when_cancelled(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._cancelled)
        for sock in list(self._sockets):
            _shutdown(sock, socket.SHUT_WR)
        with self._cond:
            self._cond.wait_for(lambda: self._closed, timeout=self.grace_seconds)
        for sock in list(self._sockets):
            _shutdown(sock, socket.SHUT_RDWR)


def _shutdown(sock: socket.socket, how: int) -> None:
    # socket.socket's own shutdown, also for a TLS socket: ssl.SSLSocket.shutdown would drop
    # its TLS state under a thread still reading the answer.
    try:
        socket.socket.shutdown(sock, how)
    except OSError:  # closed or never connected: nothing to cut
        pass


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
    if cls is not RateLimited and cls is not ServerError:
        return cls(response.status_code, **kwargs)
    # A 429, and a 5xx such as the 503 of a poll refused for capacity, may ask for a wait.
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if retry_after is None and isinstance(problem.get("retry_after_seconds"), int | float):
        retry_after = float(problem["retry_after_seconds"])
    if cls is RateLimited:
        return RateLimited(response.status_code, retry_after=retry_after, **kwargs)
    return ServerError(response.status_code, retry_after=retry_after, **kwargs)
