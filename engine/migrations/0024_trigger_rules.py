"""Trigger rules and conditions (issue 19): a task's ``trigger_rule`` (when it runs, by its
upstream task runs' outcomes; Airflow's names, task_trigger_rule_valid) and ``condition``
(a CEL expression on the run input and upstream outputs, at most 2,000 characters:
task_condition_length), and a task run's ``skip_reason`` (why it was skipped:
taskrun_skip_reason_valid).

Existing tasks get ``all_success`` and no condition, which is what they did before;
existing task runs get ''. Each column has a database default (``db_default``), so the
engine's INSERT statements that do not name them stay valid, and adding them rewrites no
table (PostgreSQL stores a constant default in the catalog). Reversible: every operation
has its inverse (the constraints are dropped before their columns).
"""

import django.db.models.functions.text
import django.db.models.lookups
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0023_workflow_input_schema'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='trigger_rule',
            field=models.CharField(
                choices=[('all_success', 'All Success'), ('all_failed', 'All Failed'), ('all_done', 'All Done'),
                         ('one_failed', 'One Failed'), ('one_success', 'One Success'),
                         ('none_failed', 'None Failed'), ('always', 'Always')],
                db_default='all_success', max_length=20),
        ),
        migrations.AddField(
            model_name='task',
            name='condition',
            field=models.TextField(blank=True, db_default=''),
        ),
        migrations.AddField(
            model_name='taskrun',
            name='skip_reason',
            field=models.CharField(
                blank=True,
                choices=[('', 'none'), ('upstream_failed', 'Upstream Failed'), ('trigger_rule', 'Trigger Rule'),
                         ('condition_false', 'Condition False')],
                db_default='', max_length=20),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(
                condition=models.Q(('trigger_rule__in', ['all_success', 'all_failed', 'all_done', 'one_failed',
                                                         'one_success', 'none_failed', 'always'])),
                name='task_trigger_rule_valid'),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(
                condition=django.db.models.lookups.LessThanOrEqual(
                    django.db.models.functions.text.Length('condition'), 2000),
                name='task_condition_length'),
        ),
        migrations.AddConstraint(
            model_name='taskrun',
            constraint=models.CheckConstraint(
                condition=models.Q(('skip_reason__in', ['', 'upstream_failed', 'trigger_rule', 'condition_false'])),
                name='taskrun_skip_reason_valid'),
        ),
    ]
