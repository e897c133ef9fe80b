"""API keys whose creator is no longer a member of the key's organization are revoked.

Since this release a member's removal or departure revokes the API keys they created there
(``tenancy.apikeys.revoke_keys_of_departing_member``). Keys of members removed before it
were refused (their creator held no membership) but still listed as active, and would have
answered again had their creator been invited back: this revokes them (``revoked_by`` left
empty: no one did it in the organization). Reversing it leaves them revoked: a revocation
is not undone.
"""

from django.db import migrations
from django.db.models import Exists, OuterRef
from django.utils import timezone


def revoke_keys_of_former_members(apps, schema_editor):
    ApiKey = apps.get_model("tenancy", "ApiKey")
    Membership = apps.get_model("tenancy", "Membership")
    member = Membership.objects.filter(organization_id=OuterRef("organization_id"), user_id=OuterRef("created_by_id"))
    ApiKey.objects.filter(revoked_at__isnull=True).exclude(Exists(member)).update(revoked_at=timezone.now())


class Migration(migrations.Migration):

    dependencies = [
        ("tenancy", "0008_run_retention_days"),
    ]

    operations = [
        migrations.RunPython(revoke_keys_of_former_members, migrations.RunPython.noop, elidable=False),
    ]
