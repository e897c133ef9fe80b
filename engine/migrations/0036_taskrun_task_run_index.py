"""core_taskrun's index on its task becomes (task_id, workflow_run_id): idx_taskrun_task_run.

It still serves WHERE task_id = ? (seed 000 keeps the foreign key's index for that), and a
probe by (run, task) now reads one entry through it as through uniq_taskrun_per_run_task.
The foreign key's own index (task_id alone) replaced here was what a generic plan took for
such a probe whenever the statistics priced both at one row (a table never analyzed, or
tasks that each had one run so far): it then read an entry for every run of the task,
filtering by run (tests/unit/test_hot_statement_plans.py,
test_a_run_and_task_probe_reads_one_entry_behind_a_tasks_many_runs).

Non-atomic, so neither index is built or dropped under a lock that stops the engine's
writes: the new index is built CONCURRENTLY first (task_id queries always have an index),
then the old one is dropped CONCURRENTLY, and only once the new one is valid. Reversing
rebuilds the old index, then drops the new one, the same way.

Re-runnable: a build goes on in the server when the migrating process is stopped, so a
second attempt can find the index there, valid (kept), or left INVALID by a build that was
cancelled or failed (dropped and built again; IF NOT EXISTS alone would have kept it and let
the old index go, leaving task_id no usable index).
"""

from django.db import migrations, models

OLD_INDEX = "core_taskrun_task_id_208ca913"  # Django's name for the foreign key's index
NEW_INDEX = "idx_taskrun_task_run"
BUILD = {
    OLD_INDEX: f"CREATE INDEX CONCURRENTLY {OLD_INDEX} ON core_taskrun (task_id)",
    NEW_INDEX: f"CREATE INDEX CONCURRENTLY {NEW_INDEX} ON core_taskrun (task_id, workflow_run_id)",
}


def index_valid(connection, name: str) -> bool | None:
    """Whether the index ``name`` (in the search path) is valid; None when there is none."""
    with connection.cursor() as cur:
        cur.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cur.fetchone()
    return None if row is None else row[0]


def ensure_index(connection, name: str, create_sql: str) -> None:
    """Build the index ``name`` with ``create_sql`` (a CREATE INDEX CONCURRENTLY) unless a
    valid one is there; an invalid one (a build cancelled or failed) is dropped first."""
    valid = index_valid(connection, name)
    if valid:
        return
    with connection.cursor() as cur:
        if valid is False:
            cur.execute(f"DROP INDEX CONCURRENTLY {name}")
        cur.execute(create_sql)


def drop_replaced(connection, name: str, kept: str) -> None:
    """Drop the index ``name`` (CONCURRENTLY, if it is there) once the index ``kept`` that
    replaces it is valid. Raises RuntimeError, dropping nothing, when ``kept`` is missing or
    invalid."""
    if not index_valid(connection, kept):
        raise RuntimeError(f"index {kept} is missing or invalid: {name} is kept so task_id keeps an index; "
                           f"build {kept} (or drop its invalid copy) and migrate again")
    with connection.cursor() as cur:
        cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def build_new(apps, schema_editor):
    ensure_index(schema_editor.connection, NEW_INDEX, BUILD[NEW_INDEX])


def drop_new(apps, schema_editor):
    drop_replaced(schema_editor.connection, NEW_INDEX, kept=OLD_INDEX)


def drop_old(apps, schema_editor):
    drop_replaced(schema_editor.connection, OLD_INDEX, kept=NEW_INDEX)


def build_old(apps, schema_editor):
    ensure_index(schema_editor.connection, OLD_INDEX, BUILD[OLD_INDEX])


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('engine', '0035_partition_create_type_race'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name='taskrun',
                    index=models.Index(fields=['task', 'workflow_run'], name=NEW_INDEX),
                ),
            ],
            database_operations=[migrations.RunPython(build_new, drop_new)],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='taskrun',
                    name='task',
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.PROTECT,
                                            related_name='task_runs', to='engine.task'),
                ),
            ],
            database_operations=[migrations.RunPython(drop_old, build_old)],
        ),
    ]
