"""The built-in task types: noop, sleep, fail, python."""

from __future__ import annotations

import inspect
from typing import Any

from engine.handlers import callables
from engine.handlers.base import (
    ConfigError,
    PermanentTaskError,
    TaskContext,
    TaskHandler,
    reject_unknown,
    require_number,
)


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
            context.raise_if_lease_lost()
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


# Longest callable name accepted (it is echoed in errors, so an absurd one is refused unread).
MAX_CALLABLE_NAME = 255


class PythonHandler(TaskHandler):
    type_name = "python"
    description = (
        "Calls a registered task callable (FLOWFORGE_TASK_CALLABLES, by full dotted name) as "
        "fn(input, upstream, **params); a `context` parameter, if the function declares one, "
        "receives the TaskContext."
    )

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        reject_unknown(config, {"callable", "params"})
        path = config.get("callable")
        if not isinstance(path, str) or not path:
            raise ConfigError("'callable' is required: the full dotted name of a registered task callable")
        if len(path) > MAX_CALLABLE_NAME:
            raise ConfigError(f"'callable' is {len(path)} characters long; at most {MAX_CALLABLE_NAME}")
        # Membership of the exact name only: nothing is imported on a request's behalf.
        if callables.lookup(path) is None:
            raise ConfigError(
                f"'callable' {path!r} is not a registered task callable; the deployment's operator "
                f"registers functions by full dotted name in FLOWFORGE_TASK_CALLABLES"
            )
        params = config.get("params", {})
        if not isinstance(params, dict):
            raise ConfigError("'params' must be an object")
        return {"callable": path, "params": params}

    def run(self, context: TaskContext) -> Any:
        path = context.config["callable"]
        fn = callables.lookup(path)  # the registry may have shrunk since the definition was stored
        if fn is None:
            raise PermanentTaskError(
                f"'callable' {path!r} is no longer a registered task callable (FLOWFORGE_TASK_CALLABLES)"
            )
        kwargs = dict(context.config.get("params") or {})
        if "context" in inspect.signature(fn).parameters:
            kwargs["context"] = context
        return fn(context.input, context.upstream, **kwargs)
