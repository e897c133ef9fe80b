"""Migration 0033 on a database that already holds history (issue 21; seed 001: "both need a
database with rows already in it"): the events and log lines stored before it are moved into
partitions whole, the partition manager then goes on from them, and the migration reverses
and applies again without losing a row."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from flowforge.stack import BASE_DIR


def _url(name: str) -> str:
    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{name}"


def manage(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url}
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def scratch(db):
    name = f"{connection.settings_dict['NAME']}_history"
    admin = _url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _url(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def snapshot(conn) -> dict[str, list[tuple]]:
    return {
        "events": conn.execute("SELECT id, workflow_run_id, seq, kind, created_at FROM core_taskrunevent "
                               "ORDER BY workflow_run_id, seq").fetchall(),
        "logs": conn.execute("SELECT id, task_run_id, message FROM core_tasklog ORDER BY id").fetchall(),
    }


def test_stored_history_moves_into_partitions_whole_and_back(scratch):
    manage(scratch, "migrate", "--noinput")
    # A deployment's history: runs with their events (written by the engine's start path)
    # and log lines; then the database as it was before the migration (0032: plain tables),
    # with half the runs created 40 days ago.
    manage(scratch, "shell", "-c", """
from django.db import connection
from engine.services import apply_definition, start_run
from tenancy.actors import Actor
from tenancy.services import create_organization
org = create_organization(name='Old', slug='old-history', owner_email='old@example.com')[0]
actor = Actor.system(org)
wf = apply_definition(actor=actor, document={'name': 'wf', 'tasks': [{'key': 'a', 'type': 'noop'}, {'key': 'b', 'type': 'noop', 'depends_on': ['a']}]})
runs = [start_run(workflow=wf, actor=actor) for _ in range(6)]
with connection.cursor() as cur:
    cur.execute("INSERT INTO core_tasklog (organization_id, workflow_run_id, task_run_id, attempt, fencing_token, level, message, run_created_at) "
                "SELECT t.organization_id, t.workflow_run_id, t.id, 1, 0, 'info', 'line of ' || t.id, r.created_at "
                "FROM core_taskrun t JOIN core_workflowrun r ON r.id = t.workflow_run_id")
""")
    manage(scratch, "migrate", "--noinput", "engine", "0032")
    with psycopg.connect(scratch) as conn:
        conn.execute("UPDATE core_workflowrun SET created_at = now() - interval '40 days' "
                     "WHERE id IN (SELECT id FROM core_workflowrun ORDER BY id LIMIT 3)")
        conn.commit()
    with psycopg.connect(scratch) as conn:
        before = snapshot(conn)
        assert len(before["events"]) >= 6 and len(before["logs"]) == 12
    manage(scratch, "migrate", "--noinput", "engine", "0033")
    with psycopg.connect(scratch) as conn:
        assert snapshot(conn) == before  # every row, as it was
        wrong = conn.execute("SELECT count(*) FROM core_taskrunevent e JOIN core_workflowrun r "
                             "ON r.id = e.workflow_run_id WHERE e.run_created_at <> r.created_at").fetchone()[0]
        assert wrong == 0
        parts = conn.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                             "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'core_taskrunevent'::regclass "
                             "ORDER BY 1").fetchall()
        # The history already stored is one partition (from the oldest run's period to the
        # current one); then the current period and 14 ahead.
        assert len(parts) == 16
        old = conn.execute("SELECT DISTINCT e.tableoid::regclass::text FROM core_taskrunevent e JOIN core_workflowrun r "
                           "ON r.id = e.workflow_run_id WHERE r.created_at < now() - interval '1 day'").fetchall()
        assert old == [(parts[0][0],)]
        # New history goes on into the partitions, and the log's id sequence continues.
        conn.execute("INSERT INTO core_tasklog (organization_id, workflow_run_id, task_run_id, attempt, fencing_token, "
                     "level, message, run_created_at) SELECT t.organization_id, t.workflow_run_id, t.id, 1, 0, 'info', "
                     "'after', r.created_at FROM core_taskrun t JOIN core_workflowrun r ON r.id = t.workflow_run_id "
                     "LIMIT 1")
        assert conn.execute("SELECT min(id) FROM core_tasklog WHERE message = 'after'").fetchone()[0] > max(
            r[0] for r in before["logs"])
        conn.execute("DELETE FROM core_tasklog WHERE message = 'after'")
        conn.commit()
    out = manage(scratch, "shell", "-c", "from engine import partitions; print(len(partitions.ensure_ahead()))")
    assert out.strip().splitlines()[-1] == "0"  # the manager finds them all there
    # A run purged past the drop horizon leaves its history to its partition's drop; going
    # back to plain tables (and their foreign keys) leaves those rows out, and only those.
    with psycopg.connect(scratch) as conn:
        gone = conn.execute("SELECT id FROM core_workflowrun ORDER BY id LIMIT 1").fetchone()[0]
        gone_task_runs = {r[0] for r in conn.execute("SELECT id FROM core_taskrun WHERE workflow_run_id = %s",
                                                      [gone]).fetchall()}
        conn.execute("UPDATE core_workflowrun SET state = 'succeeded', finished_at = now() WHERE id = %s", [gone])
        conn.commit()
    out = manage(scratch, "shell", "-c", f"""
import datetime as dt
from engine import retention
print(retention.purge_runs(['{gone}'], horizon=dt.datetime(2100, 1, 1, tzinfo=dt.UTC)))""")
    assert out.strip().splitlines()[-1] == "(1, 0)"
    with psycopg.connect(scratch) as conn:
        assert snapshot(conn) == before  # its history is still there, for the drop
    manage(scratch, "migrate", "--noinput", "engine", "0032")
    before = {"events": [e for e in before["events"] if e[1] != gone],
              "logs": [line for line in before["logs"] if line[1] not in gone_task_runs]}
    with psycopg.connect(scratch) as conn:
        assert snapshot(conn) == before and len(before["logs"]) == 10
        kinds = conn.execute("SELECT c.relkind FROM pg_class c WHERE c.relname IN ('core_taskrunevent', 'core_tasklog')"
                             ).fetchall()
        assert sorted(k for (k,) in kinds) == ["r", "r"]  # plain tables again
        fks = conn.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid IN "
                           "('core_taskrunevent'::regclass, 'core_tasklog'::regclass)").fetchone()[0]
        assert fks == 5
    manage(scratch, "migrate", "--noinput")
    with psycopg.connect(scratch) as conn:
        assert snapshot(conn) == before
