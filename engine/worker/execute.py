"""Executing one message: start, heartbeat, handler, output, completion, continuation.

``execute`` runs one generation (the ``execute_task_run`` actor); ``execute_many`` runs
the generations of one ``execute_task_runs`` message in turn. An attempt::

    message (task_run_id, fencing_token)          or a continuation (+ its outbox_id)
      │
      ▼
    completer.start ──── stale token / redelivery / duplicate ──▶ "ignored"
      │  (batched with the process's other starts and successes;  (an event records it)
      │   a continuation's start stamps its outbox row)
      ▼
    condition (if any) ── false ──▶ "skipped" (task_runs.skip_for_condition); an error ──▶
      │                  "failed" for good (conditions.evaluate: bounded steps and time)
      ▼
    heartbeat.register ── every beat extends the lease; a lease that could not be
      │                   extended sets context.lost (context.lease_lost)
      ▼
    secret_refs.resolve ── the config's {{ secrets.NAME }} replaced by their values (a
      │                    secret deleted since: SecretUnavailable, the task fails for good)
      ▼
    handler.run(context) ──▶ secret_refs.redact ──▶ output.encode_output (size and JSON
      │                      checks; over the row's cap, offload.offload_output keeps it in
      │                      the offload storage) / error_text: no value used reaches the completion,
      │                      its events or a log line (logs.redacting)
      │  inside attempt_log.capturing: the handler's logging records, stdout and stderr
      │  (and the http task's request summary) are the attempt's lines, redacted and
      │  capped; log_shipper writes them while it runs (FLOWFORGE_TASK_LOG_FLUSH_SECONDS).
      │  A failure of the handler's own also keeps its traceback (output.traceback_text:
      │  the organization's frames only, no platform frame nor server path).
      ▼
    heartbeat.unregister, log_shipper.finish (the lines not written yet: no statement for
      │                                       an attempt that wrote none)
      ├─ failed and lease lost ──▶ "abandoned" (the reaper or the cancellation owns the outcome)
      ▼
    completer.complete(Success | Failure)
      │  Success, no dependents, batch in flight ──▶ "succeeded" (write-behind: next batch)
      │  Success with dependents: waits; claims them, publishes all but one
      │  Failure: own transaction; a retry sends a delayed schedule_tick (dispatch.nudge_scheduler) ──▶ "retrying"
      │  completion lost to a newer generation or a cancellation ──▶ "rejected"
      ▼
    "succeeded" / "failed" ── a dependent kept back for this thread (continue_inline,
                              up to FLOWFORGE_INLINE_CONTINUATIONS hops) is run next,
                              with no broker message: back to completer.start

Hand-off (``execute_many``): while the thread is busy with one generation of a
several-generation message, ``handoff.HandOff`` sends the ones not yet started back to
the broker once FLOWFORGE_GROUP_HANDOFF_SECONDS have passed. A redelivered message (this
process died before the ack) starts only the generations that had not started: fencing.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid

from django.conf import settings

from engine import attempt_log, conditions, metrics, offload, secret_refs
from engine.db import atomic_retry
from engine.dispatch import nudge_scheduler, process_owner
from engine.handlers import PermanentTaskError, TaskContext, get_handler
from engine.repositories import task_runs, types
from engine.states import TASK_BULK_PRIORITY
from engine.worker import log_shipper
from engine.worker.batching import (
    BatchCompleter,
    Completer,
    Failure,
    Start,
    Success,
    count_completion,
    record_batch,
)
from engine.worker.handoff import Group, hand_off_watchdog, yield_rest
from engine.worker.heartbeat import heartbeater
from engine.worker.output import encode_output, error_text, traceback_text
from flowforge import logs
from flowforge.dramatiq_middleware import urgent_message_waiting
from flowforge.jsonb import stored_bytes

log = logging.getLogger(__name__)

# This process's completer. One batch in flight per worker process, its threads' starts and
# successes together: measured against one combiner for each (2 x 8 threads, 2,000
# independent tasks, 6 runs each), 0.19 against 0.16 of raw Dramatiq's throughput on average.
completer: Completer = BatchCompleter()


def _start_alone(request: types.StartRequest) -> types.StartedAttempt | None:
    """Start a delivered generation in a transaction of its own (``execute``'s ``alone``;
    ``Completer.start``'s result), then ask the process's refiller, as a batch that did
    not claim does, to claim what the start made room for in its organization."""
    started = record_batch([Start(request)], claim=False)[0]
    refiller = getattr(completer, "refiller", None)
    if refiller is not None:
        refiller.request([request.task_run_id])
    return started


def execute(task_run_id: str | uuid.UUID, fencing_token: int, *, continue_inline: bool = False,
            alone: bool = False) -> str:
    """Run generation ``fencing_token`` of a task run to completion in this thread (see
    ``_execute``) and return its outcome. The ids it binds to log lines are reset when
    it returns, so nothing of this attempt is ambient in the thread's next message.

    With ``continue_inline`` (the execute actor), when the success claims dependents,
    this thread then runs one of them itself, and so on down a chain, up to
    FLOWFORGE_INLINE_CONTINUATIONS hops per message: a hop then costs the completion's
    commit and the next start, not a broker round trip and a consumer's poll. The
    others are published as usual. A continued generation is started, fenced and
    completed exactly as one that came through the broker.

    With ``alone`` (a first-lane message), its start is its own transaction, not a place
    in the process's next batch: a batch holds the rows of other organizations' runs
    (each batch bumps their runs' event counters), and under one organization's burst
    the start of another's first task would wait for that run's row lock behind the
    burst's own transactions.
    """
    hops_left = settings.FLOWFORGE_INLINE_CONTINUATIONS if continue_inline else 0
    with logs.bound(task_run_id=task_run_id, fencing_token=fencing_token):
        outcome, following = _execute(task_run_id, fencing_token, may_continue=hops_left > 0, alone=alone)
    while following is not None:
        hops_left -= 1
        with logs.bound(task_run_id=following.task_run_id, fencing_token=following.fencing_token,
                        continued=True):
            _, following = _execute(following.task_run_id, following.fencing_token, may_continue=hops_left > 0,
                                    outbox_id=following.outbox_id)
    return outcome


def execute_many(dispatches: list[tuple[str, int]]) -> list[str]:
    """Run the generations of one ``execute_task_runs`` message, [(task_run_id,
    fencing_token), ...], one after the other in this thread, each as ``execute`` with
    ``continue_inline`` would; returns the outcome of each one run here.

    Once FLOWFORGE_GROUP_HANDOFF_SECONDS have passed since the first began, the ones not
    yet started are handed back to the broker (``HandOff``, while this thread is still
    busy with its current one), one ``execute_task_run`` message each, for other threads
    to take: a slow task holds the rest of its message up for about that long at most.
    Each is fenced as usual, so a redelivery of the message (this process died) starts
    only the ones that did not start.

    Between two generations, when this process has fetched a more urgent message than a
    bulk one (``urgent_message_waiting``: another organization's first-lane generation, a
    control actor) that waits for a thread, the rest is handed back at once
    (``handoff.yield_rest``) and this thread returns to take it."""
    group = Group(dispatches)
    watchdog = hand_off_watchdog()
    watchdog.register(group)
    outcomes: list[str] = []
    try:
        while (pair := group.take_next()) is not None:
            outcomes.append(execute(pair[0], pair[1], continue_inline=True))
            if group.pending and urgent_message_waiting(TASK_BULK_PRIORITY):
                try:
                    yield_rest(group)
                except Exception:  # noqa: BLE001 - the rest stays with this thread, as before
                    log.warning("could not hand the rest of a message back for a more urgent one; running it here",
                                exc_info=True)
    finally:
        watchdog.unregister(group)
    return outcomes


def _gate(started: types.StartedAttempt) -> str | None:
    """Evaluate the started attempt's condition (engine.conditions: bounded in steps, time
    and memory) before its handler. Returns None when it is true (run the handler), else
    the outcome recorded: "skipped" (false: ``task_runs.skip_for_condition``; its
    dependents settled by their trigger rules), "failed" (it could not be evaluated: the
    attempt fails for good, the error naming the condition) or "rejected" (the generation
    moved on meanwhile)."""
    try:
        if conditions.evaluate(started.condition, run_input=started.run_input, upstream=started.upstream,
                               schedule=started.schedule):
            return None
    except conditions.ConditionFailed as exc:
        result, _ = completer.complete(Failure(started.task_run_id, started.fencing_token, str(exc), False))
        outcome = count_completion(result)
        if outcome != "rejected":
            _nudge_after_finish()
        return "rejected" if outcome == "rejected" else (result.state or "failed")
    result = atomic_retry(lambda: task_runs.skip_for_condition(task_run_id=started.task_run_id,
                                                             fencing_token=started.fencing_token),
                          connection_attempts=8)
    outcome = count_completion(result)
    if outcome == "rejected":
        return "rejected"
    log.info("task %s (run %s): condition false, skipped", started.task_key, started.workflow_run_id)
    _nudge_after_finish()
    return "skipped"


def _nudge_after_finish() -> None:
    """Nudge the scheduler after a finish other than a success: it freed a room and a
    permit, and its advance may have made dependents ready (a failure handler, a cleanup)
    that nothing claimed yet."""
    try:
        nudge_scheduler()
    except Exception:  # noqa: BLE001 - the clock's tick claims them anyway
        log.warning("could not nudge the scheduler after a finish; the clock's next tick claims")


def _execute(
    task_run_id: str | uuid.UUID, fencing_token: int, *, may_continue: bool = False,
    outbox_id: uuid.UUID | None = None, alone: bool = False,
) -> tuple[str, types.Dispatch | None]:
    """Run generation ``fencing_token`` of a task run to completion in this thread
    (``outbox_id``: its outbox row, when it is a continuation no message was sent for).

    Returns what happened: "ignored" (stale or duplicate message), "succeeded",
    "failed", "retrying", "abandoned" (the lease was lost and the handler stopped for it)
    or "rejected" (the completion lost to a newer generation or a cancellation); and,
    when ``may_continue`` and the success claimed dependents, the one this thread is to
    run next (already stamped as delivered), else None.
    """
    task_run_id = uuid.UUID(str(task_run_id))
    owner = f"{process_owner('worker')}:{threading.get_ident()}"
    # One round trip and one commit, shared with the process's other threads' starts and
    # successes; or, ``alone``, its own (``execute``).
    request = types.StartRequest(task_run_id, fencing_token, owner, outbox_id)
    started = _start_alone(request) if alone else completer.start(request)
    if started is None:
        return "ignored", None
    # Every log line of this attempt names its organization, run and attempt too.
    logs.bind(organization_id=started.organization_id, workflow_run_id=started.workflow_run_id,
              attempt=started.attempt)
    if started.dispatch_latency_seconds is not None:
        metrics.observe("flowforge_dispatch_latency_seconds", max(0.0, started.dispatch_latency_seconds))
    if started.condition:
        gated = _gate(started)
        if gated is not None:
            return gated, None
    context = TaskContext(
        task_run_id=started.task_run_id,
        workflow_run_id=started.workflow_run_id,
        organization_id=started.organization_id,
        task_key=started.task_key,
        attempt=started.attempt,
        max_attempts=started.max_attempts,
        fencing_token=started.fencing_token,
        timeout_seconds=started.timeout_seconds,
        config=started.config,
        input=started.run_input,
        upstream=started.upstream,
        schedule=started.schedule,
    )
    hb = heartbeater()
    hb.register(context)
    # What the handler logs and prints, kept with the attempt (engine.attempt_log); written
    # by the process's shipper, so an attempt that says nothing costs no statement.
    lines = log_shipper.shipper().open(
        organization_id=started.organization_id, workflow_run_id=started.workflow_run_id,
        task_run_id=started.task_run_id, attempt=started.attempt, fencing_token=started.fencing_token)
    succeeded = False
    retryable = True
    output_json = ""
    error = ""
    trace = ""
    in_handler = False
    began = time.monotonic()
    # The values of the secrets this attempt's config references: resolved here, at the
    # start, and redacted from everything it leaves behind before that is recorded.
    secret_values: list[str] = []
    redaction = None
    try:
        handler = get_handler(started.task_type)
        context.config, secret_values = secret_refs.resolve(started.organization_id, started.config)
        context.secret_values = secret_values
        redaction = secret_refs.redaction_pattern(secret_values)
        lines.redact_with(secret_values, redaction)
        with logs.redacting(redaction):
            with attempt_log.capturing(lines):
                in_handler = True
                result = handler.run(context)
                in_handler = False
            output_json = encode_output(secret_refs.redact(result, secret_values),
                                        limit_bytes=settings.FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES,
                                        setting="FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES")
            if stored_bytes(output_json) > settings.FLOWFORGE_MAX_OUTPUT_BYTES:
                # Over the row's cap as stored (numbers come back without their exponent):
                # the whole output goes to the offload storage, the row keeps a summary
                # (engine.offload).
                output_json = offload.offload_output(
                    organization_id=started.organization_id, workflow_run_id=started.workflow_run_id,
                    task_run_id=task_run_id, fencing_token=fencing_token, text=output_json)
        succeeded = True
    except Exception as exc:
        retryable = not isinstance(exc, PermanentTaskError)
        error = error_text(exc, redaction=redaction)
        if in_handler:  # the handler's own failure: its traceback is kept with the attempt
            trace = traceback_text(exc, values=secret_values, redaction=redaction,
                                   limit=settings.FLOWFORGE_TASK_TRACEBACK_MAX_CHARS)
        with logs.redacting(redaction):
            log.info(
                "task %s (run %s) attempt %s failed: %s",
                started.task_key, started.workflow_run_id, started.attempt, error,
                extra={"traceback": secret_refs.redact_text(traceback.format_exc(limit=5), redaction)},
            )
    finally:
        hb.unregister(context)
        context.config, context.secret_values = started.config, []  # the values leave with the attempt
        metrics.observe("flowforge_task_duration_seconds", time.monotonic() - began)
    # Before the completion: once the task run shows its outcome, its lines are all there.
    log_shipper.shipper().finish(lines)
    if not succeeded and context.lease_lost:
        # The lease was lost (timed out, reaped or cancelled) and the handler stopped for
        # it: the reaper, or the cancellation, owns this attempt's outcome and records
        # the right reason ("attempt timed out", "lease expired"); a completion here
        # would record the interruption instead.
        return "abandoned", None
    if succeeded:
        has_dependents = started.has_dependents
        # Without dependents there is nothing to continue with: may_continue must stay False,
        # or the batch's continuation pick could hand this thread another success's dependent.
        recorded = completer.complete(Success(
            types.SuccessRequest(task_run_id, fencing_token, None, has_dependents, output_json=output_json),
            started.workflow_run_id, may_continue and has_dependents,
        ))
        if recorded is None:  # written behind: counted and logged by the thread that records it
            return "succeeded", None
    else:
        recorded = completer.complete(Failure(task_run_id, fencing_token, error, retryable, trace))
    result, following = recorded
    if count_completion(result) == "rejected":
        return "rejected", None
    if result.retry_in_seconds is not None:
        nudge_scheduler(delay_ms=int(result.retry_in_seconds * 1000) + 20)
        return "retrying", following
    if not succeeded:
        # The failure freed this attempt's room and permit, and may have made dependents
        # ready (one_failed, all_done, ...): claimed now rather than at the next tick.
        _nudge_after_finish()
    return result.state or "unknown", following
