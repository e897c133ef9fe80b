"""The OpenAPI schema and docs views (kept apart from api.schema, which the REST
framework settings import while DRF views are being created)."""

from __future__ import annotations

import threading

from django.conf import settings
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

# --- the schema and docs views -------------------------------------------------------------------


class SchemaView(SpectacularAPIView):
    """GET /api/schema/ — the OpenAPI 3 document (YAML; ``?format=json`` for JSON).

    ``schema = None`` keeps this view (and DocsView) out of the endpoints the
    generator enumerates: otherwise their ``/api/`` paths would shorten the common
    path prefix to ``/api`` and every operation would be tagged ``v1``."""

    schema = None

    def _get_schema_response(self, request):
        # One generation at a time in a process: drf-spectacular loads its extensions'
        # target classes lazily and not thread-safely (an optional one whose package is
        # absent is set to None while another thread reads it: a 500 AttributeError under
        # gunicorn's threads when two clients asked for the first schema at once).
        with _GENERATION:
            return super()._get_schema_response(request)


_GENERATION = threading.Lock()


class DocsView(SpectacularSwaggerSplitView):
    """GET /api/docs/ — Swagger UI over SchemaView. The split view serves its start-up
    script as a file (``?script``), so the page needs no inline script under the
    site's Content-Security-Policy; Swagger UI's own assets come from
    ``SWAGGER_UI_DIST`` (drf-spectacular's default: a CDN), which ``docs_csp()``
    allows for this page only."""

    schema = None


def docs_csp() -> dict[str, list[str]]:
    """The Content-Security-Policy of the docs page: the site's policy plus Swagger
    UI's asset origin for scripts, styles and images, and inline styles (Swagger UI
    sets style attributes; scripts stay file-only)."""
    from urllib.parse import urlsplit

    from django.utils.csp import CSP
    from drf_spectacular.settings import spectacular_settings

    origins = []
    for url in (spectacular_settings.SWAGGER_UI_DIST, spectacular_settings.SWAGGER_UI_FAVICON_HREF):
        parts = urlsplit(str(url))
        if parts.scheme in ("http", "https") and parts.netloc:
            origins.append(f"{parts.scheme}://{parts.netloc}")
    origins = sorted(set(origins))
    policy = {key: list(value) for key, value in getattr(settings, "SECURE_CSP", {}).items()}
    policy["script-src"] = [CSP.SELF, *origins]
    policy["style-src"] = [CSP.SELF, CSP.UNSAFE_INLINE, *origins]
    policy["img-src"] = [CSP.SELF, "data:", *origins]
    policy["connect-src"] = [CSP.SELF]
    return policy


def docs_view():
    """The view function of /api/docs/ (DocsView with its own CSP)."""
    from django.views.decorators.csp import csp_override

    return csp_override(docs_csp())(DocsView.as_view(url_name="api-schema"))
