"""Run input schemas (issue 19): a workflow's ``input_schema``, a JSON Schema (Draft
2020-12) that every run input of the version must satisfy.

Checked at definition time (``check_schema``) and applied at every start
(``InputSchema.validate``: the API, the web form, a trigger's firing, an idempotent start,
a retry all pass through ``engine.services.start_run``). Validation is the ``jsonschema``
library's; this module only fences it in for a shared deployment, where a schema and an
input both come from a possibly hostile member:

- **No remote references.** Every ``$ref`` / ``$dynamicRef`` must point inside the
  document (start with ``#``) and resolve when the definition is stored; the referencing
  registry holds the document alone and refuses to retrieve anything (``_refuse_remote``),
  so no URL is ever fetched. ``$id`` is allowed on the root only and ``$schema`` only on
  the root, as this dialect's URI (a nested ``$schema`` would switch jsonschema to another
  draft's validator, without the guards below).
- **Size.** At most MAX_SCHEMA_BYTES of compact JSON and MAX_SCHEMA_DEPTH levels of
  nesting.
- **Regular expressions in linear time.** ``pattern`` and ``patternProperties`` run on
  RE2 (google-re2), never Python's backtracking ``re``: a pattern RE2 cannot compile
  (lookaround, backreferences), or only at a cost engine.patterns bounds (counted repeats
  expanding to more than MAX_REPEAT_COPIES copies, a program over RE2_MAX_MEM_BYTES), is
  refused at definition time; compiled patterns are kept in engine.patterns' process cache,
  so a start does not compile them again; and ``unevaluatedProperties`` is refused beside ``patternProperties`` (jsonschema evaluates that pair with ``re``).
- **A work budget.** Each keyword evaluation costs one step plus one per 256 characters
  of the value it looks at (what jsonschema may copy into a message), a reference
  REFERENCE_STEPS more; a validation over MAX_VALIDATION_STEPS stops with
  ValidationBudgetExceeded (``anyOf`` nested through references is exponential).
  ``uniqueItems`` hashes the items (jsonschema's fallback for objects compares every pair).
- **Bounded answers.** At most MAX_VIOLATIONS_LISTED violations, each message at most
  MAX_MESSAGE_CHARS characters.

Formats are asserted where jsonschema checks them without optional packages (``date``,
``email``, ``ipv4``, ``ipv6``, ``uuid``, ``regex``, ``idn-email``, ``idn-hostname``);
other formats are annotations.

**Defaults.** Before validation, each property declared under ``properties`` (of the
root, and of every object value present or defaulted, following local ``$ref``s, at most
DEFAULTS_MAX_DEPTH levels) that the input lacks is filled with a copy of its ``default``;
the run's stored input holds them. ``check_schema`` validates each such default against
its property's own schema (the input as a whole is validated after they are filled in).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import islice
from typing import Any, TypedDict

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from engine import patterns

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Largest input_schema, in characters of compact JSON, and its deepest nesting of objects
# and arrays (the root object is level 1).
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
# Work allowed for one validation of an input (and for all of a schema's definition-time
# checks together): keyword evaluations, each counted as 1 + (characters of the value it
# looks at) // 256, a reference (which resolves and descends) as REFERENCE_STEPS more.
# About half a second of CPU at most; an input of several thousand small objects fits.
MAX_VALIDATION_STEPS = 100_000
REFERENCE_STEPS = 30
# Violations listed in one refusal (then one entry says how many more), and the longest
# message of one (jsonschema's messages quote the offending value).
MAX_VIOLATIONS_LISTED = 50
MAX_MESSAGE_CHARS = 300
# Nesting followed when filling defaults (a recursive schema would otherwise fill forever).
DEFAULTS_MAX_DEPTH = 16
# Schemas compiled and kept per process (by organization and schema digest).
CACHE_SIZE = 256

# Keywords of Draft 2020-12 whose value is a schema, a list of schemas, or a map of them:
# what the definition-time walk visits (keywords outside these hold data, e.g. const,
# enum, default, examples, and are not schemas even when they look like one).
_SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "dependentSchemas")
_SCHEMA_LIST_KEYWORDS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "items", "contains", "propertyNames",
                    "not", "if", "then", "else", "unevaluatedItems")
# What may stand beside a $ref that ``InputSchema.resolve`` follows: annotations (kept, the
# referring schema's win) and definitions.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_BESIDE_A_REFERENCE = _ANNOTATIONS | {"$ref", "$defs", "$schema", "$id", "$anchor"}


class Violation(TypedDict):
    """One way an input breaks its schema: ``path`` is a JSON pointer into the input
    (``""`` for the whole input, ``/customer/id``; a missing required property's own
    pointer), ``message`` says what is wrong, ``keyword`` the schema keyword that failed."""

    path: str
    message: str
    keyword: str


class ValidationBudgetExceeded(Exception):
    """A validation needed more than MAX_VALIDATION_STEPS steps."""


@dataclass
class _Budget:
    steps_left: int
    sizes: dict[int, int] = field(default_factory=dict)  # id(container) -> characters, for the cost


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("input_schema_budget", default=None)


@contextlib.contextmanager
def _budget_for(value: Any):
    """A budget of MAX_VALIDATION_STEPS for validating ``value``, or the one already running
    (the definition-time checks share one across all their validations)."""
    running = _budget.get()
    if running is not None:
        running.sizes.update(_measure(value))
        yield running
        return
    token = _budget.set(_Budget(steps_left=MAX_VALIDATION_STEPS, sizes=_measure(value)))
    try:
        yield _budget.get()
    finally:
        _budget.reset(token)


def _path_key(pointer: str) -> tuple:
    """A JSON pointer's sort key: array indices in numeric order (``/x/2`` before ``/x/10``)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pointer.split("/"))


def _refuse_remote(uri: str):
    """The registry's retrieve hook: nothing outside the document exists (no fetch, ever)."""
    raise NoSuchResource(ref=uri)


#: Units of search cost (engine.patterns.search_cost: characters × instructions) charged as
#: one validation step: MAX_VALIDATION_STEPS steps are then at most 10,000,000 units of
#: searching all together (about 0.6 s at RE2's worst), as much as the rest of a validation.
SEARCH_UNITS_PER_STEP = 100


def _search(pattern: str, text: str) -> bool:
    """Whether RE2 finds ``pattern`` in ``text``; the compiled pattern comes from
    engine.patterns' process cache, so a start does not compile it again. The search's worst
    cost is charged to the validation's budget first (ValidationBudgetExceeded: a long text
    against a large pattern is refused before it runs). Raises PatternRefused for a pattern
    over engine.patterns' bounds (check_schema refuses those)."""
    regex = patterns.compiled(pattern)
    budget = _budget.get()
    if budget is not None:
        budget.steps_left -= patterns.search_cost(regex, text) // SEARCH_UNITS_PER_STEP
        if budget.steps_left < 0:
            raise ValidationBudgetExceeded(f"validation needed more than {MAX_VALIDATION_STEPS} steps")
    return regex.search(text) is not None


def _value_size(value: Any) -> int:
    budget = _budget.get()
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict | list):
        known = budget.sizes.get(id(value)) if budget is not None else None
        return known if known is not None else len(value)
    return 1


def _charge(instance: Any, extra: int) -> None:
    budget = _budget.get()
    if budget is None:
        return
    budget.steps_left -= 1 + extra + _value_size(instance) // 256
    if budget.steps_left < 0:
        raise ValidationBudgetExceeded(f"validation needed more than {MAX_VALIDATION_STEPS} steps")


def _measure(value: Any) -> dict[int, int]:
    """id(container) -> approximate characters of its JSON, for every object and array in
    ``value`` (iterative: no recursion limit)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, dict):
            if done:
                sizes[id(node)] = 2 + sum(len(k) + 4 + _leaf_or_known(v, sizes) for k, v in node.items())
            else:
                stack.append((node, True))
                stack.extend((v, False) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            if done:
                sizes[id(node)] = 2 + sum(1 + _leaf_or_known(v, sizes) for v in node)
            else:
                stack.append((node, True))
                stack.extend((v, False) for v in node if isinstance(v, dict | list))
    return sizes


def _leaf_or_known(value: Any, sizes: dict[int, int]) -> int:
    if isinstance(value, dict | list):
        return sizes.get(id(value), len(value))
    if isinstance(value, str):
        return len(value) + 2
    return 8


def _counted(name: str, keyword_fn):
    """A jsonschema keyword function that first charges its evaluation to the budget."""
    extra = REFERENCE_STEPS if name in ("$ref", "$dynamicRef") else 0

    def keyword(validator, value, instance, schema):
        _charge(instance, extra)
        return keyword_fn(validator, value, instance, schema)

    return keyword


def _pattern(validator, patrn, instance, schema):
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"does not match the pattern {patrn!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    """jsonschema's additionalProperties, with patternProperties matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        names = ", ".join(repr(e) for e in sorted(extras)[:20]) + (", ..." if len(extras) > 20 else "")
        yield ValidationError(f"additional properties are not allowed ({names} {'was' if len(extras) == 1 else 'were'} "
                              "unexpected)")


def _canonical(value: Any) -> Any:
    """A hashable form of a JSON value under JSON Schema's equality (1 == 1.0, true != 1,
    object key order ignored)."""
    if value is True or value is False:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z",)
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("?", repr(value))


def _unique_items(validator, unique, instance, schema):
    """uniqueItems in O(n) hashing (jsonschema's fallback for objects compares every pair)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set = set()
    for index, item in enumerate(instance):
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"has non-unique elements (item {index} repeats an earlier one)")
            return
        seen.add(key)


_OVERRIDES = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}
_Validator = validators.extend(
    Draft202012Validator,
    validators={k: _counted(k, _OVERRIDES.get(k, fn)) for k, fn in Draft202012Validator.VALIDATORS.items()},
)


def _pointer(parts) -> str:
    """A JSON pointer (RFC 6901) from path parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _dotted(parts) -> str:
    """``input_schema.properties.x.type`` / ``input_schema.allOf[0]`` from path parts."""
    out = "input_schema"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def _depth_exceeds(value: Any, limit: int) -> bool:
    """True when ``value`` nests objects/arrays more than ``limit`` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class InputSchema:
    """A checked input schema, ready to validate inputs (build it with ``compiled``).

    ``schema`` is the document as stored (its root ``$schema``, if any, is dropped for
    validation: the validator class is fixed to this module's guarded 2020-12 one).
    """

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        usable = {k: v for k, v in schema.items() if k != "$schema"}
        resource = DRAFT202012.create_resource(usable)
        self._registry = Registry(retrieve=_refuse_remote).with_resource(resource.id() or "", resource)
        self._resolver = self._registry.resolver(base_uri=resource.id() or "")
        self._validator = _Validator(usable, registry=self._registry,
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)

    # --- references --------------------------------------------------------------------------

    def lookup(self, ref: str) -> Any:
        """The subschema a document-local ``ref`` points to. Raises Unresolvable."""
        return self._resolver.lookup(ref).contents

    def resolve(self, subschema: Any, *, hops: int = 8) -> Any:
        """``subschema`` with a ``$ref`` standing alone (besides annotations such as title,
        description, default, and ``$defs``) replaced by its target, followed at most ``hops`` times; the
        referring schema's annotations win. For presenters (the start form) and defaults;
        anything unresolvable is returned as it is."""
        annotations: dict[str, Any] = {}
        for _ in range(hops):
            if not isinstance(subschema, dict) or not isinstance(subschema.get("$ref"), str):
                break
            if set(subschema) - _BESIDE_A_REFERENCE:
                break
            annotations = {k: v for k, v in subschema.items() if k in _ANNOTATIONS} | annotations
            try:
                subschema = self.lookup(subschema["$ref"])
            except Unresolvable:
                break
        if annotations and isinstance(subschema, dict):
            subschema = {**subschema, **annotations}
        return subschema

    # --- validation --------------------------------------------------------------------------

    def with_defaults(self, value: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``value`` with the declared defaults filled in (module docstring)."""
        out = copy.deepcopy(value)
        stack: list[tuple[Any, dict, int]] = [(self.schema, out, 0)]
        while stack:
            schema, target, depth = stack.pop()
            schema = self.resolve(schema)
            if depth >= DEFAULTS_MAX_DEPTH or not isinstance(schema, dict):
                continue
            properties = schema.get("properties")
            if not isinstance(properties, dict):
                continue
            for name, sub in properties.items():
                sub = self.resolve(sub)
                if not isinstance(sub, dict):
                    continue
                if name not in target and "default" in sub:
                    target[name] = copy.deepcopy(sub["default"])
                if isinstance(target.get(name), dict):
                    stack.append((sub, target[name], depth + 1))
        return out

    def violations(self, value: Any, *, schema: Any = None) -> list[Violation]:
        """Every way ``value`` breaks the schema (or ``schema``, a subschema of it), sorted
        by path: at most MAX_VIOLATIONS_LISTED, then one entry (path ``""``, keyword
        ``truncated``) saying how many more there were at least. Raises
        ValidationBudgetExceeded past MAX_VALIDATION_STEPS, RecursionError for a schema
        whose references loop without consuming the input."""
        validator = self._validator if schema is None else self._validator.evolve(schema=schema)
        with _budget_for(value):
            found = list(islice(self._iter(validator, value), MAX_VIOLATIONS_LISTED + 1))
        found.sort(key=lambda v: (_path_key(v["path"]), v["keyword"], v["message"]))
        if len(found) > MAX_VIOLATIONS_LISTED:
            found = found[:MAX_VIOLATIONS_LISTED] + [
                {"path": "", "keyword": "truncated", "message": f"more violations not listed (over {MAX_VIOLATIONS_LISTED})"}
            ]
        return found

    def _iter(self, validator, value: Any) -> Iterator[Violation]:
        seen: set[tuple[str, str]] = set()
        for error in validator.iter_errors(value):
            base = _pointer(error.absolute_path)
            if error.validator == "required" and isinstance(error.instance, dict):
                # One entry per missing property, at the property's own pointer (a form shows
                # it next to that field), once per failing `required` keyword.
                once = (base, _pointer(error.absolute_schema_path))
                if once in seen:
                    continue
                seen.add(once)
                for name in error.validator_value:
                    if name not in error.instance:
                        yield {"path": f"{base}/{_pointer([name])[1:]}", "message": "a value is required",
                               "keyword": "required"}
                continue
            yield {"path": base, "message": _short(error.message), "keyword": str(error.validator)}

    def validate(self, value: dict[str, Any]) -> tuple[dict[str, Any], list[Violation]]:
        """(``value`` with its defaults filled in, the violations of that), see ``violations``."""
        filled = self.with_defaults(value)
        return filled, self.violations(filled)


# --- definition time -------------------------------------------------------------------------


# Keywords whose effect on which fields exist field_cannot_exist does not work out: a
# schema using one on the way is taken to allow the field.
_NOT_FOLLOWED = ("$ref", "$dynamicRef", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                 "dependentSchemas", "unevaluatedProperties", "propertyNames")


def field_cannot_exist(schema: Any, path: str) -> str | None:
    """Why the dotted ``path`` (``customer.id``) can never be a field of a run input that
    ``schema`` (a valid Draft 2020-12 schema, ``check_schema``) accepts, or None when it
    can, or when the schema is too involved to tell (a keyword of _NOT_FOLLOWED on the
    way). It cannot when a schema on the way is ``false``, declares a ``type`` that is
    not "object", or lists ``properties`` without the next name and forbids others
    (``additionalProperties: false`` and no ``patternProperties``). Used for a concurrency
    key's ``{{ input.<path> }}`` at definition time: a key no run can fill is refused
    there, not at every start."""
    node = schema
    walked = "input"
    for part in path.split("."):
        if node is False:
            return f"the input_schema admits no value at {walked}"
        if not isinstance(node, dict) or any(k in node for k in _NOT_FOLLOWED):
            return None
        declared = node.get("type")
        types = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
        if types is not None and "object" not in types:
            return f"the input_schema makes {walked} {' or '.join(map(str, types))}, which has no field {part!r}"
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        if part in properties:
            node = properties[part]
            walked = f"{walked}.{part}"
            continue
        if node.get("additionalProperties") is False and not node.get("patternProperties"):
            listed = ", ".join(sorted(properties)) or "none"
            return (f"the input_schema allows no field {part!r} in {walked} "
                    f"(additionalProperties is false; its properties: {listed})")
        return None
    return None


def check_schema(schema: Any) -> list[dict[str, str]]:
    """The problems of ``schema`` as a workflow's ``input_schema``, each {"path", "message"}
    with the path in the definition (``input_schema.properties.x.type``); [] when it is
    usable. Checks, in order (later checks only once the earlier pass): a JSON object of at
    most MAX_SCHEMA_BYTES and MAX_SCHEMA_DEPTH levels; ``$schema`` absent or DIALECT; the
    Draft 2020-12 meta-schema; a root that accepts objects; every reference local and
    resolvable, ``$id`` / ``$schema`` on the root only, every pattern accepted by RE2,
    no ``unevaluatedProperties`` beside ``patternProperties``; every default that would be
    filled in valid against its property's schema; and validating an empty input
    finishing within the budget. Never fetches anything."""
    if not isinstance(schema, dict):
        return [{"path": "input_schema", "message": "must be a JSON Schema object, e.g. "
                 '{"type": "object", "properties": {"date": {"type": "string", "format": "date"}}}'}]
    if _depth_exceeds(schema, MAX_SCHEMA_DEPTH):
        return [{"path": "input_schema", "message": f"nested more than {MAX_SCHEMA_DEPTH} levels deep"}]
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
    except ValueError:
        return [{"path": "input_schema", "message": "contains NaN or Infinity, which JSON cannot hold"}]
    if size > MAX_SCHEMA_BYTES:
        return [{"path": "input_schema", "message": f"{size} characters of JSON; at most {MAX_SCHEMA_BYTES}"}]
    if "$schema" in schema and schema["$schema"] != DIALECT:
        return [{"path": "input_schema.$schema", "message": f"only JSON Schema Draft 2020-12 ({DIALECT!r}) is "
                 f"supported, got {schema['$schema']!r}; omit $schema or use that URI"}]
    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA, registry=SPECIFICATIONS)
    problems = []
    for error in meta.iter_errors(schema):
        error = best_match([error])
        problems.append({"path": _dotted(error.absolute_path), "message": _short(error.message)})
    if problems:
        return _sorted(problems)
    root_type = schema.get("type")
    if root_type is not None and "object" not in ([root_type] if isinstance(root_type, str) else root_type):
        return [{"path": "input_schema.type", "message": f"a run input is a JSON object; the root type must be "
                 f"'object', got {root_type!r}"}]
    compiled = InputSchema(schema)
    with patterns.definition_budget():  # the definition's, when validate_document opened one
        problems = _walk(compiled, schema)
    if problems:
        return _sorted(problems)
    with _budget_for({}):  # one budget for the defaults and the empty input together
        try:
            problems = _check_defaults(compiled)
            if problems:
                return _sorted(problems)
            compiled.violations({})
        except (ValidationBudgetExceeded, RecursionError):
            return [{"path": "input_schema", "message": "validating its defaults and an empty input does not "
                     f"finish within {MAX_VALIDATION_STEPS} steps (a $ref loop that consumes no input, or "
                     "anyOf/oneOf nested through references?)"}]
    return []


def _sorted(problems: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(problems, key=lambda p: (p["path"], p["message"]))


def _walk(compiled: InputSchema, root: dict[str, Any]) -> list[dict[str, str]]:
    """The reference, identifier and pattern rules over every subschema reachable from the
    root, through the applicator keywords and through references (iterative)."""
    problems: list[dict[str, str]] = []
    has = {"patternProperties": False, "unevaluatedProperties": False}
    visited: set[int] = set()
    stack: list[tuple[Any, list]] = [(root, [])]
    while stack:
        node, parts = stack.pop()
        if not isinstance(node, dict) or id(node) in visited:
            continue
        visited.add(id(node))
        here = _dotted(parts)
        for keyword in ("$id", "$schema"):
            if keyword in node and parts:
                problems.append({"path": f"{here}.{keyword}", "message": f"{keyword} is allowed on the root schema "
                                 "only (references stay inside this document)"})
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if ref is None:
                continue
            if not ref.startswith("#"):
                problems.append({"path": f"{here}.{keyword}", "message": f"{ref!r}: only references inside this "
                                 "schema are allowed (starting with '#', e.g. '#/$defs/address'); nothing is fetched"})
                continue
            try:
                target = compiled.lookup(ref)
            except Unresolvable:
                problems.append({"path": f"{here}.{keyword}", "message": f"{ref!r} points to nothing in this schema"})
                continue
            target_parts = _pointer_parts(ref)
            stack.append((target, target_parts if target_parts is not None else [*parts, f"{keyword}({ref})"]))
        if isinstance(node.get("pattern"), str):
            problems.extend(_pattern_problem(node["pattern"], f"{here}.pattern"))
        for keyword in has:
            has[keyword] = has[keyword] or keyword in node
        for keyword in _SCHEMA_MAP_KEYWORDS:
            sub = node.get(keyword)
            if isinstance(sub, dict):
                for name, child in sub.items():
                    if keyword == "patternProperties":
                        problems.extend(_pattern_problem(name, f"{here}.patternProperties"))
                    stack.append((child, [*parts, keyword, name]))
        for keyword in _SCHEMA_LIST_KEYWORDS:
            sub = node.get(keyword)
            if isinstance(sub, list):
                stack.extend((child, [*parts, keyword, i]) for i, child in enumerate(sub))
        for keyword in _SCHEMA_KEYWORDS:
            if keyword in node:
                stack.append((node[keyword], [*parts, keyword]))
    if has["patternProperties"] and has["unevaluatedProperties"]:
        problems.append({"path": "input_schema", "message": "unevaluatedProperties cannot be used in a schema that "
                         "also uses patternProperties (not supported: their evaluation is not linear-time)"})
    return problems


def _pointer_parts(ref: str) -> list | None:
    """The parts of a ``#/a/b`` reference (for error paths), or None for an anchor."""
    if ref == "#":
        return []
    if not ref.startswith("#/"):
        return None
    return [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]


def _pattern_problem(pattern: str, path: str) -> list[dict[str, str]]:
    """The pattern's refusal by engine.patterns (RE2 syntax, counted repeats over
    MAX_REPEAT_COPIES, a program over RE2_MAX_MEM_BYTES) at ``path``, or []."""
    reason = patterns.problem(pattern)
    if reason is not None:
        return [{"path": path, "message": f"{_short(repr(pattern))} is not a pattern FlowForge can run ({reason}); "
                 "patterns run on RE2: no lookaround or backreferences, counted repeats within "
                 f"{patterns.MAX_REPEAT_COPIES} copies in all"}]
    return []


def _check_defaults(compiled: InputSchema) -> list[dict[str, str]]:
    """Each default ``with_defaults`` could fill in, validated against its own schema.
    Raises what ``InputSchema.violations`` raises."""
    problems: list[dict[str, str]] = []
    stack: list[tuple[Any, list, int]] = [(compiled.schema, [], 0)]
    visited: set[int] = set()
    while stack:
        schema, parts, depth = stack.pop()
        schema = compiled.resolve(schema)
        if depth >= DEFAULTS_MAX_DEPTH or not isinstance(schema, dict) or id(schema) in visited:
            continue
        visited.add(id(schema))
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            continue
        for name, raw in properties.items():
            sub = compiled.resolve(raw)
            if not isinstance(sub, dict):
                continue
            where = [*parts, "properties", name]
            if "default" in sub:
                wrong = compiled.violations(sub["default"], schema=sub)
                for v in wrong[:5]:
                    at = f" at {v['path']}" if v["path"] else ""
                    problems.append({"path": f"{_dotted(where)}.default",
                                     "message": f"the default does not match its own schema{at}: {v['message']}"})
            stack.append((sub, where, depth + 1))
    return problems


@lru_cache(maxsize=CACHE_SIZE)
def _compiled(organization_id: str, text: str) -> InputSchema:
    return InputSchema(json.loads(text))


def compiled(schema_text: str, *, organization_id: Any) -> InputSchema:
    """The InputSchema of a stored (already checked) schema, given as its JSON text
    (``Workflow.input_schema_json``), compiled once per process for each (organization,
    text) pair: the cache key carries the organization id. Callers must not change what it
    returns."""
    return _compiled(str(organization_id), schema_text)


def check_input(schema_text: str | None, value: dict[str, Any], *,
                organization_id: Any) -> tuple[dict[str, Any], list[Violation]]:
    """(``value`` with the schema's defaults filled in, its violations) for a stored
    schema's JSON text; (``value``, []) without a schema. A validation that exceeds the
    budget, or loops, is one violation at the root saying so (never raises for the input)."""
    if not schema_text:
        return value, []
    schema = compiled(schema_text, organization_id=organization_id)
    try:
        return schema.validate(value)
    except (ValidationBudgetExceeded, RecursionError):
        return value, [{"path": "", "keyword": "budget", "message": "validating this input against the input "
                        f"schema needs more than {MAX_VALIDATION_STEPS} steps; send a smaller input"}]
    except patterns.PatternRefused as exc:  # not for a schema checked since engine.patterns' bounds
        return value, [{"path": "", "keyword": "pattern", "message": "the input schema has a pattern FlowForge "
                        f"no longer runs ({exc}); the workflow's input_schema must be applied again"}]
    except Unresolvable as exc:  # not for a checked schema (check_schema resolves every reference)
        return value, [{"path": "", "keyword": "$ref", "message": f"the input schema's reference {exc.ref!r} "
                        "points to nothing"}]


def summary(violations: list[Violation], *, limit: int = 5) -> str:
    """The first ``limit`` violations as one line: ``/a: message; /b: message (and 3 more)``."""
    shown = "; ".join(f"{v['path'] or '(input)'}: {v['message']}" for v in violations[:limit])
    more = len(violations) - limit
    return shown + (f" (and {more} more)" if more > 0 else "")

