"""flowforge.stack.Stack.stop_all: a graceful stop lets processes handle SIGTERM; a
non-graceful one (tests' teardown) kills each process group at once, children included."""

from __future__ import annotations

import os
import sys
import time

from flowforge.stack import Stack

# A parent that ignores SIGTERM and a child (same process group) that ignores it too.
STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pid = os.fork()\n"
    "print(pid if pid else os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)
# Exits 3 on SIGTERM: what a graceful stop relies on.
POLITE = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _child_pid(log) -> int:
    for _ in range(100):
        text = log.read_text() if log.exists() else ""
        if text.strip():
            return int(text.split()[0])
        time.sleep(0.05)
    raise AssertionError("the child never printed its pid")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of a dead parent is reaped by init; a zombie still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:  # reaped in between
        return False


def test_a_non_graceful_stop_kills_each_group_at_once_children_included(tmp_path):
    stack = Stack(env=dict(os.environ), log_dir=tmp_path)
    proc = stack.start("stubborn", [sys.executable, "-c", STUBBORN])
    child = _child_pid(proc.log_path)
    began = time.monotonic()
    stack.stop_all(graceful=False)
    assert time.monotonic() - began < 5  # not the 15 s a graceful stop would wait for it
    assert proc.popen.returncode == -9  # SIGKILL, not a handled SIGTERM
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_graceful_stop_lets_the_process_handle_sigterm(tmp_path):
    stack = Stack(env=dict(os.environ), log_dir=tmp_path)
    proc = stack.start("polite", [sys.executable, "-c", POLITE])
    for _ in range(200):
        if proc.log_path.read_text().strip() == "ready":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the process never installed its SIGTERM handler")
    stack.stop_all()
    assert proc.popen.returncode == 3
