"""Queues of the organizations' own workers (issue 18).

A task's queue and its task runs' (``''``: the shared workers); the claim's index now
leads with the queue (idx_taskrun_ready_claim), so the shared claim reads queue ``''``
alone and a worker poll its organization's queue alone; the workers seen polling
(core_workerconnection) and the log lines they send (core_tasklog); and a trigger that
announces, at commit, each worker task run that becomes ready
(``pg_notify('flowforge_worker_ready', '<organization id>:<queue>')``), which wakes the
long polls waiting on that queue (engine.queue_hub). The trigger's WHEN clause keeps it
off the shared workers' rows: a notifying transaction takes PostgreSQL's notify queue lock
at commit, which the shared path's commits must not queue behind.
Reversible: Django's operations, and the trigger is dropped with its function.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
import uuid
from django.db import migrations, models

CREATE_NOTIFY = """
CREATE FUNCTION flowforge_worker_ready_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only "look": a poll claims by its own query. pg_notify folds equal payloads of one
    -- transaction into one, so a fan-out of a thousand tasks on one queue notifies once.
    PERFORM pg_notify('flowforge_worker_ready', NEW.organization_id::text || ':' || NEW.queue);
    RETURN NULL;
END
$$;
CREATE TRIGGER taskrun_worker_ready_notify
    AFTER INSERT OR UPDATE OF state ON core_taskrun
    FOR EACH ROW WHEN (NEW.state = 'ready' AND NEW.queue <> '')
    EXECUTE FUNCTION flowforge_worker_ready_notify();
"""

DROP_NOTIFY = """
DROP TRIGGER IF EXISTS taskrun_worker_ready_notify ON core_taskrun;
DROP FUNCTION IF EXISTS flowforge_worker_ready_notify();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0018_redelivered_event'),
        ('tenancy', '0005_organization_plan_and_limits'),
    ]

    operations = [
        migrations.CreateModel(
            name='TaskLog',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('attempt', models.IntegerField()),
                ('fencing_token', models.BigIntegerField()),
                ('level', models.CharField(choices=[('debug', 'Debug'), ('info', 'Info'), ('warning', 'Warning'), ('error', 'Error')], max_length=10)),
                ('message', models.TextField()),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'core_tasklog',
            },
        ),
        migrations.CreateModel(
            name='WorkerConnection',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('worker_id', models.CharField(max_length=64)),
                ('queue', models.CharField(max_length=64)),
                ('name', models.CharField(blank=True, default='', max_length=200)),
                ('host', models.CharField(blank=True, default='', max_length=200)),
                ('sdk', models.CharField(blank=True, default='', max_length=200)),
                ('concurrency', models.IntegerField(blank=True, null=True)),
                ('first_seen_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_seen_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'core_workerconnection',
            },
        ),
        migrations.RemoveIndex(
            model_name='taskrun',
            name='idx_taskrun_ready_claim',
        ),
        migrations.AddField(
            model_name='task',
            name='queue',
            field=models.CharField(blank=True, db_default='', max_length=64),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='queue',
            field=models.CharField(blank=True, db_default='', max_length=64),
        ),
        migrations.AddIndex(
            model_name='taskrun',
            index=models.Index(models.F('queue'), models.F('organization'), models.OrderBy(models.F('priority'), descending=True), models.F('created_at'), condition=models.Q(('state', 'ready')), name='idx_taskrun_ready_claim'),
        ),
        migrations.AddField(
            model_name='tasklog',
            name='organization',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
        ),
        migrations.AddField(
            model_name='tasklog',
            name='task_run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='logs', to='engine.taskrun'),
        ),
        migrations.AddField(
            model_name='tasklog',
            name='workflow_run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='engine.workflowrun'),
        ),
        migrations.AddField(
            model_name='workerconnection',
            name='api_key',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey'),
        ),
        migrations.AddField(
            model_name='workerconnection',
            name='organization',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization'),
        ),
        migrations.AddIndex(
            model_name='tasklog',
            index=models.Index(fields=['task_run', 'id'], name='idx_tasklog_taskrun'),
        ),
        migrations.AddIndex(
            model_name='tasklog',
            index=models.Index(fields=['workflow_run'], name='idx_tasklog_run'),
        ),
        migrations.AddConstraint(
            model_name='tasklog',
            constraint=models.CheckConstraint(condition=models.Q(('level__in', ['debug', 'info', 'warning', 'error'])), name='tasklog_level_valid'),
        ),
        migrations.AddConstraint(
            model_name='workerconnection',
            constraint=models.UniqueConstraint(fields=('organization', 'queue', 'worker_id'), name='uniq_worker_org_queue_id'),
        ),
        migrations.AddConstraint(
            model_name='workerconnection',
            constraint=models.CheckConstraint(condition=models.Q(('concurrency__isnull', True), ('concurrency__gte', 1), _connector='OR'), name='worker_concurrency_positive'),
        ),
        migrations.RunSQL(CREATE_NOTIFY, reverse_sql=DROP_NOTIFY),
    ]
