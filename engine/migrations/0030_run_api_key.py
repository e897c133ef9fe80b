# Issue 20: the API key that started a run (runs list and run page label it). A nullable
# column with neither index nor constraint: adding it rewrites nothing; reversible (drops it).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0029_offloaded_payloads_retention'),
        ('tenancy', '0007_secrets'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='api_key',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tenancy.apikey'),
        ),
    ]
