"""Health endpoints for load balancers and orchestrators.

- ``/healthz``: the process answers (no dependency is touched).
- ``/readyz``: PostgreSQL answers, the broker answers, and the database's migrations
  match the code's exactly — 503 listing unapplied migrations by name, and also
  migrations the database has that this code does not know (a binary older than its
  database, e.g. after a rollback), as seed 001's readiness does.
- ``/metrics``: Prometheus text format (engine.metrics); with DEBUG off, only with its token
  (FLOWFORGE_METRICS_TOKEN) unless FLOWFORGE_METRICS_PUBLIC is true.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


def migration_drift() -> tuple[list[str], list[str]]:
    """(unapplied: known to the code, not applied), (unknown: applied, not in the code)."""
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    known = set(loader.disk_migrations)
    applied = set(loader.applied_migrations)
    unapplied = sorted(f"{app}.{name}" for app, name in known - applied)
    unknown = sorted(f"{app}.{name}" for app, name in applied - known)
    return unapplied, unknown


def _broker_ok() -> str | None:
    url = settings.BROKER_URL
    parts = urlsplit(url)
    try:
        if parts.scheme.startswith("redis") or parts.scheme == "unix":
            import redis

            redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping()
        else:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=2):
                pass
    except Exception as exc:  # any failure to reach it is "not ready"
        return f"{type(exc).__name__}: {exc}"
    return None


@transaction.non_atomic_requests
@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@transaction.non_atomic_requests  # a request transaction would fail before the check when the DB is down
@never_cache
@require_GET
def readyz(request):
    checks: dict = {}
    ready = True
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        checks["database"] = "ok"
        unapplied, unknown = migration_drift()
        checks["migrations"] = {"unapplied": unapplied, "unknown_to_code": unknown}
        ready &= not unapplied and not unknown
    except DatabaseError as exc:
        checks["database"] = f"unreachable: {exc}".strip()
        ready = False
    broker = _broker_ok()
    checks["broker"] = "ok" if broker is None else f"unreachable: {broker}"
    ready &= broker is None
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503)


@transaction.non_atomic_requests
@never_cache
@require_GET
def metrics(request):
    """Prometheus exposition.

    When FLOWFORGE_METRICS_TOKEN is set, ``Authorization: Bearer <token>`` must match (401
    otherwise). With no token and DEBUG off, the answer is 403 unless FLOWFORGE_METRICS_PUBLIC
    is true: queue depths and task counts of every organization are not for outsiders.
    """
    import hmac

    from engine.metrics import render

    token = getattr(settings, "FLOWFORGE_METRICS_TOKEN", "")
    if token:
        supplied = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            return HttpResponse("metrics need the Bearer token\n", status=401, content_type="text/plain")
    elif not settings.DEBUG and not getattr(settings, "FLOWFORGE_METRICS_PUBLIC", False):
        return HttpResponse(
            "metrics are not public: set FLOWFORGE_METRICS_TOKEN and scrape with "
            "'Authorization: Bearer <token>', or set FLOWFORGE_METRICS_PUBLIC=true to serve them to anyone\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
