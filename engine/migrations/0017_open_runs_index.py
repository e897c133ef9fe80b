"""A partial index of the runs still going per workflow version (issue 16's run limits count,
admit and cancel them without reading finished history). Reversible."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0016_trigger_priority'),
        ('tenancy', '0005_organization_plan_and_limits'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(condition=models.Q(('state__in', ['pending', 'running'])), fields=['workflow', 'created_at'], name='idx_wfrun_open_by_workflow'),
        ),
    ]
