"""The database guards of engine/migrations/0002_definition_guards.py.

Once a workflow version has a run, its tasks, dependencies and its name, version,
definition and description are frozen in the database, so ``QuerySet.update()``,
``bulk_create`` and raw SQL cannot edit what a run executed; its lifecycle ``state``
still changes (archive/restore). A dependency edge must join two tasks of its own
workflow. The migration reverses cleanly.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError

from engine.models import Task, TaskDependency, TaskRun, Workflow, WorkflowRun
from engine.repositories import runs
from engine.services import start_run

GUARD_TRIGGERS = {
    ("ff_workflow_frozen", "core_workflow"),
    ("ff_task_frozen", "core_task"),
    ("ff_taskdependency_frozen", "core_taskdependency"),
    ("ff_taskdependency_same_workflow", "core_taskdependency"),
}
GUARD_FUNCTIONS = {"ff_workflow_has_runs", "ff_guard_workflow_update", "ff_guard_task_change", "ff_guard_edge_workflow"}

TASKS = [
    {"key": "a", "type": "noop"},
    {"key": "b", "type": "noop", "depends_on": ["a"]},
    {"key": "c", "type": "noop"},
]


def refused(write, *, sqlstate: str) -> Exception:
    """Run ``write`` in a savepoint; assert the database refused it with ``sqlstate``.
    Returns the underlying psycopg error."""
    with pytest.raises(IntegrityError) as excinfo:
        with transaction.atomic():
            write()
    cause = excinfo.value.__cause__
    assert cause is not None
    assert cause.sqlstate == sqlstate, f"expected SQLSTATE {sqlstate}, got {cause.sqlstate}: {cause}"
    return cause


def frozen(write, workflow: Workflow) -> str:
    """Assert ``write`` is refused by a 'has runs' guard (restrict_violation); returns the message."""
    cause = refused(write, sqlstate="23001")
    message = cause.diag.message_primary
    assert "has runs" in message
    assert "has runs" in str(cause)
    return message


def tasks_msg(workflow: Workflow) -> str:
    return f"workflow {workflow.pk} has runs: its tasks and dependencies cannot be changed"


def workflow_msg(workflow: Workflow) -> str:
    return f"workflow {workflow.name} v{workflow.version} has runs: its definition cannot be edited (apply a new version instead)"


def task(workflow: Workflow, key: str) -> Task:
    return Task.objects.unscoped().get(workflow=workflow, key=key)


def triggers() -> set[tuple[str, str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tg.tgname, c.relname FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid "
            "WHERE NOT tg.tgisinternal AND tg.tgname LIKE 'ff\\_%%'"
        )
        return set(cur.fetchall())


def functions() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'ff\\_%%'")
        return {r[0] for r in cur.fetchall()}


@pytest.fixture
def wf(org, make_workflow):
    return make_workflow(org, TASKS, name="guarded")


@pytest.fixture
def ran(wf):
    """``wf`` after one run was started."""
    start_run(workflow=wf, run_input={})
    return wf


# --- frozen once run ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_guard_triggers_are_installed():
    assert GUARD_TRIGGERS <= triggers()
    assert GUARD_FUNCTIONS <= functions()


@pytest.mark.django_db
def test_task_config_update_is_refused_once_the_workflow_has_runs(ran):
    message = frozen(
        lambda: Task.objects.unscoped().filter(workflow=ran, key="a").update(config={"changed": True}), ran
    )
    assert message == tasks_msg(ran)
    assert task(ran, "a").config == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, value", [("key", "renamed"), ("type", "sleep"), ("max_attempts", 5), ("timeout_seconds", 9.0), ("position_x", 1)]
)
def test_any_task_column_update_is_refused_once_the_workflow_has_runs(ran, field, value):
    before = task(ran, "c")
    assert frozen(lambda: Task.objects.unscoped().filter(pk=before.pk).update(**{field: value}), ran) == tasks_msg(ran)
    assert getattr(task(ran, "c"), field) == getattr(before, field)


@pytest.mark.django_db
def test_inserting_a_task_is_refused_once_the_workflow_has_runs(ran):
    message = frozen(
        lambda: Task.objects.bulk_create([Task(organization_id=ran.organization_id, workflow=ran, key="d", type="noop")]),
        ran,
    )
    assert message == tasks_msg(ran)
    assert Task.objects.unscoped().filter(workflow=ran).count() == 3


@pytest.mark.django_db
def test_deleting_a_task_with_task_runs_is_protected_by_the_orm(ran):
    with pytest.raises(ProtectedError) as excinfo:
        with transaction.atomic():
            Task.objects.unscoped().filter(workflow=ran, key="c").delete()
    assert {type(o) for o in excinfo.value.protected_objects} == {TaskRun}
    assert Task.objects.unscoped().filter(workflow=ran).count() == 3


@pytest.mark.django_db
def test_deleting_a_task_in_sql_is_refused_once_the_workflow_has_runs(ran):
    c = task(ran, "c")

    def delete():
        with connection.cursor() as cur:
            cur.execute("DELETE FROM core_task WHERE id = %s", [c.pk])

    assert frozen(delete, ran) == tasks_msg(ran)
    assert Task.objects.unscoped().filter(workflow=ran).count() == 3


@pytest.mark.django_db
def test_deleting_a_task_is_refused_even_after_its_task_runs_are_gone(ran):
    """The guard is the workflow having runs, not the task having task runs."""
    TaskRun.objects.unscoped().filter(task__workflow=ran, task__key="c").delete()
    assert frozen(lambda: Task.objects.unscoped().filter(workflow=ran, key="c").delete(), ran) == tasks_msg(ran)
    assert Task.objects.unscoped().filter(workflow=ran).count() == 3


@pytest.mark.django_db
def test_inserting_a_dependency_is_refused_once_the_workflow_has_runs(ran):
    edge = TaskDependency(organization_id=ran.organization_id, workflow=ran, task=task(ran, "c"), depends_on=task(ran, "a"))
    assert frozen(lambda: TaskDependency.objects.bulk_create([edge]), ran) == tasks_msg(ran)
    assert list(TaskDependency.objects.unscoped().filter(workflow=ran).values_list("task__key", "depends_on__key")) == [
        ("b", "a")
    ]


@pytest.mark.django_db
def test_deleting_a_dependency_is_refused_once_the_workflow_has_runs(ran):
    assert frozen(lambda: TaskDependency.objects.unscoped().filter(workflow=ran).delete(), ran) == tasks_msg(ran)
    assert TaskDependency.objects.unscoped().filter(workflow=ran).count() == 1


@pytest.mark.django_db
def test_relabelling_a_dependency_is_refused_once_the_workflow_has_runs(ran):
    assert frozen(lambda: TaskDependency.objects.unscoped().filter(workflow=ran).update(label="x"), ran) == tasks_msg(ran)
    assert TaskDependency.objects.unscoped().get(workflow=ran).label == ""


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field, value",
    [("name", "renamed"), ("definition", {"name": "guarded", "tasks": []}), ("description", "edited"), ("version", 7)],
)
def test_editing_the_workflow_definition_is_refused_once_it_has_runs(ran, field, value):
    before = Workflow.objects.unscoped().get(pk=ran.pk)
    message = frozen(lambda: Workflow.objects.unscoped().filter(pk=ran.pk).update(**{field: value}), ran)
    assert message == workflow_msg(ran)
    assert getattr(Workflow.objects.unscoped().get(pk=ran.pk), field) == getattr(before, field)


@pytest.mark.django_db
def test_moving_a_workflow_with_runs_to_another_organization_is_refused(ran, make_org):
    other = make_org()
    assert frozen(lambda: Workflow.objects.unscoped().filter(pk=ran.pk).update(organization=other), ran) == workflow_msg(ran)
    assert Workflow.objects.unscoped().get(pk=ran.pk).organization_id == ran.organization_id


@pytest.mark.django_db
def test_archiving_and_restoring_a_workflow_with_runs_still_works(ran):
    qs = Workflow.objects.unscoped().filter(pk=ran.pk)
    assert qs.update(state="archived") == 1
    assert qs.get().state == "archived"
    assert qs.update(state="active") == 1
    assert qs.get().state == "active"


@pytest.mark.django_db
def test_rewriting_identical_values_is_not_an_edit(ran):
    """The workflow guard compares values: an update that changes nothing passes."""
    assert Workflow.objects.unscoped().filter(pk=ran.pk).update(name=ran.name, description=ran.description) == 1
    assert Workflow.objects.unscoped().get(pk=ran.pk).name == "guarded"


@pytest.mark.django_db
def test_deleting_a_workflow_with_runs_is_protected(ran):
    with pytest.raises(ProtectedError) as excinfo:
        with transaction.atomic():
            Workflow.objects.unscoped().filter(pk=ran.pk).delete()
    protected_types = {type(o) for o in excinfo.value.protected_objects}
    assert WorkflowRun in protected_types or TaskRun in protected_types
    assert Workflow.objects.unscoped().filter(pk=ran.pk).exists()


@pytest.mark.django_db
def test_deleting_a_workflow_with_runs_in_sql_is_refused_by_the_database(ran):
    run = WorkflowRun.objects.unscoped().get(workflow=ran)

    def delete():
        with connection.cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # Django's FKs are deferred; check now
            cur.execute("DELETE FROM core_workflow WHERE id = %s", [ran.pk])

    cause = refused(delete, sqlstate="23503")  # foreign_key_violation
    assert cause.diag.table_name in {"core_workflowrun", "core_task", "core_taskdependency"}
    assert Workflow.objects.unscoped().filter(pk=ran.pk).exists()
    assert WorkflowRun.objects.unscoped().filter(pk=run.pk).exists()


@pytest.mark.django_db
def test_a_new_version_of_a_frozen_workflow_is_editable(ran, make_workflow):
    v2 = make_workflow(ran.organization, TASKS, name="guarded")
    assert v2.version == 2
    assert Task.objects.unscoped().filter(workflow=v2, key="a").update(config={"v": 2}) == 1
    assert task(v2, "a").config == {"v": 2}
    assert task(ran, "a").config == {}


# --- editable without runs ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_workflow_without_runs_can_be_edited(wf):
    assert not WorkflowRun.objects.unscoped().filter(workflow=wf).exists()
    assert Task.objects.unscoped().filter(workflow=wf, key="a").update(config={"x": 1}, max_attempts=4) == 1
    assert (task(wf, "a").config, task(wf, "a").max_attempts) == ({"x": 1}, 4)

    (d,) = Task.objects.bulk_create([Task(organization_id=wf.organization_id, workflow=wf, key="d", type="noop")])
    TaskDependency.objects.bulk_create(
        [TaskDependency(organization_id=wf.organization_id, workflow=wf, task=d, depends_on=task(wf, "c"), label="then")]
    )
    assert TaskDependency.objects.unscoped().filter(workflow=wf, task=d).get().label == "then"

    assert TaskDependency.objects.unscoped().filter(workflow=wf, task__key="b").delete()[0] == 1
    deleted, _ = Task.objects.unscoped().filter(workflow=wf, key="d").delete()
    assert deleted == 2  # the task and its edge
    assert sorted(Task.objects.unscoped().filter(workflow=wf).values_list("key", flat=True)) == ["a", "b", "c"]

    assert Workflow.objects.unscoped().filter(pk=wf.pk).update(name="renamed", description="d", definition={"k": 1}) == 1
    got = Workflow.objects.unscoped().get(pk=wf.pk)
    assert (got.name, got.description, got.definition) == ("renamed", "d", {"k": 1})


@pytest.mark.django_db
def test_a_workflow_without_runs_can_be_deleted(wf):
    deleted, per_model = Workflow.objects.unscoped().filter(pk=wf.pk).delete()
    assert per_model == {"engine.Workflow": 1, "engine.Task": 3, "engine.TaskDependency": 1}
    assert not Task.objects.unscoped().filter(workflow_id=wf.pk).exists()


@pytest.mark.django_db
def test_a_workflow_whose_runs_were_removed_is_editable_again(ran):
    WorkflowRun.objects.unscoped().filter(workflow=ran).delete()
    assert Task.objects.unscoped().filter(workflow=ran, key="a").update(config={"again": True}) == 1
    assert task(ran, "a").config == {"again": True}


# --- edges stay inside their workflow -----------------------------------------------------------


@pytest.fixture
def two(org, make_workflow):
    return make_workflow(org, TASKS, name="one"), make_workflow(org, TASKS, name="two")


def _edge_refused(write):
    cause = refused(write, sqlstate="23514")  # check_violation
    assert "must join two tasks of workflow" in cause.diag.message_primary
    return cause


@pytest.mark.django_db
def test_a_dependency_joining_tasks_of_two_workflows_is_rejected(two):
    one, other = two
    edge = TaskDependency(organization_id=one.organization_id, workflow=one, task=task(one, "c"), depends_on=task(other, "a"))
    cause = _edge_refused(lambda: TaskDependency.objects.bulk_create([edge]))
    assert str(one.pk) in cause.diag.message_primary
    assert not TaskDependency.objects.unscoped().filter(task=task(one, "c")).exists()


@pytest.mark.django_db
def test_a_dependency_filed_under_another_workflow_than_its_tasks_is_rejected(two):
    one, other = two
    edge = TaskDependency(organization_id=one.organization_id, workflow=other, task=task(one, "c"), depends_on=task(one, "a"))
    _edge_refused(lambda: TaskDependency.objects.bulk_create([edge]))
    assert TaskDependency.objects.unscoped().filter(workflow=other).count() == 1


@pytest.mark.django_db
def test_repointing_a_dependency_at_another_workflows_task_is_rejected(two):
    one, other = two
    _edge_refused(lambda: TaskDependency.objects.unscoped().filter(workflow=one).update(depends_on=task(other, "a")))
    assert TaskDependency.objects.unscoped().get(workflow=one).depends_on_id == task(one, "a").pk


# --- the freeze checks the workflow a row moves into as well (migration 0003) ------------------


@pytest.mark.django_db
def test_moving_a_task_into_a_workflow_with_runs_is_refused(ran, make_workflow):
    spare = make_workflow(ran.organization, [{"key": "extra", "type": "noop"}], name="spare")
    moved = task(spare, "extra")
    with pytest.raises(IntegrityError) as excinfo:
        with transaction.atomic():
            Task.objects.unscoped().filter(pk=moved.pk).update(workflow=ran)
    assert "has runs" in str(excinfo.value)
    assert Task.objects.unscoped().filter(workflow=ran).count() == 3


@pytest.mark.django_db
def test_moving_a_dependency_into_a_workflow_with_runs_is_refused(ran, make_workflow):
    spare = make_workflow(ran.organization, TASKS, name="spare")
    with pytest.raises(IntegrityError) as excinfo:
        with transaction.atomic():
            TaskDependency.objects.unscoped().filter(workflow=spare).update(
                workflow=ran, task=task(ran, "c"), depends_on=task(ran, "a")
            )
    assert "has runs" in str(excinfo.value)
    assert TaskDependency.objects.unscoped().filter(workflow=ran).count() == 1


# --- the migration reverses cleanly -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_guard_migration_reverses_and_reapplies(org, make_workflow):
    wf = make_workflow(org, TASKS, name="migrating")
    with transaction.atomic():  # a run without start_run's on-commit broker nudge
        runs.create_with_task_runs(
            workflow_id=wf.pk, organization_id=wf.organization_id, run_input={}, trigger_source="cli"
        )
    assert GUARD_TRIGGERS <= triggers()
    frozen(lambda: Task.objects.unscoped().filter(workflow=wf, key="a").update(config={"x": 1}), wf)

    try:
        call_command("migrate", "engine", "0001", verbosity=0)
        assert not {t for t in triggers() if t in GUARD_TRIGGERS}
        assert not (GUARD_FUNCTIONS & functions())
        # Without the guards the same write goes through.
        assert Task.objects.unscoped().filter(workflow=wf, key="a").update(config={"x": 1}) == 1
    finally:
        call_command("migrate", verbosity=0)  # every app back to its latest migration

    assert GUARD_TRIGGERS <= triggers()
    assert GUARD_FUNCTIONS <= functions()
    message = frozen(lambda: Task.objects.unscoped().filter(workflow=wf, key="a").update(config={"x": 2}), wf)
    assert message == tasks_msg(wf)
    assert task(wf, "a").config == {"x": 1}
    with connection.cursor() as cur:
        cur.execute("SELECT name FROM django_migrations WHERE app = 'engine' ORDER BY name")
        applied = [r[0] for r in cur.fetchall()]
    assert applied[:2] == ["0001_initial", "0002_definition_guards"]
