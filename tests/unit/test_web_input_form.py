"""The start form generated from a workflow version's input schema (issue 19, item 7;
frontend/input_form.py), server-side: one field per property (text, date, number, select,
checkbox or a Yes/No select, a fieldset for a nested object, a JSON textarea for the rest)
with labels from titles, descriptions, required markers and defaults; a refused input is
shown next to each field and nothing is stored; a valid one starts a run with typed
values. A schema the form cannot lay out falls back to the JSON textarea. The trigger
list flags a trigger whose input the latest version refuses. Real PostgreSQL."""

from __future__ import annotations

import html
import re

import pytest

from engine.models import WorkflowRun
from engine.services import apply_definition
from engine.triggers import create_trigger
from tenancy.actors import Actor
from tests.unit.test_web_workflows import assert_csp_clean, client_for, make_team, text

SCHEMA = {
    "type": "object",
    "properties": {
        "day": {"type": "string", "format": "date", "title": "Day to load", "description": "The day whose orders load."},
        "region": {"enum": ["eu", "us"], "default": "eu", "title": "Region"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100},
        "ratio": {"type": "number"},
        "dry_run": {"type": "boolean", "default": False, "title": "Dry run"},
        "notify": {"type": "boolean"},
        "customer": {"$ref": "#/$defs/customer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$", "title": "Warehouse code"},
    },
    "required": ["day", "code"],
    "$defs": {"customer": {"type": "object", "title": "Customer", "properties": {
        "id": {"type": "string", "title": "Customer id"},
        "vip": {"type": "boolean", "default": True}}, "required": ["id"]}},
}


@pytest.fixture
def team(org):
    return make_team(org)


@pytest.fixture
def wf(team):
    return apply_definition(organization=team["org"], document={
        "name": "orders", "tasks": [{"key": "load", "type": "noop"}], "input_schema": SCHEMA})


def text_of(raw: str) -> str:
    return html.unescape(raw)


def field_errors(body: str, name: str) -> str:
    """The text of the error list of the form field ``name`` ("" when it has none)."""
    start = body.find(f'id="id_{name}_errors"')
    if start < 0:
        return ""
    start = body.index(">", start) + 1
    return " ".join(re.sub(r"<[^>]+>", " ", body[start: body.index("</ul>", start)]).split())


def tag(body: str, field_id: str) -> str:
    """The HTML tag with ``id="<field_id>"``."""
    match = re.search(rf'<(?:input|select|textarea)\b[^>]*\bid="{re.escape(field_id)}"[^>]*>', body)
    assert match, field_id
    return match.group(0)


def label(body: str, field_id: str) -> str:
    match = re.search(rf'<label for="{re.escape(field_id)}">(.*?)</label>', body, re.S)
    assert match, field_id
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def test_the_start_form_has_a_field_per_property_in_the_schemas_order(team, wf):
    raw = client_for(team["member"]).get(f"/workflows/{wf.pk}/").content.decode()
    body = text_of(raw)
    assert_csp_clean(body)
    assert "data-json-object" not in body  # no whole-input textarea
    ids = re.findall(r'<(?:input|select|textarea)\b[^>]*\bid="(id_in-[0-9-]+)"', body)
    assert ids == ["id_in-0", "id_in-1", "id_in-2", "id_in-3", "id_in-4", "id_in-5", "id_in-6-0", "id_in-6-1",
                   "id_in-7", "id_in-8"]
    # Titles label the fields (else the property's name); required ones are marked.
    assert label(body, "id_in-0") == "Day to load *" and label(body, "id_in-8") == "Warehouse code *"
    assert label(body, "id_in-2") == "limit" and label(body, "id_in-6-0") == "Customer id *"
    assert "The day whose orders load." in body
    day = tag(body, "id_in-0")
    assert 'type="date"' in day and "required" in day
    region = tag(body, "id_in-1")
    assert region.startswith("<select")
    assert '<option value="&quot;eu&quot;" selected>eu</option>' in raw  # the default
    limit = tag(body, "id_in-2")
    assert 'type="number"' in limit and 'min="1"' in limit and 'max="500"' in limit and 'value="100"' in limit
    assert 'step="any"' in tag(body, "id_in-3")
    assert 'type="checkbox"' in tag(body, "id_in-4") and "checked" not in tag(body, "id_in-4")
    assert tag(body, "id_in-5").startswith("<select")  # optional, no default: Yes / No / unset
    # The nested object is a fieldset; its required field is not required in HTML (the object is optional).
    assert re.search(r"<legend>Customer\s*</legend>", body)
    assert "required" not in tag(body, "id_in-6-0")
    assert 'type="checkbox"' in tag(body, "id_in-6-1") and "checked" in tag(body, "id_in-6-1")
    assert tag(body, "id_in-7").startswith("<textarea")  # an array: JSON


def test_a_refused_input_is_shown_next_to_each_field_and_nothing_is_stored(team, wf):
    client = client_for(team["member"])
    resp = client.post(f"/workflows/{wf.pk}/start/", {
        "in-0": "2026-02-30", "in-1": '"eu"', "in-2": "0", "in-8": "abc", "in-6-0": "",
        "in-7": '["x", 1]', "in-5": "unknown", "priority": "0"})
    assert resp.status_code == 400
    body = text(resp)
    assert field_errors(body, "in-0") == "'2026-02-30' is not a 'date'"
    assert field_errors(body, "in-2") == "0 is less than the minimum of 1"
    assert field_errors(body, "in-8") == "Does not match the pattern '^[A-Z]{3}$'"
    assert field_errors(body, "in-7") == "/1: 1 is not of type 'string'"
    # The customer fieldset was given (its checkbox turned off), so its id is required.
    assert field_errors(body, "in-6-0") == "A value is required"
    assert field_errors(body, "in-3") == ""
    # What was typed is kept.
    assert 'value="abc"' in tag(body, "id_in-8") and 'value="2026-02-30"' in tag(body, "id_in-0")
    assert not WorkflowRun.objects.for_organization(team["org"]).exists()


def test_a_value_the_form_cannot_read_is_an_error_on_its_field(team, wf):
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {
        "in-0": "2026-03-01", "in-8": "ABC", "in-3": "1,5", "in-7": "[1,", "in-1": '"mars"'})
    assert resp.status_code == 400
    body = text(resp)
    assert field_errors(body, "in-3") == "Enter a number, such as 42 or 0.5."
    assert field_errors(body, "in-7").startswith("Not valid JSON: Expecting value")
    assert "Select a valid choice" in field_errors(body, "in-1")
    assert not WorkflowRun.objects.for_organization(team["org"]).exists()


def test_a_valid_form_starts_a_run_with_typed_values_and_the_defaults(team, wf):
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {
        "in-0": "2026-03-01", "in-1": '"us"', "in-2": "", "in-3": "0.25", "in-5": "false",
        "in-6-0": "c-9", "in-6-1": "on", "in-7": '["a", "b"]', "in-8": "BER", "priority": "2"})
    run = WorkflowRun.objects.for_organization(team["org"]).get()
    assert resp.status_code == 302 and resp["Location"] == f"/runs/{run.pk}/"
    assert run.input == {"day": "2026-03-01", "region": "us", "limit": 100, "ratio": 0.25, "dry_run": False,
                         "notify": False, "customer": {"id": "c-9", "vip": True}, "tags": ["a", "b"],
                         "code": "BER"}
    assert run.priority == 2


def test_blank_optional_fields_and_an_empty_optional_fieldset_are_left_out(team, wf):
    resp = client_for(team["member"]).post(f"/workflows/{wf.pk}/start/", {
        "in-0": "2026-03-01", "in-8": "BER", "in-1": "", "in-5": "unknown", "in-6-1": "on"})
    assert resp.status_code == 302, re.findall(r'class="errorlist"[^>]*>(.*?)</ul>', text(resp), re.S)
    run = WorkflowRun.objects.for_organization(team["org"]).get()
    # region and limit from their defaults; dry_run is a checkbox (always sent); no customer.
    assert run.input == {"day": "2026-03-01", "code": "BER", "region": "eu", "limit": 100, "dry_run": False}


def test_a_schema_the_form_cannot_lay_out_falls_back_to_json_with_the_violations_listed(team):
    wf = apply_definition(organization=team["org"], document={
        "name": "free", "tasks": [{"key": "a", "type": "noop"}],
        "input_schema": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}}})
    client = client_for(team["member"])
    body = text(client.get(f"/workflows/{wf.pk}/"))
    assert "data-json-object" in body and 'id="id_in-0"' not in body
    assert "<summary>Input schema</summary>" in body and "minProperties" in body
    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": '{"a": "x"}'})
    assert resp.status_code == 400
    assert field_errors(text(resp), "input") == "/a: 'x' is not of type 'integer'"
    resp = client.post(f"/workflows/{wf.pk}/start/", {"input": '{"a": 1}'})
    assert resp.status_code == 302
    assert WorkflowRun.objects.for_organization(team["org"]).get().input == {"a": 1}


def test_the_generated_form_escapes_titles_descriptions_and_choices(team):
    evil = "<script>alert(1)</script>"
    wf = apply_definition(organization=team["org"], document={
        "name": "evil", "tasks": [{"key": "a", "type": "noop"}],
        "input_schema": {"properties": {"x": {"title": evil, "description": evil, "enum": [evil]}}}})
    body = client_for(team["member"]).get(f"/workflows/{wf.pk}/").content.decode()
    assert evil not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_the_trigger_list_flags_a_trigger_whose_input_the_latest_version_refuses(team):
    org = team["org"]
    apply_definition(organization=org, document={"name": "orders", "tasks": [{"key": "a", "type": "noop"}]})
    create_trigger(actor=Actor.system(org), data={"name": "nightly", "workflow_name": "orders",
                                                   "cron_expression": "0 2 * * *", "input": {"day": "2026-03-01"}})
    client = client_for(team["member"])
    assert "Input rejected" not in text(client.get("/triggers/"))
    owner = client_for(team["owner"])
    definition = ('{"name": "orders", "tasks": [{"key": "a", "type": "noop"}], "input_schema": '
                  + __import__("json").dumps(SCHEMA) + "}")
    resp = owner.post("/workflows/new/", {"definition": definition, "state": "active"}, follow=True)
    assert "Trigger nightly: its input does not match the input schema of orders v2: /code: a value is required" \
        in text(resp)
    body = text(client.get("/triggers/"))
    assert "Input rejected" in body
    assert "Its input does not match the input schema of orders v2: /code: a value is required" in body
