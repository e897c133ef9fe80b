"""The 'redelivered' event kind (issue 22: a generation whose message a dead worker
process held, given back to its queue) in core_taskrunevent.kind's choices and in the
taskrunevent_kind_valid CHECK.

Reversible: unapplying restores the previous list, which fails while 'redelivered' rows
exist (delete them first, or keep this migration).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0017_open_runs_index'),
        ('tenancy', '0005_organization_plan_and_limits'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='taskrunevent',
            name='taskrunevent_kind_valid',
        ),
        migrations.AlterField(
            model_name='taskrunevent',
            name='kind',
            field=models.CharField(choices=[('run_started', 'Run Started'), ('run_finished', 'Run Finished'), ('promoted', 'Promoted'), ('claimed', 'Claimed'), ('started', 'Started'), ('succeeded', 'Succeeded'), ('attempt_failed', 'Attempt Failed'), ('attempt_timed_out', 'Attempt Timed Out'), ('lease_expired', 'Lease Expired'), ('dispatch_expired', 'Dispatch Expired'), ('dispatch_dead_lettered', 'Dispatch Dead Lettered'), ('duplicate_delivery_ignored', 'Duplicate Delivery Ignored'), ('stale_dispatch_ignored', 'Stale Dispatch Ignored'), ('stale_completion_rejected', 'Stale Completion Rejected'), ('skipped', 'Skipped'), ('cancelled', 'Cancelled'), ('waiting', 'Waiting'), ('run_admitted', 'Run Admitted'), ('redelivered', 'Redelivered')], max_length=40),
        ),
        migrations.AddConstraint(
            model_name='taskrunevent',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['run_started', 'run_finished', 'promoted', 'claimed', 'started', 'succeeded', 'attempt_failed', 'attempt_timed_out', 'lease_expired', 'dispatch_expired', 'dispatch_dead_lettered', 'duplicate_delivery_ignored', 'stale_dispatch_ignored', 'stale_completion_rejected', 'skipped', 'cancelled', 'waiting', 'run_admitted', 'redelivered'])), name='taskrunevent_kind_valid'),
        ),
    ]
