"""Organization plan and per-organization limit overrides (issue 16). Reversible."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0004_invitation_invited_by_api_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='organization',
            name='max_definition_bytes_override',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='organization',
            name='max_running_task_runs_override',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='organization',
            name='max_runs_per_minute_override',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='organization',
            name='plan',
            field=models.CharField(choices=[('free', 'Free'), ('team', 'Team'), ('business', 'Business')], db_default='free', max_length=20),
        ),
        migrations.AddField(
            model_name='organization',
            name='weight_override',
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name='organization',
            constraint=models.CheckConstraint(condition=models.Q(('plan__in', ['free', 'team', 'business'])), name='org_plan_valid'),
        ),
        migrations.AddConstraint(
            model_name='organization',
            constraint=models.CheckConstraint(condition=models.Q(('weight_override__isnull', True), models.Q(('weight_override__gte', 1), ('weight_override__lte', 100)), _connector='OR'), name='org_weight_range'),
        ),
        migrations.AddConstraint(
            model_name='organization',
            constraint=models.CheckConstraint(condition=models.Q(('max_running_task_runs_override__isnull', True), ('max_running_task_runs_override__gte', 1), _connector='OR'), name='org_max_running_positive'),
        ),
        migrations.AddConstraint(
            model_name='organization',
            constraint=models.CheckConstraint(condition=models.Q(('max_runs_per_minute_override__isnull', True), ('max_runs_per_minute_override__gte', 1), _connector='OR'), name='org_max_runs_per_minute_positive'),
        ),
        migrations.AddConstraint(
            model_name='organization',
            constraint=models.CheckConstraint(condition=models.Q(('max_definition_bytes_override__isnull', True), ('max_definition_bytes_override__gte', 1), _connector='OR'), name='org_max_definition_bytes_positive'),
        ),
    ]
