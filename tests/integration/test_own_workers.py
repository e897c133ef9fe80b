"""The organizations' own workers against the real web server (gunicorn) and the
database's commit notifications (issue 18, docs/workers.md): a waiting long poll is woken
by the commit of the task it receives; two workers polling for one task start it once;
another organization's worker never receives it, even polling the same queue name; a
revoked worker key gets 401 on its next call, and a key revoked while its poll waits is
handed nothing."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from engine.models import TaskRun, TaskRunEvent
from engine.services import apply_definition, start_run
from tenancy.actors import Actor
from tenancy.apikeys import create_api_key, revoke_api_key
from tenancy.models import KeyRole, Membership, Role
from tests.integration.conftest import start_web
from tests.unit.test_api_auth import actor_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ONE = [{"key": "job", "type": "worker", "config": {"queue": "jobs"}}]


@pytest.fixture
def web(stack):
    return start_web(stack)


def worker_key(org):
    owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
    return create_api_key(actor=owner, name="workers", role=KeyRole.WORKER), owner


def poll(base, key, *, queue="jobs", wait=0.0, worker_id="w"):
    return httpx.post(f"{base}/api/v1/worker/poll/", json={"queue": queue, "wait_seconds": wait,
                                                           "worker": {"id": worker_id}},
                      headers={"Authorization": f"Bearer {key}"}, timeout=wait + 30)


def start(org, tasks=ONE, name="w1"):
    wf = apply_definition(organization=org, document={"name": name, "tasks": tasks})
    return start_run(workflow=wf, actor=Actor.system(org))


def test_a_waiting_poll_is_woken_by_the_commit_of_its_task(web, org):
    (_row, key), _owner = worker_key(org)
    wf = apply_definition(organization=org, document={"name": "w1", "tasks": ONE})
    assert poll(web, key).json()["tasks"] == []  # warm: the process's hub and connections
    got: dict = {}

    def waiting_poll():
        began = time.monotonic()
        response = poll(web, key, wait=20)
        got.update(response=response, returned=time.monotonic(), began=began)

    t = threading.Thread(target=waiting_poll)
    t.start()
    time.sleep(1.0)  # the poll is waiting by now
    run = start_run(workflow=wf, actor=Actor.system(org))
    committed = time.monotonic()
    t.join(30)
    tasks = got["response"].json()["tasks"]
    assert [task["task_run_id"] for task in tasks] == [
        str(TaskRun.objects.for_organization(org).get(workflow_run=run).pk)]
    # Woken by the notification, not by the end of its 20 s wait (figures are printed, not asserted).
    print(f"long poll answered {1000 * (got['returned'] - committed):.1f} ms after the run's commit")
    assert got["returned"] - got["began"] < 15


def test_one_task_polled_by_two_workers_at_once_starts_once(web, org):
    (_row, key), _owner = worker_key(org)
    run = start(org)
    answers: list = []
    barrier = threading.Barrier(2)

    def racer(i):
        barrier.wait()
        answers.append(poll(web, key, worker_id=f"racer-{i}").json()["tasks"])

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(len(a) for a in answers) == [0, 1]
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    started = TaskRunEvent.objects.for_organization(org).filter(task_run=tr, kind="started")
    assert started.count() == 1


def test_another_organizations_worker_polling_the_same_queue_name_gets_nothing(web, make_org):
    a, b = make_org(), make_org()
    (_ra, key_a), _ = worker_key(a)
    (_rb, key_b), _ = worker_key(b)
    run = start(a)
    apply_definition(organization=b, document={"name": "b-own", "tasks": ONE})  # B's own queue "jobs"
    assert poll(web, key_b, wait=1.0).json()["tasks"] == []
    tr = TaskRun.objects.for_organization(a).get(workflow_run=run)
    assert tr.state == "ready"
    (task,) = poll(web, key_a).json()["tasks"]
    assert task["task_run_id"] == str(tr.pk)


def test_a_revoked_worker_key_gets_401_on_its_next_call(web, org):
    (row, key), owner = worker_key(org)
    apply_definition(organization=org, document={"name": "w1", "tasks": ONE})
    assert poll(web, key).status_code == 200
    revoke_api_key(actor=owner, api_key=row)
    response = poll(web, key)
    assert response.status_code == 401
    assert response.json()["code"] in {"authentication_failed", "not_authenticated"}


def test_a_poll_whose_client_went_away_claims_nothing(web, org):
    (_row, key), _owner = worker_key(org)
    wf = apply_definition(organization=org, document={"name": "w1", "tasks": ONE})
    with pytest.raises(httpx.ReadTimeout):  # the worker gives up on its poll (killed, or a proxy cut it)
        httpx.post(f"{web}/api/v1/worker/poll/", json={"queue": "jobs", "wait_seconds": 10, "worker": {"id": "gone"}},
                   headers={"Authorization": f"Bearer {key}"}, timeout=1.0)
    run = start_run(workflow=wf, actor=Actor.system(org))
    time.sleep(2.0)  # the abandoned poll was woken by the task's commit meanwhile
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    assert (tr.state, tr.fencing_token) == ("ready", 0)  # not started for a client that is gone
    (task,) = poll(web, key, worker_id="present").json()["tasks"]
    assert task["task_run_id"] == str(tr.pk)


def test_a_key_revoked_while_its_poll_waits_is_handed_no_task(web, org):
    (row, key), owner = worker_key(org)
    wf = apply_definition(organization=org, document={"name": "w1", "tasks": ONE})
    assert poll(web, key).json()["tasks"] == []  # warm: the key is in the authentication cache
    got: dict = {}

    def waiting_poll():
        got["response"] = poll(web, key, wait=5)

    t = threading.Thread(target=waiting_poll)
    t.start()
    time.sleep(1.0)  # the poll is waiting by now
    revoke_api_key(actor=owner, api_key=row)
    run = start_run(workflow=wf, actor=Actor.system(org))  # wakes the waiting poll
    t.join(30)
    assert got["response"].status_code == 200
    assert got["response"].json()["tasks"] == []
    tr = TaskRun.objects.for_organization(org).get(workflow_run=run)
    assert (tr.state, tr.fencing_token) == ("ready", 0)  # nothing started, no input handed out


def test_a_waiting_poll_whose_claim_failed_for_a_gone_secret_goes_on_to_the_next_task(web, org):
    from tenancy.vault import delete_secret, set_secret

    (_row, key), owner = worker_key(org)
    set_secret(actor=owner, name="CDN_TOKEN", value="tok-" + "w" * 20)
    doomed = start(org, [{"key": "job", "type": "worker",
                          "config": {"queue": "jobs", "input": {"auth": "{{ secrets.CDN_TOKEN }}"}}}], name="secret")
    delete_secret(actor=owner, name="CDN_TOKEN")
    plain = start(org)
    # One task per claim: the doomed one (older) is claimed first and failed at hand-out;
    # the poll goes on to the next instead of answering [] early.
    tasks = poll(web, key, wait=5).json()["tasks"]
    assert [t["task_run_id"] for t in tasks] == [str(TaskRun.objects.for_organization(org).get(workflow_run=plain).pk)]
    assert TaskRun.objects.for_organization(org).get(workflow_run=doomed).state == "failed"

