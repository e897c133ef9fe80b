"""A cron trigger's run priority (issue 16): the priority of the runs it starts,
PRIORITY_MIN..PRIORITY_MAX like a run's own (trigger_priority_range). Existing triggers
get 0, the default priority. Reversible: both operations have their inverse."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0015_fair_scheduling'),
    ]

    operations = [
        migrations.AddField(
            model_name='scheduledtrigger',
            name='priority',
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.AddConstraint(
            model_name='scheduledtrigger',
            constraint=models.CheckConstraint(condition=models.Q(('priority__gte', -10), ('priority__lte', 10)),
                                              name='trigger_priority_range'),
        ),
    ]
