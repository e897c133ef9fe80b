"""Resume and per-task actions (issue 19, engine.recovery):

- ``core_taskrun.attempt_base``: attempts a task run used before a person last reopened
  it (0 until then), with ``taskrun_attempt_base_valid`` (0 <= attempt_base < attempt);
- ``core_workflowrun.resumed_at``: when a person last sent the finished run back to
  running (its run timeout counts from then);
- the event kinds 'resumed', 'reset', 'marked_succeeded' and 'marked_skipped' in
  core_taskrunevent.kind's choices and in the taskrunevent_kind_valid CHECK.

Non-atomic, so each step commits on its own and no lock is held across a table scan: the
new column has a constant default (no table rewrite), each CHECK is added NOT VALID (an
ACCESS EXCLUSIVE lock for a moment, checking new rows only) and then validated under a
SHARE UPDATE EXCLUSIVE lock, which lets the engine go on reading and writing while
existing rows are checked. The two CHECKs are written out as Django generates them
(``sqlmigrate`` of the state operations), so the state and the database agree.

Reversible: unapplying drops the constraint, the columns and restores the previous list
of kinds (which fails while rows of the new kinds exist: delete them first, or keep this
migration).
"""

from django.db import migrations, models

OLD_KINDS = [
    'run_started', 'run_finished', 'promoted', 'claimed', 'started', 'succeeded', 'attempt_failed',
    'attempt_timed_out', 'lease_expired', 'dispatch_expired', 'dispatch_dead_lettered',
    'duplicate_delivery_ignored', 'stale_dispatch_ignored', 'stale_completion_rejected', 'skipped', 'cancelled',
    'waiting', 'run_admitted', 'redelivered',
]
NEW_KINDS = OLD_KINDS + ['resumed', 'reset', 'marked_succeeded', 'marked_skipped']


def _kinds_check(kinds: list[str]) -> str:
    listed = ", ".join(f"'{k}'" for k in kinds)
    return (f'ALTER TABLE "core_taskrunevent" DROP CONSTRAINT IF EXISTS "taskrunevent_kind_valid", '
            f'ADD CONSTRAINT "taskrunevent_kind_valid" CHECK ("kind" IN ({listed})) NOT VALID')


VALIDATE_KINDS = 'ALTER TABLE "core_taskrunevent" VALIDATE CONSTRAINT "taskrunevent_kind_valid"'


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('engine', '0024_trigger_rules'),
        ('tenancy', '0007_secrets'),
    ]

    operations = [
        migrations.AddField(
            model_name='taskrun',
            name='attempt_base',
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='resumed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    'ALTER TABLE "core_taskrun" ADD CONSTRAINT "taskrun_attempt_base_valid" '
                    'CHECK (("attempt_base" >= 0 AND ("attempt" < 1 OR "attempt_base" < ("attempt")))) NOT VALID',
                    reverse_sql='ALTER TABLE "core_taskrun" DROP CONSTRAINT IF EXISTS "taskrun_attempt_base_valid"',
                ),
                migrations.RunSQL(
                    'ALTER TABLE "core_taskrun" VALIDATE CONSTRAINT "taskrun_attempt_base_valid"',
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name='taskrun',
                    constraint=models.CheckConstraint(condition=models.Q(('attempt_base__gte', 0), models.Q(('attempt__lt', 1), ('attempt_base__lt', models.F('attempt')), _connector='OR')), name='taskrun_attempt_base_valid'),
                ),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(_kinds_check(NEW_KINDS), reverse_sql=VALIDATE_KINDS),
                migrations.RunSQL(VALIDATE_KINDS, reverse_sql=_kinds_check(OLD_KINDS)),
            ],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='taskrunevent',
                    name='taskrunevent_kind_valid',
                ),
                migrations.AlterField(
                    model_name='taskrunevent',
                    name='kind',
                    field=models.CharField(choices=[('run_started', 'Run Started'), ('run_finished', 'Run Finished'), ('promoted', 'Promoted'), ('claimed', 'Claimed'), ('started', 'Started'), ('succeeded', 'Succeeded'), ('attempt_failed', 'Attempt Failed'), ('attempt_timed_out', 'Attempt Timed Out'), ('lease_expired', 'Lease Expired'), ('dispatch_expired', 'Dispatch Expired'), ('dispatch_dead_lettered', 'Dispatch Dead Lettered'), ('duplicate_delivery_ignored', 'Duplicate Delivery Ignored'), ('stale_dispatch_ignored', 'Stale Dispatch Ignored'), ('stale_completion_rejected', 'Stale Completion Rejected'), ('skipped', 'Skipped'), ('cancelled', 'Cancelled'), ('waiting', 'Waiting'), ('run_admitted', 'Run Admitted'), ('redelivered', 'Redelivered'), ('resumed', 'Resumed'), ('reset', 'Reset'), ('marked_succeeded', 'Marked Succeeded'), ('marked_skipped', 'Marked Skipped')], max_length=40),
                ),
                migrations.AddConstraint(
                    model_name='taskrunevent',
                    constraint=models.CheckConstraint(condition=models.Q(('kind__in', NEW_KINDS)), name='taskrunevent_kind_valid'),
                ),
            ],
        ),
    ]
