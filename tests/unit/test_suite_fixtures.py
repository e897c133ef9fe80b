"""The suite's own fixtures (tests/conftest.py): a selection of tests that do not use the
test database neither fails for it nor writes to the configured database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from django.conf import settings

BASE_DIR = Path(__file__).resolve().parents[2]


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
    name = f"ff_nodb_{uuid.uuid4().hex[:10]}"
    admin = _server_url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        # Its own namespace: the child's session end empties its namespace in Redis.
        env = dict(os.environ, DATABASE_URL=_server_url(name), BROKER_NAMESPACE=name)
        for key in ("TEST_DATABASE_URL", "TEST_DATABASE_NAME", "PYTEST_ADDOPTS"):
            env.pop(key, None)
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
