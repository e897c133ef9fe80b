"""Audit retention (issue 21): old rows go, each chain still verifies from a signed
checkpoint, and an edit of a kept row is still found (docs/audit.md, "Retention")."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from audit.keys import signing_key
from audit.models import AuditCheckpoint, AuditLog
from audit.retention import purge
from audit.services import record
from tenancy.actors import Actor
from tenancy.services import create_organization

ROOT = Path(__file__).resolve().parents[2]
YEARS_AGO = dt.timedelta(days=3 * 365)


def audit_verify(*args: str) -> tuple[bool, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return False, f"{out.getvalue()}{err.getvalue()}{exc}"
    return True, out.getvalue() + err.getvalue()


@pytest.fixture
def old_org(monkeypatch):
    """An organization made three years ago with 8 more audit rows of then, and 3 rows of now:
    its chain is seq 1..n_old (old) then n_old+1..n_old+3 (now)."""
    past = timezone.now() - YEARS_AGO
    clock = iter(past + dt.timedelta(seconds=i) for i in range(10_000))
    with monkeypatch.context() as m:
        m.setattr(timezone, "now", lambda: next(clock))
        org, _user, _ = create_organization(slug=f"old-{uuid.uuid4().hex[:6]}", name="Old",
                                            owner_email=f"owner-{uuid.uuid4().hex[:6]}@old.example")
        for i in range(8):
            record("test.old", actor=Actor.system(org), metadata={"i": i})
    n_old = AuditLog.objects.for_organization(org).count()
    for i in range(3):
        record("test.new", actor=Actor.system(org), metadata={"i": i})
    return org, n_old


def seqs(org) -> list[int]:
    return list(AuditLog.objects.for_organization(org).order_by("seq").values_list("seq", flat=True))


def org_item(results, org):
    return next(i for i in results if i.chain == str(org.pk))


@pytest.mark.django_db
def test_old_rows_are_removed_and_every_chain_still_verifies(old_org):
    org, n_old = old_org
    assert n_old >= 9
    results = purge(keep_days=365)
    item = org_item(results, org)
    assert (item.first_seq, item.through_seq, item.removable, item.removed, item.problem) == (1, n_old, n_old, n_old, "")
    assert seqs(org) == [n_old + 1, n_old + 2, n_old + 3]
    checkpoint = AuditCheckpoint.objects.get(chain=str(org.pk))
    assert (checkpoint.seq, checkpoint.rows_removed) == (n_old, n_old)
    first_kept = AuditLog.objects.for_organization(org).order_by("seq").first()
    assert first_kept.prev_hash == checkpoint.row_hash
    ok, output = audit_verify()
    assert ok, output
    # A second pass has nothing left to remove in this chain (its newest old row is gone).
    assert str(org.pk) not in {i.chain for i in purge(keep_days=365)}


@pytest.mark.django_db
def test_an_edit_of_a_kept_row_is_still_found_after_retention(old_org):
    org, n_old = old_org
    purge(keep_days=365)
    kept = AuditLog.objects.for_organization(org).get(seq=n_old + 2)
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete")
        cur.execute("UPDATE core_auditlog SET metadata = '{\"i\": 99}' WHERE id = %s", [kept.pk])
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_update_delete")
    ok, output = audit_verify()
    assert not ok
    assert f"broken at row {kept.pk} (seq {n_old + 2}): its content does not match its hash" in output


@pytest.mark.django_db
def test_a_preview_removes_nothing_and_counts_what_would_go(old_org):
    org, n_old = old_org
    before = seqs(org)
    item = org_item(purge(keep_days=365, preview=True), org)
    assert (item.removable, item.removed) == (n_old, 0)
    assert seqs(org) == before
    assert not AuditCheckpoint.objects.filter(chain=str(org.pk)).exists()
    out = io.StringIO()
    call_command("audit_purge", "--preview", "--days", "365", stdout=out)
    assert f"chain {org.pk}: would remove {n_old} row(s), seq 1..{n_old}" in out.getvalue()
    assert seqs(org) == before


@pytest.mark.django_db
def test_rows_inside_the_policy_stay(old_org):
    org, _n_old = old_org
    before = seqs(org)
    assert str(org.pk) not in {i.chain for i in purge(keep_days=4 * 365)}
    assert seqs(org) == before


@pytest.mark.django_db
def test_small_batches_leave_one_checkpoint_each_and_verify(old_org):
    org, n_old = old_org
    item = org_item(purge(keep_days=365, batch_rows=2), org)
    assert item.removed == n_old
    cps = list(AuditCheckpoint.objects.filter(chain=str(org.pk)).order_by("seq").values_list("seq", "rows_removed"))
    expected = [(min(s + 1, n_old), min(s + 1, n_old) - s + 1) for s in range(1, n_old + 1, 2)]
    assert cps == expected
    assert sum(r for _s, r in cps) == n_old
    ok, output = audit_verify()
    assert ok, output


@pytest.mark.django_db
def test_a_bounded_pass_removes_at_most_max_rows_and_the_next_goes_on(old_org):
    org, n_old = old_org
    assert org_item(purge(keep_days=365, max_rows=4), org).removed == 4
    assert seqs(org)[0] == 5
    assert audit_verify()[0]
    assert org_item(purge(keep_days=365), org).removed == n_old - 4
    assert seqs(org)[0] == n_old + 1
    assert audit_verify()[0]


@pytest.mark.django_db
def test_the_newest_row_of_a_chain_is_kept_however_old(monkeypatch):
    past = timezone.now() - YEARS_AGO
    with monkeypatch.context() as m:
        m.setattr(timezone, "now", lambda: past)
        org, _user, _ = create_organization(slug=f"quiet-{uuid.uuid4().hex[:6]}", name="Quiet",
                                            owner_email=f"owner-{uuid.uuid4().hex[:6]}@quiet.example")
        record("test.old", actor=Actor.system(org))
        record("test.old", actor=Actor.system(org))
    last = seqs(org)[-1]
    assert last >= 3
    item = org_item(purge(keep_days=365), org)
    assert (item.through_seq, item.removed) == (last - 1, last - 1)
    assert seqs(org) == [last]
    assert audit_verify()[0]


@pytest.mark.django_db
def test_a_chain_that_does_not_verify_is_left_whole_and_named(old_org):
    org, n_old = old_org
    edited = AuditLog.objects.for_organization(org).get(seq=3)
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete")
        cur.execute("UPDATE core_auditlog SET action = 'test.rewritten' WHERE id = %s", [edited.pk])
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_update_delete")
    before = seqs(org)
    item = org_item(purge(keep_days=365), org)
    assert item.removed == 0 and item.problem.startswith("seq 3: its content does not match its hash")
    assert seqs(org) == before
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 chain\\(s\\) do not verify"):
        call_command("audit_purge", "--days", "365", stdout=io.StringIO(), stderr=err)
    assert f"chain {org.pk}: left whole, it does not verify: seq 3" in err.getvalue()
    assert seqs(org) == before


@pytest.mark.django_db
def test_a_head_exported_before_retention_still_verifies(old_org, tmp_path):
    org, n_old = old_org
    head = tmp_path / "head.json"
    ok, output = audit_verify("--export-head", str(head))
    assert ok, output
    assert json.loads(head.read_text())["heads"][str(org.pk)]["seq"] == n_old + 3
    purge(keep_days=365)
    ok, output = audit_verify("--head", str(head))
    assert ok, output


@pytest.mark.django_db
def test_a_checkpoint_not_signed_with_the_audit_key_breaks_the_chain(old_org):
    org, n_old = old_org
    purge(keep_days=365)
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditcheckpoint DISABLE TRIGGER ff_auditcheckpoint_no_update_delete")
        cur.execute("UPDATE core_auditcheckpoint SET signature = %s WHERE chain = %s", ["0" * 64, str(org.pk)])
        cur.execute("ALTER TABLE core_auditcheckpoint ENABLE TRIGGER ff_auditcheckpoint_no_update_delete")
    ok, output = audit_verify()
    assert not ok
    assert (f"(seq {n_old + 1}): the retention checkpoint at seq {n_old} does not match its signature" in output), output


@pytest.mark.django_db
def test_rows_removed_without_a_checkpoint_are_still_found(old_org):
    org, _n_old = old_org
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete")
        cur.execute("DELETE FROM core_auditlog WHERE chain = %s AND seq <= 2", [str(org.pk)])
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_update_delete")
    ok, output = audit_verify()
    assert not ok and "rows 1..2 are missing, and no retention checkpoint accounts for them" in output


def refused(sql: str, params) -> str:
    with pytest.raises(DatabaseError) as excinfo:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, params)
    return str(excinfo.value)


@pytest.mark.django_db
def test_the_removal_function_and_the_trigger_refuse_everything_else(old_org):
    org, n_old = old_org
    chain = str(org.pk)
    remove = "SELECT ff_audit_remove_through(%s, %s, make_interval(days => %s))"
    assert f"chain {chain}: no checkpoint at seq 3" in refused(remove, [chain, 3, 365])
    assert "kept at least 365 days" in refused(remove, [chain, 3, 30])
    # A checkpoint whose hash is not that row's: refused by the function.
    AuditCheckpoint.objects.create(chain=chain, seq=3, row_hash="f" * 64, row_created_at=timezone.now(),
                                   key_id="x", signature="0" * 64, rows_removed=3, created_at=timezone.now())
    assert "the checkpoint at seq 3 does not match that row" in refused(remove, [chain, 3, 365])
    # Rows inside the policy: refused whatever the checkpoint says.
    last = seqs(org)[-1]
    row = AuditLog.objects.for_organization(org).get(seq=last - 1)
    AuditCheckpoint.objects.create(chain=chain, seq=last - 1, row_hash=row.row_hash, row_created_at=row.created_at,
                                   key_id="x", signature="0" * 64, rows_removed=1, created_at=timezone.now())
    assert f"rows through seq {last - 1} include one of" in refused(remove, [chain, last - 1, 365])
    # Without the function's flag, a plain DELETE is refused even of a covered row.
    assert "append-only: DELETE is not allowed" in refused(
        "DELETE FROM core_auditlog WHERE chain = %s AND seq = 1", [chain])
    # Checkpoints themselves are append-only.
    assert "core_auditcheckpoint is append-only: DELETE" in refused(
        "DELETE FROM core_auditcheckpoint WHERE chain = %s", [chain])
    assert "core_auditcheckpoint is append-only: UPDATE" in refused(
        "UPDATE core_auditcheckpoint SET seq = 1 WHERE chain = %s", [chain])
    assert seqs(org) == list(range(1, n_old + 4))


@pytest.mark.django_db(transaction=True)
def test_the_application_role_purges_only_through_the_function(old_org):
    org, n_old = old_org
    role, password = f"ff_app_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    call_command("grant_app_role", role, password=password, stdout=io.StringIO())
    s = connection.settings_dict
    try:
        with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                             user=role, password=password, autocommit=True) as app:
            for sql, expected in [
                ("DELETE FROM core_auditlog", "permission denied"),
                ("DELETE FROM core_auditcheckpoint", "permission denied"),
                ("UPDATE core_auditcheckpoint SET seq = 0", "permission denied"),
            ]:
                with pytest.raises(psycopg.Error) as excinfo:
                    app.execute(sql)
                assert expected in str(excinfo.value), (sql, str(excinfo.value))
        # The application's own purge (as the web, workers and clock would run it) works.
        with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                             user=role, password=password) as app:
            cp_row = AuditLog.objects.for_organization(org).get(seq=2)
            app.execute("INSERT INTO core_auditcheckpoint (id, chain, seq, row_hash, row_created_at, key_id, "
                        "signature, rows_removed, created_at) VALUES (%s, %s, 2, %s, %s, %s, %s, 2, now())",
                        [uuid.uuid4(), str(org.pk), cp_row.row_hash, cp_row.created_at, signing_key()[0], "0" * 64])
            removed = app.execute("SELECT ff_audit_remove_through(%s, 2, make_interval(days => 365))",
                                  [str(org.pk)]).fetchone()[0]
            app.commit()
        assert removed == 2
        assert seqs(org)[0] == 3
        # ...and a checkpoint written without the audit key does not pass the check.
        ok, output = audit_verify()
        assert not ok and "the retention checkpoint at seq 2 does not match its signature" in output
    finally:
        with connection.cursor() as cur:
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE "{role}"')


@pytest.mark.parametrize("days", ["100", "364", "1.5", "-1"])
def test_a_retention_under_a_year_is_refused_at_start(days):
    env = {**os.environ, "FLOWFORGE_AUDIT_RETENTION_DAYS": days, "DJANGO_SETTINGS_MODULE": "flowforge.settings"}
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"FLOWFORGE_AUDIT_RETENTION_DAYS={days!r}: expected a whole number of days, at least 365" in proc.stderr


def test_purge_refuses_a_policy_under_a_year():
    with pytest.raises(ValueError, match="keep_days=30: audit rows are kept at least 365 days"):
        purge(keep_days=30)
    assert purge(keep_days=0) == []


@pytest.mark.django_db
def test_staff_see_checkpoints_read_only(old_org):
    from django.test import Client

    from tenancy.models import User

    purge(keep_days=365)
    staff = User.objects.create_superuser(email=f"staff-{uuid.uuid4().hex[:6]}@flowforge.example",
                                          password="x-long-pass-123")
    client = Client()
    client.force_login(staff)
    listing = client.get("/admin/audit/auditcheckpoint/")
    assert listing.status_code == 200 and str(old_org[0].pk) in listing.content.decode()
    assert client.get("/admin/audit/auditcheckpoint/add/").status_code == 403
    checkpoint = AuditCheckpoint.objects.get(chain=str(old_org[0].pk))
    assert client.post(f"/admin/audit/auditcheckpoint/{checkpoint.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditCheckpoint.objects.filter(pk=checkpoint.pk).exists()


@pytest.mark.django_db
def test_the_clocks_housekeeping_applies_the_policy(old_org, settings):
    from engine.actors import housekeeping

    org, n_old = old_org
    settings.FLOWFORGE_AUDIT_RETENTION_DAYS = 0  # off: nothing goes
    housekeeping.fn()
    assert seqs(org)[0] == 1
    settings.FLOWFORGE_AUDIT_RETENTION_DAYS = 365
    housekeeping.fn()
    assert seqs(org) == [n_old + 1, n_old + 2, n_old + 3]
    assert audit_verify()[0]
