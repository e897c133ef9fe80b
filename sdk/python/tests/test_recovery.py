"""The client's recovery actions (docs/recovery.md): resume a run, retry, mark succeeded or
skip one of its task runs — the request each sends (method, path, body), the run each
returns, the problem each refusal raises, and that none is sent twice once it went out.
Against httpx.MockTransport answering as the API does; tests/integration/test_sdk_recovery.py
runs them against the real API."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fakeserver import MEMBER_KEY
from flowforge_sdk import Backoff, Client, Conflict, NetworkError, NotFound, PermissionDenied, ValidationError
from flowforge_sdk.models import TaskRun

RUN = "11111111-1111-4111-8111-111111111111"
TASK = "22222222-2222-4222-8222-222222222222"


def run_answer(state: str = "running") -> dict[str, Any]:
    return {"id": RUN, "workflow": {"id": "w1", "name": "nightly", "version": 3}, "state": state,
            "priority": 0, "error": None, "input": {"day": "2026-03-01"}, "created_at": "2026-03-02T01:00:00Z",
            "started_at": "2026-03-02T01:00:00Z", "finished_at": None, "trigger_source": "api",
            "retry_of": None, "resumed_at": "2026-03-02T09:00:00Z", "waiting_reason": None,
            "task_runs": [{"id": TASK, "key": "load", "state": "ready", "attempt": 2, "output": None, "error": "",
                           "created_at": "2026-03-02T01:00:00Z", "started_at": None, "finished_at": None,
                           "waiting_reason": None, "skip_reason": ""}]}


class Recorder:
    """A MockTransport handler that answers each request with the next of ``answers``
    (a status and a JSON body) and records (method, path, body) of each."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        status, answer = self.answers.pop(0)
        headers = {"Content-Type": "application/problem+json"} if status >= 400 else {}
        return httpx.Response(status, json=answer, headers=headers)


def client_of(recorder: Recorder, **kwargs: Any) -> Client:
    return Client("http://flowforge.test", MEMBER_KEY, transport=httpx.MockTransport(recorder),
                  backoff=Backoff(initial_seconds=0.001, max_seconds=0.002), **kwargs)


def problem(status: int, detail: str, code: str, errors: Any = None) -> dict[str, Any]:
    return {"type": "about:blank", "title": "t", "status": status, "detail": detail, "code": code,
            **({"errors": errors} if errors is not None else {})}


def test_each_action_posts_to_its_endpoint_with_its_body_and_returns_the_run() -> None:
    rec = Recorder(*[(200, run_answer())] * 5)
    with client_of(rec) as c:
        resumed = c.runs.resume(RUN, reason="bucket restored")
        retried = c.runs.retry_task(RUN, TASK)
        marked = c.runs.mark_task_succeeded(RUN, TASK, {"rows": 42}, reason="loaded by hand")
        skipped = c.runs.skip_task(RUN, TaskRun(id=TASK, key="load", state="failed"), reason="not today")
        nulled = c.runs.mark_task_succeeded(RUN, TASK)
    base = f"/api/v1/runs/{RUN}/"
    assert rec.seen == [
        ("POST", f"{base}resume/", {"reason": "bucket restored"}),
        ("POST", f"{base}task-runs/{TASK}/retry/", {}),
        ("POST", f"{base}task-runs/{TASK}/mark-succeeded/", {"output": {"rows": 42}, "reason": "loaded by hand"}),
        ("POST", f"{base}task-runs/{TASK}/skip/", {"reason": "not today"}),
        ("POST", f"{base}task-runs/{TASK}/mark-succeeded/", {"output": None}),
    ]
    for run in (resumed, retried, marked, skipped, nulled):
        assert (run.id, run.state, run.workflow.name) == (RUN, "running", "nightly")
        assert (run.task("load").state, run.task("load").attempt, run.task("load").skip_reason) == ("ready", 2, "")


def test_a_refusal_is_a_conflict_carrying_the_servers_reason() -> None:
    why = ("task c cannot be retried: its trigger rule all_success (it runs once every upstream task succeeded) "
           "is not met by its upstream tasks (b failed); retry b (its downstream, c included, runs again) or mark "
           "it succeeded")
    rec = Recorder((409, problem(409, why, "conflict")),
                   (409, problem(409, f"run {RUN} is running; only a finished run can be resumed", "conflict")))
    with client_of(rec) as c:
        with pytest.raises(Conflict) as refused:
            c.runs.retry_task(RUN, TASK)
        assert refused.value.detail == why and refused.value.status == 409
        with pytest.raises(Conflict, match="only a finished run can be resumed"):
            c.runs.resume(RUN)
    assert len(rec.seen) == 2  # a 409 is not retried


def test_bad_input_forbidden_and_missing_map_to_their_errors() -> None:
    rec = Recorder(
        (400, problem(400, "Invalid input.", "invalid",
                      {"output": ["is 300000 bytes of JSON text; at most 262144 (FLOWFORGE_MAX_OUTPUT_BYTES)"]})),
        (403, problem(403, "Your role (viewer) may not do this.", "permission_denied")),
        (404, problem(404, "Not found.", "not_found")),
    )
    with client_of(rec) as c:
        with pytest.raises(ValidationError) as invalid:
            c.runs.mark_task_succeeded(RUN, TASK, {"data": "x"})
        assert invalid.value.errors == {
            "output": ["is 300000 bytes of JSON text; at most 262144 (FLOWFORGE_MAX_OUTPUT_BYTES)"]}
        with pytest.raises(PermissionDenied):
            c.runs.skip_task(RUN, TASK)
        with pytest.raises(NotFound):
            c.runs.resume(RUN)


def test_what_the_server_would_refuse_is_refused_before_sending() -> None:
    rec = Recorder()
    with client_of(rec) as c:
        with pytest.raises(ValueError, match="reason is 501 characters; at most 500"):
            c.runs.resume(RUN, reason="r" * 501)
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            c.runs.mark_task_succeeded(RUN, TASK, {"x": float("nan")})
        with pytest.raises(ValueError, match="task_run must be a task run's id or a TaskRun"):
            c.runs.retry_task(RUN, "")
        with pytest.raises(TypeError, match="reason must be a string"):
            c.runs.skip_task(RUN, TASK, reason=3)  # type: ignore[arg-type]
    assert rec.seen == []
    # 500 characters once NULs and surrounding blanks are gone, as the server counts them: sent.
    rec = Recorder((200, run_answer()))
    with client_of(rec) as c:
        c.runs.resume(RUN, reason=" " + "r" * 500 + "\x00\x00 ")
    assert rec.seen == [("POST", f"/api/v1/runs/{RUN}/resume/", {"reason": " " + "r" * 500 + "\x00\x00 "})]


def test_an_action_whose_answer_was_lost_is_not_sent_again_but_a_429_is_retried() -> None:
    sent: list[str] = []

    def lost(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        raise httpx.ReadTimeout("the answer was lost", request=request)

    with Client("http://flowforge.test", MEMBER_KEY, retries=3, transport=httpx.MockTransport(lost),
                backoff=Backoff(initial_seconds=0.001, max_seconds=0.002)) as c:
        with pytest.raises(NetworkError):
            c.runs.retry_task(RUN, TASK)
    assert sent == [f"/api/v1/runs/{RUN}/task-runs/{TASK}/retry/"]  # a second try could run the task twice

    rec = Recorder((429, problem(429, "Slow down.", "throttled")), (200, run_answer()))
    with client_of(rec, retries=2) as c:
        assert c.runs.skip_task(RUN, TASK).state == "running"
    assert [s[1] for s in rec.seen] == [f"/api/v1/runs/{RUN}/task-runs/{TASK}/skip/"] * 2
