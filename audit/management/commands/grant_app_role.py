"""manage.py grant_app_role ROLE [--password P]: the least-privileged role the
application connects as in production (docs/audit.md).

Run as the role that owns the tables (the one migrations run as). The application
role may read and write the engine's and tenancy's tables, but on ``core_auditlog``
it holds only SELECT and INSERT (and on ``core_auditcheckpoint``): it cannot update, delete
or truncate audit rows — audit retention removes old ones only through the owner's
``ff_audit_remove_through``, which checks a signed checkpoint and the age —
and, not owning the table, it cannot ``ALTER TABLE ... DISABLE TRIGGER`` either (nor
set ``session_replication_role``, which needs a superuser). Idempotent.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction
from psycopg import sql

AUDIT_TABLE = "core_auditlog"
CHECKPOINT_TABLE = "core_auditcheckpoint"
# Audit retention's one way to remove rows (migration audit/0004): runs with the owner's rights.
REMOVE_FUNCTION = "ff_audit_remove_through(text, bigint, interval)"
# The history partition manager's (engine migration 0033): the tables' owner creates and drops
# partitions, the application only asks (engine.partitions).
PARTITION_FUNCTIONS = ("ff_history_partition_create(text, timestamptz, timestamptz)",
                       "ff_history_partition_drop(text)")


class Command(BaseCommand):
    help = "Create or update the application's database role: full DML except on the audit log (SELECT, INSERT)."

    def add_arguments(self, parser):
        parser.add_argument("role")
        parser.add_argument("--password", help="set the role's password (LOGIN); omit to keep it")

    def handle(self, *args, **opts):
        role = opts["role"]
        with connection.cursor() as cur:
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
            row = cur.fetchone()
        if row and row[0]:
            raise CommandError(f"role {role!r} is a superuser; the application role must not be one")
        ident = sql.Identifier(role)
        stmts = []
        if row is None:
            stmts.append(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT").format(ident))
        if opts["password"]:
            stmts.append(sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(ident, sql.Literal(opts["password"])))
        stmts += [
            sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident),
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(ident),
            sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(ident),
            # Future tables (later migrations) get the same; the audit table is fixed below.
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}").format(ident),
            sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {}").format(ident),
            sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(AUDIT_TABLE), ident),
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(AUDIT_TABLE), ident),
            sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(CHECKPOINT_TABLE), ident),
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(sql.Identifier(CHECKPOINT_TABLE), ident),
            sql.SQL("GRANT EXECUTE ON FUNCTION " + REMOVE_FUNCTION + " TO {}").format(ident),
            *(sql.SQL("GRANT EXECUTE ON FUNCTION " + f + " TO {}").format(ident) for f in PARTITION_FUNCTIONS),
        ]
        with transaction.atomic(), connection.cursor() as cur:
            for stmt in stmts:
                cur.execute(stmt)
        self.stdout.write(f"role {role}: DML on every table; SELECT and INSERT only on {AUDIT_TABLE} "
                          f"and {CHECKPOINT_TABLE}")
