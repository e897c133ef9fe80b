"""The Python SDK's recovery actions against the real API (gunicorn, Dramatiq workers,
clock): client.runs.resume, retry_task, mark_task_succeeded and skip_task do what
docs/recovery.md says, and the API's refusals reach the caller as the SDK's errors —
a Conflict carrying the server's reason (a retry its trigger rule does not allow, a
resume of a succeeded run), PermissionDenied for a viewer's key.

The workflow: a -> b (fails its first attempt, succeeds on the next: ``fail`` with
``fail_attempts`` 1, one attempt allowed) -> c (all_success), and b -> cleanup (always).
A run fails at b; c is skipped, cleanup runs anyway."""

from __future__ import annotations

import pytest
from flowforge_sdk import Client, Conflict, PermissionDenied

from audit.models import AuditLog
from engine.models import TaskRunEvent
from engine.services import apply_definition
from tenancy.apikeys import create_api_key
from tenancy.models import KeyRole, Membership, Role
from tests.integration.conftest import start_web
from tests.unit.test_api_auth import actor_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TASKS = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "fail", "config": {"fail_attempts": 1}, "depends_on": ["a"], "max_attempts": 1},
    {"key": "c", "type": "noop", "depends_on": ["b"]},
    {"key": "cleanup", "type": "noop", "depends_on": ["b"], "trigger_rule": "always"},
]


def key_of(org, role: str) -> str:
    owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
    return create_api_key(actor=owner, name=f"sdk {role}", role=role)[1]


def states(run) -> dict[str, tuple[str, int]]:
    return {t.key: (t.state, t.attempt) for t in run.task_runs}


def failed_run(client: Client):
    run = client.runs.wait(client.runs.start("sdk-recovery").id, timeout=60)
    assert run.state == "failed"
    assert states(run) == {"a": ("succeeded", 1), "b": ("failed", 1), "c": ("skipped", 1),
                           "cleanup": ("succeeded", 1)}
    return run


def test_the_sdks_recovery_actions_against_the_real_api(stack, org):
    web = start_web(stack)
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    apply_definition(organization=org, document={"name": "sdk-recovery", "tasks": TASKS})
    member = Client(web, key_of(org, KeyRole.MEMBER), retries=0)
    viewer = Client(web, key_of(org, KeyRole.VIEWER), retries=0)

    run = failed_run(member)
    with pytest.raises(PermissionDenied):
        viewer.runs.resume(run.id)
    with pytest.raises(Conflict) as refused:
        member.runs.retry_task(run.id, run.task("c"))
    assert refused.value.detail == (
        "task c cannot be retried: its trigger rule all_success (it runs once every upstream task succeeded) is "
        "not met by its upstream tasks (b failed); retry b (its downstream, c included, runs again) or mark it "
        "succeeded")

    # The always cleanup below the failed b may run again; the run fails again (b still failed).
    again = member.runs.retry_task(run.id, run.task("cleanup"), reason="re-check the cleanup")
    assert again.state == "running"
    run = member.runs.wait(run.id, timeout=60)
    assert (run.state, states(run)) == ("failed", {"a": ("succeeded", 1), "b": ("failed", 1), "c": ("skipped", 1),
                                                   "cleanup": ("succeeded", 2)})

    # Resume: b runs again (attempt 2 succeeds), then c and the cleanup; a does not.
    member.runs.resume(run.id, reason="fixed the bucket")
    run = member.runs.wait(run.id, timeout=60)
    assert (run.state, states(run)) == ("succeeded", {"a": ("succeeded", 1), "b": ("succeeded", 2),
                                                      "c": ("succeeded", 1), "cleanup": ("succeeded", 3)})
    assert run.task("b").output == {"succeeded_on_attempt": 2}
    with pytest.raises(Conflict, match="succeeded: every task succeeded and there is nothing to resume"):
        member.runs.resume(run.id)

    # Mark succeeded: c runs, handed the output given.
    second = failed_run(member)
    member.runs.mark_task_succeeded(second.id, second.task("b"), {"rows": 3}, reason="loaded by hand")
    second = member.runs.wait(second.id, timeout=60)
    # c never started before: its first attempt.
    assert (second.state, states(second)["c"]) == ("succeeded", ("succeeded", 1))
    assert second.task("b").output == {"rows": 3}

    # Skip: a run whose only failure is skipped succeeds; c stays skipped below the skip.
    third = failed_run(member)
    skipped = member.runs.skip_task(third.id, third.task("b").id, reason="not needed today")
    assert skipped.state == "succeeded"
    assert (states(skipped)["b"][0], states(skipped)["c"][0]) == ("skipped", "skipped")
    assert (skipped.task("c").skip_reason, skipped.task("b").skip_reason) == ("trigger_rule", "marked")

    # Each action done is audited once, as the API key's; the refused ones are not.
    actions = sorted(AuditLog.objects.for_organization(org).filter(action__in=[
        "run.resumed", "task_run.retried", "task_run.marked_succeeded", "task_run.skipped"]).values_list(
        "action", flat=True))
    assert actions == ["run.resumed", "task_run.marked_succeeded", "task_run.retried", "task_run.skipped"]
    assert TaskRunEvent.objects.for_organization(org).filter(kind="resumed").count() == 4
    member.close()
    viewer.close()
