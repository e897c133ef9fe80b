"""The worker API (issue 18, docs/workers.md) through Django's test client on real
PostgreSQL: a worker key polls, heartbeats, logs, completes and fails worker tasks of its
organization's queues, matched on the fencing token; every other key is refused; another
organization's worker never sees them; bad input is refused naming the field, with
nothing changed."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid

import pytest
from django.test import Client

from api import views_worker
from engine.models import TaskLog, TaskRun, TaskRunEvent, WorkerConnection
from engine.reaper import reap_once
from engine.services import apply_definition, cancel_run, start_run
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.models import KeyRole, Membership, Role
from tests.unit.test_api_auth import actor_of, assert_problem, bearer

WORKER_DAG = [
    {"key": "resize", "type": "worker", "config": {"queue": "images", "name": "resize_image",
                                                   "input": {"width": 640}},
     "max_attempts": 2, "retry_backoff_seconds": 0},
    {"key": "after", "type": "noop", "depends_on": ["resize"]},
]


class Org:
    def __init__(self, org):
        self.org = org
        self.owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
        self.worker_row, self.worker_key = create_api_key(actor=self.owner, name="workers", role=KeyRole.WORKER)
        _row, self.owner_key = create_api_key(actor=self.owner, name="owner", role=Role.OWNER)
        self.client = Client()

    def post(self, path, body, *, key=None):
        return self.client.post(f"/api/v1/{path}", json.dumps(body), content_type="application/json",
                                headers=bearer(key or self.worker_key))

    def poll(self, queue="images", *, max_tasks=1, wait=0, worker_id="w-1", key=None, **extra):
        return self.post("worker/poll/", {"queue": queue, "max_tasks": max_tasks, "wait_seconds": wait,
                                          "worker": {"id": worker_id, **extra}}, key=key)

    def start(self, tasks=WORKER_DAG, name="thumbs", run_input=None):
        wf = apply_definition(organization=self.org, document={"name": name, "tasks": tasks})
        return start_run(workflow=wf, run_input=run_input or {"url": "https://example.com/a.png"},
                         actor=Actor.system(self.org))


@pytest.fixture
def a(make_org):
    return Org(make_org())


@pytest.fixture
def b(make_org):
    return Org(make_org())


def task_run(run, key="resize") -> TaskRun:
    return TaskRun.objects.for_organization(run.organization_id).get(workflow_run=run, task__key=key)


def kinds(tr) -> list[str]:
    return list(TaskRunEvent.objects.for_organization(tr.organization_id).filter(task_run=tr)
                .order_by("seq").values_list("kind", flat=True))


@pytest.mark.django_db
def test_a_worker_task_waits_on_its_queue_and_a_poll_hands_it_out_started(a):
    run = a.start()
    tr = task_run(run)
    assert (tr.state, tr.queue) == ("ready", "images")  # the shared claim at start left it alone

    response = a.poll(name="resizer-1", host="box-7", sdk="flowforge-python/0.1.0", concurrency=4)
    assert response.status_code == 200, response.content
    (task,) = response.json()["tasks"]
    assert task["task_run_id"] == str(tr.pk)
    assert (task["fencing_token"], task["attempt"], task["max_attempts"]) == (1, 1, 2)
    assert (task["name"], task["queue"], task["task_key"], task["workflow"]) == (
        "resize_image", "images", "resize", "thumbs")
    assert task["input"] == {"width": 640}
    assert task["run_input"] == {"url": "https://example.com/a.png"}
    assert task["upstream"] == {}
    tr.refresh_from_db()
    assert (tr.state, tr.fencing_token, tr.started_fencing_token, tr.lease_owner) == ("running", 1, 1, "worker:w-1")
    assert kinds(tr)[-2:] == ["claimed", "started"]
    seen = WorkerConnection.objects.for_organization(a.org).get(worker_id="w-1", queue="images")
    assert (seen.name, seen.host, seen.sdk, seen.concurrency, seen.api_key_id) == (
        "resizer-1", "box-7", "flowforge-python/0.1.0", 4, a.worker_row.pk)
    # Handed out once: the next poll finds nothing.
    assert a.poll(worker_id="w-2").json()["tasks"] == []


@pytest.mark.django_db
def test_completion_with_the_held_token_succeeds_and_promotes_the_dependents(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    response = a.post(f"worker/tasks/{task['task_run_id']}/complete/",
                      {"fencing_token": task["fencing_token"], "output": {"thumbnail": "s3://x"}})
    assert response.status_code == 200, response.content
    assert response.json() == {"state": "succeeded"}
    tr = task_run(run)
    assert (tr.state, tr.output) == ("succeeded", {"thumbnail": "s3://x"})
    assert task_run(run, "after").state in {"ready", "running"}  # promoted (and claimed for the shared workers)


@pytest.mark.django_db
def test_a_stale_completion_gets_409_and_an_event_and_a_replayed_one_its_first_answer(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    url = f"worker/tasks/{task['task_run_id']}/complete/"
    wrong = a.post(url, {"fencing_token": 7, "output": 1})
    body = assert_problem(wrong, 409)
    assert body["code"] == "stale_fencing_token"
    assert "fencing token 7" in body["detail"]
    tr = task_run(run)
    assert (tr.state, tr.output) == ("running", None)
    assert kinds(tr)[-1] == "stale_completion_rejected"

    assert a.post(url, {"fencing_token": 1, "output": 1}).json() == {"state": "succeeded"}
    seq = TaskRunEvent.objects.for_organization(a.org).filter(workflow_run=run).order_by("-seq").first().seq
    # The same generation's completion again (a worker that lost the first answer retries):
    # the first answer again, the first output kept, nothing written.
    for output in (1, 2, 3):
        replay = a.post(url, {"fencing_token": 1, "output": output})
        assert (replay.status_code, replay.json()) == (200, {"state": "succeeded"})
    tr.refresh_from_db()
    assert (tr.state, tr.output) == ("succeeded", 1)
    assert not TaskRunEvent.objects.for_organization(a.org).filter(workflow_run=run, seq__gt=seq,
                                                                   task_run=tr).exists()
    # A failure of a generation that succeeded contradicts it: refused, once per generation and
    # outcome however often it is replayed, naming why; the run's history does not grow.
    for _ in range(5):
        failed = a.post(f"worker/tasks/{task['task_run_id']}/fail/", {"fencing_token": 1, "error": "x"})
        assert assert_problem(failed, 409)["code"] == "stale_fencing_token"
    rejected = [(e.fencing_token, e.detail["outcome"], e.detail.get("reason")) for e in TaskRunEvent.objects
                .for_organization(a.org).filter(task_run=tr, kind="stale_completion_rejected").order_by("seq")]
    assert rejected == [(7, "succeeded", "stale_fencing_token"), (1, "failed", "stale_fencing_token")]


@pytest.mark.django_db
def test_an_expired_lease_refuses_the_heartbeat_and_the_late_completion_of_the_old_generation(a, settings):
    settings.FLOWFORGE_WORKER_LEASE_SECONDS = 1.0
    run = a.start()
    task = a.poll().json()["tasks"][0]
    tid = task["task_run_id"]
    assert a.post(f"worker/tasks/{tid}/heartbeat/", {"fencing_token": 1}).json() == {"lease_seconds": 1.0}
    time.sleep(1.2)
    assert assert_problem(a.post(f"worker/tasks/{tid}/heartbeat/", {"fencing_token": 1}), 409)["code"] == \
        "lease_expired"
    reap_once()
    tr = task_run(run)
    assert (tr.state, tr.attempt, tr.fencing_token) == ("ready", 2, 2)  # a new generation, back on its queue
    again = a.poll(worker_id="w-2").json()["tasks"][0]
    assert (again["task_run_id"], again["fencing_token"], again["attempt"]) == (tid, 3, 2)
    late = a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": "late"})
    assert assert_problem(late, 409)["code"] == "stale_fencing_token"
    assert a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 3, "output": "ok"}).status_code == 200
    tr.refresh_from_db()
    assert (tr.state, tr.output) == ("succeeded", "ok")


@pytest.mark.django_db
def test_a_cancelled_run_answers_the_next_heartbeat_with_409_cancelled(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    assert cancel_run(run=run, actor=Actor.system(a.org)) is True
    body = assert_problem(a.post(f"worker/tasks/{task['task_run_id']}/heartbeat/", {"fencing_token": 1}), 409)
    assert body["code"] == "cancelled"


@pytest.mark.django_db
def test_fail_retryable_goes_back_to_the_queue_and_not_retryable_fails_the_run(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    url = f"worker/tasks/{task['task_run_id']}/fail/"
    response = a.post(url, {"fencing_token": 1, "error": "ValueError: too large"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "ready"
    second = a.poll().json()["tasks"][0]
    assert (second["attempt"], second["fencing_token"]) == (2, 2)
    final = a.post(url, {"fencing_token": 2, "error": "no", "retryable": False})
    assert final.json() == {"state": "failed", "retry_in_seconds": None}
    run.refresh_from_db()
    assert run.state == "failed"
    assert task_run(run, "after").state == "skipped"


@pytest.mark.django_db
def test_log_lines_are_kept_with_the_generation_and_refused_after_it(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    url = f"worker/tasks/{task['task_run_id']}/logs/"
    response = a.post(url, {"fencing_token": 1, "lines": [{"level": "info", "message": "one"},
                                                          {"level": "error", "message": "two"}]})
    assert response.json() == {"accepted": 2}
    rows = TaskLog.objects.for_organization(a.org).filter(task_run=task_run(run)).order_by("id")
    assert [(r.level, r.message, r.attempt, r.fencing_token) for r in rows] == [
        ("info", "one", 1, 1), ("error", "two", 1, 1)]
    assert assert_problem(a.post(url, {"fencing_token": 2, "lines": [{"message": "x"}]}), 409)["code"] == \
        "stale_fencing_token"
    assert rows.count() == 2


@pytest.mark.django_db
def test_only_worker_keys_may_call_and_worker_keys_may_call_nothing_else(a):
    a.start()
    assert assert_problem(a.poll(key=a.owner_key), 403)["code"] == "permission_denied"
    assert task_run(TaskRun.objects.for_organization(a.org).get(task__key="resize").workflow_run).state == "ready"
    for path in ("workflows/", "runs/", "api-keys/"):
        response = a.client.get(f"/api/v1/{path}", headers=bearer(a.worker_key))
        assert response.status_code == 403, (path, response.content)
    revoke_api_key(actor=a.owner, api_key=a.worker_row)
    assert a.poll().status_code == 401


@pytest.mark.django_db
def test_another_organizations_worker_never_sees_or_touches_the_tasks(a, b):
    run = a.start()
    # B's worker: its organization names no queue "images" yet, then it does (its own queue).
    unknown = assert_problem(b.poll("images"), 400)
    assert "no task of this organization's workflows waits on queue 'images'" in unknown["errors"]["queue"][0]
    apply_definition(organization=b.org, document={"name": "b-thumbs", "tasks": WORKER_DAG})
    assert b.poll("images").json()["tasks"] == []  # B's "images" is B's own queue
    task = a.poll().json()["tasks"][0]
    tid = task["task_run_id"]
    for verb, body in (("heartbeat", {"fencing_token": 1}), ("complete", {"fencing_token": 1, "output": 1}),
                       ("fail", {"fencing_token": 1, "error": "x"}),
                       ("logs", {"fencing_token": 1, "lines": [{"message": "x"}]})):
        response = b.post(f"worker/tasks/{tid}/{verb}/", body)
        assert assert_problem(response, 404)["code"] == "not_found", verb
    assert task_run(run).state == "running"
    assert not TaskLog.objects.unscoped().filter(task_run_id=tid).exists()


@pytest.mark.django_db
def test_a_shared_workers_task_run_is_not_a_worker_task(a):
    run = a.start([{"key": "n", "type": "noop"}], name="plain")
    tr = task_run(run, "n")
    assert assert_problem(a.post(f"worker/tasks/{tr.pk}/complete/", {"fencing_token": tr.fencing_token}), 404)


@pytest.mark.django_db
@pytest.mark.parametrize("body, field", [
    ({"queue": "bad queue", "worker": {"id": "w"}}, "queue"),
    ({"queue": "", "worker": {"id": "w"}}, "queue"),
    ({"queue": "images", "worker": {"id": "w"}, "max_tasks": 0}, "max_tasks"),
    ({"queue": "images", "worker": {"id": "w"}, "max_tasks": "3"}, "max_tasks"),
    ({"queue": "images", "worker": {"id": "w"}, "wait_seconds": 31}, "wait_seconds"),
    ({"queue": "images", "worker": {"id": ""}}, "worker"),
    ({"queue": "images"}, "worker"),
])
def test_a_malformed_poll_is_refused_naming_the_field_and_claims_nothing(a, body, field):
    run = a.start()
    body_ = assert_problem(a.post("worker/poll/", body), 400)
    assert field in body_["errors"], body_
    assert task_run(run).state == "ready"


@pytest.mark.django_db
def test_malformed_calls_on_a_task_are_refused_naming_the_field(a):
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    assert "fencing_token" in assert_problem(
        a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": "1", "output": 1}), 400)["errors"]
    assert "fencing_token" in assert_problem(a.post(f"worker/tasks/{tid}/heartbeat/", {}), 400)["errors"]
    lines = assert_problem(a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 1,
                                                                 "lines": [{"level": "loud", "message": "x"}]}), 400)
    assert "lines" in lines["errors"]
    assert "error" in assert_problem(a.post(f"worker/tasks/{tid}/fail/", {"fencing_token": 1, "error": ""}),
                                     400)["errors"]
    unknown = a.post(f"worker/tasks/{uuid.uuid4()}/heartbeat/", {"fencing_token": 1})
    assert_problem(unknown, 404)
    assert task_run(run).state == "running"


@pytest.mark.django_db
def test_an_oversized_output_is_413_naming_it_and_the_task_keeps_running(a, monkeypatch):
    # The output's own limit, below the body's (FLOWFORGE_MAX_BODY_BYTES, 1 MiB by default,
    # which answers first for a body over it).
    monkeypatch.setattr(views_worker, "MAX_OUTPUT_BYTES", 1000)
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    body = assert_problem(a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": "x" * 1000}), 413)
    assert body["code"] == "payload_too_large"
    assert body["errors"] == {"output": ["is 1002 bytes of JSON text; at most 1000"]}
    assert task_run(run).state == "running"
    too_big_body = a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": "x" * (1024 * 1024)})
    assert assert_problem(too_big_body, 413)["code"] == "payload_too_large"
    assert task_run(run).state == "running"


@pytest.mark.django_db
def test_an_output_is_measured_as_stored_with_its_numbers_written_out(a, monkeypatch):
    monkeypatch.setattr(views_worker, "MAX_OUTPUT_BYTES", 1000)
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    # 26 bytes sent; stored as [ + 4 numbers of 309 digits + 3 commas + ] = 1241 bytes.
    body = assert_problem(a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": [1e308] * 4}), 413)
    assert body["errors"] == {"output": ["is 1241 bytes of JSON text; at most 1000"]}
    assert task_run(run).state == "running"


@pytest.mark.django_db
def test_an_output_holding_nul_or_an_unpaired_surrogate_is_stored_as_a_runs_input_would_be(a):
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    raw = '{"fencing_token": 1, "output": {"nul": "a\\u0000b", "lone": "x\\ud800y", "k\\u0000": 1}}'
    done = a.client.post(f"/api/v1/worker/tasks/{tid}/complete/", raw, content_type="application/json",
                         headers=bearer(a.worker_key))
    assert done.status_code == 200, done.content
    assert task_run(run).output == {"nul": "ab", "lone": "x\ufffdy", "k": 1}


@pytest.mark.django_db
def test_a_heartbeat_near_the_attempts_timeout_answers_the_shorter_lease_it_granted(a):
    run = a.start([{"key": "resize", "type": "worker", "config": {"queue": "images"}, "timeout_seconds": 5}])
    task = a.poll().json()["tasks"][0]
    assert task["lease_seconds"] == 5  # FLOWFORGE_WORKER_LEASE_SECONDS is 60: the timeout comes first
    assert task["heartbeat_interval_seconds"] == round(5 / 3, 3)  # paced by the lease granted
    answer = a.post(f"worker/tasks/{task['task_run_id']}/heartbeat/", {"fencing_token": 1}).json()
    tr = task_run(run)
    left = (tr.started_at + dt.timedelta(seconds=5) - tr.lease_expires_at).total_seconds()
    assert abs(left) < 0.01  # the lease was extended to the timeout, no further
    assert 3.0 < answer["lease_seconds"] <= 5.0


@pytest.mark.django_db
def test_heartbeats_and_completions_have_a_budget_apart_from_polls_and_log_lines(a, settings, monkeypatch):
    from api import throttling

    monkeypatch.setattr(throttling, "now", lambda: 1_900_000_000 + 10.0)  # one window throughout
    settings.FLOWFORGE_API_RATE_LIMIT_PER_MINUTE = 2
    settings.FLOWFORGE_WORKER_LEASE_CALLS_PER_MINUTE = 3
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]  # API call 1
    line = {"fencing_token": 1, "lines": [{"message": "working"}]}
    assert a.post(f"worker/tasks/{tid}/logs/", line).status_code == 200  # API call 2
    spent = assert_problem(a.post(f"worker/tasks/{tid}/logs/", line), 429)
    assert "this API key's rate limit of 2 requests per minute is spent" in spent["detail"]
    # The API's budget is spent, and the lease calls still have theirs: the task is not lost.
    assert [a.post(f"worker/tasks/{tid}/heartbeat/", {"fencing_token": 1}).status_code for _ in range(2)] == [200, 200]
    assert a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": 1}).status_code == 200
    assert task_run(run).state == "succeeded"
    over = assert_problem(a.post(f"worker/tasks/{tid}/heartbeat/", {"fencing_token": 1}), 429)
    assert "limit of calls on held tasks of 3 requests per minute is spent" in over["detail"]


@pytest.mark.django_db
def test_the_output_limit_counts_compact_utf8_json_text(a, monkeypatch):
    output = {"name": "café", "sizes": [1, 2]}  # {"name":"café","sizes":[1,2]}: 30 bytes ("é" is 2)
    a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    monkeypatch.setattr(views_worker, "MAX_OUTPUT_BYTES", 29)
    body = assert_problem(a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": output}), 413)
    assert body["errors"] == {"output": ["is 30 bytes of JSON text; at most 29"]}
    monkeypatch.setattr(views_worker, "MAX_OUTPUT_BYTES", 30)  # not 34, its size with ", " and ": "
    assert a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": output}).json() == {
        "state": "succeeded"}


@pytest.mark.django_db
@pytest.mark.parametrize("config, message", [
    ({}, "'queue' is required"),
    ({"queue": "has space"}, "not a queue name"),
    ({"queue": "q", "name": "a/b"}, "not a handler name"),
    ({"queue": "q", "input": [1]}, "'input' must be an object"),
    ({"queue": "q", "extra": 1}, "unknown field"),
])
def test_a_worker_task_definition_is_checked_at_apply_time(a, config, message):
    from engine.definitions import DefinitionError

    with pytest.raises(DefinitionError) as info:
        apply_definition(organization=a.org, document={"name": "bad", "tasks": [
            {"key": "w", "type": "worker", "config": config}]})
    (error,) = info.value.errors
    assert error["path"] == "tasks[w].config"
    assert message in error["message"]


@pytest.mark.django_db
def test_a_poll_past_the_process_capacity_gets_503_with_retry_after_or_the_ready_task(a, settings, caplog):
    settings.FLOWFORGE_WORKER_POLLS_PER_PROCESS = 0
    apply_definition(organization=a.org, document={"name": "thumbs", "tasks": WORKER_DAG})
    caplog.set_level(logging.INFO)
    response = a.poll(wait=10)
    body = assert_problem(response, 503)
    assert body["code"] == "poll_capacity"
    assert response["Retry-After"] == "2"
    # Routine under load: one WARNING saying when the worker comes back, not Django's ERROR line.
    said = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [("api.views_worker", logging.WARNING, "poll of queue 'images' by worker w-1 refused: this "
                     "process holds as many waiting polls as it may; the worker is asked to retry after 2 s")]
    assert not WorkerConnection.objects.for_organization(a.org).exists()  # not listed as serving the queue
    run = a.start()
    (task,) = a.poll(wait=10).json()["tasks"]  # something ready: handed out without waiting
    assert task["task_run_id"] == str(task_run(run).pk)


@pytest.mark.django_db
def test_a_worker_queue_obeys_concurrency_permits_and_priorities(a):
    tasks = [{"key": f"t{i}", "type": "worker", "config": {"queue": "images"},
              "concurrency": {"key": "cdn", "limit": 2}} for i in range(4)]
    low = a.start(tasks, name="limited")
    high = start_run(workflow=apply_definition(organization=a.org, document={"name": "urgent", "tasks": [
        {"key": "u", "type": "worker", "config": {"queue": "images"}, "priority": 5}]}),
        actor=Actor.system(a.org), priority=3)
    handed = a.poll(max_tasks=10).json()["tasks"]
    # The priority 8 task first; then two of the four holding the key's two permits.
    assert handed[0]["task_run_id"] == str(task_run(high, "u").pk)
    assert len(handed) == 3
    held = [t for t in handed if t["task_key"].startswith("t")]
    assert len(held) == 2
    assert a.poll(max_tasks=10).json()["tasks"] == []  # the permits are held
    a.post(f"worker/tasks/{held[0]['task_run_id']}/complete/", {"fencing_token": held[0]["fencing_token"]})
    (third,) = a.poll(max_tasks=10).json()["tasks"]  # one permit came back
    assert third["task_key"].startswith("t") and third["task_run_id"] not in {t["task_run_id"] for t in held}
    assert TaskRun.objects.for_organization(a.org).filter(workflow_run=low, state="running").count() == 2


@pytest.mark.django_db
def test_made_up_worker_ids_stop_being_recorded_at_the_cap_and_old_ones_are_purged(a, monkeypatch):
    from django.utils import timezone

    from engine.repositories import worker_queues as repo
    from engine.services import purge_forgotten_workers

    monkeypatch.setattr(repo, "MAX_WORKERS_PER_ORGANIZATION", 3)
    apply_definition(organization=a.org, document={"name": "thumbs", "tasks": WORKER_DAG})
    for i in range(5):
        assert a.poll(worker_id=f"made-up-{i}").status_code == 200  # polling still works
    rows = WorkerConnection.objects.for_organization(a.org)
    assert sorted(rows.values_list("worker_id", flat=True)) == ["made-up-0", "made-up-1", "made-up-2"]
    assert a.poll(worker_id="made-up-0", name="renamed").status_code == 200  # a known worker is refreshed
    assert rows.get(worker_id="made-up-0").name == "renamed"
    rows.filter(worker_id="made-up-1").update(last_seen_at=timezone.now() - dt.timedelta(days=8))
    assert purge_forgotten_workers() == 1
    assert sorted(rows.values_list("worker_id", flat=True)) == ["made-up-0", "made-up-2"]


@pytest.mark.django_db
def test_a_poll_of_a_queue_no_task_names_is_400_naming_queue_and_records_no_worker(a):
    body = assert_problem(a.poll("imagse"), 400)
    assert list(body["errors"]) == ["queue"]
    assert "apply a workflow with a worker task on it" in body["errors"]["queue"][0]
    assert not WorkerConnection.objects.for_organization(a.org).exists()
    # An archived version still names it: its queue stays known.
    wf = apply_definition(organization=a.org, document={"name": "thumbs", "tasks": WORKER_DAG})
    wf.state = "archived"
    wf.save(update_fields=["state"])
    assert a.poll("images").status_code == 200


SECRET_DAG = [{"key": "call", "type": "worker", "config": {"queue": "images", "name": "call",
                                                          "input": {"auth": "Bearer {{ secrets.CDN_TOKEN }}"}}}]


@pytest.mark.django_db
def test_a_worker_tasks_secret_reference_is_resolved_in_the_poll_and_redacted_from_what_comes_back(a):
    from tenancy.vault import set_secret

    set_secret(actor=a.owner, name="CDN_TOKEN", value="tok-" + "x" * 20)
    run = a.start(SECRET_DAG, name="with-secret")
    (task,) = a.poll().json()["tasks"]
    assert task["input"] == {"auth": "Bearer tok-" + "x" * 20}  # resolved for the worker only
    tr = task_run(run, "call")
    assert tr.task.config["input"] == {"auth": "Bearer {{ secrets.CDN_TOKEN }}"}  # stored as written
    tid = task["task_run_id"]
    a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 1, "lines": [{"message": "sent tok-" + "x" * 20}]})
    done = a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": {"echo": "tok-" + "x" * 20}})
    assert done.status_code == 200, done.content
    tr.refresh_from_db()
    assert tr.output == {"echo": "[redacted]"}
    assert list(TaskLog.objects.for_organization(a.org).filter(task_run=tr).values_list("message", flat=True)) == [
        "sent [redacted]"]


TWO_SECRET_DAG = [{"key": "call", "type": "worker", "config": {
    "queue": "images", "name": "call",
    "input": {"auth": "Bearer {{ secrets.CDN_TOKEN }}", "db": "{{ secrets.DB_PASSWORD }}"}}}]


@pytest.mark.django_db
@pytest.mark.parametrize("change", ["rotated", "deleted"])
def test_a_secret_rotated_or_deleted_while_a_worker_holds_it_is_still_redacted_by_the_value_handed_out(a, change):
    from tenancy.vault import delete_secret, set_secret

    old, other = "tok-old-" + "x" * 16, "pw-" + "z" * 16
    set_secret(actor=a.owner, name="CDN_TOKEN", value=old)
    set_secret(actor=a.owner, name="DB_PASSWORD", value=other)
    run = a.start(TWO_SECRET_DAG, name="with-secrets")
    (task,) = a.poll().json()["tasks"]
    assert task["input"] == {"auth": f"Bearer {old}", "db": other}
    if change == "rotated":
        set_secret(actor=a.owner, name="CDN_TOKEN", value="tok-new-" + "y" * 16)
    else:
        delete_secret(actor=a.owner, name="CDN_TOKEN")
    tid = task["task_run_id"]
    logged = a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 1, "lines": [{"message": f"used {old} {other}"}]})
    assert logged.status_code == 200, logged.content
    done = a.post(f"worker/tasks/{tid}/complete/", {"fencing_token": 1, "output": {"old": old, "other": other}})
    assert done.status_code == 200, done.content
    tr = task_run(run, "call")
    # The handed-out value, and the other secret's, are redacted whatever became of the first.
    assert tr.output == {"old": "[redacted]", "other": "[redacted]"}
    assert list(TaskLog.objects.for_organization(a.org).filter(task_run=tr).values_list("message", flat=True)) == [
        "used [redacted] [redacted]"]


@pytest.mark.django_db
def test_the_handed_out_values_of_a_generation_no_longer_running_are_purged(a):
    from engine.models import AttemptSecrets
    from engine.services import purge_finished_attempt_secrets
    from tenancy.vault import set_secret

    set_secret(actor=a.owner, name="CDN_TOKEN", value="tok-" + "p" * 20)
    a.start(SECRET_DAG, name="with-secret")
    a.start(SECRET_DAG, name="with-secret")
    first, second = a.poll(max_tasks=2).json()["tasks"]
    kept = AttemptSecrets.objects.for_organization(a.org)
    assert kept.count() == 2
    assert "tok-" + "p" * 20 not in kept.first().values_encrypted  # encrypted at rest
    a.post(f"worker/tasks/{first['task_run_id']}/complete/", {"fencing_token": 1, "output": None})
    assert purge_finished_attempt_secrets() == 1
    assert [str(r.task_run_id) for r in kept] == [second["task_run_id"]]  # still held: kept


@pytest.mark.django_db
def test_a_worker_task_whose_secret_was_deleted_fails_at_its_poll_without_retry(a):
    from tenancy.vault import delete_secret, set_secret

    set_secret(actor=a.owner, name="CDN_TOKEN", value="tok-" + "y" * 20)
    run = a.start(SECRET_DAG, name="with-secret")
    delete_secret(actor=a.owner, name="CDN_TOKEN")
    assert a.poll().json()["tasks"] == []
    tr = task_run(run, "call")
    assert tr.state == "failed"
    assert "secret CDN_TOKEN no longer exists (referenced at config.input.auth)" in tr.error


@pytest.mark.django_db
def test_a_worker_task_referencing_an_unknown_secret_is_refused_at_apply(a):
    from engine.definitions import DefinitionError

    with pytest.raises(DefinitionError) as info:
        apply_definition(organization=a.org, document={"name": "bad-secret", "tasks": SECRET_DAG})
    assert any("CDN_TOKEN" in e["message"] and e["path"].startswith("tasks[call].config.input")
               for e in info.value.errors), info.value.errors


@pytest.mark.django_db
@pytest.mark.parametrize("demoted_to", [Role.MEMBER, Role.VIEWER])
def test_a_worker_key_stops_when_its_creator_is_demoted_below_admin(a, demoted_to):
    from tenancy.services import change_role
    from tests.unit.test_web_workflows import add_member

    admin = add_member(a.org, Role.ADMIN)
    _row, key = create_api_key(actor=actor_of(admin), name="admins-workers", role=KeyRole.WORKER)
    a.start()
    assert a.poll(key=key, worker_id="before").status_code == 200
    a.start()
    change_role(actor=a.owner, membership=admin, role=demoted_to)
    # A member or viewer may not make worker keys: the key is cut off (it would be handed
    # secrets in its tasks' inputs), not capped as a member key would be.
    assert_problem(a.poll(key=key, worker_id="after"), 401)
    change_role(actor=a.owner, membership=Membership.objects.for_organization(a.org).get(pk=admin.pk),
                role=Role.ADMIN)
    assert a.poll(key=key, worker_id="restored").status_code == 200
