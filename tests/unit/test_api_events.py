"""REST API: a run's events — the list in ``seq`` order with the ``?after=`` cursor, the
server-sent event stream (resume from Last-Event-ID or ?after=, live through LISTEN/
NOTIFY, heartbeat, ends at run_finished, stops watching so the process's listener hub
closes its LISTEN connection) and the NOTIFY
trigger itself. Runs are driven with engine.repositories (task_runs, runs), in process."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from api import streaming
from engine import live
from engine.models import TaskRun, TaskRunEvent, WorkflowRun
from engine.repositories import events, task_runs
from engine.services import apply_definition, start_run
from tenancy.models import Role
from tests import engine_helpers
from tests.unit.test_api_auth import assert_problem, bearer, data_queries
from tests.unit.test_api_workflows import Api, new_api_factory

DIAMOND = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "noop", "depends_on": ["a"]},
    {"key": "c", "type": "noop", "depends_on": ["a"]},
    {"key": "d", "type": "noop", "depends_on": ["b", "c"]},
]
OWNER = "test-driver"


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


def step(run_id) -> bool:
    """Claim the run's ready task runs, then start and complete every running one (each
    in its own transaction, like a worker). Returns True once the run is finished."""
    ready = list(TaskRun.objects.unscoped().filter(workflow_run_id=run_id, state="ready").values_list("pk", flat=True))
    if ready:
        with transaction.atomic():
            task_runs.claim_ready_many(limit=len(ready), lease_seconds=30, owner=OWNER, task_run_ids=ready)
    for tr in TaskRun.objects.unscoped().filter(workflow_run_id=run_id, state="running").select_related("task"):
        with transaction.atomic():
            engine_helpers.start_attempt(task_run_id=tr.pk, fencing_token=tr.fencing_token, owner=OWNER, lease_seconds=30)
        with transaction.atomic():
            engine_helpers.complete_attempt(task_run_id=tr.pk, fencing_token=tr.fencing_token, succeeded=True,
                                         output={"key": tr.task.key}, lease_seconds=30, owner=OWNER)
    return WorkflowRun.objects.unscoped().get(pk=run_id).is_terminal


def run_to_end(run_id) -> None:
    for _ in range(10):
        if step(run_id):
            return
    raise AssertionError(f"run {run_id} did not finish")


def all_seqs(run) -> list[int]:
    return list(TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run=run)
                .order_by("seq").values_list("seq", flat=True))


@pytest.fixture
def finished_run(api):
    wf = apply_definition(organization=api.org, document={"name": "diamond", "tasks": DIAMOND})
    run = start_run(workflow=wf, trigger_source="api")
    run_to_end(run.pk)
    run.refresh_from_db()
    assert run.state == "succeeded"
    return run


# --- the list -------------------------------------------------------------------------------------


def test_events_are_listed_in_seq_order_and_after_returns_only_later_ones(api, finished_run):
    seqs = all_seqs(finished_run)
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 10
    body = api.get(f"/api/v1/runs/{finished_run.pk}/events/?page_size=500", role=Role.VIEWER).json()
    assert [e["seq"] for e in body["results"]] == seqs and body["next"] is None
    kinds = [e["kind"] for e in body["results"]]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    first_claim = next(e for e in body["results"] if e["kind"] == "claimed")
    assert (first_claim["task_key"], first_claim["from_state"], first_claim["to_state"]) == ("a", "ready", "running")
    assert body["results"][0]["task_run"] is None and body["results"][0]["task_key"] is None

    later = api.get(f"/api/v1/runs/{finished_run.pk}/events/?after=5").json()["results"]
    assert [e["seq"] for e in later] == seqs[5:]
    assert api.get(f"/api/v1/runs/{finished_run.pk}/events/?after={seqs[-1]}").json() == {"results": [], "next": None}

    paged, url = [], f"/api/v1/runs/{finished_run.pk}/events/?page_size=4"
    while url:
        page = api.get(url).json()
        paged += [e["seq"] for e in page["results"]]
        url = page["next"]
        if url:
            assert f"after={paged[-1]}" in url and url.startswith("http://testserver/")
    assert paged == seqs

    for query in ("?after=-1", "?after=x", "?after=1.5", "?after=" + "9" * 23):
        # The message says the range (a 23-digit number is a whole number: it is too big).
        assert assert_problem(api.get(f"/api/v1/runs/{finished_run.pk}/events/{query}"), 400)["errors"] == {
            "after": ["must be a whole number from 0 to 999999999999999999 (at most 18 digits)"]}
    assert_problem(api.get(f"/api/v1/runs/{uuid.uuid4()}/events/"), 404)


def test_the_event_list_takes_a_constant_number_of_queries(api, finished_run):
    path = f"/api/v1/runs/{finished_run.pk}/events/?page_size=500"
    api.get(path)
    expected = len(all_seqs(finished_run))
    with CaptureQueriesContext(connection) as queries:
        assert len(api.get(path).json()["results"]) == expected
    assert len(data_queries(queries)) == 3  # the key's membership, the run, the events


# --- the stream -----------------------------------------------------------------------------------


def parse_sse(text: str) -> list[dict]:
    """SSE text as a list of {"id", "data", "comment", "retry"} dicts, one per message."""
    messages = []
    for block in text.split("\n\n"):
        if not block:
            continue
        message: dict = {}
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "":
                message["comment"] = value
            elif field == "data":
                message["data"] = json.loads(value)
            else:
                message[field] = value
        messages.append(message)
    return messages


def stream(api, run, *, headers=None, query="", role=Role.VIEWER):
    return api.client.get(f"/api/v1/runs/{run.pk}/events/stream/{query}",
                          headers={**bearer(api.keys[role]), "Accept": "text/event-stream", **(headers or {})})


def read_all(response) -> list[dict]:
    return parse_sse(b"".join(response.streaming_content).decode())


def listen_backends() -> int:
    """Open listener connections to this database: the listener hub's LISTEN connection
    (engine.live_hub, one per process while it serves a stream, none otherwise)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # else a transaction sees its first snapshot again
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s", [streaming.LISTENER_APPLICATION_NAME])
        return cur.fetchone()[0]


def wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_stream_resumes_after_last_event_id_and_ends_at_run_finished(api, finished_run):
    seqs = all_seqs(finished_run)
    response = stream(api, finished_run, headers={"Last-Event-ID": "2"}, query="?after=7")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    messages = read_all(response)  # returns: the stream ended by itself
    assert messages[0] == {"retry": str(streaming.RETRY_MILLISECONDS)}
    events = messages[1:]
    assert [int(m["id"]) for m in events] == seqs[2:]  # Last-Event-ID wins over ?after=
    assert all(m["data"]["seq"] == int(m["id"]) and m["data"]["run"] == str(finished_run.pk) for m in events)
    assert events[-1]["data"]["kind"] == "run_finished" and events[-1]["data"]["to_state"] == "succeeded"

    by_query = read_all(stream(api, finished_run, query="?after=7"))
    assert [int(m["id"]) for m in by_query[1:]] == seqs[7:]
    whole = read_all(stream(api, finished_run))
    assert [int(m["id"]) for m in whole[1:]] == seqs
    # Resumed after run_finished: nothing more will come, so it ends at once.
    assert read_all(stream(api, finished_run, headers={"Last-Event-ID": str(seqs[-1])})) == [
        {"retry": str(streaming.RETRY_MILLISECONDS)}]
    assert wait_for(lambda: listen_backends() == 0)  # no stream open: the process holds no LISTEN connection


def test_head_of_the_stream_answers_its_headers_without_streaming(api, monkeypatch):
    monkeypatch.setattr(streaming, "run_event_stream", None)  # never called
    wf = apply_definition(organization=api.org, document={"name": "head", "tasks": DIAMOND})
    run = start_run(workflow=wf, trigger_source="api")
    response = api.client.head(f"/api/v1/runs/{run.pk}/events/stream/", headers=bearer(api.keys[Role.VIEWER]))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    assert b"".join(response.streaming_content) == b""


def test_a_bad_resume_point_is_a_400_problem_naming_it(api, finished_run):
    response = stream(api, finished_run, headers={"Last-Event-ID": "abc"})
    body = assert_problem(response, 400)
    assert set(body["errors"]) == {"Last-Event-ID"}
    assert set(assert_problem(stream(api, finished_run, query="?after=-3"), 400)["errors"]) == {"after"}
    assert_problem(api.client.get(f"/api/v1/runs/{uuid.uuid4()}/events/stream/",
                                  headers={**bearer(api.keys[Role.VIEWER]), "Accept": "text/event-stream"}), 404)


# Transactional: closing a response fires request_finished, which closes a connection
# that is inside a test's transaction.
@pytest.mark.django_db(transaction=True)
def test_a_quiet_run_gets_heartbeats_and_closing_the_stream_closes_its_listen_connection(api_factory, monkeypatch):
    api = api_factory()
    monkeypatch.setattr(streaming, "HEARTBEAT_SECONDS", 0.3)
    monkeypatch.setattr(streaming, "POLL_SECONDS", 0.1)
    wf = apply_definition(organization=api.org, document={"name": "quiet", "tasks": DIAMOND})
    run = start_run(workflow=wf, trigger_source="api")
    assert wait_for(lambda: listen_backends() == 0)
    response = stream(api, run)
    chunks = iter(response.streaming_content)
    seen = []
    started = time.monotonic()
    while not any(c.startswith(b": heartbeat") for c in seen):
        seen.append(next(chunks))
        assert time.monotonic() - started < 5, seen
    assert listen_backends() == 1  # the process's listener hub
    assert [m.get("id") for m in parse_sse(b"".join(seen).decode()) if "id" in m] == ["1"]
    response.close()  # the client went away: the WSGI server closes the response
    assert wait_for(lambda: listen_backends() == 0)  # the hub's last stream ended: it closes its connection


@pytest.mark.django_db(transaction=True)
def test_the_stream_follows_a_live_run_through_notify_and_ends_at_run_finished(api_factory, monkeypatch):
    # Only a notification can wake the stream within the test's patience.
    monkeypatch.setattr(streaming, "POLL_SECONDS", 60.0)
    monkeypatch.setattr(streaming, "HEARTBEAT_SECONDS", 60.0)
    api = api_factory()
    wf = apply_definition(organization=api.org, document={"name": "live", "tasks": DIAMOND})
    run = start_run(workflow=wf, trigger_source="api")
    assert wait_for(lambda: listen_backends() == 0)
    received: list[tuple[float, bytes]] = []
    finished = threading.Event()

    def consume():
        try:
            response = stream(api, run)
            for chunk in response.streaming_content:
                received.append((time.monotonic(), chunk))
            response.close()
        finally:
            finished.set()
            connections.close_all()

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert wait_for(lambda: any(c.startswith(b"id: 1\n") for _, c in received)), received
    assert wait_for(lambda: listen_backends() == 1)
    for _ in range(10):
        before = len(received)
        done = step(run.pk)
        # Each committed step is announced: the stream sends its events long before POLL_SECONDS.
        assert wait_for(lambda n=before: len(received) > n, timeout=5), (before, received)
        if done:
            break
    assert finished.wait(10), "the stream did not end after run_finished"
    consumer.join(5)
    ids = [int(m["id"]) for m in parse_sse(b"".join(c for _, c in received).decode()) if "id" in m]
    assert ids == all_seqs(run)
    assert json.loads(received[-1][1].decode().split("data: ", 1)[1])["kind"] == "run_finished"
    assert wait_for(lambda: listen_backends() == 0)


# --- the trigger ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_event_insert_notifies_run_id_and_seq_at_commit_and_never_on_rollback(make_org):
    org = make_org()
    wf = apply_definition(organization=org, document={"name": "t", "tasks": DIAMOND[:1]})
    run = start_run(workflow=wf)
    listener = live.listen_connection(application_name="flowforge-test-listener")
    try:
        # Nobody subscribed to the run: its events are not announced (no commit serialization).
        with transaction.atomic():
            events.append(workflow_run_id=run.pk, kind="duplicate_delivery_ignored")
        assert list(listener.notifies(timeout=0.5)) == []
        live.subscribe(listener, organization_id=org.pk, run_id=run.pk)
        with transaction.atomic():
            seq = events.append(workflow_run_id=run.pk, kind="duplicate_delivery_ignored", detail={"big": "x" * 20_000})
            assert list(listener.notifies(timeout=0.3)) == []  # nothing before the commit
        (notify,) = list(listener.notifies(timeout=2, stop_after=1))
        assert (notify.channel, notify.payload) == (streaming.CHANNEL, f"{run.pk}:{seq}")

        class Boom(Exception):
            pass

        with pytest.raises(Boom), transaction.atomic():
            events.append(workflow_run_id=run.pk, kind="duplicate_delivery_ignored")
            raise Boom
        assert list(listener.notifies(timeout=0.5)) == []
    finally:
        listener.close()
    assert isinstance(listener, psycopg.Connection) and listener.closed
