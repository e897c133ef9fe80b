"""Issue 19: a workflow version's run input schema (Workflow.input_schema_json), JSON text
kept in the order written (jsonb would reorder its keys). Nullable: versions stored before
have none, and every input stays accepted for them."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0022_attempt_secrets'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflow',
            name='input_schema_json',
            field=models.TextField(blank=True, null=True),
        ),
    ]
