"""The built-in task types: noop, sleep, fail, python."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from django.conf import settings

from engine.handlers.base import ConfigError, TaskContext, TaskHandler, reject_unknown, require_number


class NoopHandler(TaskHandler):
    type_name = "noop"
    description = "Does nothing and succeeds; output is null."

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, set())
        return {}

    def run(self, context: TaskContext) -> Any:
        return None


class SleepHandler(TaskHandler):
    type_name = "sleep"
    description = "Waits `seconds` (interrupted if the lease is lost), then succeeds."

    # Longest sleep accepted, in seconds (a week); a task that must wait longer wants a cron trigger.
    MAX_SECONDS = 7 * 24 * 3600

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, {"seconds"})
        seconds = require_number(config, "seconds")
        if seconds > self.MAX_SECONDS:
            raise ConfigError(f"'seconds' must be at most {self.MAX_SECONDS} (a week), got {seconds}")
        return {"seconds": seconds}

    def run(self, context: TaskContext) -> Any:
        seconds = float(context.config["seconds"])
        if context.wait(seconds):
            context.raise_if_cancelled()
        return {"slept_seconds": seconds}


class FailHandler(TaskHandler):
    type_name = "fail"
    description = "Raises `message`; with `fail_attempts` N it fails N attempts and then succeeds."

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, {"message", "fail_attempts"})
        message = config.get("message", "task failed on purpose")
        if not isinstance(message, str):
            raise ConfigError("'message' must be a string")
        out: dict[str, Any] = {"message": message}
        if "fail_attempts" in config:
            n = require_number(config, "fail_attempts", minimum=0)
            if int(n) != n:
                raise ConfigError("'fail_attempts' must be a whole number")
            out["fail_attempts"] = int(n)
        return out

    def run(self, context: TaskContext) -> Any:
        limit = context.config.get("fail_attempts")
        if limit is None or context.attempt <= limit:
            raise RuntimeError(f"{context.config['message']} (attempt {context.attempt})")
        return {"succeeded_on_attempt": context.attempt}


def python_target_allowed(path: str) -> bool:
    """True when ``path`` is listed in FLOWFORGE_PYTHON_TASK_ALLOWLIST (exactly, or under a
    prefix that ends with a dot)."""
    for entry in settings.FLOWFORGE_PYTHON_TASK_ALLOWLIST:
        if path == entry or (entry.endswith(".") and path.startswith(entry)):
            return True
    return False


def resolve_callable(path: str):
    """Import ``module.attr`` and return the callable; raise ConfigError if it is not one."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"'callable' must be a dotted path like 'package.module.function', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"'callable' {path!r}: cannot import module {module_name!r} ({exc})") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"'callable' {path!r}: {module_name!r} has no callable named {attr!r}")
    return fn


class PythonHandler(TaskHandler):
    type_name = "python"
    description = (
        "Calls an allowlisted function as fn(input, upstream, **params); a `context` "
        "parameter, if the function declares one, receives the TaskContext."
    )

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, {"callable", "params"})
        path = config.get("callable")
        if not isinstance(path, str) or not path:
            raise ConfigError("'callable' is required: a dotted path to a function")
        if not python_target_allowed(path):
            raise ConfigError(
                f"'callable' {path!r} is not in FLOWFORGE_PYTHON_TASK_ALLOWLIST "
                f"({', '.join(settings.FLOWFORGE_PYTHON_TASK_ALLOWLIST) or 'empty'})"
            )
        resolve_callable(path)
        params = config.get("params", {})
        if not isinstance(params, dict):
            raise ConfigError("'params' must be an object")
        return {"callable": path, "params": params}

    def run(self, context: TaskContext) -> Any:
        path = context.config["callable"]
        if not python_target_allowed(path):  # the allowlist may have shrunk since the definition
            raise PermissionError(f"{path!r} is no longer in FLOWFORGE_PYTHON_TASK_ALLOWLIST")
        fn = resolve_callable(path)
        kwargs = dict(context.config.get("params") or {})
        if "context" in inspect.signature(fn).parameters:
            kwargs["context"] = context
        return fn(context.input, context.upstream, **kwargs)
