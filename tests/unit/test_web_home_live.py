"""Issue 20: the home page ("what is running and what broke?"), the organization's live
run-change stream behind it and the run list, and the run page's task table filter and
pagination and its light live updates (only what changed).

Query counts are asserted (no N+1), another organization's runs never appear, and the task
table's parameters are validated with errors naming them.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import uuid
from collections import Counter

import pytest
from django.utils import timezone

from engine import org_hub
from engine.models import ScheduledTrigger, TaskRun, WorkflowRun
from engine.services import cancel_run
from frontend import live_org
from frontend.dag import STATE_CODES
from frontend.presenters import home as home_presenter
from frontend.presenters import run_page
from tests.unit.test_web_runs import (
    actor_for,
    client_for,
    counted,
    drive_run,
    make_run,
    member,
    owner_of,
    text,
)

# --- the home page -----------------------------------------------------------------------------


def _home_sections(body: str) -> dict[str, str]:
    """The HTML of each home section, by its data-section name."""
    return dict(re.findall(r'data-section="(\w+)">(.*?)</section>', body, flags=re.S))


def test_home_shows_running_failed_and_finished_runs_of_the_organization_only(make_org):
    org, other = make_org(), make_org()
    running = make_run(org, 3, name="ingest-orders")
    failed = drive_run(make_run(org, 2, name="partner-sync"), fail=["t000"])
    done = drive_run(make_run(org, 2, name="nightly-etl"))
    theirs = make_run(other, 2, name="their-secret-flow")
    drive_run(make_run(other, 2, name="their-failed-flow"), fail=["t000"])
    assert failed.state == "failed" and done.state == "succeeded" and running.state == "running"

    resp = client_for(owner_of(org)).get("/")
    assert resp.status_code == 200
    sections = _home_sections(resp.content.decode())
    assert str(running.pk) in sections["running"] and "ingest-orders" in sections["running"]
    assert str(failed.pk) in sections["failed"] and str(done.pk) not in sections["failed"]
    assert str(done.pk) in sections["finished"] and str(failed.pk) in sections["finished"]
    assert str(running.pk) not in sections["finished"]
    body = resp.content.decode()
    assert "their-secret-flow" not in body and "their-failed-flow" not in body and str(theirs.pk) not in body
    # The running run's progress and a duration the browser advances from its start.
    assert "0/3" in sections["running"] and f'data-started="{running.started_at.isoformat()}"' in sections["running"]
    # Live: the page holds the organization's stream and knows its fragment.
    assert 'data-stream-url="/live/runs/stream/"' in body and 'data-fragment-url="/home/live/"' in body


def test_home_shows_next_trigger_fire_times_and_queue_health(org, make_org):
    make_run(org, 1, name="cleanup")
    soon = timezone.now() + timezone.timedelta(minutes=5)
    ScheduledTrigger.objects.create(organization=org, name="every-hour", workflow_name="cleanup",
                                    cron_expression="0 * * * *", next_fire_at=soon)
    ScheduledTrigger.objects.create(organization=org, name="paused-one", workflow_name="cleanup",
                                    cron_expression="0 * * * *", next_fire_at=soon, enabled=False)
    ScheduledTrigger.objects.create(organization=make_org(), name="their-trigger", workflow_name="x",
                                    cron_expression="0 * * * *", next_fire_at=soon)
    from engine.services import apply_definition
    apply_definition(actor=actor_for(org), document={"name": "on-my-box", "tasks": [
        {"key": "a", "type": "worker", "config": {"queue": "gpu"}}]})
    body = text(client_for(owner_of(org)).get("/"))
    triggers = _home_sections(body)["triggers"]
    assert "every-hour" in triggers and "in 4\u00a0m" in triggers
    assert "paused-one" not in triggers and "their-trigger" not in body
    queues = _home_sections(body)["queues"]
    assert 'data-queue="gpu"' in queues


def test_home_query_count_does_not_grow_with_runs(org):
    client = client_for(owner_of(org))
    make_run(org, 2)
    client.get("/")
    resp, few = counted(client, "/")
    assert resp.status_code == 200
    for _ in range(6):
        make_run(org, 3)
        drive_run(make_run(org, 2))
        drive_run(make_run(org, 2), fail=["t000"])
    resp, many = counted(client, "/")
    assert len(many) == len(few), "\n".join(many)
    resp, fragment = counted(client, "/home/live/")
    assert resp.status_code == 200 and "data-live-fragment" in resp.content.decode()
    assert len(fragment) <= len(many)


def test_home_presenter_reads_at_most_six_statements(org, django_assert_max_num_queries):
    for _ in range(3):
        make_run(org, 2)
        drive_run(make_run(org, 2), fail=["t000"])
    with django_assert_max_num_queries(6):
        sections = home_presenter.home_sections(org)
    assert len(sections.running) == 3 and len(sections.failed) == 3 and len(sections.finished) == 3


def test_home_fragment_is_scoped_to_the_active_organization(make_org):
    org, other = make_org(), make_org()
    theirs = drive_run(make_run(other, 2, name="theirs"), fail=["t000"])
    body = client_for(owner_of(org)).get("/home/live/").content.decode()
    assert str(theirs.pk) not in body and "data-live-fragment" in body


# --- the organization's run-change stream -------------------------------------------------------


def test_org_stream_refuses_a_since_that_is_not_an_instant(org):
    client = client_for(owner_of(org))
    for bad in ("yesterday", "2026-12-03T10:00:00"):  # the second has no offset
        resp = client.get("/live/runs/stream/", {"since": bad})
        assert resp.status_code == 400
        assert "since" in resp.content.decode() and "ISO 8601" in resp.content.decode()


def test_org_stream_requires_sign_in(org):
    from tests.unit.test_identity import fresh_client

    resp = fresh_client().get("/live/runs/stream/")
    assert resp.status_code == 302


@pytest.mark.django_db(transaction=True)
def test_org_stream_says_change_at_once_for_a_change_since_the_page_was_read(make_org):
    org = make_org()
    before = timezone.now()
    make_run(org, 2)
    gen = live_org.org_changes(organization_id=org.pk, since=before)
    try:
        assert next(gen).startswith("retry:")
        assert next(gen).startswith("event: change\n")
    finally:
        gen.close()
    # Nothing changed since: no change at once, a keep-alive after the heartbeat.
    quiet = live_org.org_changes(organization_id=org.pk, since=timezone.now())
    old = live_org.HEARTBEAT_SECONDS
    live_org.HEARTBEAT_SECONDS = 0.3
    try:
        assert next(quiet).startswith("retry:")
        assert next(quiet) == ": keep-alive\n\n"
    finally:
        live_org.HEARTBEAT_SECONDS = old
        quiet.close()


@pytest.mark.django_db(transaction=True)
def test_org_stream_announces_a_failed_run_within_a_second_and_not_another_orgs(make_org):
    org, other = make_org(), make_org()
    run = make_run(org, 2, width=2)
    client = client_for(owner_of(org))
    # The hub LISTENs before the stream opens: its first connection wakes every wait (what
    # was announced before it listened is unknown), which would read as a change here when
    # this test runs first in its process.
    warm = org_hub.wait_for(org.pk)
    warm.wait(2.0)
    warm.close()
    resp = client.get("/live/runs/stream/", {"since": timezone.now().isoformat()})
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/event-stream")
    stream = iter(resp.streaming_content)
    received: list[tuple[float, bytes]] = []
    stop = threading.Event()
    old_heartbeat = live_org.HEARTBEAT_SECONDS
    live_org.HEARTBEAT_SECONDS = 0.5  # a keep-alive soon after the test is done lets the reader stop

    def read():
        for chunk in stream:
            received.append((time.monotonic(), chunk))
            if stop.is_set():
                return  # the generator stays suspended at a yield: resp.close() below ends it

    reader = threading.Thread(target=read, daemon=True)
    try:
        assert next(stream).startswith(b"retry:")
        reader.start()
        time.sleep(0.3)
        drive_run(make_run(other, 2, width=2), fail=["t000"])  # another organization's: nothing
        time.sleep(0.5)
        assert not any(b"event: change" in c for _, c in received), received
        committed = time.monotonic()
        drive_run(run, fail=["t000", "t001"])
        run.refresh_from_db()
        assert run.state == "failed"
        deadline = time.monotonic() + 5
        while not any(b"event: change" in c for _, c in received) and time.monotonic() < deadline:
            time.sleep(0.005)
        changes = [at for at, c in received if b"event: change" in c]
        assert changes, "no change announced"
        assert changes[-1] - committed < 1.0
    finally:
        stop.set()
        reader.join(timeout=10)
        live_org.HEARTBEAT_SECONDS = old_heartbeat
        assert not reader.is_alive()
        resp.close()  # closes the stream's generator: its hub wait is released


def test_org_stream_is_refused_past_the_stream_limits(org, settings):
    settings.FLOWFORGE_SSE_PER_PROCESS = 0
    resp = client_for(owner_of(org)).get("/live/runs/stream/")
    assert resp.status_code == 429 and resp["Retry-After"]


# --- the run list, live ------------------------------------------------------------------------


def test_run_list_fragment_has_the_table_alone_with_the_same_filters(make_org):
    org, other = make_org(), make_org()
    failed = drive_run(make_run(org, 2, name="sync"), fail=["t000"])
    ok = drive_run(make_run(org, 2, name="sync"))
    theirs = drive_run(make_run(other, 2, name="sync"), fail=["t000"])
    client = client_for(owner_of(org))
    page = client.get("/runs/?state=failed").content.decode()
    assert 'data-fragment-url="/runs/?state=failed&amp;fragment=1"' in page
    resp, sql = counted(client, "/runs/?state=failed&fragment=1")
    body = resp.content.decode()
    assert resp.status_code == 200 and body.lstrip().startswith("<div data-live-fragment")
    assert str(failed.pk) in body and str(ok.pk) not in body and str(theirs.pk) not in body
    assert "<form" not in body  # the filters stay as the reader set them
    _, full = counted(client, "/runs/?state=failed")
    assert len(sql) <= len(full)


# --- the run page: task table filter and pagination ---------------------------------------------


def test_task_table_pages_and_filters_by_state_and_key(org, monkeypatch):
    monkeypatch.setattr(run_page, "TASK_PAGE_SIZE", 10)
    run = make_run(org, 25, width=5)
    drive_run(run, steps=7)
    client = client_for(owner_of(org))

    def keys(body: str) -> list[str]:
        return re.findall(r'<tr id="task-(t\d+)" class="task-row', body)

    first = client.get(f"/runs/{run.pk}/").content.decode()
    assert keys(first) == [f"t{i:03d}" for i in range(10)]
    assert "1–10 of 25" in first and "page 1 of 3" in first and 'href="?task_page=2#tasks"' in first
    third = client.get(f"/runs/{run.pk}/?task_page=3").content.decode()
    assert keys(third) == [f"t{i:03d}" for i in range(20, 25)]
    # The timeline shows the page's rows too.
    assert len(re.findall(r'<g class="tl-row"', first)) == 10
    done = set(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="succeeded")
               .values_list("task__key", flat=True))
    by_state = client.get(f"/runs/{run.pk}/?task_state=succeeded").content.decode()
    assert set(keys(by_state)) == done and len(done) == 7
    by_key = client.get(f"/runs/{run.pk}/", {"task_key": "T01"}).content.decode()  # any case
    assert keys(by_key) == [f"t01{i}" for i in range(10)]
    both = client.get(f"/runs/{run.pk}/", {"task_key": "t00", "task_state": "succeeded"}).content.decode()
    assert set(keys(both)) == {k for k in done if k.startswith("t00")}
    none = client.get(f"/runs/{run.pk}/", {"task_key": "nope"}).content.decode()
    assert keys(none) == [] and "No task matches" in none
    # A page past the last shows the last.
    assert keys(client.get(f"/runs/{run.pk}/?task_page=99").content.decode()) == keys(third)


@pytest.mark.parametrize("params, named", [
    ({"task_state": "exploded"}, "task_state: exploded is not a task state"),
    ({"task_page": "0"}, "task_page: pages start at 1."),
    ({"task_page": "two"}, "task_page: a whole number from 1 is expected."),
    ({"task_key": "k" * 201}, "task_key: at most 200 characters."),
])
def test_task_table_parameters_are_validated_with_errors_naming_them(org, params, named):
    run = make_run(org, 3)
    client = client_for(owner_of(org))
    page = client.get(f"/runs/{run.pk}/", params)
    assert page.status_code == 400 and named in text(page)
    assert len(re.findall(r'<tr id="task-', page.content.decode())) == 3  # the table unfiltered
    fragment = client.get(f"/runs/{run.pk}/live/", {"after": "0", **params})
    assert fragment.status_code == 400 and named in fragment.content.decode()


def test_task_table_is_scoped_another_orgs_run_is_a_404(make_org):
    org, other = make_org(), make_org()
    theirs = make_run(other, 3)
    client = client_for(owner_of(org))
    assert client.get(f"/runs/{theirs.pk}/?task_state=running").status_code == 404
    assert client.get(f"/runs/{theirs.pk}/live/?after=0&task_page=2").status_code == 404


def test_task_table_query_count_is_the_same_for_any_page_or_filter(org):
    run = make_run(org, 120, width=10)
    drive_run(run, steps=30)
    client = client_for(owner_of(org))
    client.get(f"/runs/{run.pk}/")
    _, plain = counted(client, f"/runs/{run.pk}/")
    for query in ("?task_page=2", "?task_state=succeeded", "?task_key=t1&task_page=2"):
        _, sql = counted(client, f"/runs/{run.pk}/{query}")
        assert len(sql) == len(plain), query


# --- the run page's live updates: only what changed ----------------------------------------------


def _sig(body: str) -> str:
    return re.search(r'data-table-sig="([0-9a-f]+)"', body).group(1)


def test_a_live_update_sends_only_the_changed_rows_and_the_graphs_new_states(org):
    run = make_run(org, 300, width=30)
    drive_run(run, steps=40)
    client = client_for(owner_of(org))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    run.refresh_from_db()
    seen, sig = run.last_event_seq, _sig(page)
    drive_run(run, steps=2)
    run.refresh_from_db()
    new_events = list(run_page.TaskRunEvent.objects.for_organization(org)
                      .filter(workflow_run=run, seq__gt=seen).values_list("task_run_id", flat=True))
    changed = {tr for tr in new_events if tr}
    changed_keys = set(TaskRun.objects.for_organization(org).filter(pk__in=changed)
                       .values_list("task__key", flat=True))
    resp = client.get(f"/runs/{run.pk}/live/", {"after": seen, "sig": sig}, HTTP_ACCEPT_ENCODING="gzip")
    assert resp.status_code == 200 and resp["Content-Encoding"] == "gzip"
    wire = len(resp.content)
    body = gzip.decompress(resp.content).decode()
    # The graph is not drawn again (the browser draws it: frontend/graph/graph.js): its states,
    # a letter a task in the graph's order (frontend.dag.states_code), which it recolours from.
    assert "<svg xmlns" not in body
    states = json.loads(re.search(r'<script id="graph-states" type="application/json">(.*?)</script>',
                                  body).group(1))
    by_state = Counter(TaskRun.objects.for_organization(org).filter(workflow_run=run)
                       .values_list("state", flat=True))
    assert len(states) == 300
    assert Counter(states) == Counter({STATE_CODES[state]: n for state, n in by_state.items()})
    # The task table and the timeline: the changed rows of the page only.
    assert 'data-region="run-tasks" data-mode="patch"' in body
    row_keys = set(re.findall(r'<tr id="task-(t\d+)"', body))
    assert row_keys and row_keys <= changed_keys
    assert set(re.findall(r'<g class="tl-row" data-task-key="(t\d+)"', body)) == row_keys
    print(f"live update of a 300-task run: {len(body)} bytes of HTML, {wire} bytes gzipped; "
          f"the page: {len(page)} bytes")
    assert wire <= 20 * 1024
    assert len(body) <= 20 * 1024


def test_a_live_updates_query_count_does_not_grow_with_the_run(org):
    client = client_for(owner_of(org))

    def delta_queries(n: int, width: int) -> tuple[int, int]:
        run = make_run(org, n, width=width)
        drive_run(run, steps=width)
        sig = _sig(client.get(f"/runs/{run.pk}/").content.decode())
        run.refresh_from_db()
        seen = run.last_event_seq
        drive_run(run, steps=2)
        resp, sql = counted(client, f"/runs/{run.pk}/live/?after={seen}&sig={sig}")
        assert 'data-mode="patch"' in resp.content.decode()
        return len(sql), len(resp.content)

    delta_queries(6, 3)  # warm-up
    small, _ = delta_queries(6, 3)
    big, size = delta_queries(300, 30)
    assert big == small
    assert size <= 20 * 1024


def test_a_live_update_sends_the_page_whole_when_its_rows_changed(org):
    run = make_run(org, 30, width=10)
    drive_run(run, steps=3)
    client = client_for(owner_of(org))
    page = client.get(f"/runs/{run.pk}/?task_state=running").content.decode()
    run.refresh_from_db()
    seen, sig = run.last_event_seq, _sig(page)
    drive_run(run, steps=2)  # two running tasks succeeded: the filtered page lost them
    body = client.get(f"/runs/{run.pk}/live/", {"after": seen, "sig": sig, "task_state": "running"}).content.decode()
    assert '<div data-region="run-tasks">' in body and 'data-mode="patch"' not in body
    # Without a signature (a page with no chart yet) the page goes whole too.
    body = client.get(f"/runs/{run.pk}/live/", {"after": seen}).content.decode()
    assert '<div data-region="run-tasks">' in body


def test_running_durations_and_bars_carry_their_start_for_the_client(org):
    run = make_run(org, 2, width=2)
    ready = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="ready")
                 .values_list("id", flat=True))
    from engine.repositories import task_runs
    from tests import engine_helpers
    task_runs.claim_ready_many(limit=len(ready), lease_seconds=30, owner="test", task_run_ids=ready)
    tr = TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running").first()
    engine_helpers.start_attempt(task_run_id=tr.pk, fencing_token=tr.fencing_token, owner="test", lease_seconds=30)
    tr.refresh_from_db()
    run.refresh_from_db()
    body = client_for(owner_of(org)).get(f"/runs/{run.pk}/").content.decode()
    assert f'data-started="{tr.started_at.isoformat()}"' in body  # the task's duration cell
    assert f'class="num run-duration" data-started="{run.started_at.isoformat()}"' in body
    start_ms = re.search(r'class="tl-bar outcome-running"[^>]*data-start="(\d+)"', body)
    assert start_ms and "data-end" not in body[start_ms.start():body.index(">", start_ms.start())]
    assert 'data-now-ms="' in body and re.search(r'<svg class="timeline"[^>]*data-t0="\d+"', body)
    cancel_run(run=run, actor=actor_for(org), reason="done")
    done = client_for(owner_of(org)).get(f"/runs/{run.pk}/").content.decode()
    assert "data-started" not in done


def test_viewer_sees_the_home_page_and_a_run_page_page(org):
    viewer = member(org, "viewer")
    run = make_run(org, 3)
    client = client_for(viewer)
    assert str(run.pk) in client.get("/").content.decode()
    assert client.get(f"/runs/{run.pk}/?task_page=1").status_code == 200
    assert WorkflowRun.objects.for_organization(org).count() == 1
    assert uuid.UUID(str(run.pk))
