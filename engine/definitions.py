"""Workflow definition documents: parsing and validation.

A document is JSON (or YAML) of the shape::

    {"name": "etl", "description": "...",
     "tasks": [{"key": "extract", "type": "python", "config": {...},
                "depends_on": ["..."], "max_attempts": 3,
                "retry_backoff_seconds": 1.0, "timeout_seconds": 60,
                "position": {"x": 0, "y": 0},
                "priority": 0,
                "concurrency": {"key": "customer-{{ input.customer_id }}", "limit": 2},
                "rate_limit": {"key": "github", "per_second": 10}}],
     "concurrency": {"max_running_tasks": 10, "max_running_runs": 2, "policy": "queue"},
     "input_schema": {"type": "object", "properties": {"customer_id": {"type": "string"}},
                      "required": ["customer_id"]}}

``input_schema`` (issue 19, docs/api.md "Run input schemas"): a JSON Schema (Draft 2020-12)
every run input of the version must satisfy, checked here by ``engine.input_schema``.

A task's ``trigger_rule`` (one of TRIGGER_RULES, default all_success: when it runs by
its upstream outcomes) and ``condition`` (a CEL expression on ``input`` and ``upstream``,
engine.conditions: checked here, evaluated by the worker) are docs/api.md's "Trigger
rules and conditions" (issue 19).

Scheduling fields (issue 16; docs/api.md "Scheduling fields"): a task's ``priority``
(PRIORITY_MIN..PRIORITY_MAX, added to its run's), ``concurrency`` (a named key of the
organization, optionally templated from the run input, and the most task runs of this
task holding it at once), ``rate_limit`` (a named fixed-window bucket: ``per_second`` or
``per_minute``); the workflow's ``concurrency`` (``max_running_tasks``,
``max_running_runs`` and the ``policy`` for a start over the latter), counted across
every version of the name. ``render_concurrency_key`` (``engine.limit_keys``, re-exported
here) fills a key's placeholders at start.

``validate_document`` either returns a normalized copy or raises DefinitionError
listing every problem with the task (and field) it concerns. It writes nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any

import yaml

from engine import conditions, patterns, secret_refs
from engine import input_schema as input_schemas
from engine.handlers import REGISTRY, ConfigError
from engine.limit_keys import PLACEHOLDER_RE, normalize_placeholders
from engine.limit_keys import RENDERED_KEY_MAX as RENDERED_KEY_MAX  # re-exported
from engine.limit_keys import placeholders as placeholders  # re-exported
from engine.limit_keys import render_concurrency_key as render_concurrency_key  # re-exported

# Priorities of tasks and runs (the CHECK constraints' range), re-exported.
from engine.states import PRIORITY_MAX as PRIORITY_MAX
from engine.states import PRIORITY_MIN as PRIORITY_MIN
from engine.states import priority_problem
from flowforge.jsonb import strip_nul

# Anchored with \Z, not $: "$" also matches before a final newline, so "etl\n" passed.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")
KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
KEY_FORM = "1-100 letters, digits, '_', '-' or '.'"  # what KEY_RE accepts, for error messages
TASK_FIELDS = {
    "key", "type", "config", "depends_on", "max_attempts", "retry_backoff_seconds", "timeout_seconds",
    "position", "edge_labels", "priority", "concurrency", "rate_limit", "trigger_rule", "condition",
}
# A task's trigger_rule (engine.states.TriggerRule, the CHECK task_trigger_rule_valid;
# this module is imported without the app registry, so the names are written here and
# tests/unit/test_trigger_rules.py checks they agree).
TRIGGER_RULES = ("all_success", "all_failed", "all_done", "one_failed", "one_success", "none_failed", "always")
DEFAULT_TRIGGER_RULE = "all_success"
DOC_FIELDS = {"name", "description", "tasks", "timeout_seconds", "concurrency", "input_schema"}

# Concurrency and rate-limit keys: the text outside placeholders, and the whole key as
# written (Task.concurrency_key / rate_key hold 200 characters).
LIMIT_KEY_CHARS_RE = re.compile(r"^[A-Za-z0-9_.:-]*\Z")
LIMIT_KEY_FORM = "letters, digits, '_', '.', ':' or '-'"
LIMIT_KEY_MAX = 200
# Placeholders and their rendering (PLACEHOLDER_RE, RENDERED_KEY_MAX, placeholders,
# render_concurrency_key) live in engine.limit_keys, which cron triggers use too.
CONCURRENCY_FIELDS = {"key", "limit"}
RATE_LIMIT_FIELDS = {"key", "per_second", "per_minute"}
RATE_WINDOWS = {"per_second": 1, "per_minute": 60}
WORKFLOW_CONCURRENCY_FIELDS = {"max_running_tasks", "max_running_runs", "policy"}
RUN_LIMIT_POLICIES = ("queue", "cancel_newest", "cancel_oldest")  # engine.models.RunLimitPolicy
MAX_TASKS = 5000
# Problems listed in one DefinitionError; past it one more entry says how many were left out
# (a document can hold tens of thousands of bad references, and the answer stays small).
MAX_ERRORS_LISTED = 200
MAX_ATTEMPTS_LIMIT = 100
# Longest task attempt (timeout_seconds) and run (the workflow's timeout_seconds): 30 and
# 365 days. Beyond them a timestamp of PostgreSQL's range would be computed from them.
MAX_TASK_TIMEOUT_SECONDS = 30 * 24 * 3600
MAX_RUN_TIMEOUT_SECONDS = 365 * 24 * 3600
# Longest delay before a retry (retry_backoff_seconds, and the delay it doubles to with
# each attempt: the doubling stops here): one day.
MAX_RETRY_BACKOFF_SECONDS = 24 * 3600
MAX_LABEL_LENGTH = 100  # TaskDependency.label
MAX_DESCRIPTION_LENGTH = 10_000
# Canvas coordinates are stored as PostgreSQL integers.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class DefinitionError(ValueError):
    """A definition was rejected. ``errors`` is a list of {"path", "message"}; ``path``
    names the task (``tasks[extract].config``) or field where the problem is."""

    def __init__(self, errors: list[dict[str, str]]):
        if len(errors) > MAX_ERRORS_LISTED:
            left_out = len(errors) - MAX_ERRORS_LISTED
            errors = errors[:MAX_ERRORS_LISTED] + [
                {"path": "document", "message": f"{left_out} more problem{'s' if left_out != 1 else ''} not listed"}
            ]
        self.errors = errors
        super().__init__("; ".join(f"{e['path']}: {e['message']}" for e in errors))


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (YAML would keep the last)
    and any alias (``*name``): a few hundred bytes of nested aliases expand to gigabytes
    ("billion laughs"), and a definition has no need of them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a workflow definition", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in keys:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


# Largest definition document accepted, in characters.
MAX_DOCUMENT_CHARS = 1024 * 1024


def parse_document(text: str, *, filename: str = "") -> dict[str, Any]:
    """Parse a JSON or YAML document (YAML when ``filename`` ends in .yaml/.yml or the
    text is not JSON). Raises DefinitionError with the line of a syntax error, for a
    document over MAX_DOCUMENT_CHARS, one nested too deeply, or YAML aliases."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise DefinitionError([{"path": "document", "message": f"larger than {MAX_DOCUMENT_CHARS} characters"}])
    try:
        return _parse_document(text, filename=filename)
    except RecursionError:
        raise DefinitionError([{"path": "document", "message": "nested too deeply"}]) from None


def _parse_document(text: str, *, filename: str = "") -> dict[str, Any]:
    is_yaml = filename.endswith((".yaml", ".yml"))
    if not is_yaml:
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicates)
        except _DuplicateKey as exc:
            raise DefinitionError([{"path": "document", "message": f"duplicate key {exc.args[0]!r} in an object"}]) from exc
        except json.JSONDecodeError as exc:
            if filename.endswith(".json"):
                raise DefinitionError(
                    [{"path": "document", "message": f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"}]
                ) from exc
            is_yaml = True
    if is_yaml:
        try:
            doc = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError as exc:
            raise DefinitionError([{"path": "document", "message": f"invalid YAML: {exc}"}]) from exc
    if not isinstance(doc, dict):
        raise DefinitionError([{"path": "document", "message": "a definition must be an object with name and tasks"}])
    return doc


def _find_cycle(keys: list[str], deps: dict[str, list[str]]) -> list[str] | None:
    """Return the keys of one cycle in order (first key repeated at the end), or None.

    An iterative depth-first search: O(tasks + dependencies), no recursion (a chain of
    MAX_TASKS tasks needs no raised recursion limit, which is process-wide state).
    Dependencies naming no key in ``keys`` are ignored.
    """
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(keys, WHITE)
    for root in keys:
        if color[root] != WHITE:
            continue
        color[root] = GREY
        path = [root]  # the grey keys, in order
        where = {root: 0}  # a grey key's place on path, to cut the cycle out in O(1)
        todo = [iter(deps.get(root, ()))]
        while todo:
            for d in todo[-1]:
                state = color.get(d)
                if state == GREY:
                    return path[where[d]:] + [d]
                if state == WHITE:
                    color[d] = GREY
                    where[d] = len(path)
                    path.append(d)
                    todo.append(iter(deps.get(d, ())))
                    break
            else:  # every dependency of path[-1] is done
                todo.pop()
                done = path.pop()
                del where[done]
                color[done] = BLACK
    return None


def _number(errors, path, value, *, minimum, integer=False, allow_none=False, maximum=None, unit=""):
    """``value`` checked against ``minimum``/``maximum``, or None after appending the
    error. ``integer``: a JSON integer only (as run starts and triggers take a
    priority): a float is refused even when whole (``2.0``), as are a bool and a string."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        errors.append({"path": path, "message": f"must be {'a whole number' if integer else 'a number'}, got {value!r}"})
        return None
    if not math.isfinite(value):
        errors.append({"path": path, "message": f"must be a finite number, got {value!r}"})
        return None
    if value < minimum:
        errors.append({"path": path, "message": f"must be at least {minimum}, got {value!r}"})
        return None
    if maximum is not None and value > maximum:
        errors.append({"path": path, "message": f"must be at most {maximum}{unit}, got {value!r}"})
        return None
    return int(value) if integer else float(value)


def _limit_key(errors, path, value, *, placeholders: bool) -> str | None:
    """Check a concurrency or rate-limit key: a string of 1..LIMIT_KEY_MAX characters,
    LIMIT_KEY_FORM outside placeholders, and (``placeholders``) any number of
    ``{{ input.<dotted path> }}``. Returns it with each placeholder written
    ``{{ input.<path> }}`` (``limit_keys.normalize_placeholders``: spellings of one key
    compare, store and render as one; the length counted is this form's), or None after
    appending the error."""
    if value is None or value == "":
        errors.append({"path": path, "message": f"required: a name of 1-{LIMIT_KEY_MAX} {LIMIT_KEY_FORM}"})
        return None
    if not isinstance(value, str):
        errors.append({"path": path, "message": f"must be a string, got {value!r}"})
        return None
    written = value
    if placeholders:
        value = normalize_placeholders(value)
    if len(value) > LIMIT_KEY_MAX:
        note = " (each placeholder counted as {{ input.<path> }})" if value != written else ""
        errors.append({"path": path, "message": f"at most {LIMIT_KEY_MAX} characters{note}, got {len(value)}"})
        return None
    literal = PLACEHOLDER_RE.sub("", value) if placeholders else value
    if "{" in literal or "}" in literal:
        if placeholders:
            message = (f"{value!r}: a placeholder must be {{{{ input.<dotted path> }}}}, e.g. "
                       "{{ input.customer_id }}; nothing else may stand between the braces")
        else:
            message = f"{value!r}: placeholders are not allowed in a rate-limit key"
        errors.append({"path": path, "message": message})
        return None
    if not LIMIT_KEY_CHARS_RE.match(literal):
        bad = sorted({c for c in literal if not LIMIT_KEY_CHARS_RE.match(c)})
        errors.append({"path": path, "message": f"{value!r}: {''.join(bad)!r} not allowed; use {LIMIT_KEY_FORM}"})
        return None
    return value


def _unknown_fields(errors, path, value: dict, allowed: set[str]) -> None:
    for extra in sorted(set(value) - allowed, key=str):
        errors.append({"path": f"{path}.{extra}", "message": f"unknown field; allowed: {', '.join(sorted(allowed))}"})


def _task_concurrency(errors, where: str, raw: Any) -> dict[str, Any] | None:
    """A task's ``concurrency`` as {"key", "limit"}, or None (absent or invalid)."""
    if raw is None:
        return None
    path = f"{where}.concurrency"
    if not isinstance(raw, dict):
        errors.append({"path": path, "message": 'must be an object {"key": "<name>", "limit": <n>}'})
        return None
    _unknown_fields(errors, path, raw, CONCURRENCY_FIELDS)
    key = _limit_key(errors, f"{path}.key", raw.get("key"), placeholders=True)
    if "limit" not in raw or raw["limit"] is None:
        # Seed 001's trap: a key without a limit must not silently limit nothing.
        errors.append({"path": f"{path}.limit", "message": "required: the most task runs holding the key at once "
                       "(a whole number, at least 1); a key without a limit is unconfigured"})
        return None
    limit = _number(errors, f"{path}.limit", raw["limit"], minimum=1, integer=True, maximum=INT32_MAX)
    if key is None or limit is None:
        return None
    return {"key": key, "limit": limit}


def _task_rate_limit(errors, where: str, raw: Any) -> dict[str, Any] | None:
    """A task's ``rate_limit`` as {"key", "per_second" | "per_minute"}, or None."""
    if raw is None:
        return None
    path = f"{where}.rate_limit"
    if not isinstance(raw, dict):
        errors.append({"path": path, "message": 'must be an object {"key": "<name>", "per_second": <n>} '
                       'or {"key": "<name>", "per_minute": <n>}'})
        return None
    _unknown_fields(errors, path, raw, RATE_LIMIT_FIELDS)
    key = _limit_key(errors, f"{path}.key", raw.get("key"), placeholders=False)
    given = [w for w in RATE_WINDOWS if raw.get(w) is not None]
    if len(given) != 1:
        errors.append({"path": path, "message": "give exactly one of per_second or per_minute"
                       + (", not both" if len(given) == 2 else "")})
        return None
    window = given[0]
    limit = _number(errors, f"{path}.{window}", raw[window], minimum=1, integer=True, maximum=INT32_MAX)
    if key is None or limit is None:
        return None
    return {"key": key, window: limit}


def _workflow_concurrency(errors, raw: Any) -> dict[str, Any] | None:
    """The workflow's ``concurrency`` block, normalized: the limits given, and ``policy``
    (default queue). None when absent or empty."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errors.append({"path": "concurrency", "message": "must be an object with max_running_tasks, "
                       "max_running_runs and policy (each optional)"})
        return None
    _unknown_fields(errors, "concurrency", raw, WORKFLOW_CONCURRENCY_FIELDS)
    out: dict[str, Any] = {}
    for name in ("max_running_tasks", "max_running_runs"):
        if raw.get(name) is not None:
            value = _number(errors, f"concurrency.{name}", raw[name], minimum=1, integer=True, maximum=INT32_MAX)
            if value is not None:
                out[name] = value
    policy = raw.get("policy", "queue")
    if policy is None:
        policy = "queue"
    if policy not in RUN_LIMIT_POLICIES:
        errors.append({"path": "concurrency.policy",
                       "message": f"must be one of {', '.join(RUN_LIMIT_POLICIES)}, got {policy!r}"})
        return None
    if policy != "queue" and raw.get("max_running_runs") is None:
        # A policy decides a start over max_running_runs; without that limit cancel_* would
        # silently do nothing. (queue, the default, states what happens anyway, and every
        # normalized document carries it: stored versions re-validate on restore.)
        errors.append({"path": "concurrency.policy",
                       "message": f"policy applies only with max_running_runs; {policy!r} without it would do nothing"})
        return None
    if not out and "policy" not in raw:
        return None
    out["policy"] = policy
    return out


def dependency_limits() -> tuple[int, int]:
    """(dependencies per task, dependencies per workflow) allowed: the settings
    FLOWFORGE_MAX_DEPENDENCIES_PER_TASK and FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW."""
    from django.conf import settings

    return (int(getattr(settings, "FLOWFORGE_MAX_DEPENDENCIES_PER_TASK", 1000)),
            int(getattr(settings, "FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW", 50_000)))


def _json_type(value: Any) -> str:
    """The JSON type of ``value`` in words (boolean, number, array, object, null)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def validate_document(doc: Any, *, new: bool = True) -> dict[str, Any]:
    """Validate a parsed definition and return its normalized form.

    Rejects, naming the task and the problem: a missing or malformed name, an
    empty workflow, more than MAX_TASKS tasks, duplicate task keys, a task listing more
    dependencies than FLOWFORGE_MAX_DEPENDENCIES_PER_TASK, a workflow with more than
    FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW in total, an unknown dependency, a
    self-dependency, a cycle (listing the keys on it), an unknown type, a config
    that the type rejects, and bad scheduling fields (a priority outside
    PRIORITY_MIN..PRIORITY_MAX, a concurrency or rate limit below 1; any of these,
    max_attempts or a workflow limit not a JSON integer: a float, even ``2.0``, a bool or
    a string; a concurrency key without a limit, a key with characters outside
    LIMIT_KEY_FORM (a trailing newline included) or a placeholder other than
    ``{{ input.<dotted path> }}``, a rate limit with both or neither of per_second and
    per_minute, an unknown field in any of these objects, one concurrency key with two
    limits, or one rate key with two limits for the same window, in one document (placeholders compared in their one written form: ``{{input.x}}`` is
    ``{{ input.x }}``), a run-limit policy other than queue, cancel_newest or
    cancel_oldest, or cancel_* without max_running_runs), a trigger_rule not in
    TRIGGER_RULES or on a task without dependencies, a condition that
    ``engine.conditions.check`` refuses (a CEL syntax error, an unknown variable or
    function, ``upstream.<key>`` naming a task it does not depend on, over
    MAX_CONDITION_CHARS or MAX_CONDITION_DEPTH) or past MAX_CONDITION_CHARS_PER_WORKFLOW
    distinct characters of conditions, each at ``tasks[<key>].trigger_rule`` or
    ``tasks[<key>].condition``, and an ``input_schema`` that
    ``engine.input_schema.check_schema`` refuses (not Draft 2020-12, over its size or depth,
    a reference leaving the document, a pattern RE2 cannot run, a default its own schema
    refuses; each named by its path, ``input_schema.properties.x.type``). Raises DefinitionError with
    the problems found (at most MAX_ERRORS_LISTED of them, then how many more).

    Concurrency keys are returned (and so stored) with their placeholders written
    ``{{ input.<path> }}``.

    Secret references (``{{ secrets.NAME }}``, engine.secret_refs) may stand in any string
    of a task's config; a malformed one is refused naming its field path
    (``tasks[fetch].config.headers.Authorization``). ``new`` (a definition about to be
    stored; False when a stored version is re-validated, as restore does) adds the rules
    for new definitions only (``TaskHandler.check_new_config``: an http task's credential
    header must reference a secret, not hold a literal value). Whether each referenced
    secret exists is not checked here (``engine.services.check_definition`` does).

    The patterns of its conditions and input schema share one compile budget
    (``engine.patterns.definition_budget``: MAX_DEFINITION_INSTRUCTIONS in all).

    Time is linear in the size of the document (tasks + dependencies + configs): every
    membership test is a set or dict lookup, and the cycle search visits each edge once.
    """
    with patterns.definition_budget():
        return _validate_document(doc, new=new)


def _validate_document(doc: Any, *, new: bool) -> dict[str, Any]:
    """``validate_document`` inside its patterns' budget."""
    per_task_limit, per_workflow_limit = dependency_limits()
    edge_count = 0
    errors: list[dict[str, str]] = []
    if not isinstance(doc, dict):
        raise DefinitionError([{"path": "document", "message": "a definition must be an object with name and tasks"}])
    for extra in sorted(set(doc) - DOC_FIELDS):
        errors.append({"path": extra, "message": f"unknown field; allowed: {', '.join(sorted(DOC_FIELDS))}"})
    name = doc.get("name")
    if name is None or name == "":
        errors.append({"path": "name", "message": "required: the workflow's name"})
    elif not isinstance(name, str):
        # YAML reads yes/no/on/off/true as a boolean and 1.10 as a number: say so, not just "True".
        errors.append({"path": "name", "message": f"must be text, not a {_json_type(name)} ({name!r}); in YAML, "
                                                  "quote a name such as 'yes' or '1.10'"})
    elif not NAME_RE.match(name):
        errors.append({"path": "name", "message": f"{name!r}: use 1-200 letters, digits, '_', '-' or '.', starting with a letter or digit"})
    description = doc.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        errors.append({"path": "description", "message": "must be a string"})
        description = ""
    elif len(description) > MAX_DESCRIPTION_LENGTH:
        errors.append({"path": "description", "message": f"at most {MAX_DESCRIPTION_LENGTH} characters"})
    run_timeout = _number(errors, "timeout_seconds", doc.get("timeout_seconds"), minimum=0.001, allow_none=True,
                          maximum=MAX_RUN_TIMEOUT_SECONDS, unit=" (365 days)")
    tasks = doc.get("tasks")
    if tasks is not None and not isinstance(tasks, list):
        errors.append({"path": "tasks", "message": f"must be a list of tasks, got {type(tasks).__name__}"})
        raise DefinitionError(errors)
    if not tasks:
        errors.append({"path": "tasks", "message": "a workflow needs at least one task"})
        raise DefinitionError(errors)
    if len(tasks) > MAX_TASKS:
        errors.append({"path": "tasks", "message": f"at most {MAX_TASKS} tasks, got {len(tasks)}"})
        raise DefinitionError(errors)

    workflow_concurrency = _workflow_concurrency(errors, doc.get("concurrency"))
    # The run input's JSON Schema (issue 19; engine.input_schema): problems named by their
    # path in it (input_schema.properties.x.type). Stored as written.
    schema = doc.get("input_schema")
    if schema is not None:
        errors.extend(input_schemas.check_schema(schema))
    normalized: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    # key (placeholders normalized, so two spellings of one key meet) -> (first task, its limit)
    concurrency_limits: dict[str, tuple[str, int]] = {}
    # (rate key, window) -> (the first task naming it, its limit): one bucket, one limit.
    rate_limits: dict[tuple[str, str], tuple[str, int]] = {}
    # Distinct condition texts and their characters (MAX_CONDITION_CHARS_PER_WORKFLOW).
    seen_conditions: set[str] = set()
    condition_chars = 0
    for i, raw in enumerate(tasks):
        where = f"tasks[{i}]"
        if not isinstance(raw, dict):
            errors.append({"path": where, "message": "each task must be an object"})
            continue
        key = raw.get("key")
        if key is None or key == "":
            errors.append({"path": f"{where}.key", "message": f"required: {KEY_FORM}"})
            continue
        if not isinstance(key, str) or not KEY_RE.match(key):
            errors.append({"path": f"{where}.key", "message": f"{key!r} is not a valid key: use {KEY_FORM}"})
            continue
        where = f"tasks[{key}]"
        if key in seen:
            errors.append({"path": where, "message": f"duplicate task key {key!r} (tasks {seen[key]} and {i})"})
            continue
        seen[key] = i
        for extra in sorted(set(raw) - TASK_FIELDS):
            errors.append({"path": f"{where}.{extra}", "message": f"unknown field; allowed: {', '.join(sorted(TASK_FIELDS))}"})
        type_name = raw.get("type")
        config = raw.get("config", {})
        if config is None:
            config = {}
        if not isinstance(config, dict):
            errors.append({"path": f"{where}.config", "message": "must be an object"})
            config = {}
        if type_name not in REGISTRY:
            errors.append({
                "path": f"{where}.type",
                "message": f"unknown task type {type_name!r}; known types: {', '.join(sorted(REGISTRY))}",
            })
        else:
            try:
                config = REGISTRY[type_name].validate_config(config)
            except ConfigError as exc:
                errors.append({"path": f"{where}.config", "message": f"{type_name} task: {exc}"})
            else:
                if new:
                    for field, message in REGISTRY[type_name].check_new_config(config):
                        errors.append({"path": f"{where}.config.{field}", "message": message})
        # Secret references ({{ secrets.NAME }}) in any string of any config: a malformed
        # one is an error naming its field. Whether each name exists is the apply's check
        # (engine.services: it needs the organization).
        secret_refs.find_references(config, f"{where}.config", errors=errors)
        depends_on = raw.get("depends_on", [])
        if isinstance(depends_on, str):
            depends_on = [depends_on]
        if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
            errors.append({"path": f"{where}.depends_on", "message": "must be a list of task keys"})
            depends_on = []
        too_many = len(depends_on) > per_task_limit
        if too_many:
            errors.append({
                "path": f"{where}.depends_on",
                "message": f"task {key!r} lists {len(depends_on)} dependencies; at most {per_task_limit} "
                "per task (FLOWFORGE_MAX_DEPENDENCIES_PER_TASK)",
            })
            depends_on = []  # not looked at further: one error says it all
        for dep, times in Counter(depends_on).items():  # one pass (list.count per key was quadratic)
            if times > 1:
                errors.append({
                    "path": f"{where}.depends_on",
                    "message": f"lists dependency {dep!r} {'twice' if times == 2 else f'{times} times'}",
                })
        edge_count += len(depends_on)
        max_attempts = _number(errors, f"{where}.max_attempts", raw.get("max_attempts", 1), minimum=1, integer=True)
        if max_attempts is not None and max_attempts > MAX_ATTEMPTS_LIMIT:
            errors.append({"path": f"{where}.max_attempts", "message": f"at most {MAX_ATTEMPTS_LIMIT}"})
        backoff = _number(errors, f"{where}.retry_backoff_seconds", raw.get("retry_backoff_seconds", 1.0), minimum=0,
                          maximum=MAX_RETRY_BACKOFF_SECONDS, unit=" (a day)")
        timeout = _number(errors, f"{where}.timeout_seconds", raw.get("timeout_seconds"), minimum=0.001, allow_none=True,
                          maximum=MAX_TASK_TIMEOUT_SECONDS, unit=" (30 days)")
        priority = raw.get("priority", 0)
        if (problem := priority_problem(priority)) is not None:
            errors.append({"path": f"{where}.priority", "message": problem})
            priority = None
        concurrency = _task_concurrency(errors, where, raw.get("concurrency"))
        if concurrency is not None:
            first = concurrency_limits.setdefault(concurrency["key"], (key, concurrency["limit"]))
            if first[1] != concurrency["limit"]:
                errors.append({
                    "path": f"{where}.concurrency.limit",
                    "message": f"key {concurrency['key']!r} has limit {first[1]} in task {first[0]!r}; "
                    "one key has one limit within a workflow",
                })
        rate_limit = _task_rate_limit(errors, where, raw.get("rate_limit"))
        if rate_limit is not None:
            window = next(w for w in RATE_WINDOWS if w in rate_limit)
            first = rate_limits.setdefault((rate_limit["key"], window), (key, rate_limit[window]))
            if first[1] != rate_limit[window]:
                errors.append({
                    "path": f"{where}.rate_limit.{window}",
                    "message": f"key {rate_limit['key']!r} has {window} {first[1]} in task {first[0]!r}; "
                    "one key has one limit per window within a workflow (its tasks share one bucket)",
                })
        trigger_rule = raw.get("trigger_rule")
        if trigger_rule is None:
            trigger_rule = DEFAULT_TRIGGER_RULE
        if trigger_rule not in TRIGGER_RULES:
            errors.append({"path": f"{where}.trigger_rule",
                           "message": f"unknown trigger rule {trigger_rule!r}; one of {', '.join(TRIGGER_RULES)}"})
            trigger_rule = DEFAULT_TRIGGER_RULE
        elif trigger_rule != DEFAULT_TRIGGER_RULE and not depends_on and not too_many:
            errors.append({"path": f"{where}.trigger_rule",
                           "message": f"{trigger_rule!r} needs depends_on: a trigger rule decides by the "
                           "outcomes of the task's dependencies, and a task without any starts with its run"})
        condition = raw.get("condition")
        if condition == "":  # none, as a task without a condition reads back (its API shape)
            condition = None
        if isinstance(condition, str) and condition not in seen_conditions:
            seen_conditions.add(condition)
            condition_chars += len(condition)
        if condition is not None and condition_chars > conditions.MAX_CONDITION_CHARS_PER_WORKFLOW:
            errors.append({"path": f"{where}.condition",
                           "message": f"the workflow's distinct conditions hold more than "
                           f"{conditions.MAX_CONDITION_CHARS_PER_WORKFLOW} characters in all"})
            condition = None
        if condition is not None:
            problem = conditions.check(condition, dependencies=depends_on)
            if problem is not None:
                errors.append({"path": f"{where}.condition", "message": problem})
                condition = None
        position = raw.get("position")
        if position is not None and not (
            isinstance(position, dict)
            and all(
                isinstance(position.get(a), int)
                and not isinstance(position.get(a), bool)
                and INT32_MIN <= position[a] <= INT32_MAX
                for a in ("x", "y")
            )
        ):
            errors.append({
                "path": f"{where}.position",
                "message": f"must be {{\"x\": int, \"y\": int}} with each between {INT32_MIN} and {INT32_MAX}",
            })
            position = None
        edge_labels = raw.get("edge_labels", {})
        if not isinstance(edge_labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in edge_labels.items()
        ):
            errors.append({"path": f"{where}.edge_labels", "message": "must map a dependency key to a label"})
            edge_labels = {}
        if too_many:  # reported above; its labels are not looked at either
            edge_labels = {}
        for dep, label in edge_labels.items():
            if len(label) > MAX_LABEL_LENGTH:
                errors.append({
                    "path": f"{where}.edge_labels",
                    "message": f"label of {dep!r} is {len(label)} characters; at most {MAX_LABEL_LENGTH}",
                })
        try:
            json.dumps(config, allow_nan=False)
        except ValueError:
            errors.append({"path": f"{where}.config", "message": "contains NaN or Infinity, which JSON cannot store"})
        task = {
            "key": key,
            "type": type_name,
            "config": config,
            "depends_on": list(depends_on),
            "max_attempts": max_attempts or 1,
            "retry_backoff_seconds": backoff if backoff is not None else 1.0,
            "timeout_seconds": timeout,
        }
        # Set only when given (like position): a document without them normalizes, and
        # is stored, as before they existed.
        if priority:
            task["priority"] = priority
        if concurrency is not None:
            task["concurrency"] = concurrency
        if rate_limit is not None:
            task["rate_limit"] = rate_limit
        if trigger_rule != DEFAULT_TRIGGER_RULE:
            task["trigger_rule"] = trigger_rule
        if condition is not None:
            task["condition"] = condition
        if position is not None:
            task["position"] = {"x": position["x"], "y": position["y"]}
        if edge_labels:
            task["edge_labels"] = dict(edge_labels)
        normalized.append(task)

    if edge_count > per_workflow_limit:
        errors.append({
            "path": "tasks",
            "message": f"the workflow lists {edge_count} dependencies in total; at most {per_workflow_limit} "
            "(FLOWFORGE_MAX_DEPENDENCIES_PER_WORKFLOW)",
        })
    keys = [t["key"] for t in normalized]
    known = set(keys)
    for t in normalized:
        for d in t["depends_on"]:
            if d == t["key"]:
                errors.append({"path": f"tasks[{t['key']}].depends_on", "message": "a task cannot depend on itself"})
            elif d not in known and d not in seen:
                errors.append({"path": f"tasks[{t['key']}].depends_on", "message": f"unknown dependency {d!r}"})
        labels = t.get("edge_labels", {})
        if labels:
            listed = set(t["depends_on"])
            for label_key in labels:
                if label_key not in listed:
                    errors.append({"path": f"tasks[{t['key']}].edge_labels",
                                   "message": f"{label_key!r} is not a dependency"})
    # A concurrency key's {{ input.<path> }} that no input the schema accepts can have:
    # every start of the version would be refused, so the definition is (issue 16).
    if isinstance(schema, dict) and not any(e["path"].startswith("input_schema") for e in errors):
        for t in normalized:
            template = (t.get("concurrency") or {}).get("key") or ""
            for field_path in placeholders(template):
                reason = input_schemas.field_cannot_exist(schema, field_path)
                if reason is not None:
                    errors.append({"path": f"tasks[{t['key']}].concurrency.key",
                                   "message": f"{{{{ input.{field_path} }}}} can never be filled: {reason}"})
    if not errors:
        cycle = _find_cycle(keys, {t["key"]: [d for d in t["depends_on"] if d != t["key"]] for t in normalized})
        if cycle:
            errors.append({"path": "tasks", "message": f"dependency cycle: {' -> '.join(cycle)}"})
    if errors:
        raise DefinitionError(errors)
    # NULs cannot be stored in text or jsonb columns (seed 001): strip them from every string.
    out = {"name": name, "description": description, "tasks": normalized}
    if run_timeout is not None:
        out["timeout_seconds"] = run_timeout
    if workflow_concurrency is not None:
        out["concurrency"] = workflow_concurrency
    if schema is not None:
        out["input_schema"] = schema
    return strip_nul(out)
