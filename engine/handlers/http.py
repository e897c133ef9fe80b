"""The ``http`` task type: one HTTP request with httpx."""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx

# A module import (not ``from engine.secret_refs import ...``): secret_refs imports
# engine.handlers.base, so whichever of the two is imported first, this works.
from engine import attempt_log, egress, secret_refs
from engine.handlers.base import (
    ConfigError,
    PermanentTaskError,
    TaskContext,
    TaskHandler,
    reject_unknown,
    require_number,
)

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
# Largest response body read, in bytes; the rest is dropped and `truncated` is set.
MAX_BODY_BYTES = 256 * 1024
# Headers the client sets itself: Host (which virtual host is asked is the URL's business,
# checked by the egress policy), the hop-by-hop headers of RFC 9110 section 7.6.1, and the
# framing headers. Lower case; a config naming one (any case) is refused.
RESERVED_HEADERS = frozenset({
    "host", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade", "content-length",
})


# Headers that carry credentials: a new definition must take their value from a secret
# ({{ secrets.NAME }}), never write it down, since definitions are readable by every role
# (Proxy-Authorization is refused anyway, as a hop-by-hop header). Lower case.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


# Other header names and query parameter names that carry a credential (X-Auth-Token,
# X-Access-Token, api_key, access_token, client_secret, password, sig, ...): the same rule.
_CREDENTIAL_NAME = re.compile(
    r"auth|token|secret|passw|pwd|hmac|api[-_]?key|credential|signature|session|^sig$|(^|[-_])key$",
    re.IGNORECASE)


def _is_credential_name(name: str) -> bool:
    name = name.strip()
    return name.lower() in CREDENTIAL_HEADERS or _CREDENTIAL_NAME.search(name) is not None


def _literal(value: str) -> bool:
    """True when ``value`` is written down, not taken from a secret (a malformed reference
    is engine.definitions' to report, not a literal)."""
    return bool(value) and not secret_refs.has_reference(value) and not secret_refs.mentions_reference(value)


# RFC 9110's token: what a field name may be made of (no ':' pseudo-headers, no spaces).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")


def _shown(text: str, limit: int = 200) -> str:
    """``text`` as repr, cut to ``limit`` characters, for an error message."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def malformed_header(headers: dict[str, str]) -> str | None:
    """What is wrong with the first malformed header of ``headers`` (a name that is not an
    RFC 9110 token — pseudo-headers included —, a value holding CR, LF or NUL), or None."""
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            return f"'headers': {_shown(name)} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)"
        if any(c in value for c in "\r\n\0"):
            return f"'headers': the value of {name!r} may not contain CR, LF or NUL"
    return None


class HttpStatusError(RuntimeError):
    """The response's status code is not one of ``expected_status``."""


class ReservedHeaderError(PermanentTaskError):
    """A stored config sets a header the client owns (Host, a hop-by-hop header)."""


def reserved_headers(headers: dict[str, str]) -> list[str]:
    """The names in ``headers`` (as written) that are RESERVED_HEADERS, case-insensitively."""
    return [name for name in headers if name.strip().lower() in RESERVED_HEADERS]


def check_url(url: str, *, shown: str, numeric_host: bool = True) -> None:
    """Raise ConfigError unless ``url`` is an absolute http(s) URL naming a host that
    httpx parses, whose host, when numeric (and ``numeric_host``), the egress policy
    allows. ``shown`` is how the URL is quoted in the error (the URL as written, or words
    for one that holds secret values)."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises for a port outside 0-65535
    except ValueError as exc:
        raise ConfigError(f"'url' is not a valid URL ({exc}), got {shown}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"'url' must be an absolute http(s) URL, got {shown}")
    if not host:
        raise ConfigError(f"'url' must name a host, got {shown}")
    # Only a numeric host is checked here (no DNS lookup in the web process); a host
    # name is resolved and checked by the worker at connect time, every hop.
    if numeric_host:
        try:
            egress.check_literal_host(unquote(host))
        except egress.EgressDenied as exc:
            raise ConfigError(f"'url': {exc}") from None
    try:
        httpx.URL(url)  # what the worker will parse: refuses control characters, bad hosts
    except httpx.InvalidURL as exc:
        raise ConfigError(f"'url' is not a valid URL ({exc}), got {shown}") from None


class ResolvedConfigError(PermanentTaskError):
    """A config whose secret references were resolved is no longer valid (a secret's value
    put a line break in a header, or made the URL something else than an http(s) URL)."""


def _summary(cfg: dict[str, Any], began: float, outcome: str, *, level: str) -> None:
    """The attempt's request summary line (stream ``http``): method, URL, what happened
    and how long it took. The attempt's log redacts the secret values the URL (or an
    error quoting it) holds before it keeps the line (engine.attempt_log)."""
    elapsed_ms = (time.monotonic() - began) * 1000
    attempt_log.note("http", level, f"{cfg['method']} {cfg['url']} -> {outcome} in {elapsed_ms:.0f} ms")


class HttpHandler(TaskHandler):
    type_name = "http"
    description = (
        "One HTTP request (method, url, headers, json body, expected_status, timeout_seconds); "
        "output is {status, headers, body} with the body parsed as JSON when it is JSON. "
        "Loopback, private, link-local and other internal addresses are refused (each redirect "
        "hop too) unless the deployment allows them; Host and hop-by-hop headers are not settable. "
        "Credentials come from the organization's secrets: {{ secrets.NAME }} in the url, a header value "
        "or a json string (Authorization, Cookie, X-Api-Key and other credential headers, a URL's password "
        "and credential query parameters take no literal value)."
    )

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, {"method", "url", "headers", "json", "expected_status", "timeout_seconds"})
        url = config.get("url")
        if not isinstance(url, str) or not url:
            raise ConfigError("'url' is required")
        # A reference ({{ secrets.NAME }}) is checked as a plain word where it stands: its
        # value is known only when an attempt starts, and run() checks the URL again then.
        check_url(secret_refs.with_placeholders(url), shown=_shown(url))
        method = str(config.get("method", "GET")).upper()
        if method not in METHODS:
            raise ConfigError(f"'method' must be one of {', '.join(sorted(METHODS))}, got {config.get('method')!r}")
        headers = config.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ConfigError("'headers' must be an object of string to string")
        if (problem := malformed_header(headers)) is not None:
            raise ConfigError(problem)
        refused = reserved_headers(headers)
        if refused:
            raise ConfigError(
                f"'headers' may not set {', '.join(repr(h) for h in refused)}: the client sets Host "
                "and the hop-by-hop headers (Connection, Keep-Alive, Proxy-*, TE, Trailer, "
                "Transfer-Encoding, Upgrade, Content-Length) itself"
            )
        expected = config.get("expected_status", [200, 201, 202, 204])
        if isinstance(expected, int):
            expected = [expected]
        if not isinstance(expected, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in expected
        ):
            raise ConfigError(
                "'expected_status' must be a status code or a list of status codes (100-599), "
                f"got {config.get('expected_status')!r}"
            )
        out = {"method": method, "url": url, "headers": headers, "expected_status": expected}
        if "json" in config:
            try:
                json.dumps(config["json"])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"'json' must be JSON-encodable ({exc})") from exc
            out["json"] = config["json"]
        # A day at most: httpx turns it into a deadline, and a larger one overflows it.
        out["timeout_seconds"] = require_number(config, "timeout_seconds", minimum=0.001, default=30.0,
                                                maximum=24 * 3600)
        return out

    def check_new_config(self, config: dict[str, Any]) -> list[tuple[str, str]]:
        """New definitions may not write a credential down: a credential header's value
        (CREDENTIAL_HEADERS: Authorization, Proxy-Authorization, Cookie, X-Api-Key, and any
        header named like one: X-Auth-Token, X-Access-Token, ..., any case), the URL's
        password (``user:password@``) or a query parameter named like one (``api_key``,
        ``access_token``, ``key``, ``sig``, ...) must reference a secret, e.g.
        ``"Bearer {{ secrets.API_TOKEN }}"``. Returns [(field path, message), ...].
        Every role reads definitions, so a literal credential there is readable by viewers.
        Versions stored before this rule keep running as they are."""
        store = ("store it as a secret of the organization (PUT /api/v1/secrets/NAME/ or the Secrets page) "
                 "and reference it")
        problems = []
        for name, value in (config.get("headers") or {}).items():
            if _is_credential_name(name) and isinstance(value, str) and _literal(value):
                problems.append((f"headers.{name}", (
                    f"{name} holds a literal credential: {store}, e.g. "
                    '"Bearer {{ secrets.NAME }}"; definitions are readable by every role')))
        url = config.get("url")
        if isinstance(url, str):
            try:
                parts = urlsplit(url)
            except ValueError:
                return problems  # validate_config reports a malformed URL
            netloc = parts.netloc
            if "@" in netloc:
                userinfo = netloc.rsplit("@", 1)[0]
                if ":" in userinfo and _literal(userinfo.split(":", 1)[1]):
                    problems.append(("url", f"the URL holds a literal password (user:password@): {store}, e.g. "
                                            '"https://user:{{ secrets.NAME }}@host/"; definitions are readable '
                                            "by every role"))
            for name, value in parse_qsl(parts.query, keep_blank_values=True):
                if _is_credential_name(name) and _literal(value):
                    problems.append(("url", f"the URL's query parameter {name!r} holds a literal credential: "
                                            f"{store}, e.g. \"?{name}={{{{ secrets.NAME }}}}\"; definitions are "
                                            "readable by every role"))
        return problems

    def run(self, context: TaskContext) -> Any:
        # context.config has its secret references resolved (engine.worker.execute); what
        # this attempt leaves behind is redacted there, before it is recorded.
        cfg = context.config
        headers = cfg.get("headers") or {}
        try:
            # The egress policy is applied when connecting (every hop), as for any URL.
            check_url(cfg["url"], shown="the URL with its secret references resolved", numeric_host=False)
        except ConfigError as exc:
            raise ResolvedConfigError(str(exc)) from None
        # A definition stored before these headers were refused at validation, or a
        # secret's value that put a line break into a header.
        if (problem := malformed_header(headers)) is not None:
            raise ReservedHeaderError(problem)
        refused = reserved_headers(headers)
        if refused:
            raise ReservedHeaderError(f"'headers' may not set {', '.join(repr(h) for h in refused)}")
        kwargs: dict[str, Any] = {"headers": headers}
        if "json" in cfg:
            kwargs["json"] = cfg["json"]
        # Every connection, each redirect hop included, goes through the egress policy; a
        # refusal raises EgressDenied (permanent) before anything is sent or read.
        began = time.monotonic()
        try:
            with egress.client(timeout=cfg.get("timeout_seconds", 30.0), follow_redirects=True) as client:
                with client.stream(cfg["method"], cfg["url"], **kwargs) as response:
                    raw = bytearray()
                    truncated = False
                    for chunk in response.iter_bytes():
                        raw.extend(chunk)
                        if len(raw) > MAX_BODY_BYTES:
                            truncated = True
                            del raw[MAX_BODY_BYTES:]
                            break
        except Exception as exc:
            _summary(cfg, began, f"failed: {type(exc).__name__}: {exc}", level="error")
            raise
        outcome = f"{response.status_code} {response.reason_phrase}".rstrip() + f", {len(raw)} bytes"
        if truncated:
            outcome += f" (body cut at {MAX_BODY_BYTES} bytes)"
        if response.history:
            hops = len(response.history)
            outcome += f", after {hops} redirect{'s' if hops != 1 else ''} to {response.url}"
        _summary(cfg, began, outcome, level="info" if response.status_code in cfg["expected_status"] else "warning")
        text = raw.decode(response.encoding or "utf-8", errors="replace")
        if truncated:  # the cut may go through a secret's value: the worker redacts only whole ones
            text = secret_refs.redact_tail(text, context.secret_values)
        body: Any = text
        if not truncated and "json" in response.headers.get("content-type", ""):
            try:
                body = json.loads(text)
            except ValueError:
                body = text
        if response.status_code not in cfg["expected_status"]:
            raise HttpStatusError(
                f"{cfg['method']} {cfg['url']} answered {response.status_code}, "
                f"expected {cfg['expected_status']}: {secret_refs.redact(text, context.secret_values)[:500]}"
            )
        return {
            "status": response.status_code,
            "headers": {k: v for k, v in response.headers.items() if k.lower().startswith("content-")},
            "body": body,
            "truncated": truncated,
        }
