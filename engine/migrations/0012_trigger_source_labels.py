"""Labels only: TriggerSource shows "CLI" and "API" instead of "Cli" and "Api". No SQL."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0011_drop_redundant_fk_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='workflowrun',
            name='trigger_source',
            field=models.CharField(choices=[('cli', 'CLI'), ('api', 'API'), ('web', 'Web'), ('cron', 'Cron'), ('retry', 'Retry')], default='cli', max_length=20),
        ),
    ]
