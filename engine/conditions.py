"""Task conditions: a CEL expression (Common Expression Language, as Hatchet uses) on the
run's input and the task's upstream outputs, checked when a definition is applied and
evaluated by the worker when the task's trigger rule has let it run (docs/api.md,
"Trigger rules and conditions").

A condition is evaluated with three variables:

- ``input``: the run's input (a map);
- ``upstream``: the outputs of the task's dependencies by task key, exactly as the
  handler is handed them (``TaskContext.upstream``: ``null`` for a dependency that did not
  succeed, a ``{"$ref": "task_output", ...}`` summary for one past
  FLOWFORGE_MAX_UPSTREAM_BYTES);
- ``schedule``: the cron instant the run is for (``engine.states.RunSchedule``, as the
  handler's ``context.schedule``), a map of three CEL timestamps (UTC) ``scheduled_for``,
  ``data_interval_start`` and ``data_interval_end``, or ``null`` for a run no trigger or
  backfill started. Timestamps rather than strings: they compare with ``timestamp("...")``
  and answer ``getDayOfWeek("Europe/Berlin")``, ``getHours(...)`` in any time zone, and
  ``string(t)`` gives the RFC 3339 text.

It must evaluate to a bool: ``true`` runs the task, ``false`` skips it (an event says the
condition was false) and its dependents follow their own trigger rules. Anything else
(an error such as a missing key, a value that is not a bool, a limit reached) fails the
task, without retry, naming the condition.

The library is cel-python (``celpy``: a parser and a tree-walking interpreter in Python).
Never ``eval``. ``matches()`` runs on RE2 (linear in the text) through engine.patterns,
which bounds what compiling a pattern costs (counted repeats, program size) and keeps
compiled patterns per text: a pattern written in the condition (a string literal) is
checked when the definition is applied; one that comes from the data (``input.x.matches(
input.pattern)``) is checked when it is used, and a refused one fails the task like any
other condition error. The cost of one
evaluation is bounded, because a member of any organization writes the expression and a
worker of the shared pool evaluates it:

- MAX_CONDITION_CHARS characters and MAX_CONDITION_DEPTH levels of parse tree, refused
  when the definition is applied (the depth bounds the interpreter's recursion);
- MAX_CONDITION_STEPS interpreter steps and CONDITION_TIME_LIMIT_SECONDS of wall time,
  whichever comes first (a macro such as ``exists`` over a long list counts each element);
- MAX_CONDITION_CONCAT characters, bytes or list items built by ``+`` in one evaluation
  (a doubling in a macro would otherwise claim gigabytes within the time limit);
- only CEL's standard functions and macros: cel-python's extensions (``reduce``, ``min``)
  and unknown names are refused when the definition is applied, as is a variable other
  than ``input``, ``upstream``, ``schedule`` or a macro's own, and ``upstream.<key>`` naming a task the
  condition's task does not depend on.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import Evaluator, base_functions, celstr

from engine import patterns
from engine.states import RunSchedule

#: Characters of a condition (engine.models.TASK_CONDITION_MAX_CHARS, the CHECK
#: constraint task_condition_length, is the same number: tests/unit/test_trigger_rules.py).
MAX_CONDITION_CHARS = 2000
#: Characters of a workflow's distinct conditions, all together (a repeated condition is
#: parsed once): parsing costs tens of microseconds per character, and a definition is
#: checked in a web request (engine.definitions).
MAX_CONDITION_CHARS_PER_WORKFLOW = 20_000
#: Levels of a condition's parse tree. A level is one grammar rule: ``a + b + c`` nests one
#: level per ``+``, a parenthesis about ten. The interpreter recurses about three Python
#: frames per level, so this keeps an evaluation far from the recursion limit.
MAX_CONDITION_DEPTH = 120
#: Interpreter steps (parse-tree nodes visited) of one evaluation.
MAX_CONDITION_STEPS = 100_000
#: Wall time of one evaluation, in seconds.
CONDITION_TIME_LIMIT_SECONDS = 0.5
#: Characters, bytes or list items that ``+`` may build in one evaluation, all together.
MAX_CONDITION_CONCAT = 1_000_000

#: The variables a condition can name.
VARIABLES = ("input", "upstream", "schedule")
#: CEL's macros over a list or map (their first argument names a variable of their own).
_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: Functions called by name (``size(x)``, ``int("3")``) and macros (``has``, ``dyn``).
_GLOBAL_FUNCTIONS = frozenset(
    {"has", "dyn", "size", "type", "bool", "bytes", "double", "duration", "int", "list", "map", "string",
     "timestamp", "uint", "matches", "contains", "startsWith", "endsWith"}
)
#: Methods (``s.startsWith("x")``, ``t.getHours()``) and the comprehensions.
_METHODS = frozenset(
    {"size", "contains", "startsWith", "endsWith", "matches", "getDate", "getDayOfMonth", "getDayOfWeek",
     "getDayOfYear", "getFullYear", "getMonth", "getHours", "getMilliseconds", "getMinutes", "getSeconds"}
) | _COMPREHENSIONS
#: Type names a condition may compare with ``type(x) == int``.
_TYPE_NAMES = frozenset(
    {"bool", "bytes", "double", "duration", "int", "list", "map", "null_type", "string", "timestamp", "type",
     "uint"}
)


class ConditionFailed(Exception):
    """A condition could not be evaluated to a bool: ``str(exc)`` says why (a CEL error
    such as a missing key, a value that is not a bool, or a limit of this module)."""


class _PatternRefused(BaseException):
    """Raised by ``matches`` for a pattern engine.patterns refuses (a BaseException, as
    _OutOfBudget, so that ``||`` cannot absorb it)."""


def _matches(text: Any, pattern: Any) -> Any:
    """CEL's ``matches`` (``text.matches(pattern)``, ``matches(text, pattern)``): whether
    RE2 finds ``pattern`` in ``text``, the pattern compiled by engine.patterns. Raises
    _PatternRefused for a pattern over its bounds, or a search over its work bound
    (engine.patterns.search: text × program size); other argument types go to celpy's
    own function (its error for a wrong overload)."""
    if not isinstance(text, str) or not isinstance(pattern, str):
        return base_functions["matches"](text, pattern)
    try:
        regex = patterns.compiled(str(pattern))
        return celtypes.BoolType(patterns.search(regex, str(text)))
    except patterns.PatternRefused as exc:
        raise _PatternRefused(f"matches(): pattern {_clip(str(pattern))} refused: {exc}") from None
    except patterns.SearchRefused as exc:
        # Bounded before it runs: a search is not interruptible by the condition's time limit.
        raise _PatternRefused(f"matches(): {exc}") from None


def _null_aware(name: str):
    """CEL's ``==`` / ``!=`` (``name``: ``_==_`` or ``_!=_``) with null equal to null only,
    as the CEL specification's heterogeneous equality has it: celpy finds no overload for
    ``{...} != null`` or ``3 == null``, and ``schedule != null`` must be a bool."""
    base = base_functions[name]
    differ = name == "_!=_"

    def compare(left: Any, right: Any) -> Any:
        if (left is None) != (right is None):
            return celtypes.BoolType(differ)
        return base(left, right)

    return compare


_NULL_AWARE = {"_==_": _null_aware("_==_"), "_!=_": _null_aware("_!=_")}


def _clip(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


class _OutOfBudget(BaseException):
    """Raised inside the interpreter when a limit is reached. A BaseException, so that no
    ``except Exception`` of the interpreter turns it into a CEL error value (which ``||``
    and ``&&`` may absorb)."""


_lock = threading.Lock()


@functools.cache
def _environment() -> celpy.Environment:
    """The process's CEL environment, made on first use (it builds the grammar's parser).
    celpy's constructor raises the process's recursion limit to 2500 as a side effect;
    MAX_CONDITION_DEPTH makes that unnecessary, so the limit is put back."""
    with _lock:
        previous = sys.getrecursionlimit()
        try:
            return celpy.Environment()
        finally:
            sys.setrecursionlimit(previous)


#: Conditions up to this many characters keep their parse tree in a process's cache (of
#: _CACHED_TREES trees). A tree takes about 700 bytes per character (1.4 MiB for 2,000), so
#: the cache holds at most about 45 MiB whatever the organizations write.
_CACHED_CHARS = 500
_CACHED_TREES = 128


def _compile(expression: str) -> lark.Tree:
    """The parse tree of ``expression``. Raises celpy.CELParseError. The parser keeps the
    text of its last parse on itself, hence the lock."""
    env = _environment()
    with _lock:
        return env.compile(expression)


_compile_cached = functools.lru_cache(maxsize=_CACHED_TREES)(_compile)


def _parse(expression: str) -> lark.Tree:
    """``_compile``, from the process's cache for a short condition (a tree is only read
    after it is made, so threads share it)."""
    return _compile_cached(expression) if len(expression) <= _CACHED_CHARS else _compile(expression)


def check(expression: Any, *, dependencies: Collection[str]) -> str | None:
    """Why ``expression`` cannot be a condition of a task depending on ``dependencies``
    (task keys), or None when it can: not a string, empty, longer than
    MAX_CONDITION_CHARS, a CEL syntax error (with its line and column), a parse tree
    deeper than MAX_CONDITION_DEPTH, an unknown variable, function or macro, or
    ``upstream.<key>`` naming a task not in ``dependencies``. Writes nothing; parsing
    is linear in the expression's length."""
    if not isinstance(expression, str):
        return f"must be a CEL expression (a string), got {type(expression).__name__}"
    if not expression.strip():
        return "must be a CEL expression, e.g. upstream.check.ok == true; leave it out (or '') for none"
    if len(expression) > MAX_CONDITION_CHARS:
        return f"at most {MAX_CONDITION_CHARS} characters, got {len(expression)}"
    try:
        # Not cached: a definition is checked once, and its conditions may be long.
        tree = _compile(expression)
    except celpy.CELParseError as exc:
        line, column = (exc.line or 1), (exc.column or 1)
        lines = expression.splitlines() or [""]
        text = lines[min(line, len(lines)) - 1]
        near = text[column - 1:column + 19].strip()
        where = f"line {line}, column {column}" if len(lines) > 1 else f"column {column}"
        return f"not a valid CEL expression: syntax error at {where}" + (f" (near {near!r})" if near else "")
    except RecursionError:
        return f"nested too deeply (at most {MAX_CONDITION_DEPTH} levels)"
    return _check_tree(tree, set(dependencies)) or _check_patterns(tree)


def _check_patterns(tree: lark.Tree) -> str | None:
    """Why a pattern written as a string literal in a ``matches`` call cannot run
    (engine.patterns), or None."""
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and _token(node.children[1]) == "matches":
            args, index = (node.children[2] if len(node.children) > 2 else None), 0
        elif node.data == "ident_arg" and _token(node.children[0]) == "matches":
            args, index = (node.children[1] if len(node.children) > 1 else None), 1
        else:
            continue
        if not isinstance(args, lark.Tree) or len(args.children) <= index:
            continue
        literal = _single_literal(args.children[index])
        if literal is None:
            continue  # a pattern from the data: checked when it is used
        reason = patterns.problem(literal)
        if reason is not None:
            return f"matches(): pattern {_clip(literal)} cannot run: {reason}"
    return None


def _single_literal(node: Any) -> str | None:
    """The string an expr consisting of one string literal denotes, else None."""
    while isinstance(node, lark.Tree):
        if node.data == "literal":
            token = node.children[0]
            if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
                return str(celstr(token))
            return None
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _check_tree(tree: lark.Tree, dependencies: set[str]) -> str | None:
    """The static checks of ``check`` on a parse tree (iterative: the tree may be deep)."""
    bound: set[str] = set()  # the comprehensions' own variables, anywhere in the expression
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and _token(node.children[1]) in _COMPREHENSIONS:
            args = node.children[2] if len(node.children) > 2 else None
            first = args.children[0] if isinstance(args, lark.Tree) and args.children else None
            name = _single_ident(first)
            if name is None:
                return f"{_token(node.children[1])}() takes a variable name first, e.g. items.exists(i, i > 0)"
            if name in VARIABLES:
                return f"{_token(node.children[1])}(): {name!r} names a variable of the condition; use another name"
            bound.add(name)
    stack: list[tuple[lark.Tree, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_CONDITION_DEPTH:
            return f"nested too deeply (at most {MAX_CONDITION_DEPTH} levels)"
        kind = node.data
        if kind == "ident":
            name = _token(node.children[0])
            if name not in VARIABLES and name not in bound and name not in _TYPE_NAMES:
                return f"unknown variable {name!r}; a condition reads input, upstream and schedule"
        elif kind == "ident_arg":
            name = _token(node.children[0])
            if name not in _GLOBAL_FUNCTIONS:
                return f"unknown function {name}()"
        elif kind == "member_dot_arg":
            name = _token(node.children[1])
            if name not in _METHODS:
                return f"unknown method .{name}()"
        elif kind in ("dot_ident", "dot_ident_arg", "member_object"):
            return "message and package names (a leading '.', Message{...}) are not available in a condition"
        elif kind == "member_dot":
            inner = node.children[0]
            if _single_ident(inner) == "upstream":
                key = _token(node.children[1])
                if key not in dependencies:
                    listed = ", ".join(sorted(dependencies)) or "none"
                    return f"upstream.{key}: {key!r} is not a dependency of this task (depends_on: {listed})"
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    return None


def _token(child: Any) -> str:
    return child.value if isinstance(child, lark.Token) else str(child)


def _single_ident(node: Any) -> str | None:
    """The identifier ``node`` consists of (an expr that is only ``name``), else None."""
    while isinstance(node, lark.Tree):
        if node.data == "ident":
            return _token(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


class _Budget:
    """What one evaluation may still spend: steps, a deadline (time.monotonic()) and
    characters/items that ``+`` may build."""

    __slots__ = ("concat", "deadline", "seconds", "steps")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.steps = MAX_CONDITION_STEPS
        self.deadline = time.monotonic() + seconds
        self.concat = MAX_CONDITION_CONCAT


class _BoundedEvaluator(Evaluator):
    """celpy's interpreter, charging each node it visits to a _Budget (macros evaluate
    their bodies through ``sub_evaluator``, so they are charged too)."""

    budget: _Budget

    def visit_children(self, tree: lark.Tree) -> list:
        budget = self.budget
        budget.steps -= 1
        if budget.steps < 0:
            raise _OutOfBudget(f"took more than {MAX_CONDITION_STEPS} steps")
        if time.monotonic() > budget.deadline:
            raise _OutOfBudget(f"took longer than its time limit ({budget.seconds:g} s)")
        return super().visit_children(tree)

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        nested = _BoundedEvaluator(ast, activation=self.activation)
        nested.budget = self.budget
        return nested


def _bounded_add(budget: _Budget):
    """CEL's ``+``, charging what it builds (a string's characters, bytes, a list's
    items) to ``budget``. (CEL has no ``*`` of a string or list by an int: celpy finds no
    overload for it, so ``+`` is the only way to build a large value.)"""
    add = base_functions["_+_"]

    def bounded(left: Any, right: Any) -> Any:
        if isinstance(left, (str, bytes, list)) and isinstance(right, (str, bytes, list)):
            budget.concat -= len(left) + len(right)
            if budget.concat < 0:
                raise _OutOfBudget(f"built more than {MAX_CONDITION_CONCAT} characters or items with +")
        return add(left, right)

    return bounded


def evaluate(expression: str, *, run_input: Any, upstream: Mapping[str, Any],
             schedule: RunSchedule | None = None, time_limit_seconds: float | None = None) -> bool:
    """Evaluate the condition ``expression`` (already accepted by ``check``) with the run's
    input and the task's upstream outputs by key (JSON values), and the run's cron instant
    (``schedule``: None for a run started otherwise; see the module docstring). Returns
    its bool.

    Raises ConditionFailed naming what went wrong: a CEL error (a missing key, no such
    overload), a result that is not a bool, or a limit reached (MAX_CONDITION_STEPS,
    CONDITION_TIME_LIMIT_SECONDS, MAX_CONDITION_CONCAT). Takes at most about
    CONDITION_TIME_LIMIT_SECONDS plus the time to convert the JSON values, which is linear
    in their size. ``time_limit_seconds`` lowers the time limit (a caller's budget for
    several evaluations: the worker API's poll).
    """
    try:
        tree = _parse(expression)
    except (celpy.CELParseError, RecursionError) as exc:  # refused at definition time; kept for a stored one
        raise ConditionFailed(f"not a valid CEL expression ({type(exc).__name__})") from None
    seconds = CONDITION_TIME_LIMIT_SECONDS
    if time_limit_seconds is not None:
        seconds = max(0.0, min(seconds, time_limit_seconds))
    budget = _Budget(seconds)
    reads = _reads(tree)
    try:
        # Only what the expression reads is converted (a condition on input.mode does not
        # pay for a large input.rows), and the conversion is charged to the budget.
        variables = {
            "input": _to_cel(_prune(run_input if run_input is not None else {}, reads["input"]), budget),
            "upstream": _to_cel(_prune(dict(upstream), reads["upstream"]), budget),
            "schedule": _schedule_to_cel(schedule),
        }
        functions = {"_+_": _bounded_add(budget), "matches": _matches, **_NULL_AWARE}
        activation = celpy.InterpretedRunner(_environment(), tree, functions).new_activation()
        evaluator = _BoundedEvaluator(tree, activation=activation)
        evaluator.budget = budget
        value = evaluator.evaluate(variables)
    except _OutOfBudget as exc:
        raise ConditionFailed(f"condition stopped: it {exc}") from None
    except _PatternRefused as exc:
        raise ConditionFailed(f"condition could not be evaluated: {exc}") from None
    except celpy.CELEvalError as exc:
        raise ConditionFailed(f"condition could not be evaluated: {_eval_message(exc)}") from None
    except RecursionError:
        raise ConditionFailed("condition could not be evaluated: a value is nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - any other interpreter error is the condition's failure
        raise ConditionFailed(f"condition could not be evaluated: {type(exc).__name__}: {exc}"[:500]) from None
    if not isinstance(value, celtypes.BoolType):
        raise ConditionFailed(f"condition must evaluate to a bool (true or false), got {_type_name(value)}")
    return bool(value)


def _reads(tree: lark.Tree) -> dict[str, list[tuple[str, ...]]]:
    """For each variable, the paths of field names the expression selects under it with
    dots, each as far as the dots go (``upstream.check.ok`` -> ("check", "ok")); () when
    the variable itself is read otherwise (``size(input)``, ``input["x"]``)."""
    parent: dict[int, lark.Tree] = {}
    idents: list[lark.Tree] = []
    for node in tree.iter_subtrees():
        for child in node.children:
            if isinstance(child, lark.Tree):
                parent[id(child)] = node
        if node.data == "ident" and _token(node.children[0]) in VARIABLES:
            idents.append(node)
    reads: dict[str, list[tuple[str, ...]]] = {name: [] for name in VARIABLES}
    for ident in idents:
        path: list[str] = []
        node = parent.get(id(ident))  # primary
        while node is not None:
            up = parent.get(id(node))  # member, then member_dot
            if up is not None and up.data == "member":
                node, up = up, parent.get(id(up))
            if up is None or up.data != "member_dot" or up.children[0] is not node:
                break
            path.append(_token(up.children[1]))
            node = up
        reads[_token(ident.children[0])].append(tuple(path))
    return reads


def _prune(value: Any, paths: list[tuple[str, ...]]) -> Any:
    """``value`` with only what ``paths`` select kept: a map keeps the keys a path goes
    through (whole where a path ends); anything else is kept whole, so a selection on it
    fails as it would have."""
    if not paths or any(not p for p in paths) or not isinstance(value, dict):
        return value if paths else {}
    below: dict[str, list[tuple[str, ...]]] = {}
    for p in paths:
        below.setdefault(p[0], []).append(p[1:])
    return {k: (v if any(not p for p in below[k]) else _prune(v, below[k]))
            for k, v in value.items() if k in below}


def _schedule_to_cel(schedule: RunSchedule | None) -> Any:
    """The ``schedule`` variable: a map of the three instants as CEL timestamps, or null."""
    if schedule is None:
        return None
    return celtypes.MapType({celtypes.StringType(name): celtypes.TimestampType(getattr(schedule, name))
                             for name in ("scheduled_for", "data_interval_start", "data_interval_end")})


def _to_cel(value: Any, budget: _Budget) -> Any:
    """A JSON value as CEL values (celpy.json_to_cel's mapping), one step of ``budget``
    per value: a large input costs time (celpy's int costs tens of microseconds), so the
    conversion stops at the same limits as the evaluation."""
    budget.steps -= 1
    if budget.steps < 0:
        raise _OutOfBudget(f"took more than {MAX_CONDITION_STEPS} steps (reading its values)")
    if budget.steps % 256 == 0 and time.monotonic() > budget.deadline:
        raise _OutOfBudget(f"took longer than its time limit ({budget.seconds:g} s) reading its values")
    if isinstance(value, dict):
        return celtypes.MapType({celtypes.StringType(k): _to_cel(v, budget) for k, v in value.items()})
    if isinstance(value, list):
        return celtypes.ListType([_to_cel(v, budget) for v in value])
    return celpy.json_to_cel(value)


def _eval_message(exc: celpy.CELEvalError) -> str:
    """A CEL error's message, short: its first argument (``no such member in mapping:
    'x'``), without the interpreter's token names."""
    message = str(exc.args[0]) if exc.args else str(exc)
    return message.replace("Token('RULE', ", "(")[:500]


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    for name, kind in (("an int", celtypes.IntType), ("a double", celtypes.DoubleType),
                       ("a string", celtypes.StringType), ("a list", celtypes.ListType),
                       ("a map", celtypes.MapType)):
        if isinstance(value, kind):
            return name
    return type(value).__name__


__all__ = [
    "CONDITION_TIME_LIMIT_SECONDS",
    "MAX_CONDITION_CHARS",
    "MAX_CONDITION_CHARS_PER_WORKFLOW",
    "MAX_CONDITION_CONCAT",
    "MAX_CONDITION_DEPTH",
    "MAX_CONDITION_STEPS",
    "VARIABLES",
    "ConditionFailed",
    "check",
    "evaluate",
]
