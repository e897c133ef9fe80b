"""The workers page and a run page's no-live-worker warning in real Chromium (issue 18,
item 6): the queue a task waits on with no live worker is flagged on both pages, the
warning goes once a worker polls the queue, the log lines the worker then sends show on
the run page, escaped, and no page breaks the CSP. Screenshots:
test-artifacts/screenshots/workers.png, run-waiting-on-worker.png and run-worker-logs.png.

No Dramatiq worker is needed: a worker task waits on its queue until one of the
organization's own workers polls it, and the polls are recorded as they would be."""

from __future__ import annotations

import datetime as dt

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client
from django.utils import timezone

from engine.models import WorkerConnection
from engine.repositories.worker_queues import note_worker_seen
from engine.services import apply_definition, start_run
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key
from tenancy.models import KeyRole, Role
from tenancy.services import create_organization
from tests.e2e.conftest import orm

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1440, "height": 900}


def setup() -> dict:
    """An organization whose run waits on the queue "images" (no live worker: its only
    worker polled ten minutes ago), and a live worker on "pdf"; the owner's session key."""
    org, owner, _ = create_organization(slug="acme", name="Acme Imaging", owner_email="ada@acme.example")
    actor = Actor(organization=org, role=Role.OWNER, user=owner, channel="web")
    workflow = apply_definition(actor=actor, document={"name": "thumbnails", "tasks": [
        {"key": "fetch", "type": "noop"},
        {"key": "resize", "type": "worker", "config": {"queue": "images", "name": "resize"}},
        {"key": "publish", "type": "noop", "depends_on": ["resize"]}]})
    apply_definition(actor=actor, document={"name": "reports", "tasks": [
        {"key": "render", "type": "worker", "config": {"queue": "pdf"}}]})
    run = start_run(workflow=workflow, actor=actor)
    row, worker_secret = create_api_key(actor=actor, name="box-7 workers", role=KeyRole.WORKER)
    for worker_id, queue, name, host in (("6b1f…-old", "images", "resizer-1", "box-7"),
                                         ("2c9e-pdf-1", "pdf", "pdf-renderer", "box-9")):
        note_worker_seen(organization_id=org.pk, worker_id=worker_id, queue=queue, name=name, host=host,
                         sdk="flowforge-python/0.1.0", concurrency=4, api_key_id=row.pk)
    WorkerConnection.objects.for_organization(org).filter(queue="images").update(
        last_seen_at=timezone.now() - dt.timedelta(minutes=10))
    session = SessionStore()
    session[SESSION_KEY] = str(owner.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = owner.get_session_auth_hash()
    session.create()
    return {"org": org, "run": run, "worker_key": row, "worker_secret": worker_secret,
            "session": session.session_key}


def test_the_workers_page_and_the_run_page_flag_a_queue_without_a_live_worker(live_server, browser, screenshots):
    data = orm(setup)
    base = live_server.url
    context = browser.new_context(viewport=VIEWPORT)
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": data["session"], "url": base}])
    page = context.new_page()
    # No live stream: its process-wide LISTEN connection would outlive the test and keep the
    # test database from being dropped (the page polls its fragment instead).
    page.route("**/stream/**", lambda route: route.abort())
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(base + "/workers/")
    assert page.locator("h1").inner_text() == "Workers"
    alert = page.locator(".no-worker-alert")
    assert alert.count() == 1 and alert.is_visible()
    assert "No worker is polling queue images" in alert.inner_text()
    images = page.locator("tr[data-queue='images']")
    assert images.locator("td").nth(1).inner_text() == "1"  # waiting
    assert images.locator(".badge.warn").inner_text() == "none"
    assert page.locator("tr[data-queue='pdf'] .badge.ok").inner_text() == "1"
    assert "Live" in page.locator("#queue-pdf tr[data-worker-id='2c9e-pdf-1']").inner_text()
    assert "10\u00a0m" in page.locator("#queue-images tr[data-worker-id='6b1f…-old']").inner_text()
    page.screenshot(path=str(screenshots / "workers.png"), full_page=True)

    run_url = f"{base}/runs/{data['run'].pk}/"
    page.goto(run_url)
    warning = page.locator("#task-resize .no-worker")
    assert warning.is_visible() and "No worker is polling queue images" in warning.inner_text()
    assert page.locator(".no-worker-alert").is_visible()
    page.screenshot(path=str(screenshots / "run-waiting-on-worker.png"), full_page=True)

    # A worker polls "images": the warning goes from both pages.
    orm(lambda: note_worker_seen(organization_id=data["org"].pk, worker_id="6b1f…-new", queue="images",
                                 name="resizer-2", host="box-8", sdk="flowforge-python/0.1.0", concurrency=4,
                                 api_key_id=data["worker_key"].pk))
    page.goto(run_url)
    assert page.locator(".no-worker").count() == 0 and page.locator(".no-worker-alert").count() == 0
    assert "images" in page.locator("#task-resize .worker-queue").inner_text()
    page.goto(base + "/workers/")
    assert page.locator(".no-worker-alert").count() == 0
    assert page.locator("tr[data-queue='images'] .badge.ok").inner_text() == "1"

    # The worker takes the task and sends log lines: the run page shows them, escaped.
    def work() -> str:
        client = Client(headers={"Authorization": f"Bearer {data['worker_secret']}"})
        task = client.post("/api/v1/worker/poll/", {"queue": "images", "wait_seconds": 0, "worker": {
            "id": "6b1f…-new", "name": "resizer-2"}}, content_type="application/json").json()["tasks"][0]
        lines = [{"level": "info", "message": "fetching https://example.com/a.png"},
                 {"level": "debug", "message": "640x480, 212 KiB"},
                 {"level": "warning", "message": "<b>not bold</b>: EXIF orientation ignored"},
                 {"level": "error", "message": "retrying the upload (1 of 3)"}]
        answer = client.post(f"/api/v1/worker/tasks/{task['task_run_id']}/logs/",
                             {"fencing_token": task["fencing_token"], "lines": lines},
                             content_type="application/json")
        assert answer.json() == {"accepted": 4}, answer.content
        return task["task_run_id"]

    orm(work)
    page.goto(run_url)
    log = page.locator("#log-resize")
    assert log.is_visible()
    assert "attempt 1 · generation 1" in log.inner_text()
    assert "<b>not bold</b>: EXIF orientation ignored" in log.locator(".level-warning").inner_text()
    assert log.locator("b").count() == 0
    assert page.locator("#task-resize .badge").inner_text() == "Running"
    page.locator("#log-resize").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "run-worker-logs.png"), full_page=True)
    assert not csp, csp
    context.close()
