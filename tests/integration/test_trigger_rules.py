"""Trigger rules and conditions on real worker processes (issue 19): an ``always`` cleanup
runs after a failure (and the run still fails), a ``one_failed`` handler handles one (the
run succeeds), and a condition on an upstream output chooses a branch."""

from __future__ import annotations

import pytest

from engine.models import TaskRun, TaskRunEvent, WorkflowRun
from engine.services import start_run
from tests.integration.conftest import wait_for_run_terminal

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def rows(org, run):
    return {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run)
            .select_related("task")}


def test_an_always_cleanup_runs_after_a_failure_and_the_run_still_fails(stack, org, make_workflow):
    wf = make_workflow(org, [
        {"key": "setup", "type": "noop"},
        {"key": "work", "type": "fail", "config": {"message": "disk full"}, "depends_on": ["setup"]},
        {"key": "publish", "type": "noop", "depends_on": ["work"]},
        {"key": "cleanup", "type": "sleep", "config": {"seconds": 0.05}, "depends_on": ["publish"],
         "trigger_rule": "always"},
        {"key": "alert", "type": "noop", "depends_on": ["work"], "trigger_rule": "all_done",
         "condition": "upstream.work == null"},
    ], name="cleanup")
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    run = start_run(workflow=wf)

    assert wait_for_run_terminal(run, timeout=60) == "failed"
    tr = rows(org, run)
    assert (tr["work"].state, tr["work"].error) == ("failed", "RuntimeError: disk full (attempt 1)")
    assert (tr["publish"].state, tr["publish"].skip_reason) == ("skipped", "upstream_failed")
    # The cleanup ran after the failure (two levels below it, through the skipped publish).
    assert tr["cleanup"].state == "succeeded"
    assert tr["cleanup"].started_at >= tr["work"].finished_at
    # all_done ran the alert, whose condition saw the failed task's output: null.
    assert tr["alert"].state == "succeeded"
    run.refresh_from_db()
    assert run.error == "task work failed"
    started = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="started")
    assert sorted(started.values_list("task_run__task__key", flat=True)) == ["alert", "cleanup", "setup", "work"]


def test_a_failure_handled_by_a_one_failed_task_leaves_the_run_succeeded(stack, org, make_workflow):
    wf = make_workflow(org, [
        {"key": "charge", "type": "fail"},
        {"key": "refund", "type": "noop", "depends_on": ["charge"], "trigger_rule": "one_failed"},
        {"key": "receipt", "type": "noop", "depends_on": ["charge"]},
    ], name="handled")
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    run = start_run(workflow=wf)

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    tr = rows(org, run)
    assert (tr["charge"].state, tr["refund"].state) == ("failed", "succeeded")
    assert (tr["receipt"].state, tr["receipt"].skip_reason) == ("skipped", "upstream_failed")
    assert WorkflowRun.objects.for_organization(org).get(pk=run.pk).error == ""


@pytest.mark.parametrize(("route", "taken", "not_taken"), [("left", "left", "right"), ("right", "right", "left")])
def test_a_condition_on_an_upstream_output_chooses_a_branch(stack, org, make_workflow, route, taken, not_taken):
    wf = make_workflow(org, [
        # The python task's output carries the run input: {"input": {"route": ...}, ...}.
        {"key": "check", "type": "python", "config": {"callable": "tests.callables.echo"}},
        {"key": "left", "type": "noop", "depends_on": ["check"],
         "condition": 'upstream.check.input.route == "left"'},
        {"key": "right", "type": "noop", "depends_on": ["check"],
         "condition": 'upstream.check.input.route == "right"'},
        {"key": "after_left", "type": "noop", "depends_on": ["left"]},
        {"key": "join", "type": "noop", "depends_on": ["after_left", "right"], "trigger_rule": "none_failed"},
    ], name="branch")
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    run = start_run(workflow=wf, run_input={"route": route})

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    tr = rows(org, run)
    assert tr[taken].state == "succeeded"
    assert (tr[not_taken].state, tr[not_taken].skip_reason) == ("skipped", "condition_false")
    assert tr["after_left"].state == ("succeeded" if taken == "left" else "skipped")
    assert tr["join"].state == "succeeded"
    (event,) = TaskRunEvent.objects.for_organization(org).filter(task_run=tr[not_taken], kind="skipped")
    assert event.detail == {"reason": "condition_false",
                            "condition": f'upstream.check.input.route == "{not_taken}"'}
    # The skipped branch's handler never started: only its condition was evaluated.
    handlers = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="succeeded")
    assert not_taken not in set(handlers.values_list("task_run__task__key", flat=True))


def test_a_condition_that_cannot_be_evaluated_fails_its_task_without_retry(stack, org, make_workflow):
    wf = make_workflow(org, [
        {"key": "check", "type": "noop"},
        {"key": "use", "type": "noop", "depends_on": ["check"], "max_attempts": 3,
         "condition": "upstream.check.ready"},
    ], name="bad-condition")
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    run = start_run(workflow=wf)

    assert wait_for_run_terminal(run, timeout=60) == "failed"
    use = rows(org, run)["use"]
    assert (use.state, use.attempt) == ("failed", 1)
    assert use.error.startswith("condition could not be evaluated: ")
