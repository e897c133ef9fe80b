"""A service that owns its transaction and retries it on a deadlock says so with
``transaction.atomic(durable=True)``: nested in a caller's transaction (a request's,
under ATOMIC_REQUESTS) it fails loudly instead of retrying inside someone else's
transaction. The views that call it are outside ATOMIC_REQUESTS."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import Client

from engine.models import TaskRunEvent, WorkflowRun
from engine.services import cancel_run, start_run
from tenancy.models import Membership

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(org, make_workflow):
    return start_run(workflow=make_workflow(org, [{"key": "a", "type": "noop"}]), run_input={})


def test_cancel_run_nested_in_a_transaction_raises_and_cancels_nothing(run):
    before = WorkflowRun.objects.unscoped().get(pk=run.pk).state
    assert before in ("pending", "running")
    with pytest.raises(RuntimeError, match="durable"):
        with transaction.atomic():
            cancel_run(run=run)
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == before
    assert not TaskRunEvent.objects.unscoped().filter(workflow_run=run, kind="run_finished").exists()


def test_cancel_run_outside_a_transaction_cancels_in_its_own(run):
    assert cancel_run(run=run) is True
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "cancelled"


def test_the_web_cancel_view_runs_outside_the_request_transaction(org, run):
    client = Client()
    client.force_login(Membership.objects.for_organization(org).get(role="owner").user)
    response = client.post(f"/runs/{run.pk}/cancel/")
    assert response.status_code == 302
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "cancelled"
