"""The audit log: append-only in the database, tamper-evident, read-only for staff."""

from __future__ import annotations

import csv
import io
import threading
import uuid

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.test import Client

from audit.models import AuditLog
from audit.services import SecretInMetadata, record
from audit.verify import verify_all
from tenancy.actors import Actor
from tenancy.models import User

TRIGGERS = {"ff_auditlog_no_update_delete", "ff_auditlog_no_truncate"}


def triggers() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'core_auditlog'::regclass AND NOT tgisinternal")
        return {r[0] for r in cur.fetchall()}


def refused(write) -> str:
    """Run ``write`` in a savepoint; assert the database refused it; return the message."""
    with pytest.raises(DatabaseError) as excinfo:
        with transaction.atomic():
            write()
    return str(excinfo.value)


@pytest.fixture
def entry(org):
    with transaction.atomic():
        return record("test.event", actor=Actor.system(org), target=("thing", "t1"), metadata={"n": 1})


@pytest.mark.django_db
def test_update_delete_bulk_update_raw_sql_and_truncate_are_all_refused(entry):
    qs = AuditLog.objects.unscoped().filter(pk=entry.pk)
    assert "core_auditlog is append-only: UPDATE is not allowed" in refused(lambda: qs.update(action="x"))
    assert "core_auditlog is append-only: DELETE is not allowed" in refused(lambda: qs.delete())
    entry.action = "changed"
    assert "UPDATE is not allowed" in refused(lambda: AuditLog.objects.unscoped().bulk_update([entry], ["action"]))

    def raw(sql):
        with connection.cursor() as cur:
            cur.execute(sql, [entry.pk])

    assert "UPDATE is not allowed" in refused(lambda: raw("UPDATE core_auditlog SET action = 'x' WHERE id = %s"))
    assert "DELETE is not allowed" in refused(lambda: raw("DELETE FROM core_auditlog WHERE id = %s"))
    assert "TRUNCATE is not allowed" in refused(lambda: raw("TRUNCATE core_auditlog -- %s"))
    stored = AuditLog.objects.unscoped().get(pk=entry.pk)
    assert (stored.action, stored.metadata) == ("test.event", {"n": 1})


@pytest.mark.django_db(transaction=True)
def test_the_trigger_migration_reverses_and_reapplies():
    assert triggers() == TRIGGERS
    try:
        call_command("migrate", "audit", "0001", verbosity=0)
        assert triggers() == set()
    finally:
        call_command("migrate", "audit", verbosity=0)
    assert triggers() == TRIGGERS


@pytest.mark.django_db
def test_a_rolled_back_change_leaves_no_record(org):
    before = AuditLog.objects.for_organization(org).count()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            record("test.doomed", actor=Actor.system(org))
            raise RuntimeError("the change failed")
    assert AuditLog.objects.for_organization(org).count() == before
    assert not AuditLog.objects.for_organization(org).filter(action="test.doomed").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["password", "secret", "token", "totp_secret", "hashed_key", "recovery_codes"])
def test_metadata_naming_a_secret_is_refused(org, key):
    with pytest.raises(SecretInMetadata, match=f"metadata.changes.{key}"):
        record("test.leak", actor=Actor.system(org), metadata={"changes": {key: "x"}})


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_keep_every_chain_intact(make_org):
    orgs = [make_org(f"burst-{i}") for i in range(2)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for j in range(25):
                org = orgs[(i + j) % 2]
                with transaction.atomic():
                    record("test.burst", actor=Actor.system(org), metadata={"thread": i, "n": j})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert AuditLog.objects.unscoped().filter(action="test.burst").count() == 200
    for org in orgs:
        seqs = list(AuditLog.objects.for_organization(org).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))  # no two rows claim one place
    checked, breaks = verify_all()
    assert breaks == [] and checked >= 200
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    assert out.getvalue().startswith("audit log intact:")


def _disable_trigger_and(sql: str, params) -> None:
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete")
        cur.execute(sql, params)
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_update_delete")


@pytest.mark.django_db
def test_a_record_checks_the_transactions_pending_foreign_keys_first_and_leaves_them_deferred(org):
    """audit.record makes the transaction's pending foreign-key checks before it takes the chain
    lock (so they lock referenced rows before it, not at the commit) and then defers them
    again, as they were: a dangling reference written before a record is refused there, and
    one written after it is refused only at the commit (here: at the end of the savepoint's
    immediate check). Restoring ``ALL DEFERRED`` is only right while every deferrable
    constraint of the schema is INITIALLY DEFERRED, which the first query checks."""
    with connection.cursor() as cur:
        cur.execute("SELECT conrelid::regclass::text, conname FROM pg_constraint "
                    "WHERE condeferrable AND NOT condeferred")
        assert cur.fetchall() == []
    actor = Actor.system(org)
    missing = uuid.uuid4()

    def dangling_membership():
        with connection.cursor() as cur:  # a membership of a user that does not exist
            cur.execute("INSERT INTO core_membership (id, organization_id, user_id, role, created_at) "
                        "VALUES (%s, %s, %s, 'member', now())", [uuid.uuid4(), org.pk, missing])

    with pytest.raises(DatabaseError, match="foreign key"), transaction.atomic():
        dangling_membership()
        record("test.checked", actor=actor)  # the pending check is made here
    with transaction.atomic():
        record("test.deferred", actor=actor)
        dangling_membership()  # deferred again: accepted until the checks run
        with pytest.raises(DatabaseError, match="foreign key"), connection.cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
        transaction.set_rollback(True)


@pytest.mark.django_db
def test_audit_verify_names_an_edited_row(org):
    rows = [record("test.chain", actor=Actor.system(org), metadata={"i": i}) for i in range(5)]
    _disable_trigger_and("UPDATE core_auditlog SET metadata = '{\"i\": 99}' WHERE id = %s", [rows[2].pk])
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 broken chain"):
        call_command("audit_verify", stdout=io.StringIO(), stderr=err)
    assert f"broken at row {rows[2].pk} (seq {rows[2].seq}): its content does not match its hash" in err.getvalue()


@pytest.mark.django_db
def test_audit_verify_names_the_row_after_a_deleted_one(org):
    rows = [record("test.chain", actor=Actor.system(org), metadata={"i": i}) for i in range(5)]
    _disable_trigger_and("DELETE FROM core_auditlog WHERE id = %s", [rows[1].pk])
    _, breaks = verify_all()
    assert len(breaks) == 1
    assert (breaks[0].row_id, breaks[0].seq) == (str(rows[2].pk), rows[2].seq)
    assert "missing (deleted)" in breaks[0].problem


@pytest.mark.django_db(transaction=True)
def test_the_application_role_cannot_change_the_audit_log_or_disable_its_trigger(org):
    with transaction.atomic():
        record("test.role", actor=Actor.system(org))
    role = f"ff_app_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    call_command("grant_app_role", role, password=password, stdout=io.StringIO())
    s = connection.settings_dict
    try:
        with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                             user=role, password=password, autocommit=True) as app:
            assert app.execute("SELECT count(*) FROM core_auditlog").fetchone()[0] >= 1
            for sql, expected in [
                ("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete", "must be owner"),
                ("ALTER TABLE core_auditlog DISABLE TRIGGER ALL", "must be owner"),
                ("SET session_replication_role = replica", "permission denied"),
                ("UPDATE core_auditlog SET action = 'x'", "permission denied"),
                ("DELETE FROM core_auditlog", "permission denied"),
                ("TRUNCATE core_auditlog", "permission denied"),
            ]:
                with pytest.raises(psycopg.Error) as excinfo:
                    app.execute(sql)
                assert expected in str(excinfo.value), (sql, str(excinfo.value))
            # It can still do its work: read engine tables, write them, append audit rows.
            assert app.execute("SELECT count(*) FROM core_workflow").fetchone()[0] >= 0
            app.execute("UPDATE core_organization SET name = name WHERE id = %s", [org.pk])
        assert triggers() == TRIGGERS
    finally:
        with connection.cursor() as cur:
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE "{role}"')


# --- the staff admin ------------------------------------------------------------------------


@pytest.fixture
def staff_client(db):
    user = User.objects.create_superuser(email=f"staff-{uuid.uuid4().hex[:6]}@flowforge.example", password="x-long-pass-123")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_staff_filter_search_and_export_the_audit_log(staff_client, make_org):
    a, b = make_org("adm-a"), make_org("adm-b")
    with transaction.atomic():
        record("run.started", actor=Actor.system(a), target=("workflowrun", "r-a"), metadata={"channel": "api"})
        record("run.cancelled", actor=Actor.system(b), target=("workflowrun", "r-b"))
    base = "/admin/audit/auditlog/"
    page = staff_client.get(base, {"organization__id__exact": str(a.pk)})
    assert page.status_code == 200
    body = page.content.decode()
    assert "r-a" in body and "r-b" not in body
    found = staff_client.get(base, {"q": "r-b"}).content.decode()
    assert "r-b" in found and "r-a" not in found
    by_action = staff_client.get(base, {"action": "run.started"}).content.decode()
    assert "r-a" in by_action and "r-b" not in by_action
    export = staff_client.get(base + "export.csv", {"organization__id__exact": str(a.pk)})
    assert export.status_code == 200 and export["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    assert {r["organization_id"] for r in rows} == {str(a.pk)}
    assert "r-a" in {r["target_id"] for r in rows}


@pytest.mark.django_db
def test_staff_cannot_add_change_or_delete_audit_records(staff_client, org):
    with transaction.atomic():
        entry = record("run.started", actor=Actor.system(org), target=("workflowrun", "x"))
    base = "/admin/audit/auditlog/"
    assert staff_client.get(base + "add/").status_code == 403
    assert staff_client.post(base + "add/", {"action": "forged"}).status_code == 403
    detail = staff_client.get(f"{base}{entry.pk}/change/")
    assert detail.status_code == 200  # viewable
    assert b'name="_save"' not in detail.content
    assert staff_client.post(f"{base}{entry.pk}/change/", {"action": "edited"}).status_code == 403
    assert staff_client.post(f"{base}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = staff_client.post(base, {"action": "delete_selected", "_selected_action": [str(entry.pk)]})
    assert bulk.status_code in (200, 302)
    stored = AuditLog.objects.unscoped().get(pk=entry.pk)
    assert stored.action == "run.started"
