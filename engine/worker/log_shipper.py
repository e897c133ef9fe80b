"""Writing the lines the process's attempts capture (``engine.attempt_log``) to core_tasklog.

One ``LogShipper`` per worker process. ``open`` gives an attempt its ``AttemptLog``; an
attempt that never writes a line is never registered and costs nothing more. The first
line registers it, and from then on a daemon thread takes the lines of every registered
attempt each FLOWFORGE_TASK_LOG_FLUSH_SECONDS and writes them all in one statement
(``task_logs.append_many``), so a running attempt's lines show while it runs. ``finish``,
called by the attempt's own thread once its handler returned and before its completion is
recorded, closes the log and writes what is left (one statement, only if anything is).

Each AttemptLog's ``write_lock`` is held by whoever writes its lines, the thread's batch or
the attempt's end, so an attempt's lines reach the table (whose ids are their order) in the
order they were written. Lines are best effort: a write that fails is logged and its lines
dropped, never the attempt's outcome.
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref

from django import db
from django.conf import settings

from engine.attempt_log import AttemptLog, Line
from engine.repositories import task_logs

log = logging.getLogger(__name__)


class LogShipper:
    """The writer of one worker process's captured lines (module docstring).
    ``interval_seconds`` None reads FLOWFORGE_TASK_LOG_FLUSH_SECONDS at each wait."""

    #: Seconds without lines after which the thread gives its database connection back.
    IDLE_CLOSE_SECONDS = 300.0

    _instances: weakref.WeakSet[LogShipper] = weakref.WeakSet()

    def __init__(self, *, interval_seconds: float | None = None):
        LogShipper._instances.add(self)
        self._interval = interval_seconds
        self._active: dict[int, AttemptLog] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def open(self, *, organization_id: uuid.UUID, workflow_run_id: uuid.UUID, task_run_id: uuid.UUID,
             attempt: int, fencing_token: int) -> AttemptLog:
        """A new AttemptLog for one started generation, capped by the settings
        (FLOWFORGE_TASK_LOG_MAX_LINES, FLOWFORGE_TASK_LOG_MAX_BYTES), registered with this
        shipper when its first line comes. No statement, no lock."""
        return AttemptLog(
            organization_id=organization_id, workflow_run_id=workflow_run_id, task_run_id=task_run_id,
            attempt=attempt, fencing_token=fencing_token, max_lines=settings.FLOWFORGE_TASK_LOG_MAX_LINES,
            max_bytes=settings.FLOWFORGE_TASK_LOG_MAX_BYTES, on_first_line=self._register,
        )

    def _register(self, attempt_log: AttemptLog) -> None:
        with self._lock:
            self._active[id(attempt_log)] = attempt_log
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="flowforge-task-logs", daemon=True)
                self._thread.start()

    def finish(self, attempt_log: AttemptLog) -> int:
        """The attempt's handler returned: close its log and write the lines not written yet,
        in this thread (after a batch of the shipper's that holds earlier ones). Returns how
        many were written; no statement for an attempt that wrote nothing."""
        attempt_log.close()
        if not attempt_log.has_lines:
            return 0
        try:
            with attempt_log.write_lock:
                return self._write_many([(attempt_log, line) for line in attempt_log.take()])
        finally:
            with self._lock:
                self._active.pop(id(attempt_log), None)

    def ship(self) -> int:
        """Write the lines every registered attempt captured since the last write, in one
        statement (the thread's work; also called by tests). An attempt whose end is being
        written by its own thread is left to it. Returns how many lines were written."""
        with self._lock:
            active = list(self._active.values())
        held: list[AttemptLog] = []
        lines: list[tuple[AttemptLog, Line]] = []
        try:
            for attempt_log in active:
                if attempt_log.write_lock.acquire(blocking=False):
                    held.append(attempt_log)
                    lines.extend((attempt_log, line) for line in attempt_log.take())
            return self._write_many(lines)
        finally:
            for attempt_log in held:
                attempt_log.write_lock.release()

    def _write_many(self, lines: list[tuple[AttemptLog, Line]]) -> int:
        """Write ``lines`` ((their attempt, line), in order) in one statement; when that
        fails for several attempts, each attempt's again alone, so a gone task run costs
        only its own lines. Failures are logged; returns how many lines were written."""
        if not lines:
            return 0
        rows = [_row(a, line) for a, line in lines]
        try:
            return task_logs.append_many(rows)
        except Exception as exc:  # noqa: BLE001 - lines are best effort; the attempt goes on
            attempts = {id(a): a for a, _ in lines}
            if len(attempts) == 1:
                a = next(iter(attempts.values()))
                log.warning("could not write %d log lines of task run %s generation %s (%s: %s); they are dropped",
                            len(lines), a.task_run_id, a.fencing_token, type(exc).__name__, exc)
                _reset_connection()
                return 0
            _reset_connection()
            return sum(self._write_many([(a, line) for a, line in lines if id(a) == key]) for key in attempts)

    def _loop(self) -> None:
        idle = 0.0
        try:
            while True:
                interval = self._interval if self._interval is not None else settings.FLOWFORGE_TASK_LOG_FLUSH_SECONDS
                if self._stop.wait(interval):
                    self.ship()
                    return
                try:
                    written = self.ship()
                except Exception:  # noqa: BLE001 - the next beat tries again
                    log.exception("writing captured task log lines failed; retrying next time")
                    _reset_connection()
                    written = 0
                idle = 0.0 if written else idle + interval
                if idle >= self.IDLE_CLOSE_SECONDS:
                    db.connection.close()  # reopened by the next write
                    idle = 0.0
        finally:
            db.connection.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is waiting, end the thread and close its connection (tests)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @classmethod
    def stop_all(cls) -> None:
        """``stop`` every LogShipper of this process (a test session's end: no thread may
        keep a connection to the database being dropped)."""
        for shipper in list(cls._instances):
            shipper.stop()


def _row(attempt_log: AttemptLog, line: Line) -> task_logs.NewLine:
    return task_logs.NewLine(
        organization_id=attempt_log.organization_id, workflow_run_id=attempt_log.workflow_run_id,
        task_run_id=attempt_log.task_run_id, attempt=attempt_log.attempt, fencing_token=attempt_log.fencing_token,
        stream=line.stream, level=line.level, message=line.message, at=line.at,
    )


def _reset_connection() -> None:
    """After a failed write outside a transaction: a broken connection is replaced by the
    next statement."""
    if not db.connection.in_atomic_block:
        db.connection.close_if_unusable_or_obsolete()


_shipper: LogShipper | None = None


def shipper() -> LogShipper:
    """This process's LogShipper (created on first use)."""
    global _shipper
    if _shipper is None:
        _shipper = LogShipper()
    return _shipper
