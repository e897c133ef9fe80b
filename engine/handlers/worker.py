"""The ``worker`` task type: a task run by the organization's own worker processes, which
take it from a queue of the organization over the REST API (docs/workers.md, issue 18).

Only its config is validated here. The shared Dramatiq workers never run it: a worker
task run carries its queue (``core_taskrun.queue``), the shared claim takes only rows of
the queue ``''``, and the organization's workers claim theirs through
``engine.repositories.worker_queues``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.handlers.base import ConfigError, PermanentTaskError, TaskContext, TaskHandler, reject_unknown
from flowforge.jsonb import stored_bytes

#: A queue's and a handler name's form: 1-64 letters, digits, '_', '-' or '.', starting with
#: a letter or digit (``\Z``, not ``$``: a trailing newline is not part of a name).
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
QUEUE_NAME_FORM = "1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"
#: Bytes of JSON text a worker task's ``input`` may hold.
MAX_INPUT_BYTES = 64 * 1024


def valid_queue_name(value: Any) -> bool:
    """True when ``value`` is a string of QUEUE_NAME_FORM."""
    return isinstance(value, str) and QUEUE_NAME_RE.match(value) is not None


class WorkerHandler(TaskHandler):
    type_name = "worker"
    description = (
        "Runs in the organization's own worker processes: waits on `queue` until a worker "
        "takes it over the API (docs/workers.md), which runs its handler `name` (default: the "
        "task's key) with `input`."
    )

    def validate_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Normalize ``{"queue": str, "name": str?, "input": object?}``; raise ConfigError
        naming the field for a missing or malformed queue, a malformed name, an input that
        is not an object or is over MAX_INPUT_BYTES of JSON text, or an unknown field."""
        reject_unknown(config, {"queue", "name", "input"})
        queue = config.get("queue")
        if queue is None or queue == "":
            raise ConfigError(f"'queue' is required: the queue your workers poll ({QUEUE_NAME_FORM})")
        if not valid_queue_name(queue):
            raise ConfigError(f"'queue' {str(queue)[:80]!r} is not a queue name: use {QUEUE_NAME_FORM}")
        out: dict[str, Any] = {"queue": queue}
        if config.get("name") is not None:
            if not valid_queue_name(config["name"]):
                raise ConfigError(f"'name' {str(config['name'])[:80]!r} is not a handler name: use {QUEUE_NAME_FORM}")
            out["name"] = config["name"]
        if config.get("input") is not None:
            value = config["input"]
            if not isinstance(value, dict):
                raise ConfigError(f"'input' must be an object, got {type(value).__name__}")
            try:
                size = stored_bytes(json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":")))
            except ValueError as exc:
                raise ConfigError("'input' contains NaN or Infinity, which JSON cannot store") from exc
            if size > MAX_INPUT_BYTES:
                raise ConfigError(f"'input' is {size} bytes of JSON; at most {MAX_INPUT_BYTES}")
            out["input"] = value
        return out

    def run(self, context: TaskContext) -> Any:
        # Never reached through the engine (the shared claim skips worker queues); a
        # message that names one anyway is refused rather than run here.
        raise PermanentTaskError(
            f"task {context.task_key!r} runs on queue {context.config.get('queue')!r} of the "
            "organization's own workers, not in the shared workers"
        )
