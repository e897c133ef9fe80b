"""A CHECK on core_taskrunevent.kind listing every event kind (engine.states.EventKind).

Reversible: unapplying drops ``taskrunevent_kind_valid`` (and the field's choices,
which are Python-only). Every kind the engine has ever written is in the list, so
existing rows pass the check.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0013_hot_rows_tenant_column'),
    ]

    operations = [
        migrations.AlterField(
            model_name='taskrunevent',
            name='kind',
            field=models.CharField(choices=[('run_started', 'Run Started'), ('run_finished', 'Run Finished'), ('promoted', 'Promoted'), ('claimed', 'Claimed'), ('started', 'Started'), ('succeeded', 'Succeeded'), ('attempt_failed', 'Attempt Failed'), ('attempt_timed_out', 'Attempt Timed Out'), ('lease_expired', 'Lease Expired'), ('dispatch_expired', 'Dispatch Expired'), ('dispatch_dead_lettered', 'Dispatch Dead Lettered'), ('duplicate_delivery_ignored', 'Duplicate Delivery Ignored'), ('stale_dispatch_ignored', 'Stale Dispatch Ignored'), ('stale_completion_rejected', 'Stale Completion Rejected'), ('skipped', 'Skipped'), ('cancelled', 'Cancelled')], max_length=40),
        ),
        migrations.AddConstraint(
            model_name='taskrunevent',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['run_started', 'run_finished', 'promoted', 'claimed', 'started', 'succeeded', 'attempt_failed', 'attempt_timed_out', 'lease_expired', 'dispatch_expired', 'dispatch_dead_lettered', 'duplicate_delivery_ignored', 'stale_dispatch_ignored', 'stale_completion_rejected', 'skipped', 'cancelled'])), name='taskrunevent_kind_valid'),
        ),
    ]
