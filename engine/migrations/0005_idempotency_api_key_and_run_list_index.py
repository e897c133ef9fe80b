"""API-key callers of idempotent starts, and the index of the org-scoped run listing.

- ``core_idempotencykey.api_key``: the API key that sent a start (see
  engine.models.IdempotencyKey for why its rows' keys are namespaced by the key id).
  Its foreign-key index serves the cascade when an API key row is deleted.
- ``idx_wfrun_org_recent`` (organization, created_at DESC, id DESC): the keyset page of
  GET /api/v1/runs/ (api.pagination), one index range scan whatever the page's depth.

Every operation is reversible (Django derives the reverse of each).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0004_trigger_firings'),
        ('tenancy', '0002_invitations_api_keys'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='idempotencykey',
            name='api_key',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenancy.apikey'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(models.F('organization'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='idx_wfrun_org_recent'),
        ),
    ]
