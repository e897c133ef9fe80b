"""WSGI entry point (gunicorn flowforge.wsgi).

Each gunicorn worker process imports this module when it boots (no ``--preload``), and
warms itself up here (``warm_up``) before it accepts a connection, so no client's
request pays for what a process does once: Django's and DRF's lazy imports and settings,
the URL resolver's patterns and reverse map (about 350 ms measured on a 2-core host for
a new process's first ``POST /api/v1/runs/``). ``FLOWFORGE_WEB_WARM_UP=0`` turns it off.
"""

import io
import logging
import os
import uuid

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
application = get_wsgi_application()

log = logging.getLogger(__name__)


def warm_up(app) -> int | None:
    """Send one unauthenticated ``GET /api/v1/runs/`` through ``app`` in this thread
    (middleware, URL resolution, DRF's settings and authentication: a 401, nothing
    recorded, no query, though the view's transaction opens a database connection, closed
    again here) and build the reverse map of the URLs a response links to. Returns the
    status code (a 500, logged by Django, when the database is down at boot), or None when
    the warm-up raised (logged). Either way the process serves: a cold first request is
    slow, not wrong."""
    from django.conf import settings
    from django.db import connections
    from django.urls import reverse

    hosts = [h for h in settings.ALLOWED_HOSTS if h and "*" not in h]
    host = hosts[0].lstrip(".") if hosts else "localhost"
    scheme = "https" if settings.SECURE_SSL_REDIRECT else "http"
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": "/api/v1/runs/", "QUERY_STRING": "", "SCRIPT_NAME": "",
        "SERVER_NAME": host, "SERVER_PORT": "443" if scheme == "https" else "80", "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": host, "HTTP_ACCEPT": "application/json", "REMOTE_ADDR": "127.0.0.1",
        "wsgi.version": (1, 0), "wsgi.url_scheme": scheme, "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": io.StringIO(), "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }
    if scheme == "https" and settings.SECURE_PROXY_SSL_HEADER:
        header, value = settings.SECURE_PROXY_SSL_HEADER
        environ[header] = value
    statuses: list[str] = []
    try:
        body = app(environ, lambda status, headers, exc_info=None: statuses.append(status))
        for _chunk in body:
            pass
        if hasattr(body, "close"):
            body.close()
        reverse("api:run-detail", kwargs={"pk": uuid.UUID(int=0)})
    except Exception:  # noqa: BLE001 - never keep a worker from serving
        log.warning("web process warm-up failed; its first request will be slower", exc_info=True)
        return None
    finally:
        # This thread serves no request: it keeps no connection (one it did not open, in a
        # transaction, is its caller's).
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:
                conn.close()
    return int(statuses[0].split()[0]) if statuses else None


def _warm_up_on() -> bool:
    from django.conf import settings

    return settings.FLOWFORGE_WEB_WARM_UP


if _warm_up_on():
    warm_up(application)
