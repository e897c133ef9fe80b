"""Resume and per-task actions (engine.recovery, issue 19), through the service functions
the API, the pages and the commands call, with the engine driven in this process one
transition at a time (claim, start, complete: the production statements).

The run is the same run throughout: a resume sends it back to running and reopens its
task runs as new generations; what runs next is the engine's own promotion and skipping.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections import Counter
from collections.abc import Iterable

import pytest
from django.db import connection, transaction

from audit import services as audit
from audit.models import AuditLog
from engine import recovery, sql
from engine.live_stream import EventFeed
from engine.models import TaskRun, TaskRunEvent, Workflow, WorkflowRun
from engine.recovery import (
    ActionRefused,
    InvalidAction,
    mark_task_run_succeeded,
    resume_run,
    retry_task_run,
    skip_task_run,
)
from engine.repositories import recovery as rows
from engine.repositories import task_runs
from engine.services import apply_definition, archive_workflow, cancel_run, retry_run, start_run
from flowforge.stack import wait_until
from tenancy.actors import Actor
from tenancy.models import Membership, Role, User
from tenancy.permissions import Forbidden
from tests import engine_helpers

_n = itertools.count()


# --- helpers ---------------------------------------------------------------------------------------


def actor_with(org, role: str = Role.MEMBER) -> Actor:
    user = User.objects.create_user(email=f"{role}-{next(_n)}@recovery.example")
    Membership.objects.create(organization=org, user=user, role=role)
    return Actor(organization=org, role=role, user=user, channel="web")


def workflow(org, tasks: list[dict], **extra) -> Workflow:
    return apply_definition(organization=org, document={"name": f"rec-{next(_n)}", "tasks": tasks, **extra})


def by_key(run) -> dict[str, TaskRun]:
    return {tr.task.key: tr for tr in TaskRun.objects.for_organization(run.organization_id)
            .filter(workflow_run=run).select_related("task")}


def events(run, kind: str | None = None) -> list[TaskRunEvent]:
    qs = TaskRunEvent.objects.for_organization(run.organization_id).filter(workflow_run=run).select_related(
        "task_run__task").order_by("seq")
    return list(qs.filter(kind=kind) if kind else qs)


def drive(run, *, fail: Iterable[str] = (), outputs: dict | None = None) -> WorkflowRun:
    """Run ``run`` in this process to its end as the scheduler and the workers would (claim,
    start, complete), the tasks in ``fail`` failing every attempt (without retries), the
    others succeeding with ``{"task": key, "attempt": n}`` (or ``outputs[key]``). Returns
    the run, fresh."""
    fail, outputs = set(fail), outputs or {}
    org = run.organization_id
    for _ in range(500):
        ready = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="ready")
                     .values_list("id", flat=True))
        if ready:
            task_runs.claim_ready_many(limit=len(ready), lease_seconds=30, owner="test", task_run_ids=ready)
        claimed = list(TaskRun.objects.for_organization(org).filter(workflow_run=run, state="running")
                       .values_list("id", "fencing_token"))
        if not claimed:
            break
        for task_run_id, token in claimed:
            att = engine_helpers.start_attempt(task_run_id=task_run_id, fencing_token=token, owner="test",
                                               lease_seconds=30)
            assert att is not None
            bad = att.task_key in fail
            engine_helpers.complete_attempt(
                task_run_id=att.task_run_id, fencing_token=att.fencing_token, succeeded=not bad,
                output=outputs.get(att.task_key, {"task": att.task_key, "attempt": att.attempt}),
                error=f"{att.task_key} failed" if bad else "", retryable=False, lease_seconds=30, owner="test",
                claim=False)
    run.refresh_from_db()
    return run


def started_since(run, seq: int) -> Counter:
    """How many attempts of each task started after event ``seq``."""
    return Counter(e.task_run.task.key for e in events(run, "started") if e.seq > seq)


# a -> b -> c, a -> d: b fails, c is skipped, a and d succeed.
DIAMOND = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "noop", "depends_on": ["a"]},
    {"key": "c", "type": "noop", "depends_on": ["b"]},
    {"key": "d", "type": "noop", "depends_on": ["a"]},
]


@pytest.fixture
def failed_run(org):
    run = start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER))
    run = drive(run, fail={"b"})
    assert run.state == "failed"
    assert {k: tr.state for k, tr in by_key(run).items()} == {
        "a": "succeeded", "b": "failed", "c": "skipped", "d": "succeeded"}
    return run


# --- resume ----------------------------------------------------------------------------------------


def test_resume_reruns_only_what_did_not_succeed_and_keeps_the_succeeded_outputs(org, failed_run):
    run = failed_run
    before = by_key(run)
    actor = actor_with(org)

    result = resume_run(actor=actor, run=run, reason="fixed the upstream bucket")

    assert result == recovery.ActionResult(run_state="running", resumed_from="failed", reopened=("b", "c"))
    run.refresh_from_db()
    assert (run.state, run.finished_at, run.error) == ("running", None, "")
    assert run.resumed_at is not None
    now = by_key(run)
    # b's dependencies all succeeded: promoted to ready; c waits for b.
    assert (now["b"].state, now["c"].state) == ("ready", "pending")
    for key in ("a", "d"):  # untouched: same generation, same output
        assert (now[key].state, now[key].fencing_token, now[key].output) == (
            "succeeded", before[key].fencing_token, before[key].output)
    # New generations, the next attempt, a fresh budget.
    assert now["b"].fencing_token == before["b"].fencing_token + 1
    assert (now["b"].attempt, now["b"].attempt_base) == (2, 1)
    assert (now["c"].attempt, now["c"].attempt_base) == (1, 0)  # c never started: its attempt 1 is unused
    resumed = events(run, "resumed")
    assert len(resumed) == 1
    assert (resumed[0].from_state, resumed[0].to_state, resumed[0].task_run_id) == ("failed", "running", None)
    assert resumed[0].detail == {"action": "resume", "by": actor.user.email, "reason": "fixed the upstream bucket",
                                 "tasks": ["b", "c"], "reopened": 2}
    resets = {e.task_run.task.key: (e.from_state, e.to_state) for e in events(run, "reset")}
    assert resets == {"b": ("failed", "pending"), "c": ("skipped", "pending")}
    # The history in order: resumed, then the resets, then b's promotion.
    kinds = [e.kind for e in events(run) if e.seq > resumed[0].seq]
    assert kinds == ["reset", "reset", "promoted"]

    run = drive(run)
    assert run.state == "succeeded"
    assert started_since(run, resumed[0].seq) == Counter({"b": 1, "c": 1})
    after = by_key(run)
    assert after["b"].output == {"task": "b", "attempt": 2}
    assert after["a"].output == before["a"].output and after["d"].output == before["d"].output
    seqs = [e.seq for e in events(run)]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_resumed_task_gets_its_whole_retry_budget_again_and_its_attempts_count_on(org):
    wf = workflow(org, [{"key": "x", "type": "noop", "max_attempts": 2, "retry_backoff_seconds": 0}])
    run = start_run(workflow=wf, actor=actor_with(org, Role.OWNER))

    def attempt_fails(retryable=True):
        ready = [tr.pk for tr in by_key(run).values() if tr.state == "ready"]
        task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=ready)
        tr = by_key(run)["x"]
        att = engine_helpers.start_attempt(task_run_id=tr.pk, fencing_token=tr.fencing_token, owner="t",
                                           lease_seconds=30)
        return engine_helpers.complete_attempt(task_run_id=tr.pk, fencing_token=att.fencing_token, succeeded=False,
                                               error="no", lease_seconds=30, owner="t"), att.attempt

    assert [(r.state, n) for r, n in (attempt_fails(), attempt_fails())] == [("ready", 1), ("failed", 2)]
    resume_run(actor=actor_with(org), run=run)
    # Two attempts again: the third is retried, the fourth fails the task.
    assert [(r.state, n) for r, n in (attempt_fails(), attempt_fails())] == [("ready", 3), ("failed", 4)]
    run.refresh_from_db()
    assert run.state == "failed"


def test_a_completion_of_a_generation_from_before_the_reset_is_refused_and_recorded(org, failed_run):
    run = failed_run
    old = by_key(run)["b"]
    resume_run(actor=actor_with(org), run=run)
    # The worker of b's failed generation reports again (a duplicate, or a late replay).
    late = engine_helpers.complete_attempt(task_run_id=old.pk, fencing_token=old.fencing_token, succeeded=True,
                                           output={"late": True}, lease_seconds=30, owner="late")
    assert late.accepted is False
    # Claimed and started as a new generation, the old one's completion still matches nothing.
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[old.pk])
    new = by_key(run)["b"]
    att = engine_helpers.start_attempt(task_run_id=old.pk, fencing_token=new.fencing_token, owner="t",
                                       lease_seconds=30)
    assert att.fencing_token == old.fencing_token + 2  # the reset's generation, then the claim's
    again = engine_helpers.complete_attempt(task_run_id=old.pk, fencing_token=old.fencing_token, succeeded=False,
                                            error="late failure", lease_seconds=30, owner="late")
    assert again.accepted is False
    now = by_key(run)["b"]
    assert (now.state, now.output, now.fencing_token) == ("running", None, att.fencing_token)
    stale = events(run, "stale_completion_rejected")
    assert [(e.fencing_token, e.detail["outcome"]) for e in stale] == [
        (old.fencing_token, "succeeded"), (old.fencing_token, "failed")]


def test_resuming_a_run_that_is_going_or_succeeded_is_refused_with_the_reason(org):
    actor = actor_with(org)
    run = start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER))
    with pytest.raises(ActionRefused, match="is running; only a finished run can be resumed"):
        resume_run(actor=actor, run=run)
    run = drive(run)
    assert run.state == "succeeded"
    with pytest.raises(ActionRefused, match="succeeded: every task succeeded and there is nothing to resume"):
        resume_run(actor=actor, run=run)
    assert not events(run, "resumed")


def test_a_cancelled_run_resumes_its_cancelled_tasks_and_can_be_cancelled_again(org):
    run = start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER))
    owner = actor_with(org, Role.OWNER)
    assert cancel_run(run=run, actor=owner) is True
    result = resume_run(actor=owner, run=run)
    assert result.resumed_from == "cancelled" and result.reopened == ("a", "b", "c", "d")
    assert {k: tr.state for k, tr in by_key(run).items()} == {"a": "ready", "b": "pending", "c": "pending",
                                                              "d": "pending"}
    assert cancel_run(run=run, actor=owner) is True
    run.refresh_from_db()
    assert run.state == "cancelled"
    assert {tr.state for tr in by_key(run).values()} == {"cancelled"}


# --- per-task actions ------------------------------------------------------------------------------


def test_mark_succeeded_of_a_failed_task_lets_its_descendants_run_with_that_output(org, failed_run):
    run = failed_run
    actor = actor_with(org)

    result = mark_task_run_succeeded(actor=actor, task_run=by_key(run)["b"], output={"rows": 7})

    assert result == recovery.ActionResult(run_state="running", resumed_from="failed", reopened=("c",))
    now = by_key(run)
    assert (now["b"].state, now["b"].output, now["b"].error) == ("succeeded", {"rows": 7}, "")
    assert now["c"].state == "ready"  # promoted by the engine's fan-in rule
    resumed = events(run, "resumed")[0]
    assert resumed.detail == {"action": "mark_succeeded", "by": actor.user.email, "task": "b", "tasks": ["c"],
                              "reopened": 1}
    assert [(e.kind, e.task_run.task.key if e.task_run else None) for e in events(run) if e.seq > resumed.seq] == [
        ("marked_succeeded", "b"), ("reset", "c"), ("promoted", "c")]
    mark = events(run, "marked_succeeded")[0]
    assert (mark.from_state, mark.to_state, mark.detail["output_bytes"]) == ("failed", "succeeded", 10)
    # c is handed b's marked output.
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[now["c"].pk])
    c = by_key(run)["c"]
    att = engine_helpers.start_attempt(task_run_id=c.pk, fencing_token=c.fencing_token, owner="t", lease_seconds=30)
    assert att.upstream == {"b": {"rows": 7}}
    engine_helpers.complete_attempt(task_run_id=c.pk, fencing_token=att.fencing_token, succeeded=True, output=None,
                                    lease_seconds=30, owner="t")
    run.refresh_from_db()
    assert run.state == "succeeded"
    assert started_since(run, resumed.seq) == Counter({"c": 1})


def test_skipping_the_only_failed_task_ends_the_run_succeeded(org):
    run = start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER))
    run = drive(run, fail={"c"})
    assert run.state == "failed"
    result = skip_task_run(actor=actor_with(org), task_run=by_key(run)["c"])
    assert result == recovery.ActionResult(run_state="succeeded", resumed_from="failed", reopened=())
    run.refresh_from_db()
    assert (run.state, run.error) == ("succeeded", "")
    assert by_key(run)["c"].skip_reason == "marked"  # a person skipped it
    last = events(run)[-3:]
    assert [(e.kind, e.from_state, e.to_state) for e in last] == [
        ("resumed", "failed", "running"), ("marked_skipped", "failed", "skipped"),
        ("run_finished", "running", "succeeded")]


def test_skipping_a_failed_task_decides_its_downstream_again(org, failed_run):
    # b's downstream c was skipped for b's failure; b skipped, c is skipped again (an
    # all_success task does not run below a skipped one) and the run ends succeeded.
    result = skip_task_run(actor=actor_with(org), task_run=by_key(failed_run)["b"], reason="not needed today")
    assert result.run_state == "succeeded" and result.reopened == ("c",)
    c = by_key(failed_run)["c"]
    assert c.state == "skipped"
    assert [(e.kind, e.detail.get("reason")) for e in events(failed_run) if e.task_run_id == c.pk][-2:] == [
        ("reset", "not needed today"), ("skipped", "trigger_rule")]  # SkipReason: a skip upstream, no failure


def test_retry_of_a_succeeded_task_reruns_it_and_its_downstream_only(org):
    run = drive(start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER)))
    assert run.state == "succeeded"
    result = retry_task_run(actor=actor_with(org), task_run=by_key(run)["b"])
    assert result == recovery.ActionResult(run_state="running", resumed_from="succeeded", reopened=("b", "c"))
    resumed = events(run, "resumed")[0]
    run = drive(run)
    assert run.state == "succeeded"
    assert started_since(run, resumed.seq) == Counter({"b": 1, "c": 1})


def test_retry_of_a_failed_task_while_its_run_is_still_running(org):
    # a fails; its sibling branch s -> t is still going: the run stays running throughout.
    wf = workflow(org, [{"key": "a", "type": "noop"}, {"key": "a2", "type": "noop", "depends_on": ["a"]},
                        {"key": "s", "type": "noop"}, {"key": "t", "type": "noop", "depends_on": ["s"]}])
    run = start_run(workflow=wf, actor=actor_with(org, Role.OWNER))
    rows = by_key(run)
    task_runs.claim_ready_many(limit=2, lease_seconds=30, owner="t", task_run_ids=[rows["a"].pk, rows["s"].pk])
    a = by_key(run)["a"]
    att = engine_helpers.start_attempt(task_run_id=a.pk, fencing_token=a.fencing_token, owner="t", lease_seconds=30)
    engine_helpers.complete_attempt(task_run_id=a.pk, fencing_token=att.fencing_token, succeeded=False,
                                    retryable=False, error="boom", lease_seconds=30, owner="t", claim=False)
    assert by_key(run)["a2"].state == "skipped"
    run.refresh_from_db()
    assert run.state == "running"  # s is still claimed

    result = retry_task_run(actor=actor_with(org), task_run=by_key(run)["a"])

    assert result == recovery.ActionResult(run_state="running", resumed_from=None, reopened=("a", "a2"))
    assert not events(run, "resumed")
    assert {k: tr.state for k, tr in by_key(run).items()} == {"a": "ready", "a2": "pending", "s": "running",
                                                              "t": "pending"}
    assert drive(run).state == "succeeded"


def test_a_task_still_going_upstream_of_what_is_retried_decides_for_its_dependents_itself(org):
    # x fails while y still runs; d needs both, e needs y only. Retrying x reopens d, and
    # leaves e (and d) waiting for y: nothing below y is skipped for y being unfinished.
    wf = workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop"},
                        {"key": "d", "type": "noop", "depends_on": ["x", "y"]},
                        {"key": "e", "type": "noop", "depends_on": ["y"]}])
    run = start_run(workflow=wf, actor=actor_with(org, Role.OWNER))
    rows_ = by_key(run)
    task_runs.claim_ready_many(limit=2, lease_seconds=30, owner="t", task_run_ids=[rows_["x"].pk, rows_["y"].pk])
    x = by_key(run)["x"]
    att = engine_helpers.start_attempt(task_run_id=x.pk, fencing_token=x.fencing_token, owner="t", lease_seconds=30)
    engine_helpers.complete_attempt(task_run_id=x.pk, fencing_token=att.fencing_token, succeeded=False,
                                    retryable=False, error="boom", lease_seconds=30, owner="t", claim=False)
    assert {k: tr.state for k, tr in by_key(run).items()} == {"x": "failed", "y": "running", "d": "skipped",
                                                              "e": "pending"}

    retry_task_run(actor=actor_with(org), task_run=by_key(run)["x"])

    assert {k: tr.state for k, tr in by_key(run).items()} == {"x": "ready", "y": "running", "d": "pending",
                                                              "e": "pending"}
    assert drive(run).state == "succeeded"


@pytest.mark.parametrize(("action", "key", "state_before", "message"), [
    ("retry", "c", "skipped", "task c cannot be retried: its trigger rule all_success \\(it runs once every upstream task succeeded\\) is not met by its upstream tasks \\(b failed\\); retry b \\(its downstream, c included, runs again\\) or mark it succeeded"),
    ("mark", "a", "succeeded", "task a already succeeded; retry it to run it again"),
    ("skip", "c", "skipped", "task c was skipped; only a failed or cancelled task can be skipped"),
    ("skip", "a", "succeeded", "task a succeeded; only a failed or cancelled task can be skipped"),
])
def test_an_action_the_task_runs_state_does_not_allow_is_refused_with_the_reason(org, failed_run, action, key,
                                                                                   state_before, message):
    actor = actor_with(org)
    target = by_key(failed_run)[key]
    assert target.state == state_before
    seq = failed_run.last_event_seq
    with pytest.raises(ActionRefused, match=message):
        if action == "retry":
            retry_task_run(actor=actor, task_run=target)
        elif action == "mark":
            mark_task_run_succeeded(actor=actor, task_run=target, output=None)
        else:
            skip_task_run(actor=actor, task_run=target)
    failed_run.refresh_from_db()
    assert (failed_run.state, failed_run.last_event_seq) == ("failed", seq)  # nothing changed


def test_actions_on_a_running_run_are_refused_for_tasks_still_going_or_with_downstream_going(org):
    wf = workflow(org, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop", "depends_on": ["a"]}])
    run = start_run(workflow=wf, actor=actor_with(org, Role.OWNER))
    actor = actor_with(org)
    with pytest.raises(ActionRefused, match="task a is ready; only a finished task can be acted on"):
        skip_task_run(actor=actor, task_run=by_key(run)["a"])
    # A succeeded task of a running run: its downstream may be going.
    run2 = start_run(workflow=wf, actor=actor_with(org, Role.OWNER))
    a = by_key(run2)["a"]
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="t", task_run_ids=[a.pk])
    att = engine_helpers.start_attempt(task_run_id=a.pk, fencing_token=a.fencing_token + 1, owner="t",
                                       lease_seconds=30)
    engine_helpers.complete_attempt(task_run_id=a.pk, fencing_token=att.fencing_token, succeeded=True, output=1,
                                    lease_seconds=30, owner="t", claim=False)
    with pytest.raises(ActionRefused, match="task a succeeded and its run is still running"):
        retry_task_run(actor=actor, task_run=by_key(run2)["a"])


def test_a_marked_output_is_checked_like_a_tasks_own(org, failed_run, settings):
    settings.FLOWFORGE_MAX_OUTPUT_BYTES = 64
    actor = actor_with(org)
    b = by_key(failed_run)["b"]
    with pytest.raises(InvalidAction, match="is 73 bytes of JSON text; at most 64") as too_big:
        mark_task_run_succeeded(actor=actor, task_run=b, output={"data": "x" * 62})
    assert too_big.value.field == "output"
    with pytest.raises(InvalidAction, match="not storable JSON") as nan:
        mark_task_run_succeeded(actor=actor, task_run=b, output={"x": float("nan")})
    assert nan.value.field == "output"
    deep: list = []
    for _ in range(500):  # far past the limit
        deep = [deep]
    with pytest.raises(InvalidAction, match="is nested deeper than 64 levels") as too_deep:
        mark_task_run_succeeded(actor=actor, task_run=b, output=deep)
    assert too_deep.value.field == "output"
    with pytest.raises(InvalidAction, match="at most 500") as long_reason:
        skip_task_run(actor=actor, task_run=b, reason="r" * 501)
    assert long_reason.value.field == "reason"
    assert by_key(failed_run)["b"].state == "failed"
    # NUL characters go, as in a task's own output.
    mark_task_run_succeeded(actor=actor, task_run=b, output={"s": "a\x00b"})
    assert by_key(failed_run)["b"].output == {"s": "ab"}


def test_a_finished_run_is_not_reopened_past_its_workflows_run_limit_or_for_an_archived_version(org):
    owner = actor_with(org, Role.OWNER)
    wf = workflow(org, DIAMOND, concurrency={"max_running_runs": 1})
    failed = drive(start_run(workflow=wf, actor=owner), fail={"c"})
    busy = start_run(workflow=wf, actor=owner)  # the one place is taken
    with pytest.raises(ActionRefused, match=r"has 1/1 runs going \(its run limit"):
        resume_run(actor=owner, run=failed)
    # Skipping the failed leaf reopens nothing: allowed under a full limit.
    assert skip_task_run(actor=owner, task_run=by_key(failed)["c"]) == recovery.ActionResult(
        run_state="succeeded", resumed_from="failed", reopened=())
    cancel_run(run=busy, actor=owner)
    archive_workflow(actor=owner, workflow=wf, confirm=wf.name)
    with pytest.raises(ActionRefused, match="is archived; restore it"):
        retry_task_run(actor=owner, task_run=by_key(failed)["c"])
    assert by_key(failed)["c"].state == "skipped"


def test_a_viewer_may_not_act_and_each_action_is_audited_once_with_its_actor(org, failed_run):
    viewer = actor_with(org, Role.VIEWER)
    rows = by_key(failed_run)
    for call in (lambda: resume_run(actor=viewer, run=failed_run),
                 lambda: retry_task_run(actor=viewer, task_run=rows["b"]),
                 lambda: mark_task_run_succeeded(actor=viewer, task_run=rows["b"], output=1),
                 lambda: skip_task_run(actor=viewer, task_run=rows["b"])):
        with pytest.raises(Forbidden):
            call()
    assert not events(failed_run, "resumed")

    member = actor_with(org)
    mark_task_run_succeeded(actor=member, task_run=rows["b"], output={"ok": 1}, reason="checked by hand")
    entry = AuditLog.objects.for_organization(org).get(action="task_run.marked_succeeded")
    assert (entry.actor_user_id, entry.target_type, entry.target_id) == (member.user.pk, "taskrun", str(rows["b"].pk))
    assert entry.metadata == {"run": str(failed_run.pk), "task_key": "b", "channel": "web", "from_state": "failed",
                              "reopened": 1, "tasks": ["c"], "reason": "checked by hand",
                              "run_resumed_from": "failed", "output_bytes": 8}


def test_the_run_timeout_counts_from_the_resume(org):
    owner = actor_with(org, Role.OWNER)
    run = drive(start_run(workflow=workflow(org, DIAMOND, timeout_seconds=600), actor=owner), fail={"b"})
    # Started two hours ago: long past its timeout, but it was not running since it failed.
    WorkflowRun.objects.for_organization(org).filter(pk=run.pk).update(
        started_at=run.started_at - dt.timedelta(hours=2))
    resume_run(actor=owner, run=run)
    with connection.cursor() as cur:
        cur.execute(sql.queries["run_list_timed_out"], {"limit": 100})
        assert run.pk not in [r[0] for r in cur.fetchall()]


def test_the_event_stream_of_a_resumed_run_goes_on_past_its_first_run_finished(org, failed_run):
    resume_run(actor=actor_with(org), run=failed_run)
    feed = EventFeed(organization_id=org.pk, run_id=failed_run.pk, after=0)
    sent = "".join(feed.read())
    assert '"kind":"run_finished"' in sent.replace(" ", "") and '"kind":"resumed"' in sent.replace(" ", "")
    assert feed.finished is False  # the run is running again: the stream waits for more
    drive(failed_run)
    rest = "".join(feed.read())
    assert '"kind":"run_finished"' in rest.replace(" ", "") and feed.finished is True


def test_another_organizations_run_is_not_found(make_org, failed_run):
    other = make_org()
    with pytest.raises(WorkflowRun.DoesNotExist):
        resume_run(actor=actor_with(other, Role.OWNER), run=failed_run)
    failed_run.refresh_from_db()
    assert failed_run.state == "failed"


# --- an action and a cancel of the same run ---------------------------------------------------------


def _backends_waiting_on_a_lock() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")
        return cur.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_waits_for_an_action_in_progress_and_then_cancels_what_it_reopened(org):
    run = drive(start_run(workflow=workflow(org, DIAMOND), actor=actor_with(org, Role.OWNER)), fail={"b"})
    b = by_key(run)["b"]
    reopened, release = threading.Event(), threading.Event()

    def action_in_progress():
        # What engine.recovery does, paused before its commit: the run's row locked first,
        # the run and b reopened.
        try:
            with transaction.atomic():
                rows.lock_run(workflow_run_id=run.pk)
                rows.reopen_run(workflow_run_id=run.pk, detail={"action": "retry"})
                assert rows.reopen_task_runs([rows.Reopen(b.pk, b.fencing_token, "failed", "ready")],
                                             detail={"action": "retry"}) == {b.pk}
                reopened.set()
                release.wait(30)
        finally:
            connection.close()

    cancelled: list[bool] = []

    def cancel():
        try:
            cancelled.append(cancel_run(run=run, actor=actor_with(org, Role.OWNER)))
        finally:
            connection.close()

    action = threading.Thread(target=action_in_progress)
    action.start()
    assert reopened.wait(30)
    canceller = threading.Thread(target=cancel)
    canceller.start()
    # The cancel waits for the run's row (it takes it first, as the action did)...
    wait_until(lambda: _backends_waiting_on_a_lock() >= 1, timeout=30, what="the cancel to wait for the row lock")
    release.set()
    action.join(30)
    canceller.join(30)
    # ...and so sees, and cancels, the task run the action reopened: nothing stays open.
    assert cancelled == [True]
    run.refresh_from_db()
    assert run.state == "cancelled"
    assert by_key(run)["b"].state == "cancelled"
    assert not [tr for tr in by_key(run).values() if tr.state in ("pending", "ready", "running")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("locked", ["run", "workflow"])
def test_a_start_waits_for_a_row_lock_held_by_a_recorder_instead_of_deadlocking(org, locked):
    """A re-run (``retry_run``) references the original run and its workflow version, whose
    rows an action on the run (``engine.recovery``: the run's row FOR UPDATE, then its audit
    record) or an archive (the version's row FOR UPDATE, then its record) holds. The re-run's
    foreign keys were checked at its commit, after its audit record had taken the chain
    lock: each waited for the other and PostgreSQL aborted one (a 500 from
    POST /runs/{id}/retry/ beside a mark-succeeded of a task of that run). Now the re-run
    waits for the row, the other records and commits, then the re-run does: both succeed."""
    owner = actor_with(org, Role.OWNER)
    run = drive(start_run(workflow=workflow(org, DIAMOND), actor=owner), fail={"b"})
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def recorder():
        # What an action on the run (or an archive of its version) does, paused: the row
        # locked first, its audit record after.
        try:
            with transaction.atomic():
                if locked == "run":
                    rows.lock_run(workflow_run_id=run.pk)
                else:
                    Workflow.objects.for_organization(org).select_for_update().get(pk=run.workflow_id)
                holding.set()
                release.wait(30)
                audit.record("task_run.retried", actor=owner, target=run, metadata={"held": locked})
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    reruns: list[WorkflowRun] = []

    def rerun():
        try:
            reruns.append(retry_run(actor=owner, run=WorkflowRun.objects.for_organization(org).select_related(
                "workflow").get(pk=run.pk)))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=recorder)
    first.start()
    assert holding.wait(30)
    second = threading.Thread(target=rerun)
    second.start()
    # The re-run waits for the row the recorder holds...
    wait_until(lambda: _backends_waiting_on_a_lock() >= 1, timeout=30, what="the re-run to wait for the row")
    release.set()  # ...which records (the chain lock is free) and commits
    first.join(30)
    second.join(30)
    assert errors == []
    assert len(reruns) == 1 and reruns[0].retry_of_id == run.pk
    actions = list(AuditLog.objects.for_organization(org).filter(
        action__in=["task_run.retried", "run.retried"]).order_by("seq").values_list("action", flat=True))
    assert actions == ["task_run.retried", "run.retried"]


# --- review findings: a branch not taken, a handled failure, a marked handler ----------------------

# check -> alert (one_failed: nothing fails, so skipped: trigger_rule) ; report (none_failed on
# check and alert: succeeds) -> publish (fails).
BRANCH = [
    {"key": "check", "type": "noop"},
    {"key": "alert", "type": "noop", "depends_on": ["check"], "trigger_rule": "one_failed"},
    {"key": "report", "type": "noop", "depends_on": ["check", "alert"], "trigger_rule": "none_failed"},
    {"key": "publish", "type": "noop", "depends_on": ["report"]},
]


def test_resume_keeps_what_succeeded_below_a_branch_not_taken(org):
    run = drive(start_run(workflow=workflow(org, BRANCH), actor=actor_with(org, Role.OWNER)), fail={"publish"})
    states = {k: (tr.state, tr.skip_reason) for k, tr in by_key(run).items()}
    assert states == {"check": ("succeeded", ""), "alert": ("skipped", "trigger_rule"),
                      "report": ("succeeded", ""), "publish": ("failed", "")}
    seq = run.last_event_seq
    report_output = by_key(run)["report"].output

    result = resume_run(actor=actor_with(org), run=run, reason="fixed publish")

    assert result.reopened == ("publish",)
    run = drive(run)
    assert run.state == "succeeded"
    assert started_since(run, seq) == Counter({"publish": 1})
    assert by_key(run)["report"].output == report_output
    assert by_key(run)["alert"].state == "skipped"


def test_resume_keeps_what_succeeded_below_a_condition_that_was_false(org):
    wf = workflow(org, [
        {"key": "check", "type": "noop"},
        {"key": "large", "type": "noop", "depends_on": ["check"], "condition": "input.big == true"},
        {"key": "report", "type": "noop", "depends_on": ["large"], "trigger_rule": "none_failed"},
        {"key": "publish", "type": "noop", "depends_on": ["report"]},
    ])
    run = start_run(workflow=wf, actor=actor_with(org, Role.OWNER), run_input={"big": False})
    # check succeeds; then large's worker finds its condition false (as engine.worker.execute does).
    ready = [by_key(run)["check"].pk]
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="test", task_run_ids=ready)
    check = by_key(run)["check"]
    att = engine_helpers.start_attempt(task_run_id=check.pk, fencing_token=check.fencing_token, owner="test",
                                       lease_seconds=30)
    engine_helpers.complete_attempt(task_run_id=check.pk, fencing_token=att.fencing_token, succeeded=True,
                                    output={}, error="", retryable=False, lease_seconds=30, owner="test", claim=False)
    large = by_key(run)["large"]
    task_runs.claim_ready_many(limit=1, lease_seconds=30, owner="test", task_run_ids=[large.pk])
    large = by_key(run)["large"]
    att = engine_helpers.start_attempt(task_run_id=large.pk, fencing_token=large.fencing_token, owner="test",
                                       lease_seconds=30)
    assert task_runs.skip_for_condition(task_run_id=large.pk, fencing_token=att.fencing_token).accepted
    run = drive(run, fail={"publish"})
    assert {k: (tr.state, tr.skip_reason) for k, tr in by_key(run).items()} == {
        "check": ("succeeded", ""), "large": ("skipped", "condition_false"), "report": ("succeeded", ""),
        "publish": ("failed", "")}
    seq = run.last_event_seq

    assert resume_run(actor=actor_with(org), run=run).reopened == ("publish",)

    run = drive(run)
    assert run.state == "succeeded"
    assert started_since(run, seq) == Counter({"publish": 1})
    assert by_key(run)["large"].state == "skipped"


def test_resume_of_a_run_whose_failure_was_handled_names_the_failure(org):
    wf = workflow(org, [
        {"key": "a", "type": "noop"},
        {"key": "b", "type": "noop", "depends_on": ["a"]},
        {"key": "alert", "type": "noop", "depends_on": ["b"], "trigger_rule": "one_failed"},
    ])
    run = drive(start_run(workflow=wf, actor=actor_with(org, Role.OWNER)), fail={"b"})
    assert run.state == "succeeded"  # alert handled b's failure
    with pytest.raises(ActionRefused, match=r"succeeded: the failure of b was handled by a task whose trigger "
                                            r"rule reacts to failures .* retry task b to run it again"):
        resume_run(actor=actor_with(org), run=run)


def test_marking_the_failure_handler_succeeded_counts_as_handling_the_failure(org):
    wf = workflow(org, [
        {"key": "a", "type": "noop"},
        {"key": "b", "type": "noop", "depends_on": ["a"]},
        {"key": "alert", "type": "noop", "depends_on": ["b"], "trigger_rule": "one_failed"},
    ])
    run = drive(start_run(workflow=wf, actor=actor_with(org, Role.OWNER)), fail={"b", "alert"})
    assert (run.state, run.error) == ("failed", "2 tasks failed: b, alert")

    mark_task_run_succeeded(actor=actor_with(org), task_run=by_key(run)["alert"], output={"paged": "on-call"})

    run.refresh_from_db()
    assert by_key(run)["alert"].state == "succeeded"
    assert (run.state, run.error) == ("succeeded", "")
