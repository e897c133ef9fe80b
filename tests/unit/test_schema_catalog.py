"""The migrated database carries seed 000's schema, read from PostgreSQL's catalog:
table names, every seed index (name, table, columns in order, direction, partial
predicate) and every named constraint (table and type)."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def index_info(name: str) -> dict | None:
    """Catalog facts of index ``name``: its table, columns in order with direction,
    uniqueness, predicate and definition. None when no such index exists."""
    rows = _rows(
        """
        SELECT t.relname, ix.indisunique, pg_get_expr(ix.indpred, ix.indrelid), pg_get_indexdef(ix.indexrelid),
               am.amname, ix.indexrelid
        FROM pg_index ix
        JOIN pg_class i ON i.oid = ix.indexrelid
        JOIN pg_class t ON t.oid = ix.indrelid
        JOIN pg_namespace n ON n.oid = i.relnamespace
        JOIN pg_am am ON am.oid = i.relam
        WHERE i.relname = %s AND n.nspname = current_schema()
        """,
        [name],
    )
    if not rows:
        return None
    ((table, unique, predicate, indexdef, method, oid),) = rows
    columns = _rows(
        """
        SELECT a.attname,
               CASE WHEN pg_index_column_has_property(ix.indexrelid, k.ord::int, 'desc') THEN 'DESC' ELSE 'ASC' END
        FROM pg_index ix
        CROSS JOIN LATERAL unnest(ix.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum
        WHERE ix.indexrelid = %s
        ORDER BY k.ord
        """,
        [oid],
    )
    return {
        "table": table,
        "unique": unique,
        "columns": [tuple(c) for c in columns],
        "predicate": predicate,
        "indexdef": indexdef,
        "method": method,
    }


SEED_INDEXES = {
    # name: (table, [(column, direction), ...], partial predicate as PostgreSQL prints it)
    "idx_wfrun_wf_recent": ("core_workflowrun", [("workflow_id", "ASC"), ("created_at", "DESC")], None),
    "idx_wfrun_state_age": ("core_workflowrun", [("state", "ASC"), ("created_at", "ASC")], None),
    "idx_taskrun_state_age": ("core_taskrun", [("state", "ASC"), ("created_at", "ASC")], None),
    "idx_taskrun_run_state": ("core_taskrun", [("workflow_run_id", "ASC"), ("state", "ASC")], None),
    "idx_taskrun_lease_expiry": (
        "core_taskrun",
        [("lease_expires_at", "ASC")],
        "((state)::text = 'running'::text)",
    ),
    "idx_outbox_pending": ("core_outboxmessage", [("created_at", "ASC")], "(published_at IS NULL)"),
    "idx_event_taskrun_created": ("core_taskrunevent", [("task_run_id", "ASC"), ("created_at", "ASC")], None),
}


@pytest.mark.parametrize("name", sorted(SEED_INDEXES))
def test_seed_index_exists_with_its_table_columns_direction_and_predicate(name):
    table, columns, predicate = SEED_INDEXES[name]
    info = index_info(name)
    assert info is not None, f"index {name} is missing"
    assert info["table"] == table
    assert info["columns"] == columns
    assert info["predicate"] == predicate
    assert info["unique"] is False
    assert info["method"] == "btree"


def test_recent_runs_index_declares_created_at_descending_in_its_definition():
    info = index_info("idx_wfrun_wf_recent")
    assert info["indexdef"] == (
        "CREATE INDEX idx_wfrun_wf_recent ON public.core_workflowrun USING btree (workflow_id, created_at DESC)"
    )


def test_partial_indexes_print_their_where_clause():
    assert index_info("idx_taskrun_lease_expiry")["indexdef"].endswith(
        "USING btree (lease_expires_at) WHERE ((state)::text = 'running'::text)"
    )
    assert index_info("idx_outbox_pending")["indexdef"].endswith(
        "USING btree (created_at) WHERE (published_at IS NULL)"
    )


def test_foreign_keys_led_by_a_composite_index_have_no_index_of_their_own_but_keep_their_constraint():
    """Migrations 0011 and 0036: each of these columns leads a composite index, so its own
    index only cost writes; the foreign-key constraint itself stays — except on the partitioned event
    table, whose rows keep no constraint since migration 0033 (engine.partitions)."""
    covered = {
        ("core_taskrun", "workflow_run_id"): "idx_taskrun_run_state",
        # Seed 000 keeps an index for WHERE task_id = ?: since migration 0036, (task, run).
        ("core_taskrun", "task_id"): "idx_taskrun_task_run",
        ("core_taskrunevent", "workflow_run_id"): "uniq_event_run_seq",
        ("core_taskrunevent", "task_run_id"): "idx_event_taskrun_created",
        ("core_outboxmessage", "task_run_id"): "uniq_outbox_per_taskrun_generation",
    }
    with connection.cursor() as cur:
        for (table, column), composite in covered.items():
            cur.execute(
                """
                SELECT i.relname, array_length(ix.indkey::int2[], 1)
                FROM pg_index ix JOIN pg_class i ON i.oid = ix.indexrelid
                JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ix.indkey[0]
                WHERE ix.indrelid = %s::regclass AND a.attname = %s
                """,
                [table, column],
            )
            leading = dict(cur.fetchall())
            assert composite in leading and all(n >= 2 for n in leading.values()), (table, column, leading)
            cur.execute(
                """
                SELECT count(*) FROM pg_constraint c
                JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
                WHERE c.conrelid = %s::regclass AND c.contype = 'f' AND a.attname = %s
                """,
                [table, column],
            )
            assert cur.fetchone()[0] == (0 if table == "core_taskrunevent" else 1), (table, column)


def test_the_tenant_column_of_hot_rows_has_no_index_and_events_and_outbox_no_constraint():
    """Migration 0013: no query reads events or outbox rows by tenant, so organization_id
    has no index there, and task runs are read by tenant only by the fair claim (issue 16),
    through its two partial indexes (ready rows, running rows), never a whole-table one;
    events and outbox rows copy it in SQL from what they are written for, so they keep no
    constraint either (core_taskrun keeps its own)."""
    expected = {"core_taskrun": [("idx_taskrun_ready_claim", True), ("idx_taskrun_running_org", True)],
                "core_taskrunevent": [], "core_outboxmessage": []}
    with connection.cursor() as cur:
        for table, constrained in (("core_taskrun", 1), ("core_taskrunevent", 0), ("core_outboxmessage", 0)):
            cur.execute(
                """
                SELECT i.relname, ix.indpred IS NOT NULL FROM pg_index ix
                JOIN pg_class i ON i.oid = ix.indexrelid
                JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ANY(ix.indkey::int2[])
                WHERE ix.indrelid = %s::regclass AND a.attname = 'organization_id'
                ORDER BY 1
                """,
                [table],
            )
            assert cur.fetchall() == expected[table], table
            cur.execute(
                """
                SELECT count(*) FROM pg_constraint c
                JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
                WHERE c.conrelid = %s::regclass AND c.contype = 'f' AND a.attname = 'organization_id'
                """,
                [table],
            )
            assert cur.fetchone()[0] == constrained, table


def test_an_unknown_index_name_is_reported_missing():
    """The catalog helper itself does not invent indexes."""
    assert index_info("idx_does_not_exist") is None


SEED_TABLES = [
    "core_workflow",
    "core_task",
    "core_workflowrun",
    "core_taskrun",
    "core_outboxmessage",
    "core_taskrunevent",
    "core_scheduledtrigger",
    "core_idempotencykey",
    "core_organization",
    "core_membership",
]


def test_tables_carry_the_seed_names():
    present = {
        r[0]
        for r in _rows(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema() AND c.relname = ANY(%s)",
            [SEED_TABLES],
        )
    }
    assert sorted(present) == sorted(SEED_TABLES)


@pytest.mark.parametrize(
    "model, table",
    [
        ("engine.Workflow", "core_workflow"),
        ("engine.Task", "core_task"),
        ("engine.TaskDependency", "core_taskdependency"),
        ("engine.WorkflowRun", "core_workflowrun"),
        ("engine.TaskRun", "core_taskrun"),
        ("engine.OutboxMessage", "core_outboxmessage"),
        ("engine.TaskRunEvent", "core_taskrunevent"),
        ("engine.ScheduledTrigger", "core_scheduledtrigger"),
        ("engine.IdempotencyKey", "core_idempotencykey"),
        ("tenancy.Organization", "core_organization"),
        ("tenancy.Membership", "core_membership"),
    ],
)
def test_models_map_to_the_seed_table_names(model, table):
    assert apps.get_model(model)._meta.db_table == table


# name: (table, type: 'u' unique / 'c' check, columns of a unique constraint in order)
SEED_CONSTRAINTS = {
    "uniq_workflow_name_version": ("core_workflow", "u", ["organization_id", "name", "version"]),
    "workflow_version_positive": ("core_workflow", "c", None),
    "workflow_state_valid": ("core_workflow", "c", None),
    "uniq_task_workflow_key": ("core_task", "u", ["workflow_id", "key"]),
    "task_max_attempts_positive": ("core_task", "c", None),
    "task_retry_backoff_non_negative": ("core_task", "c", None),
    "task_timeout_positive": ("core_task", "c", None),
    "uniq_taskdep_edge": ("core_taskdependency", "u", ["task_id", "depends_on_id"]),
    "taskdep_no_self_edge": ("core_taskdependency", "c", None),
    "wfrun_state_valid": ("core_workflowrun", "c", None),
    "wfrun_finished_at_matches_state": ("core_workflowrun", "c", None),
    "wfrun_event_seq_non_negative": ("core_workflowrun", "c", None),
    "uniq_taskrun_per_run_task": ("core_taskrun", "u", ["workflow_run_id", "task_id"]),
    "taskrun_state_valid": ("core_taskrun", "c", None),
    "taskrun_attempt_positive": ("core_taskrun", "c", None),
    "taskrun_fencing_non_negative": ("core_taskrun", "c", None),
    "taskrun_finished_after_started": ("core_taskrun", "c", None),
    "taskrun_lease_iff_running": ("core_taskrun", "c", None),
    "uniq_outbox_per_taskrun_generation": ("core_outboxmessage", "u", ["task_run_id", "fencing_token_snapshot"]),
    "outbox_attempts_non_negative": ("core_outboxmessage", "c", None),
    # With the partition key, one value per run (migration 0033; tests/unit/test_partitions.py).
    "uniq_event_run_seq": ("core_taskrunevent", "u", ["workflow_run_id", "seq", "run_created_at"]),
    "uniq_idempotency_org_user_key": ("core_idempotencykey", "u", ["organization_id", "user_id", "key"]),
    "uniq_membership_org_user": ("core_membership", "u", ["organization_id", "user_id"]),
    "membership_role_valid": ("core_membership", "c", None),
    "uniq_trigger_org_name": ("core_scheduledtrigger", "u", ["organization_id", "name"]),
    "trigger_catch_up_valid": ("core_scheduledtrigger", "c", None),
}


def constraint_info(name: str) -> list[tuple]:
    return _rows(
        """
        SELECT t.relname, c.contype,
               ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord)
                     JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
                     ORDER BY k.ord)::text[],
               pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE c.conname = %s AND n.nspname = current_schema()
          AND NOT t.relispartition  -- a partition's copy of its table's constraint (migration 0033)
        """,
        [name],
    )


@pytest.mark.parametrize("name", sorted(SEED_CONSTRAINTS))
def test_named_constraint_exists_on_its_table_with_its_type(name):
    table, contype, columns = SEED_CONSTRAINTS[name]
    rows = constraint_info(name)
    assert len(rows) == 1, f"expected exactly one constraint named {name}, found {rows}"
    ((found_table, found_type, found_columns, _definition),) = rows
    assert (found_table, found_type) == (table, contype)
    if columns is not None:
        assert found_columns == columns


def _declared_constraints() -> dict[str, tuple[str, object]]:
    return {
        c.name: (m._meta.db_table, c)
        for app in ("engine", "tenancy")
        for m in apps.get_app_config(app).get_models()
        for c in m._meta.constraints
    }


def test_every_constraint_listed_above_is_declared_on_its_model():
    declared = _declared_constraints()
    missing = sorted(set(SEED_CONSTRAINTS) - set(declared))
    assert missing == []
    assert {name: declared[name][0] for name in SEED_CONSTRAINTS} == {n: spec[0] for n, spec in SEED_CONSTRAINTS.items()}


def test_every_named_model_constraint_is_in_the_database():
    """No constraint declared in a model's Meta (engine and tenancy) is missing from the
    migrated schema. A conditional UniqueConstraint is a partial unique index in
    PostgreSQL, not a pg_constraint row."""
    from django.db.models import CheckConstraint, UniqueConstraint

    for name, (table, constraint) in _declared_constraints().items():
        if isinstance(constraint, UniqueConstraint) and constraint.condition is not None:
            info = index_info(name)
            assert info is not None, f"partial unique index {name} is missing"
            assert (info["table"], info["unique"]) == (table, True)
            assert info["predicate"] is not None
            continue
        expected_type = "u" if isinstance(constraint, UniqueConstraint) else "c"
        assert isinstance(constraint, (UniqueConstraint, CheckConstraint))
        assert [(r[0], r[1]) for r in constraint_info(name)] == [(table, expected_type)], name


def test_idempotency_key_constraint_treats_nulls_as_equal():
    ((nulls_not_distinct,),) = _rows(
        """
        SELECT ix.indnullsnotdistinct FROM pg_constraint c JOIN pg_index ix ON ix.indexrelid = c.conindid
        WHERE c.conname = 'uniq_idempotency_org_user_key'
        """
    )
    assert nulls_not_distinct is True
    (row,) = constraint_info("uniq_idempotency_org_user_key")
    assert row[3] == "UNIQUE NULLS NOT DISTINCT (organization_id, user_id, key)"


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("wfrun_finished_at_matches_state", ["'succeeded'", "'failed'", "'cancelled'", "finished_at IS NOT NULL", "finished_at IS NULL"]),
        ("taskrun_lease_iff_running", ["'running'", "lease_expires_at IS NOT NULL", "lease_expires_at IS NULL"]),
        ("taskrun_finished_after_started", ["finished_at IS NULL", "started_at IS NULL", "finished_at >= started_at"]),
        ("wfrun_state_valid", ["'pending'", "'running'", "'succeeded'", "'failed'", "'cancelled'"]),
        (
            "taskrun_state_valid",
            ["'pending'", "'ready'", "'running'", "'succeeded'", "'failed'", "'skipped'", "'cancelled'"],
        ),
        ("taskdep_no_self_edge", ["task_id = depends_on_id"]),
    ],
)
def test_check_constraint_definition_names_its_values(name, fragments):
    (row,) = constraint_info(name)
    definition = row[3]
    assert definition.startswith("CHECK ")
    for fragment in fragments:
        assert fragment in definition, f"{fragment!r} not in {definition}"


def test_state_checks_list_exactly_the_declared_states():
    (wfrun,) = constraint_info("wfrun_state_valid")
    (taskrun,) = constraint_info("taskrun_state_valid")
    quoted = lambda d: sorted(set(re.findall(r"'([a-z_]+)'::", d)))  # noqa: E731
    assert quoted(wfrun[3]) == ["cancelled", "failed", "pending", "running", "succeeded"]
    assert quoted(taskrun[3]) == ["cancelled", "failed", "pending", "ready", "running", "skipped", "succeeded"]


@pytest.mark.parametrize("table", ["core_taskrun", "core_workflowrun", "core_outboxmessage"])
def test_hot_tables_carry_the_seed_autovacuum_tuning_and_fillfactor(table):
    """Seed 001: per-table autovacuum tuning and fillfactor = 70 on the queue tables."""
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        options = dict(o.split("=", 1) for o in cur.fetchone()[0] or [])
    assert options == {"autovacuum_vacuum_scale_factor": "0.01", "autovacuum_vacuum_cost_limit": "2000",
                       "autovacuum_analyze_scale_factor": "0.02", "fillfactor": "70"}
