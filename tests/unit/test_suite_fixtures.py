"""The suite's own preparation of the test database (tests/conftest.py, ``django_db_setup``):
a selection of tests that do not use the test database neither fails for it nor writes to
the configured database, and one whose first test reaches the database through a
``django_db`` mark keeps its history partitions for every test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from django.conf import settings

BASE_DIR = Path(__file__).resolve().parents[2]


def _own_name(suffix: str) -> str:
    """A database name of this run's own: the suite's database name (which each run, part and
    worktree sets apart) plus ``suffix`` and a random part, within PostgreSQL's 63 bytes."""
    base = str(settings.DATABASES["default"]["NAME"]).removeprefix("test_")[:40]
    return f"{base}_{suffix}_{uuid.uuid4().hex[:8]}"


def _child_env(database_name: str) -> dict[str, str]:
    """The environment of a pytest run in a subprocess on ``database_name``: its own broker
    namespace (its session end empties its namespace in Redis), no test database name of ours."""
    env = dict(os.environ, DATABASE_URL=_server_url(database_name), BROKER_NAMESPACE=database_name)
    for key in ("TEST_DATABASE_URL", "TEST_DATABASE_NAME", "PYTEST_ADDOPTS"):
        env.pop(key, None)
    return env


def _server_url(name: str) -> str:
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{name}"


def test_a_selection_without_database_tests_passes_and_leaves_the_configured_database_alone():
    """Before: ``pytest tests/unit/test_logs.py`` errored in every test's setup
    ("function ff_history_partition_create(...) does not exist"): the session fixture that
    makes history partitions ran although pytest-django had created no test database, so
    it ran against the configured (here: empty, never migrated) database itself."""
    name = _own_name("nodb")
    admin = _server_url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = _child_env(name)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_logs.py"],
            cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert " passed" in done.stdout and "error" not in done.stdout.lower(), done.stdout[-3000:]
        with psycopg.connect(_server_url(name)) as conn:
            created = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public'").fetchone()[0]
            functions = conn.execute(
                "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = 'public'").fetchone()[0]
        assert (created, functions) == (0, 0)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_history_partitions_outlive_the_first_tests_transaction():
    """tests/unit/test_retention.py alone: its tests reach the database through their
    ``django_db`` marks and move runs back to 2001 and 2025. A fresh review found them failing
    ("no partition of relation core_taskrunevent found for row", 4 of 8) when the partitions
    were made lazily by an autouse fixture: inside the first test's transaction, so rolled back
    with it. Its own test database (test_<name>), made and dropped by the child run."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_retention.py"],
        cwd=BASE_DIR, env=_child_env(_own_name("marks")), capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
