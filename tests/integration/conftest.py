"""Integration fixtures: real Dramatiq worker processes and a real clock against the
test database and Redis.

The spawned processes connect to the database pytest-django created (its name is
read from the live connection), in a broker namespace unique to the test session,
with short leases so a killed worker's lease expires in seconds.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings
from django.db import connection

from flowforge.stack import Stack, wait_until

# Short leases and fast clock ticks so fault scenarios resolve in seconds.
LEASE_SECONDS = "3"
HEARTBEAT_SECONDS = "0.5"


def _database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def stack_env(transactional_db, tmp_path):
    """Environment for spawned processes: the test database, this session's broker
    namespace, short leases and fast clock periods."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_database_url(),
        REDIS_URL=settings.REDIS_URL,
        BROKER_URL=settings.BROKER_URL,
        BROKER_NAMESPACE=settings.BROKER_NAMESPACE,
        # The suite's settings (pytest-django put tests.settings there): its own task callables.
        DJANGO_SETTINGS_MODULE=os.environ["DJANGO_SETTINGS_MODULE"],
        FLOWFORGE_LEASE_SECONDS=LEASE_SECONDS,
        FLOWFORGE_DISPATCH_LEASE_SECONDS=LEASE_SECONDS,
        FLOWFORGE_HEARTBEAT_SECONDS=HEARTBEAT_SECONDS,
        # A killed worker process's prefetched messages are back within 3.5 s (issue 22).
        FLOWFORGE_BROKER_HEARTBEAT_SECONDS=HEARTBEAT_SECONDS,
        FLOWFORGE_BROKER_DEAD_AFTER_SECONDS="3",
        FLOWFORGE_CLOCK_SCHEDULE_SECONDS="0.5",
        FLOWFORGE_CLOCK_REAP_SECONDS="0.5",
        FLOWFORGE_CLOCK_RELAY_SECONDS="1",
        FLOWFORGE_REPORT_DIR=str(tmp_path / "reports"),
        # The deployment's default (tests/settings.py turns it off for the unit tests).
        FLOWFORGE_CLAIM_ON_START="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(autouse=True)
def claim_on_start(settings):
    """Runs started in the test process claim their roots at once, as a deployment's do."""
    settings.FLOWFORGE_CLAIM_ON_START = True


def flush_broker() -> None:
    """Delete this session's queues in Redis so no message of an earlier test is delivered."""
    if not settings.BROKER_URL.startswith("redis"):
        return
    client = redis.Redis.from_url(settings.BROKER_URL)
    # "<namespace>:", not "<namespace>*": another suite's namespace may start with this one's
    # (scripts/run-suite's live part is "<namespace>-live", in the same Redis db).
    for key in client.scan_iter(match=f"{settings.BROKER_NAMESPACE}:*"):
        client.delete(key)


@pytest.fixture
def stack(stack_env, tmp_path, request):
    """A Stack to start workers/clock with; everything is stopped at the end of the test
    and the process logs are printed when the test failed."""
    flush_broker()
    s = Stack(env=stack_env, log_dir=Path(tmp_path) / "logs")
    yield s
    rep = getattr(request.node, "rep_call", None)
    # The test is over: a graceful stop only costs its 2-3 s, except for a failed test, whose
    # report prints the logs (a killed worker's last lines may still be in its pipe).
    s.stop_all(graceful=rep is not None and rep.failed)
    if rep is not None and rep.failed:
        s.print_logs()
    flush_broker()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def wait_for_run_terminal(run, *, timeout: float = 60.0) -> str:
    """Poll until ``run`` is terminal; return its state (TimeoutError otherwise)."""

    def done():
        run.refresh_from_db(fields=["state", "finished_at"])
        return run.state if run.is_terminal else None

    return wait_until(done, timeout=timeout, interval=0.1, what=f"run {run.pk} to finish")


__all__ = ["flush_broker", "wait_for_run_terminal", "uuid"]


def start_web(stack) -> str:
    """Start gunicorn (``Stack.start_web``, as make run does) on a free port of loopback and
    return its base URL once ``/healthz`` answers 200."""
    from flowforge.stack import wait_until
    from tests.faults.servers import free_port

    port = free_port()
    stack.start_web(bind=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30, what="gunicorn")
    return base
