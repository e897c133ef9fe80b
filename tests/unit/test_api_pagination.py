"""Keyset pagination of GET /api/v1/runs/ under concurrent inserts (seed 001): paging
through 1,000 runs, twelve of which share one millisecond, while another thread starts
new runs, returns every pre-existing run exactly once — none skipped, none repeated —
in (created_at, id) order, at a constant number of queries per page."""

from __future__ import annotations

import datetime as dt
import threading
import uuid

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from api.pagination import decode_cursor, encode_cursor
from engine.models import WorkflowRun
from engine.services import apply_definition, start_run
from tenancy.models import Role
from tests.unit.test_api_workflows import Api, new_api_factory

RUNS = 1000
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# Rows SHARED_FROM .. SHARED_FROM+11 share the millisecond BASE + SHARED_FROM ms and
# differ only in microseconds (+0..11 µs).
SHARED_FROM, SHARED = 500, 12


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def data_queries(captured) -> list[str]:
    """Captured SQL minus transaction control (ATOMIC_REQUESTS' BEGIN/COMMIT or savepoints)."""
    return [q["sql"] for q in captured.captured_queries
            if not q["sql"].startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK"))]


def bulk_create_runs(workflow) -> set[str]:
    """RUNS runs of ``workflow`` in one INSERT ... SELECT (no task runs: the list does not
    read them). Run i is created at BASE + i ms, except the SHARED rows. Returns their ids."""
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO core_workflowrun
                (id, organization_id, workflow_id, state, input, trigger_source, error, last_event_seq,
                 created_at, started_at)
            SELECT gen_random_uuid(), %(org)s, %(wf)s, 'running', '{}'::jsonb, 'api', '', 0, t, t
            FROM generate_series(1, %(n)s) AS i,
                 LATERAL (SELECT CASE
                     WHEN i >= %(from)s AND i < %(from)s + %(shared)s
                     THEN %(base)s::timestamptz + make_interval(secs => %(from)s / 1000.0)
                          + (i - %(from)s) * interval '1 microsecond'
                     ELSE %(base)s::timestamptz + i * interval '1 millisecond' END AS t) AS c
            RETURNING id
            """,
            {"org": workflow.organization_id, "wf": workflow.pk, "n": RUNS, "from": SHARED_FROM,
             "shared": SHARED, "base": BASE},
        )
        return {str(r[0]) for r in cur.fetchall()}


def shared_millisecond_rows(org) -> list[WorkflowRun]:
    start = BASE + dt.timedelta(milliseconds=SHARED_FROM)
    return list(WorkflowRun.objects.for_organization(org).filter(
        created_at__gte=start, created_at__lt=start + dt.timedelta(milliseconds=1)))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page_size", [7, 50])
def test_paging_1000_runs_while_others_are_started_returns_each_exactly_once(api_factory, page_size):
    api = api_factory()
    wf = apply_definition(organization=api.org, document={"name": "bulk", "tasks": [{"key": "a", "type": "noop"}]})
    existing = bulk_create_runs(wf)
    assert len(existing) == RUNS
    shared = shared_millisecond_rows(api.org)
    assert len(shared) == SHARED and len({r.created_at for r in shared}) == SHARED

    stop = threading.Event()
    inserted: list[str] = []

    def insert_new_runs():
        try:
            while not stop.is_set():
                inserted.append(str(start_run(workflow=wf, trigger_source="api").pk))
        finally:
            connections.close_all()

    inserter = threading.Thread(target=insert_new_runs)
    inserter.start()
    try:
        seen: list[dict] = []
        url = f"/api/v1/runs/?page_size={page_size}"
        pages = 0
        while url:
            with CaptureQueriesContext(connection) as queries:
                response = api.get(url, role=Role.VIEWER)
            assert response.status_code == 200, response.content
            if pages:  # the first request also verified the key with Argon2
                assert len(data_queries(queries)) == 2, data_queries(queries)
            body = response.json()
            assert len(body["results"]) <= page_size
            seen += body["results"]
            url = body["next"]
            pages += 1
    finally:
        stop.set()
        inserter.join(30)

    ids = [r["id"] for r in seen]
    assert len(inserted) > 0, "the inserter never ran"
    assert len(ids) == len(set(ids)), "a run was returned twice"
    missing = existing - set(ids)
    assert not missing, f"{len(missing)} pre-existing runs were skipped"
    # Runs started after paging began are newer than every cursor: at most those on page 1.
    assert set(ids) - existing <= set(inserted)
    keys = [(dt.datetime.fromisoformat(r["created_at"].replace("Z", "+00:00")), uuid.UUID(r["id"])) for r in seen]
    assert keys == sorted(keys, reverse=True), "not newest first"
    assert pages >= RUNS // page_size


def test_a_cursor_keeps_microseconds_so_rows_sharing_a_millisecond_are_not_skipped(api):
    wf = apply_definition(organization=api.org, document={"name": "ms", "tasks": [{"key": "a", "type": "noop"}]})
    bulk_create_runs(wf)
    shared = sorted(shared_millisecond_rows(api.org), key=lambda r: (r.created_at, r.pk), reverse=True)
    top = shared[0]
    cursor = encode_cursor(top.created_at, top.pk)
    assert decode_cursor(cursor) == (top.created_at, top.pk)
    body = api.get(f"/api/v1/runs/?page_size={SHARED - 1}&cursor={cursor}").json()
    assert [r["id"] for r in body["results"]] == [str(r.pk) for r in shared[1:]]
    # What the cursor must not do: at millisecond precision it sorts before the row it came
    # from, and every row between (here eleven of the twelve) would be skipped.
    ms = top.created_at.replace(microsecond=top.created_at.microsecond // 1000 * 1000)
    truncated = encode_cursor(ms, top.pk)
    after_truncated = {r["id"] for r in api.get(f"/api/v1/runs/?page_size={SHARED}&cursor={truncated}").json()["results"]}
    between = {str(r.pk) for r in shared[1:] if r.created_at > ms}
    assert len(between) == SHARED - 2 and not between & after_truncated
