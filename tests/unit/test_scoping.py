"""Tenant data cannot be read without an organization scope."""

from __future__ import annotations

import pytest
from django.apps import apps

from engine.models import TaskRun, Workflow
from engine.services import start_run
from tenancy.models import Membership, Organization
from tenancy.scoping import OrganizationScopedManager, UnscopedQueryError


def tenant_models():
    return sorted(
        (m for m in apps.get_models() if any(f.name == "organization" and f.is_relation for f in m._meta.fields)),
        key=lambda m: m._meta.label,
    )


def test_every_model_with_an_organization_is_a_tenant_model_with_the_scoped_manager():
    models = tenant_models()
    assert {m._meta.db_table for m in models} >= {
        "core_workflow", "core_task", "core_workflowrun", "core_taskrun", "core_taskrunevent",
        "core_outboxmessage", "core_scheduledtrigger", "core_idempotencykey", "core_membership", "core_apikey",
    }
    for model in models:
        assert isinstance(model._default_manager, OrganizationScopedManager), model._meta.label
        assert model._meta.get_field("organization").remote_field.model is Organization


@pytest.mark.django_db
@pytest.mark.parametrize("model", tenant_models(), ids=lambda m: m._meta.label)
def test_unscoped_reads_of_every_tenant_model_fail(model):
    qs = model.objects.filter(pk__isnull=False)
    for read in (list, lambda q: q.count(), lambda q: q.exists(), lambda q: q.first(),
                 lambda q: list(q.values_list("pk", flat=True)), lambda q: list(q.iterator())):
        with pytest.raises(UnscopedQueryError, match=f"unscoped query of tenant model {model.__name__}"):
            read(qs)
    with pytest.raises(UnscopedQueryError):
        model.objects.all().update(pk=None)
    with pytest.raises(UnscopedQueryError):
        model.objects.all().delete()


@pytest.mark.django_db
def test_scoped_reads_see_only_their_organization(make_org, make_workflow):
    a, b = make_org("scope-a"), make_org("scope-b")
    wa = make_workflow(a, [{"key": "x", "type": "noop"}], name="same")
    wb = make_workflow(b, [{"key": "x", "type": "noop"}], name="same")
    assert list(Workflow.objects.for_organization(a).values_list("pk", flat=True)) == [wa.pk]
    assert Workflow.objects.for_organization(b).get(name="same") == wb
    assert not Workflow.objects.for_organization(a).filter(pk=wb.pk).exists()
    # Filtering on the organization is an explicit scope too (get_or_create relies on it).
    assert Workflow.objects.filter(organization=a, name="same").get() == wa
    with pytest.raises(ValueError, match="needs an organization"):
        Workflow.objects.for_organization(None)
    assert Workflow.objects.unscoped().filter(name="same").count() == 2


@pytest.mark.django_db
def test_related_managers_of_a_loaded_object_are_scoped_by_it(org, make_workflow):
    wf = make_workflow(org, [{"key": "x", "type": "noop"}, {"key": "y", "type": "noop", "depends_on": ["x"]}])
    run = start_run(workflow=wf)
    assert sorted(tr.task.key for tr in run.task_runs.select_related("task")) == ["x", "y"]
    assert wf.tasks.count() == 2
    fetched = Workflow.objects.for_organization(org).prefetch_related("tasks").get(pk=wf.pk)
    assert sorted(t.key for t in fetched.tasks.all()) == ["x", "y"]
    # Forward access and refresh go through Django's plain base manager.
    tr = TaskRun.objects.for_organization(org).first()
    assert tr.workflow_run == run
    tr.refresh_from_db()
    assert Membership.objects.for_organization(org).get().role == "owner"


@pytest.mark.django_db(transaction=True)
def test_run_history_goes_only_with_its_run_never_by_tenant(make_org, make_workflow):
    """Events and outbox rows have neither an index nor a constraint on their tenant
    (migration 0013): an organization with runs cannot be deleted at all (its history is
    protected), and deleting a run deletes its events and outbox rows through the run."""
    from django.db.models import ProtectedError

    from engine.models import OutboxMessage, TaskRunEvent
    from engine.repositories import task_runs

    a, b = make_org("del-a"), make_org("del-b")
    run_a, _run_b = (start_run(workflow=make_workflow(org, [{"key": "x", "type": "noop"}], name="wf"))
                     for org in (a, b))
    assert len(task_runs.claim_ready_many(limit=10, lease_seconds=60, owner="o")) == 2  # one outbox row each

    with pytest.raises(ProtectedError):
        a.delete()
    run_a.delete()

    for model in (TaskRunEvent, OutboxMessage, TaskRun):
        assert not model.objects.unscoped().filter(organization_id=a.pk).exists(), model
        assert model.objects.unscoped().filter(organization_id=b.pk).exists(), model
