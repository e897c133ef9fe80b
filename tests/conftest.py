"""Shared fixtures. Unit tests need PostgreSQL only; integration tests also start
real Dramatiq worker processes against Redis (see tests/integration/conftest.py)."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from engine.services import apply_definition
from tenancy.services import create_organization

_counter = itertools.count(1)


def pytest_configure(config):
    from tests import secret_registry

    secret_registry.install()


def pytest_sessionfinish(session, exitstatus):
    """Leave the test broker namespace empty: the clock's last ticks, Dramatiq's worker
    heartbeats and the metrics hashes of the suite's workers would otherwise stay in
    Redis (keys under ``<BROKER_NAMESPACE>:``, the suite's own namespace, only)."""
    from django.conf import settings

    # Never the deployment's default namespace (pytest run without the Makefile's test env).
    if not settings.configured or settings.BROKER_NAMESPACE in ("", "flowforge"):
        return
    import redis

    urls = {settings.REDIS_URL} | ({settings.BROKER_URL} if settings.BROKER_URL.startswith("redis") else set())
    for url in urls:
        try:
            client = redis.Redis.from_url(url)
            keys = list(client.scan_iter(match=f"{settings.BROKER_NAMESPACE}:*", count=1000))
            if keys:
                client.delete(*keys)
        except redis.RedisError:
            pass  # nothing to clean where Redis is gone


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, then the suite's own preparation of it; at the end,
    before it is dropped, the worker threads that keep connections to it are stopped.

    - One history partition for runs created from 2000 to the current period (migration
      0033 makes those from the current period on): tests make runs look old by moving
      their created_at, and such a run's later events need a partition to land in.
    - Refill threads (engine.worker.batching.Refiller) and log shippers are stopped at the
      session's end: an open connection of theirs would keep the database from being dropped.

    An override of ``django_db_setup``, not an autouse fixture: pytest-django creates the
    test database only for a test that uses it, and sets it up before that test's
    transaction opens. A selection with no such test (``pytest tests/unit/test_logs.py``)
    never touches the configured database; and partitions made inside the first test's
    transaction (an autouse fixture after a ``django_db`` mark's) would be rolled back with it."""
    from engine import partitions

    with django_db_blocker.unblock():
        partitions.ensure_range(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), partitions.floor(dt.datetime.now(dt.UTC)))
    yield
    from engine.worker.batching import Refiller
    from engine.worker.log_shipper import LogShipper

    Refiller.stop_all()
    LogShipper.stop_all()


def _transactional(request) -> bool:
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])):
        return True
    return bool({"transactional_db", "live_server"} & set(request.fixturenames))


@pytest.fixture(autouse=True)
def _no_failed_key_limit_across_tests(settings):
    """Every test's client comes from 127.0.0.1, so failed API key attempts of earlier
    tests would count against later ones within the same minute: the per-address limit
    is off unless a test turns it on (tests/unit/test_api_errors.py does)."""
    settings.FLOWFORGE_API_KEY_FAILURES_PER_MINUTE = 0


@pytest.fixture(autouse=True)
def _audit_log_flushable(request):
    """Let pytest-django empty core_auditlog (and core_auditcheckpoint) after a transactional test (and stop the
    worker refill threads first).

    The audit log's append-only trigger refuses TRUNCATE, which is how the test
    database is flushed between transactional tests. Only around that flush, and
    only in tests, the TRUNCATE trigger is disabled; every test starts with it on.
    """
    if not _transactional(request):
        yield
        return
    request.getfixturevalue("transactional_db")  # set up first, so its flush runs after our teardown
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_truncate")
        cur.execute("ALTER TABLE core_auditcheckpoint ENABLE TRIGGER ff_auditcheckpoint_no_truncate")
    yield
    from engine.worker.batching import Refiller
    from engine.worker.log_shipper import LogShipper

    # A refill thread started by this test's in-process batches may still be claiming:
    # its row locks would deadlock the flush's TRUNCATE (and a log shipper's connection too).
    Refiller.stop_all()
    LogShipper.stop_all()
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_truncate")
        cur.execute("ALTER TABLE core_auditcheckpoint DISABLE TRIGGER ff_auditcheckpoint_no_truncate")


@pytest.fixture
def make_org(db):
    """Factory: make_org(slug=None) -> Organization with an owner user."""

    def make(slug: str | None = None):
        slug = slug or f"org-{next(_counter)}"
        org, _user, _ = create_organization(slug=slug, name=slug.title(), owner_email=f"owner@{slug}.example")
        return org

    return make


@pytest.fixture
def org(make_org):
    return make_org()


@pytest.fixture
def make_workflow(db):
    """Factory: make_workflow(org, tasks, name="wf") -> Workflow (active)."""

    def make(org, tasks, name: str = "wf", **kwargs):
        return apply_definition(organization=org, document={"name": name, "tasks": tasks}, **kwargs)

    return make
