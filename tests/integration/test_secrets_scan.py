"""Issue 18, "Done when": a secret value set through the API appears in no API response,
page, event, output, error, log line or audit row after a run that used it in an http
header — with a real gunicorn, a real Dramatiq worker process and the clock — and a viewer
cannot read it.

The target is a local echo server that answers with the request it received (headers,
path with query, body): without redaction the task's output, and a failed attempt's
error, would hold the values. The scan looks for every spelling ``redact`` knows of each
value (engine.secret_refs.value_forms: as sent, percent-encoded, inside JSON text) in
every row of every table of the database (core_taskrun output and error,
core_taskrunevent detail, core_auditlog, core_outboxmessage payload and all the others,
each row as text), in every API response and page the test fetched, and in every log
line the web, worker and clock processes wrote.

The worker-task half: two worker tasks reference the secret in their input and are run by
an SDK worker process (the organization's own, which is handed the value: its log is not
scanned), whose handlers send it back in a log line, an output and a failure's error; the
server redacts all three before it stores them.
"""

from __future__ import annotations

import json
import secrets as pysecrets
import socket
import sys

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client as DjangoClient

from engine.models import TaskLog, TaskRun, WorkflowRun
from engine.secret_refs import value_forms
from flowforge.stack import wait_until
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import KeyRole, Membership, Role, Secret
from tests.echo_server import echo_server
from tests.integration.conftest import wait_for_run_terminal
from tests.integration.test_sdk_workers import APP as SDK_WORKER_APP

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tables_holding(needles: set[str]) -> dict[str, int]:
    """{table: rows whose text holds any of ``needles``} over every table of the schema."""
    found = {}
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename")
        tables = [r[0] for r in cur.fetchall()]
        for table in tables:
            for needle in needles:
                cur.execute(f'SELECT count(*) FROM "{table}" t WHERE strpos(t::text, %s) > 0', [needle])
                count = cur.fetchone()[0]
                if count:
                    found[table] = found.get(table, 0) + count
    return found


def test_a_secret_used_in_an_http_header_appears_nowhere_after_the_run(stack, stack_env, org):
    token = "sk_live_" + pysecrets.token_urlsafe(32)
    query_key = 'k"ey\\/+ ' + pysecrets.token_urlsafe(12)  # characters a URL and JSON text both escape
    owner = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    owner_actor = actor_for_membership(owner, channel="cli")
    _row, admin_key = create_api_key(actor=owner_actor, name="admin", role=Role.ADMIN)
    _row, viewer_key = create_api_key(actor=owner_actor, name="viewer", role=Role.VIEWER)

    stack.env["FLOWFORGE_EGRESS_ALLOW"] = "127.0.0.1/32"  # the echo server is on loopback
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    stack.start_web(bind=f"127.0.0.1:{port}")
    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)
    viewer = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {viewer_key}"}, timeout=30)

    def web_up():
        try:
            return admin.get("/api/v1/secrets/").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(web_up, timeout=30, interval=0.2, what="gunicorn to serve the API")
    responses: list[httpx.Response] = []

    def call(client: httpx.Client, method: str, url: str, **kwargs) -> httpx.Response:
        response = client.request(method, url, **kwargs)
        responses.append(response)
        return response

    # Set through the API: the responses are metadata only.
    assert call(admin, "PUT", "/api/v1/secrets/API_TOKEN/", json={"value": token}).status_code == 201
    assert call(admin, "PUT", "/api/v1/secrets/QUERY_KEY/", json={"value": query_key}).status_code == 201

    with echo_server() as echo:
        document = {"name": "calls-with-secrets", "tasks": [
            {"key": "call", "type": "http", "config": {
                "url": f"{echo.url}/echo?key={{{{ secrets.QUERY_KEY }}}}", "method": "POST",
                "headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}"},
                "json": {"token": "{{ secrets.API_TOKEN }}"}}},
            {"key": "refused", "type": "http", "max_attempts": 2, "retry_backoff_seconds": 0, "config": {
                "url": f"{echo.url}/status/502?key={{{{ secrets.QUERY_KEY }}}}",
                "headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}"}}},
            {"key": "after", "type": "python", "depends_on": ["call"], "config": {
                "callable": "tests.callables.echo", "params": {"factor": "{{ secrets.API_TOKEN }}"}}},
            {"key": "own", "type": "worker", "config": {
                "queue": "secret-q", "name": "leak", "input": {"token": "{{ secrets.API_TOKEN }}"}}},
            {"key": "own_fail", "type": "worker", "config": {
                "queue": "secret-q", "name": "leak_fail", "input": {"token": "{{ secrets.API_TOKEN }}"}}},
        ]}
        applied = call(admin, "POST", "/api/v1/workflows/", json=document)
        assert applied.status_code == 201, applied.text
        _row, worker_key = create_api_key(actor=owner_actor, name="own workers", role=KeyRole.WORKER)
        stack.start("sdk-worker", [sys.executable, SDK_WORKER_APP, base, worker_key, "secret-q", "quick"])
        workflow_id = applied.json()["id"]
        started = call(admin, "POST", "/api/v1/runs/", json={"workflow": workflow_id})
        assert started.status_code == 201, started.text
        run = WorkflowRun.objects.for_organization(org).get(pk=started.json()["id"])
        assert wait_for_run_terminal(run, timeout=60) == "failed"  # "refused" fails; the others succeed

        # The values were sent: without redaction the outputs and errors would hold them.
        assert sum(1 for r in echo.received if r["headers"].get("Authorization") == f"Bearer {token}") == 3
        assert any(json.loads(r["body"] or "{}") == {"token": token} for r in echo.received)

    states = {tr.task.key: (tr.state, tr.attempt) for tr in
              TaskRun.objects.for_organization(org).filter(workflow_run=run).select_related("task")}
    assert states == {"call": ("succeeded", 1), "refused": ("failed", 2), "after": ("succeeded", 1),
                      "own": ("succeeded", 1), "own_fail": ("failed", 1)}
    call_row = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="call")
    assert call_row.output["body"]["headers"]["Authorization"] == "Bearer [redacted]"
    own = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="own")
    assert own.output == {"echo": {"token": "[redacted]"}, "note": "used [redacted]"}
    assert [line.message for line in TaskLog.objects.for_organization(org).filter(task_run=own)] == [
        "calling with token [redacted]"]
    own_fail = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="own_fail")
    assert "the API refused token [redacted]" in own_fail.error

    # Every API response about the run, and the pages, as a member and as a viewer.
    for client in (admin, viewer):
        for url in (f"/api/v1/workflows/{workflow_id}/", "/api/v1/workflows/", f"/api/v1/runs/{run.pk}/",
                    "/api/v1/runs/", f"/api/v1/runs/{run.pk}/events/", f"/api/v1/runs/{run.pk}/events/stream/",
                    "/api/v1/secrets/", "/api/v1/secrets/API_TOKEN/", "/api/v1/secrets/QUERY_KEY/"):
            assert call(client, "GET", url).status_code == 200, url
        for task_run in TaskRun.objects.for_organization(org).filter(workflow_run=run):
            assert call(client, "GET", f"/api/v1/runs/{run.pk}/task-runs/{task_run.pk}/output/").status_code == 200
    assert call(admin, "GET", "/api/v1/audit-events/").status_code == 200
    assert "secret.created" in responses[-1].text
    # A viewer reads names and versions, and cannot set, rotate or delete.
    assert call(viewer, "GET", "/api/v1/secrets/API_TOKEN/").json()["version"] == 1
    assert call(viewer, "PUT", "/api/v1/secrets/API_TOKEN/", json={"value": "viewer-tries"}).status_code == 403
    assert call(viewer, "DELETE", "/api/v1/secrets/API_TOKEN/").status_code == 403
    django_client = DjangoClient()
    django_client.force_login(owner.user)  # a session the web process reads from the same store
    session = httpx.Client(base_url=base, timeout=30, cookies={
        settings.SESSION_COOKIE_NAME: django_client.cookies[settings.SESSION_COOKIE_NAME].value})
    for url in (f"/runs/{run.pk}/", f"/runs/{run.pk}/events/", f"/workflows/{workflow_id}/", "/secrets/"):
        assert call(session, "GET", url).status_code == 200, url
    for task_run in TaskRun.objects.for_organization(org).filter(workflow_run=run):
        assert call(session, "GET", f"/runs/{run.pk}/tasks/{task_run.pk}/output/").status_code == 200

    stack.stop_all()  # every log line written
    needles = value_forms(token) | value_forms(query_key)
    assert len(value_forms(query_key)) > 3  # the escaped spellings are really looked for
    leaked_responses = [(r.request.method, str(r.request.url)) for r in responses
                        if any(n in r.text for n in needles)]
    assert leaked_responses == []
    assert tables_holding(needles) == {}
    assert Secret.objects.for_organization(org).count() == 2  # the values are there, encrypted
    # The organization's own worker process was handed the value: its log is the organization's.
    logs = {proc.name: proc.log_path.read_text(errors="replace") for proc in stack.procs if proc.name != "sdk-worker"}
    assert "HTTP Request: POST" in logs["worker"] and "[redacted]" in logs["worker"]  # the attempts logged
    assert {name: [n for n in needles if n in text] for name, text in logs.items()} == {name: [] for name in logs}
