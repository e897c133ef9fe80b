"""The API's rate limit: fixed-window counters per API key (per user for a browser
session) and per organization, in the shared Redis cache so every web process counts
against one limit.

``settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE`` requests are allowed per caller per
clock minute, and ``settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG`` per
organization (all its keys and session users together: a second key does not double
what an organization may send, issue 16); the next one is a 429 problem whose
``Retry-After`` says how many seconds remain in the window and whose detail names the
budget that was spent (the API key's, the user's, or the organization's). A request the
caller's own budget refuses does not count against the organization's. A fixed window admits a burst of up to twice the
limit across a window boundary: a fair trade for one INCR per request (seed 001,
"Windows are fixed, not sliding").

DRF runs throttles after authentication and the permission check, so an
unauthenticated request never reaches this (it is a 401), and the schema views,
which allow anonymous callers, are not counted for them.

The counter is a convenience, not state: when Redis cannot be reached the request
is let through and a warning logged (the API stays up; PostgreSQL is the truth).
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import BaseThrottle

from tenancy.apikeys import AuthenticatedKey
from tenancy.models import User

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# Counters outlive their window a little, so a slow clock in another process still finds them.
COUNTER_TTL_SECONDS = 2 * WINDOW_SECONDS


def now() -> float:
    """Seconds since the epoch (a function so tests can pin the window)."""
    return time.time()


def caller_ident(request) -> str | None:
    """Whose budget a request spends: ``org:<id>:key:<id>`` for an API key (the cache
    key names the organization, as every tenant cache key does), ``user:<id>`` for a
    session user, None for an anonymous caller."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, AuthenticatedKey):
        return f"org:{auth.organization.pk}:key:{auth.id}"
    user = getattr(request, "user", None)
    if isinstance(user, User) and user.is_authenticated:
        return f"user:{user.pk}"
    return None


def _count(key: str) -> int | None:
    """Increment the window counter ``key`` and return its new value (None: Redis failed)."""
    try:
        for _ in range(2):
            cache.add(key, 0, timeout=COUNTER_TTL_SECONDS)
            try:
                return cache.incr(key)
            except ValueError:  # expired between add and incr: start it again
                continue
    except Exception as exc:  # noqa: BLE001 - any cache failure: fail open, loudly
        log.warning("API rate limit counter unavailable (%s); request allowed", type(exc).__name__)
    return None


def organization_ident(request) -> str | None:
    """The organization whose budget a request also spends: the API key's, else the
    resolved actor's (api.base resolves it before the throttles run); None when unknown."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, AuthenticatedKey):
        return str(auth.organization.pk)
    actor = getattr(request, "actor", None)
    organization = getattr(actor, "organization", None)
    return str(organization.pk) if organization is not None else None


class ApiRateThrottle(BaseThrottle):
    """Fixed-window limits of FLOWFORGE_API_RATE_LIMIT_PER_MINUTE per caller and
    FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG per organization (0 disables either).
    When one refuses, ``request.throttle_detail`` names it (api.base.OrganizationAPIView.throttled)."""

    #: The counters' namespace, and the settings of the two limits.
    scope = "api-rate"
    caller_setting = "FLOWFORGE_API_RATE_LIMIT_PER_MINUTE"
    organization_setting = "FLOWFORGE_API_RATE_LIMIT_PER_MINUTE_PER_ORG"
    #: What the 429's detail calls the budget.
    what = "rate limit"

    def __init__(self) -> None:
        self.retry_after: float = 0.0

    def allow_request(self, request, view) -> bool:
        ident = caller_ident(request)
        if ident is None:
            return True
        at = now()
        window = int(at // WINDOW_SECONDS)
        self.retry_after = (window + 1) * WINDOW_SECONDS - at
        limit = getattr(settings, self.caller_setting)
        if limit > 0:
            count = _count(f"{self.scope}:{ident}:{window}")
            if count is not None and count > limit:
                who = "this API key's" if ":key:" in ident else "your"
                request.throttle_detail = (f"Request was throttled: {who} {self.what} of {limit} requests per minute "
                                           "is spent.")
                return False
        org_limit = getattr(settings, self.organization_setting, 0)
        org = organization_ident(request)
        if org_limit > 0 and org is not None:
            count = _count(f"{self.scope}:org:{org}:{window}")
            if count is not None and count > org_limit:
                request.throttle_detail = (f"Request was throttled: the organization's {self.what} of {org_limit} "
                                           "requests per minute (all its API keys and users together) is spent.")
                return False
        return True

    def wait(self) -> float:
        """Whole seconds until the window ends (at least 1): the ``Retry-After`` value."""
        return max(1, math.ceil(self.retry_after))


class WorkerLeaseThrottle(ApiRateThrottle):
    """The budget of a worker's calls on the tasks it holds (heartbeat, complete, fail):
    FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE per key and
    FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE_PER_ORG per organization, apart from the API's
    budget, so a worker's polls and log lines cannot spend what its heartbeats need (a
    refused heartbeat costs the task its lease)."""

    scope = "worker-lease-rate"
    caller_setting = "FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE"
    organization_setting = "FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE_PER_ORG"
    what = "limit of calls on held tasks"


def failed_key_wait(ip: str | None) -> float | None:
    """Seconds until address ``ip`` may try an API key again, when it has already failed
    FLOWFORGE_API_KEY_FAILURES_PER_MINUTE times in this clock minute; else None.

    Checked before a key is verified: each failure costs an Argon2 verification (tens of
    milliseconds of CPU), so an address guessing keys is stopped before that work. A
    valid key sent from a blocked address waits too, until the window ends. Fails open,
    like the request limit, when Redis cannot be reached.
    """
    limit = settings.FLOWFORGE_API_KEY_FAILURES_PER_MINUTE
    if limit <= 0 or ip is None:
        return None
    at = now()
    window = int(at // WINDOW_SECONDS)
    try:
        count = cache.get(f"api-key-fail:ip:{ip}:{window}", 0)
    except Exception as exc:  # noqa: BLE001 - any cache failure: fail open, loudly
        log.warning("API key failure counter unavailable (%s); attempt allowed", type(exc).__name__)
        return None
    if count < limit:
        return None
    return max(1, math.ceil((window + 1) * WINDOW_SECONDS - at))


def record_failed_key(ip: str | None) -> None:
    """Count one failed API key authentication from address ``ip`` in this minute's window."""
    if settings.FLOWFORGE_API_KEY_FAILURES_PER_MINUTE <= 0 or ip is None:
        return
    _count(f"api-key-fail:ip:{ip}:{int(now() // WINDOW_SECONDS)}")
