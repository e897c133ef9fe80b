"""History partitioned by time (issue 21; docs/retention.md, "Partitioned history"):
``core_taskrunevent`` and ``core_tasklog`` become tables range-partitioned on a new column,
``run_created_at`` — the creation instant of the run a row belongs to, copied by the
engine's statements from the run's row.

Why the run's creation and not the row's own time: every row of one run lands in one
partition, so

- the per-run uniqueness of ``seq`` still holds. A unique index on a partitioned table must
  include the partition key (seed 001's trap: its idempotency keys, unique together with a
  per-row timestamp, never conflicted). ``uniq_event_run_seq`` is now (workflow_run_id, seq,
  run_created_at), and since run_created_at is the same for every row of a run, two rows
  with the same run and seq still collide. With the row's own time it would not.
- a partition can be dropped whole once no run created in its period is kept, which is the
  retention's own test (a run is removed when its creation and end are past the retention).

The event and log rows have no foreign keys any more (neither to the run, the task run nor
the organization): they are written only by the engine's statements, from the rows they
belong to, and the purge leaves the rows of a period about to be dropped to the drop
(engine.partitions). Readers always go through the run.

Partitions are created and dropped by two SECURITY DEFINER functions owned by the
migrating role, because the application's role (``flowforge_app``, docs/audit.md) does not
own the tables:

- ``ff_history_partition_create(parent, lo, hi)`` creates ``<parent>_p<YYYYMMDD>t<HHMMSS>``
  (UTC of lo), then attaches it (SHARE UPDATE EXCLUSIVE on the parent: inserts go on), and
  returns its name, or NULL when another manager created it (or an overlapping one) first:
  duplicate table, overlap and the catalog's unique violation all mean "someone else got
  there" (seed 001). No ``IF NOT EXISTS``: the losing side of a race would report a
  creation it did not make.
- ``ff_history_partition_drop(partition)`` drops a partition of one of the two tables only
  when its period is over and no run created in it remains, waiting at most 200 ms for the
  parent's lock (else it returns false and a later pass tries again).

There is no DEFAULT partition: a row outside every partition fails its statement instead
of landing where no drop can reach it. This migration creates the partitions that hold the
rows already stored (one, from the oldest run's period to the current one), that of the
current period and those of the next
FLOWFORGE_HISTORY_PARTITIONS_AHEAD periods; the clock's housekeeping keeps creating them
ahead (engine.partitions.maintain).

Reversible: the reverse copies the rows back into plain tables with their old constraints,
indexes, foreign keys and triggers.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import migrations, models

FUNCTIONS = r"""
CREATE FUNCTION ff_history_partition_create(parent text, lo timestamptz, hi timestamptz) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    part text;
    idx record;
BEGIN
    IF parent NOT IN ('core_taskrunevent', 'core_tasklog') THEN
        RAISE EXCEPTION 'ff_history_partition_create: % is not a partitioned history table', parent
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lo IS NULL OR hi IS NULL OR hi <= lo THEN
        RAISE EXCEPTION 'ff_history_partition_create: the period [%, %) is empty', lo, hi
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Finite and within reach: a partition ending at infinity (or in a far future) could never
    -- be dropped, and would cover periods the manager makes one at a time.
    IF NOT isfinite(lo) OR NOT isfinite(hi) OR lo < '1970-01-01' OR hi > statement_timestamp() + interval '10 years' THEN
        RAISE EXCEPTION 'ff_history_partition_create: the period [%, %) is outside 1970 to ten years from now', lo, hi
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    part := parent || '_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
    -- Made apart, then attached: ATTACH PARTITION takes SHARE UPDATE EXCLUSIVE on the parent,
    -- which inserts do not wait for; CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE.
    PERFORM set_config('lock_timeout', '2s', true);
    EXECUTE format('CREATE TABLE public.%I (LIKE public.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part, parent);
    EXECUTE format('ALTER TABLE public.%I ATTACH PARTITION public.%I FOR VALUES FROM (%L) TO (%L)', parent, part, lo, hi);
    -- Its indexes (made by the attach) named <partition>_<the table's index>, so that a plan
    -- names the seed index it scans (and a constraint's, its constraint).
    FOR idx IN SELECT c.relname AS own, pc.relname AS of_parent
               FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_inherits h ON h.inhrelid = i.indexrelid
               JOIN pg_class pc ON pc.oid = h.inhparent
               WHERE i.indrelid = format('public.%I', part)::regclass LOOP
        EXECUTE format('ALTER INDEX public.%I RENAME TO %I', idx.own, left(part || '_' || idx.of_parent, 63));
    END LOOP;
    RETURN part;
EXCEPTION WHEN duplicate_table OR invalid_object_definition OR unique_violation OR lock_not_available THEN
    -- Another manager created it (or one overlapping it) first, or the parent was busy: the
    -- subtransaction is rolled back, and a later pass tries again.
    RETURN NULL;
END
$$;

CREATE FUNCTION ff_history_partition_drop(part text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    parent text;
    lo timestamptz;
    hi timestamptz;
BEGIN
    SELECT p.relname,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)'))[2]::timestamptz
      INTO parent, lo, hi
      FROM pg_class c
      JOIN pg_inherits i ON i.inhrelid = c.oid
      JOIN pg_class p ON p.oid = i.inhparent
     WHERE c.relname = part AND c.relnamespace = 'public'::regnamespace;
    IF parent IS NULL OR parent NOT IN ('core_taskrunevent', 'core_tasklog') THEN
        RAISE EXCEPTION 'ff_history_partition_drop: % is not a partition of a history table', part
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF hi > statement_timestamp() THEN
        RETURN false;  -- its period is not over: runs may still be created in it
    END IF;
    -- A run created in the period still kept keeps its history (idx_wfrun_org_recent, per organization).
    IF EXISTS (SELECT 1 FROM public.core_organization o
               WHERE EXISTS (SELECT 1 FROM public.core_workflowrun r
                             WHERE r.organization_id = o.id AND r.created_at >= lo AND r.created_at < hi)) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', '200ms', true);
    EXECUTE format('DROP TABLE public.%I', part);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;  -- the parent was busy: the next pass tries again
END
$$;

REVOKE ALL ON FUNCTION ff_history_partition_create(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION ff_history_partition_drop(text) FROM PUBLIC;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS ff_history_partition_create(text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS ff_history_partition_drop(text);
"""

# Per table: the columns as they were (in order), the constraints, indexes and foreign keys the
# plain table had, and those of the partitioned one. The triggers are carried over whole.
EVENT = {
    "table": "core_taskrunevent",
    "columns": ["id", "seq", "kind", "from_state", "to_state", "attempt", "fencing_token", "detail",
                "created_at", "organization_id", "task_run_id", "workflow_run_id"],
    "plain": [
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT core_taskrunevent_pkey PRIMARY KEY (id)",
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT uniq_event_run_seq UNIQUE (workflow_run_id, seq)",
        "CREATE INDEX idx_event_taskrun_created ON core_taskrunevent (task_run_id, created_at)",
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT core_taskrunevent_task_run_id_7fd0bcee_fk_core_taskrun_id "
        "FOREIGN KEY (task_run_id) REFERENCES core_taskrun(id) DEFERRABLE INITIALLY DEFERRED",
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT core_taskrunevent_workflow_run_id_5ed2247b_fk_core_work "
        "FOREIGN KEY (workflow_run_id) REFERENCES core_workflowrun(id) DEFERRABLE INITIALLY DEFERRED",
    ],
    "partitioned": [
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT core_taskrunevent_pkey PRIMARY KEY (id, run_created_at)",
        # (run, seq) is unique because run_created_at is one value per run (the module's docstring).
        "ALTER TABLE core_taskrunevent ADD CONSTRAINT uniq_event_run_seq UNIQUE (workflow_run_id, seq, run_created_at)",
        "CREATE INDEX idx_event_taskrun_created ON core_taskrunevent (task_run_id, created_at)",
    ],
}
LOG = {
    "table": "core_tasklog",
    "columns": ["id", "attempt", "fencing_token", "level", "message", "created_at", "organization_id",
                "task_run_id", "workflow_run_id", "stream"],
    "plain": [
        "ALTER TABLE core_tasklog ADD CONSTRAINT core_tasklog_pkey PRIMARY KEY (id)",
        "CREATE INDEX idx_tasklog_run ON core_tasklog (workflow_run_id)",
        "CREATE INDEX idx_tasklog_taskrun ON core_tasklog (task_run_id, id)",
        "ALTER TABLE core_tasklog ADD CONSTRAINT core_tasklog_organization_id_8b8be60a_fk_core_organization_id "
        "FOREIGN KEY (organization_id) REFERENCES core_organization(id) DEFERRABLE INITIALLY DEFERRED",
        "ALTER TABLE core_tasklog ADD CONSTRAINT core_tasklog_task_run_id_f0064c36_fk_core_taskrun_id "
        "FOREIGN KEY (task_run_id) REFERENCES core_taskrun(id) DEFERRABLE INITIALLY DEFERRED",
        "ALTER TABLE core_tasklog ADD CONSTRAINT core_tasklog_workflow_run_id_3136225d_fk_core_workflowrun_id "
        "FOREIGN KEY (workflow_run_id) REFERENCES core_workflowrun(id) DEFERRABLE INITIALLY DEFERRED",
    ],
    "partitioned": [
        "ALTER TABLE core_tasklog ADD CONSTRAINT core_tasklog_pkey PRIMARY KEY (id, run_created_at)",
        "CREATE INDEX idx_tasklog_run ON core_tasklog (workflow_run_id)",
        "CREATE INDEX idx_tasklog_taskrun ON core_tasklog (task_run_id, id)",
    ],
}


def _triggers(cur, table: str) -> list[str]:
    cur.execute("SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t WHERE t.tgrelid = %s::regclass "
                "AND NOT t.tgisinternal ORDER BY t.tgname", [table])
    return [r[0] for r in cur.fetchall()]


def _set_aside(cur, spec: dict) -> list[str]:
    """Rename the table to <table>_old and drop its indexes' and constraints' names from the
    schema (they are re-created on the new table). Returns its triggers' definitions."""
    table = spec["table"]
    triggers = _triggers(cur, table)
    cur.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    for trig in triggers:
        name = trig.split()[2]
        cur.execute(f"DROP TRIGGER {name} ON {table}_old")
    # Index names are schema-wide: the old table's go before the new ones are made.
    cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f')",
                [f"{table}_old"])
    for (name,) in cur.fetchall():
        cur.execute(f'ALTER TABLE {table}_old DROP CONSTRAINT "{name}"')
    cur.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", [f"{table}_old"])
    for (name,) in cur.fetchall():
        cur.execute(f"DROP INDEX {name}")
    return triggers


def _floor(at: dt.datetime, period: int) -> dt.datetime:
    epoch = int(at.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % period, tz=dt.UTC)


def forward(apps, schema_editor):
    period = int(getattr(settings, "FLOWFORGE_HISTORY_PARTITION_SECONDS", 86400))
    ahead = int(getattr(settings, "FLOWFORGE_HISTORY_PARTITIONS_AHEAD", 14))
    with schema_editor.connection.cursor() as cur:
        cur.execute(FUNCTIONS)
        cur.execute("SELECT min(created_at), statement_timestamp() FROM core_workflowrun")
        oldest, now = cur.fetchone()
        first = _floor(min(oldest or now, now), period)
        last = _floor(now, period) + dt.timedelta(seconds=period * (ahead + 1))
        for spec in (EVENT, LOG):
            table = spec["table"]
            triggers = _set_aside(cur, spec)
            # The same columns, defaults, NOT NULLs, CHECKs and identity, plus the partition key.
            cur.execute(f"CREATE TABLE {table} (LIKE {table}_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                        f"INCLUDING IDENTITY, run_created_at timestamptz NOT NULL) PARTITION BY RANGE (run_created_at)")
            for statement in spec["partitioned"]:
                cur.execute(statement)
            lo = _floor(now, period)
            if first < lo:  # the history already stored: one partition, dropped once all its runs are gone
                cur.execute("SELECT ff_history_partition_create(%s, %s, %s)", [table, first, lo])
            while lo < last:
                hi = lo + dt.timedelta(seconds=period)
                cur.execute("SELECT ff_history_partition_create(%s, %s, %s)", [table, lo, hi])
                lo = hi
            cols = ", ".join(spec["columns"])
            old_cols = ", ".join(f"o.{c}" for c in spec["columns"])
            cur.execute(f"INSERT INTO {table} ({cols}, run_created_at) SELECT {old_cols}, r.created_at "
                        f"FROM {table}_old o JOIN core_workflowrun r ON r.id = o.workflow_run_id")
            if "id" in spec["columns"] and table == "core_tasklog":
                cur.execute("SELECT setval(pg_get_serial_sequence('core_tasklog', 'id'), "
                            "GREATEST((SELECT max(id) FROM core_tasklog_old), 1))")
            cur.execute(f"DROP TABLE {table}_old")
            for trig in triggers:
                cur.execute(trig)


def backward(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        for spec in (EVENT, LOG):
            table = spec["table"]
            triggers = _triggers(cur, table)
            cur.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
            for trig in triggers:
                cur.execute(f"DROP TRIGGER {trig.split()[2]} ON {table}_old")
            cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype IN ('p', 'u')",
                        [f"{table}_old"])
            for (name,) in cur.fetchall():
                cur.execute(f'ALTER TABLE {table}_old DROP CONSTRAINT "{name}"')
            cur.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass",
                        [f"{table}_old"])
            for (name,) in cur.fetchall():
                cur.execute(f"DROP INDEX {name}")
            cur.execute(f"CREATE TABLE {table} (LIKE {table}_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                        "INCLUDING IDENTITY)")
            cur.execute(f"ALTER TABLE {table} DROP COLUMN run_created_at")
            cols = ", ".join(spec["columns"])
            # Not the rows of runs the purge removed before their partition's drop (their
            # foreign keys, restored below, would refuse them): history of nothing.
            cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {table}_old o "
                        "WHERE EXISTS (SELECT 1 FROM core_workflowrun r WHERE r.id = o.workflow_run_id) "
                        "AND (o.task_run_id IS NULL OR EXISTS (SELECT 1 FROM core_taskrun t WHERE t.id = o.task_run_id))")
            if table == "core_tasklog":
                cur.execute("SELECT setval(pg_get_serial_sequence('core_tasklog', 'id'), "
                            "GREATEST((SELECT max(id) FROM core_tasklog_old), 1))")
            cur.execute(f"DROP TABLE {table}_old")
            for statement in spec["plain"]:
                cur.execute(statement)
            for trig in triggers:
                cur.execute(trig.replace(f" ON {table}_old ", f" ON {table} "))
        cur.execute(DROP_FUNCTIONS)


def _unconstrained_fk(to: str, related_name: str, *, null: bool = False) -> models.ForeignKey:
    return models.ForeignKey(to=to, on_delete=models.deletion.CASCADE, related_name=related_name, db_index=False,
                             db_constraint=False, null=null, blank=null)


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0032_skip_reason_marked'),
        ('tenancy', '0008_run_retention_days'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.AddField(model_name='taskrunevent', name='run_created_at',
                                    field=models.DateTimeField(), preserve_default=False),
                migrations.AddField(model_name='tasklog', name='run_created_at',
                                    field=models.DateTimeField(), preserve_default=False),
                migrations.AlterField(model_name='taskrunevent', name='workflow_run',
                                      field=_unconstrained_fk('engine.workflowrun', 'events')),
                migrations.AlterField(model_name='taskrunevent', name='task_run',
                                      field=_unconstrained_fk('engine.taskrun', 'events', null=True)),
                migrations.AlterField(model_name='tasklog', name='organization',
                                      field=_unconstrained_fk('tenancy.organization', '+')),
                migrations.AlterField(model_name='tasklog', name='workflow_run',
                                      field=_unconstrained_fk('engine.workflowrun', '+')),
                migrations.AlterField(model_name='tasklog', name='task_run',
                                      field=_unconstrained_fk('engine.taskrun', 'logs')),
                migrations.RemoveConstraint(model_name='taskrunevent', name='uniq_event_run_seq'),
                migrations.AddConstraint(model_name='taskrunevent', constraint=models.UniqueConstraint(
                    fields=('workflow_run', 'seq', 'run_created_at'), name='uniq_event_run_seq')),
            ],
        ),
    ]
