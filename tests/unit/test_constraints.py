"""Every CHECK and UNIQUE constraint of seed 000 (plus the extra ones declared in
engine/models.py and tenancy/models.py) holds when Python validation is bypassed.

Each test builds valid rows first, then writes the violating value through
``QuerySet.update()`` or ``bulk_create`` and asserts that PostgreSQL rejected it
naming the constraint (``exc.__cause__.diag.constraint_name``). Every violating
write runs inside ``transaction.atomic()`` so the test transaction stays usable,
and most tests then prove the row is unchanged.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from engine.models import (
    IdempotencyKey,
    OutboxMessage,
    ScheduledTrigger,
    Task,
    TaskDependency,
    TaskRun,
    TaskRunEvent,
    Workflow,
    WorkflowRun,
)
from engine.services import start_run
from engine.states import EventKind, SkipReason, TriggerRule
from tenancy.models import ApiKey, Invitation, Membership, Secret, User

pytestmark = pytest.mark.django_db

NOOP = {"type": "noop"}


def violation(constraint: str, write) -> IntegrityError:
    """Run ``write`` in a savepoint; assert PostgreSQL rejected it naming ``constraint``."""
    with pytest.raises(IntegrityError) as excinfo:
        with transaction.atomic():
            write()
    cause = excinfo.value.__cause__
    assert cause is not None, "IntegrityError without the underlying psycopg error"
    name = cause.diag.constraint_name
    with connection.cursor() as cur:  # a partition's copy of its table's constraint: the table's name
        cur.execute("SELECT p.conname FROM pg_constraint c JOIN pg_constraint p ON p.oid = c.conparentid "
                    "WHERE c.conname = %s", [name])
        row = cur.fetchone()
    assert (row[0] if row else name) == constraint, (
        f"expected constraint {constraint!r}, database named {name!r}: {cause}"
    )
    return excinfo.value


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def chain(org, make_workflow):
    """A workflow a -> b (b depends on a), no runs yet."""
    return make_workflow(org, [{"key": "a", **NOOP}, {"key": "b", **NOOP, "depends_on": ["a"]}], name="chain")


@pytest.fixture
def run(chain):
    """A running run of ``chain``: task run a is ready, b pending."""
    return start_run(workflow=chain, run_input={})


def task_run(run, key: str) -> TaskRun:
    return TaskRun.objects.unscoped().get(workflow_run=run, task__key=key)


def owner_of(org) -> User:
    return Membership.objects.for_organization(org).get(role="owner").user


# --- Workflow -----------------------------------------------------------------------------------


def test_renaming_a_workflow_onto_an_existing_name_and_version_violates_uniq_workflow_name_version(
    org, make_workflow
):
    make_workflow(org, [{"key": "a", **NOOP}], name="etl")
    other = make_workflow(org, [{"key": "a", **NOOP}], name="load")
    assert (other.version, Workflow.objects.for_organization(org).get(name="etl").version) == (1, 1)

    violation(
        "uniq_workflow_name_version",
        lambda: Workflow.objects.unscoped().filter(pk=other.pk).update(name="etl"),
    )
    assert Workflow.objects.unscoped().get(pk=other.pk).name == "load"


def test_bulk_inserting_a_second_v1_of_a_name_violates_uniq_workflow_name_version(org, make_workflow):
    make_workflow(org, [{"key": "a", **NOOP}], name="etl")

    violation(
        "uniq_workflow_name_version",
        lambda: Workflow.objects.bulk_create([Workflow(organization=org, name="etl", version=1)]),
    )
    assert Workflow.objects.for_organization(org).filter(name="etl").count() == 1


def test_same_name_and_version_in_two_organizations_is_allowed(make_org, make_workflow):
    a, b = make_org(), make_org()
    make_workflow(a, [{"key": "a", **NOOP}], name="etl")
    make_workflow(b, [{"key": "a", **NOOP}], name="etl")
    assert Workflow.objects.unscoped().filter(name="etl", version=1).count() == 2


@pytest.mark.parametrize("version", [0, -1])
def test_workflow_version_below_one_violates_workflow_version_positive(chain, version):
    violation(
        "workflow_version_positive",
        lambda: Workflow.objects.unscoped().filter(pk=chain.pk).update(version=version),
    )
    assert Workflow.objects.unscoped().get(pk=chain.pk).version == 1


def test_unknown_workflow_state_violates_workflow_state_valid(chain):
    violation("workflow_state_valid", lambda: Workflow.objects.unscoped().filter(pk=chain.pk).update(state="deleted"))
    assert Workflow.objects.unscoped().get(pk=chain.pk).state == "active"


def test_every_declared_workflow_state_is_accepted(chain):
    for state in ("draft", "archived", "active"):
        assert Workflow.objects.unscoped().filter(pk=chain.pk).update(state=state) == 1
        assert Workflow.objects.unscoped().get(pk=chain.pk).state == state


# --- Task ---------------------------------------------------------------------------------------


def test_renaming_a_task_onto_a_sibling_key_violates_uniq_task_workflow_key(chain):
    violation(
        "uniq_task_workflow_key",
        lambda: Task.objects.unscoped().filter(workflow=chain, key="b").update(key="a"),
    )
    assert sorted(Task.objects.unscoped().filter(workflow=chain).values_list("key", flat=True)) == ["a", "b"]


def test_bulk_inserting_a_duplicate_task_key_violates_uniq_task_workflow_key(chain):
    violation(
        "uniq_task_workflow_key",
        lambda: Task.objects.bulk_create([Task(organization_id=chain.organization_id, workflow=chain, key="a", type="noop")]),
    )
    assert Task.objects.unscoped().filter(workflow=chain).count() == 2


def test_same_task_key_in_two_workflows_is_allowed(org, make_workflow):
    make_workflow(org, [{"key": "a", **NOOP}], name="one")
    make_workflow(org, [{"key": "a", **NOOP}], name="two")
    assert Task.objects.for_organization(org).filter(key="a").count() == 2


@pytest.mark.parametrize("value", [0, -3])
def test_max_attempts_below_one_violates_task_max_attempts_positive(chain, value):
    violation(
        "task_max_attempts_positive",
        lambda: Task.objects.unscoped().filter(workflow=chain, key="a").update(max_attempts=value),
    )
    assert Task.objects.unscoped().get(workflow=chain, key="a").max_attempts == 1


def test_negative_retry_backoff_violates_task_retry_backoff_non_negative(chain):
    violation(
        "task_retry_backoff_non_negative",
        lambda: Task.objects.unscoped().filter(workflow=chain, key="a").update(retry_backoff_seconds=-0.5),
    )
    assert Task.objects.unscoped().get(workflow=chain, key="a").retry_backoff_seconds == 1.0


def test_zero_retry_backoff_is_allowed(chain):
    assert Task.objects.unscoped().filter(workflow=chain, key="a").update(retry_backoff_seconds=0) == 1
    assert Task.objects.unscoped().get(workflow=chain, key="a").retry_backoff_seconds == 0.0


@pytest.mark.parametrize("value", [0, -1.5])
def test_non_positive_timeout_violates_task_timeout_positive(chain, value):
    violation(
        "task_timeout_positive",
        lambda: Task.objects.unscoped().filter(workflow=chain, key="a").update(timeout_seconds=value),
    )
    assert Task.objects.unscoped().get(workflow=chain, key="a").timeout_seconds is None


def test_null_or_positive_timeout_is_allowed(chain):
    qs = Task.objects.unscoped().filter(workflow=chain, key="a")
    assert qs.update(timeout_seconds=0.5) == 1
    assert qs.get().timeout_seconds == 0.5
    assert qs.update(timeout_seconds=None) == 1
    assert qs.get().timeout_seconds is None


# --- TaskDependency -----------------------------------------------------------------------------


def test_bulk_inserting_the_same_edge_twice_violates_uniq_taskdep_edge(chain):
    a = Task.objects.unscoped().get(workflow=chain, key="a")
    b = Task.objects.unscoped().get(workflow=chain, key="b")
    violation(
        "uniq_taskdep_edge",
        lambda: TaskDependency.objects.bulk_create(
            [TaskDependency(organization_id=chain.organization_id, workflow=chain, task=b, depends_on=a)]
        ),
    )
    assert TaskDependency.objects.unscoped().filter(workflow=chain).count() == 1


def _disable_user_triggers():
    """Let a write reach the CHECK constraints behind the definition guards' BEFORE
    triggers (which would otherwise reject the row first, without a constraint name).
    Transaction-local: the test transaction's rollback restores it."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL session_replication_role = replica")


def test_self_edge_violates_taskdep_no_self_edge(chain):
    _disable_user_triggers()
    b = Task.objects.unscoped().get(workflow=chain, key="b")
    violation(
        "taskdep_no_self_edge",
        lambda: TaskDependency.objects.unscoped().filter(workflow=chain).update(depends_on=b),
    )
    violation(
        "taskdep_no_self_edge",
        lambda: TaskDependency.objects.bulk_create(
            [TaskDependency(organization_id=chain.organization_id, workflow=chain, task=b, depends_on=b)]
        ),
    )
    edge = TaskDependency.objects.unscoped().get(workflow=chain)
    assert (edge.task.key, edge.depends_on.key) == ("b", "a")


def test_self_edge_is_rejected_by_its_named_check_with_the_guards_enabled(chain):
    """With the definition guards active the self-edge passes the same-workflow trigger
    (migration 0003) and is refused by ``taskdep_no_self_edge``, named."""
    b = Task.objects.unscoped().get(workflow=chain, key="b")
    with pytest.raises(IntegrityError) as excinfo:
        with transaction.atomic():
            TaskDependency.objects.unscoped().filter(workflow=chain).update(depends_on=b)
    cause = excinfo.value.__cause__
    assert cause.sqlstate == "23514"  # check_violation
    assert cause.diag.constraint_name == "taskdep_no_self_edge"
    assert TaskDependency.objects.unscoped().get(workflow=chain).depends_on.key == "a"


# --- WorkflowRun --------------------------------------------------------------------------------


def test_unknown_run_state_violates_wfrun_state_valid(run):
    violation("wfrun_state_valid", lambda: WorkflowRun.objects.unscoped().filter(pk=run.pk).update(state="suceeded"))
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "running"


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_terminal_run_without_finished_at_violates_wfrun_finished_at_matches_state(run, state):
    assert run.finished_at is None
    violation(
        "wfrun_finished_at_matches_state",
        lambda: WorkflowRun.objects.unscoped().filter(pk=run.pk).update(state=state),
    )
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).state == "running"


@pytest.mark.parametrize("state", ["running", "pending"])
def test_non_terminal_run_with_finished_at_violates_wfrun_finished_at_matches_state(run, state):
    qs = WorkflowRun.objects.unscoped().filter(pk=run.pk)
    qs.update(state=state)
    violation("wfrun_finished_at_matches_state", lambda: qs.update(finished_at=timezone.now()))
    assert qs.get().finished_at is None


def test_terminal_run_with_finished_at_satisfies_wfrun_finished_at_matches_state(run):
    now = timezone.now()
    qs = WorkflowRun.objects.unscoped().filter(pk=run.pk)
    assert qs.update(state="succeeded", finished_at=now) == 1
    assert (qs.get().state, qs.get().finished_at) == ("succeeded", now)


def test_negative_last_event_seq_violates_wfrun_event_seq_non_negative(run):
    violation(
        "wfrun_event_seq_non_negative",
        lambda: WorkflowRun.objects.unscoped().filter(pk=run.pk).update(last_event_seq=-1),
    )
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).last_event_seq == 1  # the run_started event


# --- TaskRun ------------------------------------------------------------------------------------


def test_start_run_writes_roots_ready_and_dependents_pending(run):
    states = dict(TaskRun.objects.unscoped().filter(workflow_run=run).values_list("task__key", "state"))
    assert states == {"a": "ready", "b": "pending"}


def test_pointing_a_task_run_at_its_siblings_task_violates_uniq_taskrun_per_run_task(run):
    b = task_run(run, "b")
    violation(
        "uniq_taskrun_per_run_task",
        lambda: TaskRun.objects.unscoped().filter(pk=b.pk).update(task=task_run(run, "a").task),
    )
    assert task_run(run, "b").pk == b.pk


def test_bulk_inserting_a_second_task_run_for_a_task_violates_uniq_taskrun_per_run_task(run):
    a = task_run(run, "a")
    violation(
        "uniq_taskrun_per_run_task",
        lambda: TaskRun.objects.bulk_create(
            [TaskRun(organization_id=run.organization_id, workflow_run=run, task_id=a.task_id, state="pending")]
        ),
    )
    assert TaskRun.objects.unscoped().filter(workflow_run=run).count() == 2


def test_unknown_task_run_state_violates_taskrun_state_valid(run):
    a = task_run(run, "a")
    violation("taskrun_state_valid", lambda: TaskRun.objects.unscoped().filter(pk=a.pk).update(state="retrying"))
    assert task_run(run, "a").state == "ready"


@pytest.mark.parametrize("value", [0, -1])
def test_attempt_below_one_violates_taskrun_attempt_positive(run, value):
    a = task_run(run, "a")
    violation("taskrun_attempt_positive", lambda: TaskRun.objects.unscoped().filter(pk=a.pk).update(attempt=value))
    assert task_run(run, "a").attempt == 1


@pytest.mark.parametrize(("attempt", "base"), [(1, -1), (1, 1), (3, 4)])
def test_an_attempt_base_not_below_the_attempt_violates_taskrun_attempt_base_valid(run, attempt, base):
    a = task_run(run, "a")
    violation("taskrun_attempt_base_valid",
              lambda: TaskRun.objects.unscoped().filter(pk=a.pk).update(attempt=attempt, attempt_base=base))
    assert (task_run(run, "a").attempt, task_run(run, "a").attempt_base) == (1, 0)


def test_an_attempt_base_below_the_attempt_satisfies_taskrun_attempt_base_valid(run):
    a = task_run(run, "a")
    TaskRun.objects.unscoped().filter(pk=a.pk).update(attempt=4, attempt_base=3)
    assert (task_run(run, "a").attempt, task_run(run, "a").attempt_base) == (4, 3)


def test_negative_fencing_token_violates_taskrun_fencing_non_negative(run):
    a = task_run(run, "a")
    violation(
        "taskrun_fencing_non_negative",
        lambda: TaskRun.objects.unscoped().filter(pk=a.pk).update(fencing_token=-1),
    )
    assert task_run(run, "a").fencing_token == 0


def test_finished_before_started_violates_taskrun_finished_after_started(run):
    a = task_run(run, "a")
    started = timezone.now()
    qs = TaskRun.objects.unscoped().filter(pk=a.pk)
    violation(
        "taskrun_finished_after_started",
        lambda: qs.update(state="succeeded", started_at=started, finished_at=started - dt.timedelta(seconds=1)),
    )
    assert (qs.get().started_at, qs.get().finished_at) == (None, None)
    # Equal instants and either side NULL are fine.
    assert qs.update(state="succeeded", started_at=started, finished_at=started) == 1
    assert qs.update(started_at=None, finished_at=started) == 1
    assert (qs.get().started_at, qs.get().finished_at) == (None, started)


def test_running_without_a_lease_violates_taskrun_lease_iff_running(run):
    a = task_run(run, "a")
    violation("taskrun_lease_iff_running", lambda: TaskRun.objects.unscoped().filter(pk=a.pk).update(state="running"))
    assert task_run(run, "a").state == "ready"


@pytest.mark.parametrize("state", ["pending", "ready", "succeeded", "failed", "skipped", "cancelled"])
def test_a_lease_on_a_non_running_task_run_violates_taskrun_lease_iff_running(run, state):
    a = task_run(run, "a")
    violation(
        "taskrun_lease_iff_running",
        lambda: TaskRun.objects.unscoped()
        .filter(pk=a.pk)
        .update(state=state, lease_expires_at=timezone.now() + dt.timedelta(minutes=1)),
    )
    assert task_run(run, "a").lease_expires_at is None


def test_clearing_the_lease_of_a_running_task_run_violates_taskrun_lease_iff_running(run):
    a = task_run(run, "a")
    qs = TaskRun.objects.unscoped().filter(pk=a.pk)
    expires = timezone.now() + dt.timedelta(minutes=1)
    assert qs.update(state="running", lease_owner="w1", lease_expires_at=expires) == 1
    violation("taskrun_lease_iff_running", lambda: qs.update(lease_expires_at=None))
    assert (qs.get().state, qs.get().lease_expires_at) == ("running", expires)


# --- OutboxMessage ------------------------------------------------------------------------------


def _outbox(tr: TaskRun, token: int, **kw) -> OutboxMessage:
    return OutboxMessage(
        organization_id=tr.organization_id,
        task_run=tr,
        workflow_run_id=tr.workflow_run_id,
        routing_key="tasks",
        payload={"task_run_id": str(tr.pk), "fencing_token": token},
        fencing_token_snapshot=token,
        attempt_snapshot=tr.attempt,
        **kw,
    )


def test_two_dispatch_rows_for_one_generation_violate_uniq_outbox_per_taskrun_generation(run):
    a = task_run(run, "a")
    OutboxMessage.objects.bulk_create([_outbox(a, 1)])
    violation("uniq_outbox_per_taskrun_generation", lambda: OutboxMessage.objects.bulk_create([_outbox(a, 1)]))
    # A new generation is a new row.
    OutboxMessage.objects.bulk_create([_outbox(a, 2)])
    assert sorted(OutboxMessage.objects.unscoped().filter(task_run=a).values_list("fencing_token_snapshot", flat=True)) == [1, 2]


def test_renumbering_a_dispatch_onto_an_existing_generation_violates_uniq_outbox_per_taskrun_generation(run):
    a = task_run(run, "a")
    first, second = OutboxMessage.objects.bulk_create([_outbox(a, 1), _outbox(a, 2)])
    violation(
        "uniq_outbox_per_taskrun_generation",
        lambda: OutboxMessage.objects.unscoped().filter(pk=second.pk).update(fencing_token_snapshot=1),
    )
    assert OutboxMessage.objects.unscoped().get(pk=second.pk).fencing_token_snapshot == 2


def test_negative_publish_attempts_violates_outbox_attempts_non_negative(run):
    a = task_run(run, "a")
    (msg,) = OutboxMessage.objects.bulk_create([_outbox(a, 1)])
    violation(
        "outbox_attempts_non_negative",
        lambda: OutboxMessage.objects.unscoped().filter(pk=msg.pk).update(publish_attempts=-1),
    )
    violation("outbox_attempts_non_negative", lambda: OutboxMessage.objects.bulk_create([_outbox(a, 2, publish_attempts=-2)]))
    assert OutboxMessage.objects.unscoped().get(pk=msg.pk).publish_attempts == 0


# --- TaskRunEvent -------------------------------------------------------------------------------


def test_a_second_event_with_a_taken_seq_violates_uniq_event_run_seq(run):
    (started,) = TaskRunEvent.objects.unscoped().filter(workflow_run=run)
    assert (started.kind, started.seq) == ("run_started", 1)
    violation(
        "uniq_event_run_seq",
        lambda: TaskRunEvent.objects.bulk_create(
            [TaskRunEvent(organization_id=run.organization_id, workflow_run=run, run_created_at=run.created_at, seq=1, kind="promoted")]
        ),
    )
    (extra,) = TaskRunEvent.objects.bulk_create(
        [TaskRunEvent(organization_id=run.organization_id, workflow_run=run, run_created_at=run.created_at, seq=2, kind="promoted")]
    )
    violation("uniq_event_run_seq", lambda: TaskRunEvent.objects.unscoped().filter(pk=extra.pk).update(seq=1))
    assert sorted(TaskRunEvent.objects.unscoped().filter(workflow_run=run).values_list("seq", flat=True)) == [1, 2]


def test_an_event_of_an_unknown_kind_violates_taskrunevent_kind_valid(run):
    violation(
        "taskrunevent_kind_valid",
        lambda: TaskRunEvent.objects.bulk_create(
            [TaskRunEvent(organization_id=run.organization_id, workflow_run=run, run_created_at=run.created_at, seq=2, kind="forged")]
        ),
    )
    (started,) = TaskRunEvent.objects.unscoped().filter(workflow_run=run)
    violation("taskrunevent_kind_valid", lambda: TaskRunEvent.objects.unscoped().filter(pk=started.pk).update(
        kind="run_begun"))
    assert TaskRunEvent.objects.unscoped().get(pk=started.pk).kind == "run_started"


def test_every_event_kind_of_the_enum_is_accepted_by_taskrunevent_kind_valid(run):
    """The enum and the CHECK list the same kinds: each member can be written."""
    kinds = list(EventKind)
    assert len(kinds) == len(set(EventKind.values)) >= 16
    TaskRunEvent.objects.bulk_create([
        TaskRunEvent(organization_id=run.organization_id, workflow_run=run, run_created_at=run.created_at, seq=2 + i, kind=kind)
        for i, kind in enumerate(kinds)
    ])
    stored = TaskRunEvent.objects.unscoped().filter(workflow_run=run, seq__gte=2).values_list("kind", flat=True)
    assert sorted(stored) == sorted(EventKind.values)


# --- IdempotencyKey -----------------------------------------------------------------------------


def _idem(org, user, key: str) -> IdempotencyKey:
    return IdempotencyKey(
        organization=org, user=user, key=key, request_hash="0" * 64, expires_at=timezone.now() + dt.timedelta(days=1)
    )


def test_same_key_for_the_same_user_violates_uniq_idempotency_org_user_key(org):
    user = owner_of(org)
    IdempotencyKey.objects.bulk_create([_idem(org, user, "k1")])
    violation("uniq_idempotency_org_user_key", lambda: IdempotencyKey.objects.bulk_create([_idem(org, user, "k1")]))
    assert IdempotencyKey.objects.for_organization(org).filter(key="k1").count() == 1


def test_same_key_without_a_user_collides_because_nulls_are_not_distinct(org):
    IdempotencyKey.objects.bulk_create([_idem(org, None, "system-key")])
    violation(
        "uniq_idempotency_org_user_key",
        lambda: IdempotencyKey.objects.bulk_create([_idem(org, None, "system-key")]),
    )
    # And through an update of another NULL-user key onto the same key.
    (other,) = IdempotencyKey.objects.bulk_create([_idem(org, None, "other-key")])
    violation(
        "uniq_idempotency_org_user_key",
        lambda: IdempotencyKey.objects.unscoped().filter(pk=other.pk).update(key="system-key"),
    )
    assert IdempotencyKey.objects.for_organization(org).filter(user=None, key="system-key").count() == 1


def test_same_key_is_allowed_for_another_user_or_another_organization(make_org):
    a, b = make_org(), make_org()
    IdempotencyKey.objects.bulk_create(
        [_idem(a, owner_of(a), "k"), _idem(a, None, "k"), _idem(b, owner_of(b), "k"), _idem(b, None, "k")]
    )
    assert IdempotencyKey.objects.unscoped().filter(key="k").count() == 4


# --- Membership ---------------------------------------------------------------------------------


def test_a_second_membership_of_a_user_violates_uniq_membership_org_user(org):
    user = owner_of(org)
    violation(
        "uniq_membership_org_user",
        lambda: Membership.objects.bulk_create([Membership(organization=org, user=user, role="viewer")]),
    )
    assert Membership.objects.for_organization(org).filter(user=user).count() == 1


def test_unknown_role_violates_membership_role_valid(org):
    violation("membership_role_valid", lambda: Membership.objects.for_organization(org).update(role="superadmin"))
    assert list(Membership.objects.for_organization(org).values_list("role", flat=True)) == ["owner"]


def test_every_declared_role_is_accepted(org):
    qs = Membership.objects.for_organization(org)
    for role in ("admin", "member", "viewer", "owner"):
        assert qs.update(role=role) == 1
        assert qs.get().role == role


# --- ScheduledTrigger ---------------------------------------------------------------------------


def _trigger(org, name: str, **kw) -> ScheduledTrigger:
    return ScheduledTrigger(organization=org, name=name, workflow_name="etl", cron_expression="*/5 * * * *", **kw)


def test_two_triggers_with_one_name_violate_uniq_trigger_org_name(make_org):
    org, other_org = make_org(), make_org()
    ScheduledTrigger.objects.bulk_create([_trigger(org, "nightly"), _trigger(other_org, "nightly")])
    violation("uniq_trigger_org_name", lambda: ScheduledTrigger.objects.bulk_create([_trigger(org, "nightly")]))
    (hourly,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "hourly")])
    violation(
        "uniq_trigger_org_name",
        lambda: ScheduledTrigger.objects.unscoped().filter(pk=hourly.pk).update(name="nightly"),
    )
    assert ScheduledTrigger.objects.unscoped().filter(name="nightly").count() == 2


def test_unknown_catch_up_policy_violates_trigger_catch_up_valid(org):
    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "nightly")])
    violation(
        "trigger_catch_up_valid",
        lambda: ScheduledTrigger.objects.unscoped().filter(pk=trig.pk).update(catch_up="never"),
    )
    violation(
        "trigger_catch_up_valid",
        lambda: ScheduledTrigger.objects.bulk_create([_trigger(org, "other", catch_up="")]),
    )
    assert ScheduledTrigger.objects.unscoped().get(pk=trig.pk).catch_up == "latest"


def test_a_trigger_priority_outside_minus_10_to_10_violates_trigger_priority_range(org):
    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "nightly")])
    qs = ScheduledTrigger.objects.unscoped().filter(pk=trig.pk)
    violation("trigger_priority_range", lambda: qs.update(priority=11))
    violation("trigger_priority_range", lambda: qs.update(priority=-11))
    assert qs.update(priority=-10) == 1 and qs.update(priority=10) == 1


# --- ApiKey and Invitation (tenancy extras) -----------------------------------------------------


def _key(org, prefix: str, **kw) -> ApiKey:
    return ApiKey(organization=org, name=f"key {prefix}", prefix=prefix, hashed_key="argon2$not-a-secret", **kw)


def test_a_reused_api_key_prefix_violates_uniq_apikey_prefix(make_org):
    a, b = make_org(), make_org()
    ApiKey.objects.bulk_create([_key(a, "abcd1234")])
    # Prefixes are unique across organizations: the prefix alone finds the key.
    violation("uniq_apikey_prefix", lambda: ApiKey.objects.bulk_create([_key(b, "abcd1234")]))
    (other,) = ApiKey.objects.bulk_create([_key(a, "efgh5678")])
    violation("uniq_apikey_prefix", lambda: ApiKey.objects.unscoped().filter(pk=other.pk).update(prefix="abcd1234"))
    assert ApiKey.objects.unscoped().filter(prefix="abcd1234").count() == 1


def test_unknown_api_key_role_violates_apikey_role_valid(org):
    (key,) = ApiKey.objects.bulk_create([_key(org, "role0001")])
    violation("apikey_role_valid", lambda: ApiKey.objects.unscoped().filter(pk=key.pk).update(role="root"))
    violation("apikey_role_valid", lambda: ApiKey.objects.bulk_create([_key(org, "role0002", role="")]))
    assert ApiKey.objects.unscoped().get(pk=key.pk).role == "member"


def _invite(org, email: str, token: str, **kw) -> Invitation:
    return Invitation(
        organization=org, email=email, token_hash=token.ljust(64, "0"),
        expires_at=timezone.now() + dt.timedelta(days=7), **kw,
    )


def test_a_reused_invitation_token_violates_uniq_invitation_token(make_org):
    a, b = make_org(), make_org()
    Invitation.objects.bulk_create([_invite(a, "x@example.com", "t1")])
    violation("uniq_invitation_token", lambda: Invitation.objects.bulk_create([_invite(b, "y@example.com", "t1")]))
    assert Invitation.objects.unscoped().filter(token_hash="t1".ljust(64, "0")).count() == 1


def test_a_second_pending_invitation_for_an_address_violates_uniq_invitation_pending(org):
    Invitation.objects.bulk_create([_invite(org, "x@example.com", "t1")])
    violation(
        "uniq_invitation_pending",
        lambda: Invitation.objects.bulk_create([_invite(org, "x@example.com", "t2")]),
    )
    # Once the first is accepted or revoked, a new pending invitation is allowed.
    Invitation.objects.for_organization(org).filter(email="x@example.com").update(revoked_at=timezone.now())
    Invitation.objects.bulk_create([_invite(org, "x@example.com", "t3")])
    (pending,) = Invitation.objects.for_organization(org).filter(email="x@example.com", revoked_at=None)
    assert pending.token_hash == "t3".ljust(64, "0")
    # Un-revoking the old one would make two pending invitations.
    violation(
        "uniq_invitation_pending",
        lambda: Invitation.objects.for_organization(org).filter(token_hash="t1".ljust(64, "0")).update(revoked_at=None),
    )


def test_unknown_invitation_role_violates_invitation_role_valid(org):
    (inv,) = Invitation.objects.bulk_create([_invite(org, "x@example.com", "t1")])
    violation("invitation_role_valid", lambda: Invitation.objects.unscoped().filter(pk=inv.pk).update(role="guest"))
    assert Invitation.objects.unscoped().get(pk=inv.pk).role == "member"


def test_firing_one_instant_twice_violates_uniq_triggerfiring_instant(org):
    import datetime as dt

    from engine.models import TriggerFiring

    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "cron")])
    instant = dt.datetime(2026, 11, 30, 2, 30, tzinfo=dt.UTC)
    TriggerFiring.objects.create(organization=org, trigger=trig, scheduled_for=instant)
    violation(
        "uniq_triggerfiring_instant",
        lambda: TriggerFiring.objects.bulk_create([TriggerFiring(organization=org, trigger=trig, scheduled_for=instant)]),
    )
    TriggerFiring.objects.create(organization=org, trigger=trig, scheduled_for=instant + dt.timedelta(minutes=5))
    assert TriggerFiring.objects.for_organization(org).count() == 2


def test_unknown_firing_outcome_violates_triggerfiring_outcome_valid(org):
    import datetime as dt

    from engine.models import TriggerFiring

    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "cron")])
    firing = TriggerFiring.objects.create(organization=org, trigger=trig, scheduled_for=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    violation(
        "triggerfiring_outcome_valid",
        lambda: TriggerFiring.objects.for_organization(org).filter(pk=firing.pk).update(outcome="maybe"),
    )
    assert TriggerFiring.objects.for_organization(org).get(pk=firing.pk).outcome == "started"


def _audit_row(org, seq: int, **kw):
    from django.utils import timezone

    from audit.models import AuditLog

    fields = {"organization": org, "actor_type": "system", "action": "test.row", "created_at": timezone.now(),
              "chain": str(org.pk), "seq": seq, "prev_hash": "0" * 64, "row_hash": "1" * 64}
    fields.update(kw)
    return AuditLog(**fields)


def test_two_audit_rows_in_one_chain_place_violate_uniq_auditlog_chain_seq(org):
    from audit.models import AuditLog

    AuditLog.objects.bulk_create([_audit_row(org, 1000)])
    # Audit rows are append-only (a trigger refuses UPDATE), so the write is an insert.
    violation(
        "uniq_auditlog_chain_seq",
        lambda: AuditLog.objects.bulk_create([_audit_row(org, 1000)]),
    )
    assert AuditLog.objects.for_organization(org).filter(seq=1000).count() == 1


def test_two_checkpoints_at_one_chain_place_violate_uniq_auditcheckpoint_chain_seq(org):
    from django.utils import timezone

    from audit.models import AuditCheckpoint

    def checkpoint():
        now = timezone.now()
        return AuditCheckpoint(chain=str(org.pk), seq=7, row_hash="a" * 64, row_created_at=now, key_id="k1",
                               signature="b" * 64, rows_removed=7, created_at=now)

    AuditCheckpoint.objects.bulk_create([checkpoint()])
    # Checkpoints are append-only (a trigger refuses UPDATE), so the write is an insert.
    violation("uniq_auditcheckpoint_chain_seq", lambda: AuditCheckpoint.objects.bulk_create([checkpoint()]))
    assert AuditCheckpoint.objects.filter(chain=str(org.pk), seq=7).count() == 1


def test_two_payloads_of_one_generation_violate_uniq_offloadedpayload_generation(org, run):
    from engine.models import OffloadedPayload

    a = task_run(run, "a")

    def payload():
        return OffloadedPayload(organization=org, workflow_run=run, task_run=a, fencing_token=1,
                                storage_key="outputs/x.json", size_bytes=10, sha256="0" * 64)

    OffloadedPayload.objects.bulk_create([payload()])
    violation("uniq_offloadedpayload_generation", lambda: OffloadedPayload.objects.bulk_create([payload()]))
    assert OffloadedPayload.objects.for_organization(org).filter(task_run=a).count() == 1


def test_a_negative_or_huge_retention_violates_org_run_retention_range(org):
    from tenancy.models import Organization

    violation("org_run_retention_range", lambda: Organization.objects.filter(pk=org.pk).update(run_retention_days=-1))
    violation("org_run_retention_range",
              lambda: Organization.objects.filter(pk=org.pk).update(run_retention_days=36501))
    assert Organization.objects.get(pk=org.pk).run_retention_days is None


def test_unknown_actor_type_violates_auditlog_actor_type_valid(org):
    from audit.models import AuditLog

    violation(
        "auditlog_actor_type_valid",
        lambda: AuditLog.objects.bulk_create([_audit_row(org, 1000, actor_type="robot")]),
    )
    assert not AuditLog.objects.for_organization(org).filter(actor_type="robot").exists()


def test_non_positive_run_timeout_violates_workflow_run_timeout_positive(chain):
    qs = Workflow.objects.unscoped().filter(pk=chain.pk)
    violation("workflow_run_timeout_positive", lambda: qs.update(run_timeout_seconds=0))
    violation("workflow_run_timeout_positive", lambda: qs.update(run_timeout_seconds=-5))
    assert Workflow.objects.unscoped().filter(pk=chain.pk).update(run_timeout_seconds=30) == 1


def _secret(org, name: str, **kw) -> Secret:
    return Secret(organization=org, name=name, ciphertext="gAAAAA-not-a-real-token", **kw)


def test_a_second_secret_of_one_name_violates_uniq_secret_org_name(make_org):
    a, b = make_org(), make_org()
    Secret.objects.bulk_create([_secret(a, "API_TOKEN")])
    violation("uniq_secret_org_name", lambda: Secret.objects.bulk_create([_secret(a, "API_TOKEN")]))
    # Another organization has its own names.
    Secret.objects.bulk_create([_secret(b, "API_TOKEN")])
    assert Secret.objects.unscoped().filter(name="API_TOKEN").count() == 2


def test_a_name_tasks_could_not_reference_violates_secret_name_valid(org):
    (secret,) = Secret.objects.bulk_create([_secret(org, "OK_1")])
    for bad in ("bad-name", "9LIVES", "", "TOKEN\n", "with space"):  # longer than 64: varchar(64)
        violation("secret_name_valid", lambda bad=bad: Secret.objects.bulk_create([_secret(org, bad)]))
    violation("secret_name_valid", lambda: Secret.objects.unscoped().filter(pk=secret.pk).update(name="a.b"))
    assert Secret.objects.unscoped().get(pk=secret.pk).name == "OK_1"


def test_a_version_below_one_violates_secret_version_positive(org):
    (secret,) = Secret.objects.bulk_create([_secret(org, "V")])
    violation("secret_version_positive", lambda: Secret.objects.unscoped().filter(pk=secret.pk).update(version=0))
    assert Secret.objects.unscoped().get(pk=secret.pk).version == 1


# --- coverage -----------------------------------------------------------------------------------


def test_every_declared_constraint_has_a_violation_test_in_this_module():
    """A constraint added to a model's Meta must get a test here that makes it fire."""
    import inspect
    import sys

    from django.apps import apps

    source = inspect.getsource(sys.modules[__name__])
    declared = sorted(
        c.name
        for app in ("engine", "tenancy", "audit")
        for m in apps.get_app_config(app).get_models()
        for c in m._meta.constraints
    )
    untested = [name for name in declared if f'violation(\n        "{name}"' not in source and f'violation("{name}"' not in source]
    assert untested == []
    assert len(declared) >= 31


# --- Fair scheduling (issue 16): plans, limits, priorities, keys, rate buckets ------------------


def test_an_unknown_plan_violates_org_plan_valid(org):
    from tenancy.models import Organization

    violation("org_plan_valid", lambda: Organization.objects.filter(pk=org.pk).update(plan="platinum"))
    assert Organization.objects.get(pk=org.pk).plan == "free"


def test_organization_limit_overrides_out_of_range_violate_their_checks(org):
    from tenancy.models import Organization

    orgs = Organization.objects.filter(pk=org.pk)
    violation("org_weight_range", lambda: orgs.update(weight_override=0))
    violation("org_weight_range", lambda: orgs.update(weight_override=101))
    violation("org_max_running_positive", lambda: orgs.update(max_running_task_runs_override=0))
    violation("org_max_runs_per_minute_positive", lambda: orgs.update(max_runs_per_minute_override=-5))
    violation("org_max_definition_bytes_positive", lambda: orgs.update(max_definition_bytes_override=0))
    orgs.update(weight_override=100, max_running_task_runs_override=1, max_runs_per_minute_override=1,
                max_definition_bytes_override=1)
    orgs.update(weight_override=None, max_running_task_runs_override=None, max_runs_per_minute_override=None,
                max_definition_bytes_override=None)  # no override: the plan's values


@pytest.mark.parametrize("value", [-11, 11])
def test_a_priority_out_of_range_violates_the_priority_checks(chain, value):
    violation("task_priority_range", lambda: Task.objects.unscoped().filter(workflow=chain).update(priority=value))
    run = start_run(workflow=chain, run_input={})
    violation("wfrun_priority_range", lambda: WorkflowRun.objects.unscoped().filter(pk=run.pk).update(
        priority=value))
    assert WorkflowRun.objects.unscoped().get(pk=run.pk).priority == 0


def test_a_concurrency_key_without_a_positive_limit_violates_task_concurrency_limit_positive(chain):
    tasks = Task.objects.unscoped().filter(workflow=chain)
    violation("task_concurrency_limit_positive", lambda: tasks.update(concurrency_key="stripe"))
    violation("task_concurrency_limit_positive", lambda: tasks.update(concurrency_key="stripe", concurrency_limit=0))
    violation("task_concurrency_limit_positive", lambda: tasks.update(concurrency_limit=3))
    tasks.update(concurrency_key="stripe", concurrency_limit=3)


def test_a_rate_limit_half_set_or_of_another_window_violates_task_rate_limit_valid(chain):
    tasks = Task.objects.unscoped().filter(workflow=chain)
    violation("task_rate_limit_valid", lambda: tasks.update(rate_key="github", rate_limit=10))
    violation("task_rate_limit_valid", lambda: tasks.update(rate_key="github", rate_limit=10, rate_window_seconds=30))
    violation("task_rate_limit_valid", lambda: tasks.update(rate_key="github", rate_limit=0, rate_window_seconds=1))
    tasks.update(rate_key="github", rate_limit=10, rate_window_seconds=60)


def test_an_unknown_trigger_rule_violates_task_trigger_rule_valid_and_every_rule_is_accepted(chain):
    tasks = Task.objects.unscoped().filter(workflow=chain, key="b")
    violation("task_trigger_rule_valid", lambda: tasks.update(trigger_rule="all_succeeded"))
    violation("task_trigger_rule_valid", lambda: tasks.update(trigger_rule=""))
    for rule in TriggerRule.values:
        tasks.update(trigger_rule=rule)
        assert tasks.get().trigger_rule == rule


def test_a_condition_over_2000_characters_violates_task_condition_length(chain):
    tasks = Task.objects.unscoped().filter(workflow=chain, key="b")
    violation("task_condition_length", lambda: tasks.update(condition="x" * 2001))
    tasks.update(condition="x" * 2000)
    assert len(tasks.get().condition) == 2000


def test_an_unknown_skip_reason_violates_taskrun_skip_reason_valid_and_every_reason_is_accepted(run):
    rows = TaskRun.objects.unscoped().filter(pk=task_run(run, "b").pk)
    violation("taskrun_skip_reason_valid", lambda: rows.update(skip_reason="upstream_skipped"))
    for reason in SkipReason.values:
        rows.update(skip_reason=reason)
        assert rows.get().skip_reason == reason


def test_workflow_limits_below_one_or_an_unknown_policy_violate_their_checks(chain):
    wf = Workflow.objects.unscoped().filter(pk=chain.pk)
    violation("workflow_max_running_tasks_positive", lambda: wf.update(max_running_tasks=0))
    violation("workflow_max_running_runs_positive", lambda: wf.update(max_running_runs=-1))
    violation("workflow_run_limit_policy_valid", lambda: wf.update(run_limit_policy="skip"))
    assert Workflow.objects.unscoped().get(pk=chain.pk).run_limit_policy == "queue"


def test_a_second_row_for_one_bucket_or_a_negative_count_violates_the_bucket_constraints(org):
    from engine.models import RateLimitBucket

    window = timezone.now().replace(microsecond=0)
    row = RateLimitBucket.objects.create(organization=org, key="github", window_seconds=1, window_start=window, count=3)
    # One row per (organization, key, window size): a window opening moves it, never adds one.
    violation("uniq_ratelimit_bucket", lambda: RateLimitBucket.objects.create(
        organization=org, key="github", window_seconds=1, window_start=window + dt.timedelta(seconds=5), count=1))
    violation("ratelimit_count_non_negative", lambda: RateLimitBucket.objects.unscoped().filter(pk=row.pk).update(
        count=-1))
    # The same key in another window size is another bucket.
    RateLimitBucket.objects.create(organization=org, key="github", window_seconds=60, window_start=window)


# --- The organizations' own workers (issue 18) ---------------------------------------------------


def test_a_worker_key_is_an_accepted_api_key_role(org):
    (key,) = ApiKey.objects.bulk_create([_key(org, "role0003", role="worker")])
    assert ApiKey.objects.unscoped().get(pk=key.pk).role == "worker"


def test_a_second_row_for_one_worker_and_queue_violates_uniq_worker_org_queue_id(org):
    from engine.models import WorkerConnection

    WorkerConnection.objects.create(organization=org, worker_id="w-1", queue="images")
    WorkerConnection.objects.create(organization=org, worker_id="w-1", queue="videos")  # another queue: fine
    violation("uniq_worker_org_queue_id",
              lambda: WorkerConnection.objects.create(organization=org, worker_id="w-1", queue="images"))
    assert WorkerConnection.objects.for_organization(org).count() == 2


def test_a_worker_concurrency_below_one_violates_worker_concurrency_positive(org):
    from engine.models import WorkerConnection

    violation("worker_concurrency_positive",
              lambda: WorkerConnection.objects.create(organization=org, worker_id="w-2", queue="q", concurrency=0))
    assert not WorkerConnection.objects.for_organization(org).exists()


def test_an_unknown_log_level_violates_tasklog_level_valid(run):
    from engine.models import TaskLog

    tr = task_run(run, "a")
    TaskLog.objects.create(organization_id=tr.organization_id, workflow_run=run, run_created_at=run.created_at, task_run=tr, attempt=1,
                           fencing_token=0, level="info", message="ok")
    violation("tasklog_level_valid", lambda: TaskLog.objects.create(
        organization_id=tr.organization_id, workflow_run=run, run_created_at=run.created_at, task_run=tr, attempt=1, fencing_token=0,
        level="loud", message="x"))
    assert TaskLog.objects.for_organization(run.organization_id).filter(task_run=tr).count() == 1


def test_an_unknown_log_stream_violates_tasklog_stream_valid(run):
    from engine.models import TaskLog

    tr = task_run(run, "a")
    for stream in ("worker", "logging", "stdout", "stderr", "http", "system"):
        TaskLog.objects.create(organization_id=tr.organization_id, workflow_run=run, run_created_at=run.created_at, task_run=tr, attempt=1,
                               fencing_token=0, level="info", stream=stream, message="ok")
    violation("tasklog_stream_valid", lambda: TaskLog.objects.create(
        organization_id=tr.organization_id, workflow_run=run, run_created_at=run.created_at, task_run=tr, attempt=1, fencing_token=0,
        level="info", stream="syslog", message="x"))
    assert TaskLog.objects.for_organization(run.organization_id).filter(task_run=tr).count() == 6


# --- Backfills of cron triggers (issue 19) ------------------------------------------------------


def _backfill(org, trig, **overrides):
    from engine.models import TriggerBackfill

    fields = {"organization": org, "trigger": trig, "state": "running",
              "range_start": dt.datetime(2026, 3, 1, tzinfo=dt.UTC), "range_end": dt.datetime(2026, 3, 31, tzinfo=dt.UTC),
              "cron_expression": "0 6 * * *", "timezone": "Europe/Berlin", "max_active_runs": 10, "total": 31}
    fields.update(overrides)
    return TriggerBackfill(**fields)


def test_a_second_running_backfill_of_a_trigger_violates_uniq_backfill_running_per_trigger(org):
    from engine.models import TriggerBackfill

    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "cron")])
    TriggerBackfill.objects.bulk_create([_backfill(org, trig)])
    violation("uniq_backfill_running_per_trigger", lambda: TriggerBackfill.objects.bulk_create([_backfill(org, trig)]))
    # Finished ones do not count.
    TriggerBackfill.objects.bulk_create([_backfill(org, trig, state="succeeded", finished_at=timezone.now())])
    assert TriggerBackfill.objects.for_organization(org).count() == 2


def test_backfill_rows_out_of_their_rules_violate_their_checks(org):
    from engine.models import TriggerBackfill

    (trig,) = ScheduledTrigger.objects.bulk_create([_trigger(org, "cron")])
    (row,) = TriggerBackfill.objects.bulk_create([_backfill(org, trig)])
    rows = TriggerBackfill.objects.for_organization(org).filter(pk=row.pk)
    violation("backfill_state_valid", lambda: rows.update(state="paused", finished_at=timezone.now()))
    violation("backfill_range_ordered", lambda: rows.update(range_end=dt.datetime(2026, 2, 1, tzinfo=dt.UTC)))
    violation("backfill_max_active_runs_positive", lambda: rows.update(max_active_runs=0))
    violation("backfill_priority_range", lambda: rows.update(priority=11))
    violation("backfill_finished_at_matches_state", lambda: rows.update(state="succeeded"))
    violation("backfill_finished_at_matches_state", lambda: rows.update(finished_at=timezone.now()))
    rows.update(state="cancelled", finished_at=timezone.now())
    assert rows.get().state == "cancelled"


# --- Notifications (issue 19): webhook endpoints, failure subscriptions, the outbox ------------


@pytest.fixture
def outbox_rows(org, make_workflow):
    """An endpoint, a member's failure subscription, an event of a run, a webhook delivery
    (pending) and an email delivery (dead) of it, and one attempt."""
    from engine.models import (
        FailureSubscription,
        NotificationAttempt,
        NotificationDelivery,
        NotificationEvent,
        WebhookEndpoint,
    )

    wf = make_workflow(org, [{"key": "a", **NOOP}], name="notified")
    run = start_run(workflow=wf)
    user = User.objects.create_user(email="notified@example.com")
    endpoint = WebhookEndpoint.objects.create(organization=org, url="https://93.184.215.14/hook",
                                              event_types=["run.failed"], secret_ciphertext="x")
    subscription = FailureSubscription.objects.create(organization=org, user=user, workflow_name="notified")
    event = NotificationEvent.objects.create(organization=org, type="run.failed", workflow_run=run,
                                             workflow_name="notified", run_event_seq=2, payload={})
    webhook = NotificationDelivery.objects.create(organization=org, event=event, channel="webhook", endpoint=endpoint,
                                                  state="pending", next_attempt_at=timezone.now())
    email = NotificationDelivery.objects.create(organization=org, event=event, channel="email", recipient=user,
                                                state="dead", attempts=1)
    attempt = NotificationAttempt.objects.create(organization=org, delivery=email, number=1, outcome="failed",
                                                 started_at=timezone.now())
    return {"endpoint": endpoint, "subscription": subscription, "event": event, "webhook": webhook, "email": email,
            "attempt": attempt, "user": user}


def test_an_unknown_type_or_outcome_violates_the_notification_vocabulary(outbox_rows):
    from engine.models import NotificationAttempt, NotificationEvent, NotificationType

    events = NotificationEvent.objects.unscoped().filter(pk=outbox_rows["event"].pk)
    for value in NotificationType.values:  # every member of the vocabulary is accepted
        events.update(type=value)
    violation("notifevent_type_valid", lambda: events.update(type="run.exploded"))
    attempts = NotificationAttempt.objects.unscoped().filter(pk=outbox_rows["attempt"].pk)
    violation("notifattempt_outcome_valid", lambda: attempts.update(outcome="maybe"))
    violation("uniq_notifattempt_delivery_number", lambda: NotificationAttempt.objects.create(
        organization_id=outbox_rows["email"].organization_id, delivery=outbox_rows["email"], number=1,
        outcome="failed", started_at=timezone.now()))


def test_a_delivery_in_an_impossible_shape_violates_its_constraints(outbox_rows):
    from engine.models import NotificationDelivery
    from engine.states import DeliveryState

    webhook = outbox_rows["webhook"]
    rows = NotificationDelivery.objects.unscoped().filter(pk=webhook.pk)
    for state in DeliveryState.values:  # every member, with what its state needs
        rows.update(state=state, next_attempt_at=timezone.now(),
                    lease_expires_at=timezone.now() if state == "sending" else None)
    rows.update(state="pending", lease_expires_at=None)
    violation("notifdelivery_state_valid", lambda: rows.update(state="lost"))
    violation("notifdelivery_lease_iff_sending", lambda: rows.update(state="sending"))
    violation("notifdelivery_lease_iff_sending", lambda: rows.update(lease_expires_at=timezone.now()))
    violation("notifdelivery_pending_due", lambda: rows.update(next_attempt_at=None))
    violation("notifdelivery_attempts_non_negative", lambda: rows.update(attempts=-1))
    violation("notifdelivery_channel_target", lambda: rows.update(channel="email"))
    violation("notifdelivery_channel_target", lambda: rows.update(recipient=outbox_rows["user"]))
    violation("uniq_notifdelivery_event_endpoint", lambda: NotificationDelivery.objects.create(
        organization_id=webhook.organization_id, event=outbox_rows["event"], channel="webhook",
        endpoint=outbox_rows["endpoint"], state="dead"))
    violation("uniq_notifdelivery_event_recipient", lambda: NotificationDelivery.objects.create(
        organization_id=webhook.organization_id, event=outbox_rows["event"], channel="email",
        recipient=outbox_rows["user"], state="dead"))
    # A replay is a second delivery of the same event to the same endpoint, by design.
    NotificationDelivery.objects.create(organization_id=webhook.organization_id, event=outbox_rows["event"],
                                        channel="webhook", endpoint=outbox_rows["endpoint"], state="dead",
                                        replay_of=webhook)
    assert rows.get().state == "pending"


def test_an_endpoint_or_subscription_out_of_shape_violates_its_constraints(outbox_rows):
    from engine.models import FailureSubscription, NotificationType, WebhookEndpoint

    endpoints = WebhookEndpoint.objects.unscoped().filter(pk=outbox_rows["endpoint"].pk)
    endpoints.update(event_types=NotificationType.values)
    violation("webhook_event_types_valid", lambda: endpoints.update(event_types=["run.exploded"]))
    violation("webhook_event_types_valid", lambda: endpoints.update(event_types=[]))
    violation("webhook_event_types_valid", lambda: endpoints.update(event_types="run.failed"))
    violation("webhook_url_http", lambda: endpoints.update(url="ftp://93.184.215.14/"))
    subscription = outbox_rows["subscription"]
    violation("uniq_failuresub_org_workflow_user", lambda: FailureSubscription.objects.create(
        organization_id=subscription.organization_id, user=subscription.user, workflow_name="notified"))
    assert endpoints.get().url == "https://93.184.215.14/hook"
