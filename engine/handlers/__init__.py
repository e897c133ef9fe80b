"""Task types by name. A definition's ``type`` must be one of ``REGISTRY``."""

from __future__ import annotations

from engine.handlers.base import ConfigError, LeaseLost, PermanentTaskError, TaskContext, TaskHandler
from engine.handlers.builtin import FailHandler, NoopHandler, PythonHandler, SleepHandler
from engine.handlers.http import HttpHandler
from engine.handlers.worker import WorkerHandler

REGISTRY: dict[str, TaskHandler] = {
    h.type_name: h for h in (NoopHandler(), SleepHandler(), FailHandler(), PythonHandler(), HttpHandler(), WorkerHandler())
}


def get_handler(type_name: str) -> TaskHandler:
    """Return the handler of ``type_name``; raise KeyError naming the known types."""
    try:
        return REGISTRY[type_name]
    except KeyError:
        raise KeyError(f"unknown task type {type_name!r}; known types: {', '.join(sorted(REGISTRY))}") from None


__all__ = ["REGISTRY", "ConfigError", "PermanentTaskError", "LeaseLost", "TaskContext", "TaskHandler", "get_handler"]
