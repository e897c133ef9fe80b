"""Drop four single-column foreign-key indexes that a composite index already leads with.

Seed 000 ("Implicit indexes and a known redundancy") defers dropping such indexes until
``pg_stat_user_indexes.idx_scan`` on a real workload shows the cost is not worth it.
The benchmark's workload (``make bench``: 2,000-task runs, 10-task chains) writes each of
these on every transition while the composite serves the same lookups:

============================================  ====================================  =======
index dropped                                 covered by (same leading column)      scans*
============================================  ====================================  =======
core_taskrun_workflow_run_id_c8f7c540         idx_taskrun_run_state                       1
core_taskrunevent_workflow_run_id_5ed2247b    uniq_event_run_seq                          7
core_taskrunevent_task_run_id_7fd0bcee        idx_event_taskrun_created              13,978
core_outboxmessage_task_run_id_69fef573       uniq_outbox_per_taskrun_generation         26
============================================  ====================================  =======

(*) 14,000 task runs; the 13,978 are the start statement's lookup of a generation's
'claimed' event, which the seed's idx_event_taskrun_created (task_run, created_at)
serves in index order. Per task run the engine writes three events, one outbox row and
three task-run row versions and stamps the outbox row (a new version too: published_at
is in idx_outbox_pending's predicate), so this is 11 fewer index insertions per task.

Only the indexes go: the foreign-key constraints stay as they are (Django's AlterField
would drop and re-validate each constraint, a full scan under an exclusive lock), hence
SeparateDatabaseAndState. The reverse re-creates each index under its old name.
"""

import django.db.models.deletion
from django.db import migrations, models

DROPPED = (
    ("core_outboxmessage_task_run_id_69fef573", "core_outboxmessage", "task_run_id"),
    ("core_taskrun_workflow_run_id_c8f7c540", "core_taskrun", "workflow_run_id"),
    ("core_taskrunevent_task_run_id_7fd0bcee", "core_taskrunevent", "task_run_id"),
    ("core_taskrunevent_workflow_run_id_5ed2247b", "core_taskrunevent", "workflow_run_id"),
)


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0010_hot_table_storage'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                                  reverse_sql=f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")')
                for name, table, column in DROPPED
            ],
            state_operations=[
                migrations.AlterField(
                    model_name='outboxmessage',
                    name='task_run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='outbox_messages', to='engine.taskrun'),
                ),
                migrations.AlterField(
                    model_name='taskrun',
                    name='workflow_run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='task_runs', to='engine.workflowrun'),
                ),
                migrations.AlterField(
                    model_name='taskrunevent',
                    name='task_run',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='engine.taskrun'),
                ),
                migrations.AlterField(
                    model_name='taskrunevent',
                    name='workflow_run',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='engine.workflowrun'),
                ),
            ],
        ),
    ]
