"""A web process warms itself up before it serves (flowforge/wsgi.py, issue 17): one
unauthenticated request through the WSGI application, which reads nothing from the
database and records nothing."""

from __future__ import annotations

import pytest
from django.urls import clear_url_caches


@pytest.mark.django_db
def test_warm_up_sends_one_unauthenticated_request_that_touches_no_table(django_assert_num_queries):
    from flowforge import wsgi

    clear_url_caches()
    with django_assert_num_queries(0):  # no read, so no write either (an audit record, a key's use)
        assert wsgi.warm_up(wsgi.application) == 401


def test_a_failing_warm_up_is_logged_and_returns_none(caplog):
    from flowforge import wsgi

    def broken(environ, start_response):
        raise RuntimeError("no database")

    assert wsgi.warm_up(broken) is None
    assert "warm-up failed" in caplog.text
