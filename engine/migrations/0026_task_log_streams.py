"""Issue 19: core_tasklog holds every attempt's log lines, not only the ones workers send.

``stream`` says where a line came from (``worker``: sent by an organization's own worker,
what every existing row is; ``logging``, ``stdout``, ``stderr``: captured from a shared
worker's handler; ``http``: the http task's request summary; ``system``: a truncation
marker), checked by ``tasklog_stream_valid``. A column with a constant default: PostgreSQL
adds it without rewriting the table. Reversible: the column and its constraint go.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0025_resume_and_task_actions'),
    ]

    operations = [
        migrations.AddField(
            model_name='tasklog',
            name='stream',
            field=models.CharField(choices=[('worker', 'Worker'), ('logging', 'Logging'), ('stdout', 'Stdout'), ('stderr', 'Stderr'), ('http', 'Http'), ('system', 'System')], db_default='worker', max_length=10),
        ),
        migrations.AddConstraint(
            model_name='tasklog',
            constraint=models.CheckConstraint(condition=models.Q(('stream__in', ['worker', 'logging', 'stdout', 'stderr', 'http', 'system'])), name='tasklog_stream_valid'),
        ),
    ]
