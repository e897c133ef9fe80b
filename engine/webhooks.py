"""Webhooks on the wire (issue 19): the endpoint URL's rules, the signing secret, the body,
the signature (Stripe's scheme), and one POST through the egress policy.

Signature: ``FlowForge-Signature: t=<unix seconds>,v1=<hex>`` where ``<hex>`` is
HMAC-SHA256, keyed with the endpoint's secret (the whole ``whsec_...`` string, as UTF-8),
of ``"<t>." + body`` (the exact bytes sent). While a rotated-out secret still signs, a
second ``v1=`` carries its signature. A receiver recomputes the HMAC over the raw body,
compares in constant time with any ``v1``, and refuses a ``t`` too far from its clock
(``verify_signature`` is that receiver; docs/notifications.md has it standalone).

The POST never follows a redirect (a 3xx is a failed attempt, naming its Location), reads
at most FLOWFORGE_WEBHOOK_RESPONSE_BYTES of the answer, and connects only where the egress
policy allows (``engine.egress``: the host resolved and every address checked at each
connection, so a DNS answer that changed since the URL was stored is judged afresh).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import secrets
import socket
import time
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from engine import egress

SIGNATURE_HEADER = "FlowForge-Signature"
EVENT_ID_HEADER = "FlowForge-Event-Id"
EVENT_TYPE_HEADER = "FlowForge-Event-Type"
DELIVERY_ID_HEADER = "FlowForge-Delivery-Id"
ATTEMPT_HEADER = "FlowForge-Delivery-Attempt"
USER_AGENT = "FlowForge-Webhooks/1"
SECRET_PREFIX = "whsec_"
# Longest URL accepted, in characters.
MAX_URL_CHARS = 2000
# How long the check of a new URL waits for its host name to resolve, in seconds: past it,
# the name is accepted and judged at each connection (as one that does not resolve).
RESOLVE_TIMEOUT_SECONDS = 2.0
# How far a signature's timestamp may be from the receiver's clock, in seconds (verify_signature).
DEFAULT_TOLERANCE_SECONDS = 300
# Statuses worth another attempt besides 5xx: Request Timeout, Too Many Requests.
RETRYABLE_STATUSES = frozenset({408, 429})


class InvalidWebhook(ValueError):
    """A webhook endpoint's field was refused: ``field`` names it, ``message`` says why."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# --- the URL ------------------------------------------------------------------------------------


def _resolve(host: str) -> list[str]:
    return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))


def validate_url(url: Any) -> str:
    """``url`` when it may be an endpoint's: an absolute http(s) URL of at most
    MAX_URL_CHARS characters, with a host, no user:password@ and no #fragment, that httpx
    parses, whose host the egress policy allows. A numeric host is judged as the address it
    is; a host name is resolved (at most RESOLVE_TIMEOUT_SECONDS) and refused when any of its
    addresses is (a name that does not resolve now is accepted: every delivery resolves and
    checks it again). Raises InvalidWebhook("url", ...)."""
    if not isinstance(url, str) or not url:
        raise InvalidWebhook("url", "required: an absolute http(s) URL")
    if len(url) > MAX_URL_CHARS:
        raise InvalidWebhook("url", f"is {len(url)} characters long; at most {MAX_URL_CHARS}")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidWebhook("url", "must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises for one outside 0-65535
    except ValueError as exc:
        raise InvalidWebhook("url", f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidWebhook("url", "must be an absolute http:// or https:// URL")
    if not host:
        raise InvalidWebhook("url", "must name a host")
    if "@" in parts.netloc:
        raise InvalidWebhook("url", "must not hold a user or password (user:password@): receivers authenticate "
                             "FlowForge by the signature header")
    if parts.fragment or url.endswith("#"):
        raise InvalidWebhook("url", "must not have a #fragment (it is never sent)")
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidWebhook("url", f"is not a valid URL ({exc})") from None
    host = unquote(host)
    try:
        egress.check_literal_host(host)
        if egress.literal_address(host) is None and not egress.host_is_allowed(host):
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
            try:
                addresses = pool.submit(_resolve, host).result(timeout=RESOLVE_TIMEOUT_SECONDS)
            except (OSError, UnicodeError, concurrent.futures.TimeoutError):
                addresses = []
            finally:
                # Not waiting for a resolver that overran: it ends on its own, its answer unused.
                pool.shutdown(wait=False, cancel_futures=True)
            for address in addresses:
                egress.check_address(address, host=host)
    except egress.EgressDenied as exc:
        raise InvalidWebhook("url", str(exc)) from None
    return url


def safe_url(url: str) -> str:
    """``url`` cut to its scheme, host and port: what an audit record or a log line may show
    (a path or query can hold a receiver's token); '' for what is not a URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


# --- the secret and the signature -------------------------------------------------------------------


def generate_secret() -> str:
    """A new signing secret: ``whsec_`` and 43 url-safe characters (32 random bytes)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """HMAC-SHA256 of ``"<timestamp>." + body`` keyed with ``secret`` (UTF-8), as hex."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secrets_: list[str], timestamp: int, body: bytes) -> str:
    """The FlowForge-Signature value: ``t=<timestamp>`` and one ``v1=`` per secret, in order."""
    return ",".join([f"t={timestamp}", *(f"v1={sign(s, timestamp, body)}" for s in secrets_)])


class SignatureError(ValueError):
    """A signature header that does not verify: malformed, no matching v1, or too old."""


def verify_signature(secret: str, header: str, body: bytes, *, tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
                     now: float | None = None) -> int:
    """What a receiver does: check ``header`` (a FlowForge-Signature value) against the raw
    ``body`` with ``secret``. Returns the timestamp; raises SignatureError when no ``v1``
    matches (compared in constant time) or the timestamp is more than
    ``tolerance_seconds`` from ``now`` (default: this clock)."""
    pairs = [part.split("=", 1) for part in header.split(",") if "=" in part]
    stamps = [v for k, v in pairs if k.strip() == "t"]
    signatures = [v.strip() for k, v in pairs if k.strip() == "v1"]
    if len(stamps) != 1 or not stamps[0].strip().isdigit() or not signatures:
        raise SignatureError("malformed signature header")
    timestamp = int(stamps[0])
    expected = sign(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        raise SignatureError("no signature matches")
    if abs((time.time() if now is None else now) - timestamp) > tolerance_seconds:
        raise SignatureError("timestamp outside the tolerance")
    return timestamp


# --- the body ---------------------------------------------------------------------------------------


def _instant(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def event_body(*, event_id: Any, event_type: str, created_at: dt.datetime, payload: dict[str, Any]) -> bytes:
    """The JSON body of an event: ``{"id", "type", "created_at", "data"}`` (``data`` the
    snapshot recorded with the event), compact with sorted keys, so every attempt and
    replay of one event sends the same bytes."""
    document = {"id": str(event_id), "type": event_type, "created_at": _instant(created_at), "data": payload}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --- the POST ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PostResult:
    """One POST: ``ok`` for a 2xx; else ``retryable`` (network error, timeout, 408, 429,
    5xx) or not. ``status`` None when nothing came back. ``excerpt`` is the start of the
    body (``truncated`` when there was more), decoded as UTF-8 with replacements."""

    ok: bool
    retryable: bool
    status: int | None
    error: str
    excerpt: str
    truncated: bool
    duration_ms: int


def _excerpt(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def post(url: str, body: bytes, headers: dict[str, str], *, timeout_seconds: float,
         max_response_bytes: int) -> PostResult:
    """POST ``body`` (JSON) to ``url`` with ``headers``, without following redirects, through
    the egress policy; read at most ``max_response_bytes`` of the answer, as sent (asked
    for without compression, and never decompressed). Never raises for what the network or
    the receiver does: every outcome is a PostResult."""
    started = time.monotonic()

    def done(ok: bool, retryable: bool, status: int | None, error: str, raw: bytes = b"",
             truncated: bool = False) -> PostResult:
        return PostResult(ok=ok, retryable=retryable, status=status, error=error.replace("\x00", "")[:1000],
                          excerpt=_excerpt(raw),
                          truncated=truncated, duration_ms=int((time.monotonic() - started) * 1000))

    # identity: the answer is read as it comes, never decompressed (no zip bomb to inflate).
    request_headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Accept-Encoding": "identity",
                       **headers}
    try:
        with egress.client(timeout=timeout_seconds, follow_redirects=False) as client:
            with client.stream("POST", url, content=body, headers=request_headers) as response:
                raw = bytearray()
                truncated = False
                for chunk in response.iter_raw():
                    raw.extend(chunk)
                    if len(raw) > max_response_bytes:
                        truncated = True
                        del raw[max_response_bytes:]
                        break
                status = response.status_code
                location = response.headers.get("location", "")
    except egress.EgressDenied as exc:
        return done(False, False, None, str(exc))
    except httpx.TimeoutException as exc:
        return done(False, True, None, f"timed out after {timeout_seconds:g} s ({type(exc).__name__})")
    except (httpx.HTTPError, OSError) as exc:
        return done(False, True, None, f"{type(exc).__name__}: {exc}")
    if 200 <= status < 300:
        return done(True, False, status, "", bytes(raw), truncated)
    if 300 <= status < 400:
        where = f" to {safe_url(location)}..." if location.startswith(("http://", "https://")) else ""
        return done(False, False, status, f"HTTP {status}: a redirect{where}, which webhooks do not follow",
                    bytes(raw), truncated)
    retryable = status >= 500 or status in RETRYABLE_STATUSES
    return done(False, retryable, status, f"HTTP {status}", bytes(raw), truncated)
