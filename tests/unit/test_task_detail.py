"""A task run in detail (issue 19): GET /api/v1/runs/{run}/task-runs/{id}/ and the run
page's task panel — every attempt (start, end, worker, outcome, error, traceback, log
lines, output), the task's config as configured (secret references, never values), its
upstream outputs and its events; the run page's input and its links to each panel;
another organization's task run is a 404; constant query counts."""

from __future__ import annotations

import datetime as dt
import html
import re
import secrets as pysecrets
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine.models import TaskRun, WorkflowRun
from engine.repositories import task_logs
from engine.repositories import task_runs as task_run_ops
from engine.services import apply_definition, start_run
from tenancy import vault
from tenancy.models import Role
from tests import engine_helpers
from tests.unit.test_api_auth import assert_problem, data_queries
from tests.unit.test_api_workflows import Api, new_api_factory
from tests.unit.test_secret_refs import owner_actor
from tests.unit.test_web_runs import client_for, counted, member, owner_of

TRACE = ('Traceback (most recent call last):\n  File "/srv/etl/tasks.py", line 9, in load\n'
         '    raise ValueError("no rows <b>today</b>")\nValueError: no rows <b>today</b>\n')


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def seeded_run(org, *, failures: int = 1, lines: int = 3, upstream: int = 1, run_input=None) -> WorkflowRun:
    """A run whose task ``load`` (python, its config referencing the secret TOKEN) failed
    ``failures`` attempts (each with ``lines`` log lines and a traceback) and then
    succeeded, after ``upstream`` noop tasks it depends on succeeded with outputs."""
    vault.set_secret(actor=owner_actor(org), name="TOKEN", value="sk_live_" + pysecrets.token_urlsafe(16))
    ups = [f"up{i}" for i in range(upstream)]
    document = {"name": f"etl-{pysecrets.token_hex(3)}", "tasks": [
        *({"key": key, "type": "noop"} for key in ups),
        {"key": "load", "type": "python", "depends_on": ups, "edge_labels": {u: "rows" for u in ups[:1]},
         "max_attempts": failures + 1, "retry_backoff_seconds": 0,
         "config": {"callable": "tests.callables.echo", "params": {"token": "{{ secrets.TOKEN }}"}}}]}
    wf = apply_definition(organization=org, document=document)
    run = start_run(workflow=wf, run_input=run_input or {"day": "2026-01-04"})
    trs = {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run)
           .select_related("task")}

    def attempt(tr, token: int, *, ok: bool, output=None, n_lines: int = 0):
        task_run_ops.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[tr.pk])
        att = engine_helpers.start_attempt(task_run_id=tr.pk, fencing_token=token, owner=f"worker@box:{token}:7",
                                           lease_seconds=30)
        assert att is not None
        task_logs.append_many([task_logs.NewLine(
            organization_id=org.pk, workflow_run_id=run.pk, task_run_id=tr.pk, attempt=att.attempt,
            fencing_token=token, stream="stdout" if i % 2 else "logging", level="info",
            message=f"attempt {att.attempt} line {i} <i>x</i>", at=dt.datetime.now(dt.UTC)) for i in range(n_lines)])
        if ok:
            engine_helpers.complete_attempt(task_run_id=tr.pk, fencing_token=token, succeeded=True, output=output,
                                            lease_seconds=30, owner="t", claim=False)
        else:
            task_run_ops.fail_attempt(task_run_id=tr.pk, fencing_token=token, error="ValueError: no rows <b>today</b>",
                                      traceback=TRACE)

    for i, key in enumerate(ups):
        attempt(trs[key], 1, ok=True, output={"rows": 1200 + i})
    for n in range(failures):
        attempt(trs["load"], n + 1, ok=False, n_lines=lines)
    attempt(trs["load"], failures + 1, ok=True, output={"loaded": 1200}, n_lines=lines)
    run.refresh_from_db()
    return run


def load_of(run) -> TaskRun:
    return TaskRun.objects.for_organization(run.organization_id).get(workflow_run=run, task__key="load")


# --- the API --------------------------------------------------------------------------------------


def test_the_task_detail_shows_every_attempt_with_its_traceback_logs_and_output_and_the_input_as_configured(api):
    run = seeded_run(api.org)
    tr = load_of(run)
    response = api.get(f"/api/v1/runs/{run.pk}/task-runs/{tr.pk}/", role=Role.VIEWER)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["key"], body["type"], body["state"], body["attempt"], body["max_attempts"]) == (
        str(tr.pk), "load", "python", "succeeded", 2, 2)
    # The input as configured: the secret as its reference.
    assert body["config"] == {"callable": "tests.callables.echo", "params": {"token": "{{ secrets.TOKEN }}"}}
    assert body["upstream"] == [{"key": "up0", "label": "rows", "task_run_id": str(load_of_key(run, "up0").pk),
                                 "state": "succeeded", "output": {"rows": 1200}}]
    first, second = body["attempts"]
    assert (first["attempt"], first["fencing_token"], first["outcome"], first["worker"]) == (
        1, 1, "retried", "worker@box:1:7")
    assert first["error"] == "ValueError: no rows <b>today</b>" and first["traceback"] == TRACE
    assert first["output"] is None and first["finished_at"] is not None
    assert [line["message"] for line in first["logs"]["lines"]] == [f"attempt 1 line {i} <i>x</i>" for i in range(3)]
    assert [line["stream"] for line in first["logs"]["lines"]] == ["logging", "stdout", "logging"]
    assert first["logs"]["more"] is False
    assert first["logs"]["url"] == f"http://testserver/api/v1/runs/{run.pk}/task-runs/{tr.pk}/logs/?fencing_token=1"
    assert (second["outcome"], second["error"], second["traceback"], second["output"]) == (
        "succeeded", "", "", {"loaded": 1200})
    assert body["output"] == {"loaded": 1200}
    # Its events, in seq order, the traceback left to the attempts.
    kinds = [e["kind"] for e in body["events"]]
    assert kinds == ["promoted", "claimed", "started", "attempt_failed", "claimed", "started", "succeeded"]
    failed = body["events"][3]
    assert failed["detail"]["error"] == "ValueError: no rows <b>today</b>" and "traceback" not in failed["detail"]
    assert {e["task_key"] for e in body["events"]} == {"load"}
    assert body["events_truncated"] is False
    assert body["logs_url"] == f"http://testserver/api/v1/runs/{run.pk}/task-runs/{tr.pk}/logs/"


def load_of_key(run, key) -> TaskRun:
    return TaskRun.objects.for_organization(run.organization_id).get(workflow_run=run, task__key=key)


def test_a_task_that_never_started_has_no_attempt_and_says_why_it_waits(api):
    wf = apply_definition(organization=api.org, document={"name": "wait", "tasks": [
        {"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}]})
    run = start_run(workflow=wf)
    b = load_of_key(run, "b")
    body = api.get(f"/api/v1/runs/{run.pk}/task-runs/{b.pk}/").json()
    assert (body["state"], body["attempts"], body["output"], body["started_at"]) == ("pending", [], None, None)
    assert body["upstream"] == [{"key": "a", "label": "", "task_run_id": str(load_of_key(run, "a").pk),
                                 "state": "ready", "output": None}]


def test_another_organizations_task_run_or_one_of_another_run_is_a_404(api_factory):
    mine, theirs = api_factory(), api_factory()
    run, other = seeded_run(theirs.org), seeded_run(theirs.org)
    tr = load_of(run)
    foreign = assert_problem(mine.get(f"/api/v1/runs/{run.pk}/task-runs/{tr.pk}/"), 404)
    missing = assert_problem(mine.get(f"/api/v1/runs/{run.pk}/task-runs/{uuid.uuid4()}/"), 404)
    assert foreign == missing  # the same answer: nothing says the task run exists
    assert_problem(theirs.get(f"/api/v1/runs/{other.pk}/task-runs/{tr.pk}/"), 404)  # a task run of another run
    assert_problem(mine.get(f"/api/v1/runs/{run.pk}/task-runs/{tr.pk}/logs/"), 404)
    assert theirs.get(f"/api/v1/runs/{run.pk}/task-runs/{tr.pk}/").status_code == 200


def test_the_task_detail_makes_the_same_queries_whatever_its_attempts_events_lines_and_upstream(api):
    small = seeded_run(api.org, failures=1, lines=1, upstream=1)
    big = seeded_run(api.org, failures=6, lines=40, upstream=12)
    counts = []
    for run in (small, big):
        url = f"/api/v1/runs/{run.pk}/task-runs/{load_of(run).pk}/"
        api.get(url)  # warm: the key's cache
        with CaptureQueriesContext(connection) as ctx:
            response = api.get(url)
        assert response.status_code == 200
        counts.append(data_queries(ctx))
    assert len(counts[0]) == len(counts[1]), "\n".join(counts[1])
    body = api.get(f"/api/v1/runs/{big.pk}/task-runs/{load_of(big).pk}/").json()
    assert len(body["attempts"]) == 7 and len(body["upstream"]) == 12
    assert all(len(a["logs"]["lines"]) == 40 for a in body["attempts"])


def test_an_attempts_logs_show_its_last_lines_and_say_more_exist(api, monkeypatch):
    from engine import task_detail

    monkeypatch.setattr(task_detail, "ATTEMPT_LOG_LINES", 2)
    monkeypatch.setattr(task_detail.load, "__kwdefaults__", {"log_lines": 2, "events_limit": 500})
    run = seeded_run(api.org, lines=5)
    attempts = api.get(f"/api/v1/runs/{run.pk}/task-runs/{load_of(run).pk}/").json()["attempts"]
    assert [line["message"] for line in attempts[0]["logs"]["lines"]] == [
        "attempt 1 line 3 <i>x</i>", "attempt 1 line 4 <i>x</i>"]
    assert attempts[0]["logs"]["more"] is True


def test_the_logs_endpoint_pages_one_attempts_lines_and_names_each_lines_stream(api):
    run = seeded_run(api.org, failures=2, lines=3)
    base = f"/api/v1/runs/{run.pk}/task-runs/{load_of(run).pk}/logs/"
    every = api.get(base, role=Role.VIEWER).json()["results"]
    assert len(every) == 9 and {line["stream"] for line in every} == {"logging", "stdout"}
    second = api.get(base + "?attempt=2").json()["results"]
    assert [line["message"] for line in second] == [f"attempt 2 line {i} <i>x</i>" for i in range(3)]
    assert api.get(base + "?fencing_token=3").json()["results"] == api.get(base + "?attempt=3").json()["results"]
    assert len(api.get(base + "?fencing_token=3").json()["results"]) == 3
    problem = assert_problem(api.get(base + "?attempt=zero"), 400)
    assert "attempt" in problem["errors"]


def test_the_schema_describes_the_task_detail(api):
    schema = api.client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/runs/{run_id}/task-runs/{id}/"]["get"]
    assert operation["operationId"] == "runs_task_retrieve"
    example = operation["responses"]["200"]["content"]["application/json"]["examples"]
    assert next(iter(example.values()))["value"]["attempts"][0]["traceback"].startswith("Traceback")
    detail = schema["components"]["schemas"]["TaskRunDetail"]["properties"]
    assert {"attempts", "upstream", "config", "events", "logs_url"} <= set(detail)
    outcome = schema["components"]["schemas"]["Attempt"]["properties"]["outcome"]
    enum = schema["components"]["schemas"][outcome["allOf"][0]["$ref"].rsplit("/", 1)[1]]["enum"]
    assert enum == ["running", "succeeded", "retried", "failed", "timed_out", "lease_expired", "cancelled",
                    "skipped"]


# --- the web UI -----------------------------------------------------------------------------------


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def test_the_run_page_shows_the_run_input_and_links_every_task_to_its_panel(org):
    run = seeded_run(org, run_input={"day": "2026-01-04", "note": "<script>alert(1)</script>"})
    client = client_for(owner_of(org))
    body = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<pre class="json run-input">' in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert(1)" not in body
    assert f'href="/runs/{run.pk}/input/"' in body
    for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run).select_related("task"):
        url = f"/runs/{run.pk}/tasks/{tr.pk}/"
        assert f'<a class="task-link" href="{url}" hx-get="{url}" hx-target="#task-panel"' in body, tr.task.key
    assert '<section class="card task-panel-card" id="task-panel" aria-live="polite"></section>' in body
    whole = client.get(f"/runs/{run.pk}/input/")
    assert whole["Content-Type"] == "application/json" and whole.json()["note"] == "<script>alert(1)</script>"
    # The event rows leave a failed attempt's traceback to the panel.
    assert "Traceback (most recent call last)" not in body


def test_the_task_panel_shows_attempts_tracebacks_logs_input_and_upstream_escaped(org):
    run = seeded_run(org)
    tr = load_of(run)
    client = client_for(member(org, Role.VIEWER))
    url = f"/runs/{run.pk}/tasks/{tr.pk}/"
    page = client.get(url)
    assert page.status_code == 200
    body = page.content.decode()
    assert "<!DOCTYPE html>" in body and f'<a class="mono" href="/runs/{run.pk}/">' in body  # a page of its own
    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<!DOCTYPE html>" not in fragment and fragment.lstrip().startswith('<div class="task-panel state-succeeded"')
    for piece in (body, fragment):
        assert piece.count('<section class="attempt attempt-') == 2
        assert 'data-outcome="retried"' in piece and 'data-outcome="succeeded"' in piece
        assert "ValueError: no rows &lt;b&gt;today&lt;/b&gt;" in piece and "<b>today</b>" not in piece
        assert '<pre class="traceback-text">Traceback (most recent call last):' in piece
        assert "attempt 1 line 2 &lt;i&gt;x&lt;/i&gt;" in piece and "<i>x</i>" not in piece
        assert "{{ secrets.TOKEN }}" in html.unescape(piece)  # the input as configured
        assert 'data-upstream="up0"' in piece and "&quot;rows&quot;: 1200" in piece
        assert "worker@box:1:7" in piece
        assert 'hx-trigger="every' not in piece  # a finished task's panel does not poll
    assert page["Cache-Control"] == "no-store"


def test_an_open_tasks_panel_refreshes_itself_until_it_finishes(org):
    wf = apply_definition(organization=org, document={"name": "open", "tasks": [{"key": "a", "type": "noop"}]})
    run = start_run(workflow=wf)
    tr = load_of_key(run, "a")
    fragment = client_for(owner_of(org)).get(f"/runs/{run.pk}/tasks/{tr.pk}/", headers={"HX-Request": "true"})
    body = fragment.content.decode()
    assert f'hx-get="/runs/{run.pk}/tasks/{tr.pk}/" hx-trigger="every 2s" hx-swap="outerHTML"' in body
    assert "No attempt has started yet." in body


def test_the_task_panel_of_another_organizations_task_run_is_a_404(org, make_org):
    other = make_org()
    run = seeded_run(other)
    tr = load_of(run)
    client = client_for(owner_of(org))
    assert client.get(f"/runs/{run.pk}/tasks/{tr.pk}/").status_code == 404
    assert client.get(f"/runs/{run.pk}/tasks/{tr.pk}/", headers={"HX-Request": "true"}).status_code == 404
    assert client.get(f"/runs/{run.pk}/input/").status_code == 404


def test_the_task_panel_makes_the_same_queries_whatever_its_attempts_lines_and_upstream(org):
    client = client_for(owner_of(org))
    small = seeded_run(org, failures=1, lines=1, upstream=1)
    big = seeded_run(org, failures=6, lines=60, upstream=10)
    sizes = []
    for run in (small, big):
        url = f"/runs/{run.pk}/tasks/{load_of(run).pk}/"
        client.get(url)
        resp, sql = counted(client, url)
        assert resp.status_code == 200
        sizes.append(sql)
    assert len(sizes[0]) == len(sizes[1]), "\n".join(sizes[1])
    assert len(re.findall(r'<span class="log-line ', client.get(
        f"/runs/{big.pk}/tasks/{load_of(big).pk}/").content.decode())) == 7 * 60


def test_a_large_run_input_is_cut_in_the_database_and_links_to_the_whole(org):
    client = client_for(owner_of(org))
    small, large = seeded_run(org, run_input={"day": 1}), seeded_run(org, run_input={"blob": "x" * 50_000})
    client.get(f"/runs/{small.pk}/")
    _resp, few = counted(client, f"/runs/{small.pk}/")
    resp, many = counted(client, f"/runs/{large.pk}/")
    assert len(few) == len(many)
    body = text(resp)
    assert "its first 20000 characters" in body and f'href="/runs/{large.pk}/input/"' in body
    assert body.count("x") < 21_000
    assert client.get(f"/runs/{large.pk}/input/").json() == {"blob": "x" * 50_000}
