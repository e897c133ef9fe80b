"""The tenant column of the rows every task writes: no index, and on events and outbox
rows no database constraint (seed 000: "if you cannot name the query an index serves,
the index should not exist").

- ``core_taskrun.organization_id``, ``core_taskrunevent.organization_id`` and
  ``core_outboxmessage.organization_id`` lose their single-column indexes (Django's
  default for a foreign key). Every query of these tables names a run (the
  organization-scoped manager adds the tenant to a run filter, which
  idx_taskrun_run_state, uniq_event_run_seq or the outbox's run index serves), and an
  organization with runs cannot be deleted (its runs protect their workflows), so not
  even a cascade reads them by tenant.
- The foreign-key constraints of events and outbox rows to the organization are
  dropped. transitions.py writes both in SQL, copying the tenant from the task run or
  run they are written for (whose own constraints stand). Each constraint's check ran per
  row at commit and locked the organization's one row with FOR KEY SHARE from every
  worker transaction at once. They go with their run, by its constraints.

Measured with 2,000 independent tasks (2 worker processes x 8 threads, 2 CPUs, two
series of 5 rounds each): WAL 5.7 against 6.45 KB per task, PostgreSQL CPU 0.70-0.94
against 0.93-1.10 ms per task. Reversible: the reverse recreates both constraints and
the three indexes under their original names. As in migration 0011 the database side is
written out (SeparateDatabaseAndState): Django's AlterField would also drop and
re-validate core_taskrun's constraint, a full scan under a lock, for nothing.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = (
    ("core_taskrun_organization_id_b90ef6ee", "core_taskrun"),
    ("core_taskrunevent_organization_id_ce925510", "core_taskrunevent"),
    ("core_outboxmessage_organization_id_b0cebb8b", "core_outboxmessage"),
)
CONSTRAINTS = (
    ("core_taskrunevent_organization_id_ce925510_fk_core_orga", "core_taskrunevent"),
    ("core_outboxmessage_organization_id_b0cebb8b_fk_core_orga", "core_outboxmessage"),
)


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0012_trigger_source_labels'),
        ('tenancy', '0002_invitations_api_keys'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS "{name}"',
                    reverse_sql=f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" FOREIGN KEY ("organization_id") '
                    'REFERENCES "core_organization" ("id") DEFERRABLE INITIALLY DEFERRED',
                )
                for name, table in CONSTRAINTS
            ] + [
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{name}"',
                                  reverse_sql=f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("organization_id")')
                for name, table in INDEXES
            ],
            state_operations=[
                migrations.AlterField(
                    model_name='outboxmessage',
                    name='organization',
                    field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
                ),
                migrations.AlterField(
                    model_name='taskrun',
                    name='organization',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
                ),
                migrations.AlterField(
                    model_name='taskrunevent',
                    name='organization',
                    field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
                ),
            ],
        ),
    ]
