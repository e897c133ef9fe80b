"""Definition guards, tightened.

- An UPDATE that moves a task or dependency INTO a workflow that has runs is
  refused too (0002 only checked the workflow the row came from).
- A self-edge passes the same-workflow trigger so that ``taskdep_no_self_edge`` is
  the error a caller sees, with its constraint name.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ff_guard_task_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND ff_workflow_has_runs(OLD.workflow_id) THEN
        RAISE EXCEPTION 'workflow % has runs: its tasks and dependencies cannot be changed', OLD.workflow_id
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND ff_workflow_has_runs(NEW.workflow_id) THEN
        RAISE EXCEPTION 'workflow % has runs: its tasks and dependencies cannot be changed', NEW.workflow_id
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION ff_guard_edge_workflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM unnest(ARRAY[NEW.task_id, NEW.depends_on_id]) AS x(id)
        WHERE NOT EXISTS (SELECT 1 FROM core_task t WHERE t.id = x.id AND t.workflow_id = NEW.workflow_id)
    ) THEN
        RAISE EXCEPTION 'dependency % -> % must join two tasks of workflow %',
            NEW.depends_on_id, NEW.task_id, NEW.workflow_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
"""

# The 0002 bodies, restored on reverse.
REVERSE = r"""
CREATE OR REPLACE FUNCTION ff_guard_task_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wf uuid := COALESCE(OLD.workflow_id, NEW.workflow_id);
BEGIN
    IF TG_OP = 'INSERT' THEN
        wf := NEW.workflow_id;
    END IF;
    IF ff_workflow_has_runs(wf) THEN
        RAISE EXCEPTION 'workflow % has runs: its tasks and dependencies cannot be changed', wf
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION ff_guard_edge_workflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM core_task
        WHERE id IN (NEW.task_id, NEW.depends_on_id) AND workflow_id = NEW.workflow_id) <> 2 THEN
        RAISE EXCEPTION 'dependency % -> % must join two tasks of workflow %',
            NEW.depends_on_id, NEW.task_id, NEW.workflow_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("engine", "0002_definition_guards")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
