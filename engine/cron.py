"""Firing cron triggers: the clock's ``fire_triggers`` tick.

Each scheduled instant fires at most once, whatever the number of clocks and workers:
the trigger row is locked with SKIP LOCKED while it is processed, and every firing
inserts a TriggerFiring with a unique (trigger, scheduled_for) in the transaction
that starts its run, so a race loses at the constraint and starts nothing.

After downtime the trigger's catch-up policy decides what happens to the instants
that were missed (older than GRACE_SECONDS): ``skip`` fires none of them (only an
instant that is on time fires), ``latest`` fires the most recent one once, ``all``
fires each of them, oldest first, at most MAX_CATCH_UP.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from engine import sql
from engine.models import (
    CatchUpPolicy,
    ScheduledTrigger,
    TriggerFiring,
    TriggerSource,
    Workflow,
    WorkflowState,
)
from engine.services import WorkflowNotStartable, start_run
from engine.triggers import next_instant
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded

log = logging.getLogger(__name__)

# An instant at most this many seconds old is on time, not missed.
GRACE_SECONDS = 60
# The most missed instants the "all" policy fires at once.
MAX_CATCH_UP = 100


def due_instants(trigger: ScheduledTrigger, now: dt.datetime) -> list[dt.datetime]:
    """Every instant of the trigger from its next_fire_at up to ``now``, oldest first
    (the last MAX_CATCH_UP + 1 of them when more are due)."""
    out: list[dt.datetime] = []
    cursor = trigger.next_fire_at
    while cursor is not None and cursor <= now:
        out.append(cursor)
        if len(out) > 10 * MAX_CATCH_UP:
            out = out[-(MAX_CATCH_UP + 1):]
        cursor = next_instant(trigger.cron_expression, trigger.timezone, cursor)
    return out[-(MAX_CATCH_UP + 1):]


def choose(instants: list[dt.datetime], policy: str, now: dt.datetime) -> list[dt.datetime]:
    """The instants to fire under ``policy`` (see the module docstring)."""
    if not instants:
        return []
    on_time = [i for i in instants if (now - i).total_seconds() <= GRACE_SECONDS]
    if policy == CatchUpPolicy.ALL:
        return instants[-MAX_CATCH_UP:]
    if policy == CatchUpPolicy.LATEST:
        return [instants[-1]]
    return on_time[-1:]  # skip: only what is on time


def _fire(trigger: ScheduledTrigger, instant: dt.datetime) -> str:
    """Fire one instant: claim it (unique firing row) and start the run, in one transaction.
    Returns "started", "duplicate" (another clock fired it), or "failed"."""
    org = trigger.organization
    try:
        with transaction.atomic():
            firing = TriggerFiring.objects.create(organization=org, trigger=trigger, scheduled_for=instant)
    except IntegrityError:
        return "duplicate"
    workflow = (
        Workflow.objects.for_organization(org)
        .filter(name=trigger.workflow_name, state=WorkflowState.ACTIVE)
        .order_by("-version")
        .first()
    )
    try:
        if workflow is None:
            raise WorkflowNotStartable(f"no active version of workflow {trigger.workflow_name!r}")
        with transaction.atomic():
            run = start_run(
                workflow=workflow, run_input=trigger.input,
                actor=Actor(organization=org, role="owner", channel="cron"),
                trigger_source=TriggerSource.CRON, trigger=trigger,
                audit_metadata={"trigger": trigger.name, "scheduled_for": instant.isoformat()},
                priority=trigger.priority,
            )
            TriggerFiring.objects.for_organization(org).filter(pk=firing.pk).update(workflow_run=run)
        return "started"
    # A quota refusal (runs per minute) is a firing error like the others: recorded on the
    # firing, the instant not retried (catch-up policies decide about missed instants).
    except (WorkflowNotStartable, ValueError, QuotaExceeded) as exc:
        TriggerFiring.objects.for_organization(org).filter(pk=firing.pk).update(outcome="failed", detail=str(exc)[:2000])
        log.warning("trigger %s (%s) could not start a run for %s: %s", trigger.name, trigger.pk, instant, exc)
        return "failed"


def process_trigger(trigger_id: uuid.UUID, now: dt.datetime) -> int:
    """Fire what is due for one trigger and move its next_fire_at past ``now``.
    Returns how many runs were started. Safe to run concurrently (row lock + unique firings)."""
    with transaction.atomic():
        trigger = (
            ScheduledTrigger.objects.unscoped()
            .select_for_update(skip_locked=True)
            .select_related("organization")
            .filter(pk=trigger_id, enabled=True, next_fire_at__lte=now)
            .first()
        )
        if trigger is None:
            return 0
        instants = due_instants(trigger, now)
        started = 0
        for instant in choose(instants, trigger.catch_up, now):
            if _fire(trigger, instant) == "started":
                started += 1
        missed = len(instants) - len(choose(instants, trigger.catch_up, now))
        if missed:
            log.info("trigger %s: %d missed instant(s) not fired (catch_up=%s)", trigger.name, missed, trigger.catch_up)
        trigger.next_fire_at = next_instant(trigger.cron_expression, trigger.timezone, max(now, instants[-1]))
        if instants:
            trigger.last_fired_at = instants[-1]
        trigger.save(update_fields=["next_fire_at", "last_fired_at"])
    return started


def fire_due_triggers(*, now: dt.datetime | None = None, limit: int = 500) -> int:
    """Fire every enabled trigger that is due (``idx_trigger_due``). Returns runs started."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(sql.queries["trigger_list_due"], {"now": now, "limit": limit})
        ids = [r[0] for r in cur.fetchall()]
    return sum(process_trigger(tid, now) for tid in ids)
