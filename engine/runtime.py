"""Running one attempt inside a worker: start, heartbeat, handler, completion."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from django import db
from django.conf import settings

from engine import metrics
from engine.db import atomic_retry
from engine.dispatch import (
    INLINE_PUBLISH_RESERVATION_SECONDS,
    dispatch_message,
    enqueue_many,
    nudge_scheduler,
    process_owner,
)
from engine.handlers import PermanentTaskError, TaskContext, get_handler
from engine.jsonb import strip_nul
from engine.relay import publish_dispatches
from engine.repositories import transitions
from engine.states import TASK_QUEUE
from flowforge import logs

log = logging.getLogger(__name__)


class Heartbeater:
    """One daemon thread per worker process that extends the leases of every attempt
    the process is running, in one UPDATE per beat. An attempt whose lease could not
    be extended (reaped, cancelled, superseded) has ``context.lost`` set."""

    def __init__(self, *, interval_seconds: float, lease_seconds: float):
        self.interval_seconds = interval_seconds
        self.lease_seconds = lease_seconds
        self._active: dict[tuple[uuid.UUID, int], TaskContext] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, context: TaskContext) -> None:
        with self._lock:
            self._active[(context.task_run_id, context.fencing_token)] = context
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flowforge-heartbeat", daemon=True)
                self._thread.start()

    def unregister(self, context: TaskContext) -> None:
        with self._lock:
            self._active.pop((context.task_run_id, context.fencing_token), None)

    def beat(self) -> None:
        """Extend every registered lease once (also called by tests)."""
        with self._lock:
            items = list(self._active.items())
        if not items:
            return
        alive = transitions.heartbeat(leases=[k for k, _ in items], lease_seconds=self.lease_seconds)
        for (task_run_id, token), ctx in items:
            if task_run_id not in alive:
                log.warning("task run %s generation %s lost its lease", task_run_id, token)
                ctx.lost.set()

    def _loop(self) -> None:
        stop = threading.Event()
        while not stop.wait(self.interval_seconds):
            try:
                self.beat()
            except Exception:
                log.exception("heartbeat failed; retrying next beat")
                db.connection.close()


_heartbeater: Heartbeater | None = None


def heartbeater() -> Heartbeater:
    global _heartbeater
    if _heartbeater is None:
        _heartbeater = Heartbeater(
            interval_seconds=settings.FLOWFORGE_HEARTBEAT_SECONDS, lease_seconds=settings.FLOWFORGE_LEASE_SECONDS
        )
    return _heartbeater


class Combiner[Req, Res]:
    """Runs the requests of a process's threads in batches, one batch at a time.

    A request that arrives while no batch is running runs at once, alone (no added
    latency at light load); requests that arrive while one is running wait and go
    together into the next batch, which one of them runs. So a worker process has at
    most one such transaction in flight, and under load one commit covers several
    tasks instead of each thread queueing on the same run row for a commit of its own.
    ``run_batch(requests)`` returns one result per request, in order; when it raises
    for a batch of several, each request is run again alone (``run_batch([request])``)
    and gets its own result or exception, so one bad request fails only itself.

    ``submit(request)`` waits for the request's result (or raises its exception).
    ``submit(request, wait=False, on_result=f)`` does not wait when a batch is already
    running: the request goes into the next batch, ``f(result, error)`` is called (by
    the thread that runs that batch) once it has run, and the call returns None. With
    no batch running it runs the request at once, like ``submit(request)`` (``f`` is
    not called).
    Nothing queued is left behind: the thread that runs a batch hands the next one to a
    waiting submitter or, when only requests nobody waits for are queued, runs it itself.
    """

    def __init__(self, run_batch: Callable[[list[Req]], list[Res]], *, max_batch: int = 64):
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False

    def submit(self, request: Req, *, wait: bool = True,
               on_result: Callable[[Res | None, BaseException | None], None] | None = None) -> Res | None:
        slot = _Slot(request, wait, on_result)
        with self._lock:
            self._queue.append(slot)
            if self._busy:
                if not wait:
                    return None  # the thread running the current batch, or its successor, runs it
            else:
                self._busy = True
                slot.lead = True
        while True:
            if not slot.lead:
                slot.wait_ready()
                if not slot.lead:  # woken with its result
                    return slot.result()
            with self._lock:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            self._run(batch)
            with self._lock:
                successor = None
                if not self._queue:  # (its own request ran: it was queued first)
                    self._busy = False
                    finished = True
                elif slot.done:
                    # Hand the lead to a waiting submitter; with only requests nobody waits
                    # for queued, keep it (they must not be left behind).
                    successor = next((s for s in self._queue if s.wait), None)
                    if successor is not None:
                        successor.lead = True
                    finished = successor is not None
                else:
                    finished = False
            for s in batch:
                if s is not slot and s.wait:
                    s.set_ready()
            if successor is not None:
                successor.set_ready()
            if finished:
                return slot.result()

    def _run(self, batch: list[_Slot]) -> None:
        try:
            results = self._run_batch([s.request for s in batch])
            for s, res in zip(batch, results, strict=True):
                s.value = res
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                # One bad request must not fail the others it happened to share a batch with
                # (their transaction rolled back whole): each runs again alone, and only the
                # ones that fail alone get an error.
                log.warning("a batch of %d requests failed (%s: %s); running each alone",
                            len(batch), type(exc).__name__, exc)
                for s in batch:
                    try:
                        (s.value,) = self._run_batch([s.request])
                    except Exception as alone:
                        s.error = alone
        except BaseException as exc:
            for s in batch:
                s.error = exc
        for s in batch:
            s.done = True
            if s.on_result is not None and not s.lead:  # (a lead's own request: returned to it)
                try:
                    s.on_result(s.value, s.error)
                except Exception:
                    log.exception("a batched request's result callback failed")


class _Slot:
    __slots__ = ("request", "wait", "on_result", "_ready", "lead", "done", "value", "error")

    def __init__(self, request, wait: bool = True, on_result=None):
        self.request = request
        self.wait = wait
        self.on_result = on_result
        # Released once, by the thread that hands this slot its result or the lead: a bare
        # lock, as threading.Event's condition variable costs several times more per hand-off.
        self._ready = threading.Lock()
        self._ready.acquire()
        self.lead = False
        self.done = False
        self.value = None
        self.error: BaseException | None = None

    def wait_ready(self) -> None:
        self._ready.acquire()

    def set_ready(self) -> None:
        self._ready.release()

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


@dataclasses.dataclass(frozen=True)
class _Start:
    """A delivered execute message to start."""

    request: transitions.StartRequest


@dataclasses.dataclass(frozen=True)
class _Success:
    """A successful attempt to record; ``may_continue``: its thread can run one of the
    dependents this completion claims itself, instead of sending it through the broker."""

    request: transitions.SuccessRequest
    workflow_run_id: uuid.UUID
    may_continue: bool


def _publish_claimed(
    items: list[_Success], results: list[transitions.CompletionResult], dispatches: tuple[transitions.Dispatch, ...]
) -> list[tuple[transitions.CompletionResult, transitions.Dispatch | None]]:
    """After the commit of a batch of successes: publish the dependents they claimed,
    keeping back at most one per thread that may continue (same run first), returned
    beside that thread's result. No message is sent for those: the thread's start of it
    stamps its outbox row (``StartRequest.outbox_id``), so a continuation costs no
    transaction of its own; if the thread dies first, the relay publishes the row once
    the claim's reservation has passed (``INLINE_PUBLISH_RESERVATION_SECONDS``)."""
    free = [d for d in dispatches if d.outbox_id is not None]
    continuations: dict[int, transitions.Dispatch] = {}
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


def _transition_batch(items: list[_Start | _Success]) -> list:
    """Record a batch of starts and successes in one transaction and one round trip
    (``transitions.start_and_complete``), then publish the dependents the successes
    claimed (``_publish_claimed``). Returns, per item, a start's StartedAttempt or None,
    or a success's (CompletionResult, Dispatch or None)."""
    successes = [item for item in items if isinstance(item, _Success)]
    started, results, dispatches = transitions.start_and_complete(
        starts=[item.request for item in items if isinstance(item, _Start)],
        successes=[item.request for item in successes],
        worker_lease_seconds=settings.FLOWFORGE_LEASE_SECONDS,
        # The lease of dependents these completions claim: until a worker starts them.
        dispatch_lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
        owner=process_owner("worker"),
        connection_attempts=8,
        reserve_seconds=INLINE_PUBLISH_RESERVATION_SECONDS,
    )
    completed = iter(_publish_claimed(successes, results, dispatches))
    started_iter = iter(started)
    return [next(started_iter) if isinstance(item, _Start) else next(completed) for item in items]


# One batch in flight per worker process, its threads' starts and successes together:
# measured against one combiner for each (2 x 8 threads, 2,000 independent tasks, 6 runs
# each), 0.19 against 0.16 of raw Dramatiq's throughput on average.
_transitions: Combiner = Combiner(_transition_batch)


# Characters of a failed attempt's error kept (the task run's ``error`` and its event's
# detail): a handler's exception message is unbounded, and every run detail, event page
# and event stream would carry it once per attempt.
MAX_ERROR_CHARS = 4000


def error_text(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, cut to MAX_ERROR_CHARS characters (an ellipsis and
    how many characters were dropped mark a cut)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) <= MAX_ERROR_CHARS:
        return text
    note = f"… ({len(text) - MAX_ERROR_CHARS + 60} more characters cut)"
    return text[: MAX_ERROR_CHARS - 60] + note


class OutputTooLarge(PermanentTaskError):
    """A handler returned more than FLOWFORGE_MAX_OUTPUT_BYTES of output."""


class OutputNotJson(PermanentTaskError):
    """A handler returned a value JSON cannot encode."""


def encode_output(output: Any) -> str:
    """``output`` (NULs stripped) as the JSON text to store, when it fits
    FLOWFORGE_MAX_OUTPUT_BYTES (a size in bytes of UTF-8 JSON).

    Raises OutputTooLarge (naming both sizes) rather than storing a truncated value
    that dependents would misread, and OutputNotJson for a value JSON cannot encode
    (NaN and Infinity included); both fail the task without retries, since another
    attempt returns the same. The text goes to the completion as it is, so an output is
    encoded once (``transitions.SuccessRequest.output_json``).
    """
    try:
        encoded = json.dumps(strip_nul(output), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputNotJson(f"task output is not JSON-encodable: {exc}") from exc
    size = len(encoded.encode())
    if size > settings.FLOWFORGE_MAX_OUTPUT_BYTES:
        raise OutputTooLarge(
            f"task output is {size} bytes of JSON, over FLOWFORGE_MAX_OUTPUT_BYTES "
            f"({settings.FLOWFORGE_MAX_OUTPUT_BYTES}); return a summary or a reference instead"
        )
    return encoded


def cap_output(output: Any) -> Any:
    """``output`` as it will be stored: ``encode_output(output)`` decoded again (NULs
    stripped, keys made strings). Raises what ``encode_output`` raises."""
    return json.loads(encode_output(output))


def execute(task_run_id: str | uuid.UUID, fencing_token: int, *, continue_inline: bool = False) -> str:
    """Run generation ``fencing_token`` of a task run to completion in this thread (see
    ``_execute``) and return its outcome. The ids it binds to log lines are reset when
    it returns, so nothing of this attempt is ambient in the thread's next message.

    With ``continue_inline`` (the execute actor), when the success claims dependents,
    this thread then runs one of them itself, and so on down a chain, up to
    FLOWFORGE_INLINE_CONTINUATIONS hops per message: a hop then costs the completion's
    commit and the next start, not a broker round trip and a consumer's poll. The
    others are published as usual. A continued generation is started, fenced and
    completed exactly as one that came through the broker.
    """
    hops_left = settings.FLOWFORGE_INLINE_CONTINUATIONS if continue_inline else 0
    with logs.bound(task_run_id=task_run_id, fencing_token=fencing_token):
        outcome, following = _execute(task_run_id, fencing_token, may_continue=hops_left > 0)
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
    only the ones that did not start."""
    group = _Group(dispatches)
    watchdog = hand_off_watchdog()
    watchdog.register(group)
    outcomes: list[str] = []
    try:
        while (pair := group.take_next()) is not None:
            outcomes.append(execute(pair[0], pair[1], continue_inline=True))
    finally:
        watchdog.unregister(group)
    return outcomes


class _Group:
    """The generations of one ``execute_task_runs`` message that its thread has not
    started yet (taken one by one by that thread, or all at once by ``HandOff``)."""

    __slots__ = ("pending", "size", "began", "_lock")

    def __init__(self, dispatches: list[tuple[str, int]]):
        self.pending = collections.deque(dispatches)
        self.size = len(dispatches)
        self.began = time.monotonic()
        self._lock = threading.Lock()

    def take_next(self) -> tuple[str, int] | None:
        with self._lock:
            return self.pending.popleft() if self.pending else None

    def take_rest(self) -> list[tuple[str, int]]:
        with self._lock:
            rest = list(self.pending)
            self.pending.clear()
            return rest

    def put_back(self, pairs: list[tuple[str, int]]) -> None:
        with self._lock:
            self.pending.extendleft(reversed(pairs))


class HandOff:
    """One daemon thread per worker process that, every quarter of
    FLOWFORGE_GROUP_HANDOFF_SECONDS (0.05 to 0.5 s), hands the generations not yet
    started of each ``execute_task_runs`` message running longer than that back to the
    broker, once per message. Ones the broker refuses are put back for their thread to run."""

    def __init__(self) -> None:
        self._groups: set[_Group] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, group: _Group) -> None:
        if group.size < 2:
            return  # nothing that could wait behind another
        with self._lock:
            self._groups.add(group)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="flowforge-handoff", daemon=True)
                self._thread.start()

    def unregister(self, group: _Group) -> None:
        with self._lock:
            self._groups.discard(group)

    def check(self) -> None:
        """Hand off the waiting generations of every message past the limit, once each."""
        limit = settings.FLOWFORGE_GROUP_HANDOFF_SECONDS
        now = time.monotonic()
        with self._lock:
            due = [g for g in self._groups if now - g.began > limit]
            self._groups.difference_update(due)  # one try each: what the broker refuses stays with its thread
        for group in due:
            rest = group.take_rest()
            if not rest:
                continue
            try:
                refused = _hand_off(rest)
            except BaseException:
                group.put_back(rest)  # their thread runs them after all
                raise
            group.put_back(refused)
            log.info("handed %d of %d generations of a message back to the broker after %.1f s",
                     len(rest) - len(refused), group.size, now - group.began)

    def _loop(self) -> None:
        while True:
            time.sleep(min(0.5, max(0.05, settings.FLOWFORGE_GROUP_HANDOFF_SECONDS / 4)))
            try:
                self.check()
            except Exception:
                log.exception("handing generations back to the broker failed; their threads run them")


_hand_off_watchdog: HandOff | None = None


def hand_off_watchdog() -> HandOff:
    """This process's HandOff (created on first use)."""
    global _hand_off_watchdog
    if _hand_off_watchdog is None:
        _hand_off_watchdog = HandOff()
    return _hand_off_watchdog


def _hand_off(dispatches: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Send each generation as its own ``execute_task_run`` message, in one broker round
    trip; returns the ones the broker refused (logged)."""
    messages = [dispatch_message([pair], TASK_QUEUE) for pair in dispatches]
    refused = []
    for pair, error in zip(dispatches, enqueue_many(messages), strict=True):
        if error is not None:
            log.warning("handing task run %s generation %s back to the broker failed (%s); running it here",
                        pair[0], pair[1], error)
            refused.append(pair)
    return refused


def _execute(
    task_run_id: str | uuid.UUID, fencing_token: int, *, may_continue: bool = False,
    outbox_id: uuid.UUID | None = None,
) -> tuple[str, transitions.Dispatch | None]:
    """Run generation ``fencing_token`` of a task run to completion in this thread
    (``outbox_id``: its outbox row, when it is a continuation no message was sent for).

    Returns what happened: "ignored" (stale or duplicate message), "succeeded",
    "failed", "retrying" or "rejected" (the completion lost to a newer generation
    or a cancellation); and, when ``may_continue`` and the success claimed dependents,
    the one this thread is to run next (already stamped as delivered), else None.
    """
    task_run_id = uuid.UUID(str(task_run_id))
    owner = f"{process_owner('worker')}:{threading.get_ident()}"
    # One round trip and one commit, shared with the process's other threads' starts and successes.
    started = _transitions.submit(_Start(transitions.StartRequest(task_run_id, fencing_token, owner, outbox_id)))
    if started is None:
        return "ignored", None
    # Every log line of this attempt names its organization, run and attempt too.
    logs.bind(organization_id=started.organization_id, workflow_run_id=started.workflow_run_id,
              attempt=started.attempt)
    if started.dispatch_latency_seconds is not None:
        metrics.observe("flowforge_dispatch_latency_seconds", max(0.0, started.dispatch_latency_seconds))
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
    )
    hb = heartbeater()
    hb.register(context)
    succeeded = False
    retryable = True
    output_json = ""
    error = ""
    began = time.monotonic()
    try:
        handler = get_handler(started.task_type)
        output_json = encode_output(handler.run(context))
        succeeded = True
    except Exception as exc:
        retryable = not isinstance(exc, PermanentTaskError)
        error = error_text(exc)
        log.info(
            "task %s (run %s) attempt %s failed: %s",
            started.task_key, started.workflow_run_id, started.attempt, error,
            extra={"traceback": traceback.format_exc(limit=5)},
        )
    finally:
        hb.unregister(context)
        metrics.observe("flowforge_task_duration_seconds", time.monotonic() - began)
    if not succeeded and context.lease_lost:
        # The lease was lost (timed out, reaped or cancelled) and the handler stopped for
        # it: the reaper, or the cancellation, owns this attempt's outcome and records
        # the right reason ("attempt timed out", "lease expired"); a completion here
        # would record the interruption instead.
        return "abandoned", None
    if succeeded and not started.has_dependents:
        # Nothing to continue with and nothing to publish: when a batch is in flight, the
        # success goes into the next one and this thread takes its next message meanwhile,
        # so under load one transaction records its success and its next start (write-behind).
        # A success recorded later that is rejected or fails is logged and counted there
        # (_record_queued_success); a process that dies first leaves the attempt to the reaper,
        # as a death during the handler would.
        outcome = _transitions.submit(
            _Success(transitions.SuccessRequest(task_run_id, fencing_token, None, False, output_json=output_json),
                     started.workflow_run_id, False),
            wait=False,
            on_result=functools.partial(_record_queued_success, task_run_id, fencing_token),
        )
        if outcome is None:
            return "succeeded", None
        result, following = outcome
    elif succeeded:
        # One round trip and one commit, shared with the process's other starts and successes; the
        # dependents it claims are published by whichever thread ran the batch, except
        # the one this thread may continue with.
        result, following = _transitions.submit(_Success(
            transitions.SuccessRequest(task_run_id, fencing_token, None, started.has_dependents,
                                       output_json=output_json),
            started.workflow_run_id, may_continue
        ))
    else:
        following = None
        result = atomic_retry(
            lambda: transitions.complete_attempt(
                task_run_id=task_run_id,
                fencing_token=fencing_token,
                succeeded=False,
                error=error,
                retryable=retryable,
                lease_seconds=settings.FLOWFORGE_DISPATCH_LEASE_SECONDS,
                owner=process_owner("worker"),
            ),
            connection_attempts=8,
        )
        publish_dispatches(result.dispatches)
    if _count_completion(result) == "rejected":
        return "rejected", None
    if result.retry_in_seconds is not None:
        nudge_scheduler(delay_ms=int(result.retry_in_seconds * 1000) + 20)
        return "retrying", following
    return result.state or "unknown", following


def _count_completion(result: transitions.CompletionResult) -> str:
    """Count a recorded completion in the metrics; returns its outcome ("rejected",
    "retrying" or the task run's new state)."""
    if not result.accepted:
        metrics.incr("flowforge_task_attempts_total", "rejected")
        return "rejected"
    if result.run_state is not None:
        metrics.incr("flowforge_runs_finished_total", result.run_state)
    outcome = "retrying" if result.retry_in_seconds is not None else result.state or "unknown"
    metrics.incr("flowforge_task_attempts_total", outcome)
    return outcome


def _record_queued_success(task_run_id: uuid.UUID, fencing_token: int, outcome, error: BaseException | None) -> None:
    """The result of a success that went into a later batch (``_execute``'s write-behind):
    counted like any completion; a rejection (the generation was reaped, cancelled or
    superseded meanwhile) or a failure to record it is logged with the attempt's ids."""
    if error is not None:
        log.error("recording the success of task run %s generation %s failed (%s: %s); its lease will "
                  "expire and the reaper dispatches it again", task_run_id, fencing_token,
                  type(error).__name__, error)
        return
    result, _following = outcome
    if _count_completion(result) == "rejected":
        log.warning("the success of task run %s generation %s was rejected: the generation was reaped, "
                    "cancelled or superseded before it was recorded", task_run_id, fencing_token)
