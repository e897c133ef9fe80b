"""Regular expressions at a bounded compile cost (engine.patterns): RE2 expands counted
repeats, and compiling ``"a{0,1000}" * N`` took seconds to minutes with the GIL held. A
pattern over the budget is refused before RE2 sees it: when a definition is applied (a
condition's literal pattern, an input schema's pattern) and when a condition is evaluated
with a pattern from the data (the task fails, without retry, as for any condition error)."""

from __future__ import annotations

import json

import pytest

from engine import conditions, input_schema, patterns
from engine.definitions import DefinitionError, validate_document
from tests.unit.test_trigger_rules import task_run

NOOP = {"type": "noop"}
#: What the reviewer measured: 20 s of compile for 60 copies, 197 s for 200.
SLOW = "a{0,1000}" * 60
SLOWER = "a{0,1000}" * 200  # 1,800 characters: under a condition's 2,000
SCHEMA_SLOW = "a{0,1000}" * 45  # what was applied as an input schema's pattern (6.8 s)


def problems(document) -> list[dict]:
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(document)
    return excinfo.value.errors


@pytest.mark.parametrize(("pattern", "copies"), [
    ("^\\d{4}-\\d{2}-\\d{2}$", 3 + 1 + 1),
    ("a{0,1000}", 999),
    ("a{0,1000}" * 2, 1998),
    (SLOW, 60 * 999),
    ("(ab){3}", 4),                      # a group of 2 atoms, 3 times: 4 more
    ("(?:a|bc){4}", 9),                  # alternatives add up: 3 atoms, 4 times
    ("(?P<y>\\d{4})-(?<m>\\d{2})", 4),   # named groups
    ("(a{10}){10}", 99),                 # nested repeats multiply: 100 atoms from 1
    ("((a{0,100}){0,10})" * 3, 3 * 999),
    ("x{3,}", 2),
    ("[a{5}]{3}", 2),                    # a brace inside a class is a member
    ("[]{9}]", 0),                       # a leading ']' is a member, the class closes after '}'
    ("\\Qa{9}\\E", 0),                   # quoted text is literal
    ("a\\{9}", 0),                       # an escaped brace is literal
    ("a{,5}", 0),                        # not a repeat for RE2: a literal
    ("\\p{Greek}{10}", 9),
    ("(?i)a{3}", 2),                     # a flags group holds nothing
])
def test_repeat_copies_counts_what_re2_expands(pattern, copies):
    assert patterns.repeat_copies(pattern) == copies


@pytest.mark.parametrize("pattern", [SLOW, SLOWER, SCHEMA_SLOW, "(a{0,100}b{0,100}){0,10}" + "c{0,1000}" * 2])
def test_a_pattern_over_the_copies_budget_is_refused_before_re2_compiles_it(pattern, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("RE2 was asked to compile a pattern over the budget")

    monkeypatch.setattr(patterns.re2, "compile", no_compile)
    patterns._compile.cache_clear()
    with pytest.raises(patterns.PatternRefused) as excinfo:
        patterns.compiled(pattern)
    copies = patterns.repeat_copies(pattern)
    assert copies > patterns.MAX_REPEAT_COPIES
    assert str(excinfo.value) == (f"its counted repeats (x{{n,m}}) expand to {copies} copies; at most "
                                  f"{patterns.MAX_REPEAT_COPIES} in one pattern")


def test_a_pattern_whose_program_exceeds_the_memory_cap_is_refused():
    # \pL compiles to about a thousand instructions: 100 copies are over RE2_MAX_MEM_BYTES
    # though well within the copies budget.
    assert patterns.repeat_copies("^\\pL{1,100}$") == 99
    reason = patterns.problem("^\\pL{1,100}$")
    assert reason == "pattern too large - compile failed: its compiled program would exceed 1024 KiB"


@pytest.mark.parametrize(("pattern", "text", "found"), [
    ("^\\d{4}-\\d{2}-\\d{2}$", "2026-03-29", True),
    ("(?i)^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", "0A1B2C3D-0000-4000-8000-00000000000F", True),
    ("^[^@\\s]{1,64}@[^@\\s]{1,255}$", "ops@example.org", True),
    ("^\\w{1,1000}$", "x" * 1001, False),
    ("^\\pL{1,30}$", "Größe", True),
    ("a{0,1000}" * 2 + "b", "a" * 10 + "b", True),
])
def test_ordinary_patterns_compile_and_match(pattern, text, found):
    assert patterns.problem(pattern) is None
    assert (patterns.compiled(pattern).search(text) is not None) is found


def test_a_compiled_pattern_is_kept_per_text():
    pattern = "^kept-[0-9]{3}$"
    patterns._compile.cache_clear()
    assert patterns.compiled(pattern) is patterns.compiled(pattern)
    info = patterns._compile.cache_info()
    assert (info.misses, info.hits) == (1, 1)


# --- conditions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["input.s.matches({p})", "matches(input.s, {p})", "input.s.matches({p}) || true"])
def test_a_condition_with_a_literal_pattern_over_the_budget_is_refused_when_applied(call):
    condition = call.format(p=json.dumps(SLOWER))
    assert len(condition) <= conditions.MAX_CONDITION_CHARS
    errors = problems({"name": "wf", "tasks": [{"key": "a", **NOOP, "condition": condition}]})
    copies = patterns.repeat_copies(SLOWER)
    assert errors == [{"path": "tasks[a].condition",
                       "message": f"matches(): pattern {SLOWER[:60] + '…'!r} cannot run: its counted repeats "
                                  f"(x{{n,m}}) expand to {copies} copies; at most 2000 in one pattern"}]


def test_a_condition_with_a_pattern_re2_refuses_is_refused_when_applied():
    errors = problems({"name": "wf", "tasks": [{"key": "a", **NOOP, "condition": 'input.s.matches("(?=x)")'}]})
    assert errors == [{"path": "tasks[a].condition",
                       "message": "matches(): pattern '(?=x)' cannot run: invalid perl operator: (?="}]


def test_a_condition_with_an_ordinary_literal_pattern_is_accepted_and_matches():
    condition = 'input.day.matches("^\\\\d{4}-\\\\d{2}-\\\\d{2}$")'
    assert conditions.check(condition, dependencies=[]) is None
    assert conditions.evaluate(condition, run_input={"day": "2026-03-29"}, upstream={}) is True
    assert conditions.evaluate(condition, run_input={"day": "29.03.2026"}, upstream={}) is False


@pytest.mark.parametrize("expression", ["input.s.matches(input.p)", "input.s.matches(input.p) || true",
                                        "matches(input.s, upstream.a.p)"])
def test_a_pattern_from_the_data_over_the_budget_fails_the_condition(expression):
    assert conditions.check(expression, dependencies=["a"]) is None  # nothing to check before the data
    with pytest.raises(conditions.ConditionFailed) as excinfo:
        conditions.evaluate(expression, run_input={"s": "a" * 10, "p": SLOWER}, upstream={"a": {"p": SLOWER}})
    assert str(excinfo.value) == (
        f"condition could not be evaluated: matches(): pattern {SLOWER[:60] + '…'!r} refused: its counted "
        f"repeats (x{{n,m}}) expand to {patterns.repeat_copies(SLOWER)} copies; at most 2000 in one pattern")


def test_a_pattern_from_the_data_within_the_budget_matches():
    assert conditions.evaluate("input.s.matches(input.p)", run_input={"s": "aab", "p": "^a{0,1000}b$"},
                               upstream={}) is True
    with pytest.raises(conditions.ConditionFailed, match="no such overload"):
        conditions.evaluate("input.s.matches(input.p)", run_input={"s": "aab", "p": 3}, upstream={})


@pytest.mark.django_db
def test_a_worker_task_whose_condition_gets_a_slow_pattern_from_the_input_fails_at_the_poll(make_org):
    """The worker API's poll evaluates conditions in the web process: a data pattern over
    the budget fails the task there (no retry), and the poll answers."""
    from tests.unit.test_worker_api import Org

    a = Org(make_org())
    tasks = [{"key": "resize", "type": "worker", "config": {"queue": "images", "name": "resize"},
              "condition": "input.name.matches(input.pattern)", "max_attempts": 3}]
    run = a.start(tasks=tasks, run_input={"name": "a" * 10, "pattern": SLOWER})
    response = a.poll(max_tasks=5)
    assert response.status_code == 200, response.content
    assert response.json()["tasks"] == []
    resize = task_run(run.pk, "resize")
    assert resize.state == "failed"
    assert resize.error.startswith("condition could not be evaluated: matches(): pattern 'a{0,1000}")
    assert "at most 2000 in one pattern" in resize.error


# --- input schemas -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("schema", "path"), [
    ({"properties": {"code": {"type": "string", "pattern": SCHEMA_SLOW}}}, "input_schema.properties.code.pattern"),
    ({"patternProperties": {SCHEMA_SLOW: {}}}, "input_schema.patternProperties"),
])
def test_an_input_schema_pattern_over_the_budget_is_refused_naming_its_field(schema, path):
    errors = problems({"name": "wf", "tasks": [NOOP | {"key": "a"}], "input_schema": schema})
    copies = patterns.repeat_copies(SCHEMA_SLOW)
    assert errors == [{"path": path, "message": (
        f"{SCHEMA_SLOW[:input_schema.MAX_MESSAGE_CHARS - 2]!r}"[:-1] + "…"
        + f" is not a pattern FlowForge can run (its counted repeats (x{{n,m}}) expand to {copies} "
        "copies; at most 2000 in one pattern); patterns run on RE2: no lookaround or backreferences, counted "
        "repeats within 2000 copies in all")}]


def test_an_input_schemas_patterns_are_compiled_once_for_every_start(monkeypatch):
    schema = {"properties": {"code": {"type": "string", "pattern": "^once-[0-9]{4}$"}}}
    assert input_schema.check_schema(schema) == []
    compiles = []
    real = patterns.re2.compile

    def counting(pattern, options=None):
        compiles.append(pattern)
        return real(pattern, options)

    monkeypatch.setattr(patterns.re2, "compile", counting)
    text = json.dumps(schema)
    for org in ("o1", "o2", "o1"):
        assert input_schema.check_input(text, {"code": "once-2026"}, organization_id=org)[1] == []
        assert input_schema.check_input(text, {"code": "twice"}, organization_id=org)[1][0]["keyword"] == "pattern"
    assert compiles == []  # check_schema compiled it; six validations after found it compiled


def test_a_stored_schema_with_a_pattern_over_the_budget_is_one_violation_saying_so():
    # A schema stored before the budget existed: the start is refused, nothing is compiled.
    text = json.dumps({"properties": {"code": {"type": "string", "pattern": SCHEMA_SLOW}}})
    value, violations = input_schema.check_input(text, {"code": "a"}, organization_id="o")
    assert value == {"code": "a"}
    assert [(v["path"], v["keyword"]) for v in violations] == [("", "pattern")]
    assert violations[0]["message"].startswith("the input schema has a pattern FlowForge no longer runs (its counted")


# --- one definition's patterns together ---------------------------------------------------------------


def test_a_definitions_many_patterns_share_one_compile_budget_and_the_rest_are_not_compiled(monkeypatch):
    """Each \\pL{1,30} is within the bounds of one pattern, but 64 KiB of them would take
    minutes to compile: past MAX_DEFINITION_INSTRUCTIONS the next patterns are refused
    without being compiled."""
    patterns._compile.cache_clear()
    compiles = []
    real = patterns.re2.compile

    def counting(pattern, options=None):
        compiles.append(pattern)
        return real(pattern, options)

    monkeypatch.setattr(patterns.re2, "compile", counting)
    size = patterns.compiled("^\\pL{1,30}$").programsize
    compiles.clear()
    fits = patterns.MAX_DEFINITION_INSTRUCTIONS // size
    properties = {f"p{i:03}": {"type": "string", "pattern": f"^\\pL{{1,30}}{i:03}$"} for i in range(fits + 40)}
    errors = problems({"name": "wf", "tasks": [NOOP | {"key": "a"}], "input_schema": {"properties": properties}})
    message = (f"the definition's patterns compile to more than {patterns.MAX_DEFINITION_INSTRUCTIONS} RE2 "
               "instructions in all; use fewer or smaller patterns")
    assert errors and all(message in e["message"] for e in errors)
    assert len(compiles) == fits + 1  # the one that went over, then none
    # The same patterns one by one, outside a definition: each is fine.
    assert patterns.problem(properties["p000"]["pattern"]) is None


def test_a_repeated_pattern_is_charged_once_and_conditions_share_the_budget_with_the_schema():
    pattern = "^\\pL{1,30}$"
    repeated = {f"p{i}": {"type": "string", "pattern": pattern} for i in range(200)}
    conditions_ = [{"key": f"t{i}", **NOOP, "condition": f'input.p{i}.matches("^\\\\pL{{1,30}}$")'}
                   for i in range(50)]
    normalized = validate_document({"name": "wf", "tasks": conditions_, "input_schema": {"properties": repeated}})
    assert len(normalized["tasks"]) == 50


# --- searching: a long text against a large program (the second review) ---------------------------


def test_a_long_text_against_a_large_pattern_fails_the_condition_before_searching(monkeypatch):
    """500,000 characters against a{0,1000}b (within the copies budget) took 30 s of RE2's
    NFA: the search's worst cost is over MAX_SEARCH_COST, so it is refused without running."""
    searched = []
    real = patterns.search

    def spy(regex, text):
        searched.append(len(text))
        return real(regex, text)

    monkeypatch.setattr(patterns, "search", spy)
    run_input = {"s": "a" * 500_000, "ps": ["a{0,1000}b"]}
    with pytest.raises(conditions.ConditionFailed) as excinfo:
        conditions.evaluate("input.ps.exists(p, input.s.matches(p))", run_input=run_input, upstream={})
    cost = 500_000 * patterns.compiled("a{0,1000}b").programsize
    assert str(excinfo.value) == (
        f"condition could not be evaluated: matches(): searching 500,000 characters with a pattern of "
        f"{patterns.compiled('a{0,1000}b').programsize:,} instructions could cost {cost:,} steps, over "
        f"{patterns.MAX_SEARCH_COST:,}: shorten the text or the pattern")
    assert searched == [500_000]  # asked once, refused before RE2 ran


def test_a_long_text_against_a_small_pattern_still_matches():
    text = "x" * 400_000 + "ok"
    assert patterns.search_cost(patterns.compiled("ok$"), text) <= patterns.MAX_SEARCH_COST
    assert conditions.evaluate("input.s.matches('ok$')", run_input={"s": text}, upstream={}) is True


def test_input_schema_searches_are_charged_to_the_validation_budget():
    """Five patterns of a{0,1000}X against 100,000 characters took 10.5 s for one start: each
    search's worst cost is charged before it runs, and the validation stops at its budget."""
    schema = {"allOf": [{"properties": {"s": {"type": "string", "pattern": f"a{{0,1000}}{c}"}}} for c in "bcdef"]}
    assert input_schema.check_schema(schema) == []
    value, violations = input_schema.check_input(json.dumps(schema), {"s": "a" * 100_000}, organization_id="o")
    assert violations == [{"path": "", "keyword": "budget", "message": "validating this input against the input "
                           f"schema needs more than {input_schema.MAX_VALIDATION_STEPS} steps; send a smaller input"}]
    # The same schema and an ordinary value: validated as before.
    assert input_schema.check_input(json.dumps(schema), {"s": "aaab"}, organization_id="o")[1][0]["keyword"] == \
        "pattern"
