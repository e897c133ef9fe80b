"""Browser tests: real Chromium (Debian's, never a downloaded one) driven by Python
Playwright against a real server with real Dramatiq workers and the clock.

- The server is pytest-django's ``live_server``: Django in a thread of this process,
  serving the test database (transactional, so the worker processes see every
  commit), static files included. Its mail goes to ``django.core.mail.outbox``, so a
  test reads the verification and invitation emails from there.
- ``e2e_stack`` starts one Dramatiq worker process and the clock against that test
  database and this session's broker namespace (the environment of the integration
  tests: short leases, fast clock ticks), and stops them at the end.
- ``browser`` launches Chromium from /usr/bin/chromium with Playwright's sync API.

Screenshots go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, connections

from flowforge.stack import BASE_DIR, Stack
from tests.integration.conftest import flush_broker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu"]
SCREENSHOTS = BASE_DIR / "test-artifacts" / "screenshots"


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: drives real Chromium against a live server with real workers")


def _database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def orm[T](fn: Callable[[], T]) -> T:
    """Run ``fn`` (ORM calls) in a thread of its own and close that thread's connections.

    Playwright's sync API runs an event loop in the test's thread: Django refuses ORM
    calls there ("async context"), and a connection opened in that context would be
    left open and block dropping the test database. A plain thread has neither problem.
    """

    def call() -> T:
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@pytest.fixture
def e2e_stack(live_server, tmp_path, request):
    """A worker and the clock against the live server's (test) database."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=_database_url(),
        REDIS_URL=settings.REDIS_URL,
        BROKER_URL=settings.BROKER_URL,
        BROKER_NAMESPACE=settings.BROKER_NAMESPACE,
        # The suite's settings (pytest-django put tests.settings there): its own task callables.
        DJANGO_SETTINGS_MODULE=os.environ["DJANGO_SETTINGS_MODULE"],
        FLOWFORGE_LEASE_SECONDS="5",
        FLOWFORGE_DISPATCH_LEASE_SECONDS="5",
        FLOWFORGE_HEARTBEAT_SECONDS="1",
        FLOWFORGE_CLOCK_SCHEDULE_SECONDS="0.5",
        FLOWFORGE_CLOCK_REAP_SECONDS="0.5",
        FLOWFORGE_CLOCK_RELAY_SECONDS="0.5",
        PYTHONUNBUFFERED="1",
    )
    flush_broker()
    stack = Stack(env=env, log_dir=Path(tmp_path) / "logs")
    stack.start_worker(processes=1, threads=8)
    stack.start_clock()
    yield stack
    rep = getattr(request.node, "rep_call", None)
    # The test is over: a graceful stop only costs its 2-3 s, except for a failed test, whose
    # report prints the logs (a killed worker's last lines may still be in its pipe).
    stack.stop_all(graceful=rep is not None and rep.failed)
    if rep is not None and rep.failed:
        stack.print_logs()
    flush_broker()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# --- event streams (issue 14, finding 3) ---
@pytest.fixture(autouse=True)
def _streams_per_process(settings):
    """The live server is Django's threaded test server in this process (a thread per
    request, no fixed pool to protect), and a page the browser left holds its stream
    until the next keep-alive write: let every page the test opens stream, as in a
    deployment with enough threads, instead of falling back to polling."""
    settings.FLOWFORGE_SSE_PER_PROCESS = 16


def session_for(user, organization=None) -> str:
    """The key of a new session signed in as ``user`` (with ``organization`` chosen): a test
    sets it as the session cookie instead of signing in through the form. Call it in ``orm``."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from tenancy.context import SESSION_KEY as ORGANIZATION_SESSION_KEY

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    if organization is not None:
        session[ORGANIZATION_SESSION_KEY] = str(organization.pk)
    session.create()
    return session.session_key


def signed_in_page(browser, base: str, session_key: str, *, width: int = 1280, height: int = 800,
                   javascript: bool = True):
    """A page of a new browser context with ``session_key`` as its session cookie; the messages
    of its console are collected in ``page.console_messages`` (a CSP refusal is one)."""
    context = browser.new_context(viewport={"width": width, "height": height}, java_script_enabled=javascript)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session_key, "url": base}])
    page = context.new_page()
    page.console_messages = []
    page.on("console", lambda message: page.console_messages.append(message.text))
    return page
