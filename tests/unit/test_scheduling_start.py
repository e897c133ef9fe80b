"""Starting runs under issue 16's rules: a run's priority (stored on the run and, plus
each task's, on its task runs; refused out of range with the field named; kept by a
retry; a cron trigger's), concurrency keys rendered from the run input (refused when the
input cannot fill them, nothing stored), the organization's runs-per-minute quota
(service, API 429 with Retry-After, web form, cron firing), and the workflow run limit's
three policies with the admission of queued runs. Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from engine.cron import process_trigger
from engine.models import ScheduledTrigger, TaskRun, TaskRunEvent, TriggerFiring, WorkflowRun
from engine.repositories import runs, task_runs
from engine.services import InvalidStart, apply_definition, cancel_run, retry_run, start_run
from engine.triggers import TriggerError, create_trigger
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded
from tenancy.models import Membership, Organization, Role
from tests import engine_helpers
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory

LEASE = 60.0


def workflow(org, *tasks, name="wf", **top):
    return apply_definition(organization=org, document={"name": name, "tasks": list(tasks), **top})


def noop(key="a", **fields):
    return {"key": key, "type": "noop", **fields}


def task_runs_of(run) -> dict[str, TaskRun]:
    return {tr.task.key: tr for tr in TaskRun.objects.for_organization(run.organization_id)
            .filter(workflow_run=run).select_related("task")}


def run_count(org) -> tuple[int, int]:
    return (WorkflowRun.objects.for_organization(org).count(), TaskRun.objects.for_organization(org).count())


def refreshed(run) -> WorkflowRun:
    return WorkflowRun.objects.for_organization(run.organization_id).get(pk=run.pk)


def run_events(run) -> list[tuple[str, str, dict]]:
    return [(e.kind, e.to_state, e.detail) for e in TaskRunEvent.objects.for_organization(run.organization_id)
            .filter(workflow_run=run, task_run__isnull=True).order_by("seq")]


def finish(run):
    """Run every task of ``run`` to success here (claim the ready ones, start and complete
    each generation; a completion claims its dependents); returns the last completion's
    result (its run_state is the run's, as this finished it)."""
    ready = list(TaskRun.objects.for_organization(run.organization_id).filter(workflow_run=run, state="ready")
                 .values_list("pk", flat=True))
    with transaction.atomic():
        todo = list(task_runs.claim_ready_many(limit=len(ready), lease_seconds=LEASE, owner="test",
                                               task_run_ids=ready))
    result = None
    while todo:
        d = todo.pop(0)
        with transaction.atomic():
            assert engine_helpers.start_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token,
                                                owner="worker", lease_seconds=LEASE) is not None
        with transaction.atomic():
            result = engine_helpers.complete_attempt(task_run_id=d.task_run_id, fencing_token=d.fencing_token,
                                                     succeeded=True, output={}, lease_seconds=LEASE, owner="worker")
        todo.extend(result.dispatches)
    return result


# --- priority -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_task_runs_priority_is_its_runs_plus_its_tasks(org):
    wf = workflow(org, noop("a", priority=-2), noop("b", priority=10, depends_on=["a"]), noop("c"))
    run = start_run(workflow=wf, priority=3)
    assert refreshed(run).priority == 3
    assert {k: tr.priority for k, tr in task_runs_of(run).items()} == {"a": 1, "b": 13, "c": 3}
    low = start_run(workflow=wf, priority=-10)
    assert {k: tr.priority for k, tr in task_runs_of(low).items()} == {"a": -12, "b": 0, "c": -10}
    default = start_run(workflow=wf)
    assert refreshed(default).priority == 0
    assert {k: tr.priority for k, tr in task_runs_of(default).items()} == {"a": -2, "b": 10, "c": 0}


@pytest.mark.django_db
def test_roots_are_ready_from_the_start_and_the_rest_pending_without_ready_at(org):
    wf = workflow(org, noop("a"), noop("b", depends_on=["a"]))
    before = timezone.now()
    trs = task_runs_of(start_run(workflow=wf))
    assert (trs["a"].state, trs["b"].state, trs["b"].ready_at) == ("ready", "pending", None)
    assert trs["a"].ready_at >= before


@pytest.mark.django_db
@pytest.mark.parametrize(("priority", "message"), [
    (11, "must be a whole number from -10 to 10, got 11"),
    (-11, "must be a whole number from -10 to 10, got -11"),
    (1.0, "must be a whole number from -10 to 10, got 1.0"),
    ("3", "must be a whole number from -10 to 10, got '3'"),
    (True, "must be a whole number from -10 to 10, got True"),
    (None, "must be a whole number from -10 to 10, got None"),
])
def test_a_bad_priority_is_refused_naming_the_field_and_nothing_is_stored(org, priority, message):
    wf = workflow(org, noop())
    before = run_count(org)
    with pytest.raises(InvalidStart) as excinfo:
        start_run(workflow=wf, priority=priority)
    assert (excinfo.value.field, excinfo.value.message) == ("priority", message)
    assert isinstance(excinfo.value, ValueError)
    assert run_count(org) == before


@pytest.mark.django_db
def test_a_retry_keeps_the_original_runs_priority(org):
    wf = workflow(org, noop(priority=1))
    run = start_run(workflow=wf, priority=-4)
    cancel_run(run=run)
    new = retry_run(actor=Actor.system(org), run=refreshed(run))
    assert (new.priority, new.retry_of_id) == (-4, run.pk)
    assert task_runs_of(new)["a"].priority == -3


@pytest.mark.django_db
def test_a_cron_trigger_starts_runs_with_its_priority(org):
    workflow(org, noop(priority=2))
    trig = create_trigger(actor=Actor.system(org), data={
        "name": "t", "workflow_name": "wf", "cron_expression": "0 * * * *", "timezone": "UTC", "priority": 5})
    assert trig.priority == 5
    assert process_trigger(trig.pk, trig.next_fire_at + dt.timedelta(seconds=1)) == 1
    run = WorkflowRun.objects.for_organization(org).get(trigger=trig)
    assert (run.priority, task_runs_of(run)["a"].priority) == (5, 7)
    for bad in (11, -11, "1", 1.5, 2.0, True):
        with pytest.raises(TriggerError) as excinfo:
            create_trigger(actor=Actor.system(org), data={
                "name": "u", "workflow_name": "wf", "cron_expression": "0 * * * *", "priority": bad})
        assert excinfo.value.field == "priority"
    assert ScheduledTrigger.objects.for_organization(org).count() == 1


# --- concurrency keys ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_task_run_stores_its_key_rendered_with_the_run_input(org):
    wf = workflow(org, noop("charge", concurrency={"key": "customer-{{ input.customer.id }}", "limit": 2}),
                  noop("notify", concurrency={"key": "mailer", "limit": 5}, depends_on=["charge"]),
                  noop("log"))
    run = start_run(workflow=wf, run_input={"customer": {"id": 42}})
    assert {k: tr.concurrency_key for k, tr in task_runs_of(run).items()} == {
        "charge": "customer-42", "notify": "mailer", "log": None}
    other = start_run(workflow=wf, run_input={"customer": {"id": "cus_7"}})
    assert task_runs_of(other)["charge"].concurrency_key == "customer-cus_7"


@pytest.mark.django_db
@pytest.mark.parametrize(("run_input", "message"), [
    ({}, "task 'charge': its concurrency key 'customer-{{ input.customer_id }}' needs input.customer_id, "
         "which the run input does not have"),
    ({"customer_id": {"id": 1}}, "needs input.customer_id to be a string, number or boolean, not an object"),
    ({"customer_id": [1, 2]}, "needs input.customer_id to be a string, number or boolean, not an array"),
    ({"customer_id": None}, "needs input.customer_id to be a string, number or boolean, not null"),
    ({"customer_id": "cus_1\n"}, "cannot use input.customer_id: it holds U+000A control character"),
    ({"customer_id": "cus\u202e1"}, "cannot use input.customer_id: it holds U+202E RIGHT-TO-LEFT OVERRIDE"),
    ({"customer_id": "\u2067cus"}, "cannot use input.customer_id: it holds U+2067 RIGHT-TO-LEFT ISOLATE"),
])
def test_an_input_that_cannot_fill_a_key_refuses_the_start_and_stores_nothing(org, run_input, message):
    wf = workflow(org, noop("charge", concurrency={"key": "customer-{{ input.customer_id }}", "limit": 2}))
    before = run_count(org)
    with pytest.raises(InvalidStart) as excinfo:
        start_run(workflow=wf, run_input=run_input)
    assert excinfo.value.field == "input" and message in excinfo.value.message
    assert run_count(org) == before


# --- the runs-per-minute quota ------------------------------------------------------------------


def set_quota(org, **overrides) -> None:
    Organization.objects.filter(pk=org.pk).update(**overrides)
    org.refresh_from_db()


def backdate(run, seconds: float) -> None:
    WorkflowRun.objects.for_organization(run.organization_id).filter(pk=run.pk).update(
        created_at=timezone.now() - dt.timedelta(seconds=seconds))


@pytest.mark.django_db
def test_the_runs_per_minute_quota_refuses_the_start_past_it_until_the_oldest_leaves_the_window(org):
    wf = workflow(org, noop())
    set_quota(org, max_runs_per_minute_override=2)
    first = start_run(workflow=wf)
    start_run(workflow=wf)
    backdate(first, 30)  # leaves the 60 s window in 30 s
    before = run_count(org)
    with pytest.raises(QuotaExceeded) as excinfo:
        start_run(workflow=wf)
    exc = excinfo.value
    assert (exc.limit, exc.allowed, exc.used) == ("max_runs_per_minute", 2, 2)
    assert 29.0 < exc.retry_after_seconds <= 30.0
    assert "runs per minute quota (max_runs_per_minute) reached: the organization started 2 runs in the last " \
           "60 s, its limit is 2" in str(exc)
    assert run_count(org) == before
    backdate(first, 61)  # out of the window: room for one
    start_run(workflow=wf)
    assert run_count(org)[0] == 3


@pytest.mark.django_db
def test_the_quota_counts_every_channel_and_only_the_organizations_runs(make_org):
    a, b = make_org(), make_org()
    wf_a, wf_b = workflow(a, noop()), workflow(b, noop())
    set_quota(a, max_runs_per_minute_override=1)
    run = start_run(workflow=wf_a)
    start_run(workflow=wf_b)  # b's starts do not count for a, nor a's for b
    start_run(workflow=wf_b)
    cancel_run(run=run)
    with pytest.raises(QuotaExceeded):
        retry_run(actor=Actor.system(a), run=refreshed(run))  # a retry is a start too
    trig = create_trigger(actor=Actor.system(a), data={
        "name": "t", "workflow_name": "wf", "cron_expression": "0 * * * *", "timezone": "UTC"})
    assert process_trigger(trig.pk, trig.next_fire_at + dt.timedelta(seconds=1)) == 0
    firing = TriggerFiring.objects.for_organization(a).get(trigger=trig)
    assert firing.outcome == "failed" and firing.workflow_run_id is None
    assert "runs per minute quota (max_runs_per_minute) reached" in firing.detail
    assert WorkflowRun.objects.for_organization(a).count() == 1


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.mark.django_db
def test_the_api_answers_a_start_over_the_quota_with_429_and_retry_after(api_factory):
    api = api_factory()
    wf = workflow(api.org, noop())
    set_quota(api.org, max_runs_per_minute_override=1)
    headers = bearer(api.keys[Role.MEMBER])
    first = api.client.post("/api/v1/runs/", json.dumps({"workflow": "wf"}), content_type="application/json",
                            headers=headers)
    assert first.status_code == 201, first.content
    backdate(WorkflowRun.objects.for_organization(api.org).get(), 20.5)  # leaves the window in 39.5 s
    response = api.client.post("/api/v1/runs/", json.dumps({"workflow": wf.name}), content_type="application/json",
                               headers=headers)
    assert response.status_code == 429, response.content
    assert response["Retry-After"] == "40"  # whole seconds, rounded up
    body = response.json()
    assert response["Content-Type"] == "application/problem+json"
    assert (body["code"], body["limit"], body["allowed"], body["used"]) == ("quota_exceeded", "max_runs_per_minute",
                                                                            1, 1)
    assert 39.0 < body["retry_after_seconds"] <= 39.5
    assert WorkflowRun.objects.for_organization(api.org).count() == 1


@pytest.mark.django_db
def test_the_api_takes_a_priority_and_names_a_bad_one_or_a_bad_input(api_factory):
    api = api_factory()
    workflow(api.org, noop(concurrency={"key": "c-{{ input.customer }}", "limit": 1}))
    headers = bearer(api.keys[Role.MEMBER])

    def post(body):
        return api.client.post("/api/v1/runs/", json.dumps(body), content_type="application/json", headers=headers)

    ok = post({"workflow": "wf", "input": {"customer": "x"}, "priority": -7})
    assert ok.status_code == 201, ok.content
    assert refreshed(WorkflowRun.objects.for_organization(api.org).get()).priority == -7
    for bad in (11, "5", 2.5, True):
        response = post({"workflow": "wf", "input": {"customer": "x"}, "priority": bad})
        assert response.status_code == 400, (bad, response.content)
        assert list(response.json()["errors"]) == ["priority"], response.json()
    response = post({"workflow": "wf", "input": {}})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"input": [
        "task 'a': its concurrency key 'c-{{ input.customer }}' needs input.customer, which the run input does not "
        "have"]}
    response = post({"workflow": "wf", "input": {"customer": "x\ny"}})
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"input": [
        "task 'a': its concurrency key 'c-{{ input.customer }}' cannot use input.customer: it holds U+000A control "
        "character; control characters, line breaks and bidirectional text controls are not allowed in a key"]}
    assert WorkflowRun.objects.for_organization(api.org).count() == 1


@pytest.mark.django_db
def test_the_web_start_form_takes_a_priority_and_shows_a_refusal(org):
    wf = workflow(org, noop())
    owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    client = Client()
    client.force_login(owner)
    url = f"/workflows/{wf.pk}/start/"
    response = client.post(url, {"input": "{}", "priority": "4"})
    assert response.status_code == 302, response.content[:2000]
    assert WorkflowRun.objects.for_organization(org).get().priority == 4
    response = client.post(url, {"input": "{}", "priority": "12"})
    assert response.status_code == 400
    assert "Must be a whole number from -10 to 10, got 12." in response.content.decode()
    response = client.post(url, {"input": "{}", "priority": "2.0"})  # Django's IntegerField took it as 2
    assert response.status_code == 400
    assert "Must be a whole number from -10 to 10, got &#x27;2.0&#x27;." in response.content.decode()
    set_quota(org, max_runs_per_minute_override=1)
    response = client.post(url, {"input": "{}", "priority": "0"})
    assert response.status_code == 400
    assert "runs per minute quota (max_runs_per_minute) reached" in response.content.decode()
    assert WorkflowRun.objects.for_organization(org).count() == 1


# --- the workflow run limit ---------------------------------------------------------------------


def limited(org, policy: str, limit: int = 1, name: str = "wf"):
    return workflow(org, noop("a"), noop("b", depends_on=["a"]), name=name,
                    concurrency={"max_running_runs": limit, "policy": policy})


@pytest.mark.django_db
def test_queue_holds_a_run_over_the_limit_and_admits_it_when_one_finishes(org):
    wf = limited(org, "queue")
    first = start_run(workflow=wf)
    queued = start_run(workflow=wf)
    third = start_run(workflow=wf)
    assert (refreshed(first).state, refreshed(queued).state, refreshed(third).state) == (
        "running", "pending", "pending")
    q = refreshed(queued)
    assert q.started_at is None
    assert {k: (tr.state, tr.ready_at) for k, tr in task_runs_of(q).items()} == {
        "a": ("pending", None), "b": ("pending", None)}
    assert run_events(q) == [
        ("run_started", "pending", {"trigger_source": "cli", "retry_of": None}),
        ("waiting", "pending", {"reason": "workflow run limit 1/1"}),
    ]
    assert run_events(refreshed(third))[1] == ("waiting", "pending", {"reason": "workflow run limit 1/1"})
    assert runs.admit_queued() == 0  # no room yet

    result = finish(first)
    assert (result.run_state, result.run_limited) == ("succeeded", True)
    assert runs.admit_queued() == 1  # one place: the oldest queued run
    q = refreshed(queued)
    assert q.state == "running" and q.started_at is not None
    trs = task_runs_of(q)
    assert (trs["a"].state, trs["b"].state) == ("ready", "pending")
    assert trs["a"].ready_at is not None and trs["b"].ready_at is None
    assert run_events(q)[-1] == ("run_admitted", "running", {})
    assert refreshed(third).state == "pending"
    assert runs.admit_queued() == 0


@pytest.mark.django_db
def test_the_limit_counts_the_runs_of_every_version_of_the_name(org):
    v1 = limited(org, "queue", limit=2)
    v2 = limited(org, "queue", limit=2)
    assert v2.version == 2
    other = limited(org, "queue", limit=2, name="other")
    start_run(workflow=v1)
    start_run(workflow=v2)
    assert start_run(workflow=v2).state == "pending"
    assert start_run(workflow=other).state == "running"  # another name has its own count


@pytest.mark.django_db
def test_a_finished_run_of_an_unlimited_workflow_is_not_flagged(org):
    run = start_run(workflow=workflow(org, noop()))
    result = finish(run)
    assert (result.run_state, result.run_limited) == ("succeeded", False)


@pytest.mark.django_db
def test_cancel_newest_records_the_new_run_and_cancels_it_at_once(org):
    wf = limited(org, "cancel_newest")
    first = start_run(workflow=wf)
    newest = start_run(workflow=wf)
    assert newest.state == "cancelled" and newest.finished_at is not None
    assert newest.error == "cancelled: workflow wf has 1/1 runs going (run limit, policy cancel_newest)"
    assert {k: tr.state for k, tr in task_runs_of(newest).items()} == {"a": "cancelled", "b": "cancelled"}
    assert [e[0] for e in run_events(newest)] == ["run_started", "run_finished"]
    assert refreshed(first).state == "running"
    assert task_runs_of(first)["a"].state == "ready"


@pytest.mark.django_db
def test_cancel_oldest_cancels_the_oldest_running_run_and_starts_the_new_one(org):
    wf = limited(org, "cancel_oldest", limit=2)
    oldest = start_run(workflow=wf)
    second = start_run(workflow=wf)
    new = start_run(workflow=wf)
    o = refreshed(oldest)
    assert o.state == "cancelled"
    assert o.error == (f"cancelled: workflow wf reached its run limit of 2 (policy cancel_oldest); "
                       f"making room for run {new.pk}")
    assert {k: tr.state for k, tr in task_runs_of(o).items()} == {"a": "cancelled", "b": "cancelled"}
    assert (refreshed(second).state, new.state) == ("running", "running")
    assert task_runs_of(new)["a"].state == "ready"


@pytest.mark.django_db
def test_a_refused_start_of_a_limited_workflow_stores_nothing(org):
    wf = limited(org, "cancel_oldest")
    run = start_run(workflow=wf)
    set_quota(org, max_runs_per_minute_override=1)
    with pytest.raises(QuotaExceeded):
        start_run(workflow=wf)
    assert refreshed(run).state == "running"  # the quota refused before anything was cancelled
    assert run_count(org) == (1, 2)


@pytest.mark.django_db
def test_cancelling_a_queued_run_leaves_it_out_of_the_admission(org):
    wf = limited(org, "queue")
    first = start_run(workflow=wf)
    queued = start_run(workflow=wf)
    cancel_run(run=queued)
    assert refreshed(queued).state == "cancelled"
    cancel_run(run=first)
    assert runs.admit_queued() == 0
    assert refreshed(queued).state == "cancelled"


@pytest.mark.django_db
def test_a_queued_run_is_admitted_under_its_own_versions_limit(org):
    limited(org, "queue", limit=1)
    v1 = limited(org, "queue", limit=1)
    start_run(workflow=v1)
    waiting = [start_run(workflow=v1) for _ in range(3)]
    v2 = limited(org, "queue", limit=3)  # a new version with a higher limit
    assert v2.max_running_runs == 3
    # The queued runs are v1's (limit 1): none fits while one runs.
    assert runs.admit_queued() == 0
    assert [refreshed(r).state for r in waiting] == ["pending"] * 3


@pytest.mark.django_db
def test_the_scheduler_tick_admits_a_queued_run_and_claims_its_root(org):
    from engine.scheduler import schedule_once

    wf = limited(org, "queue")
    first = start_run(workflow=wf)
    queued = start_run(workflow=wf)
    cancel_run(run=first)
    schedule_once()
    assert refreshed(queued).state == "running"
    assert task_runs_of(queued)["a"].state == "running"  # admitted, then claimed in the same tick


def _race(n: int, fn) -> list[str]:
    """Run ``fn`` in ``n`` threads released together; each returns an outcome string."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(n)
    outcomes: list[str] = []

    def one() -> None:
        try:
            barrier.wait()
            outcomes.append(fn())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sorted(outcomes)


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_cannot_pass_the_quota_together(org):
    wf = workflow(org, noop())
    set_quota(org, max_runs_per_minute_override=2)

    def attempt() -> str:
        try:
            start_run(workflow=wf)
            return "started"
        except QuotaExceeded:
            return "refused"

    assert _race(5, attempt) == ["refused"] * 3 + ["started"] * 2
    assert WorkflowRun.objects.for_organization(org).count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_of_a_limited_workflow_start_exactly_the_limit(org):
    wf = limited(org, "queue", limit=2)
    assert _race(6, lambda: start_run(workflow=wf).state) == ["pending"] * 4 + ["running"] * 2
