"""Dramatiq actors: the scheduler, relay, reaper, cron triggers and their backfills, and task
execution.

Each is safe to run in many copies at once (SKIP LOCKED, unique constraints and
conditional UPDATEs). They are woken by nudges sent on commit by the code that
created the work, and periodically by the clock (``manage.py run_clock``).

The top of the engine: nothing in it imports this module. Messages for these actors
are built by name in ``engine.dispatch``, whose ``ACTOR_QUEUES`` names the queue each
is declared on here. The actors are declared on the broker ``flowforge.broker.setup()``
built (the engine app's ``ready()`` runs it; the call below only makes the order
explicit, it returns the same broker).
"""

from __future__ import annotations

import dramatiq
from django.conf import settings

from audit import retention as audit_retention
from engine import backfill, live, notifier, partitions, retention, services
from engine.cron import fire_due_triggers
from engine.reaper import reap_once
from engine.relay import relay_pending
from engine.scheduler import note_waiting_if_due, schedule_once
from engine.states import (
    CONTROL_QUEUE,
    NOTIFY_QUEUE,
    TASK_BULK_PRIORITY,
    TASK_FIRST_PRIORITY,
    TASK_QUEUE,
)
from engine.sweeper import sweep_runs as sweep
from engine.worker.execute import execute, execute_many
from flowforge.broker import setup as setup_broker
from tenancy.services import purge_stale_invitations

setup_broker()

# A task attempt is bounded by its own timeout and lease, not by Dramatiq's time limit.
EXECUTE_TIME_LIMIT_MS = 7 * 24 * 3600 * 1000


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def schedule_tick() -> None:
    """Claim ready task runs and publish their dispatches; then, at most once a second,
    record why the ones left ready wait."""
    schedule_once()
    note_waiting_if_due()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def relay_outbox() -> None:
    """Drain the outbox: publish every deliverable row."""
    relay_pending()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def reap_leases() -> None:
    """Take back expired leases, then claim: what the reaped generations held (room,
    permits) goes to the task runs waiting for it now, not at the next schedule tick."""
    if reap_once():
        schedule_once()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def fire_triggers() -> None:
    """Fire due cron triggers (each scheduled instant at most once)."""
    fire_due_triggers()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def advance_backfills() -> None:
    """Let the cron triggers' backfills go on (each for a batch of instants, in turn);
    sends itself again while one has more it could do now (a long backfill is not paced
    by the clock's period)."""
    if backfill.advance_backfills().more:
        advance_backfills.send()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def sweep_runs() -> None:
    """Close runs whose task runs all finished and fail runs past their timeout."""
    sweep()


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=300_000)
def housekeeping() -> None:
    """Periodic clean-up: expired idempotency keys, rate-limit buckets of past windows,
    workers not seen for a week, the secret values kept for worker task generations no
    longer running, abandoned live subscriptions, history partitions (created ahead, dropped
    when expired: ``engine.partitions``), runs past their retention, audit rows past the audit
    retention (``audit.retention``: a bounded number per chain and pass), and invitations
    that expired unused or were revoked 30 days ago (``tenancy.services``)."""
    services.purge_expired_idempotency_keys()
    services.purge_old_rate_limit_buckets()
    services.purge_forgotten_workers()
    services.purge_finished_attempt_secrets()
    live.purge_expired()
    partitions.ensure_ahead()  # first: an insert with no partition for it fails
    retention.purge()  # then drops the history partitions that expired
    audit_retention.purge()
    purge_stale_invitations()


# Dramatiq priority (lower runs first among the messages a worker has fetched): the
# control actors at 0, the execute messages after them, so a claim (schedule_tick) never
# waits behind the task messages a worker has already fetched; and a first-lane message
# (an organization's first few generations waiting, engine.states.TASK_FIRST_QUEUE) before
# the bulk ones a worker has already fetched, as it goes before them in the broker's queue.
FIRST_PRIORITY = TASK_FIRST_PRIORITY
BULK_PRIORITY = TASK_BULK_PRIORITY


@dramatiq.actor(queue_name=TASK_QUEUE, max_retries=0, time_limit=EXECUTE_TIME_LIMIT_MS, priority=BULK_PRIORITY)
def execute_task_run(task_run_id: str, fencing_token: int) -> None:
    """Run one generation of one task run (see ``engine.worker.execute.execute``)."""
    execute(task_run_id, fencing_token, continue_inline=True)


@dramatiq.actor(queue_name=TASK_QUEUE, max_retries=0, time_limit=EXECUTE_TIME_LIMIT_MS, priority=FIRST_PRIORITY)
def execute_task_run_first(task_run_id: str, fencing_token: int) -> None:
    """``execute_task_run`` for a first-lane generation: the same run of it, ahead of the
    bulk messages a worker process has already fetched (FIRST_PRIORITY), its start in a
    transaction of its own (``alone``: not behind another organization's batch)."""
    execute(task_run_id, fencing_token, continue_inline=True, alone=True)


@dramatiq.actor(queue_name=TASK_QUEUE, max_retries=0, time_limit=EXECUTE_TIME_LIMIT_MS, priority=BULK_PRIORITY)
def execute_task_runs(dispatches: list[list]) -> None:
    """Run several generations, [[task_run_id, fencing_token], ...], in turn (a message of
    a claim burst: ``engine.relay.group_rows``; see ``engine.worker.execute.execute_many``)."""
    execute_many([(task_run_id, int(token)) for task_run_id, token in dispatches])


# After the task messages a worker has fetched: a notification waits behind a task, never the reverse.
NOTIFY_PRIORITY = 20


@dramatiq.actor(queue_name=CONTROL_QUEUE, max_retries=0, time_limit=60_000)
def notify_tick() -> None:
    """Take back lost claims of notification deliveries, claim the due ones within the
    in-flight caps and send each to ``deliver_notification`` (engine.notifier.tick)."""
    notifier.tick()


@dramatiq.actor(queue_name=NOTIFY_QUEUE, max_retries=0, priority=NOTIFY_PRIORITY,
                time_limit=int(settings.FLOWFORGE_NOTIFY_ATTEMPT_SECONDS * 1000))
def deliver_notification(delivery_id: str, claim_token: int) -> None:
    """One attempt of a claimed notification delivery (a webhook POST or a failure email),
    stopped after FLOWFORGE_NOTIFY_ATTEMPT_SECONDS (engine.notifier.deliver)."""
    notifier.deliver(delivery_id, int(claim_token))
