"""The real web server (gunicorn, as make run and the Docker image start it) serves
the pages' static files: the browser tests' live_server serves them by itself, so
only a test against gunicorn shows that the product is styled and scripted."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import start_web

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_gunicorn_serves_css_js_htmx_and_swagger_assets(stack):
    base = start_web(stack)
    login = httpx.get(f"{base}/accounts/login/")
    assert login.status_code == 200
    for path, ctype in [
        ("/static/frontend/app.css", "text/css"),
        ("/static/frontend/runs.css", "text/css"),
        ("/static/frontend/run-page.js", "javascript"),
        ("/static/django_htmx/htmx-2.min.js", "javascript"),
        ("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js", "javascript"),
    ]:
        response = httpx.get(base + path)
        assert response.status_code == 200, path
        assert ctype in response.headers["content-type"], (path, response.headers["content-type"])
        assert len(response.content) > 100, path
    assert '/static/frontend/app.css' in login.text
