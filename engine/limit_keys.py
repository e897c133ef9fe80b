"""Concurrency keys' placeholders: their one written form, and their rendering from a run input.

A task's concurrency key may hold placeholders ``{{ input.<dotted path> }}``
(``engine.definitions`` checks the rest of the key). This module is what both the
definitions (which store each key with its placeholders in one written form, so two
spellings of one key are one key) and the runs' starters (``services.start_run``, and
``triggers``, which checks a cron trigger's input the way its firings will use it) need;
it sits below both, and imports nothing of the engine.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

# "{{ input.a.b }}": a dotted path into the run input, nothing else between the braces.
PLACEHOLDER_RE = re.compile(r"\{\{\s*input((?:\.[A-Za-z0-9_-]+)+)\s*\}\}")
# A rendered concurrency key (TaskRun.concurrency_key holds 400 characters).
RENDERED_KEY_MAX = 400
# Characters a rendered key may not take from the run input: control characters (C0, DEL,
# C1: newlines and tabs among them), the Unicode line and paragraph separators, and the
# bidirectional text controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069). A key is
# shown in wait reasons, events and pages, where these would split lines or reorder the
# text around them. Refused, not stripped: two inputs differing only by them would
# otherwise share a key's permits unseen.
FORBIDDEN_IN_KEY_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def normalize_placeholders(template: str) -> str:
    """``template`` with each placeholder written ``{{ input.<path> }}`` (one space inside
    each pair of braces): ``k-{{input.x}}`` and ``k-{{ input.x }}`` are one key."""
    return PLACEHOLDER_RE.sub(lambda m: "{{ input" + m.group(1) + " }}", template)


def placeholders(template: str) -> list[str]:
    """The dotted paths (``customer.id``) of a concurrency key's placeholders, in order."""
    return [m.group(1)[1:] for m in PLACEHOLDER_RE.finditer(template)]


def _describe(char: str) -> str:
    return f"U+{ord(char):04X} {unicodedata.name(char, 'control character')}"


def render_concurrency_key(template: str, run_input: dict[str, Any], *, task_key: str) -> str:
    """``template`` with each ``{{ input.<path> }}`` replaced by that value of the run
    input: a string as is (less NUL characters, which no stored input holds), a number or
    boolean as JSON writes it (``7``, ``2.5``, ``true``). Raises ValueError naming the task
    and the field when the path is missing, or its value is an object, an array or null,
    or a string holding a character of FORBIDDEN_IN_KEY_RE (a control character, a line
    break, a bidirectional text control), or the rendered key is empty or longer than
    RENDERED_KEY_MAX characters."""

    def value_of(match: re.Match) -> str:
        path = match.group(1)[1:]
        field = f"input.{path}"
        value: Any = run_input
        for part in path.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"task {task_key!r}: its concurrency key {template!r} needs {field}, "
                                 "which the run input does not have")
            value = value[part]
        if value is None or isinstance(value, dict | list):
            kind = "null" if value is None else "an object" if isinstance(value, dict) else "an array"
            raise ValueError(f"task {task_key!r}: its concurrency key {template!r} needs {field} to be a string, "
                             f"number or boolean, not {kind}")
        if isinstance(value, str):
            value = value.replace("\x00", "")
            bad = FORBIDDEN_IN_KEY_RE.search(value)
            if bad:
                raise ValueError(f"task {task_key!r}: its concurrency key {template!r} cannot use {field}: it holds "
                                 f"{_describe(bad.group())}; control characters, line breaks and bidirectional "
                                 "text controls are not allowed in a key")
            return value
        return json.dumps(value)

    rendered = PLACEHOLDER_RE.sub(value_of, template)
    if not rendered:
        raise ValueError(f"task {task_key!r}: its concurrency key {template!r} renders to an empty key")
    if len(rendered) > RENDERED_KEY_MAX:
        raise ValueError(f"task {task_key!r}: its concurrency key {template!r} renders to {len(rendered)} "
                         f"characters; at most {RENDERED_KEY_MAX}")
    return rendered


def render_definition_keys(definition: dict[str, Any] | None, run_input: dict[str, Any]) -> dict[str, str]:
    """{task key: its concurrency key rendered with ``run_input``} for the tasks of a stored
    (normalized) definition that have one. Raises what ``render_concurrency_key`` raises,
    for the first task (in the definition's order) whose key the input cannot fill."""
    out: dict[str, str] = {}
    for task in (definition or {}).get("tasks", ()):
        template = (task.get("concurrency") or {}).get("key")
        if template:
            out[task["key"]] = render_concurrency_key(template, run_input, task_key=task["key"])
    return out
