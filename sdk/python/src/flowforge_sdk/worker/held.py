"""The tasks a worker holds, and its slots: a task is held from the poll that handed it
out until its result is reported (or dropped), and each held task takes one of the
worker's ``concurrency`` slots. The poll asks for at most the free slots."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flowforge_sdk.models import WorkerTask
from flowforge_sdk.worker.context import TaskContext
from flowforge_sdk.worker.logs import LogBuffer


@dataclass(eq=False)
class HeldTask:
    """One task generation this worker owns (until the server says otherwise)."""

    task: WorkerTask
    ctx: TaskContext
    logs: LogBuffer
    #: time.monotonic() at which the next heartbeat is due.
    next_heartbeat_at: float = field(default_factory=time.monotonic)
    #: Seconds of lease the server last gave (the poll's, then each heartbeat's answer); None: not said.
    lease_seconds: float | None = None
    heartbeat_failures: int = 0
    #: Set once the result was reported (or dropped): heartbeats stop, a 409 is expected.
    finished: bool = False

    @property
    def task_run_id(self) -> str:
        return self.task.task_run_id

    @property
    def generation(self) -> tuple[str, int]:
        """(task run id, fencing token): a task run handed out again (its lease ran out while
        this worker was cut off) is a new generation, held apart from the old one."""
        return (self.task.task_run_id, self.task.fencing_token)

    def describe(self) -> str:
        """``<task key> (task run <id>, attempt n)`` for log messages: ids only, never input."""
        return f"{self.task.task_key or self.task.name} (task run {self.task_run_id}, attempt {self.task.attempt})"


class HeldTasks:
    """The held tasks by generation and the slot count, under one condition.

    The condition's lock is reentrant: the worker's signal handler, which runs in the
    main thread between two bytecodes, may take it while the main thread holds it.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("concurrency must be at least 1")
        self.capacity = capacity
        self.cond = threading.Condition(threading.RLock())
        self._tasks: dict[tuple[str, int], HeldTask] = {}
        #: The most tasks held at once so far (for the curious, and for tests).
        self.most_held = 0

    def __len__(self) -> int:
        with self.cond:
            return len(self._tasks)

    def free(self) -> int:
        """Slots not taken by a held task."""
        with self.cond:
            return max(0, self.capacity - len(self._tasks))

    def add(self, held: HeldTask) -> None:
        with self.cond:
            self._tasks[held.generation] = held
            self.most_held = max(self.most_held, len(self._tasks))

    def remove(self, held: HeldTask) -> None:
        """Free the task's slot and wake whoever waits for one."""
        with self.cond:
            if self._tasks.get(held.generation) is held:
                del self._tasks[held.generation]
            self.cond.notify_all()

    def snapshot(self) -> list[HeldTask]:
        with self.cond:
            return list(self._tasks.values())

    def wait_for_free_slot(self, *, stop: Callable[[], bool]) -> int:
        """Block until a slot is free or ``stop()`` is true; returns the free slots (0 when stopping)."""
        with self.cond:
            while not stop():
                free = self.capacity - len(self._tasks)
                if free > 0:
                    return free
                self.cond.wait(0.5)
            return 0

    def wait_until_empty(self, *, deadline: float | None, force: Callable[[], bool]) -> bool:
        """Block until no task is held (True), ``deadline`` (time.monotonic()) passes or
        ``force()`` is true (False)."""
        with self.cond:
            while self._tasks:
                if force():
                    return False
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True
