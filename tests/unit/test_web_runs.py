"""The run pages: list (filters, keyset pages), run page (header, DAG coloured by task
state, timeline of attempts, task table, event log), its live fragment and event
stream, Cancel / Retry (403 without run.operate, 404 for another organization's run),
and the query counts that must not grow with tasks, runs or events."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import threading
import time
import uuid
from collections.abc import Iterable

import pytest
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditLog
from engine.models import TaskRun, TaskRunEvent, WorkflowRun
from engine.repositories import task_runs
from engine.services import apply_definition, start_run
from frontend import live
from frontend.dag import STATE_CODES
from frontend.presenters import run_page, timeline
from frontend.presenters import text as run_text
from frontend.views import runs as run_views
from tenancy.actors import Actor
from tenancy.models import Membership, Role, User
from tests import engine_helpers
from tests.unit.test_identity import fresh_client, unique_email

# --- helpers ---------------------------------------------------------------------------------


def text(resp) -> str:
    return html.unescape(resp.content.decode())


def owner_of(org) -> User:
    return Membership.objects.for_organization(org).get(role=Role.OWNER).user


def actor_for(org, user=None, role=Role.OWNER) -> Actor:
    return Actor(organization=org, role=role, user=user or owner_of(org), channel="web")


def member(org, role: str) -> User:
    user = User.objects.create_user(email=unique_email(role))
    Membership.objects.create(organization=org, user=user, role=role)
    return user


def client_for(user) -> Client:
    client = fresh_client()
    client.force_login(user)
    return client


def layered_tasks(n: int, *, width: int = 5, flaky: Iterable[str] = (), failing: Iterable[str] = ()) -> list[dict]:
    """``n`` tasks in layers of ``width``; each task after the first layer depends on
    the task above it and its neighbour (a DAG with fan-in)."""
    flaky, failing = set(flaky), set(failing)
    tasks = []
    for i in range(n):
        key = f"t{i:03d}"
        deps = []
        if i >= width:
            deps = sorted({f"t{i - width:03d}", f"t{i - width + (1 if (i % width) < width - 1 else -1):03d}"})
        task: dict = {"key": key, "type": "noop", "depends_on": deps, "retry_backoff_seconds": 0}
        if key in flaky:
            task.update(type="fail", config={"fail_attempts": 1, "message": "flaky <b>first</b> attempt"},
                        max_attempts=2)
        if key in failing:
            task.update(type="fail", config={"message": "boom <script>alert(1)</script>"})
        tasks.append(task)
    return tasks


def make_run(org, n: int = 5, *, name: str | None = None, width: int = 5, **kwargs) -> WorkflowRun:
    wf = apply_definition(
        actor=actor_for(org), document={"name": name or f"flow-{uuid.uuid4().hex[:6]}",
                                        "tasks": layered_tasks(n, width=width, **kwargs)}
    )
    return start_run(workflow=wf, actor=actor_for(org))


def drive_run(run: WorkflowRun, *, steps: int | None = None, fail: Iterable[str] = (),
              flaky: Iterable[str] = ()) -> WorkflowRun:
    """Execute ``run`` in this process through the engine's transitions (claim, start,
    complete), as the scheduler and workers would: tasks in ``fail`` fail every
    attempt, tasks in ``flaky`` fail their first. Stops after ``steps`` attempts if given
    (claimed generations not yet started are picked up by the next call)."""
    fail, flaky = set(fail), set(flaky)
    org = run.organization_id
    done = 0
    while True:
        ready = list(
            TaskRun.objects.for_organization(org).filter(workflow_run=run, state="ready").values_list("id", flat=True)
        )
        if ready:
            task_runs.claim_ready_many(limit=len(ready), lease_seconds=30, owner="test", task_run_ids=ready)
        # Every claimed generation that no worker has started yet.
        pending = list(
            TaskRun.objects.for_organization(org)
            .filter(workflow_run=run, state="running")
            .exclude(started_fencing_token=F("fencing_token"))
            .order_by("task__key")
            .values_list("id", "fencing_token")
        )
        if not pending:
            break
        for task_run_id, token in pending:
            att = engine_helpers.start_attempt(task_run_id=task_run_id, fencing_token=token, owner="test",
                                            lease_seconds=30)
            if att is None:
                continue
            bad = att.task_key in fail or (att.task_key in flaky and att.attempt == 1)
            engine_helpers.complete_attempt(
                task_run_id=att.task_run_id, fencing_token=att.fencing_token, succeeded=not bad,
                output=None if bad else {"task": att.task_key, "rows": list(range(40))},
                error=f"{att.task_key} failed <b>on purpose</b>" if bad else "", lease_seconds=30, owner="test",
            )
            done += 1
            if steps is not None and done >= steps:
                run.refresh_from_db()
                return run
    run.refresh_from_db()
    return run


def counted(client: Client, url: str) -> tuple[object, list[str]]:
    """GET ``url``; return (response, the SQL it ran, without savepoint statements)."""
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(url)
    sql = [q["sql"] for q in ctx.captured_queries
           if not re.match(r"^\s*(SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT)", q["sql"])]
    return resp, sql


# --- sign-in and isolation ---------------------------------------------------------------------


def test_run_pages_require_sign_in(org):
    run = make_run(org, 2)
    client = fresh_client()
    for url in ("/runs/", f"/runs/{run.pk}/", f"/runs/{run.pk}/live/", f"/runs/{run.pk}/events/"):
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/accounts/login/"), url


def test_another_organizations_run_is_a_404_on_every_run_url(make_org):
    mine, theirs = make_org(), make_org()
    foreign = make_run(theirs, 2)
    client = client_for(owner_of(mine))
    for suffix in ("", "live/", "events/", "stream/"):
        assert client.get(f"/runs/{foreign.pk}/{suffix}").status_code == 404, suffix
    for suffix in ("cancel/", "retry/"):
        assert client.post(f"/runs/{foreign.pk}/{suffix}").status_code == 404, suffix
    foreign.refresh_from_db()
    assert foreign.state == "running"
    assert str(foreign.pk) not in client.get("/runs/").content.decode()


# --- the list ----------------------------------------------------------------------------------


def test_run_list_shows_runs_newest_first_with_state_badges(org):
    first = make_run(org, 2, name="alpha")
    second = drive_run(make_run(org, 2, name="beta"))
    client = client_for(owner_of(org))
    resp = client.get("/runs/")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert body.index(str(second.pk)[:8]) < body.index(str(first.pk)[:8])
    assert '<span class="badge state-succeeded">Succeeded</span>' in body
    assert '<span class="badge state-running">Running</span>' in body
    assert f'href="/runs/{first.pk}/"' in body
    assert "2/2" in body  # the succeeded run's progress


@pytest.mark.parametrize(("source", "label"), [("cli", "CLI"), ("api", "API"), ("web", "Web")])
def test_run_list_and_run_page_show_the_trigger_source_with_acronyms_in_capitals(org, source, label):
    wf = apply_definition(actor=actor_for(org), document={"name": f"src-{source}", "tasks": [{"key": "a", "type": "noop"}]})
    run = start_run(workflow=wf, actor=actor_for(org), trigger_source=source)
    client = client_for(owner_of(org))
    badge = f'<span class="source source-{source}">{label}</span>'
    assert badge in client.get("/runs/").content.decode()
    assert badge in client.get(f"/runs/{run.pk}/").content.decode()


def test_run_list_filters_by_workflow_state_and_dates(org):
    a = make_run(org, 1, name="alpha")
    b = drive_run(make_run(org, 1, name="beta"))
    old = make_run(org, 1, name="gamma")
    WorkflowRun.objects.for_organization(org).filter(pk=old.pk).update(
        created_at=timezone.now() - dt.timedelta(days=10))
    client = client_for(owner_of(org))

    def ids(query: str) -> set[str]:
        resp = client.get("/runs/" + query)
        assert resp.status_code == 200, query
        return set(re.findall(r'data-run-id="([0-9a-f-]+)"', resp.content.decode()))

    assert ids("") == {str(a.pk), str(b.pk), str(old.pk)}
    assert ids("?workflow=alpha") == {str(a.pk)}
    assert ids(f"?workflow={b.workflow_id}") == {str(b.pk)}
    assert ids("?state=succeeded") == {str(b.pk)}
    assert ids("?state=running") == {str(a.pk), str(old.pk)}
    today = timezone.now().date()
    assert ids(f"?created_after={today - dt.timedelta(days=1)}") == {str(a.pk), str(b.pk)}
    assert ids(f"?created_before={today - dt.timedelta(days=5)}") == {str(old.pk)}
    assert ids(f"?created_before={today}&created_after={today}&workflow=beta") == {str(b.pk)}
    bad = client.get("/runs/?created_after=yesterday")
    assert bad.status_code == 400 and "Enter a date as YYYY-MM-DD." in text(bad)


def test_run_list_pages_with_keyset_cursors_both_ways_without_skipping_ties(org, monkeypatch):
    monkeypatch.setattr(run_views, "RUN_PAGE_SIZE", 4)
    wf = apply_definition(actor=actor_for(org), document={"name": "many", "tasks": [{"key": "a", "type": "noop"}]})
    runs = [start_run(workflow=wf, actor=actor_for(org)) for _ in range(11)]
    # Five runs share one created_at to the microsecond: the id breaks the tie.
    tie = timezone.now() - dt.timedelta(minutes=5)
    WorkflowRun.objects.for_organization(org).filter(pk__in=[r.pk for r in runs[3:8]]).update(created_at=tie)
    expected = list(
        WorkflowRun.objects.for_organization(org).order_by("-created_at", "-id").values_list("id", flat=True))
    client = client_for(owner_of(org))
    seen, url, pages = [], "/runs/", []
    while url:
        resp = client.get(url)
        body = resp.content.decode()
        assert "OFFSET" not in body
        page = re.findall(r'data-run-id="([0-9a-f-]+)"', body)
        pages.append((url, page))
        seen += page
        m = re.search(r'rel="next" href="([^"]+)"', body)
        url = "/runs/" + html.unescape(m.group(1)) if m else None
    assert seen == [str(i) for i in expected]
    assert [len(p) for _, p in pages] == [4, 4, 3]
    # Back from the last page: "Newer" gives the previous page exactly.
    last_body = client.get(pages[-1][0]).content.decode()
    newer = html.unescape(re.search(r'rel="prev" href="([^"]+)"', last_body).group(1))
    back = re.findall(r'data-run-id="([0-9a-f-]+)"', client.get("/runs/" + newer).content.decode())
    assert back == pages[1][1]
    # The first page has no "Newer" link.
    assert 'rel="prev"' not in client.get("/runs/").content.decode()


def test_run_list_refuses_a_forged_cursor_and_shows_the_newest_runs(org):
    run = make_run(org, 1)
    resp = client_for(owner_of(org)).get("/runs/?older_than=not-a-cursor")
    assert resp.status_code == 400
    assert str(run.pk) in resp.content.decode()
    assert "not valid" in text(resp)


def test_run_list_query_count_does_not_grow_with_runs_or_tasks(org):
    client = client_for(owner_of(org))
    make_run(org, 2)
    client.get("/runs/")  # warm caches (content types, sessions)
    _, few = counted(client, "/runs/")
    for _ in range(6):
        drive_run(make_run(org, 12, width=4))
    resp, many = counted(client, "/runs/?state=succeeded")
    assert resp.status_code == 200 and resp.content.decode().count("data-run-id=") == 6
    assert len(many) == len(few), "\n".join(many)
    assert not any("OFFSET" in q for q in many)


def graph_states(body: str) -> dict[str, str]:
    """Task key -> state from the run page's #graph-data and #graph-states (frontend.dag)."""
    data = json.loads(re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', body, re.S).group(1))
    code = json.loads(re.search(r'<script id="graph-states" type="application/json">(.*?)</script>', body, re.S).group(1))
    letters = {v: k for k, v in STATE_CODES.items()}
    assert len(code) == len(data["tasks"])
    return {row[0]: letters[c] for row, c in zip(data["tasks"], code, strict=True)}


# --- the run page ------------------------------------------------------------------------------


def test_run_page_shows_header_dag_timeline_tasks_and_events(org):
    run = make_run(org, 10, width=5, flaky=["t001"], failing=["t002"])
    run = drive_run(run, flaky=["t001"], fail=["t002"])
    assert run.state == "failed"
    client = client_for(owner_of(org))
    resp = client.get(f"/runs/{run.pk}/")
    assert resp.status_code == 200
    body = resp.content.decode()
    # Header: workflow and version link, state, trigger source, who started it, times.
    assert f'href="/workflows/{run.workflow_id}/"' in body
    assert f"v{run.workflow.version}" in body
    assert '<span class="badge state-failed large">Failed</span>' in body
    assert owner_of(org).email in body
    assert "Web" in body
    # DAG: its data and every task's state (a letter each, in the graph's order), drawn by graph.js.
    states = dict(TaskRun.objects.for_organization(org).filter(workflow_run=run).values_list("task__key", "state"))
    assert graph_states(body) == dict(states) and len(states) == 10
    assert '<script src="/static/frontend/dist/graph.js" defer></script>' in body
    assert states["t002"] == "failed" and states["t007"] == "skipped" and states["t000"] == "succeeded"
    # Timeline: one bar per attempt, coloured by outcome (t001 was retried once).
    assert len(re.findall(r'class="tl-bar outcome-retried"', body)) == 1
    assert len(re.findall(r'class="tl-bar outcome-failed"', body)) == 1
    started = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="started").count()
    assert len(re.findall(r'class="tl-bar outcome-', body)) == started
    assert ' style="' not in body  # the CSP forbids inline styles
    # Task table: key, type, state, attempts, error (escaped), output preview (cut).
    assert 'id="task-t001"' in body and "2<span class=\"muted\">/2</span>" in body
    assert "t002 failed &lt;b&gt;on purpose&lt;/b&gt;" in body
    assert "<b>on purpose</b>" not in body
    assert "…" in body  # output previews are cut
    # Event log: seq order, the run's last event last, with from -> to.
    seqs = [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', body)]
    assert seqs == sorted(seqs) and seqs[-1] == run.last_event_seq
    assert "run_finished" in body and "attempt_failed" in body
    # A failed run offers Retry, not Cancel; the page is not live.
    assert 'data-action="retry"' in body and 'data-action="cancel"' not in body
    assert 'id="run-live"' not in body


def test_active_run_page_is_live_and_offers_cancel(org):
    run = make_run(org, 15)
    drive_run(run, steps=2)
    body = client_for(owner_of(org)).get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-live"' in body
    assert f'data-stream-url="/runs/{run.pk}/stream/"' in body
    assert f'data-fragment-url="/runs/{run.pk}/live/"' in body
    assert 'data-action="cancel"' in body and 'data-action="retry"' not in body
    assert '<script src="/static/frontend/run-page.js" defer></script>' in body
    assert "class=\"tl-bar outcome-succeeded\"" in body
    assert graph_states(body)["t014"] == "pending"


def test_run_page_query_count_does_not_grow_with_tasks_or_events(org):
    client = client_for(owner_of(org))
    small = drive_run(make_run(org, 3, width=3))
    client.get(f"/runs/{small.pk}/")
    _, few = counted(client, f"/runs/{small.pk}/")
    big = drive_run(make_run(org, 60, width=6, flaky=["t010", "t020"]), flaky=["t010", "t020"])
    assert TaskRunEvent.objects.for_organization(org).filter(workflow_run=big).count() > 200
    resp, many = counted(client, f"/runs/{big.pk}/")
    assert resp.status_code == 200
    assert len(many) == len(few), "\n".join(many)
    # The log keeps the latest EVENT_LOG_LIMIT events and links to the full log.
    assert resp.content.decode().count("<tr data-seq=") == run_page.EVENT_LOG_LIMIT
    assert f'href="/runs/{big.pk}/events/"' in resp.content.decode()


def test_live_fragment_has_every_region_and_only_new_events(org):
    run = make_run(org, 6)
    drive_run(run, steps=2)
    run.refresh_from_db()
    seen = run.last_event_seq
    client = client_for(owner_of(org))
    drive_run(run, steps=2)
    run.refresh_from_db()
    resp = client.get(f"/runs/{run.pk}/live/?after={seen}")
    assert resp.status_code == 200 and resp["Cache-Control"] == "no-store"
    body = resp.content.decode()
    for region in ("run-summary", "run-dag", "run-timeline", "run-tasks", "run-events"):
        assert f'data-region="{region}"' in body
    # Of the graph only the states are resent (a letter a task), never its tasks and edges.
    assert 'id="graph-states"' in body and 'id="graph-data"' not in body
    assert f'data-seq="{run.last_event_seq}"' in body and 'data-terminal="0"' in body
    seqs = [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', body)]
    assert seqs == list(range(seen + 1, run.last_event_seq + 1))
    assert 'data-mode="append"' in body
    drive_run(run)
    done = client.get(f"/runs/{run.pk}/live/?after={run.last_event_seq}").content.decode()
    assert 'data-terminal="1"' in done and 'data-state="succeeded"' in done
    assert 'id="run-live"' not in done and "data-live-status" not in done


def test_live_fragment_query_count_is_constant(org):
    client = client_for(owner_of(org))
    small = make_run(org, 3, width=3)
    drive_run(small, steps=1)
    client.get(f"/runs/{small.pk}/live/?after=0")
    _, few = counted(client, f"/runs/{small.pk}/live/?after=0")
    big = make_run(org, 50, width=5)
    drive_run(big, steps=30)
    resp, many = counted(client, f"/runs/{big.pk}/live/?after=3")
    assert resp.status_code == 200
    assert len(many) == len(few), "\n".join(many)


def test_fragment_replaces_the_log_when_more_events_are_new_than_it_keeps(org, monkeypatch):
    monkeypatch.setattr(run_page, "EVENT_LOG_LIMIT", 5)
    run = drive_run(make_run(org, 6))
    body = client_for(owner_of(org)).get(f"/runs/{run.pk}/live/?after=1").content.decode()
    assert 'data-mode="replace"' in body
    seqs = [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', body)]
    assert seqs == list(range(run.last_event_seq - 4, run.last_event_seq + 1))


def test_event_log_page_pages_by_seq(org, monkeypatch):
    monkeypatch.setattr(run_views, "EVENT_PAGE_SIZE", 10)
    run = drive_run(make_run(org, 6))
    client = client_for(owner_of(org))
    body = client.get(f"/runs/{run.pk}/events/").content.decode()
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', body)] == list(range(1, 11))
    assert 'href="?after=10"' in body
    rest = client.get(f"/runs/{run.pk}/events/?after=10").content.decode()
    assert [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', rest)][0] == 11


# --- cancel and retry --------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.VIEWER])
def test_viewer_sees_no_cancel_or_retry_and_is_refused_with_403(org, role):
    viewer = member(org, role)
    client = client_for(viewer)
    running = make_run(org, 3)
    body = client.get(f"/runs/{running.pk}/").content.decode()
    assert "data-action=\"cancel\"" not in body and "/cancel/" not in body
    assert client.post(f"/runs/{running.pk}/cancel/").status_code == 403
    running.refresh_from_db()
    assert running.state == "running"
    finished = drive_run(make_run(org, 2))
    assert "/retry/" not in client.get(f"/runs/{finished.pk}/").content.decode()
    assert client.post(f"/runs/{finished.pk}/retry/").status_code == 403
    assert not WorkflowRun.objects.for_organization(org).filter(retry_of=finished).exists()


def test_cancel_needs_the_csrf_token(org):
    run = make_run(org, 2)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner_of(org))
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 403
    run.refresh_from_db()
    assert run.state == "running"


def test_member_cancels_a_run_and_retries_it(org):
    user = member(org, Role.MEMBER)
    client = client_for(user)
    run = make_run(org, 4)
    drive_run(run, steps=1)
    resp = client.post(f"/runs/{run.pk}/cancel/", follow=True)
    assert resp.status_code == 200 and "The run was cancelled." in text(resp)
    run.refresh_from_db()
    assert run.state == "cancelled"
    entry = AuditLog.objects.for_organization(org).get(action="run.cancelled", target_id=str(run.pk))
    assert entry.actor_email == user.email
    # Retry: a new run linked to this one, and each page links the other.
    resp = client.post(f"/runs/{run.pk}/retry/")
    new = WorkflowRun.objects.for_organization(org).get(retry_of=run)
    assert resp.status_code == 302 and resp["Location"] == f"/runs/{new.pk}/"
    assert new.trigger_source == "retry"
    assert f'href="/runs/{run.pk}/"' in client.get(f"/runs/{new.pk}/").content.decode()
    assert f'href="/runs/{new.pk}/"' in client.get(f"/runs/{run.pk}/").content.decode()
    # Cancelling a finished run changes nothing and says so.
    resp = client.post(f"/runs/{run.pk}/cancel/", follow=True)
    assert "already finished" in text(resp)


def test_retrying_a_running_run_is_refused_with_a_message(org):
    run = make_run(org, 2)
    resp = client_for(owner_of(org)).post(f"/runs/{run.pk}/retry/", follow=True)
    assert resp.status_code == 200 and "only a finished run can be retried" in text(resp)
    assert not WorkflowRun.objects.for_organization(org).filter(retry_of=run).exists()


# --- timeline --------------------------------------------------------------------------------


def test_attempts_are_paired_from_started_to_the_event_that_ended_them():
    t0 = timezone.now()
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def at(s):
        return t0 + dt.timedelta(seconds=s)

    events = [
        (a, "started", at(0), 1, "running", None),
        (b, "started", at(1), 1, "running", None),
        (a, "attempt_failed", at(2), 1, "ready", "boom"),
        (a, "started", at(3), 2, "running", None),
        (b, "lease_expired", at(4), 1, "failed", "lost"),
        (a, "succeeded", at(5), 2, "succeeded", None),
        (c, "cancelled", at(6), 1, "cancelled", None),  # never started: no attempt
        (c, "started", at(7), 1, "running", None),
    ]
    got = timeline.attempts_from_events(events)
    assert [(x.number, x.outcome, x.error) for x in got[a]] == [(1, "retried", "boom"), (2, "succeeded", "")]
    assert [(x.outcome, x.end) for x in got[b]] == [("lease_expired", at(4))]
    assert [(x.outcome, x.end) for x in got[c]] == [("running", None)]


def test_human_durations():
    assert run_text.human_duration(0.34) == "340\u00a0ms"
    assert run_text.human_duration(12.44) == "12.4\u00a0s"
    assert run_text.human_duration(185) == "3\u00a0m 05\u00a0s"
    assert run_text.human_duration(7620) == "2\u00a0h 07\u00a0m"
    assert run_text.human_duration(None) == ""


# --- the event stream (LISTEN/NOTIFY) -----------------------------------------------------------


def listen_connections(*, settle: float = 2.0) -> int:
    """How many LISTEN connections of the run pages are open on the test database
    (waiting up to ``settle`` seconds for closed ones to leave pg_stat_activity)."""
    deadline = time.monotonic() + settle
    while True:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                [live.APPLICATION_NAME],
            )
            n = cur.fetchone()[0]
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def subscriptions_of(run) -> int:
    """Live subscriptions of ``run`` (engine.live), or 0 in a checkout without them."""
    if live.subscriptions is None:
        return 0
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM core_runsubscription WHERE workflow_run_id = %s", [run.pk])
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_stream_of_a_finished_run_says_change_and_end_then_closes(make_org):
    org = make_org()
    run = drive_run(make_run(org, 2))
    client = client_for(owner_of(org))
    resp = client.get(f"/runs/{run.pk}/stream/", HTTP_LAST_EVENT_ID="1")
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/event-stream")
    body = b"".join(resp.streaming_content).decode()
    assert f"id: {run.last_event_seq}\nevent: change\n" in body
    assert body.rstrip().endswith('"state":"succeeded"}')
    assert "event: end" in body
    assert listen_connections() == 0
    assert subscriptions_of(run) == 0


@pytest.mark.django_db(transaction=True)
def test_stream_announces_each_committed_change_at_once_and_closes_its_connection(make_org):
    org = make_org()
    run = make_run(org, 3, width=3)
    client = client_for(owner_of(org))
    resp = client.get(f"/runs/{run.pk}/stream/?after={run.last_event_seq}")
    stream = iter(resp.streaming_content)
    received: list[tuple[float, bytes]] = []
    reader = threading.Thread(target=lambda: received.extend((time.monotonic(), c) for c in stream), daemon=True)
    try:
        assert next(stream).startswith(b"retry:")
        reader.start()
        time.sleep(0.3)
        assert listen_connections(settle=0) == 1
        if live.subscriptions is not None:
            assert subscriptions_of(run) == 1  # the trigger notifies for watched runs only
        latencies = []
        for _ in range(3):
            before = len(received)
            committed = time.monotonic()
            drive_run(run, steps=1)  # autocommit: each transition commits, and notifies
            deadline = time.monotonic() + 5
            while len(received) == before and time.monotonic() < deadline:
                time.sleep(0.005)
            assert len(received) > before, "no change announced"
            latencies.append(received[before][0] - committed)
            time.sleep(0.2)
        run.refresh_from_db()
        assert run.state == "succeeded"
        reader.join(timeout=5)
        assert not reader.is_alive(), "the stream did not end when the run finished"
        body = b"".join(c for _, c in received).decode()
        assert "event: change" in body and body.rstrip().endswith('"state":"succeeded"}')
        assert max(latencies) < 1.0, latencies
    finally:
        resp.close()
        reader.join(timeout=20)
    time.sleep(0.1)
    assert listen_connections() == 0
    assert subscriptions_of(run) == 0


@pytest.mark.django_db(transaction=True)
def test_closing_a_stream_early_closes_its_listen_connection(make_org):
    org = make_org()
    run = make_run(org, 2)
    client = client_for(owner_of(org))
    resp = client.get(f"/runs/{run.pk}/stream/")
    stream = iter(resp.streaming_content)
    try:
        next(stream)
        assert listen_connections(settle=0) == 1
    finally:
        resp.close()  # what the WSGI server does when the browser goes away
    assert listen_connections() == 0
    assert subscriptions_of(run) == 0


def test_run_page_shows_why_a_ready_task_waits_and_the_waiting_events(org):
    from engine.models import Task
    from engine.repositories import waiting

    wf = apply_definition(actor=actor_for(org), document={"name": "charge", "tasks": [
        {"key": "pay", "type": "noop"}, {"key": "mail", "type": "noop", "depends_on": ["pay"]}]})
    Task.objects.unscoped().filter(workflow=wf, key="pay").update(concurrency_key="stripe", concurrency_limit=1)
    holder = start_run(workflow=wf, actor=actor_for(org))
    run = start_run(workflow=wf, actor=actor_for(org))
    TaskRun.objects.for_organization(org).filter(task__key="pay").update(concurrency_key="stripe")
    TaskRun.objects.for_organization(org).filter(workflow_run=holder, task__key="pay").update(
        state="running", fencing_token=1, lease_expires_at=timezone.now() + dt.timedelta(minutes=1))
    assert waiting.note_waiting() == 1
    client = client_for(owner_of(org))
    body = text(client.get(f"/runs/{run.pk}/"))
    row = re.search(r'<tr id="task-pay".*?</tr>', body).group(0)
    assert '<span class="badge state-ready">Ready</span> <span class="wait-reason">waiting: concurrency stripe 1/1' in row
    assert "wait-reason" not in re.search(r'<tr id="task-mail".*?</tr>', body).group(0)  # pending: no reason
    event = re.search(r'<tr data-seq="\d+" class="event kind-waiting">.*?</tr>', body).group(0)
    assert '<span class="muted">#1</span> waiting: concurrency stripe 1/1</td>' in event
    # The holder's page: nothing ready, no reason; the full event log shows the event too.
    assert "wait-reason" not in client.get(f"/runs/{holder.pk}/").content.decode()
    assert "waiting: concurrency stripe 1/1" in text(client.get(f"/runs/{run.pk}/events/"))


def test_run_page_of_a_queued_run_names_the_run_limit(org):
    from engine.models import Workflow

    wf = apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_runs=1)
    start_run(workflow=wf, actor=actor_for(org))
    queued = start_run(workflow=wf, actor=actor_for(org))
    WorkflowRun.objects.for_organization(org).filter(pk=queued.pk).update(state="pending")
    TaskRun.objects.for_organization(org).filter(workflow_run=queued).update(state="pending")
    body = text(client_for(owner_of(org)).get(f"/runs/{queued.pk}/"))
    assert '<p class="alert run-waiting">waiting: workflow run limit 1/1</p>' in body


# --- scheduling on the run pages ------------------------------------------------------------------


def fact(body: str, name: str) -> str | None:
    """The <dd> of the run page's fact ``name`` (its inner HTML), or None when absent."""
    match = re.search(rf"<div><dt>{re.escape(name)}</dt><dd[^>]*>(.*?)</dd></div>", body, flags=re.S)
    return match.group(1) if match else None


def test_run_page_shows_the_run_priority_and_each_task_runs_rendered_concurrency_key_escaped(org):
    wf = apply_definition(actor=actor_for(org), document={"name": "charges", "tasks": [
        {"key": "charge", "type": "noop", "priority": 2,
         "concurrency": {"key": "customer-{{ input.customer }}", "limit": 1}},
        {"key": "mail", "type": "noop", "depends_on": ["charge"]}]})
    run = start_run(workflow=wf, actor=actor_for(org), priority=-7,
                    run_input={"customer": '<script>alert("x")</script>&'})
    client = client_for(owner_of(org))
    for url in (f"/runs/{run.pk}/", f"/runs/{run.pk}/live/?after=0"):
        body = client.get(url).content.decode()
        assert fact(body, "Priority") == "-7", url
        charge = re.search(r'<tr id="task-charge".*?</tr>', body).group(0)
        assert ('hx-push-url="true">charge</a><div class="concurrency-key"><span class="muted">concurrency</span> '
                '<code>customer-&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;</code></div></td>') in charge
        assert "<script>alert" not in body
        assert "concurrency-key" not in re.search(r'<tr id="task-mail".*?</tr>', body).group(0)
    # Priority 0, the default, is not shown.
    plain = start_run(workflow=wf, actor=actor_for(org), run_input={"customer": "c1"})
    assert fact(client.get(f"/runs/{plain.pk}/").content.decode(), "Priority") is None


def test_a_queued_run_has_no_duration_on_its_page_its_live_fragment_or_the_list(org):
    from engine.models import Workflow

    wf = apply_definition(actor=actor_for(org), document={"name": "nightly", "tasks": [{"key": "a", "type": "noop"}]})
    Workflow.objects.unscoped().filter(pk=wf.pk).update(max_running_runs=1)
    wf.refresh_from_db()
    running = start_run(workflow=wf, actor=actor_for(org))
    queued = start_run(workflow=wf, actor=actor_for(org))
    assert (queued.state, queued.started_at) == ("pending", None)
    # It was created a minute ago: a duration counted from then would say "1 m 00 s".
    WorkflowRun.objects.unscoped().filter(pk=queued.pk).update(created_at=F("created_at") - dt.timedelta(minutes=1))
    client = client_for(owner_of(org))
    for url in (f"/runs/{queued.pk}/", f"/runs/{queued.pk}/live/?after=0"):
        body = text(client.get(url))
        assert fact(body, "Started") == "—", url
        assert fact(body, "Duration") == "—", url
        assert '<p class="alert run-waiting">waiting: workflow run limit 1/1</p>' in body
    listing = client.get("/runs/").content.decode()
    row = re.search(rf'<tr class="run-row state-pending" data-run-id="{queued.pk}">.*?</tr>', listing, re.S).group(0)
    assert re.search(r'<td class="num">—</td>\s*</tr>$', row), row
    # The running run has one, from its start (90 s ago), not from its creation.
    WorkflowRun.objects.unscoped().filter(pk=running.pk).update(
        started_at=timezone.now() - dt.timedelta(seconds=90), created_at=F("created_at") - dt.timedelta(hours=1))
    assert fact(text(client.get(f"/runs/{running.pk}/")), "Duration") == "1\u00a0m 30\u00a0s"


def test_run_durations_count_from_the_start_only():
    now = timezone.now()
    assert run_text.run_duration(None, None, now) == "—"
    assert run_text.run_duration(None, now, now) == "—"  # cancelled while queued: it never ran
    assert run_text.run_duration(now - dt.timedelta(seconds=12.44), None, now) == "12.4\u00a0s"
    assert run_text.run_duration(now - dt.timedelta(seconds=185), now - dt.timedelta(seconds=5), now) == "3\u00a0m 00\u00a0s"


def test_wait_reasons_lose_their_countdown_and_nothing_else():
    assert (run_text.without_countdown("waiting: rate limit github 10/10 per second, next window in 0.4 s")
            == "waiting: rate limit github 10/10 per second")
    assert (run_text.without_countdown("waiting: rate limit gh 3/3 per minute, next window in 44.9 s")
            == "waiting: rate limit gh 3/3 per minute")
    assert run_text.without_countdown("waiting: retry backoff, 3.2 s") == "waiting: retry backoff"
    assert (run_text.without_countdown(
        "waiting: rate limit gh 5/10 per second, 5 in a window's first half, second half in 0.2 s")
        == "waiting: rate limit gh 5/10 per second, 5 in a window's first half")
    for unchanged in ("waiting: concurrency stripe 5/5", "waiting: for a worker", "waiting: workflow run limit 2/2",
                      "waiting: organization's share of the workers (64 dispatched, not started)"):
        assert run_text.without_countdown(unchanged) == unchanged


def test_the_run_page_names_a_full_rate_window_without_a_countdown_that_would_stand_still(org):
    from engine.models import RateLimitBucket, Task

    wf = apply_definition(actor=actor_for(org), document={"name": "calls", "tasks": [
        {"key": "call", "type": "noop", "rate_limit": {"key": "github", "per_minute": 10}}]})
    assert Task.objects.unscoped().get(workflow=wf).rate_window_seconds == 60
    run = start_run(workflow=wf, actor=actor_for(org))
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        db_now = cur.fetchone()[0]
    RateLimitBucket.objects.create(organization=org, key="github", window_seconds=60, count=10,
                                   window_start=db_now - dt.timedelta(seconds=15))
    client = client_for(owner_of(org))
    for url in (f"/runs/{run.pk}/", f"/runs/{run.pk}/live/?after=0"):
        row = re.search(r'<tr id="task-call".*?</tr>', text(client.get(url))).group(0)
        assert '<span class="wait-reason">waiting: rate limit github 10/10 per minute</span>' in row, url
        assert "next window" not in row
    # The API, read at one instant, keeps the seconds.
    from engine.repositories import waiting
    assert "next window in" in waiting.reasons(run_id=run.pk)[TaskRun.objects.unscoped().get(workflow_run=run).pk]
