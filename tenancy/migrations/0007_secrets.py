"""Organization secrets (issue 18): core_secret, one Fernet token per (organization, name)
(uniq_secret_org_name), names as task configs reference them (secret_name_valid), a
version bumped on each change of the value. Reversible: the reverse drops the table.
"""

import django.db.models.deletion
import django.utils.timezone
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0006_apikey_worker_role'),
    ]

    operations = [
        migrations.CreateModel(
            name='Secret',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=64)),
                ('ciphertext', models.TextField()),
                ('version', models.IntegerField(default=1)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('created_by_api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey')),
                ('organization', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='secrets', to='tenancy.organization')),
                ('updated_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('updated_by_api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apikey')),
            ],
            options={
                'db_table': 'core_secret',
                'constraints': [models.UniqueConstraint(fields=('organization', 'name'), name='uniq_secret_org_name'), models.CheckConstraint(condition=models.Q(('name__regex', '^[A-Za-z_][A-Za-z0-9_]{0,63}$')), name='secret_name_valid'), models.CheckConstraint(condition=models.Q(('version__gte', 1)), name='secret_version_positive')],
            },
        ),
    ]
