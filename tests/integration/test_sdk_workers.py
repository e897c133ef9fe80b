"""The organizations' own workers, run by the Python SDK in real processes (issue 18's
"Done when"): an SDK worker process serves the worker tasks of a 10-task DAG whose
built-in tasks run in the shared Dramatiq workers, to success; an SDK worker SIGKILLed
mid-task loses its lease and another worker completes a new generation, while the killed
worker's late completion, replayed by the test, is refused and recorded; an idle SDK worker
stops within about a second of its SIGTERM, mid long poll, and the poll it cut off claims
nothing."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from engine.models import TaskLog, TaskRun, TaskRunEvent, WorkerConnection
from engine.services import apply_definition, start_run
from flowforge.stack import wait_until
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key
from tenancy.models import KeyRole, Membership, Role
from tests.integration.conftest import start_web, wait_for_run_terminal
from tests.unit.test_api_auth import actor_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

APP = str(Path(__file__).with_name("sdk_worker_app.py"))


def worker_task(key, name, depends_on=(), **config):
    return {"key": key, "type": "worker", "config": {"queue": "images", "name": name, **config},
            "depends_on": list(depends_on), "max_attempts": 2, "retry_backoff_seconds": 0.2}


# Ten tasks: six served by the SDK worker, four built-in ones by the shared workers.
MIXED = [
    {"key": "fetch", "type": "noop"},
    worker_task("resize_s", "resize", ["fetch"], input={"width": 160}),
    worker_task("resize_m", "resize", ["fetch"], input={"width": 640}),
    worker_task("resize_l", "resize", ["fetch"], input={"width": 1280}),
    {"key": "join", "type": "noop", "depends_on": ["resize_s", "resize_m", "resize_l"]},
    worker_task("upload", "upload", ["join", "resize_s", "resize_m", "resize_l"]),
    {"key": "settle", "type": "sleep", "config": {"seconds": 0.1}, "depends_on": ["upload"]},
    worker_task("audit_echo", "echo", ["fetch"], input={"who": "auditor"}),
    worker_task("notify", "echo", ["settle", "audit_echo"], input={"sent": True}),
    {"key": "done", "type": "noop", "depends_on": ["notify"]},
]


@pytest.fixture
def web(stack):
    stack.env["FLOWFORGE_WORKER_LEASE_SECONDS"] = "3"  # a killed worker's task comes back in seconds
    return start_web(stack)


def worker_key(org) -> str:
    owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
    return create_api_key(actor=owner, name="sdk workers", role=KeyRole.WORKER)[1]


def sdk_worker(stack, base, key, queue, mode, name, poll_wait=5):
    return stack.start(name, [sys.executable, APP, base, key, queue, mode, str(poll_wait)])


def test_an_sdk_worker_runs_the_worker_tasks_of_a_mixed_dag_to_success(stack, web, org):
    key = worker_key(org)
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    # Applied first: a worker polling a queue that no task names is refused (and stops).
    wf = apply_definition(organization=org, document={"name": "thumbnails", "tasks": MIXED})
    sdk_worker(stack, web, key, "images", "quick", "sdk-worker")
    run = start_run(workflow=wf, run_input={"url": "https://example.com/a.png"}, actor=Actor.system(org))
    assert wait_for_run_terminal(run, timeout=90) == "succeeded"
    by_key = {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run)
              .select_related("task")}
    assert {k: tr.state for k, tr in by_key.items()} == {t["key"]: "succeeded" for t in MIXED}
    assert by_key["resize_m"].output == {"width": 640, "upstream": ["fetch"]}
    assert by_key["upload"].output == {"uploaded": 4}
    assert by_key["notify"].output == {"sent": True}
    # The worker tasks were started by the SDK worker, the built-in ones by the shared workers.
    started = {e.task_run_id: e.detail["worker"] for e in TaskRunEvent.objects.for_organization(org)
               .filter(workflow_run=run, kind="started")}
    for k, tr in by_key.items():
        assert started[tr.pk].startswith("worker:") == (tr.queue == "images"), k
    (line,) = TaskLog.objects.for_organization(org).filter(task_run=by_key["upload"])
    assert (line.level, line.message) == ("info", "uploading 4 results")


def test_a_killed_sdk_worker_loses_its_lease_and_its_late_completion_is_refused(stack, web, org):
    key = worker_key(org)
    stack.start_worker(processes=1, threads=2)  # runs the clock's reap_leases: the expired lease comes back
    stack.start_clock()
    wf = apply_definition(organization=org, document={"name": "slow", "tasks": [
        {"key": "long", "type": "worker", "config": {"queue": "slow", "name": "hang"}, "max_attempts": 3,
         "retry_backoff_seconds": 0}]})
    run = start_run(workflow=wf, actor=Actor.system(org))
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    doomed = sdk_worker(stack, web, key, "slow", "hang", "sdk-doomed")

    def started():
        tr.refresh_from_db()
        return tr.state == "running" and tr.started_fencing_token == tr.fencing_token

    wait_until(started, timeout=30, what="the doomed worker to start the task")
    wait_until(lambda: "hanging" in doomed.log_path.read_text(), timeout=10, what="the handler to run")
    first_token = tr.fencing_token
    os.killpg(doomed.popen.pid, signal.SIGKILL)

    rescuer = sdk_worker(stack, web, key, "slow", "quick", "sdk-rescuer")
    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    tr.refresh_from_db()
    assert tr.output == {"mode": "quick"}
    assert tr.attempt >= 2 and tr.fencing_token > first_token
    kinds = list(TaskRunEvent.objects.for_organization(org).filter(task_run=tr).order_by("seq")
                 .values_list("kind", flat=True))
    assert "lease_expired" in kinds

    # The killed worker's result arrives late (replayed): refused, recorded, nothing changed.
    late = httpx.post(f"{web}/api/v1/worker/tasks/{tr.pk}/complete/",
                      json={"fencing_token": first_token, "output": {"mode": "hang"}},
                      headers={"Authorization": f"Bearer {key}"})
    assert late.status_code == 409
    assert late.json()["code"] == "stale_fencing_token"
    tr.refresh_from_db()
    assert tr.output == {"mode": "quick"}
    assert TaskRunEvent.objects.for_organization(org).filter(
        task_run=tr, kind="stale_completion_rejected", fencing_token=first_token).exists()
    assert rescuer.alive()


def test_an_idle_sdk_worker_stops_promptly_on_sigterm_and_its_cut_off_poll_claims_nothing(stack, web, org):
    key = worker_key(org)
    wf = apply_definition(organization=org, document={"name": "idle", "tasks": [
        {"key": "job", "type": "worker", "config": {"queue": "idle", "name": "echo"}}]})
    idle = sdk_worker(stack, web, key, "idle", "quick", "sdk-idle", poll_wait=30)
    wait_until(lambda: WorkerConnection.objects.for_organization(org).filter(queue="idle").exists(), timeout=30,
               what="the worker to poll")
    time.sleep(1.5)  # its poll waits on the server, for up to 30 s
    signalled = time.monotonic()
    os.kill(idle.popen.pid, signal.SIGTERM)
    time.sleep(0.3)  # the worker is stopping; its poll's connection is half-closed, not yet cut
    run = start_run(workflow=wf, actor=Actor.system(org))  # wakes the waiting poll
    assert idle.popen.wait(10) == 0
    assert time.monotonic() - signalled < 5, idle.log_path.read_text()
    time.sleep(1.0)
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    assert (tr.state, tr.fencing_token) == ("ready", 0)  # not started for the stopping worker
