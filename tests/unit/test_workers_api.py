"""The organization's own workers as its members read them (issue 18, item 6) on real
PostgreSQL: GET /api/v1/workers/ (live cutoff, tasks held, filters, keyset pages),
GET /api/v1/queues/ (depth, oldest waiting, running, live workers), a task run's queue
and its queue's live workers in a run's detail, and GET /api/v1/runs/{run}/task-runs/{id}/logs/.
Viewers read them; worker keys get 403; another organization sees none of it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from engine.models import TaskRun, WorkerConnection
from engine.repositories import worker_queues as worker_rows
from tenancy.apikeys import create_api_key
from tenancy.models import Role
from tests.unit.test_api_auth import assert_problem, bearer
from tests.unit.test_worker_api import Org, task_run


@pytest.fixture
def a(make_org):
    return Org(make_org())


@pytest.fixture
def b(make_org):
    return Org(make_org())


def viewer_key(o: Org) -> str:
    return create_api_key(actor=o.owner, name="viewer", role=Role.VIEWER)[1]


def get(o: Org, path: str, key: str):
    return o.client.get(f"/api/v1/{path}", headers=bearer(key))


def seen(o: Org, worker_id: str, *, queue="images", ago: float = 0.0, **info) -> None:
    """A WorkerConnection row as a poll writes it, last seen ``ago`` seconds ago."""
    worker_rows.note_worker_seen(organization_id=o.org.pk, worker_id=worker_id, queue=queue,
                                 name=info.get("name", ""), host=info.get("host", ""), sdk=info.get("sdk", ""),
                                 concurrency=info.get("concurrency"), api_key_id=o.worker_row.pk)
    if ago:
        WorkerConnection.objects.for_organization(o.org).filter(worker_id=worker_id, queue=queue).update(
            last_seen_at=timezone.now() - dt.timedelta(seconds=ago))


@pytest.mark.django_db
def test_the_workers_list_shows_what_each_worker_said_whether_it_is_live_and_the_tasks_it_holds(a):
    a.start()
    a.start()
    polled = a.poll(max_tasks=2, worker_id="w-1", name="resizer-1", host="box-7", sdk="flowforge-python/0.1.0",
                    concurrency=4)
    assert len(polled.json()["tasks"]) == 2
    seen(a, "w-2")
    seen(a, "w-old", ago=600)
    seen(a, "w-other", queue="pdf")
    key = viewer_key(a)  # viewers read the workers page's data
    response = get(a, "workers/", key)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["next"] is None
    rows = [(w["queue"], w["worker_id"], w["live"], w["tasks_held"]) for w in body["results"]]
    assert rows == [("images", "w-1", True, 2), ("images", "w-2", True, 0), ("images", "w-old", False, 0),
                    ("pdf", "w-other", True, 0)]
    first = body["results"][0]
    assert (first["name"], first["host"], first["sdk"], first["concurrency"]) == (
        "resizer-1", "box-7", "flowforge-python/0.1.0", 4)
    assert first["first_seen_at"] and first["last_seen_at"]

    live = get(a, "workers/?live=true", key).json()["results"]
    assert [w["worker_id"] for w in live] == ["w-1", "w-2", "w-other"]
    gone = get(a, "workers/?live=false", key).json()["results"]
    assert [w["worker_id"] for w in gone] == ["w-old"]
    only_pdf = get(a, "workers/?queue=pdf", key).json()["results"]
    assert [w["worker_id"] for w in only_pdf] == ["w-other"]
    assert assert_problem(get(a, "workers/?queue=bad%20queue", key), 400)["errors"].keys() == {"queue"}
    assert assert_problem(get(a, "workers/?live=maybe", key), 400)["errors"].keys() == {"live"}


@pytest.mark.django_db
def test_live_is_a_poll_within_the_cutoff_or_a_held_task_whose_lease_is_current(a, settings):
    key = viewer_key(a)

    def live_of(worker_id):
        return {w["worker_id"]: (w["live"], w["tasks_held"]) for w in get(a, "workers/", key).json()["results"]}[
            worker_id]

    seen(a, "idle", ago=60)
    settings.FLOWFORGE_WORKER_LIVE_SECONDS = 90
    assert live_of("idle") == (True, 0)
    settings.FLOWFORGE_WORKER_LIVE_SECONDS = 30
    assert live_of("idle") == (False, 0)

    # A busy worker does not poll: its held task's current lease keeps it live.
    run = a.start()
    a.poll(worker_id="busy")
    WorkerConnection.objects.for_organization(a.org).filter(worker_id="busy").update(
        last_seen_at=timezone.now() - dt.timedelta(seconds=600))
    assert live_of("busy") == (True, 1)
    # Its lease ran out (the reaper has not taken the task back yet): still held, no longer live.
    TaskRun.objects.for_organization(a.org).filter(pk=task_run(run).pk).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert live_of("busy") == (False, 1)


@pytest.mark.django_db
def test_the_workers_list_pages_by_queue_and_worker_id_and_refuses_a_forged_cursor(a):
    for worker_id in ("w-5", "w-1", "w-3", "w-2", "w-4"):
        seen(a, worker_id)
    key = viewer_key(a)
    url, pages = "/api/v1/workers/?page_size=2", []
    while url:
        body = a.client.get(url, headers=bearer(key)).json()
        pages.append([w["worker_id"] for w in body["results"]])
        url = body["next"]
    assert pages == [["w-1", "w-2"], ["w-3", "w-4"], ["w-5"]]
    assert assert_problem(get(a, "workers/?cursor=notours", key), 400)["errors"].keys() == {"cursor"}
    assert assert_problem(get(a, "workers/?page_size=0", key), 400)["errors"].keys() == {"page_size"}


@pytest.mark.django_db
def test_the_queues_list_counts_ready_running_the_oldest_wait_and_live_workers(a):
    a.start()
    second = a.start()
    a.start()
    a.start([{"key": "p", "type": "worker", "config": {"queue": "pdf"}}], name="pdfs")
    run_idle = a.start([{"key": "x", "type": "worker", "config": {"queue": "zzz-idle"}}], name="idle")
    a.start([{"key": "q", "type": "worker", "config": {"queue": "aaa-quiet"}}], name="quiet")
    TaskRun.objects.for_organization(a.org).filter(workflow_run__workflow__name="quiet").update(
        state="skipped")  # a queue a definition names, with nothing waiting
    # The second run's task became ready 100 s ago (a retry's backoff, say).
    TaskRun.objects.for_organization(a.org).filter(pk=task_run(second).pk).update(
        ready_at=timezone.now() - dt.timedelta(seconds=100))
    a.poll(worker_id="w-1")  # the claim takes the first created: 2 left ready on images
    seen(a, "w-pdf", queue="pdf", ago=600)
    key = viewer_key(a)
    response = get(a, "queues/", key)
    assert response.status_code == 200, response.content
    rows = {q["queue"]: q for q in response.json()["results"]}
    assert list(rows) == ["aaa-quiet", "images", "pdf", "zzz-idle"]
    images = rows["images"]
    assert (images["ready"], images["running"], images["live_workers"]) == (2, 1, 1)
    assert 100 <= images["oldest_ready_age_seconds"] < 110
    assert images["oldest_ready_at"] == TaskRun.objects.for_organization(a.org).get(
        pk=task_run(second).pk).ready_at.isoformat().replace("+00:00", "Z")
    assert rows["pdf"]["live_workers"] == 0 and rows["pdf"]["ready"] == 1
    assert (rows["aaa-quiet"]["ready"], rows["aaa-quiet"]["oldest_ready_at"],
            rows["aaa-quiet"]["oldest_ready_age_seconds"]) == (0, None, None)
    TaskRun.objects.for_organization(a.org).filter(pk=task_run(run_idle, "x").pk).update(
        ready_at=timezone.now() - dt.timedelta(seconds=250))
    idle = get(a, "queues/", key).json()["results"][-1]
    assert idle["queue"] == "zzz-idle" and 250 <= idle["oldest_ready_age_seconds"] < 260

    first = get(a, "queues/?page_size=3", key).json()
    assert [q["queue"] for q in first["results"]] == ["aaa-quiet", "images", "pdf"]
    rest = a.client.get(first["next"], headers=bearer(key)).json()
    assert ([q["queue"] for q in rest["results"]], rest["next"]) == (["zzz-idle"], None)


@pytest.mark.django_db
def test_a_run_names_each_task_runs_queue_and_whether_its_queue_has_a_live_worker(a):
    run = a.start()
    key = viewer_key(a)

    def task_runs():
        return {t["key"]: t for t in get(a, f"runs/{run.pk}/", key).json()["task_runs"]}

    waiting = task_runs()
    assert (waiting["resize"]["queue"], waiting["resize"]["queue_live_workers"]) == ("images", 0)
    assert waiting["resize"]["waiting_reason"] == "waiting: for a worker"
    assert (waiting["after"]["queue"], waiting["after"]["queue_live_workers"]) == ("", None)
    seen(a, "w-1")
    assert task_runs()["resize"]["queue_live_workers"] == 1
    seen(a, "w-1", ago=600)
    assert task_runs()["resize"]["queue_live_workers"] == 0
    a.poll(worker_id="w-2")
    running = task_runs()["resize"]
    assert (running["state"], running["queue"], running["queue_live_workers"]) == ("running", "images", None)


@pytest.mark.django_db
def test_a_task_runs_log_lines_page_by_id_across_attempts(a):
    run = a.start()
    task = a.poll().json()["tasks"][0]
    tid = task["task_run_id"]
    lines = [{"level": level, "message": f"line {i}"} for i, level in enumerate(["info", "debug", "warning"])]
    assert a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 1, "lines": lines}).json() == {"accepted": 3}
    a.post(f"worker/tasks/{tid}/fail/", {"fencing_token": 1, "error": "boom"})
    a.poll()
    a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 2, "lines": [{"level": "error", "message": "again"},
                                                                       {"message": "<b>done</b>"}]})
    key = viewer_key(a)
    url, seen_lines = f"/api/v1/runs/{run.pk}/task-runs/{tid}/logs/?page_size=2", []
    pages = 0
    while url:
        response = a.client.get(url, headers=bearer(key))
        assert response.status_code == 200, response.content
        body = response.json()
        seen_lines += [(r["attempt"], r["fencing_token"], r["level"], r["message"]) for r in body["results"]]
        url = body["next"]
        pages += 1
    assert pages == 3
    assert seen_lines == [(1, 1, "info", "line 0"), (1, 1, "debug", "line 1"), (1, 1, "warning", "line 2"),
                          (2, 2, "error", "again"), (2, 2, "info", "<b>done</b>")]
    ids = [r["id"] for r in get(a, f"runs/{run.pk}/task-runs/{tid}/logs/", key).json()["results"]]
    assert ids == sorted(ids)
    after = get(a, f"runs/{run.pk}/task-runs/{tid}/logs/?after={ids[2]}", key).json()
    assert [r["message"] for r in after["results"]] == ["again", "<b>done</b>"] and after["next"] is None
    assert assert_problem(get(a, f"runs/{run.pk}/task-runs/{tid}/logs/?after=x", key), 400)["errors"].keys() == \
        {"after"}
    # A task run of the shared workers has no lines; a task run of another run is a 404.
    other = a.start()
    noop = task_run(run, "after")
    assert get(a, f"runs/{run.pk}/task-runs/{noop.pk}/logs/", key).json() == {"results": [], "next": None}
    assert assert_problem(get(a, f"runs/{other.pk}/task-runs/{tid}/logs/", key), 404)


@pytest.mark.django_db
def test_worker_keys_may_not_read_workers_queues_or_logs(a):
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    for path in ("workers/", "queues/", f"runs/{run.pk}/task-runs/{tid}/logs/"):
        assert assert_problem(get(a, path, a.worker_key), 403)["code"] == "permission_denied", path


@pytest.mark.django_db
def test_another_organization_sees_none_of_the_workers_queues_or_logs(a, b):
    run = a.start()
    tid = a.poll(worker_id="a-worker").json()["tasks"][0]["task_run_id"]
    a.post(f"worker/tasks/{tid}/logs/", {"fencing_token": 1, "lines": [{"message": "secret-ish"}]})
    b_key = viewer_key(b)
    assert get(b, "workers/", b_key).json() == {"results": [], "next": None}
    assert get(b, "queues/", b_key).json() == {"results": [], "next": None}
    foreign = get(b, f"runs/{run.pk}/task-runs/{tid}/logs/", b_key)
    assert assert_problem(foreign, 404)["detail"] == assert_problem(
        get(b, f"runs/{run.pk}/task-runs/{run.pk}/logs/", b_key), 404)["detail"]
    # B's own worker on a queue of the same name is B's alone; A's list does not show it.
    seen(b, "b-worker")
    assert [w["worker_id"] for w in get(a, "workers/", viewer_key(a)).json()["results"]] == ["a-worker"]
    assert [(q["queue"], q["running"], q["live_workers"]) for q in get(b, "queues/", b_key).json()["results"]] == [
        ("images", 0, 1)]


@pytest.mark.django_db
def test_the_lists_make_the_same_queries_whatever_the_number_of_workers_and_queues(a):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    key = viewer_key(a)

    def count(path):
        get(a, path, key)  # the key's verification is cached after its first request
        with CaptureQueriesContext(connection) as ctx:
            response = get(a, path, key)
        assert response.status_code == 200
        return len(ctx.captured_queries), len(response.json()["results"])

    seen(a, "w-1")
    few = {path: count(path) for path in ("workers/", "queues/")}
    for i in range(40):
        seen(a, f"w-more-{i}", queue=f"q{i % 9}")
    many = {path: count(path) for path in ("workers/", "queues/")}
    assert many["workers/"] == (few["workers/"][0], 41) and many["queues/"] == (few["queues/"][0], 10)
