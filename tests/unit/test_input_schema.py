"""Run input schemas, the engine half (issue 19, item 7; engine/input_schema.py): what a
definition's ``input_schema`` may be (each refusal named by its path in the definition),
how an input is validated (every violation at its JSON pointer, defaults filled in), and
the fences of a shared deployment: no reference ever fetched, patterns on RE2, a work
budget, uniqueItems by hashing. No database."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from referencing.exceptions import Unresolvable

from engine import input_schema
from engine.definitions import DefinitionError, validate_document
from engine.input_schema import InputSchema, check_schema

TASKS = [{"key": "a", "type": "noop"}]

ORDER = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date", "title": "Day to load"},
        "limit": {"type": "integer", "minimum": 1, "default": 100},
        "customer": {"$ref": "#/$defs/customer"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "required": ["date", "customer"],
    "$defs": {"customer": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^c-[0-9]+$"},
        "tier": {"enum": ["free", "pro"], "default": "free"}}, "required": ["id"]}},
}


def document(schema) -> dict:
    return {"name": "orders", "tasks": TASKS, "input_schema": schema}


def errors_of(schema) -> list[dict[str, str]]:
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(document(schema))
    return excinfo.value.errors


# --- definition time ------------------------------------------------------------------------------


def test_a_valid_schema_is_stored_as_written_in_the_normalized_definition():
    normalized = validate_document(document(ORDER))
    assert normalized["input_schema"] == ORDER
    assert list(normalized["input_schema"]["properties"]) == ["date", "limit", "customer", "tags"]
    assert check_schema(ORDER) == []


@pytest.mark.parametrize(("schema", "path", "message"), [
    ({"type": "object", "properties": {"x": {"type": "strin"}}},
     "input_schema.properties.x.type", "'strin' is not valid under any of the given schemas"),
    ({"properties": {"x": {"minLength": -1}}},
     "input_schema.properties.x.minLength", "-1 is less than the minimum of 0"),
    ({"allOf": [{"required": "x"}]}, "input_schema.allOf[0].required", "'x' is not of type 'array'"),
    ({"type": "array"},
     "input_schema.type", "a run input is a JSON object; the root type must be 'object', got 'array'"),
    ("object", "input_schema", "must be a JSON Schema object"),
    ({"$schema": "http://json-schema.org/draft-07/schema#"},
     "input_schema.$schema", "only JSON Schema Draft 2020-12"),
    ({"properties": {"x": {"$ref": "https://schemas.example/customer.json"}}},
     "input_schema.properties.x.$ref", "only references inside this schema are allowed"),
    ({"properties": {"x": {"$ref": "other.json#/a"}}},
     "input_schema.properties.x.$ref", "only references inside this schema are allowed"),
    ({"properties": {"x": {"$ref": "#/$defs/nope"}}},
     "input_schema.properties.x.$ref", "'#/$defs/nope' points to nothing in this schema"),
    ({"properties": {"x": {"$dynamicRef": "https://schemas.example/x"}}},
     "input_schema.properties.x.$dynamicRef", "only references inside this schema are allowed"),
    ({"properties": {"x": {"$id": "https://schemas.example/x", "type": "string"}}},
     "input_schema.properties.x.$id", "$id is allowed on the root schema only"),
    ({"properties": {"x": {"$schema": "http://json-schema.org/draft-04/schema#"}}},
     "input_schema.properties.x.$schema", "$schema is allowed on the root schema only"),
    ({"$defs": {"c": {"pattern": "^(?=c-)"}}},
     "input_schema.$defs.c.pattern", "is not a pattern FlowForge can run (invalid perl operator: (?=)"),
    ({"patternProperties": {"(a)\\1": {}}},
     "input_schema.patternProperties", "is not a pattern FlowForge can run"),
    ({"properties": {"x": {"type": "integer", "default": "ten"}}},
     "input_schema.properties.x.default", "the default does not match its own schema: 'ten' is not of type"),
    ({"properties": {"c": {"$ref": "#/$defs/c"}}, "$defs": {"c": {"properties": {"n": {"maximum": 3, "default": 9}}}}},
     "input_schema.properties.c.properties.n.default", "9 is greater than the maximum of 3"),
    ({"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
     "input_schema", "unevaluatedProperties cannot be used in a schema that also uses patternProperties"),
])
def test_a_bad_schema_is_refused_naming_its_path_in_the_definition(schema, path, message):
    found = errors_of(schema)
    assert [e["path"] for e in found] == [path], found
    assert message in found[0]["message"]


def test_every_problem_of_the_meta_schema_is_listed_with_the_rest_of_the_definition():
    doc = {"name": "orders", "tasks": [{"key": "a", "type": "nope"}],
           "input_schema": {"properties": {"a": {"type": 1}, "b": {"minimum": "x"}}}}
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(doc)
    paths = [e["path"] for e in excinfo.value.errors]
    assert "input_schema.properties.a.type" in paths and "input_schema.properties.b.minimum" in paths
    assert "tasks[a].type" in paths


def test_size_and_depth_limits_are_enforced_with_their_numbers():
    big = {"properties": {f"p{i:05}": {"type": "string", "description": "x" * 60} for i in range(1000)}}
    [error] = errors_of(big)
    assert error["path"] == "input_schema"
    assert error["message"].endswith(f"characters of JSON; at most {input_schema.MAX_SCHEMA_BYTES}")
    deep: dict = {"type": "string"}
    for _ in range(input_schema.MAX_SCHEMA_DEPTH):
        deep = {"properties": {"x": deep}}
    [error] = errors_of(deep)
    assert error == {"path": "input_schema", "message": f"nested more than {input_schema.MAX_SCHEMA_DEPTH} levels deep"}


def exponential(levels: int) -> dict:
    """anyOf of two references to the next level, ``levels`` deep: 2**levels evaluations."""
    defs = {f"l{i}": {"anyOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]} for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"$defs": defs}


def test_a_schema_whose_empty_input_exhausts_the_budget_is_refused():
    # 2**40 evaluations, or a reference loop that consumes nothing: both stop at the budget.
    for schema in ({**exponential(40), "$ref": "#/$defs/l0"},
                   {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}):
        [error] = errors_of(schema)
        assert error["path"] == "input_schema"
        assert f"does not finish within {input_schema.MAX_VALIDATION_STEPS} steps" in error["message"]


class _Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Recorder.hits.append(self.path)
        body = json.dumps({"type": "string"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_no_reference_is_ever_fetched_at_definition_time_or_at_validation():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/customer.json"
    try:
        _Recorder.hits.clear()
        assert errors_of({"properties": {"c": {"$ref": url}}})[0]["path"] == "input_schema.properties.c.$ref"
        assert errors_of({"$ref": url})[0]["path"] == "input_schema.$ref"
        # Even a schema that slipped past the check (built directly) cannot fetch: the
        # registry holds the document alone.
        schema = InputSchema({"properties": {"c": {"$ref": url}}})
        with pytest.raises(Unresolvable):
            schema.violations({"c": "x"})
        assert _Recorder.hits == []
    finally:
        server.shutdown()


# --- validation -----------------------------------------------------------------------------------


def test_every_violation_is_listed_at_its_json_pointer_in_numeric_order():
    schema = InputSchema(ORDER)
    _, violations = schema.validate({
        "date": "2026-02-30", "limit": 0, "customer": {"tier": "gold"},
        "tags": ["a", 3, "a"] + ["b"] * 0, "extra": {"a/b": 1},
    })
    assert [(v["path"], v["keyword"]) for v in violations] == [
        ("/customer/id", "required"),
        ("/customer/tier", "enum"),
        ("/date", "format"),
        ("/limit", "minimum"),
        ("/tags", "uniqueItems"),
        ("/tags/1", "type"),
    ]
    assert violations[0]["message"] == "a value is required"
    assert violations[3]["message"] == "0 is less than the minimum of 1"
    items = InputSchema({"properties": {"xs": {"items": {"type": "integer"}}}})
    _, violations = items.validate({"xs": ["a"] * 12})
    assert [v["path"] for v in violations] == [f"/xs/{i}" for i in range(12)]  # /xs/2 before /xs/10


def test_a_missing_required_property_is_reported_at_its_own_escaped_pointer():
    schema = InputSchema({"required": ["a/b", "c~d", "ok"], "properties": {"ok": {}}})
    _, violations = schema.validate({"ok": 1})
    assert [v["path"] for v in violations] == ["/a~1b", "/c~0d"]


def test_defaults_are_filled_in_nested_and_through_references_and_the_input_is_not_changed():
    schema = InputSchema(ORDER)
    given = {"date": "2026-03-01", "customer": {"id": "c-7"}}
    filled, violations = schema.validate(given)
    assert violations == []
    assert filled == {"date": "2026-03-01", "limit": 100, "customer": {"id": "c-7", "tier": "free"}}
    assert given == {"date": "2026-03-01", "customer": {"id": "c-7"}}
    # A value given is kept, whatever the default.
    assert schema.validate({**given, "limit": 5})[0]["limit"] == 5


def test_defaults_of_a_recursive_schema_stop_at_their_depth_limit():
    tree = InputSchema({"$defs": {"node": {"type": "object", "properties": {
        "child": {"$ref": "#/$defs/node", "default": {}}}}}, "$ref": "#/$defs/node"})
    filled, violations = tree.validate({})
    assert violations == []
    depth, node = 0, filled
    while "child" in node:
        depth, node = depth + 1, node["child"]
    assert depth == input_schema.DEFAULTS_MAX_DEPTH


def test_a_catastrophic_pattern_runs_on_re2_and_finishes():
    # ^(a+)+$ against "aaaa...b" backtracks for ages in Python's re; RE2 answers at once.
    schema = InputSchema({"properties": {"x": {"pattern": "^(a+)+$"}}, "patternProperties": {"^(b+)+$": {
        "type": "integer"}}, "additionalProperties": {"type": "string"}})
    _, violations = schema.validate({"x": "a" * 50_000 + "!", "b" * 50_000 + "!": 1})
    assert [(v["path"][:3], v["keyword"]) for v in violations] == [("/bb", "type"), ("/x", "pattern")]
    assert violations[1]["message"] == "does not match the pattern '^(a+)+$'"


def test_an_input_that_exceeds_the_budget_is_one_violation_saying_so():
    schema = {**exponential(7), "properties": {"rows": {"items": {"$ref": "#/$defs/l0"}}}}
    assert check_schema(schema) == []  # an empty input is cheap
    filled, violations = input_schema.check_input(json.dumps(schema), {"rows": [1] * 200}, organization_id="o")
    assert violations == [{"path": "", "keyword": "budget", "message": "validating this input against the input "
                           f"schema needs more than {input_schema.MAX_VALIDATION_STEPS} steps; send a smaller input"}]


def test_unique_items_uses_json_equality():
    schema = InputSchema({"properties": {"xs": {"uniqueItems": True}}})
    assert schema.violations({"xs": [1, 1.0]})[0]["keyword"] == "uniqueItems"
    assert schema.violations({"xs": [{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}]})[0]["keyword"] == "uniqueItems"
    assert schema.violations({"xs": [1, True, "1", [1], {"a": 1}, None, False, 0]}) == []


def test_the_number_of_violations_and_the_length_of_messages_are_capped():
    schema = InputSchema({"properties": {"xs": {"items": {"type": "integer"}}, "s": {"const": "x"}}})
    violations = schema.violations({"xs": ["n"] * 500, "s": "y" * 10_000})
    assert len(violations) == input_schema.MAX_VIOLATIONS_LISTED + 1
    assert violations[-1]["keyword"] == "truncated"
    assert all(len(v["message"]) <= input_schema.MAX_MESSAGE_CHARS for v in violations)


def test_compiled_schemas_are_cached_per_organization():
    text = json.dumps(ORDER)
    assert input_schema.compiled(text, organization_id="a") is input_schema.compiled(text, organization_id="a")
    assert input_schema.compiled(text, organization_id="a") is not input_schema.compiled(text, organization_id="b")
