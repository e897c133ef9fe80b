"""The egress policy: which addresses a task (or a webhook) may make the worker connect to.

Every outbound HTTP request that a tenant controls goes through ``client()``. Its transport
resolves the host itself, checks **every** resolved address with ``check_address`` and then
connects to exactly the address it checked, so a DNS answer cannot change between the check
and the connection (no rebinding window). Redirects are followed by httpx and each new
origin opens a new connection, so every hop is checked the same way. TLS still verifies the
certificate against the URL's host name (httpcore passes it as ``server_hostname``).

Denied by default: loopback, unspecified, link-local (cloud metadata included), private
(RFC 1918, CGNAT, unique local), multicast, broadcast, reserved, documentation and
benchmarking ranges, everything else Python's ``ipaddress`` says is not global, and IPv6
forms that carry an IPv4 address (IPv4-mapped, NAT64, 6to4, Teredo, IPv4-compatible),
judged by the IPv4 address they carry. The deployment setting ``FLOWFORGE_EGRESS_ALLOW``
(comma-separated host names and CIDRs) allows more: a host name entry allows that exact
name whatever it resolves to; a CIDR entry allows the resolved addresses inside it.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from engine.handlers.base import PermanentTaskError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SETTING = "FLOWFORGE_EGRESS_ALLOW"

# Named ranges, first match wins, so the more specific come first. Anything not named
# here that ipaddress still calls non-global is refused by the fallback in denial_reason.
_V4_DENIED = [(ipaddress.ip_network(net), reason) for net, reason in (
    ("169.254.169.254/32", "link-local, cloud metadata"),
    ("0.0.0.0/32", "unspecified"),  # connecting to 0.0.0.0 reaches loopback on Linux
    ("0.0.0.0/8", "this network"),
    ("127.0.0.0/8", "loopback"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "private, CGNAT shared address space"),
    ("169.254.0.0/16", "link-local"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
)]
_V6_DENIED = [(ipaddress.ip_network(net), reason) for net, reason in (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("fc00::/7", "private, unique local"),  # AWS's IPv6 metadata fd00:ec2::254 is in here
    ("fec0::/10", "site-local (deprecated)"),  # ipaddress calls it global
    ("ff00::/8", "multicast"),
    ("2001:db8::/32", "documentation"),
    ("100::/64", "discard-only"),
    ("64:ff9b:1::/48", "NAT64 local-use"),
)]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # ::a.b.c.d, deprecated
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # ::ffff:0:a.b.c.d (SIIT)
# \Z, not $ ("$" matches before a final newline).
_HOST_RE = re.compile(r"^(?=.{1,253}\Z)[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\Z")


class EgressDenied(PermanentTaskError):
    """A connection to ``address`` (resolved for ``host``) is refused by the egress policy.

    A PermanentTaskError: another attempt would be refused the same way, so the task fails
    at once. The message names the address, the reason and the setting that allows it; it
    never holds anything received from the network.
    """

    def __init__(self, address: str, reason: str, host: str | None = None) -> None:
        self.address, self.reason, self.host = address, reason, host
        for_host = f" for host {host!r}" if host is not None and host != address else ""
        super().__init__(
            f"egress refused: {address} ({reason}){for_host} — allow it with {SETTING}"
        )


class EgressConfigError(ValueError):
    """An entry of FLOWFORGE_EGRESS_ALLOW is neither a CIDR nor a host name."""


# --- the address check --------------------------------------------------------------------------


def parse_address(address: str | IPAddress) -> IPAddress:
    """``address`` as an ipaddress object, without its IPv6 zone (``fe80::1%eth0``).
    Raises ValueError for a string that is not an IP address."""
    if isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        address = str(address)
    return ipaddress.ip_address(address.split("%", 1)[0])


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]] | None:
    """(form, the IPv4 addresses it carries) for the IPv6 forms that carry one, else None."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", [ip.ipv4_mapped]
    if ip in _NAT64:
        return "NAT64", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return "6to4", [ip.sixtofour]
    if ip.teredo is not None:
        server, client = ip.teredo
        return "Teredo", [server, client]
    if ip in _IPV4_TRANSLATED:
        return "IPv4-translated", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 are named ranges of their own
        return "IPv4-compatible", [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    return None


def _named_reason(ip: IPAddress) -> str | None:
    for net, reason in _V4_DENIED if ip.version == 4 else _V6_DENIED:
        if ip in net:
            return reason
    if not ip.is_global or ip.is_reserved or ip.is_multicast:
        return "reserved" if ip.is_reserved else "not globally routable"
    return None


def denial_reason(address: str | IPAddress) -> str | None:
    """Why the default policy refuses ``address`` ("loopback", "private", "link-local, cloud
    metadata", ...), or None when it is a public address. Ignores FLOWFORGE_EGRESS_ALLOW.

    An IPv6 form that carries an IPv4 address is judged by that address:
    ``::ffff:127.0.0.1`` gives "loopback, IPv4-mapped 127.0.0.1". Raises ValueError for a
    string that is not an IP address.
    """
    ip = parse_address(address)
    if ip.version == 6:
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            form, inner = embedded
            for v4 in inner:
                reason = _named_reason(v4)
                if reason is not None:
                    return f"{reason}, {form} {v4}"
            if form in ("Teredo", "IPv4-translated", "IPv4-compatible"):
                # Tunnel and transition forms no deployment needs; refuse them whole.
                return f"{form} (not globally routable)"
            return None  # the IPv4 it carries is public: the packet goes there
    return _named_reason(ip)


@functools.lru_cache(maxsize=8)
def _parse_allow(entries: tuple[str, ...]) -> tuple[frozenset[str], tuple[Any, ...]]:
    hosts: set[str] = set()
    networks = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower().rstrip(".")
        if not _HOST_RE.match(name):
            raise EgressConfigError(f"{SETTING}: {entry!r} is neither a CIDR (10.0.0.0/8, fd00::/8) nor a host name")
        hosts.add(name)
    return frozenset(hosts), tuple(networks)


def allowed() -> tuple[frozenset[str], tuple[Any, ...]]:
    """(host names, networks) of FLOWFORGE_EGRESS_ALLOW, read from the settings at each call
    (so a test's override applies). Raises EgressConfigError naming a malformed entry."""
    from django.conf import settings

    value = getattr(settings, SETTING, ())
    if isinstance(value, str):
        value = value.split(",")
    return _parse_allow(tuple(value))


def host_is_allowed(host: str) -> bool:
    """True when ``host`` (a URL's host name, any case, trailing dot or not) is a host name
    entry of FLOWFORGE_EGRESS_ALLOW."""
    return host.lower().rstrip(".") in allowed()[0]


def check_address(address: str | IPAddress, *, host: str | None = None) -> None:
    """Return when the policy lets the worker connect to ``address`` (resolved for ``host``,
    which only names it in the error); raise EgressDenied naming the address and the reason
    otherwise. An address inside a CIDR of FLOWFORGE_EGRESS_ALLOW (or an IPv4-mapped form of
    one) is allowed. Raises ValueError for a string that is not an IP address."""
    ip = parse_address(address)
    networks = allowed()[1]
    candidates = [ip]
    if ip.version == 6 and ip.ipv4_mapped is not None:
        candidates.append(ip.ipv4_mapped)
    if any(c in net for c in candidates for net in networks if net.version == c.version):
        return
    reason = denial_reason(ip)
    if reason is not None:
        raise EgressDenied(str(ip), reason, host)


def literal_address(host: str) -> IPAddress | None:
    """The IP address that ``host`` (a URL's host, brackets removed) denotes as a numeric
    literal — ``127.0.0.1``, ``::1``, and the forms the C resolver also reads as numbers
    (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``) — or None for a host name.
    Never sends a DNS query (AI_NUMERICHOST)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError, ValueError):
        return None
    return parse_address(infos[0][4][0]) if infos else None


def check_literal_host(host: str) -> None:
    """The validation-time check: when ``host`` is a numeric IP literal, check_address it;
    a host name passes (it is resolved and checked at connect time, never in the web process).
    Raises EgressDenied."""
    if host_is_allowed(host):
        return
    ip = literal_address(host)
    if ip is not None:
        check_address(ip, host=host)


# --- the connection ------------------------------------------------------------------------------


def _resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` in the resolver's order, without duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    return list(dict.fromkeys(info[4][0] for info in infos))


class EgressBackend(httpcore.SyncBackend):
    """httpcore's synchronous network backend with the egress policy in front of connect_tcp:
    resolve ``host``, refuse (EgressDenied) unless every resolved address is allowed, then
    connect to those same addresses in order. TLS is started by httpcore afterwards with the
    URL's host name, so certificates are still verified against the name, not the IP."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = _resolve(host, port)
        if not host_is_allowed(host):
            # Every address, not just the first: a name with one public and one private
            # answer is refused rather than left to the connection order.
            for address in addresses:
                check_address(address, host=host)
        last: Exception | None = None
        for address in addresses:
            try:
                # A numeric address: create_connection does no DNS lookup for it, so the
                # socket connects to exactly the address checked above.
                return super().connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                           socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None  # getaddrinfo never returns an empty list without raising
        raise last


class EgressTransport(httpx.HTTPTransport):
    """httpx's HTTP transport over EgressBackend, with no proxy: the connection pool opens
    every connection through the egress policy."""

    def __init__(self, *, verify: bool = True, limits: httpx.Limits | None = None) -> None:
        limits = limits if limits is not None else httpx.Limits()
        # trust_env here only reads SSL_CERT_FILE/SSL_CERT_DIR (a CA bundle); proxies are
        # the client's business and client() turns them off.
        super().__init__(verify=verify, limits=limits)
        # httpx (0.27, 0.28) takes no network backend; it builds one httpcore pool in
        # __init__ (no connection yet) and sends everything through self._pool. Replace
        # it with the same pool over the egress backend, and fail loudly if that changes.
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError("httpx.HTTPTransport no longer keeps an httpcore.ConnectionPool in _pool")
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=EgressBackend(),
        )


def client(*, timeout: float, follow_redirects: bool = True, max_redirects: int = 20) -> httpx.Client:
    """A new httpx.Client whose every connection (each redirect hop included) obeys the
    egress policy: requests to refused addresses raise EgressDenied before a byte is sent or
    read. ``timeout`` is in seconds (httpx's connect/read/write/pool timeout). Proxy and netrc
    environment variables are ignored (trust_env=False), so they cannot route around it.
    Use it as a context manager."""
    return httpx.Client(
        transport=EgressTransport(),
        timeout=timeout,
        follow_redirects=follow_redirects,
        max_redirects=max_redirects,
        trust_env=False,
    )
