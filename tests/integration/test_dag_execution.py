"""A 10-task DAG runs in dependency order to success on real worker processes."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.models import TaskRun, TaskRunEvent
from engine.services import start_run
from tests.integration.conftest import wait_for_run_terminal

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# extract -> validate -> t1..t6 (fan-out) -> merge (fan-in) -> publish : 10 tasks
TEN_TASK_DAG = (
    [{"key": "extract", "type": "noop"}, {"key": "validate", "type": "sleep", "config": {"seconds": 0.05}, "depends_on": ["extract"]}]
    + [{"key": f"t{i}", "type": "sleep", "config": {"seconds": 0.1}, "depends_on": ["validate"]} for i in range(1, 7)]
    + [
        {"key": "merge", "type": "noop", "depends_on": [f"t{i}" for i in range(1, 7)]},
        {"key": "publish", "type": "noop", "depends_on": ["merge"]},
    ]
)


def test_ten_task_dag_runs_in_dependency_order_to_success(stack, org, make_workflow):
    wf = make_workflow(org, TEN_TASK_DAG, name="ten")
    stack.start_worker(processes=2, threads=4)
    stack.start_clock()
    run = start_run(workflow=wf, run_input={"n": 1})

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"

    task_runs = {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run).select_related("task")}
    assert len(task_runs) == 10
    assert {tr.state for tr in task_runs.values()} == {"succeeded"}
    deps = {t["key"]: t.get("depends_on", []) for t in TEN_TASK_DAG}
    for key, parents in deps.items():
        for parent in parents:
            # Every task started only after each of its dependencies finished.
            assert task_runs[parent].finished_at <= task_runs[key].started_at, (parent, key)
    seqs = list(TaskRunEvent.objects.for_organization(org).filter(workflow_run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    started = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="started").count()
    assert started == 10


def test_a_claim_burst_carried_several_generations_per_message_runs_each_task_once(
    stack, org, make_workflow, settings
):
    # 40 independent tasks claimed at once, a fan-out of 4: each of 4 messages carries
    # 10 generations; with a 0.2 s hand-off the sleeping ones are passed back to other threads.
    # (The start claims and publishes the roots in this process: its fan-out too.)
    stack.env.update(FLOWFORGE_DISPATCH_FANOUT="4", FLOWFORGE_GROUP_HANDOFF_SECONDS="0.2")
    settings.FLOWFORGE_DISPATCH_FANOUT = 4
    tasks = [{"key": f"n{i:02d}", "type": "noop"} for i in range(30)]
    tasks += [{"key": f"s{i}", "type": "sleep", "config": {"seconds": 0.3}} for i in range(10)]
    wf = make_workflow(org, tasks, name="burst")
    worker = stack.start_worker(processes=2, threads=4)
    stack.start_clock()
    run = start_run(workflow=wf, run_input={})

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"

    # The burst went out grouped, and a thread stuck behind a sleeping task handed the rest on.
    assert "handed " in worker.log_path.read_text(errors="replace")
    events = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run)
    started = list(events.filter(kind="started").values_list("task_run_id", flat=True))
    assert len(started) == 40 and len(set(started)) == 40  # every task started exactly once
    assert not events.filter(kind__in=["duplicate_delivery_ignored", "stale_dispatch_ignored"]).exists()
    seqs = list(events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_slow_tasks_spread_over_both_worker_processes_instead_of_queueing_in_one(stack, org, make_workflow):
    # start_worker caps each process's prefetch at its thread count: with 2 processes of 2
    # threads, 4 sleeping tasks cannot all be taken by one process while the other idles.
    wf = make_workflow(org, [{"key": f"s{i}", "type": "sleep", "config": {"seconds": 1.5}} for i in range(4)],
                       name="spread")
    stack.start_worker(processes=2, threads=2)
    stack.start_clock()
    run = start_run(workflow=wf, run_input={})

    assert wait_for_run_terminal(run, timeout=60) == "succeeded"

    started = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="started")
    per_process = Counter(e.detail["worker"].split("@", 1)[1].split(":")[1] for e in started)
    assert sorted(per_process.values()) == [2, 2], per_process
    assert "dramatiq_queue_prefetch" not in stack.env  # the cap came from start_worker
