"""Migration 0036's index steps, re-run after an interruption: an index left INVALID by a
cancelled or failed CONCURRENTLY build is built again, and the index it replaces is dropped
only once it is valid (a review: IF NOT EXISTS kept the invalid index and dropped the old
one, leaving task_id no usable index)."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection

m0036 = importlib.import_module("engine.migrations.0036_taskrun_task_run_index")

TABLE = "ff_test_m0036"
NEW, OLD = "ff_test_m0036_new", "ff_test_m0036_old"


@pytest.fixture
def scratch(transactional_db):
    """A table with an index OLD on it (CONCURRENTLY needs no transaction: transactional_db)."""
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE {TABLE} (x int, y int)")
        cur.execute(f"INSERT INTO {TABLE} SELECT g, g FROM generate_series(1, 50) g")
        cur.execute(f"CREATE INDEX {OLD} ON {TABLE} (x)")
    yield
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}")


def _invalidate(name: str) -> None:
    # What a cancelled CREATE INDEX CONCURRENTLY leaves behind.
    with connection.cursor() as cur:
        cur.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)", [name])


def _definition(name: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_indexdef(to_regclass(%s))", [name])
        return cur.fetchone()[0]


def test_an_invalid_index_is_built_again_and_a_valid_one_kept(scratch):
    build = f"CREATE INDEX CONCURRENTLY {NEW} ON {TABLE} (x, y)"
    m0036.ensure_index(connection, NEW, build)
    assert m0036.index_valid(connection, NEW) is True
    _invalidate(NEW)
    assert m0036.index_valid(connection, NEW) is False
    m0036.ensure_index(connection, NEW, build)
    assert m0036.index_valid(connection, NEW) is True
    assert _definition(NEW).endswith("USING btree (x, y)")
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)::oid", [NEW])
        (built,) = cur.fetchone()
        m0036.ensure_index(connection, NEW, build)  # valid: kept as it is
        cur.execute("SELECT to_regclass(%s)::oid", [NEW])
        assert cur.fetchone() == (built,)


def test_the_replaced_index_is_dropped_only_once_its_replacement_is_valid(scratch):
    with pytest.raises(RuntimeError, match=f"index {NEW} is missing or invalid: {OLD} is kept"):
        m0036.drop_replaced(connection, OLD, kept=NEW)  # no replacement yet
    assert m0036.index_valid(connection, OLD) is True
    m0036.ensure_index(connection, NEW, f"CREATE INDEX CONCURRENTLY {NEW} ON {TABLE} (x, y)")
    _invalidate(NEW)
    with pytest.raises(RuntimeError, match="missing or invalid"):
        m0036.drop_replaced(connection, OLD, kept=NEW)  # an invalid replacement
    assert m0036.index_valid(connection, OLD) is True
    m0036.ensure_index(connection, NEW, f"CREATE INDEX CONCURRENTLY {NEW} ON {TABLE} (x, y)")
    m0036.drop_replaced(connection, OLD, kept=NEW)
    assert m0036.index_valid(connection, OLD) is None
    m0036.drop_replaced(connection, OLD, kept=NEW)  # already gone: nothing to do


def test_the_database_has_the_valid_task_index_the_migration_builds(db):
    assert m0036.index_valid(connection, m0036.NEW_INDEX) is True
    assert m0036.index_valid(connection, m0036.OLD_INDEX) is None
    assert _definition(m0036.NEW_INDEX).endswith("USING btree (task_id, workflow_run_id)")
