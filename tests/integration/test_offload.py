"""Offloaded outputs with real Dramatiq worker processes (issue 21): a 2 MiB output succeeds,
is kept outside the task-run row, comes back whole through the API, reaches its dependent
as a summary, and goes with its run."""

from __future__ import annotations

import os

import pytest
from django.db import connection
from django.test import Client

from engine import offload, retention
from engine.models import OffloadedPayload, TaskRun, WorkflowRun
from engine.services import apply_definition, start_run
from tenancy.apikeys import create_api_key
from tenancy.models import Membership, Role
from tests.integration.conftest import wait_for_run_terminal
from tests.unit.test_api_auth import actor_of, bearer

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SIZE = 2 * 1024 * 1024


def test_a_2_mib_output_is_offloaded_returned_whole_and_removed_with_its_run(stack, org):
    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    wf = apply_definition(organization=org, document={"name": "big", "tasks": [
        {"key": "produce", "type": "python", "config": {"callable": "tests.callables.big_output",
                                                         "params": {"size": SIZE}}},
        {"key": "consume", "type": "python", "depends_on": ["produce"],
         "config": {"callable": "tests.callables.echo"}},
    ]})
    run = start_run(workflow=wf)
    assert wait_for_run_terminal(run, timeout=60) == "succeeded"

    produce = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="produce")
    # The row keeps a summary of a few dozen bytes, not the 2 MiB.
    with connection.cursor() as cur:
        cur.execute("SELECT octet_length(output::text) FROM core_taskrun WHERE id = %s", [produce.pk])
        assert cur.fetchone()[0] < 200
    assert offload.is_ref(produce.output) and produce.output["bytes"] > SIZE
    payload = OffloadedPayload.objects.for_organization(org).get(task_run=produce)
    assert payload.fencing_token == produce.fencing_token and payload.size_bytes == produce.output["bytes"]
    path = offload.storage().path(payload.storage_key)
    # The dependent was handed the summary as that upstream's output.
    consume = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="consume")
    assert consume.output["upstream"]["produce"] == produce.output

    owner = actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))
    _row, key = create_api_key(actor=owner, name="reader", role=Role.VIEWER)
    client = Client()
    url = f"/api/v1/runs/{run.pk}/task-runs/{produce.pk}/output/"
    response = client.get(url, headers=bearer(key))
    assert response.status_code == 200
    body = response.json()
    assert body["offloaded"] is True and body["output"]["size"] == SIZE and body["output"]["blob"] == "x" * SIZE
    detail = client.get(f"/api/v1/runs/{run.pk}/", headers=bearer(key)).json()
    shown = {t["key"]: t["output"] for t in detail["task_runs"]}["produce"]
    assert shown["truncated"] is True and shown["bytes"] == payload.size_bytes and shown["url"].endswith(url)

    assert retention.purge_runs([run.pk]) == (1, 1)
    assert not WorkflowRun.objects.unscoped().filter(pk=run.pk).exists()
    assert not OffloadedPayload.objects.unscoped().filter(pk=payload.pk).exists()
    assert not os.path.exists(path)
    assert client.get(url, headers=bearer(key)).status_code == 404


def test_the_run_page_link_gives_the_whole_offloaded_output(stack, org):
    from tests.unit.test_web_workflows import client_for

    stack.start_worker(processes=1, threads=2)
    stack.start_clock()
    wf = apply_definition(organization=org, document={"name": "big-web", "tasks": [
        {"key": "produce", "type": "python", "config": {"callable": "tests.callables.big_output",
                                                         "params": {"size": 300_000}}}]})
    run = start_run(workflow=wf)
    assert wait_for_run_terminal(run, timeout=60) == "succeeded"
    produce = TaskRun.objects.for_organization(org).get(workflow_run=run, task__key="produce")
    member = client_for(Membership.objects.for_organization(org).get(role=Role.OWNER))
    whole = member.get(f"/runs/{run.pk}/tasks/{produce.pk}/output/")
    assert whole.status_code == 200
    body = whole.json()
    assert body["size"] == 300_000 and body["blob"] == "x" * 300_000
    # Its bytes gone from the storage: a 410 that says so, not a summary passed off as the output.
    payload = OffloadedPayload.objects.for_organization(org).get(task_run=produce)
    offload.storage().delete(payload.storage_key)
    gone = member.get(f"/runs/{run.pk}/tasks/{produce.pk}/output/")
    assert gone.status_code == 410 and "cannot be read" in gone.content.decode()
