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
then the old one is dropped CONCURRENTLY. Reversing rebuilds the old index, then drops the
new one, the same way. A build interrupted with an error leaves an INVALID index, which
IF NOT EXISTS would keep: drop it (DROP INDEX CONCURRENTLY idx_taskrun_task_run) before
migrating again.
"""

from django.db import migrations, models

OLD_INDEX = "core_taskrun_task_id_208ca913"  # Django's name for the foreign key's index
NEW_INDEX = "idx_taskrun_task_run"


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('engine', '0035_partition_create_type_race'),
    ]

    # IF NOT EXISTS / IF EXISTS: a CONCURRENTLY build goes on in the server when the migrating
    # process is stopped, so a second attempt finds it done (as migration 0011 does).
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name='taskrun',
                    index=models.Index(fields=['task', 'workflow_run'], name=NEW_INDEX),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NEW_INDEX} ON core_taskrun (task_id, workflow_run_id)",
                    reverse_sql=f"DROP INDEX CONCURRENTLY IF EXISTS {NEW_INDEX}",
                ),
            ],
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
            database_operations=[
                migrations.RunSQL(
                    sql=f"DROP INDEX CONCURRENTLY IF EXISTS {OLD_INDEX}",
                    reverse_sql=f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {OLD_INDEX} ON core_taskrun (task_id)",
                ),
            ],
        ),
    ]
