# Invitations remember the API key they were sent with (revoking it withdraws them).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0003_encrypt_mfa_secrets'),
    ]

    operations = [
        migrations.AddField(
            model_name='invitation',
            name='invited_by_api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey'),
        ),
    ]
