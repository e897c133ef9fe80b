"""Recording starts and completions: one interface, an inline and a batching implementation.

After River's ``internal/jobcompleter``: the attempt flow (``engine.worker.execute``)
talks to a ``Completer`` and does not know whether its requests share a transaction.

- ``Completer.start(request)`` starts a delivered generation: StartedAttempt, or None
  when the message is stale or a duplicate (recorded as an event).
- ``Completer.complete(completion)`` is the one way to record how an attempt ended. A
  ``Success`` goes to ``task_runs.start_and_complete_many`` with the process's other starts
  and successes; a ``Failure`` is its own transaction (``task_runs.fail_attempt``).
  Returns (CompletionResult, Dispatch to continue with or None), or None when a success
  without dependents was queued behind a batch in flight (write-behind, below).

``InlineCompleter`` records each request at once, alone, in the calling thread (tests;
what ``BatchCompleter`` does when no batch is running). ``BatchCompleter`` runs requests
through a ``Combiner``: one transaction in flight per process; under load one commit
covers several threads' starts and successes. Its write-behind: a success without
dependents (nothing to continue with, nothing to publish) submitted while a batch is in
flight does not wait; it goes into the next batch and its result is counted and logged
by ``_record_queued_success``. A process that dies first leaves the attempt to the
reaper, as a death during the handler would. A batch claims only the dependents its
successes promote; the rest of a process's claims are its ``Refiller``'s, a thread of
their own (``InlineRefiller`` claims at once, for tests).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Protocol

from django.conf import settings

from engine import metrics
from engine.db import atomic_retry
from engine.dispatch import INLINE_PUBLISH_RESERVATION_SECONDS, nudge_scheduler, process_owner
from engine.relay import publish_dispatches
from engine.repositories import task_runs, types
from engine.repositories.driver import autocommit_retry
from engine.scheduler import observe_claim_waits
from engine.worker.combiner import Combiner

log = logging.getLogger(__name__)

# (CompletionResult, the dependent this thread continues with or None)
Recorded = tuple[types.CompletionResult, types.Dispatch | None]


@dataclasses.dataclass(frozen=True)
class Start:
    """A delivered execute message to start."""

    request: types.StartRequest


@dataclasses.dataclass(frozen=True)
class Success:
    """A successful attempt to record; ``may_continue``: its thread can run one of the
    dependents this completion claims itself, instead of sending it through the broker."""

    request: types.SuccessRequest
    workflow_run_id: uuid.UUID
    may_continue: bool


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failed attempt to record: ``error`` (already cut, ``output.error_text``), whether
    another attempt may follow (False for a PermanentTaskError) and the handler's
    ``traceback`` (redacted and cut, ``output.traceback_text``; '' for none)."""

    task_run_id: uuid.UUID
    fencing_token: int
    error: str
    retryable: bool
    traceback: str = ""


class Completer(Protocol):
    """Records the starts and completions of a worker process's attempts."""

    def start(self, request: types.StartRequest) -> types.StartedAttempt | None:
        """Start a delivered generation; None for a stale or duplicate message."""
        ...

    def complete(self, completion: Success | Failure) -> Recorded | None:
        """Record how an attempt ended; None when a success was queued (write-behind)."""
        ...


class InlineCompleter:
    """Each request recorded at once, alone, in the calling thread (for tests: no
    threads, no queue; the same statements and results as BatchCompleter)."""

    def start(self, request: types.StartRequest) -> types.StartedAttempt | None:
        """``Completer.start``, in its own transaction."""
        return record_batch([Start(request)])[0]

    def complete(self, completion: Success | Failure) -> Recorded | None:
        """``Completer.complete``, in its own transaction (never None: nothing is queued)."""
        if isinstance(completion, Failure):
            return record_failure(completion)
        return record_batch([completion])[0]


class BatchCompleter:
    """Starts and successes of the process's threads go through one Combiner over
    ``run_batch`` (default ``record_batch``), at most ``max_batch`` requests per
    transaction; successes without dependents are written behind (module docstring).
    A batch claims in its own transaction only for the dependents its successes promote
    (the thread may continue with one); every other batch asks ``refiller`` (default the
    process's ``Refiller``) to refill its organizations, off the batches' path."""

    def __init__(self, run_batch: Callable[[list], list] | None = None, *, max_batch: int = 64,
                 refiller: Refiller | InlineRefiller | None = None):
        self.combiner: Combiner = Combiner(run_batch or self._record, max_batch=max_batch,
                                           linger_seconds=settings.FLOWFORGE_BATCH_LINGER_SECONDS)
        self.refiller = refiller if refiller is not None else Refiller()

    def _record(self, items: list[Start | Success]) -> list:
        """``record_batch``, claiming in the batch's transaction only when a success has
        dependents; otherwise the refiller is asked to claim for these task runs'
        organizations (what their starts and successes made room for). Measured (make
        bench, 2 x 8 threads): one claim per batch cost a fifth of the independent-task
        throughput, and a claim in a start's transaction delays that start by it."""
        claim = any(isinstance(item, Success) and item.request.has_dependents for item in items)
        results = record_batch(items, claim=claim)
        # Not for a batch of continuations' starts alone: the success that claimed them
        # claimed for their organization in the same transaction, and a refill racing the
        # chain's next success for the organization's claim lock only delays that hop.
        if not claim and not all(isinstance(item, Start) and item.request.outbox_id is not None for item in items):
            self.refiller.request([item.request.task_run_id for item in items])
        return results

    def start(self, request: types.StartRequest) -> types.StartedAttempt | None:
        """``Completer.start``, batched with the process's other starts and successes."""
        return self.combiner.submit(Start(request))

    def complete(self, completion: Success | Failure) -> Recorded | None:
        """``Completer.complete``: a success is batched (written behind when it has no
        dependents); a failure is its own transaction."""
        if isinstance(completion, Failure):
            return record_failure(completion)
        if completion.request.has_dependents:
            # Waits: the dependents it claims are published by whichever thread ran the
            # batch, except the one this thread may continue with.
            return self.combiner.submit(completion)
        request = completion.request
        return self.combiner.submit(
            completion, wait=False,
            on_result=functools.partial(_record_queued_success, request.task_run_id, request.fencing_token),
        )


def record_batch(items: list[Start | Success], *, claim: bool = True) -> list:
    """Record a batch of starts and successes in one transaction and one round trip
    (``task_runs.start_and_complete_many``), then publish the dependents the successes
    claimed (``_publish_claimed``). Returns, per item, a start's StartedAttempt or None,
    or a success's (CompletionResult, Dispatch or None). Raises what the statement raises
    (after its connection retries)."""
    successes = [item for item in items if isinstance(item, Success)]
    started, results, dispatches = task_runs.start_and_complete_many(
        claim=claim,
        starts=[item.request for item in items if isinstance(item, Start)],
        successes=[item.request for item in successes],
        worker_lease_seconds=settings.FLOWFORGE_LEASE_SECONDS,
        # The lease of dependents these completions claim: until a worker starts them.
        dispatch_lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
        owner=process_owner("worker"),
        connection_attempts=8,
        reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
    )
    observe_claim_waits(dispatches)
    completed = iter(_publish_claimed(successes, results, dispatches))
    started_iter = iter(started)
    return [next(started_iter) if isinstance(item, Start) else next(completed) for item in items]


class Refiller:
    """A worker process's refill claims, in a thread of its own (started with the first
    request): the organizations of the task runs its batches recorded get what their
    starts (room in the broker) and successes (room, permits) made room for
    (``refill``), at most once per FLOWFORGE_REFILL_INTERVAL_SECONDS. No batch waits for
    a claim; requests that arrive while one runs are merged into the next. A request
    lost with the process is claimed by the clock's next tick."""

    #: Task run ids kept per pending refill (their organizations are what is claimed for):
    #: enough for every request of an interval (16 batches of 64), so no organization's
    #: request is dropped behind another's; a refill looks each one up by primary key.
    MAX_IDS = 1024
    #: Seconds without a request after which the thread closes its database connection
    #: (a new one prepares the claim statements again).
    IDLE_CLOSE_SECONDS = 300.0

    # Every Refiller of this process (stop_all).
    _instances: weakref.WeakSet[Refiller] = weakref.WeakSet()

    def __init__(self, interval_seconds: float | None = None):
        Refiller._instances.add(self)
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._ids: list[uuid.UUID] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def request(self, task_run_ids: list[uuid.UUID]) -> None:
        """Refill the organizations of ``task_run_ids`` soon (returns at once)."""
        with self._lock:
            room = self.MAX_IDS - len(self._ids)
            if room > 0:
                self._ids.extend(task_run_ids[:room])
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="flowforge-refill", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the pending refill, end the thread and close its database connection (tests)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @classmethod
    def stop_all(cls) -> None:
        """``stop`` every Refiller of this process (a test session's end: no thread may
        keep a connection to the database being dropped)."""
        for refiller in list(cls._instances):
            refiller.stop()

    def _loop(self) -> None:
        from django.db import connection

        try:
            while True:
                if not self._wake.wait(self.IDLE_CLOSE_SECONDS):
                    connection.close()  # idle: give the connection back (reopened on the next claim)
                    continue
                self._wake.clear()
                with self._lock:
                    ids, self._ids = self._ids, []
                if ids:
                    refill(ids)
                if self._stopping:
                    return
                interval = (self._interval if self._interval is not None
                            else settings.FLOWFORGE_REFILL_INTERVAL_SECONDS)
                if interval > 0:
                    time.sleep(interval)
        finally:
            connection.close()


class InlineRefiller:
    """``Refiller``'s interface, claiming at once in the calling thread (tests)."""

    def request(self, task_run_ids: list[uuid.UUID]) -> None:
        """``refill(task_run_ids)`` now."""
        refill(task_run_ids)


def refill(task_run_ids: list[uuid.UUID]) -> int:
    """Claim for the organizations of ``task_run_ids`` (a batch that did not claim) in a
    transaction of its own and publish what it took; returns how many were claimed. A
    failure is logged, not raised: the clock's next tick claims them."""
    try:
        dispatches = atomic_free_claim(task_run_ids)
    except Exception:  # noqa: BLE001 - the clock's next tick claims them
        log.exception("a worker's refill claim failed; the clock's next tick claims")
        return 0
    observe_claim_waits(dispatches)
    publish_dispatches(dispatches, reserved=True)
    return len(dispatches)


def atomic_free_claim(task_run_ids: list[uuid.UUID]) -> list[types.Dispatch]:
    """``task_runs.claim_ready_many`` for the organizations of ``task_run_ids`` that have
    ready work, retried on a deadlock or a lost connection; none has: nothing is locked.

    The check comes first, without a lock: a refill with nothing to claim would otherwise
    hold the organization's claim lock just when a chain's next success wants it for its
    dependent (make bench's hop p99). A task run that turns ready after the check is
    claimed by whoever made it ready (a success claims its dependents, a start its roots)
    or by the clock's next tick."""
    def claim() -> list[types.Dispatch]:
        organizations = task_runs.organizations_with_ready_of(task_run_ids)
        if not organizations:
            return []
        return task_runs.claim_ready_many(
            limit=settings.FLOWFORGE_CLAIM_BATCH, lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
            owner=process_owner("worker"), organizations=organizations,
            reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
        )

    return autocommit_retry(claim, connection_attempts=8)


def _publish_claimed(
    items: list[Success], results: list[types.CompletionResult], dispatches: tuple[types.Dispatch, ...]
) -> list[Recorded]:
    """After the commit of a batch of successes: publish the dependents they claimed,
    keeping back at most one per thread that may continue (same run first), returned
    beside that thread's result. No message is sent for those: the thread's start of it
    stamps its outbox row (``StartRequest.outbox_id``), so a continuation costs no
    transaction of its own; if the thread dies first, the relay publishes the row once
    the claim's reservation has passed (``INLINE_PUBLISH_RESERVATION_SECONDS``)."""
    free = [d for d in dispatches if d.outbox_id is not None]
    continuations: dict[int, types.Dispatch] = {}
    for i, (item, result) in enumerate(zip(items, results, strict=True)):
        if not (free and item.may_continue and result.accepted):
            continue
        pick = next((d for d in free if d.workflow_run_id == item.workflow_run_id), free[0])
        free.remove(pick)
        continuations[i] = pick
    kept = {id(d) for d in continuations.values()}
    # After the commit, one publish (and one stamp) for the rest of the batch's dependents.
    publish_dispatches([d for d in dispatches if id(d) not in kept], reserved=True)
    return [(result, continuations.get(i)) for i, result in enumerate(results)]


def record_failure(failure: Failure) -> Recorded:
    """Record a failed attempt in its own transaction (retried on deadlock and on a lost
    connection), then publish the generations its advance claimed (``result.dispatches``,
    through the relay). Returns (CompletionResult, None): a failure never continues."""
    result = atomic_retry(
        lambda: task_runs.fail_attempt(
            task_run_id=failure.task_run_id,
            fencing_token=failure.fencing_token,
            error=failure.error,
            retryable=failure.retryable,
            traceback=failure.traceback,
        ),
        connection_attempts=8,
    )
    publish_dispatches(result.dispatches)
    return result, None


def count_completion(result: types.CompletionResult) -> str:
    """Count a recorded completion in the metrics; returns its outcome ("rejected",
    "retrying" or the task run's new state)."""
    if not result.accepted:
        metrics.incr("flowforge_task_attempts_total", "rejected")
        return "rejected"
    if result.run_state is not None:
        metrics.incr("flowforge_runs_finished_total", result.run_state)
        if result.run_limited:
            # A run of a workflow with max_running_runs ended: the scheduler admits the next
            # queued one now (runs.admit_queued) rather than at the clock's next tick.
            try:
                nudge_scheduler()
            except Exception:  # noqa: BLE001 - the clock's tick admits it anyway
                log.warning("could not nudge the scheduler after a limited run finished; the next tick admits")
    outcome = "retrying" if result.retry_in_seconds is not None else result.state or "unknown"
    metrics.incr("flowforge_task_attempts_total", outcome)
    return outcome


def _record_queued_success(task_run_id: uuid.UUID, fencing_token: int, outcome: Recorded | None,
                           error: BaseException | None) -> None:
    """The result of a success that went into a later batch (write-behind): counted like
    any completion; a rejection (the generation was reaped, cancelled or superseded
    meanwhile) or a failure to record it is logged with the attempt's ids."""
    if error is not None:
        log.error("recording the success of task run %s generation %s failed (%s: %s); its lease will "
                  "expire and the reaper dispatches it again", task_run_id, fencing_token,
                  type(error).__name__, error)
        return
    result, _following = outcome
    if count_completion(result) == "rejected":
        log.warning("the success of task run %s generation %s was rejected: the generation was reaped, "
                    "cancelled or superseded before it was recorded", task_run_id, fencing_token)
