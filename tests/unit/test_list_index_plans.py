"""The newest-first lists of members, pending invitations and API keys are read in
index order (docs/api.md, Pagination: "found with an index range scan"): the query each
list runs, first page and a later one, is planned as a scan of its own index with no Sort,
so page 500 costs what page 1 costs. Before tenancy migration 0010 these lists were read
through the organization's foreign-key index and sorted whole on every page."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tenancy.models import Role
from tests.unit.test_api_pagination import data_queries
from tests.unit.test_api_workflows import Api, new_api_factory

ROWS = 60  # more than a page of 50, so the first page has a next link


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


def _add_rows(api: Api) -> None:
    """ROWS members (each a user of its own), ROWS pending invitations and ROWS revoked keys,
    created a millisecond apart, in plain INSERTs (no mail, no Argon2 hash)."""
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with connection.cursor() as cur:
        for i in range(ROWS):
            at = base + dt.timedelta(milliseconds=i)
            user_id = uuid.uuid4()
            cur.execute("INSERT INTO core_user (id, password, is_superuser, email, is_staff, is_active, date_joined,"
                        " name) VALUES (%s, '!', false, %s, false, true, %s, '')",
                        [user_id, f"m{i}-{user_id.hex[:6]}@list.example", at])
            cur.execute("INSERT INTO core_membership (id, organization_id, user_id, role, created_at)"
                        " VALUES (%s, %s, %s, 'member', %s)", [uuid.uuid4(), api.org.pk, user_id, at])
            cur.execute("INSERT INTO core_invitation (id, organization_id, email, role, token_hash, created_at,"
                        " expires_at) VALUES (%s, %s, %s, 'member', %s, %s, now() + interval '7 days')",
                        [uuid.uuid4(), api.org.pk, f"i{i}@list.example", uuid.uuid4().hex + uuid.uuid4().hex, at])
            cur.execute("INSERT INTO core_apikey (id, organization_id, name, prefix, hashed_key, role, created_at,"
                        " revoked_at) VALUES (%s, %s, %s, %s, '!', 'member', %s, now())",
                        [uuid.uuid4(), api.org.pk, f"key {i}", uuid.uuid4().hex[:12], at])
        cur.execute("ANALYZE core_membership, core_invitation, core_apikey")


def _list_query(api: Api, path: str, table: str) -> tuple[str, str | None]:
    """The SQL the list ran against ``table`` for ``path`` (as executed, parameters
    inlined) and the next page's URL."""
    with CaptureQueriesContext(connection) as captured:
        response = api.get(path)
    assert response.status_code == 200, response.content
    ordered = [q for q in data_queries(captured) if f'FROM "{table}"' in q and "ORDER BY" in q]
    assert ordered, data_queries(captured)
    return ordered[-1], response.json()["next"]


def _plan(sql: str) -> str:
    """EXPLAIN of ``sql`` with sequential and bitmap scans and sorts priced out: the tables
    are small here, and the question is whether an index can give the rows in the list's
    order (a plan keeps its Sort when none can), not which plan is cheapest at this size."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off")
        cur.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cur.fetchall())


@pytest.mark.parametrize(("path", "table", "index"), [
    ("/api/v1/members/", "core_membership", "idx_membership_org_recent"),
    ("/api/v1/invitations/", "core_invitation", "idx_invitation_org_pending"),
    ("/api/v1/api-keys/", "core_apikey", "idx_apikey_org_recent"),
])
def test_each_page_of_a_newest_first_list_is_an_index_scan_without_a_sort(api_factory, path, table, index):
    api = api_factory()
    _add_rows(api)
    first, next_url = _list_query(api, path, table)
    assert next_url is not None
    second, _ = _list_query(api, next_url.split("testserver", 1)[-1], table)
    for sql in (first, second):
        plan = _plan(sql)
        assert f"Index Scan using {index}" in plan, plan
        assert "Sort" not in plan, plan


def test_the_lists_still_answer_newest_first(api_factory):
    api = api_factory()
    _add_rows(api)
    response = api.get("/api/v1/members/", role=Role.OWNER)
    created = [m["joined_at"] for m in response.json()["results"]]
    assert created == sorted(created, reverse=True) and len(created) == 50
