"""Announce every new run event with NOTIFY, from a trigger (seed 001, ``WorkflowEvents``).

``AFTER INSERT ... FOR EACH ROW`` on core_taskrunevent raises
``pg_notify('flowforge_run_events', workflow_run_id || ':' || seq)``. A trigger, not a
call each writer must remember: every path that appends an event (transitions, the
cancel, a backfill) announces it identically, and PostgreSQL delivers the notification
at commit, so nothing is announced that later rolls back.

The payload is only ``<run id>:<seq>`` (NOTIFY caps a payload at 8000 bytes and event
details are unbounded); a listener (api.streaming) re-reads the run's events after its
own cursor, so a dropped notification costs latency, never an event. Row-level on
purpose: a statement-level trigger would see no NEW and notify an empty payload.

Cost: PostgreSQL serializes the commits of transactions that notified (a cluster-wide
lock held from just before the commit record until after its flush), so those commits
no longer share fsyncs. Measured on the development machine, 16 connections committing
one-row transactions: ~2,400-3,000 commits/s without pg_notify, ~600-750 with it. Every
engine transition writes an event, so this bounds engine throughput; if it ever binds,
notify only for runs that have a listener (a small subscription table the trigger
consults) rather than dropping the trigger.
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION ff_taskrunevent_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('flowforge_run_events', NEW.workflow_run_id::text || ':' || NEW.seq::text);
    RETURN NULL;
END;
$$;
CREATE TRIGGER ff_taskrunevent_notify
    AFTER INSERT ON core_taskrunevent
    FOR EACH ROW EXECUTE FUNCTION ff_taskrunevent_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS ff_taskrunevent_notify ON core_taskrunevent;
DROP FUNCTION IF EXISTS ff_taskrunevent_notify();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('engine', '0005_idempotency_api_key_and_run_list_index'),
    ]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql=DROP),
    ]
