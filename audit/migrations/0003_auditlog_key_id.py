"""core_auditlog.key_id: the id of the FLOWFORGE_AUDIT_KEYS key that signed a row (issue 14,
finding 5). Nullable: rows written before this migration keep their plain SHA-256 hash
(the append-only trigger forbids rewriting them) and verify as the legacy scheme.
Adding or dropping a column fires no row trigger, so this reverses cleanly."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="auditlog",
            name="key_id",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
    ]
