"""The organization's own workers in the web UI (issue 18, item 6), through Django's test
client on real PostgreSQL: the workers page (queues with their depth, workers with what
they said of themselves, the empty state that says how to start one), the run page's
queue of a worker task and its warning while no worker is live on it, the worker log
lines on the run page and a task's whole log, and the API keys page's worker role."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from engine.models import TaskRun, WorkerConnection
from frontend.presenters import run_page
from tenancy.models import ApiKey, KeyRole, Role
from tests.unit.test_web_runs import client_for, counted, member, owner_of, text
from tests.unit.test_web_workflows import assert_csp_clean
from tests.unit.test_worker_api import Org, task_run
from tests.unit.test_workers_api import seen

WARNING = "No worker is polling"


@pytest.fixture
def a(make_org):
    return Org(make_org())


@pytest.fixture
def b(make_org):
    return Org(make_org())


def row_of(body: str, key: str) -> str:
    return re.search(rf'<tr id="task-{key}".*?</tr>', body, flags=re.S).group(0)


def send_logs(a: Org, tid: str, token: int, messages: list[str], level: str = "info"):
    for i in range(0, len(messages), 100):
        response = a.post(f"worker/tasks/{tid}/logs/", {
            "fencing_token": token, "lines": [{"level": level, "message": m} for m in messages[i:i + 100]]})
        assert response.status_code == 200, response.content


# --- the workers page ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_workers_page_says_how_to_start_a_worker_when_none_is_connected(a):
    owner = client_for(owner_of(a.org))
    response = owner.get("/workers/")
    assert response.status_code == 200
    body = text(response)
    assert_csp_clean(response.content.decode())
    assert "No queues yet" in body
    assert "No worker is connected yet" in body
    assert 'the <a href="/api-keys/">API keys</a> page, choose the role <strong>Worker</strong>' in body
    assert "sdk/python/README.md" in body and "docs/workers.md" in body
    assert '<a href="/workers/">Workers</a>' in body  # in the navigation
    # A viewer reads it too, and is told who creates keys.
    viewer = text(client_for(member(a.org, Role.VIEWER)).get("/workers/"))
    assert "Owners and admins create keys; ask one of them." in viewer
    assert 'href="/api-keys/">API keys</a> page' not in viewer


@pytest.mark.django_db
def test_the_workers_page_lists_queues_and_their_workers(a, b):
    a.start()
    a.start()
    a.poll(worker_id="w-1", name="resizer-1", host="box-7", sdk="flowforge-python/0.1.0", concurrency=4)
    seen(a, "w-gone", ago=3 * 3600, host="old-box")
    seen(a, "w-ancient", ago=3 * 24 * 3600)  # stopped days ago: only the API lists it
    a.start([{"key": "p", "type": "worker", "config": {"queue": "pdf"}}], name="pdfs")
    seen(b, "b-worker-secret", host="b-host")
    response = client_for(owner_of(a.org)).get("/workers/")
    assert response.status_code == 200
    body = text(response)
    queues = re.search(r'<table class="queues responsive">.*?</table>', body, flags=re.S).group(0)
    images = re.search(r'<tr data-queue="images".*?</tr>', queues, flags=re.S).group(0)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", images, flags=re.S)]
    assert cells[0] == "images" and cells[1] == "1" and cells[3] == "1" and cells[4] == "1"
    assert re.fullmatch(r"\d+(\.\d)?\u00a0(ms|s)", cells[2]), cells[2]  # the oldest waiting task's age
    pdf = re.search(r'<tr data-queue="pdf" class="starved".*?</tr>', queues, flags=re.S).group(0)
    assert '<span class="badge warn">none</span>' in pdf
    assert "No worker is polling queue <code>pdf</code>: its tasks wait until you start one with a worker key." in body
    assert "No worker is polling queue <code>images</code>" not in body

    section = re.search(r'<section class="card flush worker-queue" id="queue-images">.*?</section>', body,
                        flags=re.S).group(0)
    live = re.search(r'<tr data-worker-id="w-1">.*?</tr>', section, flags=re.S).group(0)
    assert "resizer-1" in live and "box-7" in live and "flowforge-python/0.1.0" in live
    assert '<td data-label="Slots" class="num">4</td>' in live
    assert '<td data-label="Tasks held" class="num">1</td>' in live
    assert '<span class="badge ok">Live</span>' in live and " ago</td>" in live
    gone = re.search(r'<tr data-worker-id="w-gone" class="dim">.*?</tr>', section, flags=re.S).group(0)
    assert '<span class="badge">Gone</span>' in gone and "3\u00a0h 00\u00a0m ago" in gone
    assert "w-ancient" not in body
    assert "b-worker-secret" not in body and "b-host" not in body
    assert "Start another worker" in body


@pytest.mark.django_db
def test_the_workers_page_makes_the_same_queries_whatever_the_number_of_workers(a):
    client = client_for(owner_of(a.org))
    seen(a, "w-1")
    client.get("/workers/")
    _, few = counted(client, "/workers/")
    for i in range(30):
        seen(a, f"w-more-{i}", queue=f"q{i % 7}")
    response, many = counted(client, "/workers/")
    assert response.status_code == 200 and response.content.decode().count("<tr data-worker-id=") == 31
    assert len(many) == len(few), "\n".join(many)


@pytest.mark.django_db
def test_worker_names_and_hosts_are_escaped_on_the_workers_page(a):
    seen(a, "w-<i>x</i>", name="<script>alert(1)</script>", host="<b>h</b>")
    body = client_for(owner_of(a.org)).get("/workers/").content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<b>h</b>" not in body and "<i>x</i>" not in body


# --- the run page --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_warns_while_no_worker_is_live_on_the_queue_a_task_waits_on(a):
    run = a.start()
    client = client_for(owner_of(a.org))

    def page():
        return text(client.get(f"/runs/{run.pk}/")), text(client.get(f"/runs/{run.pk}/live/"))

    body, fragment = page()
    row = row_of(body, "resize")
    assert '<span class="muted">queue</span> <a href="/workers/#queue-images"><code>images</code></a>' in row
    assert "No worker is polling queue <code>images</code>: start one with a worker key" in row
    assert "No worker is polling queue <code>images</code> (1 task of this run waits on it)" in body
    assert WARNING not in row_of(body, "after")  # pending, of the shared workers
    assert "No worker is polling queue <code>images</code>" in fragment  # the live page's update too

    seen(a, "w-1")  # a worker polls the queue: the warning goes
    body, fragment = page()
    assert "No worker is polling" not in body and "No worker is polling" not in fragment
    assert "<code>images</code>" in row_of(body, "resize")

    WorkerConnection.objects.for_organization(a.org).update(last_seen_at=timezone.now() - dt.timedelta(minutes=10))
    body, _ = page()
    assert "No worker is polling queue <code>images</code>: start one" in row_of(body, "resize")

    a.poll(worker_id="w-2")  # handed out: running, nothing waits
    body, _ = page()
    assert "No worker is polling" not in body


@pytest.mark.django_db
def test_the_run_page_shows_the_newest_attempts_log_lines_escaped_and_capped(a):
    run = a.start()
    tid = a.poll().json()["tasks"][0]["task_run_id"]
    send_logs(a, tid, 1, ["first attempt line"])
    a.post(f"worker/tasks/{tid}/fail/", {"fencing_token": 1, "error": "boom"})
    a.poll()
    lines = [f"line {i}" for i in range(run_page.LOG_LINES_PER_TASK + 5)] + ["<script>alert('x')</script>"]
    send_logs(a, tid, 2, lines)
    send_logs(a, tid, 2, ["careful"], level="warning")
    client = client_for(owner_of(a.org))
    response = client.get(f"/runs/{run.pk}/")
    raw = response.content.decode()
    assert "<script>alert(" not in raw and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in raw
    body = text(response)
    block = re.search(r'<div class="task-log" id="log-resize".*?</pre></div>', body, flags=re.S).group(0)
    assert "attempt 2 · generation 2" in block
    assert f"the last {run_page.LOG_LINES_PER_TASK} lines of this attempt" in block
    shown = re.findall(r'<span class="log-line level-(\w+)">.*?<span class="log-level">(\w+)</span> (.*?)</span>\n',
                       block)
    assert len(shown) == run_page.LOG_LINES_PER_TASK
    assert shown[-1] == ("warning", "WARNING", "careful")
    assert shown[-2][2] == "<script>alert('x')</script>"
    assert shown[0][2] == "line 7"  # the last 200 of the attempt's 207 lines (205 + 2)
    assert "first attempt line" not in body  # only the newest attempt's lines
    assert f'href="/runs/{run.pk}/tasks/{tid}/logs/">whole log</a>' in block
    assert 'data-region="run-logs"' in text(client.get(f"/runs/{run.pk}/live/"))

    whole = client.get(f"/runs/{run.pk}/tasks/{tid}/logs/")
    assert whole.status_code == 200 and whole["Content-Type"] == "text/plain; charset=utf-8"
    log = whole.content.decode().splitlines()
    assert len(log) == 1 + len(lines) + 1
    assert log[0].endswith("attempt 1 gen 1 worker  INFO    first attempt line")
    assert log[-1].endswith("attempt 2 gen 2 worker  WARNING careful")
    # One generation's lines (what the task panel links each attempt to).
    second = client.get(f"/runs/{run.pk}/tasks/{tid}/logs/?fencing_token=2").content.decode().splitlines()
    assert len(second) == len(lines) + 1 and all(" attempt 2 gen 2 " in line for line in second)


@pytest.mark.django_db
def test_a_run_without_worker_tasks_has_no_logs_section_and_a_foreign_log_is_a_404(a, b):
    plain = a.start([{"key": "n", "type": "noop"}], name="plain")
    client = client_for(owner_of(a.org))
    assert "Worker logs" not in text(client.get(f"/runs/{plain.pk}/"))
    run = a.start()
    assert "No log lines yet." in text(client.get(f"/runs/{run.pk}/"))
    tid = task_run(run).pk
    assert client.get(f"/runs/{run.pk}/tasks/{tid}/logs/").content.decode() == "(no log lines)\n"
    assert client_for(owner_of(b.org)).get(f"/runs/{run.pk}/tasks/{tid}/logs/").status_code == 404
    assert client.get(f"/runs/{plain.pk}/tasks/{tid}/logs/").status_code == 404  # not that run's task


@pytest.mark.django_db
def test_the_run_page_makes_the_same_queries_whatever_the_number_of_worker_tasks_and_lines(a):
    def dag(n):
        return [{"key": f"w{i:02d}", "type": "worker", "config": {"queue": f"q{i % 3}"}} for i in range(n)]

    client = client_for(owner_of(a.org))
    small = a.start(dag(2), name="small")
    tid = a.poll("q0").json()["tasks"][0]["task_run_id"]
    send_logs(a, tid, 1, ["x"])
    client.get(f"/runs/{small.pk}/")
    _, few = counted(client, f"/runs/{small.pk}/")
    big = a.start(dag(30), name="big")
    for queue in ("q0", "q1", "q2"):
        for task in a.poll(queue, max_tasks=3, worker_id=f"w-{queue}").json()["tasks"]:
            if task["workflow_run_id"] == str(big.pk):
                send_logs(a, task["task_run_id"], 1, [f"{task['task_key']} {i}" for i in range(50)])
    seen(a, "w-q0")
    response, many = counted(client, f"/runs/{big.pk}/")
    assert response.status_code == 200
    assert response.content.decode().count('<div class="task-log"') >= 6
    assert len(many) == len(few), "\n".join(many)


# --- the API keys page -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_keys_page_offers_the_worker_role_and_shows_worker_keys(a):
    client = client_for(owner_of(a.org))
    body = text(client.get("/api-keys/"))
    assert '<option value="worker">Worker</option>' in body
    assert "create a key with the role <strong>Worker</strong> for your worker processes" in body
    row = re.search(r"<tr>(?:(?!</tr>).)*?workers</td>.*?</tr>", body, flags=re.S).group(0)
    assert '<span class="badge role-worker">Worker</span>' in row
    assert ApiKey.objects.for_organization(a.org).get(pk=a.worker_row.pk).role == KeyRole.WORKER
    # The key the page creates with that role is a worker key.
    page = client.get("/api-keys/").content.decode()
    token = re.search(r'name="form_token" value="([^"]+)"', page).group(1)
    created = client.post("/api-keys/", {"name": "box-7 workers", "role": "worker", "form_token": token})
    assert created.status_code == 201
    assert ApiKey.objects.for_organization(a.org).get(name="box-7 workers").role == KeyRole.WORKER


@pytest.mark.django_db
def test_a_ready_worker_task_counts_in_the_queue_and_not_after_it_runs(a):
    run = a.start()
    client = client_for(owner_of(a.org))
    body = text(client.get("/workers/"))
    assert "No worker is polling queue <code>images</code>" in body
    a.poll()
    assert TaskRun.objects.for_organization(a.org).get(pk=task_run(run).pk).state == "running"
    body = text(client.get("/workers/"))
    assert "No worker is polling" not in body
