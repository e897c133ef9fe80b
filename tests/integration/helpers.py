"""Small helpers shared by the fault and dispatch integration tests: database reads,
worker-process lookup, and two writers that go through ``engine.repositories`` like the
engine does (a run created without the scheduler nudge, an in-process claim)."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

from django.db import transaction

from engine.models import OutboxMessage, TaskRun, TaskRunEvent, WorkflowRun
from engine.repositories import runs, task_runs
from flowforge.stack import Proc, wait_until, worker_child_pids


def task_runs_by_key(org, run) -> dict[str, TaskRun]:
    """The run's task runs keyed by task key (fresh from the database)."""
    return {
        tr.task.key: tr
        for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run).select_related("task")
    }


def events(org, *, run=None, task_run=None, kind: str | None = None):
    """Events of a run (or one task run) in ``seq`` order, optionally of one kind."""
    qs = TaskRunEvent.objects.for_organization(org)
    if run is not None:
        qs = qs.filter(workflow_run=run)
    if task_run is not None:
        qs = qs.filter(task_run=task_run)
    if kind is not None:
        qs = qs.filter(kind=kind)
    return list(qs.order_by("seq"))


def outbox_rows(org, task_run) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.for_organization(org).filter(task_run=task_run).order_by("created_at"))


def assert_gap_free(org, run) -> None:
    seqs = list(
        TaskRunEvent.objects.for_organization(org)
        .filter(workflow_run=run)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def owner_pid(lease_owner: str) -> int:
    """PID in a worker lease owner ``worker@host:PID:thread``."""
    role, _, rest = lease_owner.partition("@")
    assert role == "worker", lease_owner
    _host, pid, _thread = rest.rsplit(":", 2)
    return int(pid)


def wait_started(org, task_run_id: uuid.UUID, *, token: int | None = None, timeout: float = 20.0) -> TaskRun:
    """Wait until the task run's current generation (``token`` if given) has started
    on a worker; return the fresh row."""

    def started():
        tr = TaskRun.objects.for_organization(org).get(pk=task_run_id)
        ok = (
            tr.state == "running"
            and tr.started_fencing_token is not None
            and tr.started_fencing_token == tr.fencing_token
            and (token is None or tr.fencing_token == token)
            and (tr.lease_owner or "").startswith("worker@")
        )
        return tr if ok else None

    return wait_until(started, timeout=timeout, interval=0.05, what=f"task run {task_run_id} to start")


def worker_process_of(pid: int, workers: list[Proc]) -> Proc:
    """Which ``dramatiq`` command (master) forked the worker process ``pid``."""
    for proc in workers:
        if pid in worker_child_pids(proc.pid):
            return proc
    raise AssertionError(f"pid {pid} is not a child of any of {[(p.name, p.pid) for p in workers]}")


def wait_worker_children(workers: list[Proc], *, count: int = 1, timeout: float = 20.0) -> None:
    """Wait until each dramatiq master has forked ``count`` worker processes."""
    for proc in workers:
        wait_until(
            lambda p=proc: len(worker_child_pids(p.pid)) >= count,
            timeout=timeout,
            what=f"{proc.name} to fork its worker processes",
        )


def signal_pid(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)


def create_run_without_nudge(workflow, run_input: dict[str, Any] | None = None) -> WorkflowRun:
    """Create a run exactly like ``start_run`` but without the on-commit scheduler nudge,
    so nothing claims its ready task runs until the test says so."""
    with transaction.atomic():
        run_id = runs.create_with_task_runs(
            workflow_id=workflow.pk,
            organization_id=workflow.organization_id,
            run_input=run_input or {},
            trigger_source="cli",
        )
    return WorkflowRun.objects.for_organization(workflow.organization_id).get(pk=run_id)


def claim_in_process(task_run_id: uuid.UUID, *, lease_seconds: float, owner: str = "test"):
    """Claim one ready task run here (ready -> running, token + 1, one outbox row)."""
    with transaction.atomic():
        dispatches = task_runs.claim_ready_many(
            limit=1, lease_seconds=lease_seconds, owner=owner, task_run_ids=[task_run_id]
        )
    assert len(dispatches) == 1, dispatches
    return dispatches[0]


def wait_for_event(org, *, task_run, kind: str, timeout: float) -> TaskRunEvent:
    return wait_until(
        lambda: (events(org, task_run=task_run, kind=kind) or [None])[0],
        timeout=timeout,
        interval=0.1,
        what=f"a {kind!r} event of task run {task_run.pk}",
    )
