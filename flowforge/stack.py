"""Start and stop FlowForge's processes: web, Dramatiq workers, clock.

Used by ``make run`` / ``make demo`` (``flowforge/devstack.py``) and by the integration
tests, so both exercise the same commands a deployment runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def bin_path(name: str) -> str:
    """Path of a console script installed beside the running interpreter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


@dataclass
class Proc:
    """One started process (its own process group, so a stop reaches its children)."""

    name: str
    popen: subprocess.Popen
    log_path: Path | None = None
    _terminated: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        """SIGTERM the main process once (gunicorn's and dramatiq's masters stop their own
        children gracefully, letting in-flight tasks finish); a second SIGTERM is not sent
        (dramatiq would take it as a hurry)."""
        if self.alive() and not self._terminated:
            self._terminated = True
            try:
                os.kill(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, *, timeout: float = 15.0) -> int | None:
        """``terminate``, then SIGKILL the whole group after ``timeout`` seconds. Returns
        the exit code."""
        if self.alive():
            self.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group (gone already: nothing)."""
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group at once, and wait for its leader (10 s at most)."""
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class Stack:
    """A set of started processes sharing one environment."""

    env: dict[str, str]
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        """Start ``argv`` with this stack's environment (plus ``env``, if given); output goes
        to log_dir/name.log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                argv, cwd=BASE_DIR, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc = Proc(name=name, popen=popen, log_path=log_path)
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str = "worker", *, processes: int = 2, threads: int = 8) -> Proc:
        """Start ``dramatiq flowforge.worker`` with ``processes`` worker processes of ``threads`` threads.

        Each process holds at most ``threads`` messages (``dramatiq_queue_prefetch``, unless
        the environment sets it): with Dramatiq's default of twice that, one process takes
        queued slow tasks its threads cannot start while the other process's threads idle
        (12 tasks of 10 s on 2 x 8 threads took 20 s instead of 10)."""
        env = {} if "dramatiq_queue_prefetch" in self.env else {"dramatiq_queue_prefetch": str(threads)}
        return self.start(
            name,
            [bin_path("dramatiq"), "flowforge.worker", "--processes", str(processes), "--threads", str(threads),
             "--worker-shutdown-timeout", "10000"],
            env=env,
        )

    def start_clock(self, name: str = "clock") -> Proc:
        return self.start(name, [sys.executable, "manage.py", "run_clock"])

    def start_web(self, name: str = "web", *, bind: str = "127.0.0.1:8000") -> Proc:
        """Start gunicorn: 2 processes of 24 threads; at most 12 of each process's threads may
        hold event streams (FLOWFORGE_SSE_PER_PROCESS) and 6 workers' long polls
        (FLOWFORGE_WORKER_POLLS_PER_PROCESS), unless the environment sets them, so 6 stay for
        ordinary requests."""
        env = {} if "FLOWFORGE_SSE_PER_PROCESS" in self.env else {"FLOWFORGE_SSE_PER_PROCESS": "12"}
        return self.start(
            name,
            # Threaded workers: a live run page or an event stream holds its thread for minutes.
            [bin_path("gunicorn"), "flowforge.wsgi", "--bind", bind, "--workers", "2", "--worker-class", "gthread",
             "--threads", "24"],  # no access log: Django's request log redacts invitation tokens
            env=env,
        )

    def stop_all(self, *, timeout: float = 15.0, graceful: bool = True) -> None:
        """SIGTERM every process at once, then wait for each (SIGKILL for the groups still up
        ``timeout`` seconds after): they stop side by side, not one after another (a
        test's teardown took 4-6 s of graceful stops in a row).

        ``graceful=False`` SIGKILLs every group at once instead (a test's teardown, once
        the test has asserted what it needed): a Dramatiq worker's graceful stop takes 2-3 s
        of one-second sleeps in its main loop, and no test after it looks at what an
        in-flight task of a finished test would have done. What a kill leaves behind is
        what a crash leaves: the next test flushes the broker's keys and the database."""
        if not graceful:
            for proc in reversed(self.procs):
                proc.signal_group(signal.SIGKILL)  # the group: also children a dead leader left behind
            for proc in reversed(self.procs):
                proc.kill()  # (already sent: waits for it)
            return
        for proc in reversed(self.procs):
            proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in reversed(self.procs):
            proc.stop(timeout=max(0.5, deadline - time.monotonic()))

    def print_logs(self, *, lines: int = 60) -> None:
        """Print the last ``lines`` of each process's log (for a failed test's report)."""
        for proc in self.procs:
            if proc.log_path and proc.log_path.exists():
                print(f"==== {proc.name} log (last {lines} lines) ====")
                print("\n".join(proc.log_path.read_text(errors="replace").splitlines()[-lines:]))


def proc_stats() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, command name, the fields after the name) of each process in /proc (Linux):
    ``/proc/<pid>/stat`` split after its parenthesised name, which may hold spaces, so the
    fields count from the state (0), ppid (1) ... utime (11), stime (12). A process that
    ends while it is read is left out."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def worker_child_pids(master_pid: int) -> list[int]:
    """Pids of the worker processes a ``dramatiq`` master forked (read from /proc)."""
    return sorted(pid for pid, _name, fields in proc_stats() if int(fields[1]) == master_pid)


def wait_until(predicate, *, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate()`` until it returns a truthy value (returned) or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
