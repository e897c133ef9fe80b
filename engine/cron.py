"""Firing cron triggers: the clock's ``fire_triggers`` tick.

Each scheduled instant fires at most once, whatever the number of clocks and workers:
the trigger row is locked with SKIP LOCKED while it is processed, and every firing
inserts a TriggerFiring with a unique (trigger, scheduled_for) in the transaction
that starts its run, so a race loses at the constraint and starts nothing.

After downtime the trigger's catch-up policy decides what happens to the instants
that were missed (older than GRACE_SECONDS): ``skip`` fires none of them (only an
instant that is on time fires), ``latest`` fires the most recent one once, ``all``
fires each of them, oldest first, at most MAX_CATCH_UP (the most recent ones). Instants
left unfired are never dropped silently: the trigger's ``missed_instants`` says how
many, which (the first and the last) and why, an audit record
``trigger.instants_missed`` and a warning in the clock's log say it too, and a backfill
(engine.backfill) can fire them later.

Each run is started with its instant and data interval (``engine.states.RunSchedule``:
the run's scheduled_for, data_interval_start, data_interval_end; the handler's
``context.schedule``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit import services as audit
from engine import sql
from engine.models import (
    CatchUpPolicy,
    ScheduledTrigger,
    TriggerFiring,
    TriggerSource,
    Workflow,
    WorkflowRun,
    WorkflowState,
)
from engine.services import WorkflowNotStartable, start_run
from engine.states import RunSchedule
from engine.triggers import next_instant, run_schedule
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded

log = logging.getLogger(__name__)

# An instant at most this many seconds old is on time, not missed.
GRACE_SECONDS = 60
# The most missed instants the "all" policy fires at once.
MAX_CATCH_UP = 100


@dataclasses.dataclass(frozen=True)
class Due:
    """The instants of a trigger due at a tick: ``instants``, the most recent
    MAX_CATCH_UP + 1 of them, oldest first; ``total``, how many were due; ``first``, the
    oldest (None when none was)."""

    instants: list[dt.datetime]
    total: int
    first: dt.datetime | None


def due_instants(trigger: ScheduledTrigger, now: dt.datetime) -> Due:
    """Every instant of the trigger from its next_fire_at up to ``now``: counted, the
    oldest kept, and the last MAX_CATCH_UP + 1 of them listed oldest first."""
    out: list[dt.datetime] = []
    total, first = 0, None
    cursor = trigger.next_fire_at
    while cursor is not None and cursor <= now:
        out.append(cursor)
        total += 1
        first = first or cursor
        if len(out) > 10 * MAX_CATCH_UP:
            out = out[-(MAX_CATCH_UP + 1):]
        cursor = next_instant(trigger.cron_expression, trigger.timezone, cursor)
    return Due(instants=out[-(MAX_CATCH_UP + 1):], total=total, first=first)


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


def start_for_instant(trigger: ScheduledTrigger, schedule: RunSchedule, *, source: str = TriggerSource.CRON,
                      priority: int | None = None, triggered_by=None,
                      audit_metadata: dict[str, Any] | None = None) -> WorkflowRun:
    """Start a run of the latest active version of the trigger's workflow, with the
    trigger's input, for ``schedule`` (its instant and data interval), through
    ``services.start_run`` (quotas, run limits, the fair claim), acting as the
    organization's system (channel ``cron``). ``priority`` defaults to the trigger's;
    ``triggered_by``: the person on whose behalf (a backfill's creator), else none.
    Call inside the caller's transaction; the caller claims the instant first.

    Raises WorkflowNotStartable when the workflow has no active version, and what
    start_run raises (ValueError/InvalidStart for an input it refuses, QuotaExceeded)."""
    org = trigger.organization
    workflow = (
        Workflow.objects.for_organization(org)
        .filter(name=trigger.workflow_name, state=WorkflowState.ACTIVE)
        .order_by("-version")
        .first()
    )
    if workflow is None:
        raise WorkflowNotStartable(f"no active version of workflow {trigger.workflow_name!r}")
    return start_run(
        workflow=workflow, run_input=trigger.input,
        actor=Actor(organization=org, role="owner", channel="cron"),
        trigger_source=source, trigger=trigger, triggered_by=triggered_by,
        audit_metadata={"trigger": trigger.name, "scheduled_for": schedule.as_dict()["scheduled_for"],
                        **(audit_metadata or {})},
        priority=trigger.priority if priority is None else priority,
        schedule=schedule,
    )


def _fire(trigger: ScheduledTrigger, instant: dt.datetime) -> str:
    """Fire one instant: claim it (unique firing row) and start the run, in one transaction.
    Returns "started", "duplicate" (another clock, or a backfill, fired it), or "failed"."""
    org = trigger.organization
    try:
        with transaction.atomic():
            firing = TriggerFiring.objects.create(organization=org, trigger=trigger, scheduled_for=instant)
    except IntegrityError:
        return "duplicate"
    try:
        with transaction.atomic():
            run = start_for_instant(trigger, run_schedule(trigger.cron_expression, trigger.timezone, instant))
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
        due = due_instants(trigger, now)
        instants = due.instants
        chosen = choose(instants, trigger.catch_up, now)
        started = 0
        for instant in chosen:
            if _fire(trigger, instant) == "started":
                started += 1
        update = ["next_fire_at", "last_fired_at"]
        if due.total > len(chosen):
            trigger.missed_instants = _record_missed(trigger, due, chosen, now)
            update.append("missed_instants")
        trigger.next_fire_at = next_instant(trigger.cron_expression, trigger.timezone, max(now, instants[-1]))
        if instants:
            trigger.last_fired_at = instants[-1]
        trigger.save(update_fields=update)
    return started


def missed_note(*, policy: str, due: Due, chosen: list[dt.datetime], now: dt.datetime) -> dict[str, Any]:
    """What the trigger shows (``missed_instants``) when a tick leaves due instants
    unfired: {"at", "policy", "reason", "due", "fired", "not_fired", "first_not_fired",
    "last_not_fired", "max_catch_up"} (instants in ISO 8601, UTC). ``reason`` is
    ``catch_up_bound`` when the ``all`` policy had more than MAX_CATCH_UP to fire (it
    fired the most recent ones), ``catch_up_policy`` when ``skip`` or ``latest`` left
    them by design. The unfired ones run from the first due instant to the one before
    the fired ones (those are always the most recent): a backfill of that range fires
    them."""
    # choose() always picks a suffix of the due instants: the one before it is the last not fired.
    last_not_fired = due.instants[-len(chosen) - 1]
    return {
        "at": now.isoformat(),
        "policy": policy,
        "reason": "catch_up_bound" if policy == CatchUpPolicy.ALL else "catch_up_policy",
        "due": due.total,
        "fired": len(chosen),
        "not_fired": due.total - len(chosen),
        "first_not_fired": due.first.isoformat() if due.first else None,
        "last_not_fired": last_not_fired.isoformat(),
        "max_catch_up": MAX_CATCH_UP,
    }


def _record_missed(trigger: ScheduledTrigger, due: Due, chosen: list[dt.datetime], now: dt.datetime) -> dict:
    """Say that due instants were left unfired: the note for the trigger (returned), an
    audit record ``trigger.instants_missed`` (the organization's system actor) and a
    warning in the clock's log. Runs in the tick's transaction, after the trigger's row
    lock (the order delete_trigger takes them in)."""
    note = missed_note(policy=trigger.catch_up, due=due, chosen=chosen, now=now)
    audit.record("trigger.instants_missed", actor=Actor.system(trigger.organization), target=trigger,
                 metadata={"name": trigger.name, **note})
    log.warning("trigger %s (%s): %d due instant(s) from %s to %s not fired (%s, catch_up=%s); a backfill of "
                "that range fires them", trigger.name, trigger.pk, note["not_fired"], note["first_not_fired"],
                note["last_not_fired"], note["reason"], trigger.catch_up)
    return note


def fire_due_triggers(*, now: dt.datetime | None = None, limit: int = 500) -> int:
    """Fire every enabled trigger that is due (``idx_trigger_due``). Returns runs started."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(sql.queries["trigger_list_due"], {"now": now, "limit": limit})
        ids = [r[0] for r in cur.fetchall()]
    return sum(process_trigger(tid, now) for tid in ids)
