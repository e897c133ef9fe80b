"""Audit retention (docs/audit.md, "Retention"): signed checkpoints where a chain starts
after its oldest rows were removed, and the one way to remove them.

- ``core_auditcheckpoint``, append-only like the log (its own triggers refuse UPDATE,
  DELETE and TRUNCATE);
- ``ff_audit_remove_through(chain, seq, keep)``: SECURITY DEFINER (the owner's rights: the
  application role has only SELECT and INSERT on the log), removes rows ``..seq`` of a
  chain only when a checkpoint of that chain at ``seq`` matches row ``seq``'s hash, the
  chain's newest row stays, and every removed row is older than ``keep`` (at least 365
  days, whatever the caller asks);
- the log's append-only trigger lets a DELETE through only inside that function (a
  transaction-local flag it sets) and only for a row a checkpoint covers.
"""

import uuid
from django.db import migrations, models

FORWARD = r"""
CREATE FUNCTION ff_auditcheckpoint_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core_auditcheckpoint is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'a checkpoint records where a chain starts after retention; it is never changed';
END $$;
CREATE TRIGGER ff_auditcheckpoint_no_update_delete BEFORE UPDATE OR DELETE ON core_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION ff_auditcheckpoint_append_only();
CREATE TRIGGER ff_auditcheckpoint_no_truncate BEFORE TRUNCATE ON core_auditcheckpoint
    FOR EACH STATEMENT EXECUTE FUNCTION ff_auditcheckpoint_append_only();

CREATE OR REPLACE FUNCTION ff_auditlog_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Audit retention only (ff_audit_remove_through sets the flag): a row that a checkpoint
    -- of its chain covers. uniq_auditcheckpoint_chain_seq.
    IF TG_OP = 'DELETE' AND current_setting('flowforge.audit_retention', true) = 'on'
       AND EXISTS (SELECT 1 FROM core_auditcheckpoint c WHERE c.chain = OLD.chain AND c.seq >= OLD.seq) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'core_auditlog is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'audit records are never changed or removed; append a new record instead';
END $$;

CREATE FUNCTION ff_audit_remove_through(p_chain text, p_seq bigint, p_keep interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    cp_hash text;
    last_seq bigint;
    newest timestamptz;
    removed bigint;
BEGIN
    IF p_keep IS NULL OR p_keep < interval '365 days' THEN
        RAISE EXCEPTION 'audit rows are kept at least 365 days (asked to keep %)', p_keep
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT c.row_hash INTO cp_hash FROM core_auditcheckpoint c WHERE c.chain = p_chain AND c.seq = p_seq;
    IF cp_hash IS NULL THEN
        RAISE EXCEPTION 'chain %: no checkpoint at seq %', p_chain, p_seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- uniq_auditlog_chain_seq for the three reads below.
    SELECT max(a.seq) INTO last_seq FROM core_auditlog a WHERE a.chain = p_chain;
    IF last_seq IS NULL OR p_seq >= last_seq THEN
        RAISE EXCEPTION 'chain %: the newest row (seq %) is kept', p_chain, last_seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM core_auditlog a WHERE a.chain = p_chain AND a.seq = p_seq AND a.row_hash = cp_hash) THEN
        RAISE EXCEPTION 'chain %: the checkpoint at seq % does not match that row', p_chain, p_seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT max(a.created_at) INTO newest FROM core_auditlog a WHERE a.chain = p_chain AND a.seq <= p_seq;
    IF newest >= now() - p_keep THEN
        RAISE EXCEPTION 'chain %: rows through seq % include one of % (kept for %)', p_chain, p_seq, newest, p_keep
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('flowforge.audit_retention', 'on', true);
    DELETE FROM core_auditlog a WHERE a.chain = p_chain AND a.seq <= p_seq;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('flowforge.audit_retention', '', true);
    RETURN removed;
END $$;
-- The application role is granted EXECUTE by manage.py grant_app_role.
REVOKE ALL ON FUNCTION ff_audit_remove_through(text, bigint, interval) FROM PUBLIC;
"""

REVERSE = r"""
DROP FUNCTION IF EXISTS ff_audit_remove_through(text, bigint, interval);
CREATE OR REPLACE FUNCTION ff_auditlog_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'core_auditlog is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'audit records are never changed or removed; append a new record instead';
END $$;
DROP TRIGGER IF EXISTS ff_auditcheckpoint_no_truncate ON core_auditcheckpoint;
DROP TRIGGER IF EXISTS ff_auditcheckpoint_no_update_delete ON core_auditcheckpoint;
DROP FUNCTION IF EXISTS ff_auditcheckpoint_append_only();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0003_auditlog_key_id'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditCheckpoint',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('chain', models.CharField(max_length=40)),
                ('seq', models.BigIntegerField()),
                ('row_hash', models.CharField(max_length=64)),
                ('row_created_at', models.DateTimeField()),
                ('key_id', models.CharField(max_length=32)),
                ('signature', models.CharField(max_length=64)),
                ('rows_removed', models.BigIntegerField()),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'core_auditcheckpoint',
            },
        ),
        migrations.AddIndex(
            model_name='auditlog',
            index=models.Index(fields=['created_at'], name='idx_auditlog_created'),
        ),
        migrations.AddConstraint(
            model_name='auditcheckpoint',
            constraint=models.UniqueConstraint(fields=('chain', 'seq'), name='uniq_auditcheckpoint_chain_seq'),
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
