"""Fair scheduling, priorities, concurrency and rate limits (issue 16).

Priorities on runs, tasks and task runs; a task's concurrency key and rate-limit bucket;
a workflow's run and task limits; the task run's rendered key, ready_at and wait_reason;
the claim's index (idx_taskrun_ready_claim: per organization, priority, age; partial on
ready) and the permits' (idx_taskrun_running_org: running task runs per organization and
key); the rate-limit buckets (seed 001's RateLimitBuckets, one row per key and window size, with the hot tables' storage
settings of migration 0010); event kinds 'waiting' and 'run_admitted'.
Reversible: every operation is Django's own, and the storage settings are reset.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0014_taskrunevent_kind_valid'),
        ('tenancy', '0005_organization_plan_and_limits'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='RateLimitBucket',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('key', models.CharField(max_length=200)),
                ('window_seconds', models.IntegerField()),
                ('window_start', models.DateTimeField()),
                ('count', models.IntegerField(db_default=0)),
            ],
            options={
                'db_table': 'core_ratelimitbucket',
            },
        ),
        migrations.RemoveConstraint(
            model_name='taskrunevent',
            name='taskrunevent_kind_valid',
        ),
        migrations.AddField(
            model_name='task',
            name='concurrency_key',
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='concurrency_limit',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='priority',
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='task',
            name='rate_key',
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='rate_limit',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='rate_window_seconds',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='concurrency_key',
            field=models.CharField(blank=True, max_length=400, null=True),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='priority',
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='ready_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='wait_reason',
            field=models.CharField(blank=True, db_default='', max_length=200),
        ),
        migrations.AddField(
            model_name='workflow',
            name='max_running_runs',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflow',
            name='max_running_tasks',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='workflow',
            name='run_limit_policy',
            field=models.CharField(choices=[('queue', 'Queue'), ('cancel_newest', 'Cancel Newest'), ('cancel_oldest', 'Cancel Oldest')], db_default='queue', max_length=20),
        ),
        migrations.AddField(
            model_name='workflowrun',
            name='priority',
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AlterField(
            model_name='taskrunevent',
            name='kind',
            field=models.CharField(choices=[('run_started', 'Run Started'), ('run_finished', 'Run Finished'), ('promoted', 'Promoted'), ('claimed', 'Claimed'), ('started', 'Started'), ('succeeded', 'Succeeded'), ('attempt_failed', 'Attempt Failed'), ('attempt_timed_out', 'Attempt Timed Out'), ('lease_expired', 'Lease Expired'), ('dispatch_expired', 'Dispatch Expired'), ('dispatch_dead_lettered', 'Dispatch Dead Lettered'), ('duplicate_delivery_ignored', 'Duplicate Delivery Ignored'), ('stale_dispatch_ignored', 'Stale Dispatch Ignored'), ('stale_completion_rejected', 'Stale Completion Rejected'), ('skipped', 'Skipped'), ('cancelled', 'Cancelled'), ('waiting', 'Waiting'), ('run_admitted', 'Run Admitted')], max_length=40),
        ),
        migrations.AddIndex(
            model_name='taskrun',
            index=models.Index(models.F('organization'), models.OrderBy(models.F('priority'), descending=True), models.F('created_at'), condition=models.Q(('state', 'ready')), name='idx_taskrun_ready_claim'),
        ),
        migrations.AddIndex(
            model_name='taskrun',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['organization', 'concurrency_key'], name='idx_taskrun_running_org'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(('priority__gte', -10), ('priority__lte', 10)), name='task_priority_range'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('concurrency_key__isnull', True), ('concurrency_limit__isnull', True)), models.Q(('concurrency_key__isnull', False), ('concurrency_limit__gte', 1), ('concurrency_limit__isnull', False)), _connector='OR'), name='task_concurrency_limit_positive'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('rate_key__isnull', True), ('rate_limit__isnull', True), ('rate_window_seconds__isnull', True)), models.Q(('rate_key__isnull', False), ('rate_limit__gte', 1), ('rate_limit__isnull', False), ('rate_window_seconds__in', [1, 60]), ('rate_window_seconds__isnull', False)), _connector='OR'), name='task_rate_limit_valid'),
        ),
        migrations.AddConstraint(
            model_name='taskrunevent',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['run_started', 'run_finished', 'promoted', 'claimed', 'started', 'succeeded', 'attempt_failed', 'attempt_timed_out', 'lease_expired', 'dispatch_expired', 'dispatch_dead_lettered', 'duplicate_delivery_ignored', 'stale_dispatch_ignored', 'stale_completion_rejected', 'skipped', 'cancelled', 'waiting', 'run_admitted'])), name='taskrunevent_kind_valid'),
        ),
        migrations.AddConstraint(
            model_name='workflow',
            constraint=models.CheckConstraint(condition=models.Q(('max_running_tasks__isnull', True), ('max_running_tasks__gte', 1), _connector='OR'), name='workflow_max_running_tasks_positive'),
        ),
        migrations.AddConstraint(
            model_name='workflow',
            constraint=models.CheckConstraint(condition=models.Q(('max_running_runs__isnull', True), ('max_running_runs__gte', 1), _connector='OR'), name='workflow_max_running_runs_positive'),
        ),
        migrations.AddConstraint(
            model_name='workflow',
            constraint=models.CheckConstraint(condition=models.Q(('run_limit_policy__in', ['queue', 'cancel_newest', 'cancel_oldest'])), name='workflow_run_limit_policy_valid'),
        ),
        migrations.AddConstraint(
            model_name='workflowrun',
            constraint=models.CheckConstraint(condition=models.Q(('priority__gte', -10), ('priority__lte', 10)), name='wfrun_priority_range'),
        ),
        migrations.AddField(
            model_name='ratelimitbucket',
            name='organization',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
        ),
        migrations.AddIndex(
            model_name='ratelimitbucket',
            index=models.Index(fields=['window_start'], name='idx_ratelimit_window_start'),
        ),
        migrations.AddConstraint(
            model_name='ratelimitbucket',
            constraint=models.UniqueConstraint(fields=('organization', 'key', 'window_seconds'), name='uniq_ratelimit_bucket'),
        ),
        migrations.AddConstraint(
            model_name='ratelimitbucket',
            constraint=models.CheckConstraint(condition=models.Q(('count__gte', 0)), name='ratelimit_count_non_negative'),
        ),
        migrations.RunSQL(
            "ALTER TABLE core_ratelimitbucket SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_cost_limit = 2000, fillfactor = 70)",
            reverse_sql="ALTER TABLE core_ratelimitbucket RESET (autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_cost_limit, fillfactor)",
        ),
    ]
