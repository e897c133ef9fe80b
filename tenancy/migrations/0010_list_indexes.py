"""Indexes for the newest-first lists of members, pending invitations and API keys
(api.pagination.paginate_newest_first: WHERE organization_id = ? ORDER BY created_at DESC,
id DESC after a cursor): each page is read in index order instead of every row of the
organization sorted on every page. Reversible (RemoveIndex)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tenancy', '0009_revoke_keys_of_former_members'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='apikey',
            index=models.Index(models.F('organization'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='idx_apikey_org_recent'),
        ),
        migrations.AddIndex(
            model_name='invitation',
            index=models.Index(models.F('organization'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), condition=models.Q(('accepted_at__isnull', True), ('revoked_at__isnull', True)), name='idx_invitation_org_pending'),
        ),
        migrations.AddIndex(
            model_name='membership',
            index=models.Index(models.F('organization'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='idx_membership_org_recent'),
        ),
    ]
