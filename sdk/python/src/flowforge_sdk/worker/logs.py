"""Log lines of a held task, buffered and sent in batches through the logs endpoint
(``POST /worker/tasks/<id>/logs``, at most 100 lines a call, 4,000 characters a line).

A handler's ``ctx.log(...)`` only appends to the task's LogBuffer. The worker's flusher
thread sends what is buffered every ``log_flush_interval_seconds`` (sooner when a batch
is full), and the task's own thread sends the rest before it reports the result, since
after the completion the token is stale and lines would be refused.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from flowforge_sdk.client import LOG_LEVELS, MAX_LOG_LINES_PER_CALL, MAX_LOG_MESSAGE_CHARS, WorkerAPI
from flowforge_sdk.errors import PayloadTooLarge, ValidationError

logger = logging.getLogger("flowforge_sdk.worker")

#: Lines kept per task while the server cannot be reached; later ones are counted and dropped.
MAX_BUFFERED_LINES = 10_000


class LogBuffer:
    """The unsent log lines of one task generation (``task_run_id``, ``fencing_token``).
    Thread-safe: handlers add, the flusher and the task's thread send, one at a time."""

    def __init__(self, task_run_id: str, fencing_token: int, *, max_buffered: int = MAX_BUFFERED_LINES) -> None:
        self.task_run_id = task_run_id
        self.fencing_token = fencing_token
        self._max = max_buffered
        self._lines: deque[dict[str, str]] = deque()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one sender at a time keeps the lines in order
        self.dropped = 0
        self.sent = 0

    def add(self, level: str, message: str) -> bool:
        """Buffer one line (``message`` cut to 4,000 characters). Returns True when a
        whole batch is waiting (time to wake the flusher). ValueError for an unknown level."""
        if level not in LOG_LEVELS:
            raise ValueError(f"level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        text = str(message)
        if len(text) > MAX_LOG_MESSAGE_CHARS:
            text = text[: MAX_LOG_MESSAGE_CHARS - 1] + "…"
        with self._lock:
            if len(self._lines) >= self._max:
                self.dropped += 1
                return True
            self._lines.append({"level": level, "message": text})
            return len(self._lines) >= MAX_LOG_LINES_PER_CALL

    def pending(self) -> int:
        with self._lock:
            return len(self._lines)

    def flush(self, api: WorkerAPI) -> int:
        """Send every buffered line, 100 per call; returns how many were sent.

        A failed call leaves its lines buffered and raises its error (NetworkError,
        ServerError, RateLimited, Conflict…), except a 400 or 413 about the lines: that
        batch is dropped (logged locally) so one bad line cannot block the others."""
        sent = 0
        with self._send_lock:
            while True:
                with self._lock:
                    if self.dropped and len(self._lines) < self._max:
                        self._lines.append({"level": "warning", "message": f"{self.dropped} log lines were dropped: "
                                            "the worker could not send them in time"})
                        self.dropped = 0
                    batch = [self._lines[i] for i in range(min(len(self._lines), MAX_LOG_LINES_PER_CALL))]
                if not batch:
                    return sent
                try:
                    api.logs(self.task_run_id, self.fencing_token, batch)
                except (ValidationError, PayloadTooLarge) as exc:
                    logger.warning("task run %s: %d log lines refused by the server (%s); dropped", self.task_run_id,
                                   len(batch), exc)
                with self._lock:
                    for _ in batch:  # only this sender removes lines, and only from the front
                        self._lines.popleft()
                sent += len(batch)
                self.sent += len(batch)
