"""Task callables of the test suite, registered in tests/settings.py only (never in a
deployment's FLOWFORGE_TASK_CALLABLES)."""

from __future__ import annotations


def echo(input, upstream, factor=1, context=None):
    """Return what a python task receives: the run input, the upstream outputs, the
    ``factor`` param and the attempt number (from the injected TaskContext)."""
    return {"input": input, "upstream": upstream, "factor": factor, "attempt": context.attempt}


def schedule_of(input, upstream, context=None):
    """Return the cron instant and data interval the run is for, as the handler's context
    holds it (``TaskContext.schedule``: ISO 8601 strings in UTC), or None for a run that
    has none."""
    return context.schedule.as_dict() if context.schedule is not None else None
