"""The hot path's transactions commit without waiting for the WAL flush, except a run's end.

``driver.run_prepared(..., flush=False)`` opens its own transaction with
``commit_without_wal_flush`` (``SET LOCAL synchronous_commit = off``); a batch of starts
and successes and a claim use it; ``run_finish_if_done_many`` turns the flush back on in
the transaction that ends a run, so a finished run is on disk before anyone is told.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from engine.models import WorkflowRun
from engine.repositories import driver, task_runs, types
from engine.sql import queries
from engine.worker import batching
from tests import engine_helpers

SETTING = "SELECT current_setting('synchronous_commit')"


@pytest.mark.django_db(transaction=True)
def test_run_prepared_without_flush_sets_it_for_its_own_transaction_only():
    assert driver.run_prepared([SETTING], {})[0] == [("on",)]
    assert driver.run_prepared([SETTING], {}, flush=False)[0] == [("off",)]
    # The next transaction of the connection has the configured value again (SET LOCAL).
    assert driver.run_prepared([SETTING], {})[0] == [("on",)]
    # Inside a caller's transaction the caller's commit decides: nothing is changed.
    with transaction.atomic():
        assert driver.run_prepared([SETTING], {}, flush=False)[0] == [("on",)]


def _running(run_id) -> list[tuple]:
    """(task_run_id, fencing_token) of the run's claimed generations."""
    from engine.models import TaskRun

    return list(TaskRun.objects.unscoped().filter(workflow_run_id=run_id, state="running")
                .order_by("task__key").values_list("id", "fencing_token"))


def _started(org, make_workflow, tasks):
    from engine.services import start_run

    wf = make_workflow(org, tasks)
    run = start_run(workflow=wf)
    task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="t")  # what the start's own claim left
    claimed = _running(run.pk)
    engine_helpers.start_attempts([types.StartRequest(i, token, "w") for i, token in claimed], lease_seconds=60)
    return run, claimed


def _succeed_and_read_setting(generation) -> str:
    task_run_id, token = generation
    params = {"ids": [task_run_id], "tokens": [token], "outputs": ["{}"]}
    out = driver.run_prepared([queries["task_run_succeed_many"], queries["run_finish_if_done_many"], SETTING],
                              params, flush=False)
    return out[-1][0][0]


@pytest.mark.django_db(transaction=True)
def test_the_success_that_ends_a_run_turns_the_flush_back_on(org, make_workflow):
    run, (a,) = _started(org, make_workflow, [{"key": "a", "type": "noop"}])
    assert _succeed_and_read_setting(a) == "on"
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_success_that_leaves_its_run_open_commits_without_the_flush(org, make_workflow):
    run, claimed = _started(org, make_workflow, [{"key": "a", "type": "noop"}, {"key": "b", "type": "noop"}])
    assert len(claimed) == 2
    assert _succeed_and_read_setting(claimed[0]) == "off"
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "running"
    assert _succeed_and_read_setting(claimed[1]) == "on"
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_claim_and_a_workers_batches_ask_for_no_flush(org, make_workflow, monkeypatch, settings):
    """The scheduler's claim and a worker's batches of starts and successes go without the flush."""
    settings.FLOWFORGE_CLAIM_ON_START = False
    flushes: list[bool] = []
    real = driver.run_prepared

    def spy(statements, params, *, flush=True):
        flushes.append(flush)
        return real(statements, params, flush=flush)

    monkeypatch.setattr(task_runs, "run_prepared", spy)
    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    run = start_run(workflow=wf)
    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="t")
    assert flushes == [False]
    (started,) = batching.record_batch([batching.Start(types.StartRequest(a.task_run_id, a.fencing_token, "w"))],
                                       claim=False)
    assert started is not None
    ((result, _next),) = batching.record_batch([batching.Success(
        types.SuccessRequest(a.task_run_id, a.fencing_token, {}, False), run.pk, False)], claim=False)
    assert result.accepted and result.run_state == "succeeded"
    assert flushes == [False, False, False]


@pytest.mark.django_db(transaction=True)
def test_with_the_setting_on_the_hot_transactions_wait_for_the_flush(org, make_workflow, monkeypatch, settings):
    settings.FLOWFORGE_CLAIM_ON_START = False
    settings.FLOWFORGE_HOT_PATH_WAL_FLUSH = True
    flushes: list[bool] = []
    real = driver.run_prepared

    def spy(statements, params, *, flush=True):
        flushes.append(flush)
        return real(statements, params, flush=flush)

    monkeypatch.setattr(task_runs, "run_prepared", spy)
    from engine.services import start_run

    wf = make_workflow(org, [{"key": "a", "type": "noop"}])
    start_run(workflow=wf)
    (a,) = task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="t")
    (started,) = batching.record_batch([batching.Start(types.StartRequest(a.task_run_id, a.fencing_token, "w"))],
                                       claim=False)
    assert started is not None and flushes == [True, True]
