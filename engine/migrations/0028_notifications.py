"""Notifications (issue 19): webhook endpoints, failure subscriptions, and the notifications'
outbox (events, deliveries, attempts); and the trigger that records a notification in the
transaction of the transition that causes it.

``ff_notification_record``: ``AFTER INSERT ON core_taskrunevent FOR EACH ROW WHEN (...)`` —
a run's 'run_finished' event (run.succeeded / run.failed / run.cancelled) and a task run's
move into 'failed' (task.failed). A trigger on the run's history, like
``ff_taskrunevent_notify`` (migration 0006), and not a CTE in each statement: every path
that finishes a run or fails a task run writes that event (run_finish_if_done[_many],
run_cancel, task_run_fail_attempt, task_run_fail_undelivered, task_run_fail_expired_lease,
and whatever statement comes next), so none can forget to notify.

Cost: the WHEN clause is evaluated by the executor for every event row (no function call:
an event that is neither is not even queued); the function runs once per finished run and
per failed task run. For an organization with no enabled endpoint subscribed to the type
(and, for run.failed, no failure subscription) that is one probe of idx_webhook_org_enabled
and one of uniq_failuresub_org_workflow_user, and nothing is written. Otherwise it writes
one core_notificationevent (the snapshot receivers get) and one core_notificationdelivery
per matching endpoint (its workflow filter applied) and per subscribed member, pending now:
the clock's notify_tick claims them (engine.notifier).
"""

import django.db.models.deletion
import django.db.models.functions.comparison
import django.db.models.functions.datetime
import django.db.models.lookups
import uuid
from django.conf import settings
from django.db import migrations, models


RECORD = """
CREATE FUNCTION ff_notification_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_type text := CASE WHEN NEW.task_run_id IS NULL THEN 'run.' || NEW.to_state ELSE 'task.failed' END;
BEGIN
    IF v_type NOT IN ('run.succeeded', 'run.failed', 'run.cancelled', 'task.failed') THEN
        RETURN NULL;
    END IF;
    -- All an organization without endpoints or subscriptions pays: two index probes.
    IF NOT EXISTS (SELECT 1 FROM core_webhookendpoint e
                   WHERE e.organization_id = NEW.organization_id AND e.enabled AND e.event_types ? v_type)
       AND (v_type <> 'run.failed' OR NOT EXISTS (SELECT 1 FROM core_failuresubscription s
                                                  WHERE s.organization_id = NEW.organization_id)) THEN
        RETURN NULL;
    END IF;
    WITH run AS (
        SELECT r.id, r.state, r.error, r.trigger_source, r.priority, r.retry_of_id, r.created_at, r.started_at,
               r.finished_at, w.id AS wf_id, w.name AS wf_name, w.version AS wf_version
        FROM core_workflowrun r JOIN core_workflow w ON w.id = r.workflow_id
        WHERE r.id = NEW.workflow_run_id
    ), hooks AS (
        SELECT e.id FROM core_webhookendpoint e, run
        WHERE e.organization_id = NEW.organization_id AND e.enabled AND e.event_types ? v_type
          AND (e.workflow_name = '' OR e.workflow_name = run.wf_name)
    ), mails AS (
        -- Members only: a subscription outliving its membership sends nothing.
        SELECT s.user_id FROM core_failuresubscription s
        JOIN run ON s.workflow_name = run.wf_name
        JOIN core_membership m ON m.organization_id = s.organization_id AND m.user_id = s.user_id
        WHERE v_type = 'run.failed' AND s.organization_id = NEW.organization_id
    ), ev AS (
        INSERT INTO core_notificationevent
            (id, organization_id, type, workflow_run_id, task_run_id, workflow_name, run_event_seq, payload, created_at)
        SELECT gen_random_uuid(), NEW.organization_id, v_type, NEW.workflow_run_id, NEW.task_run_id, run.wf_name,
               NEW.seq,
               jsonb_build_object(
                   'organization', jsonb_build_object('id', NEW.organization_id),
                   'workflow', jsonb_build_object('id', run.wf_id, 'name', run.wf_name, 'version', run.wf_version),
                   'run', jsonb_build_object(
                       'id', run.id, 'state', run.state, 'error', left(run.error, 2000),
                       'trigger_source', run.trigger_source, 'priority', run.priority, 'retry_of', run.retry_of_id,
                       'created_at', run.created_at, 'started_at', run.started_at, 'finished_at', run.finished_at))
               || CASE WHEN NEW.task_run_id IS NULL THEN '{}'::jsonb ELSE jsonb_build_object(
                   'task_run', (SELECT jsonb_build_object(
                       'id', t.id, 'task_key', k.key, 'state', t.state, 'attempt', t.attempt,
                       'error', left(t.error, 2000), 'reason', NEW.kind, 'finished_at', t.finished_at)
                    FROM core_taskrun t JOIN core_task k ON k.id = t.task_id WHERE t.id = NEW.task_run_id)) END,
               clock_timestamp()
        FROM run
        WHERE EXISTS (SELECT 1 FROM hooks) OR EXISTS (SELECT 1 FROM mails)
        RETURNING id, created_at
    )
    INSERT INTO core_notificationdelivery
        (id, organization_id, event_id, channel, endpoint_id, recipient_id, state, attempts, claim_token,
         next_attempt_at, last_error, created_at)
    SELECT gen_random_uuid(), NEW.organization_id, ev.id, 'webhook', hooks.id, NULL::uuid, 'pending', 0, 0,
           ev.created_at, '', ev.created_at
    FROM ev, hooks
    UNION ALL
    SELECT gen_random_uuid(), NEW.organization_id, ev.id, 'email', NULL::uuid, mails.user_id, 'pending', 0, 0,
           ev.created_at, '', ev.created_at
    FROM ev, mails;
    RETURN NULL;
END;
$$;
CREATE TRIGGER ff_notification_record
    AFTER INSERT ON core_taskrunevent
    FOR EACH ROW
    WHEN ((NEW.task_run_id IS NULL AND NEW.kind = 'run_finished')
          OR (NEW.task_run_id IS NOT NULL AND NEW.to_state = 'failed' AND NEW.from_state <> 'failed'))
    EXECUTE FUNCTION ff_notification_record();
"""

DROP = """
DROP TRIGGER IF EXISTS ff_notification_record ON core_taskrunevent;
DROP FUNCTION IF EXISTS ff_notification_record();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0027_cron_dates_backfill'),
        ('tenancy', '0007_secrets'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='NotificationEvent',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('type', models.CharField(choices=[('run.succeeded', 'Run Succeeded'), ('run.failed', 'Run Failed'), ('run.cancelled', 'Run Cancelled'), ('task.failed', 'Task Failed')], max_length=32)),
                ('task_run_id', models.UUIDField(blank=True, null=True)),
                ('workflow_name', models.CharField(max_length=200)),
                ('run_event_seq', models.BigIntegerField()),
                ('payload', models.JSONField()),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('organization', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
                ('workflow_run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='engine.workflowrun')),
            ],
            options={
                'db_table': 'core_notificationevent',
            },
        ),
        migrations.CreateModel(
            name='WebhookEndpoint',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('url', models.CharField(max_length=2000)),
                ('description', models.CharField(blank=True, default='', max_length=200)),
                ('event_types', models.JSONField()),
                ('workflow_name', models.CharField(blank=True, default='', max_length=200)),
                ('enabled', models.BooleanField(default=True)),
                ('secret_ciphertext', models.TextField()),
                ('previous_secret_ciphertext', models.TextField(blank=True, default='')),
                ('previous_secret_expires_at', models.DateTimeField(blank=True, null=True)),
                ('secret_rotated_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('organization', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
            ],
            options={
                'db_table': 'core_webhookendpoint',
            },
        ),
        migrations.CreateModel(
            name='NotificationDelivery',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('channel', models.CharField(choices=[('webhook', 'Webhook'), ('email', 'Email')], max_length=10)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('sending', 'Sending'), ('succeeded', 'Succeeded'), ('dead', 'Dead')], default='pending', max_length=10)),
                ('attempts', models.IntegerField(default=0)),
                ('claim_token', models.BigIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('last_status', models.IntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('dead_lettered_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('organization', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
                ('recipient', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('replay_of', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='replays', to='engine.notificationdelivery')),
                ('event', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='engine.notificationevent')),
                ('endpoint', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='engine.webhookendpoint')),
            ],
            options={
                'db_table': 'core_notificationdelivery',
            },
        ),
        migrations.CreateModel(
            name='FailureSubscription',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('workflow_name', models.CharField(max_length=200)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('organization', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'db_table': 'core_failuresubscription',
                'constraints': [models.UniqueConstraint(fields=('organization', 'workflow_name', 'user'), name='uniq_failuresub_org_workflow_user')],
            },
        ),
        migrations.CreateModel(
            name='NotificationAttempt',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('number', models.IntegerField()),
                ('outcome', models.CharField(choices=[('succeeded', 'Succeeded'), ('failed', 'Failed')], max_length=10)),
                ('retrying', models.BooleanField(default=False)),
                ('started_at', models.DateTimeField()),
                ('duration_ms', models.IntegerField(blank=True, null=True)),
                ('status_code', models.IntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('response_excerpt', models.TextField(blank=True, default='')),
                ('response_truncated', models.BooleanField(default=False)),
                ('organization', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.organization')),
                ('delivery', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempt_log', to='engine.notificationdelivery')),
            ],
            options={
                'db_table': 'core_notificationattempt',
                'constraints': [models.UniqueConstraint(fields=('delivery', 'number'), name='uniq_notifattempt_delivery_number'), models.CheckConstraint(condition=models.Q(('outcome__in', ['succeeded', 'failed'])), name='notifattempt_outcome_valid')],
            },
        ),
        migrations.AddConstraint(
            model_name='notificationevent',
            constraint=models.CheckConstraint(condition=models.Q(('type__in', ['run.succeeded', 'run.failed', 'run.cancelled', 'task.failed'])), name='notifevent_type_valid'),
        ),
        migrations.AddIndex(
            model_name='webhookendpoint',
            index=models.Index(condition=models.Q(('enabled', True)), fields=['organization', 'created_at'], name='idx_webhook_org_enabled'),
        ),
        migrations.AddIndex(
            model_name='webhookendpoint',
            index=models.Index(fields=['organization', 'created_at'], name='idx_webhook_org_created'),
        ),
        migrations.AddConstraint(
            model_name='webhookendpoint',
            constraint=models.CheckConstraint(condition=models.Q(django.db.models.lookups.Exact(models.Func(models.F('event_types'), function='jsonb_typeof', output_field=models.CharField()), 'array'), ('event_types__contained_by', ['run.succeeded', 'run.failed', 'run.cancelled', 'task.failed']), models.Q(('event_types', []), _negated=True)), name='webhook_event_types_valid'),
        ),
        migrations.AddConstraint(
            model_name='webhookendpoint',
            constraint=models.CheckConstraint(condition=models.Q(('url__startswith', 'http://'), ('url__startswith', 'https://'), _connector='OR'), name='webhook_url_http'),
        ),
        migrations.AddIndex(
            model_name='notificationdelivery',
            index=models.Index(django.db.models.functions.comparison.Coalesce('endpoint', 'recipient'), models.F('next_attempt_at'), condition=models.Q(('state', 'pending')), name='idx_notifdelivery_pending'),
        ),
        migrations.AddIndex(
            model_name='notificationdelivery',
            index=models.Index(condition=models.Q(('state', 'sending')), fields=['lease_expires_at'], name='idx_notifdelivery_sending'),
        ),
        migrations.AddIndex(
            model_name='notificationdelivery',
            index=models.Index(models.F('endpoint'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='idx_notifdelivery_endpoint'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['pending', 'sending', 'succeeded', 'dead'])), name='notifdelivery_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('channel', 'webhook'), ('endpoint__isnull', False), ('recipient__isnull', True)), models.Q(('channel', 'email'), ('endpoint__isnull', True), ('recipient__isnull', False)), _connector='OR'), name='notifdelivery_channel_target'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('lease_expires_at__isnull', False), ('state', 'sending')), models.Q(models.Q(('state', 'sending'), _negated=True), ('lease_expires_at__isnull', True)), _connector='OR'), name='notifdelivery_lease_iff_sending'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('state', 'pending'), _negated=True), ('next_attempt_at__isnull', False), _connector='OR'), name='notifdelivery_pending_due'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.CheckConstraint(condition=models.Q(('attempts__gte', 0)), name='notifdelivery_attempts_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.UniqueConstraint(condition=models.Q(('endpoint__isnull', False), ('replay_of__isnull', True)), fields=('event', 'endpoint'), name='uniq_notifdelivery_event_endpoint'),
        ),
        migrations.AddConstraint(
            model_name='notificationdelivery',
            constraint=models.UniqueConstraint(condition=models.Q(('recipient__isnull', False), ('replay_of__isnull', True)), fields=('event', 'recipient'), name='uniq_notifdelivery_event_recipient'),
        ),
        migrations.RunSQL(RECORD, reverse_sql=DROP),
    ]
