"""The organizations' own workers (issue 18; the protocol is docs/workers.md): what the
worker API's calls do, above the repositories.

- ``poll``: claim and start up to N ready task runs of one queue of the caller's
  organization (``task_runs.claim_for_worker``: the fair claim's gates, no outbox), or wait
  for one: a long poll woken by the commit notification of a task run turning ready on
  that queue (``engine.queue_hub``), re-checking at the queue's next due time when a
  backoff or a limit holds its ready rows. Each task handed out carries its input with its
  secret references resolved.
- ``heartbeat``, ``append_logs``, ``complete``, ``fail``: each matched on the generation
  the worker holds (``WorkerGeneration.refusal``); a call of a worker that does not hold
  it raises WorkerCallRefused (409: cancelled, lease_expired, stale_fencing_token) and
  changes nothing, beyond the ``stale_completion_rejected`` event of a refused completion.
  A completion's output and a failure's error are redacted of the secret values the
  attempt's input resolved before they are stored.

Every call is scoped to the caller's organization: a task run of another organization,
or of the shared workers, is NotAWorkerTask (404), the same answer as no task run at all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from engine import conditions, metrics, queue_hub, secret_refs
from engine.attempt_log import cap_middle
from engine.db import atomic_retry
from engine.dispatch import INLINE_PUBLISH_RESERVATION_SECONDS, nudge_scheduler
from engine.relay import publish_dispatches
from engine.repositories import events, task_runs, worker_queues
from engine.repositories.types import StartedAttempt, SuccessRequest
from flowforge.crypto import DecryptionError
from tenancy import vault

log = logging.getLogger(__name__)

#: Longest long poll, in seconds (docs/workers.md: wait_seconds 0..30).
MAX_WAIT_SECONDS = 30
#: Most tasks one poll may ask for.
MAX_TASKS_PER_POLL = 100
#: Seconds between a waiting poll's re-checks of a queue whose ready rows a limit holds back
#: (no notification announces a permit coming free).
LIMITED_RECHECK_SECONDS = 1.0
#: Seconds a poll refused for capacity is asked to wait (Retry-After).
POLL_CAPACITY_RETRY_AFTER = 2


class NotAWorkerTask(LookupError):
    """No worker task run of the caller's organization has that id (a 404)."""


class WorkerCallRefused(Exception):
    """The caller does not hold the generation it names (a 409). ``code`` is one of
    ``cancelled``, ``lease_expired``, ``stale_fencing_token``; the message says why."""

    MESSAGES = {
        "cancelled": "the task run was cancelled (its run was cancelled or timed out); stop working on it",
        "lease_expired": "the lease of this generation expired before this call; it is no longer this worker's",
        "stale_fencing_token": "fencing token {token} is not the task run's current started generation "
                               "(it moved on to another generation, or has finished)",
    }

    def __init__(self, code: str, token: int, generation: worker_queues.WorkerGeneration | None = None):
        super().__init__(self.MESSAGES[code].format(token=token))
        self.code = code
        #: The task run as the refusal saw it (None when not read).
        self.generation = generation


class UnknownQueue(ValueError):
    """No task of the organization's workflows (any version) waits on the queue a poll
    names: a typo, or a worker started before its workflow was applied (a 400 naming
    ``queue``)."""


class PollCapacity(Exception):
    """This web process holds as many long polls as it may (FLOWFORGE_WORKER_POLLS_PER_PROCESS,
    at most half of them one organization's) and nothing was ready: a 503 with
    ``retry_after`` seconds."""

    retry_after = POLL_CAPACITY_RETRY_AFTER


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a polling worker says of itself (docs/workers.md, ``worker``)."""

    id: str
    name: str = ""
    host: str = ""
    sdk: str = ""
    concurrency: int | None = None


def lease_seconds() -> float:
    """FLOWFORGE_WORKER_LEASE_SECONDS: the lease of a task handed to a worker, renewed by
    its heartbeats (sent every third of it)."""
    return float(settings.FLOWFORGE_WORKER_LEASE_SECONDS)


def live_seconds() -> float:
    """FLOWFORGE_WORKER_LIVE_SECONDS: a worker seen polling within this many seconds (or
    holding a task whose lease is current) is live on the workers page, in the API and in
    the run page's warning."""
    return float(settings.FLOWFORGE_WORKER_LIVE_SECONDS)


def attach_live_workers(task_runs: Iterable[Any], *, organization_id: uuid.UUID) -> None:
    """Set ``queue_live_workers`` on each of ``task_runs`` (TaskRuns, or anything with
    ``state`` and ``queue``): for a ready task run of a worker queue, the live workers of
    its queue (``worker_queues.live_workers``; 0: no worker will take it until one polls);
    None for every other. One statement, none when no such task run is ready."""
    rows = list(task_runs)
    waiting = {tr.queue for tr in rows if tr.state == "ready" and tr.queue}
    live = worker_queues.live_workers(organization_id=organization_id, queues=sorted(waiting),
                                      live_within_seconds=live_seconds())
    for tr in rows:
        tr.queue_live_workers = live.get(tr.queue, 0) if tr.state == "ready" and tr.queue else None


# --- Held long polls, per process -------------------------------------------------------------

_held_lock = threading.Lock()
_polls_held: dict[uuid.UUID, int] = {}


def _take_poll_slot(organization_id: uuid.UUID) -> bool:
    """Count one more held long poll of the organization in this process; False (nothing
    counted) when the process holds FLOWFORGE_WORKER_POLLS_PER_PROCESS, or the organization
    half of them (so one organization cannot hold every slot)."""
    total = int(settings.FLOWFORGE_WORKER_POLLS_PER_PROCESS)
    with _held_lock:
        if sum(_polls_held.values()) >= total or _polls_held.get(organization_id, 0) >= max(1, math.ceil(total / 2)):
            return False
        _polls_held[organization_id] = _polls_held.get(organization_id, 0) + 1
        return True


def _give_poll_slot(organization_id: uuid.UUID) -> None:
    with _held_lock:
        n = _polls_held.get(organization_id, 0) - 1
        if n > 0:
            _polls_held[organization_id] = n
        else:
            _polls_held.pop(organization_id, None)


# --- Poll ---------------------------------------------------------------------------------------

#: (organization, queue) pairs this process has seen known: task rows are never deleted but
#: with their organization, so a known queue stays known. Bounded: cleared when full.
_known_queues: set[tuple[uuid.UUID, str]] = set()
_KNOWN_QUEUES_MAX = 10_000


def _require_known_queue(organization_id: uuid.UUID, queue: str) -> None:
    """Raise UnknownQueue unless a task of the organization waits on ``queue``."""
    if (organization_id, queue) in _known_queues:
        return
    if not worker_queues.queue_known(organization_id=organization_id, queue=queue):
        raise UnknownQueue(
            f"no task of this organization's workflows waits on queue {queue!r}: check the name, or apply a "
            "workflow with a worker task on it (config.queue) before starting its workers")
    if len(_known_queues) >= _KNOWN_QUEUES_MAX:
        _known_queues.clear()
    _known_queues.add((organization_id, queue))


def _resolve_input(organization_id: uuid.UUID, value: Any) -> tuple[Any, list[str]]:
    """The task's input with its secret references (``{{ secrets.NAME }}``) resolved, and
    the values used (``engine.secret_refs.resolve``, its field paths under config.input).
    Raises SecretUnavailable when a referenced secret is gone."""
    resolved, values = secret_refs.resolve(organization_id, {"input": value})
    return resolved["input"], values


#: Seconds one poll may spend evaluating the conditions of the tasks it claimed, all
#: together (each one at most conditions.CONDITION_TIME_LIMIT_SECONDS): a poll runs in a web
#: process, and one organization's slow conditions must not hold its thread for long. Once
#: spent, the poll's remaining conditions get no time and their tasks fail saying so.
MAX_CONDITION_SECONDS_PER_POLL = 2.0


def _condition_holds(a: StartedAttempt, *, time_left: float) -> bool:
    """Whether attempt ``a``'s condition (engine.conditions, evaluated here, before the
    hand-out, as a shared worker does before its handler, within ``time_left`` seconds)
    lets it run. False: the task run was skipped (condition false, its dependents settled)
    or failed for good (the condition could not be evaluated), and the scheduler nudged
    for what that made ready."""
    try:
        if conditions.evaluate(a.condition, run_input=a.run_input, upstream=a.upstream, schedule=a.schedule,
                               time_limit_seconds=time_left):
            return True
        result = atomic_retry(lambda: task_runs.skip_for_condition(task_run_id=a.task_run_id,
                                                                 fencing_token=a.fencing_token),
                              connection_attempts=2)
    except conditions.ConditionFailed as exc:
        error = str(exc)
        result = atomic_retry(lambda: task_runs.fail_attempt(
            task_run_id=a.task_run_id, fencing_token=a.fencing_token, error=error, retryable=False),
            connection_attempts=2)
    if result.accepted:
        metrics.incr("flowforge_task_attempts_total", result.state or "skipped")
        nudge_scheduler()
    return False


def _payloads(attempts: list[StartedAttempt]) -> list[dict[str, Any]]:
    """Started attempts as the poll's answer shows them (docs/workers.md). An attempt whose
    input references a secret that is gone is failed at once, not retried (its message
    names the secret, never a value), and left out of the answer, as is one whose
    condition is false (skipped) or cannot be evaluated (failed)."""
    names = worker_queues.workflow_names([a.workflow_run_id for a in attempts])
    out = []
    conditions_until = time.monotonic() + MAX_CONDITION_SECONDS_PER_POLL
    for a in attempts:
        if a.condition and not _condition_holds(a, time_left=conditions_until - time.monotonic()):
            continue
        try:
            task_input, values = _resolve_input(a.organization_id, a.config.get("input") or {})
            if values:
                _keep_handed_values(a, values)
        except secret_refs.SecretUnavailable as exc:
            result = atomic_retry(lambda a=a, exc=exc: task_runs.fail_attempt(
                task_run_id=a.task_run_id, fencing_token=a.fencing_token, error=str(exc), retryable=False),
                connection_attempts=2)
            publish_dispatches(list(result.dispatches))
            continue
        out.append(_payload(a, names.get(a.workflow_run_id, ""), task_input))
    return out


def _handout_name(task_run_id: uuid.UUID, fencing_token: int) -> str:
    """What the handed-out values are encrypted bound to (tenancy.vault's ``name``): the
    generation, so a row cannot be read as another's."""
    return f"attempt:{task_run_id}:{fencing_token}"


def _keep_handed_values(a: StartedAttempt, values: list[str]) -> None:
    """Keep, encrypted, the secret values handed to generation ``a`` (core_attemptsecrets):
    its log lines, output and error are redacted of them even if a secret is rotated or
    deleted while the worker holds it."""
    sealed = vault.encrypt(a.organization_id, _handout_name(a.task_run_id, a.fencing_token), json.dumps(values))
    worker_queues.put_attempt_secrets(organization_id=a.organization_id, task_run_id=a.task_run_id,
                                      fencing_token=a.fencing_token, values_encrypted=sealed)


def _payload(a: StartedAttempt, workflow: str, task_input: Any) -> dict[str, Any]:
    """A started attempt as the poll's answer shows it (docs/workers.md), with its input
    resolved (``task_input``)."""
    lease = min(lease_seconds(), a.timeout_seconds) if a.timeout_seconds else lease_seconds()
    return {
        "task_run_id": str(a.task_run_id),
        "fencing_token": a.fencing_token,
        "attempt": a.attempt,
        "max_attempts": a.max_attempts,
        "workflow_run_id": str(a.workflow_run_id),
        "workflow": workflow,
        "task_key": a.task_key,
        "name": a.config.get("name") or a.task_key,
        "queue": a.config.get("queue"),
        "input": task_input,
        "run_input": a.run_input,
        "upstream": a.upstream,
        # A cron run's instant and data interval (ISO 8601, UTC); null for other runs.
        "schedule": a.schedule.as_dict() if a.schedule is not None else None,
        "timeout_seconds": a.timeout_seconds,
        "lease_seconds": lease,
        # A third of the lease granted (shorter than the setting's when the timeout is nearer).
        "heartbeat_interval_seconds": round(lease / 3, 3),
    }


def _claim(organization_id: uuid.UUID, queue: str, limit: int, owner: str) -> list[StartedAttempt]:
    return atomic_retry(lambda: task_runs.claim_for_worker(
        organization_id=organization_id, queue=queue, limit=limit, owner=owner, lease_seconds=lease_seconds(),
    ), connection_attempts=2)


def poll(
    *, organization_id: uuid.UUID, api_key_id: uuid.UUID | None, queue: str, max_tasks: int,
    wait_seconds: float, worker: WorkerInfo, still_wanted: Callable[[], bool] = lambda: True,
) -> list[dict[str, Any]]:
    """Up to ``max_tasks`` task runs of ``queue`` claimed and started for ``worker``, each
    as its answer's dict (docs/workers.md), waiting up to ``wait_seconds`` for the first
    when none is ready; [] when the wait ran out. Raises UnknownQueue when no task of the
    organization waits on ``queue``, and PollCapacity when the process may
    not hold another long poll and nothing was ready. ``still_wanted`` is asked before
    each claim after the first (the first claim acts on the request's own authentication):
    False ends the poll with []. Must not run in a transaction (each
    claim commits at once, and a waiting poll holds no transaction open)."""
    owner = f"worker:{worker.id}"
    wait_seconds = min(wait_seconds, float(settings.FLOWFORGE_WORKER_POLL_MAX_WAIT_SECONDS))
    _require_known_queue(organization_id, queue)

    def seen() -> None:
        # Not for a poll refused for capacity: its worker is not serving the queue.
        worker_queues.note_worker_seen(
            organization_id=organization_id, worker_id=worker.id, queue=queue, name=worker.name, host=worker.host,
            sdk=worker.sdk, concurrency=worker.concurrency, api_key_id=api_key_id,
        )

    if wait_seconds <= 0:
        seen()
        return _payloads(_claim(organization_id, queue, max_tasks, owner))
    if not _take_poll_slot(organization_id):
        started = _claim(organization_id, queue, max_tasks, owner)
        if not started:
            raise PollCapacity()
        seen()
        return _payloads(started)
    seen()
    began = time.monotonic()
    try:
        # Registered before the first claim: a task that turns ready after it is announced.
        with queue_hub.hub().wait_for(organization_id, queue) as waiting:
            deadline = began + wait_seconds
            woken = False
            while True:
                if woken and not still_wanted():
                    # The client went away while this poll waited (killed, or cut off by a
                    # proxy), or its key was revoked: a claim now would start tasks nobody
                    # will run (each costing an attempt when its lease runs out), or hand
                    # secrets to a key that no longer may have them.
                    return []
                woken = True
                started = _claim(organization_id, queue, max_tasks, owner)
                # Attempts whose secret is gone failed at hand-out: without another, wait on.
                payloads = _payloads(started) if started else []
                if payloads:
                    metrics.observe("flowforge_worker_poll_wait_seconds", time.monotonic() - began)
                    return payloads
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                due = worker_queues.seconds_until_due(organization_id=organization_id, queue=queue)
                timeout = remaining
                if due is not None:  # ready rows held back by a backoff or a limit
                    timeout = min(timeout, max(due, LIMITED_RECHECK_SECONDS) if due > 0 else LIMITED_RECHECK_SECONDS)
                if not waiting.live:
                    timeout = min(timeout, queue_hub.NOT_LIVE_RECHECK_SECONDS)
                # No transaction is open while it waits (each claim committed): the thread's
                # persistent connection idles, kept for the claim the wake-up makes.
                waiting.wait(timeout)
    finally:
        _give_poll_slot(organization_id)
        close_old_connections()


# --- Calls on a held generation ------------------------------------------------------------------


def _held(organization_id: uuid.UUID, task_run_id: uuid.UUID, token: int) -> worker_queues.WorkerGeneration:
    """The generation the caller names, if it holds it; raises NotAWorkerTask or
    WorkerCallRefused otherwise."""
    gen = worker_queues.generation(organization_id=organization_id, task_run_id=task_run_id)
    if gen is None:
        raise NotAWorkerTask(f"no worker task run {task_run_id} in this organization")
    code = gen.refusal(token)
    if code is not None:
        raise WorkerCallRefused(code, token, gen)
    return gen


def heartbeat(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int) -> float:
    """Extend the lease of the generation ``fencing_token`` the caller holds by
    FLOWFORGE_WORKER_LEASE_SECONDS (never past the attempt's timeout). Returns the seconds
    the lease now runs (less than the setting once the timeout is nearer; rounded to
    milliseconds). Raises NotAWorkerTask or WorkerCallRefused."""
    _held(organization_id, task_run_id, fencing_token)
    extended = task_runs.extend_leases(leases=[(task_run_id, fencing_token)], lease_seconds=lease_seconds())
    if task_run_id not in extended:  # lost between the read and the update
        gen = _held(organization_id, task_run_id, fencing_token)
        raise WorkerCallRefused(gen.refusal(fencing_token) or "lease_expired", fencing_token)
    return round(extended[task_run_id], 3)


def append_logs(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int,
                lines: list[tuple[str, str]]) -> int:
    """Keep ``lines`` ((level, message), validated by the caller) for the generation the
    caller holds, each message redacted of the attempt's secret values, within the
    attempt's caps (FLOWFORGE_TASK_LOG_MAX_LINES, FLOWFORGE_TASK_LOG_MAX_BYTES; past them a
    ``system`` line says the log was truncated and later lines are dropped). Returns how
    many were kept. Raises NotAWorkerTask or WorkerCallRefused."""
    gen = _held(organization_id, task_run_id, fencing_token)
    values = _attempt_values(organization_id, task_run_id, fencing_token, gen.config)
    max_lines, max_bytes = settings.FLOWFORGE_TASK_LOG_MAX_LINES, settings.FLOWFORGE_TASK_LOG_MAX_BYTES
    kept = worker_queues.append_logs(
        organization_id=organization_id, task_run_id=task_run_id, fencing_token=fencing_token,
        lines=[(level, _redact(message, values)) for level, message in lines],
        max_lines=max_lines, max_bytes=max_bytes,
        marker=(f"log truncated: this attempt's log reached its limit of {max_lines} lines "
                f"(FLOWFORGE_TASK_LOG_MAX_LINES) or {max_bytes} bytes (FLOWFORGE_TASK_LOG_MAX_BYTES); later lines "
                "are dropped"),
    )
    if kept == 0 and lines:
        gen = _held(organization_id, task_run_id, fencing_token)  # raises: the lease ran out meanwhile
    return kept


def _held_for_completion(organization_id: uuid.UUID, task_run_id: uuid.UUID, token: int,
                         *, succeeded: bool) -> worker_queues.WorkerGeneration | None:
    """``_held``, and a refused completion recorded on the task run as a
    ``stale_completion_rejected`` event naming the refusal's code (its own transaction;
    once per generation and outcome, however often the worker replays it) before the
    refusal is raised. None, recording nothing, for a success that generation ``token``
    already completed (a replay: the worker lost the first answer and sent it again)."""
    try:
        return _held(organization_id, task_run_id, token)
    except WorkerCallRefused as refused:
        if succeeded and refused.generation is not None and refused.generation.succeeded_as(token):
            return None
        code = refused.code  # bound here: the lambda must not close over the except's name
        atomic_retry(lambda: events.append_stale_completion(
            task_run_id=task_run_id, fencing_token=token, succeeded=succeeded, reason=code, once=True),
            connection_attempts=2)
        raise


def _redact(value: Any, values: list[str]) -> Any:
    """``value`` (any JSON value, or a string) with every secret value in ``values`` and its
    encoded forms redacted (``engine.secret_refs.redact``)."""
    return secret_refs.redact(value, values)


def _attempt_values(organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int,
                    config: dict[str, Any]) -> list[str]:
    """The secret values to redact from what generation ``fencing_token`` leaves behind:
    those it was handed at its poll (core_attemptsecrets), and the current values of the
    secrets its input references (a value rotated in since is redacted too; a secret
    deleted since is still redacted by its handed-out value). [] for an input without
    references (no query beyond the config's scan)."""
    task_input = config.get("input") or {}
    if not secret_refs.mentions_reference(json.dumps(task_input)):
        return []
    values = secret_refs.current_values(organization_id, {"input": task_input})
    sealed = worker_queues.attempt_secrets(organization_id=organization_id, task_run_id=task_run_id,
                                           fencing_token=fencing_token)
    if sealed is not None:
        try:
            handed = json.loads(vault.decrypt(sealed, organization_id=organization_id,
                                              name=_handout_name(task_run_id, fencing_token)))
        except DecryptionError:
            # Its key left FLOWFORGE_SECRET_KEYS while the worker held the task: the current
            # values are all that is left to redact with.
            log.warning("the secret values handed to task run %s (generation %s) no longer decrypt",
                        task_run_id, fencing_token)
            handed = []
        values = list(dict.fromkeys([*handed, *values]))
    return values


def complete(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int, output: Any) -> str:
    """Record that the generation the caller holds succeeded with ``output`` (JSON),
    redacted of the attempt's secret values: its dependents are promoted (and claimed for
    the shared workers, published after the commit), its run finishes when nothing is left.
    Returns the task run's state ('succeeded'), also for a replay of the completion that
    generation already made (the first output is kept; nothing is written). Raises
    NotAWorkerTask or WorkerCallRefused (the refusal of a completion also leaves a
    ``stale_completion_rejected`` event), and ValueError for an output holding NaN or
    Infinity."""
    gen = _held_for_completion(organization_id, task_run_id, fencing_token, succeeded=True)
    if gen is None:
        log.info("task run %s: completion of generation %s repeated; it had succeeded already", task_run_id,
                 fencing_token)
        return "succeeded"
    values = _attempt_values(organization_id, task_run_id, fencing_token, gen.config)
    _starts, results, dispatches = task_runs.start_and_complete_many(
        starts=[], successes=[SuccessRequest(task_run_id, fencing_token, _redact(output, values), gen.has_dependents)],
        worker_lease_seconds=lease_seconds(), dispatch_lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
        owner=f"worker-api:{task_run_id}", connection_attempts=2, reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
    )
    publish_dispatches(list(dispatches), reserved=True)
    result = results[0]
    if not result.accepted:  # lost the generation between the read and the update
        gen = worker_queues.generation(organization_id=organization_id, task_run_id=task_run_id)
        if gen is not None and gen.succeeded_as(fencing_token):  # to the same completion sent twice at once
            return "succeeded"
        gen = _held(organization_id, task_run_id, fencing_token)
        raise WorkerCallRefused(gen.refusal(fencing_token) or "stale_fencing_token", fencing_token)
    metrics.incr("flowforge_task_attempts_total", "succeeded")
    if result.run_limited:
        nudge_scheduler()
    return result.state or "succeeded"


def fail(*, organization_id: uuid.UUID, task_run_id: uuid.UUID, fencing_token: int, error: str,
         retryable: bool, traceback: str = "") -> tuple[str, float | None]:
    """Record that the generation the caller holds failed with ``error`` (redacted of the
    attempt's secret values): back to its queue after its backoff while ``retryable`` and
    attempts remain, else failed (its descendants skipped, its run advanced). ``traceback``
    ('' for none) is kept beside the error in the attempt's event, redacted and cut to
    FLOWFORGE_TASK_TRACEBACK_MAX_CHARS (its start and end). Returns (state, seconds until
    the retry or None). Raises NotAWorkerTask or WorkerCallRefused."""
    gen = _held_for_completion(organization_id, task_run_id, fencing_token, succeeded=False)
    values = _attempt_values(organization_id, task_run_id, fencing_token, gen.config)
    trace = cap_middle(_redact(traceback, values), limit=settings.FLOWFORGE_TASK_TRACEBACK_MAX_CHARS, values=values,
                       what="the traceback", setting="FLOWFORGE_TASK_TRACEBACK_MAX_CHARS") if traceback else ""
    result = atomic_retry(lambda: task_runs.fail_attempt(
        task_run_id=task_run_id, fencing_token=fencing_token, error=_redact(error, values), retryable=retryable,
        traceback=trace,
    ), connection_attempts=2)
    publish_dispatches(list(result.dispatches))
    if not result.accepted:
        gen = _held(organization_id, task_run_id, fencing_token)
        raise WorkerCallRefused(gen.refusal(fencing_token) or "stale_fencing_token", fencing_token)
    metrics.incr("flowforge_task_attempts_total", "retrying" if result.retry_in_seconds is not None else result.state)
    # The failure freed a permit and room: task runs waiting for them are claimed now.
    nudge_scheduler()
    return result.state or "failed", result.retry_in_seconds
