"""Database guards on workflow definitions.

- A definition that has runs is frozen: its tasks, dependencies and the
  workflow's name, version, definition and description cannot change (its
  lifecycle ``state`` still can: archive and restore). Deletion is already refused
  by the PROTECT foreign keys from WorkflowRun and TaskRun.
- A dependency edge joins two tasks of its own workflow.

Raising in the database means a ``QuerySet.update()`` or raw SQL cannot bypass the
rule the services follow.
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION ff_workflow_has_runs(wf uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM core_workflowrun WHERE workflow_id = wf)
$$;

CREATE FUNCTION ff_guard_workflow_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.name, NEW.version, NEW.definition, NEW.description, NEW.organization_id)
       IS DISTINCT FROM (OLD.name, OLD.version, OLD.definition, OLD.description, OLD.organization_id)
       AND ff_workflow_has_runs(OLD.id) THEN
        RAISE EXCEPTION 'workflow % v% has runs: its definition cannot be edited (apply a new version instead)',
            OLD.name, OLD.version USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER ff_workflow_frozen BEFORE UPDATE ON core_workflow
    FOR EACH ROW EXECUTE FUNCTION ff_guard_workflow_update();

CREATE FUNCTION ff_guard_task_change() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER ff_task_frozen BEFORE INSERT OR UPDATE OR DELETE ON core_task
    FOR EACH ROW EXECUTE FUNCTION ff_guard_task_change();
CREATE TRIGGER ff_taskdependency_frozen BEFORE INSERT OR UPDATE OR DELETE ON core_taskdependency
    FOR EACH ROW EXECUTE FUNCTION ff_guard_task_change();

CREATE FUNCTION ff_guard_edge_workflow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM core_task
        WHERE id IN (NEW.task_id, NEW.depends_on_id) AND workflow_id = NEW.workflow_id) <> 2 THEN
        RAISE EXCEPTION 'dependency % -> % must join two tasks of workflow %',
            NEW.depends_on_id, NEW.task_id, NEW.workflow_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER ff_taskdependency_same_workflow BEFORE INSERT OR UPDATE ON core_taskdependency
    FOR EACH ROW EXECUTE FUNCTION ff_guard_edge_workflow();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS ff_taskdependency_same_workflow ON core_taskdependency;
DROP FUNCTION IF EXISTS ff_guard_edge_workflow();
DROP TRIGGER IF EXISTS ff_taskdependency_frozen ON core_taskdependency;
DROP TRIGGER IF EXISTS ff_task_frozen ON core_task;
DROP FUNCTION IF EXISTS ff_guard_task_change();
DROP TRIGGER IF EXISTS ff_workflow_frozen ON core_workflow;
DROP FUNCTION IF EXISTS ff_guard_workflow_update();
DROP FUNCTION IF EXISTS ff_workflow_has_runs(uuid);
"""


class Migration(migrations.Migration):
    dependencies = [("engine", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
