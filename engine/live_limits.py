"""Limits on open server-sent event streams, and what an open stream holds while it lives.

Each stream (api.streaming, frontend.live) holds a web server thread for as long as it
is open, and used to be free to open: four streams froze a 1-worker x 4-thread server,
``/healthz`` included. Before a stream starts, ``acquire`` takes three slots:

- one of FLOWFORGE_SSE_PER_PROCESS in this process (counted in memory: it protects this
  process's threads; keep it below the web server's threads per process, so ordinary
  requests always find a thread);
- one of FLOWFORGE_SSE_PER_PRINCIPAL for the API key (or the signed-in user), and one of
  FLOWFORGE_SSE_PER_ORG for the organization, counted deployment-wide in Redis.

A Redis slot is a member of a sorted set scored by its expiry time (epoch seconds). A
stream refreshes its members every SLOT_REFRESH_SECONDS and removes them when it ends;
the members of a stream whose process was killed expire after SLOT_TTL_SECONDS and are
dropped at the next count. When Redis cannot be reached the two deployment-wide limits
are not enforced (a warning is logged; api.throttling does the same) and the
per-process limit still is.

A refusal is StreamRefused, carrying the message (naming the limit and its setting) and
the seconds to put in ``Retry-After``. The views answer it with a 429.

The acquired StreamLease also re-authorizes the stream: ``still_allowed()``, called by
the stream before each read, runs the view's check (the API key is still active, the
user still a member of the organization...) at least every FLOWFORGE_SSE_REAUTH_SECONDS,
so a revoked key or a removed member stops receiving within that time. ``release()``
gives every slot back; it is idempotent, and called both from the stream generator's
``finally`` and from ``LeasedStream.close()`` (a generator closed before it started
never runs its ``finally``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# Seconds a Redis slot lives unless refreshed: how long a killed process's slots linger.
SLOT_TTL_SECONDS = 60
# Seconds between refreshes of an open stream's Redis slots.
SLOT_REFRESH_SECONDS = 20
# Seconds a refused client is asked to wait (Retry-After).
RETRY_AFTER_SECONDS = 10

# Drop expired members, check both limits, add the member to both sets: one atomic step,
# so concurrent opens in several processes cannot overshoot a limit.
# KEYS: principal set, organization set. ARGV: now, expiry, member, principal limit,
# organization limit, key ttl. Returns 0 (taken), 1 (principal full) or 2 (organization full).
_ACQUIRE_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return 0
"""


class StreamRefused(Exception):
    """A stream may not start now: ``str(exc)`` says which limit (and its setting);
    ``retry_after`` is in seconds."""

    def __init__(self, message: str, *, retry_after: int = RETRY_AFTER_SECONDS):
        super().__init__(message)
        self.retry_after = retry_after


# --- the per-process count ------------------------------------------------------------------------

_process_lock = threading.Lock()
_process_open = 0


def _reset_after_fork() -> None:
    # A forked child serves none of its parent's streams.
    global _process_lock, _process_open
    _process_lock, _process_open = threading.Lock(), 0


os.register_at_fork(after_in_child=_reset_after_fork)


def _take_process_slot() -> None:
    global _process_open
    limit = settings.FLOWFORGE_SSE_PER_PROCESS
    with _process_lock:
        if _process_open >= limit:
            raise StreamRefused(
                f"This server process already serves {limit} event streams, its limit "
                f"(FLOWFORGE_SSE_PER_PROCESS); retry in a moment or poll instead.")
        _process_open += 1


def _give_process_slot() -> None:
    global _process_open
    with _process_lock:
        _process_open = max(0, _process_open - 1)


# --- the deployment-wide counts in Redis ----------------------------------------------------------

_local = threading.local()


def _redis() -> redis.Redis:
    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", None) != os.getpid():
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        _local.client, _local.pid = client, os.getpid()
    return client


def organization_key(organization_id) -> str:
    """The Redis sorted set of an organization's open streams."""
    return f"{settings.BROKER_NAMESPACE}:sse:org:{organization_id}"


def principal_key(*, organization_id, api_key_id=None, user_id=None) -> str:
    """The Redis sorted set of one principal's open streams: an API key (within its
    organization) or a user (across organizations, like api.throttling's caller)."""
    if api_key_id is not None:
        return f"{settings.BROKER_NAMESPACE}:sse:org:{organization_id}:key:{api_key_id}"
    if user_id is None:
        raise ValueError("principal_key needs api_key_id or user_id")
    return f"{settings.BROKER_NAMESPACE}:sse:user:{user_id}"


class StreamLease:
    """The slots one open stream holds, and its re-authorization (module docstring).

    ``reauthorize`` is a callable returning True while the stream's principal may still
    read the run; it reads the database through the calling thread's connection.
    """

    def __init__(self, *, keys: list[str], member: str, reauthorize: Callable[[], bool]):
        self._keys = keys  # Redis sets holding ``member``; empty when Redis was away
        self._member = member
        self._reauthorize = reauthorize
        self._released = False
        self._refreshed = self._authorized = time.monotonic()

    @property
    def reauth_seconds(self) -> float:
        return float(settings.FLOWFORGE_SSE_REAUTH_SECONDS)

    def seconds_to_next_check(self) -> float:
        """Seconds until ``still_allowed`` has work to do: bounds the stream's waits."""
        now = time.monotonic()
        due = min(self._authorized + self.reauth_seconds, self._refreshed + SLOT_REFRESH_SECONDS)
        return max(0.0, due - now)

    def still_allowed(self) -> bool:
        """Refresh the Redis slots and re-authorize when due. False: the principal lost
        its right to read the run (or the check could not be made): end the stream."""
        now = time.monotonic()
        if now - self._refreshed >= SLOT_REFRESH_SECONDS:
            self._refresh()
            self._refreshed = now
        if now - self._authorized >= self.reauth_seconds:
            try:
                allowed = bool(self._reauthorize())
            except Exception:  # noqa: BLE001 - fail closed: the client can reconnect and authenticate
                log.warning("event stream re-authorization failed; ending the stream", exc_info=True)
                allowed = False
            if not allowed:
                return False
            self._authorized = time.monotonic()
        return True

    def _refresh(self) -> None:
        if not self._keys:
            return
        expiry = time.time() + SLOT_TTL_SECONDS
        try:
            pipe = _redis().pipeline()
            for key in self._keys:
                pipe.zadd(key, {self._member: expiry}, xx=True)
                pipe.expire(key, 2 * SLOT_TTL_SECONDS)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not refresh event stream slots (%s)", type(exc).__name__)

    def release(self) -> None:
        """Give every slot back (idempotent)."""
        if self._released:
            return
        self._released = True
        _give_process_slot()
        if self._keys:
            try:
                pipe = _redis().pipeline()
                for key in self._keys:
                    pipe.zrem(key, self._member)
                pipe.execute()
            except redis.RedisError as exc:  # the members expire on their own
                log.warning("could not release event stream slots (%s)", type(exc).__name__)


def acquire(*, organization_id: uuid.UUID, api_key_id: uuid.UUID | None = None, user_id=None,
            reauthorize: Callable[[], bool]) -> StreamLease:
    """Take a stream's slots for an API key (``api_key_id``) or a user (``user_id``) of
    ``organization_id``. Returns the StreamLease to hand to the stream; raises
    StreamRefused (the message names the limit) when a limit is reached, holding nothing."""
    _take_process_slot()
    member = uuid.uuid4().hex
    keys = [principal_key(organization_id=organization_id, api_key_id=api_key_id, user_id=user_id),
            organization_key(organization_id)]
    try:
        client = _redis()
        now = time.time()
        verdict = client.eval(_ACQUIRE_LUA, 2, *keys, now, now + SLOT_TTL_SECONDS, member,
                              settings.FLOWFORGE_SSE_PER_PRINCIPAL, settings.FLOWFORGE_SSE_PER_ORG,
                              2 * SLOT_TTL_SECONDS)
    except redis.RedisError as exc:
        log.warning("event stream limits unavailable in Redis (%s); only the per-process limit applies",
                    type(exc).__name__)
        return StreamLease(keys=[], member=member, reauthorize=reauthorize)
    except BaseException:
        _give_process_slot()
        raise
    if verdict == 0:
        return StreamLease(keys=keys, member=member, reauthorize=reauthorize)
    _give_process_slot()
    if verdict == 1:
        who = "This API key" if api_key_id is not None else "You"
        raise StreamRefused(
            f"{who} already {'has' if api_key_id is not None else 'have'} "
            f"{settings.FLOWFORGE_SSE_PER_PRINCIPAL} open event streams, the limit per "
            f"{'API key' if api_key_id is not None else 'user'} (FLOWFORGE_SSE_PER_PRINCIPAL); "
            "close one or retry later.")
    raise StreamRefused(
        f"This organization already has {settings.FLOWFORGE_SSE_PER_ORG} open event streams, the limit per "
        "organization (FLOWFORGE_SSE_PER_ORG); close one or retry later.")


class LeasedStream:
    """An iterator over ``stream`` that releases ``lease`` when it ends or is closed, for a
    StreamingHttpResponse (which closes its content when the client goes away or the
    response is discarded, even before the first item: then a generator's ``finally``
    does not run)."""

    def __init__(self, stream: Iterator[str], lease: StreamLease):
        self._stream = stream
        self._lease = lease

    def __iter__(self) -> LeasedStream:
        return self

    def __next__(self) -> str:
        try:
            return next(self._stream)
        except BaseException:
            self._lease.release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
        finally:
            self._lease.release()
