"""Task callables for fault injection (registered in tests/settings.py only)."""

from __future__ import annotations

import os
import signal


def kill_own_worker(input, upstream):
    """Kill the worker process running this attempt, on every attempt (SIGKILL: no
    cleanup, no completion). The task must end failed once its attempts are spent."""
    os.kill(os.getpid(), signal.SIGKILL)
