"""Resume from failure and per-task actions (issue 19) on real worker processes, through the
REST API of a real gunicorn: a 10-task run failing at task 7 is resumed and runs only task
7 and its descendants (counted from the run's events), its succeeded outputs unchanged; a
failed task marked succeeded lets its descendants run with the given output; each action
is in the audit log; a viewer's API key gets 403 for each."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from audit.models import AuditLog
from engine.models import TaskRun, TaskRunEvent
from engine.services import start_run
from tenancy.apikeys import create_api_key
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role
from tests.integration.conftest import start_web, wait_for_run_terminal
from tests.integration.helpers import assert_gap_free

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ECHO = {"callable": "tests.callables.echo"}


def ten_tasks(t7: dict) -> list[dict]:
    """t1 -> t2, t3 -> t4, t5 -> t6 -> t7 -> t8 -> t10, and t6 -> t9 -> t10: task 7 (``t7``)
    has two descendants (t8, t10); t9 is a sibling branch that does not depend on it. Each
    task but t7 returns what it was given (tests.callables.echo), so a task that ran again
    would show another attempt in its output."""
    deps = {"t1": [], "t2": ["t1"], "t3": ["t1"], "t4": ["t2"], "t5": ["t3"], "t6": ["t4", "t5"], "t7": ["t6"],
            "t8": ["t7"], "t9": ["t6"], "t10": ["t8", "t9"]}
    return [{"key": k, "depends_on": d, **(t7 if k == "t7" else {"type": "python", "config": ECHO})}
            for k, d in deps.items()]


def api_keys(org) -> tuple[dict, dict]:
    """Bearer headers of a member's and a viewer's API key of ``org``."""
    owner = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    actor = actor_for_membership(owner, channel="cli")
    _m, member = create_api_key(actor=actor, name="on-call", role=Role.MEMBER)
    _v, viewer = create_api_key(actor=actor, name="dashboard", role=Role.VIEWER)
    return {"Authorization": f"Bearer {member}"}, {"Authorization": f"Bearer {viewer}"}


def task_runs(org, run) -> dict[str, TaskRun]:
    return {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run)
            .select_related("task")}


def started_after(org, run, seq: int) -> Counter:
    """Attempts started after event ``seq``, by task key."""
    return Counter(TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="started", seq__gt=seq)
                   .values_list("task_run__task__key", flat=True))


def the_resumed_event(org, run) -> TaskRunEvent:
    (event,) = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="resumed")
    return event


def test_resuming_a_ten_task_run_failed_at_task_7_reruns_only_it_and_its_descendants(stack, org, make_workflow):
    # Task 7 fails its first attempt and has no other: the run fails. Its cause is "fixed"
    # from the second attempt on, which the resume makes.
    wf = make_workflow(org, ten_tasks({"type": "fail", "config": {"fail_attempts": 1, "message": "bucket missing"},
                                       "max_attempts": 1}), name="ten-resume")
    member, viewer = api_keys(org)
    stack.start_worker(processes=2, threads=4)
    stack.start_clock()
    base = start_web(stack)
    run = start_run(workflow=wf, run_input={"day": "2026-03-01"})
    assert wait_for_run_terminal(run, timeout=60) == "failed"
    before = task_runs(org, run)
    assert {k: tr.state for k, tr in before.items()} == {
        **{f"t{i}": "succeeded" for i in (1, 2, 3, 4, 5, 6, 9)}, "t7": "failed", "t8": "skipped", "t10": "skipped"}

    t7 = before["t7"].pk
    with httpx.Client(base_url=f"{base}/api/v1", timeout=30) as http:
        for path, body in ((f"runs/{run.pk}/resume/", {}), (f"runs/{run.pk}/task-runs/{t7}/retry/", {}),
                           (f"runs/{run.pk}/task-runs/{t7}/mark-succeeded/", {"output": 1}),
                           (f"runs/{run.pk}/task-runs/{t7}/skip/", {})):
            refused = http.post(path, json=body, headers=viewer)
            assert refused.status_code == 403, (path, refused.text)
        run.refresh_from_db()
        assert run.state == "failed" and not TaskRunEvent.objects.for_organization(org).filter(
            workflow_run=run, kind="resumed").exists()

        resumed = http.post(f"runs/{run.pk}/resume/", json={"reason": "bucket restored"}, headers=member)
        assert resumed.status_code == 200, resumed.text
        # Running again (or, the workers being quick, already done): the wait below decides.
        assert resumed.json()["state"] in ("running", "succeeded")

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    event = the_resumed_event(org, run)
    assert (event.from_state, event.detail["tasks"], event.detail["reason"]) == (
        "failed", ["t10", "t7", "t8"], "bucket restored")
    # Only task 7 and its descendants started again, once each.
    assert started_after(org, run, event.seq) == Counter({"t7": 1, "t8": 1, "t10": 1})
    after = task_runs(org, run)
    for key in ("t1", "t2", "t3", "t4", "t5", "t6", "t9"):  # kept: same generation, same output
        assert (after[key].fencing_token, after[key].output) == (before[key].fencing_token, before[key].output), key
        assert after[key].output["attempt"] == 1
    assert after["t7"].output == {"succeeded_on_attempt": 2}
    assert (after["t7"].attempt, after["t7"].attempt_base) == (2, 1)
    assert after["t8"].output["upstream"] == {"t7": {"succeeded_on_attempt": 2}}
    assert after["t10"].output["upstream"]["t9"] == before["t9"].output
    assert_gap_free(org, run)
    entry = AuditLog.objects.for_organization(org).get(action="run.resumed", target_id=str(run.pk))
    assert (entry.actor_type, entry.actor_api_key_prefix is not None, entry.metadata["tasks"]) == (
        "api_key", True, ["t10", "t7", "t8"])


def test_marking_a_failed_task_succeeded_lets_its_descendants_run_with_that_output(stack, org, make_workflow):
    wf = make_workflow(org, ten_tasks({"type": "fail", "config": {"message": "the API is down"}, "max_attempts": 1}),
                       name="ten-mark")
    member, viewer = api_keys(org)
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    base = start_web(stack)
    run = start_run(workflow=wf, run_input={})
    assert wait_for_run_terminal(run, timeout=60) == "failed"
    before = task_runs(org, run)

    url = f"{base}/api/v1/runs/{run.pk}/task-runs/{before['t7'].pk}/mark-succeeded/"
    assert httpx.post(url, json={"output": {"rows": 0}}, headers=viewer, timeout=30).status_code == 403
    marked = httpx.post(url, json={"output": {"rows": 42, "loaded": "by hand"}, "reason": "loaded from the export"},
                        headers=member, timeout=30)
    assert marked.status_code == 200, marked.text
    body = {t["key"]: t for t in marked.json()["task_runs"]}
    # (t8 and t10 are the workers' from here: how far they got by the answer is a race.)
    assert (body["t7"]["state"], body["t7"]["output"]) == ("succeeded", {"rows": 42, "loaded": "by hand"})
    assert body["t8"]["state"] != "skipped"

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    event = the_resumed_event(org, run)
    assert started_after(org, run, event.seq) == Counter({"t8": 1, "t10": 1})
    after = task_runs(org, run)
    assert after["t7"].output == {"rows": 42, "loaded": "by hand"}
    assert after["t8"].output["upstream"] == {"t7": {"rows": 42, "loaded": "by hand"}}
    for key in ("t1", "t6", "t9"):
        assert after[key].output == before[key].output
    entry = AuditLog.objects.for_organization(org).get(action="task_run.marked_succeeded")
    assert (entry.target_id, entry.metadata["reason"], entry.metadata["tasks"]) == (
        str(before["t7"].pk), "loaded from the export", ["t10", "t8"])
