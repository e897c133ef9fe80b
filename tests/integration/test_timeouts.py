"""A task's timeout_seconds bounds each attempt on real worker processes."""

from __future__ import annotations

import pytest

from engine.models import TaskRun, TaskRunEvent
from engine.services import start_run
from tests.integration.conftest import wait_for_run_terminal

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_attempt_past_its_timeout_fails_with_a_timeout_error_and_is_retried(stack, org, make_workflow):
    wf = make_workflow(org, [
        {"key": "hang", "type": "sleep", "config": {"seconds": 60}, "timeout_seconds": 1,
         "max_attempts": 2, "retry_backoff_seconds": 0},
        {"key": "after", "type": "noop", "depends_on": ["hang"]},
    ], name="timeouts")
    stack.start_worker(processes=1, threads=4)
    stack.start_clock()
    run = start_run(workflow=wf)
    assert wait_for_run_terminal(run, timeout=45) == "failed"
    hang = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="hang")
    assert hang.state == "failed" and hang.attempt == 2
    assert hang.error == "attempt timed out (timeout_seconds reached)"
    kinds = list(TaskRunEvent.objects.for_organization(org).filter(task_run=hang).order_by("seq")
                 .values_list("kind", "to_state"))
    assert kinds.count(("attempt_timed_out", "ready")) == 1 and kinds.count(("attempt_timed_out", "failed")) == 1
    assert [k for k, _ in kinds].count("started") == 2
    assert TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="after").state == "skipped"
    # Each attempt was cut off near its timeout, not after the handler's 60 s.
    assert (run.finished_at - run.started_at).total_seconds() < 30
