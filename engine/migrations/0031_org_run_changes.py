"""The home page's and the run list's live updates (issue 20): a notification at the commit of
every run created or changing state, and the indexes their sections read.

``ff_workflowrun_org_notify``: ``AFTER INSERT OR UPDATE OF state ON core_workflowrun`` raises
``pg_notify('flowforge_org_runs', '<organization id>:runs')``, which wakes the organization's
open home pages and run lists (engine.org_hub; frontend.live_org). Only run-level transitions
notify (a run's created, started, finished, resumed): a few per run, never one per task, so
the commits that take PostgreSQL's notify queue lock are the runs' own, not the tasks'.
pg_notify folds equal payloads of one transaction, so a cron tick starting 50 runs of one
organization notifies once.

Indexes (each read by frontend.presenters.home, newest first, LIMIT n):

- ``idx_wfrun_org_open``: the organization's pending and running runs by creation, without
  reading its finished history (partial: the open runs are few);
- ``idx_wfrun_org_finished``: its recently finished runs, by finish time;
- ``idx_wfrun_org_failed``: its recently failed runs, by finish time — apart from the
  previous one so that a rare failure is found without walking every success since.

Reversible: the trigger is dropped with its function, and the indexes with Django's operations.
"""

from django.db import migrations, models
from django.db.models import F, Q

CREATE_NOTIFY = """
CREATE FUNCTION ff_workflowrun_org_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Only "look": the page reads the runs itself.
    PERFORM pg_notify('flowforge_org_runs', NEW.organization_id::text || ':runs');
    RETURN NULL;
END
$$;
CREATE TRIGGER workflowrun_org_insert_notify
    AFTER INSERT ON core_workflowrun
    FOR EACH ROW EXECUTE FUNCTION ff_workflowrun_org_notify();
CREATE TRIGGER workflowrun_org_state_notify
    AFTER UPDATE OF state ON core_workflowrun
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION ff_workflowrun_org_notify();
"""

DROP_NOTIFY = """
DROP TRIGGER IF EXISTS workflowrun_org_state_notify ON core_workflowrun;
DROP TRIGGER IF EXISTS workflowrun_org_insert_notify ON core_workflowrun;
DROP FUNCTION IF EXISTS ff_workflowrun_org_notify();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("engine", "0030_run_api_key"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(F("organization"), F("created_at").desc(), name="idx_wfrun_org_open",
                               condition=Q(state__in=["pending", "running"])),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(F("organization"), F("finished_at").desc(), name="idx_wfrun_org_finished",
                               condition=Q(finished_at__isnull=False)),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(F("organization"), F("finished_at").desc(), name="idx_wfrun_org_failed",
                               condition=Q(state="failed")),
        ),
        migrations.RunSQL(CREATE_NOTIFY, reverse_sql=DROP_NOTIFY),
    ]
