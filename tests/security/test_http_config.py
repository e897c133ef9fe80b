"""Malformed http task configs are refused when the definition is validated (found by a
hostile review after issue 14's fixes): a URL that cannot be parsed gave a 500 to a viewer,
and a port out of range, a control character in the host, a CR/LF in a header value or a
pseudo-header name were stored and failed only at run time.

Each test is the request a viewer (validate) or a member (apply) sends; each must be a 400
``invalid_definition`` naming the field, with nothing stored.
"""

from __future__ import annotations

import pytest

from engine.models import Workflow
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem
from tests.unit.test_api_workflows import Api, new_api_factory


@pytest.fixture
def api(make_org) -> Api:
    factory = new_api_factory(make_org)
    yield next(factory)()
    next(factory, None)  # the factory's clean-up


def http_task(**config) -> dict:
    return {"name": "probe", "tasks": [{"key": "call", "type": "http", "config": config}]}


BAD_URLS = {
    "unclosed-ipv6": ("http://[::1", "Invalid IPv6 URL"),
    "bare-bracket": ("http://[", "Invalid IPv6 URL"),
    "port-too-big": ("https://example.com:99999/", "Port out of range"),
    "negative-port": ("https://example.com:-1/", "-1"),
    "nul-host": ("http://\x00/", "non-printable"),
    "ipvfuture": ("http://[v1.x]/", "Invalid IPv6 address"),
}


@pytest.mark.parametrize("case", sorted(BAD_URLS))
def test_a_viewer_validating_an_unparseable_url_gets_a_400_naming_the_url(api, case):
    url, reason = BAD_URLS[case]
    body = assert_problem(api.post("/api/v1/workflows/validate/", http_task(url=url), role=Role.VIEWER), 400)
    assert body["code"] == "invalid_definition"
    (error,) = body["errors"]
    assert error["path"] == "tasks[call].config"
    assert "'url' is not a valid URL" in error["message"] and reason in error["message"], error


@pytest.mark.parametrize("headers, message", [
    ({"X-A": "b\r\nHost: evil"}, "the value of 'X-A' may not contain CR, LF or NUL"),
    ({"X-A": "b\x00"}, "the value of 'X-A' may not contain CR, LF or NUL"),
    ({":authority": "internal"}, "':authority' is not a valid header name"),
    ({"Host ": "internal"}, "'Host ' is not a valid header name"),
])
def test_a_member_cannot_apply_headers_that_smuggle_or_pseudo_headers(api, headers, message):
    response = api.post("/api/v1/workflows/", http_task(url="https://example.com/", headers=headers),
                        role=Role.MEMBER)
    body = assert_problem(response, 400)
    assert body["code"] == "invalid_definition"
    assert any(message in e["message"] for e in body["errors"]), body["errors"]
    assert not Workflow.objects.unscoped().filter(name="probe").exists()


def test_a_long_bad_url_is_not_echoed_whole(api):
    url = "http://[" + "a" * 100_000
    body = assert_problem(api.post("/api/v1/workflows/validate/", http_task(url=url), role=Role.VIEWER), 400)
    (error,) = body["errors"]
    assert "(100008 characters)" in error["message"] and len(error["message"]) < 400, error["message"][:300]
