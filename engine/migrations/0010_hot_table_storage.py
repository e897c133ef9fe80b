"""Storage settings of the engine's hot tables (seed 001, ``TaskQueues``: "Each partition
carries per-table autovacuum tuning").

core_taskrun, core_workflowrun and core_outboxmessage are updated several times per task.
Stock autovacuum (a vacuum once 20 % of a table is dead) lets dead row versions pile up
faster than they are reclaimed, and every index probe of the hot path then steps over
them; ``autovacuum_vacuum_scale_factor = 0.01`` with ``autovacuum_vacuum_cost_limit =
2000`` vacuums them at 1 %, without the default throttle. ``fillfactor = 70`` leaves room
on each page for HOT updates (a run's event-counter bump, a lease extension that changes
no indexed column) so they do not have to move the row. ``autovacuum_analyze_scale_factor
= 0.02`` keeps the planner's counts of a queue's states closer to the truth.
"""

from django.db import migrations

TABLES = ("core_taskrun", "core_workflowrun", "core_outboxmessage")
OPTIONS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_cost_limit": "2000",
    "autovacuum_analyze_scale_factor": "0.02",
    "fillfactor": "70",
}

SET = "\n".join(
    f"ALTER TABLE {t} SET ({', '.join(f'{k} = {v}' for k, v in OPTIONS.items())});" for t in TABLES
)
RESET = "\n".join(f"ALTER TABLE {t} RESET ({', '.join(OPTIONS)});" for t in TABLES)


class Migration(migrations.Migration):
    dependencies = [("engine", "0009_outbox_dead_letters")]

    operations = [migrations.RunSQL(SET, reverse_sql=RESET)]
