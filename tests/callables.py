"""Task callables of the test suite, registered in tests/settings.py only (never in a
deployment's FLOWFORGE_TASK_CALLABLES)."""

from __future__ import annotations


def echo(input, upstream, factor=1, context=None):
    """Return what a python task receives: the run input, the upstream outputs, the
    ``factor`` param and the attempt number (from the injected TaskContext)."""
    return {"input": input, "upstream": upstream, "factor": factor, "attempt": context.attempt}
