"""Helpers of the SDK's tests: a deterministic, recording Backoff and a worker run in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flowforge_sdk import Backoff, Worker


class RecordingBackoff(Backoff):
    """A Backoff without jitter (each delay is its ceiling) that records the delays it gave."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(rng=lambda: 1.0, **kwargs)
        self.delays: list[float] = []

    def next_delay(self, *, retry_after: float | None = None) -> float:
        delay = super().next_delay(retry_after=retry_after)
        self.delays.append(delay)
        return delay

    def copy(self) -> RecordingBackoff:
        return self  # one shared record of every delay


class RunningWorker:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # noqa: B036 (handed to the test)
            self.error = exc

    def join(self, timeout: float = 15.0) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


@contextmanager
def running(worker: Worker) -> Iterator[RunningWorker]:
    """Run ``worker.run()`` in a thread; at the end stop it and make sure it returned."""
    runner = RunningWorker(worker)
    runner.thread.start()
    try:
        yield runner
    finally:
        worker.stop()
        assert runner.join(20), "the worker did not stop"
