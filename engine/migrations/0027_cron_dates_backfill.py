"""Cron dates and backfill (issue 19, item 5).

- core_workflowrun: scheduled_for, data_interval_start, data_interval_end (nullable: adding
  them rewrites nothing); trigger_source gains 'backfill' (choices only, no SQL).
- core_scheduledtrigger.missed_instants: what the clock last could not fire.
- core_triggerbackfill: a backfill of a trigger over a range, with its counters and cursor.
- core_triggerfiring.backfill_id: which backfill fired an instant (idx_firing_backfill).

Every operation is reversible (Django drops what it added).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0026_task_log_streams'),
        ('tenancy', '0007_secrets'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='scheduledtrigger',
            name='missed_instants',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='data_interval_end',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='data_interval_start',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='scheduled_for',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='workflowrun',
            name='trigger_source',
            field=models.CharField(choices=[('cli', 'CLI'), ('api', 'API'), ('web', 'Web'), ('cron', 'Cron'), ('retry', 'Retry'), ('backfill', 'Backfill')], default='cli', max_length=20),
        ),
        migrations.CreateModel(
            name='TriggerBackfill',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('state', models.CharField(choices=[('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='running', max_length=20)),
                ('range_start', models.DateTimeField()),
                ('range_end', models.DateTimeField()),
                ('cron_expression', models.CharField(max_length=200)),
                ('timezone', models.CharField(max_length=64)),
                ('max_active_runs', models.SmallIntegerField()),
                ('priority', models.SmallIntegerField(default=0)),
                ('total', models.IntegerField()),
                ('created_runs', models.IntegerField(default=0)),
                ('skipped', models.IntegerField(default=0)),
                ('next_instant', models.DateTimeField(blank=True, null=True)),
                ('not_before', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('error', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
                ('trigger', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='backfills', to='engine.scheduledtrigger')),
            ],
            options={
                'db_table': 'core_triggerbackfill',
            },
        ),
        migrations.AddField(
            model_name='triggerfiring',
            name='backfill',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='firings', to='engine.triggerbackfill'),
        ),
        migrations.AddIndex(
            model_name='triggerfiring',
            index=models.Index(condition=models.Q(('backfill__isnull', False)), fields=['backfill', 'scheduled_for'], name='idx_firing_backfill'),
        ),
        migrations.AddIndex(
            model_name='triggerbackfill',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['not_before'], name='idx_backfill_due'),
        ),
        migrations.AddIndex(
            model_name='triggerbackfill',
            index=models.Index(models.F('trigger'), models.OrderBy(models.F('created_at'), descending=True), name='idx_backfill_trigger_recent'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['running', 'succeeded', 'failed', 'cancelled'])), name='backfill_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.CheckConstraint(condition=models.Q(('range_start__lte', models.F('range_end'))), name='backfill_range_ordered'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.CheckConstraint(condition=models.Q(('max_active_runs__gte', 1)), name='backfill_max_active_runs_positive'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.CheckConstraint(condition=models.Q(('priority__gte', -10), ('priority__lte', 10)), name='backfill_priority_range'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.UniqueConstraint(condition=models.Q(('state', 'running')), fields=('trigger',), name='uniq_backfill_running_per_trigger'),
        ),
        migrations.AddConstraint(
            model_name='triggerbackfill',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('finished_at__isnull', True), ('state', 'running')), models.Q(models.Q(('state', 'running'), _negated=True), ('finished_at__isnull', False)), _connector='OR'), name='backfill_finished_at_matches_state'),
        ),
    ]
