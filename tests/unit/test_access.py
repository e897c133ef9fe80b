"""The access helpers (engine.access, tenancy.access): an object of the caller's
organization is returned; a missing id, another organization's id and a malformed id
all raise the same ObjectNotFound with the same message (an id never confirms that
another tenant has it), and both the web UI and the API answer it with the same 404."""

from __future__ import annotations

import re
import uuid

import pytest
from django.http import Http404

from engine.access import access_run, access_task_run, access_trigger, access_workflow
from engine.models import TaskRun
from engine.triggers import create_trigger
from tenancy.access import ObjectNotFound, access_api_key, access_invitation, access_membership
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tenancy.services import invite_member
from tests.unit.test_web_runs import actor_for, client_for, make_run, owner_of


def the_error(call) -> str:
    """The message of the ObjectNotFound ``call`` raises (it must raise one)."""
    with pytest.raises(ObjectNotFound) as caught:
        call()
    assert isinstance(caught.value, Http404)
    return str(caught.value)


def objects_of(org) -> dict:
    """One object of each kind the helpers read, in ``org``."""
    actor = actor_for(org)
    run = make_run(org, 2)
    trigger = create_trigger(actor=actor, data={
        "name": f"t-{uuid.uuid4().hex[:6]}", "workflow_name": run.workflow.name, "cron_expression": "0 * * * *",
        "timezone": "UTC", "input": {}, "catch_up": "latest", "enabled": True})
    invitation, _ = invite_member(actor=actor, email=f"{uuid.uuid4().hex[:8]}@example.com", role=Role.MEMBER)
    api_key, _ = create_api_key(actor=actor, name="k", role=Role.MEMBER)
    return {
        "run": run,
        "workflow": run.workflow,
        "task_run": TaskRun.objects.for_organization(org).filter(workflow_run=run).first(),
        "trigger": trigger,
        "membership": Membership.objects.for_organization(org).get(role=Role.OWNER),
        "invitation": invitation,
        "api_key": api_key,
    }


READERS = {
    "run": lambda who, obj_id, mine: access_run(who, obj_id),
    "workflow": lambda who, obj_id, mine: access_workflow(who, obj_id),
    "task_run": lambda who, obj_id, mine: access_task_run(who, mine["run"].pk, obj_id),
    "trigger": lambda who, obj_id, mine: access_trigger(who, obj_id),
    "membership": lambda who, obj_id, mine: access_membership(who, obj_id),
    "invitation": lambda who, obj_id, mine: access_invitation(who, obj_id),
    "api_key": lambda who, obj_id, mine: access_api_key(who, obj_id),
}


@pytest.mark.parametrize("kind", sorted(READERS))
def test_missing_foreign_and_malformed_ids_give_the_same_not_found(make_org, kind):
    org, other = make_org(), make_org()
    mine, theirs = objects_of(org), objects_of(other)
    read = READERS[kind]
    # The caller's own object, whether named by an Actor, an Organization or its id.
    for who in (actor_for(org), org, org.pk):
        assert read(who, mine[kind].pk, mine).pk == mine[kind].pk
    missing = the_error(lambda: read(org, uuid.uuid4(), mine))
    foreign = the_error(lambda: read(org, theirs[kind].pk, mine))
    malformed = the_error(lambda: read(org, "not-an-id", mine))
    assert missing == foreign == malformed
    assert missing.startswith("no such ")


def test_a_task_run_of_another_run_is_not_found_like_a_missing_one(make_org):
    org = make_org()
    first, second = make_run(org, 2), make_run(org, 2)
    task_run = TaskRun.objects.for_organization(org).filter(workflow_run=first).first()
    assert access_task_run(org, first.pk, task_run.pk).pk == task_run.pk
    assert the_error(lambda: access_task_run(org, second.pk, task_run.pk)) == the_error(
        lambda: access_task_run(org, first.pk, uuid.uuid4())) == the_error(
        lambda: access_task_run(org, "nope", task_run.pk))


def test_no_organization_is_a_bug_not_a_404():
    with pytest.raises(ValueError):
        access_run(None, uuid.uuid4())


def test_the_web_and_the_api_answer_a_foreign_run_like_a_missing_one(make_org):
    org, other = make_org(), make_org()
    foreign = make_run(other, 2)
    client = client_for(owner_of(org))
    for path in ("/runs/{}/", "/runs/{}/events/", "/api/v1/runs/{}/", "/api/v1/runs/{}/events/"):
        got_foreign = client.get(path.format(foreign.pk))
        got_missing = client.get(path.format(uuid.uuid4()))
        assert got_foreign.status_code == got_missing.status_code == 404, path
        assert same_page(got_foreign.content) == same_page(got_missing.content), path


def same_page(content: bytes) -> bytes:
    """A response body without its per-response values (CSP nonces, CSRF tokens: long
    random runs of letters and digits)."""
    return re.sub(rb"[A-Za-z0-9_+/=-]{20,}", b"<token>", content)
