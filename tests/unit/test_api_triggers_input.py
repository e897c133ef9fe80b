"""A cron trigger's input and priority are checked when it is created or changed, the way
its firings will use them: an input that cannot fill a concurrency key of the workflow's
latest active version (a missing field, an array, a control character) is refused naming
``input`` — service, API and web form — instead of every firing failing; a priority is a
JSON integer (``"3"`` and ``2.0`` refused, not converted). Nothing is stored on a refusal.
Real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from engine.cron import process_trigger
from engine.models import ScheduledTrigger, TaskRun, TriggerFiring
from engine.services import apply_definition
from engine.triggers import TriggerError, create_trigger, update_trigger
from tenancy.actors import Actor
from tenancy.models import Role
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory
from tests.unit.test_web_triggers import field_errors, form_data
from tests.unit.test_web_workflows import client_for, make_team, text

KEYED = {"name": "cust", "tasks": [{"key": "charge", "type": "noop",
                                    "concurrency": {"key": "cust-{{ input.c.id }}", "limit": 1}}]}
PLAIN = {"name": "plain", "tasks": [{"key": "a", "type": "noop"}]}
MISSING = ("no run could start with it: task 'charge': its concurrency key 'cust-{{ input.c.id }}' needs "
           "input.c.id, which the run input does not have")
ARRAY = ("no run could start with it: task 'charge': its concurrency key 'cust-{{ input.c.id }}' needs "
         "input.c.id to be a string, number or boolean, not an array")
NEWLINE = ("no run could start with it: task 'charge': its concurrency key 'cust-{{ input.c.id }}' cannot use "
           "input.c.id: it holds U+000A control character; control characters, line breaks and bidirectional "
           "text controls are not allowed in a key")


def data(**overrides) -> dict:
    return {"name": "t", "workflow_name": "cust", "cron_expression": "0 * * * *", "timezone": "UTC",
            **overrides}


@pytest.mark.django_db
@pytest.mark.parametrize(("run_input", "message"), [
    ({}, MISSING),
    ({"c": {}}, MISSING),
    ({"c": {"id": [1]}}, ARRAY),
    ({"c": {"id": "7\n"}}, NEWLINE),
])
def test_an_input_that_cannot_fill_a_key_refuses_the_trigger_naming_input(org, run_input, message):
    apply_definition(organization=org, document=KEYED)
    with pytest.raises(TriggerError) as excinfo:
        create_trigger(actor=Actor.system(org), data=data(input=run_input))
    assert (excinfo.value.field, excinfo.value.message) == ("input", message)
    assert not ScheduledTrigger.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_an_input_over_the_limit_as_stored_refuses_the_trigger_naming_input(org, settings):
    settings.FLOWFORGE_MAX_INPUT_BYTES = 1000
    apply_definition(organization=org, document=PLAIN)
    with pytest.raises(TriggerError) as excinfo:  # {"a":[ + 4 x 309 digits + 3 commas + ]} = 1247 bytes
        create_trigger(actor=Actor.system(org), data=data(workflow_name="plain", input={"a": [1e308] * 4}))
    assert (excinfo.value.field, excinfo.value.message) == ("input", (
        "is 1247 bytes of JSON as stored (numbers are stored without an exponent); at most 1000 "
        "(FLOWFORGE_MAX_INPUT_BYTES)"))
    assert not ScheduledTrigger.objects.for_organization(org).exists()


@pytest.mark.django_db
def test_an_input_that_fills_the_keys_is_taken_and_its_firing_starts_a_run(org):
    apply_definition(organization=org, document=KEYED)
    trig = create_trigger(actor=Actor.system(org), data=data(input={"c": {"id": 7}}))
    assert process_trigger(trig.pk, trig.next_fire_at + dt.timedelta(seconds=1)) == 1
    firing = TriggerFiring.objects.for_organization(org).get(trigger=trig)
    assert firing.workflow_run_id is not None
    assert TaskRun.objects.for_organization(org).get(workflow_run_id=firing.workflow_run_id).concurrency_key == "cust-7"


@pytest.mark.django_db
def test_a_change_of_input_or_workflow_is_checked_and_a_refusal_changes_nothing(org):
    apply_definition(organization=org, document=KEYED)
    apply_definition(organization=org, document=PLAIN)
    actor = Actor.system(org)
    keyed = create_trigger(actor=actor, data=data(input={"c": {"id": "a"}}))
    with pytest.raises(TriggerError) as excinfo:
        update_trigger(actor=actor, trigger=keyed, data={"input": {"c": {"id": [1]}}})
    assert (excinfo.value.field, excinfo.value.message) == ("input", ARRAY)
    plain = create_trigger(actor=actor, data=data(name="p", workflow_name="plain", input={}))
    # The plain workflow's input {} cannot fill cust's key: moving the trigger there is refused.
    with pytest.raises(TriggerError) as excinfo:
        update_trigger(actor=actor, trigger=plain, data={"workflow_name": "cust"})
    assert (excinfo.value.field, excinfo.value.message) == ("input", MISSING)
    stored = {t.name: (t.workflow_name, t.input) for t in ScheduledTrigger.objects.for_organization(org)}
    assert stored == {"t": ("cust", {"c": {"id": "a"}}), "p": ("plain", {})}
    # Both together are fine; a change of neither (a pause) is not checked again.
    update_trigger(actor=actor, trigger=plain, data={"workflow_name": "cust", "input": {"c": {"id": 1}}})
    update_trigger(actor=actor, trigger=keyed, data={"enabled": False})


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.mark.django_db
def test_the_api_refuses_a_bad_input_or_a_non_integer_priority_with_a_400_naming_it(api_factory):
    api = api_factory()
    apply_definition(organization=api.org, document=KEYED)
    headers = bearer(api.keys[Role.ADMIN])

    def send(method, path, body):
        return getattr(api.client, method)(path, json.dumps(body), content_type="application/json", headers=headers)

    body = {**data(input={"c": {"id": 1}}), "enabled": True}
    for field, value, message in [
        ("input", {}, MISSING),
        ("input", {"c": {"id": [1]}}, ARRAY),
        ("priority", "3", "must be a whole number from -10 to 10, got '3'"),
        ("priority", 2.0, "must be a whole number from -10 to 10, got 2.0"),
        ("priority", True, "must be a whole number from -10 to 10, got True"),
        # Out of range: the same words (engine.states.priority_problem), not DRF's min/max message.
        ("priority", 11, "must be a whole number from -10 to 10, got 11"),
        ("priority", -11, "must be a whole number from -10 to 10, got -11"),
    ]:
        response = send("post", "/api/v1/triggers/", {**body, field: value})
        assert response.status_code == 400, (field, value, response.content)
        assert response.json()["errors"] == {field: [message]}, response.json()
    assert not ScheduledTrigger.objects.for_organization(api.org).exists()
    created = send("post", "/api/v1/triggers/", {**body, "priority": 3})
    assert created.status_code == 201, created.content
    url = f"/api/v1/triggers/{created.json()['id']}/"
    for field, value, message in [("input", {"c": {}}, MISSING),
                                  ("priority", 2.0, "must be a whole number from -10 to 10, got 2.0")]:
        response = send("patch", url, {field: value})
        assert response.status_code == 400, response.content
        assert response.json()["errors"] == {field: [message]}, response.json()
    trig = ScheduledTrigger.objects.for_organization(api.org).get()
    assert (trig.input, trig.priority) == ({"c": {"id": 1}}, 3)


@pytest.mark.django_db
def test_the_web_form_shows_the_refusal_next_to_the_input_or_priority(org):
    team = make_team(org)
    apply_definition(organization=org, document=KEYED)
    client = client_for(team["member"])
    response = client.post("/triggers/new/", form_data(workflow_name="cust", input="{}"))
    assert response.status_code == 400
    assert MISSING[:1].upper() + MISSING[1:] in field_errors(text(response), "input")
    response = client.post("/triggers/new/", form_data(workflow_name="cust", input='{"c": {"id": 1}}',
                                                       priority="2.0"))
    assert response.status_code == 400
    assert "Must be a whole number from -10 to 10, got '2.0'." in field_errors(text(response), "priority")
    assert not ScheduledTrigger.objects.for_organization(org).exists()
