"""The log flusher thread: sends the buffered log lines of every held task every
``interval`` seconds, and at once when a handler filled a batch of 100."""

from __future__ import annotations

import logging
import threading

from flowforge_sdk.client import WorkerAPI
from flowforge_sdk.errors import Conflict, NotFound
from flowforge_sdk.worker.held import HeldTasks

logger = logging.getLogger("flowforge_sdk.worker")


class LogFlusher(threading.Thread):
    """Flushes every held task's LogBuffer until ``stop()``. A send that fails keeps its
    lines for the next round; a 409 or 404 marks the task lost, as a heartbeat's would."""

    def __init__(self, api: WorkerAPI, held: HeldTasks, *, interval: float) -> None:
        super().__init__(name="flowforge-logs", daemon=True)
        self._api = api
        self._held = held
        self._interval = interval
        self._stop_event = threading.Event()
        self._wake = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush_all()

    def flush_all(self) -> None:
        for held in self._held.snapshot():
            if held.finished or held.ctx.cancelled or not held.logs.pending():
                continue
            try:
                held.logs.flush(self._api)
            except (Conflict, NotFound) as exc:
                reason = (exc.code or "conflict") if isinstance(exc, Conflict) else "not_found"
                if not held.finished and held.ctx._mark_lost(reason):
                    logger.warning("task %s: the server took it back (%s); its result will be dropped",
                                   held.describe(), reason)
            except Exception as exc:  # down, throttled: the lines wait for the next round
                logger.debug("task %s: log lines not sent yet (%s)", held.describe(), exc)
