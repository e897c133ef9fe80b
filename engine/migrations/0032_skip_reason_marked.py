"""A task run a person marked skipped keeps why: ``skip_reason`` ``marked`` (it was '').

Reversing sets those back to '' before the old check (taskrun_skip_reason_valid without
``marked``) is restored."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0031_org_run_changes'),
        ('tenancy', '0008_run_retention_days'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='taskrun',
            name='taskrun_skip_reason_valid',
        ),
        migrations.RunSQL(
            sql=migrations.RunSQL.noop,
            reverse_sql="UPDATE core_taskrun SET skip_reason = '' WHERE skip_reason = 'marked'",
        ),
        migrations.AlterField(
            model_name='taskrun',
            name='skip_reason',
            field=models.CharField(blank=True, choices=[('', 'none'), ('upstream_failed', 'Upstream Failed'), ('trigger_rule', 'Trigger Rule'), ('condition_false', 'Condition False'), ('marked', 'Marked')], db_default='', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='taskrun',
            constraint=models.CheckConstraint(condition=models.Q(('skip_reason__in', ['', 'upstream_failed', 'trigger_rule', 'condition_false', 'marked'])), name='taskrun_skip_reason_valid'),
        ),
    ]
