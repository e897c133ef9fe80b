"""Make core_auditlog append-only in the database (seed 000: "a trigger rejects UPDATE
and DELETE"): a row-level BEFORE UPDATE OR DELETE trigger and a statement-level BEFORE
TRUNCATE trigger that raise, so ``QuerySet.update()``, ``.delete()``, raw SQL and
TRUNCATE all fail with a clear error. The table owner could still disable the
trigger, which is why production connects as a role that does not own the tables
(see docs/audit.md)."""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION ff_auditlog_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core_auditlog is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'audit records are never changed or removed; append a new record instead';
END $$;

CREATE TRIGGER ff_auditlog_no_update_delete BEFORE UPDATE OR DELETE ON core_auditlog
    FOR EACH ROW EXECUTE FUNCTION ff_auditlog_append_only();
CREATE TRIGGER ff_auditlog_no_truncate BEFORE TRUNCATE ON core_auditlog
    FOR EACH STATEMENT EXECUTE FUNCTION ff_auditlog_append_only();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS ff_auditlog_no_truncate ON core_auditlog;
DROP TRIGGER IF EXISTS ff_auditlog_no_update_delete ON core_auditlog;
DROP FUNCTION IF EXISTS ff_auditlog_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
