"""Finding 7a of issue 14: a cursor or a ``created_after``/``created_before`` filter
whose UTC offset is beyond what PostgreSQL's timestamptz holds (±15:59) was passed
through to the database and answered with a 500 on every newest-first list. The
attack is a hand-made query string; the answer must be a 400 naming the parameter."""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import uuid

import pytest
from django.test import Client

from tenancy.models import Role
from tests.unit.test_api_org import PROBLEM, acme, org_factory  # noqa: F401 (fixtures)
from tests.unit.test_web_runs import client_for, make_run, owner_of

# Offsets Python's ISO parser accepts but no time zone has (PostgreSQL refuses beyond ±15:59).
OFFSETS = ["+20:00", "-23:59", "+16:00"]


def forged_cursor(offset: str) -> str:
    """A cursor in the shape api.pagination issues, with a foreign UTC offset."""
    data = {"t": f"2026-01-05T10:00:00.000001{offset}", "id": str(uuid.uuid4())}
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


API_LISTS = ["/api/v1/runs/", "/api/v1/members/", "/api/v1/invitations/", "/api/v1/audit-events/"]
API_FILTERS = {"/api/v1/runs/": ["created_after", "created_before"],
               "/api/v1/audit-events/": ["created_after", "created_before"]}


def assert_api_400_naming(response, param: str) -> None:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert response["Content-Type"] == PROBLEM
    errors = response.json()["errors"]
    assert param in errors, errors


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("path", API_LISTS)
def test_api_list_refuses_a_cursor_with_an_impossible_utc_offset(client, acme, path, offset):  # noqa: F811
    make_run(acme.org, 1)
    response = client.get(path, {"cursor": forged_cursor(offset)}, headers=acme.as_(Role.OWNER))
    assert_api_400_naming(response, "cursor")


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize(("path", "param"), [(p, f) for p, fs in API_FILTERS.items() for f in fs])
def test_api_list_refuses_a_created_filter_with_an_impossible_utc_offset(client, acme, path, param, offset):  # noqa: F811
    make_run(acme.org, 1)
    response = client.get(path, {param: f"2026-01-05T10:00:00{offset}"}, headers=acme.as_(Role.OWNER))
    assert_api_400_naming(response, param)


@pytest.fixture
def client() -> Client:
    return Client()


WEB_PAGES = ["/runs/", "/audit/"]


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("param", ["older_than", "newer_than"])
@pytest.mark.parametrize("path", WEB_PAGES)
def test_web_list_refuses_a_page_link_with_an_impossible_utc_offset(org, path, param, offset):
    make_run(org, 1)
    response = client_for(owner_of(org)).get(path, {param: forged_cursor(offset)})
    assert response.status_code == 400
    assert "That page link has expired or is not valid" in html.unescape(response.content.decode())


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("param", ["created_after", "created_before"])
@pytest.mark.parametrize("path", WEB_PAGES)
def test_web_list_refuses_a_date_filter_with_an_impossible_utc_offset(org, path, param, offset):
    make_run(org, 1)
    response = client_for(owner_of(org)).get(path, {param: f"2026-01-05T10:00{offset}"})
    assert response.status_code == 400
    body = html.unescape(response.content.decode())
    # The form error sits under the field it names.
    assert "The UTC offset must be between -15:59 and +15:59." in body
    assert f'name="{param}"' in body


def test_in_range_offsets_still_filter(org):
    run = make_run(org, 1)
    client = client_for(owner_of(org))
    before = (run.created_at + dt.timedelta(minutes=1)).astimezone(dt.timezone(dt.timedelta(hours=14)))
    response = client.get("/runs/", {"created_before": before.isoformat(timespec="seconds")})
    assert response.status_code == 200
    assert str(run.pk) in response.content.decode()


@pytest.mark.parametrize("path", ["/api/v1/runs/", "/api/v1/audit-events/"])
def test_api_filter_at_the_edge_of_the_calendar_is_a_400(client, acme, path):  # noqa: F811
    response = client.get(path, {"created_after": "0001-01-01T00:00:00+05:00"}, headers=acme.as_(Role.OWNER))
    assert_api_400_naming(response, "created_after")


@pytest.mark.parametrize("path", WEB_PAGES)
def test_web_filter_at_the_edge_of_the_calendar_is_a_form_error(org, path):
    response = client_for(owner_of(org)).get(path, {"created_before": "9999-12-31T23:00-05:00"})
    assert response.status_code == 400
    assert "The instant is out of range once converted to UTC." in html.unescape(response.content.decode())
