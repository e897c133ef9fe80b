"""The lease reaper: take back running task runs whose lease expired."""

from __future__ import annotations

import logging

from django.conf import settings

from engine import metrics
from engine.db import atomic_retry
from engine.repositories import transitions
from engine.scheduler import process_owner, publish_dispatches

log = logging.getLogger(__name__)


def reap_once(*, limit: int = 500) -> int:
    """Expire every lease that ran out (``idx_taskrun_lease_expiry``), each in its own
    transaction so one run's advance never waits for another's. Returns how many
    leases were taken back."""
    owner = process_owner("reaper")
    reaped = 0
    for task_run_id, token in transitions.expired_leases(limit=limit):
        result = atomic_retry(
            lambda tr=task_run_id, tok=token: transitions.expire_lease(
                task_run_id=tr, fencing_token=tok, lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
                owner=owner
            )
        )
        if result.accepted:
            reaped += 1
            metrics.incr("flowforge_lease_reaps_total", {"ready": "requeued", "failed": "failed"}.get(result.state or "", "other"))
            if result.run_state is not None:
                metrics.incr("flowforge_runs_finished_total", result.run_state)
            log.info("reaped lease of task run %s generation %s -> %s", task_run_id, token, result.state)
            publish_dispatches(result.dispatches)
    return reaped
