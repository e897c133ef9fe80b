"""The API client against the fake server: workflows, runs, events, secrets, errors,
retries, and what must never be logged."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest

from fakeserver import MEMBER_KEY, WORKER_KEY, FakeFlowForge
from flowforge_sdk import (
    ApiError,
    AuthenticationError,
    Backoff,
    Client,
    Conflict,
    NetworkError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    ValidationError,
    WaitTimeout,
    Workflow,
)
from flowforge_sdk.models import WorkerInfo

DIAMOND = {"name": "diamond", "tasks": [{"key": "start", "type": "noop"},
                                        {"key": "join", "type": "noop", "depends_on": ["start"]}]}


def test_base_url_gets_the_api_prefix_once(fake: FakeFlowForge) -> None:
    for given in (fake.url, fake.url + "/", fake.url + "/api/v1", fake.url + "/api/v1/"):
        with Client(given, MEMBER_KEY) as c:
            assert c.base_url == fake.url + "/api/v1/"
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:8000", MEMBER_KEY)
    with pytest.raises(ValueError, match="api_key is empty"):
        Client(fake.url, " ")


def test_apply_stores_a_new_version_of_the_name_each_time_it_changes(fake: FakeFlowForge, client: Client) -> None:
    wf = Workflow("thumbnails", description="Resize images.")
    fetch = wf.noop("fetch")
    wf.worker_task("resize", queue="images", input={"width": 640}, depends_on=[fetch])

    first = client.workflows.apply(wf)
    first_document = wf.to_document()
    same = client.workflows.apply(wf.to_document())  # identical: the server answers 200, unchanged
    assert (same.id, same.version, same.unchanged, first.unchanged) == (first.id, 1, True, False)
    wf.description = "Resize images to 640 px."
    second = client.workflows.apply(wf.to_document())

    assert (first.name, first.version, first.state) == ("thumbnails", 1, "active")
    assert second.version == 2 and not second.unchanged
    assert [t["key"] for t in first.tasks] == ["fetch", "resize"]
    (call,) = fake.calls_to("/workflows/")[:1]
    assert call.body == first_document
    assert client.workflows.get(first.id).version == 1
    latest = client.workflows.latest("thumbnails")
    assert latest is not None and latest.id == second.id
    assert client.workflows.latest("nope") is None
    assert [v.version for v in client.workflows.versions(first.id, page_size=1)] == [2, 1]


def test_a_refused_definition_raises_validation_error_with_the_paths(fake: FakeFlowForge, client: Client) -> None:
    with pytest.raises(ValidationError) as caught:
        client.workflows.apply({"name": "", "tasks": []})
    error = caught.value
    assert error.status == 400 and error.code == "invalid_definition"
    assert error.errors == [{"path": "name", "message": "required: the workflow's name"},
                            {"path": "tasks", "message": "a workflow needs at least one task"}]
    assert "name: required: the workflow's name" in str(error)


def test_lists_follow_next_links_with_the_clients_own_host(fake: FakeFlowForge, client: Client) -> None:
    names = [f"wf-{i:02d}" for i in range(7)]
    for name in names:
        client.workflows.apply({**DIAMOND, "name": name})
    got = [w.name for w in client.workflows.list(page_size=3)]
    assert got == names
    pages = fake.calls_to("/api/v1/workflows/", method="GET")
    assert len(pages) == 3  # 3 + 3 + 1
    # The fake's next links name another host; the client used only their query strings.
    assert [p.query.get("cursor") for p in pages] == [None, "wf-02", "wf-05"]
    assert all(p.query["page_size"] == "3" for p in pages)


def test_start_sends_an_idempotency_key_and_a_repeat_returns_the_first_run(fake: FakeFlowForge,
                                                                           client: Client) -> None:
    client.workflows.apply(DIAMOND)
    run = client.runs.start("diamond", {"date": "2026-01-04"}, idempotency_key="key-1", priority=3)
    again = client.runs.start("diamond", {"date": "2026-01-04"}, idempotency_key="key-1", priority=3)

    assert run.state == "running" and run.replayed is False
    assert again.id == run.id and again.replayed is True
    assert run.input == {"date": "2026-01-04"} and run.priority == 3
    assert [t.key for t in run.task_runs] == ["start", "join"]
    assert run.workflow.name == "diamond" and run.workflow.version == 1
    starts = fake.calls_to("/api/v1/runs/")
    assert [c.headers["idempotency-key"] for c in starts] == ["key-1", "key-1"]
    assert starts[0].body == {"workflow": "diamond", "input": {"date": "2026-01-04"}, "priority": 3}
    with pytest.raises(Conflict) as caught:
        client.runs.start("diamond", {"date": "other"}, idempotency_key="key-1")
    assert caught.value.code == "conflict"


def test_a_start_whose_answer_was_lost_is_retried_with_the_same_key_and_starts_one_run(fake: FakeFlowForge,
                                                                                       client: Client) -> None:
    client.workflows.apply(DIAMOND)
    fake.inject("POST", r"/api/v1/runs/$", 503, apply=True)  # the run starts, the answer is lost
    run = client.runs.start("diamond", {"n": 1})
    starts = fake.calls_to("/api/v1/runs/")
    assert len(starts) == 2
    key = starts[0].headers["idempotency-key"]
    assert len(key) == 36 and starts[1].headers["idempotency-key"] == key
    assert run.replayed is True
    assert list(fake.runs) == [run.id]


def test_apply_is_not_retried_after_the_request_was_sent(fake: FakeFlowForge, client: Client) -> None:
    fake.inject("POST", r"/api/v1/workflows/$", 503, apply=True)
    with pytest.raises(ServerError) as caught:
        client.workflows.apply(DIAMOND)
    assert caught.value.status == 503
    assert len(fake.calls_to("/api/v1/workflows/")) == 1  # a retry could have stored a second version


def test_get_is_retried_after_a_502_and_a_429_honours_retry_after(fake: FakeFlowForge, client: Client) -> None:
    client.workflows.apply(DIAMOND)
    run = client.runs.start("diamond")
    fake.inject("GET", r"/api/v1/runs/[^/]+/$", 502)
    fake.inject("GET", r"/api/v1/runs/[^/]+/$", 429, headers={"Retry-After": "0.3"})
    began = time.monotonic()
    assert client.runs.get(run.id).id == run.id
    assert time.monotonic() - began >= 0.3
    assert len(fake.calls_to(f"/api/v1/runs/{run.id}/", method="GET")) == 3


def test_wait_polls_until_the_run_finishes(fake: FakeFlowForge, client: Client) -> None:
    client.workflows.apply(DIAMOND)
    run = client.runs.start("diamond")
    fake.finish_runs_after_gets = 3
    done = client.runs.wait(run.id, timeout=10, poll_interval=0.05)
    assert done.state == "succeeded" and done.finished and done.succeeded
    assert done.task("join").state == "succeeded"
    assert fake.run_gets[run.id] == 3


def test_wait_times_out_with_the_last_state(fake: FakeFlowForge, client: Client) -> None:
    client.workflows.apply(DIAMOND)
    run = client.runs.start("diamond")
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as caught:
        client.runs.wait(run.id, timeout=0.5, poll_interval=0.1)
    assert 0.5 <= time.monotonic() - began < 2
    assert caught.value.run.state == "running"


def test_list_and_cancel_runs(fake: FakeFlowForge, client: Client) -> None:
    client.workflows.apply(DIAMOND)
    ids = [client.runs.start("diamond", {"n": n}).id for n in range(5)]
    assert [r.id for r in client.runs.list(page_size=2)] == list(reversed(ids))
    cancelled = client.runs.cancel(ids[0])
    assert cancelled.state == "cancelled"
    with pytest.raises(Conflict) as caught:
        client.runs.cancel(ids[0])
    assert caught.value.detail == "The run has already finished (cancelled)."
    assert [r.id for r in client.runs.list(state="cancelled")] == [ids[0]]
    with pytest.raises(NotFound):
        client.runs.get("0b7e7c8a-0000-4000-8000-000000000000")


def test_events_are_listed_in_order_across_pages(fake: FakeFlowForge, client: Client) -> None:
    client.workflows.apply(DIAMOND)
    run = client.runs.start("diamond")
    with fake.cond:
        for i in range(6):
            fake._event(run.id, "claimed", task_key="start", attempt=1, fencing_token=i + 1)
        fake._finish(fake.runs[run.id], "succeeded")
    events = list(client.events.list(run.id, page_size=3))
    assert [e.seq for e in events] == list(range(1, 9))
    assert events[0].kind == "run_started" and events[-1].kind == "run_finished"
    assert events[-1].to_state == "succeeded"
    assert [p.query.get("after") for p in fake.calls_to(f"/runs/{run.id}/events/", method="GET")] == [
        None, "3", "6"]
    assert [e.seq for e in client.events.list(run.id, after=6)] == [7, 8]
    assert [e.kind for e in client.events.follow(run.id, after=6, poll_interval=0.05)] == ["claimed", "run_finished"]


def test_secrets_are_created_rotated_listed_and_deleted(fake: FakeFlowForge, client: Client) -> None:
    created = client.secrets.set("CDN_TOKEN", "tok-1")
    rotated = client.secrets.set("CDN_TOKEN", "tok-2")
    client.secrets.set("DB_PASSWORD", "pw")

    assert (created.name, created.version, created.created) == ("CDN_TOKEN", 1, True)
    assert (rotated.version, rotated.created) == (2, False)
    assert fake.secrets["CDN_TOKEN"]["value"] == "tok-2"
    assert [s.name for s in client.secrets.list(page_size=1)] == ["CDN_TOKEN", "DB_PASSWORD"]
    assert client.secrets.get("DB_PASSWORD").version == 1
    client.secrets.delete("DB_PASSWORD")
    assert "DB_PASSWORD" not in fake.secrets
    with pytest.raises(NotFound):
        client.secrets.delete("DB_PASSWORD")
    with pytest.raises(ValidationError) as caught:
        client.secrets.set("EMPTY", "")
    assert caught.value.errors == {"value": ["required: a non-empty string"]}


def test_neither_the_key_nor_a_secret_value_is_logged_or_shown(fake: FakeFlowForge, client: Client,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client.secrets.set("CDN_TOKEN", "very-secret-value-123")
    fake.inject("PUT", r"/secrets/", 503)
    client.secrets.set("CDN_TOKEN", "very-secret-value-456")  # retried once: logged at debug
    fake.inject("PUT", r"/secrets/", 400, {"type": "about:blank", "title": "Bad Request", "status": 400,
                                           "detail": "refused", "code": "invalid"})
    with pytest.raises(ValidationError) as caught:
        client.secrets.set("CDN_TOKEN", "very-secret-value-789")
    text = caplog.text + repr(client) + str(caught.value) + repr(caught.value)
    assert "flowforge_sdk.http" in {r.name for r in caplog.records}
    for needle in ("very-secret-value", MEMBER_KEY, "s3cr3t"):
        assert needle not in text


def test_problem_details_map_to_exception_classes(fake: FakeFlowForge) -> None:
    cases: list[tuple[int, type[ApiError], str]] = [
        (400, ValidationError, "invalid"), (401, AuthenticationError, "authentication_failed"),
        (403, PermissionDenied, "permission_denied"), (404, NotFound, "not_found"),
        (409, Conflict, "stale_fencing_token"), (413, PayloadTooLarge, "payload_too_large"),
        (429, RateLimited, "throttled"), (422, ApiError, "quota_exceeded"), (500, ServerError, "server_error"),
        (503, ServerError, "poll_capacity"),
    ]
    with Client(fake.url, WORKER_KEY, retries=0) as c:
        for status, cls, code in cases:
            body = {"type": "about:blank", "title": "t", "status": status, "detail": f"detail {status}",
                    "code": code, "errors": {"fencing_token": ["must be a whole number"]}}
            fake.inject("POST", r"/heartbeat/$", status, body, headers={"Retry-After": "7", "X-Request-ID": "r-1"})
            with pytest.raises(cls) as caught:
                c.worker.heartbeat("tr-1", 1)
            error = caught.value
            assert type(error) is cls
            assert (error.status, error.code, error.detail) == (status, code, f"detail {status}")
            assert error.errors == {"fencing_token": ["must be a whole number"]}
            assert error.request_id == "r-1"
            assert error.problem["title"] == "t"
            if cls is RateLimited or cls is ServerError:
                assert isinstance(error, RateLimited | ServerError) and error.retry_after == 7.0


def test_an_error_without_a_problem_body_still_maps_by_status() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>Bad Gateway</html>")

    with Client("http://flowforge.test", MEMBER_KEY, retries=0, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ServerError) as caught:
            c.runs.get("r1")
    assert caught.value.status == 502 and caught.value.code is None
    assert caught.value.detail == "<html>Bad Gateway</html>"


def test_a_refused_key_is_an_authentication_error(fake: FakeFlowForge) -> None:
    with Client(fake.url, "ffk_wrong_key", retries=0) as c:
        with pytest.raises(AuthenticationError) as caught:
            list(c.workflows.list())
    assert caught.value.status == 401 and caught.value.code == "authentication_failed"


def test_an_unreachable_server_is_a_network_error_after_the_retries(fake: FakeFlowForge) -> None:
    fake.go_down()
    backoff = Backoff(initial_seconds=0.01, max_seconds=0.02)
    with Client(fake.url, MEMBER_KEY, retries=2, backoff=backoff) as c:
        with pytest.raises(NetworkError) as caught:
            c.runs.get("r1")
    assert isinstance(caught.value.cause, httpx.ConnectError)
    assert "no answer from the server" in str(caught.value)


def test_worker_calls_speak_the_protocol(fake: FakeFlowForge, worker_client: Client) -> None:
    # The input's secret holds letters no id, number or timestamp has: a check on "640" failed
    # whenever a random UUID in the repr happened to contain those three digits.
    task_id = fake.enqueue("images", "resize", input={"width": 640, "token": "sk-zqxw-never-printed"})
    info = WorkerInfo(id="w-1", name="resizer-1", host="box-7", sdk="flowforge-python/0.1.0", concurrency=4)
    polled = worker_client.worker.poll("images", worker=info, max_tasks=4, wait_seconds=1)
    (task,) = polled.tasks
    assert (task.task_run_id, task.fencing_token, task.attempt, task.name) == (task_id, 1, 1, "resize")
    assert task.input == {"width": 640, "token": "sk-zqxw-never-printed"}
    assert task.heartbeat_interval_seconds == 0.2
    assert "sk-zqxw" not in repr(task) and "width" not in repr(task)  # inputs may hold secrets: never in a repr
    assert fake.calls_to("/worker/poll")[0].body == {
        "queue": "images", "max_tasks": 4, "wait_seconds": 1,
        "worker": {"id": "w-1", "name": "resizer-1", "host": "box-7", "sdk": "flowforge-python/0.1.0",
                   "concurrency": 4}}
    assert task.lease_seconds == 30.0
    assert worker_client.worker.heartbeat(task_id, 1) is not None
    assert worker_client.worker.extend_lease(task_id, 1) == 30.0
    fake.heartbeat_lease_seconds = 4.5  # the lease cut short by the attempt's timeout
    assert worker_client.worker.extend_lease(task_id, 1) == 4.5
    fake.heartbeat_sends_lease = False
    assert worker_client.worker.extend_lease(task_id, 1) is None
    assert worker_client.worker.heartbeat(task_id, 1) is None
    assert worker_client.worker.logs(task_id, 1, [{"level": "info", "message": "hi"}]) == 1
    assert worker_client.worker.complete(task_id, 1, {"ok": True}) == "succeeded"
    with pytest.raises(Conflict) as caught:
        worker_client.worker.complete(task_id, 1, {"ok": True})
    assert caught.value.code == "stale_fencing_token"
    empty = worker_client.worker.poll("images", worker=info, wait_seconds=0)
    assert empty.tasks == []


def test_a_cancelled_poll_channel_cuts_off_the_poll_in_flight_which_claims_nothing(fake: FakeFlowForge,
                                                                                    worker_client: Client) -> None:
    info = WorkerInfo(id="w-1")
    channel = worker_client.worker.poll_channel(grace_seconds=0.3)
    outcome: dict[str, Any] = {}

    def poll() -> None:
        try:
            outcome["result"] = worker_client.worker.poll("images", worker=info, wait_seconds=30, channel=channel)
        except Exception as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        assert fake.wait_for(lambda: len(fake.calls_to("/worker/poll")) == 1)
        time.sleep(0.3)  # waiting on the server
        cancelled_at = time.monotonic()
        channel.cancel()
        thread.join(5)
        assert not thread.is_alive()
        # No answer came within the grace (nothing was ready): the connection was cut.
        assert isinstance(outcome.get("error"), NetworkError), outcome
        assert 0.25 <= outcome["at"] - cancelled_at < 2
        task_id = fake.enqueue("images", "resize")
        time.sleep(0.3)
        assert fake.task_runs[task_id].state == "ready"  # the server claimed nothing for the poll cut off
        with pytest.raises(NetworkError, match="cancelled"):
            worker_client.worker.poll("images", worker=info, wait_seconds=30, channel=channel)
        assert len(fake.calls_to("/worker/poll")) == 1  # refused before anything was sent
    finally:
        channel.close()
        thread.join(5)


def test_fail_reports_the_retry(fake: FakeFlowForge, worker_client: Client) -> None:
    task_id = fake.enqueue("images", "resize", max_attempts=2)
    worker_client.worker.poll("images", worker={"id": "w-1"}, wait_seconds=0)
    result = worker_client.worker.fail(task_id, 1, "x" * 20_000)
    assert (result.state, result.retry_in_seconds) == ("ready", 0.0)
    assert len(fake.calls_to(f"/tasks/{task_id}/fail")[0].body["error"]) == 10_000


def test_nan_in_a_body_is_refused_before_sending(fake: FakeFlowForge, worker_client: Client) -> None:
    with pytest.raises(ValueError):
        worker_client.worker.complete("tr-1", 1, {"score": float("nan")})
    assert fake.calls_to("/complete") == []


def test_models_read_times_with_z_and_any_fraction() -> None:
    from flowforge_sdk.models import parse_time

    when = parse_time("2026-12-02T20:31:05.12Z")
    assert when is not None and when.microsecond == 120000 and when.utcoffset() is not None
    assert parse_time("2026-01-05T10:00:01.750000+00:00") is not None
    assert parse_time("garbage") is None and parse_time(None) is None


def test_api_keys_are_listed_page_by_page_and_revoked() -> None:
    seen: list[tuple[str, str, str]] = []
    key = {"id": "k1", "prefix": "ab12", "name": "ci", "role": "worker", "created_by": "a@b.c",
           "created_at": "2026-01-05T10:00:00Z", "last_used_at": None, "expires_at": None, "revoked_at": None}
    older = {**key, "id": "k0", "prefix": "cd34", "name": "old", "role": "viewer", "created_at": "2026-01-04T10:00:00Z"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.query.decode()))
        if request.method == "GET" and "cursor" not in request.url.params:
            # /api-keys/ pages like every list: {"results": [...], "next": url | null}
            return httpx.Response(200, json={"results": [key], "next": "https://elsewhere.test/api/v1/api-keys/"
                                                                      "?page_size=1&cursor=c2"})
        if request.method == "GET":
            return httpx.Response(200, json={"results": [older], "next": None})
        return httpx.Response(200, json={**key, "revoked_at": "2026-01-05T11:00:00Z"})

    with Client("http://flowforge.test", MEMBER_KEY, transport=httpx.MockTransport(handler)) as c:
        listed = list(c.api_keys.list(page_size=1))
        revoked = c.api_keys.revoke("k1")
    assert [(k.id, k.role, k.revoked_at) for k in listed] == [("k1", "worker", None), ("k0", "viewer", None)]
    assert revoked.revoked_at is not None and revoked.revoked_at.hour == 11
    assert seen == [("GET", "/api/v1/api-keys/", "page_size=1"), ("GET", "/api/v1/api-keys/", "page_size=1&cursor=c2"),
                    ("POST", "/api/v1/api-keys/k1/revoke/", "")]


def test_backoff_grows_to_its_cap_with_jitter_and_never_overflows() -> None:
    low = Backoff(initial_seconds=1, max_seconds=8, rng=lambda: 0.0)
    high = Backoff(initial_seconds=1, max_seconds=8, rng=lambda: 0.999999)
    assert [low.next_delay() for _ in range(5)] == [0.5, 1, 2, 4, 4]  # each delay drawn from [d/2, d]
    assert [round(high.next_delay(), 3) for _ in range(5)] == [1, 2, 4, 8, 8]
    assert high.next_delay(retry_after=20) == 20  # at least the server's Retry-After
    high.failures = 5000  # days of outage
    assert round(high.next_delay(), 3) == 8
    high.reset()
    assert round(high.next_delay(), 3) == 1


def test_a_polled_tasks_schedule_is_read_from_the_answer_and_none_for_other_runs() -> None:
    from flowforge_sdk.models import WorkerTask

    schedule = {"scheduled_for": "2026-03-29T04:00:00+00:00", "data_interval_start": "2026-03-28T05:00:00+00:00",
                "data_interval_end": "2026-03-29T04:00:00+00:00"}
    base = {"task_run_id": "t", "fencing_token": 1, "workflow_run_id": "r", "task_key": "k"}
    assert WorkerTask.from_api({**base, "schedule": schedule}).schedule == schedule
    assert WorkerTask.from_api({**base, "schedule": None}).schedule is None
    assert WorkerTask.from_api(base).schedule is None
