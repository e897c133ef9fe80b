"""Issue 14, finding 3 (server-sent event streams), written as the attacks:

- one API key (or one web user) opens more streams than FLOWFORGE_SSE_PER_PRINCIPAL, and
  the keys of one organization together more than FLOWFORGE_SSE_PER_ORG: 429s naming
  the limit, with Retry-After;
- streams opened by different principals against one real gunicorn worker of 4 threads:
  only FLOWFORGE_SSE_PER_PROCESS get through, so /healthz keeps answering (4 streams froze
  such a server);
- a key revoked (a member removed) while its stream is open: the stream ends within the
  re-authorization interval and delivers nothing committed after it;
- N open streams in one process hold one LISTEN connection (the hub's), not N.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings
from django.db import connection, connections, transaction

from engine import live_hub
from engine.repositories import events
from engine.services import apply_definition, cancel_run, start_run
from flowforge.stack import Stack, bin_path, wait_until
from tenancy import apikeys
from tenancy.actors import Actor
from tenancy.models import ApiKey, Membership, Role
from tenancy.services import remove_member
from tests.faults.servers import free_port
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory
from tests.unit.test_web_runs import client_for, make_run, member, owner_of

TASKS = [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}]
ROLES = [Role.VIEWER, Role.MEMBER, Role.ADMIN, Role.OWNER]


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


def running_run(org):
    """A run that stays running: nothing executes its tasks in these tests."""
    wf = apply_definition(organization=org, document={"name": f"live-{uuid.uuid4().hex[:6]}", "tasks": TASKS})
    return start_run(workflow=wf, trigger_source="api")


def api_stream(client, run, key):
    return client.get(f"/api/v1/runs/{run.pk}/events/stream/", headers={**bearer(key), "Accept": "text/event-stream"})


def owner_actor(org) -> Actor:
    membership = Membership.objects.for_organization(org).get(role=Role.OWNER)
    return Actor(organization=org, role=Role.OWNER, user=membership.user, channel="api")


def hub_connections() -> int:
    """Backends of the test database named as the listener hub's LISTEN connection."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s", [live_hub.APPLICATION_NAME])
        return cur.fetchone()[0]


def backends() -> int:
    """Every backend connected to the test database (this process's and any other's)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cur.fetchone()[0]


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def close_all(responses) -> None:
    for response in responses:
        response.close()  # what the WSGI server does when the client goes away


# --- caps per principal and per organization ------------------------------------------------------


# Transactional: closing a response fires request_finished, which closes the connection.
@pytest.mark.django_db(transaction=True)
def test_one_api_key_cannot_open_more_streams_than_its_limit_nor_its_org_more_than_the_org_limit(
        api_factory, settings):
    settings.FLOWFORGE_SSE_PER_PROCESS = 100  # this test is about the deployment-wide limits
    settings.FLOWFORGE_SSE_PER_PRINCIPAL = 5
    settings.FLOWFORGE_SSE_PER_ORG = 8
    api, other = api_factory(), api_factory()
    run, other_run = running_run(api.org), running_run(other.org)
    held = []
    try:
        for _ in range(5):
            response = api_stream(api.client, run, api.keys[Role.VIEWER])
            assert response.status_code == 200
            held.append(response)
        refused = api_stream(api.client, run, api.keys[Role.VIEWER])
        assert refused.status_code == 429
        assert refused["Content-Type"] == "application/problem+json"
        assert int(refused["Retry-After"]) > 0
        body = refused.json()
        assert body["status"] == 429 and body["code"] == "too_many_streams"
        assert "5 open event streams" in body["detail"] and "FLOWFORGE_SSE_PER_PRINCIPAL" in body["detail"]

        # A second key of the same organization: the organization's total stops it at 8.
        for _ in range(3):
            response = api_stream(api.client, run, api.keys[Role.MEMBER])
            assert response.status_code == 200
            held.append(response)
        refused = api_stream(api.client, run, api.keys[Role.MEMBER])
        assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
        detail = refused.json()["detail"]
        assert "8 open event streams" in detail and "FLOWFORGE_SSE_PER_ORG" in detail

        # Another organization is not affected by this one's streams.
        response = api_stream(other.client, other_run, other.keys[Role.VIEWER])
        assert response.status_code == 200
        held.append(response)
    finally:
        close_all(held)
    # Closing the streams gave the slots back.
    again = api_stream(api.client, run, api.keys[Role.VIEWER])
    try:
        assert again.status_code == 200
    finally:
        again.close()


@pytest.mark.django_db(transaction=True)
def test_one_web_user_cannot_open_more_run_page_streams_than_the_limit(make_org, settings):
    settings.FLOWFORGE_SSE_PER_PROCESS = 100
    settings.FLOWFORGE_SSE_PER_PRINCIPAL = 5
    settings.FLOWFORGE_SSE_PER_ORG = 20
    org = make_org()
    run = make_run(org, 2)
    client = client_for(owner_of(org))
    held = []
    try:
        for _ in range(5):
            response = client.get(f"/runs/{run.pk}/stream/")
            assert response.status_code == 200
            held.append(response)
        refused = client.get(f"/runs/{run.pk}/stream/")
        assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
        text = refused.content.decode()
        assert "5 open event streams" in text and "FLOWFORGE_SSE_PER_PRINCIPAL" in text
    finally:
        close_all(held)


# --- re-authorization -----------------------------------------------------------------------------


class Consumer:
    """Reads a streaming response on a thread, recording (monotonic time, chunk)."""

    def __init__(self, open_response):
        self.received: list[tuple[float, bytes]] = []
        self.finished = threading.Event()
        self.ended_at: float | None = None
        self.status = None
        self._open = open_response
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            response = self._open()
            self.status = response.status_code
            try:
                for chunk in response.streaming_content:
                    self.received.append((time.monotonic(), chunk))
            finally:
                response.close()
        finally:
            self.ended_at = time.monotonic()
            self.finished.set()
            connections.close_all()

    def text(self) -> str:
        return b"".join(c for _, c in self.received).decode()


def commit_events(run, *, seconds: float, every: float = 0.1) -> list[tuple[float, int]]:
    """Commit a note event on ``run`` every ``every`` seconds for ``seconds``: [(time, seq)]."""
    committed = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with transaction.atomic():
            seq = events.append(workflow_run_id=run.pk, kind="duplicate_delivery_ignored")
        committed.append((time.monotonic(), seq))
        time.sleep(every)
    return committed


REAUTH = 1.0
SLACK = 1.5


@pytest.mark.django_db(transaction=True)
def test_a_revoked_keys_open_stream_ends_within_the_reauth_interval_and_delivers_nothing_after(
        api_factory, settings):
    settings.FLOWFORGE_SSE_REAUTH_SECONDS = REAUTH
    api = api_factory()
    run = running_run(api.org)
    consumer = Consumer(lambda: api_stream(api.client, run, api.keys[Role.VIEWER]))
    try:
        assert wait_for(lambda: any(b"id: 1\n" in c for _, c in consumer.received)), consumer.received
        first = commit_events(run, seconds=0.5)  # the stream is live: these arrive
        assert wait_for(lambda: f"id: {first[-1][1]}\n" in consumer.text()), consumer.text()

        row = ApiKey.objects.for_organization(api.org).get(prefix=apikeys.parse_key(api.keys[Role.VIEWER])[0])
        apikeys.revoke_api_key(actor=owner_actor(api.org), api_key=row)  # what DELETE /api-keys/<id>/ calls
        revoked_at = time.monotonic()
        after = commit_events(run, seconds=REAUTH + SLACK + 0.5)

        assert consumer.finished.wait(5), "the revoked key's stream is still open"
        assert consumer.ended_at - revoked_at <= REAUTH + SLACK
        delivered = {int(line[4:]) for line in consumer.text().splitlines() if line.startswith("id: ")}
        late = {seq for at, seq in after if at >= revoked_at + REAUTH}
        assert late, "no event was committed after the re-authorization interval"
        assert not delivered & late, sorted(delivered & late)
    finally:
        consumer.finished.wait(10)


@pytest.mark.django_db(transaction=True)
def test_a_removed_members_run_page_stream_ends_within_the_reauth_interval(make_org, settings):
    settings.FLOWFORGE_SSE_REAUTH_SECONDS = REAUTH
    org = make_org()
    run = make_run(org, 2)
    viewer = member(org, Role.VIEWER)
    client = client_for(viewer)
    consumer = Consumer(lambda: client.get(f"/runs/{run.pk}/stream/"))
    try:
        assert wait_for(lambda: b"event: change" in b"".join(c for _, c in consumer.received)), consumer.received
        remove_member(actor=owner_actor(org), membership=Membership.objects.for_organization(org).get(user=viewer))
        removed_at = time.monotonic()
        after = commit_events(run, seconds=REAUTH + SLACK + 0.5, every=0.2)

        assert consumer.finished.wait(5), "the removed member's stream is still open"
        assert consumer.ended_at - removed_at <= REAUTH + SLACK
        text = consumer.text()
        assert "event: end" in text and '"state":"unauthorized"' in text
        changes = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
        late = {seq for at, seq in after if at >= removed_at + REAUTH}
        assert late and not set(changes) & late, (changes, sorted(late))
    finally:
        consumer.finished.wait(10)


# --- one LISTEN connection per process ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_open_streams_in_one_process_share_one_listen_connection_and_hold_no_other(api_factory, settings):
    settings.FLOWFORGE_SSE_PER_PROCESS = 100
    api = api_factory()
    runs = [running_run(api.org) for _ in range(2)]
    assert wait_for(lambda: hub_connections() == 0)  # no stream open yet
    before = backends()
    consumers = [Consumer(lambda run=run, role=role: api_stream(api.client, run, api.keys[role]))
                 for run in runs for role in (Role.VIEWER, Role.MEMBER)]
    try:
        assert wait_for(lambda: all(b"id: 1\n" in c.text().encode() for c in consumers)), [
            c.received for c in consumers]
        time.sleep(0.5)  # every stream is waiting now
        assert hub_connections() == 1
        # 4 streams, and only the hub's connection more than before: no LISTEN connection
        # per stream, no Django connection held by a waiting stream.
        assert backends() - before <= 1, backends() - before
        # Still live through the shared connection.
        with transaction.atomic():
            seq = events.append(workflow_run_id=runs[0].pk, kind="duplicate_delivery_ignored")
        assert wait_for(lambda: all(f"id: {seq}\n" in c.text() for c in consumers[:2]))
    finally:
        close_all_consumers(consumers, runs)
    assert wait_for(lambda: hub_connections() == 0)


def close_all_consumers(consumers, runs) -> None:
    """End the test client's streams (they end with their run) and wait for them."""
    for run in runs:
        cancel_run(run=run)
    for c in consumers:
        assert c.finished.wait(10), "a stream did not end with its run"


# --- the per-process cap, on a real server ---------------------------------------------------------


def _database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_streams_beyond_the_process_cap_are_refused_so_healthz_keeps_a_thread(api_factory, tmp_path):
    api = api_factory()
    run = running_run(api.org)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWFORGE_SSE_")}  # the defaults
    env.update(DATABASE_URL=_database_url(), REDIS_URL=django_settings.REDIS_URL,
               BROKER_URL=django_settings.BROKER_URL, BROKER_NAMESPACE=django_settings.BROKER_NAMESPACE,
               PYTHONUNBUFFERED="1")
    stack = Stack(env=env, log_dir=Path(tmp_path) / "logs")
    stack.start("web", [bin_path("gunicorn"), "flowforge.wsgi", "--workers", "1", "--worker-class", "gthread",
                        "--threads", "4", "--bind", f"127.0.0.1:{port}"])
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=httpx.Timeout(5.0))
    opened: list[httpx.Response] = []
    try:
        def up():
            try:
                return client.get("/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, what="gunicorn")
        statuses = []
        for role in ROLES:  # four principals: no one of them reaches its own limit
            request = client.build_request("GET", f"/api/v1/runs/{run.pk}/events/stream/",
                                           headers={**bearer(api.keys[role]), "Accept": "text/event-stream"})
            response = client.send(request, stream=True)
            opened.append(response)
            statuses.append(response.status_code)
        assert statuses == [200, 200, 429, 429], statuses
        for response in opened[2:]:
            response.read()
            assert int(response.headers["Retry-After"]) > 0
            detail = response.json()["detail"]
            assert "2 event streams" in detail and "FLOWFORGE_SSE_PER_PROCESS" in detail

        started = time.monotonic()
        health = client.get("/healthz", timeout=5)  # froze while 4 streams held the 4 threads
        assert health.status_code == 200 and time.monotonic() - started < 3
        # The server's two streams share one LISTEN connection.
        assert wait_for(lambda: hub_connections() == 1)
    finally:
        for response in opened:
            response.close()
        client.close()
        stack.stop_all()
        connections.close_all()
