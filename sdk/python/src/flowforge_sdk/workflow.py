"""Code-first workflows: build a DAG in Python, get the definition document the server
accepts (docs/api.md "Workflows", the same JSON as the files in ``examples/``).

    wf = Workflow("thumbnails", description="Fetch, resize, publish.")
    fetch = wf.http_task("fetch", "https://example.com/images.json")
    resize = wf.worker_task("resize", queue="images", input={"width": 640}, depends_on=[fetch],
                            max_attempts=3, retry_backoff_seconds=2)
    wf.sleep("settle", 0.5, depends_on=[resize])
    client.workflows.apply(wf)          # POST /workflows/: the next version of "thumbnails"

Only what is cheap is checked here (names and keys, duplicate keys, unknown and
circular dependencies, JSON-ness), with DefinitionError naming the task and field as
the server would; the server validates everything else and is the authority.
Fields are written only when given, so ``to_document()`` is the smallest document
that says what was asked.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from flowforge_sdk.errors import DefinitionError

# The server's forms (engine/definitions.py, docs/workers.md), anchored with \Z.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")
KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
WORKER_INPUT_MAX_BYTES = 64 * 1024


class TaskRef:
    """A task added to a Workflow: pass it in another task's ``depends_on`` (or
    ``edge_labels``). ``str(ref)`` is its key."""

    __slots__ = ("key", "type", "_workflow")

    def __init__(self, key: str, type: str, workflow: Workflow) -> None:
        self.key = key
        self.type = type
        self._workflow = workflow

    def __repr__(self) -> str:
        return f"TaskRef({self.key!r}, type={self.type!r})"

    def __str__(self) -> str:
        return self.key


Dependency = TaskRef | str


class Workflow:
    """A workflow definition built in code. ``to_document()`` is the JSON document of
    ``POST /workflows/``; ``client.workflows.apply(workflow)`` stores it as the next
    version of its name.

    ``timeout_seconds`` bounds a whole run; ``concurrency`` is the workflow's
    ``{"max_running_tasks", "max_running_runs", "policy"}`` block (docs/api.md);
    ``input_schema`` is a JSON Schema (Draft 2020-12) every run input must satisfy (the
    server checks it: docs/api.md, "Run input schemas").
    """

    def __init__(self, name: str, *, description: str = "", timeout_seconds: float | None = None,
                 concurrency: Mapping[str, Any] | None = None,
                 input_schema: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise DefinitionError([{"path": "name", "message": f"{name!r}: use 1-200 letters, digits, '_', '-' or "
                                    "'.', starting with a letter or digit"}])
        self.name = name
        self.description = description
        self.timeout_seconds = timeout_seconds
        self.concurrency = dict(concurrency) if concurrency is not None else None
        self.input_schema = dict(input_schema) if input_schema is not None else None
        self._tasks: dict[str, dict[str, Any]] = {}
        self._refs: dict[str, TaskRef] = {}

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, tasks={list(self._tasks)})"

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, key: object) -> bool:
        return (key.key if isinstance(key, TaskRef) else key) in self._tasks

    @property
    def tasks(self) -> list[TaskRef]:
        """The tasks added so far, in order."""
        return list(self._refs.values())

    def __getitem__(self, key: str) -> TaskRef:
        return self._refs[key]

    # --- adding tasks ---------------------------------------------------------------------

    def task(self, key: str, type: str, *, config: Mapping[str, Any] | None = None,
             depends_on: Dependency | Iterable[Dependency] | None = None, max_attempts: int | None = None,
             retry_backoff_seconds: float | None = None, timeout_seconds: float | None = None,
             priority: int | None = None, concurrency: Mapping[str, Any] | None = None,
             rate_limit: Mapping[str, Any] | None = None, position: tuple[int, int] | Mapping[str, int] | None = None,
             edge_labels: Mapping[Dependency, str] | None = None) -> TaskRef:
        """Add a task of any ``type`` (``noop``, ``sleep``, ``fail``, ``http``, ``python``,
        ``worker``…) with its ``config``; returns its handle for ``depends_on``.

        ``depends_on``: TaskRefs of this workflow or task keys (a key may name a task
        added later). ``max_attempts``, ``retry_backoff_seconds`` (attempt n is retried
        after backoff × 2^(n−1) s), ``timeout_seconds`` (one attempt), ``priority``
        (−10 to 10), ``concurrency`` (``{"key", "limit"}``), ``rate_limit`` (``{"key",
        "per_second" | "per_minute"}``), ``position`` (``(x, y)`` on the canvas) and
        ``edge_labels`` (dependency → label) are written only when given.

        Raises DefinitionError for a malformed or duplicate key, a dependency on
        itself or on another Workflow's task.
        """
        where = f"tasks[{key}]"
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise DefinitionError([{"path": f"tasks[{key!r}].key", "message": f"{key!r} is not a valid key: use "
                                    "1-100 letters, digits, '_', '-' or '.', starting with a letter or digit"}])
        if key in self._tasks:
            raise DefinitionError([{"path": where, "message": f"duplicate task key {key!r}"}])
        if not isinstance(type, str) or not type:
            raise DefinitionError([{"path": f"{where}.type", "message": "required: the task's type"}])
        deps = self._dependency_keys(where, depends_on)
        if key in deps:
            raise DefinitionError([{"path": f"{where}.depends_on", "message": "a task cannot depend on itself"}])
        task: dict[str, Any] = {"key": key, "type": type}
        if config:
            task["config"] = _plain(config)
        if deps:
            task["depends_on"] = deps
        for field, value in (("max_attempts", max_attempts), ("retry_backoff_seconds", retry_backoff_seconds),
                             ("timeout_seconds", timeout_seconds), ("priority", priority)):
            if value is not None:
                _check_number(where, field, value, integer=field in ("max_attempts", "priority"))
                task[field] = value
        if concurrency is not None:
            task["concurrency"] = dict(concurrency)
        if rate_limit is not None:
            task["rate_limit"] = dict(rate_limit)
        if position is not None:
            if isinstance(position, Mapping):
                task["position"] = {"x": position["x"], "y": position["y"]}
            else:
                x, y = position
                task["position"] = {"x": x, "y": y}
        if edge_labels:
            labels = {self._dependency_key(f"{where}.edge_labels", dep): label for dep, label in edge_labels.items()}
            not_deps = [d for d in labels if d not in deps]
            if not_deps:
                raise DefinitionError([{"path": f"{where}.edge_labels",
                                        "message": f"{not_deps[0]!r} is not a dependency"}])
            task["edge_labels"] = labels
        self._tasks[key] = task
        ref = TaskRef(key, type, self)
        self._refs[key] = ref
        return ref

    def worker_task(self, key: str, queue: str, *, name: str | None = None, input: Mapping[str, Any] | None = None,
                    depends_on: Dependency | Iterable[Dependency] | None = None, max_attempts: int | None = None,
                    retry_backoff_seconds: float | None = None, timeout_seconds: float | None = None,
                    priority: int | None = None, concurrency: Mapping[str, Any] | None = None,
                    rate_limit: Mapping[str, Any] | None = None,
                    position: tuple[int, int] | Mapping[str, int] | None = None,
                    edge_labels: Mapping[Dependency, str] | None = None) -> TaskRef:
        """A ``worker`` task: it waits on your organization's ``queue`` until one of your
        workers takes it; ``name`` is the handler the worker runs (default: the key),
        ``input`` the JSON object handed to it (64 KiB at most; strings may reference
        secrets as ``{{ secrets.NAME }}``). docs/workers.md."""
        where = f"tasks[{key}].config"
        if not isinstance(queue, str) or not QUEUE_RE.match(queue):
            raise DefinitionError([{"path": f"{where}.queue", "message": f"{queue!r}: use 1-64 letters, digits, "
                                    "'_', '-' or '.', starting with a letter or digit"}])
        config: dict[str, Any] = {"queue": queue}
        if name is not None:
            if not isinstance(name, str) or not QUEUE_RE.match(name):
                raise DefinitionError([{"path": f"{where}.name", "message": f"{name!r}: use 1-64 letters, digits, "
                                        "'_', '-' or '.', starting with a letter or digit"}])
            config["name"] = name
        if input is not None:
            if not isinstance(input, Mapping):
                raise DefinitionError([{"path": f"{where}.input", "message": "must be a JSON object (a mapping)"}])
            config["input"] = dict(input)
            size = len(_json(f"{where}.input", config["input"]).encode())
            if size > WORKER_INPUT_MAX_BYTES:
                raise DefinitionError([{"path": f"{where}.input", "message": f"is {size} bytes of JSON; at most "
                                        f"{WORKER_INPUT_MAX_BYTES}"}])
        return self.task(key, "worker", config=config, depends_on=depends_on, max_attempts=max_attempts,
                         retry_backoff_seconds=retry_backoff_seconds, timeout_seconds=timeout_seconds,
                         priority=priority, concurrency=concurrency, rate_limit=rate_limit, position=position,
                         edge_labels=edge_labels)

    def http_task(self, key: str, url: str, *, method: str | None = None, headers: Mapping[str, str] | None = None,
                  json: Any = None, expected_status: int | list[int] | None = None,
                  request_timeout_seconds: float | None = None,
                  depends_on: Dependency | Iterable[Dependency] | None = None, max_attempts: int | None = None,
                  retry_backoff_seconds: float | None = None, timeout_seconds: float | None = None,
                  priority: int | None = None, concurrency: Mapping[str, Any] | None = None,
                  rate_limit: Mapping[str, Any] | None = None,
                  position: tuple[int, int] | Mapping[str, int] | None = None,
                  edge_labels: Mapping[Dependency, str] | None = None) -> TaskRef:
        """An ``http`` task: one request from FlowForge's workers (``method`` default GET,
        ``headers``, a ``json`` body, ``expected_status``, ``request_timeout_seconds``
        — the config's ``timeout_seconds``; the task's own ``timeout_seconds`` bounds the
        attempt). Header values may reference secrets as ``{{ secrets.NAME }}``."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise DefinitionError([{"path": f"tasks[{key}].config.url",
                                    "message": f"must be an absolute http(s) URL, got {url!r}"}])
        config: dict[str, Any] = {"url": url}
        if method is not None:
            config["method"] = method
        if headers is not None:
            config["headers"] = dict(headers)
        if json is not None:
            config["json"] = json
        if expected_status is not None:
            config["expected_status"] = expected_status
        if request_timeout_seconds is not None:
            config["timeout_seconds"] = request_timeout_seconds
        return self.task(key, "http", config=config, depends_on=depends_on, max_attempts=max_attempts,
                         retry_backoff_seconds=retry_backoff_seconds, timeout_seconds=timeout_seconds,
                         priority=priority, concurrency=concurrency, rate_limit=rate_limit, position=position,
                         edge_labels=edge_labels)

    def noop(self, key: str, *, depends_on: Dependency | Iterable[Dependency] | None = None,
             max_attempts: int | None = None, retry_backoff_seconds: float | None = None,
             timeout_seconds: float | None = None, priority: int | None = None,
             position: tuple[int, int] | Mapping[str, int] | None = None,
             edge_labels: Mapping[Dependency, str] | None = None) -> TaskRef:
        """A ``noop`` task: succeeds at once (a join point, a start marker)."""
        return self.task(key, "noop", depends_on=depends_on, max_attempts=max_attempts,
                         retry_backoff_seconds=retry_backoff_seconds, timeout_seconds=timeout_seconds,
                         priority=priority, position=position, edge_labels=edge_labels)

    def sleep(self, key: str, seconds: float, *, depends_on: Dependency | Iterable[Dependency] | None = None,
              max_attempts: int | None = None, retry_backoff_seconds: float | None = None,
              timeout_seconds: float | None = None, priority: int | None = None,
              position: tuple[int, int] | Mapping[str, int] | None = None,
              edge_labels: Mapping[Dependency, str] | None = None) -> TaskRef:
        """A ``sleep`` task: waits ``seconds``, then succeeds."""
        _check_number(f"tasks[{key}].config", "seconds", seconds)
        return self.task(key, "sleep", config={"seconds": seconds}, depends_on=depends_on,
                         max_attempts=max_attempts, retry_backoff_seconds=retry_backoff_seconds,
                         timeout_seconds=timeout_seconds, priority=priority, position=position,
                         edge_labels=edge_labels)

    # --- the document -----------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        """The definition document (a new dict each time): ``name``, ``description`` when
        set, ``tasks`` in the order added, ``timeout_seconds``, ``concurrency`` and
        ``input_schema`` when set.

        Raises DefinitionError when the workflow has no task, a dependency names no task
        of the workflow, the dependencies form a cycle, or a value is not JSON."""
        if not self._tasks:
            raise DefinitionError([{"path": "tasks", "message": "a workflow needs at least one task"}])
        errors: list[dict[str, str]] = []
        for key, task in self._tasks.items():
            for dep in task.get("depends_on", []):
                if dep not in self._tasks:
                    errors.append({"path": f"tasks[{key}].depends_on", "message": f"unknown dependency {dep!r}"})
        if errors:
            raise DefinitionError(errors)
        cycle = _find_cycle({key: task.get("depends_on", []) for key, task in self._tasks.items()})
        if cycle:
            raise DefinitionError([{"path": "tasks", "message": f"dependency cycle: {' -> '.join(cycle)}"}])
        doc: dict[str, Any] = {"name": self.name}
        if self.description:
            doc["description"] = self.description
        doc["tasks"] = [_plain(task) for task in self._tasks.values()]
        if self.timeout_seconds is not None:
            doc["timeout_seconds"] = self.timeout_seconds
        if self.concurrency is not None:
            doc["concurrency"] = dict(self.concurrency)
        if self.input_schema is not None:
            _json("input_schema", self.input_schema)
            doc["input_schema"] = dict(self.input_schema)
        for task in doc["tasks"]:
            _json(f"tasks[{task['key']}]", task)
        return doc

    def to_json(self, *, indent: int | None = 2) -> str:
        """``to_document()`` as JSON text."""
        return json.dumps(self.to_document(), indent=indent, allow_nan=False)

    # --- helpers ----------------------------------------------------------------------------

    def _dependency_key(self, path: str, dep: Dependency) -> str:
        if isinstance(dep, TaskRef):
            if dep._workflow is not self:
                raise DefinitionError([{"path": path, "message": f"task {dep.key!r} belongs to workflow "
                                        f"{dep._workflow.name!r}, not {self.name!r}"}])
            return dep.key
        if isinstance(dep, str) and dep:
            return dep
        raise DefinitionError([{"path": path, "message": f"a dependency is a TaskRef or a task key, got {dep!r}"}])

    def _dependency_keys(self, where: str, depends_on: Dependency | Iterable[Dependency] | None) -> list[str]:
        if depends_on is None:
            return []
        items: Iterable[Dependency] = [depends_on] if isinstance(depends_on, TaskRef | str) else depends_on
        keys: list[str] = []
        for dep in items:
            key = self._dependency_key(f"{where}.depends_on", dep)
            if key in keys:
                raise DefinitionError([{"path": f"{where}.depends_on", "message": f"lists dependency {key!r} twice"}])
            keys.append(key)
        return keys


def _check_number(where: str, field: str, value: Any, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (isinstance(value, float) and not math.isfinite(value)):
        wanted = "a whole number" if integer else "a finite number"
        raise DefinitionError([{"path": f"{where}.{field}", "message": f"must be {wanted}, got {value!r}"}])


def _plain(value: Any) -> Any:
    """A deep copy made of dicts and lists (Mappings and tuples converted)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json(path: str, value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DefinitionError([{"path": path, "message": f"is not JSON: {exc}"}]) from None


def _find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    """The keys of one dependency cycle (first key repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in deps:
        if state.get(root):
            continue
        path = [root]
        stack = [iter(deps.get(root, []))]
        state[root] = 1
        while stack:
            for dep in stack[-1]:
                if state.get(dep) == 1:
                    return path[path.index(dep):] + [dep]
                if not state.get(dep):
                    state[dep] = 1
                    path.append(dep)
                    stack.append(iter(deps.get(dep, [])))
                    break
            else:
                stack.pop()
                state[path.pop()] = 2
    return None
