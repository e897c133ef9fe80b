"""Workflow versions and webhook endpoints an API key created name the key
(``created_by_api_key``, its prefix on the pages and in the API) instead of no one.
Nullable columns: reversing drops them."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0033_history_partitions'),
        ('tenancy', '0008_run_retention_days'),
    ]

    operations = [
        migrations.AddField(
            model_name='webhookendpoint',
            name='created_by_api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey'),
        ),
        migrations.AddField(
            model_name='workflow',
            name='created_by_api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey'),
        ),
    ]
