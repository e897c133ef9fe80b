"""Issue 14, finding 5: the audit chain cannot be rewritten unnoticed.

Each test is the attack, in raw SQL as the application role (or, where the append-only
trigger is in the way, as the table's owner with the trigger disabled), then
``manage.py audit_verify`` must fail naming what it found.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from audit.chain import GENESIS, canonical
from audit.models import AuditLog
from audit.services import record
from tenancy.actors import Actor
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role, User
from tenancy.services import change_role

ROOT = Path(__file__).resolve().parents[2]


def key_spec(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(32)).decode()}"


def audit_verify(*args: str) -> tuple[bool, str]:
    """Run ``manage.py audit_verify``; (passed, stdout + stderr + the error)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return False, f"{out.getvalue()}{err.getvalue()}{exc}"
    return True, out.getvalue() + err.getvalue()


def as_owner_without_trigger(sql: str, params=()) -> None:
    """What the table's owner can do: switch the append-only trigger off around a write."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE core_auditlog DISABLE TRIGGER ff_auditlog_no_update_delete")
        cur.execute(sql, params)
        cur.execute("ALTER TABLE core_auditlog ENABLE TRIGGER ff_auditlog_no_update_delete")


def sha256_of(row: dict) -> str:
    """The old unkeyed scheme, which anyone can compute."""
    return hashlib.sha256(canonical(row)).hexdigest()


# Every stored column (key_id included where it exists), as values() names them.
ROW_FIELDS = tuple(f.attname for f in AuditLog._meta.concrete_fields)


def chain_rows(org) -> list[dict]:
    return list(AuditLog.objects.for_organization(org).order_by("seq").values(*ROW_FIELDS))


def rehash_forward(org, from_seq: int, *, unkeyed: bool = False) -> None:
    """Recompute every row from ``from_seq`` on with plain SHA-256 and store it (owner bypass)."""
    prev = GENESIS
    for row in chain_rows(org):
        if row["seq"] < from_seq:
            prev = row["row_hash"]
            continue
        row["prev_hash"] = prev
        if unkeyed:
            row["key_id"] = None
            as_owner_without_trigger("UPDATE core_auditlog SET key_id = NULL WHERE id = %s", [row["id"]])
        row["row_hash"] = sha256_of(row)
        as_owner_without_trigger(
            "UPDATE core_auditlog SET metadata = %s, prev_hash = %s, row_hash = %s WHERE id = %s",
            [json.dumps(row["metadata"]), row["prev_hash"], row["row_hash"], row["id"]])
        prev = row["row_hash"]


@pytest.fixture
def history(org):
    """An organization with some history: an admin promoted to owner and back."""
    owner = Membership.objects.for_organization(org).select_related("organization", "user").get(role=Role.OWNER)
    user = User.objects.create_user(email=f"eve-{uuid.uuid4().hex[:6]}@example.com")
    eve = Membership.objects.create(organization=org, user=user, role=Role.VIEWER)
    actor = actor_for_membership(owner)
    change_role(actor=actor, membership=eve, role=Role.MEMBER)
    change_role(actor=actor, membership=eve, role=Role.ADMIN)
    for i in range(3):
        record("test.event", actor=Actor.system(org), metadata={"i": i})
    return org, eve


@pytest.mark.django_db
def test_an_edit_rehashed_forward_with_sha256_fails_verification(history):
    org, eve = history
    assert audit_verify()[0]
    edited = AuditLog.objects.for_organization(org).filter(action="member.role_changed").order_by("seq").first()
    metadata = {**edited.metadata, "role": {"before": "viewer", "after": "owner"}}
    as_owner_without_trigger("UPDATE core_auditlog SET metadata = %s WHERE id = %s", [json.dumps(metadata), edited.pk])
    rehash_forward(org, edited.seq)

    ok, output = audit_verify()
    assert not ok
    assert f"chain {org.pk}: broken at row {edited.pk} (seq {edited.seq}): its content does not match its hash" in output


@pytest.mark.django_db
def test_a_whole_chain_rewritten_as_legacy_sha256_rows_fails_verification(history):
    org, _eve = history
    first = chain_rows(org)[0]
    rehash_forward(org, 1, unkeyed=True)  # a downgrade: every row now claims the unkeyed scheme

    ok, output = audit_verify()
    assert not ok
    assert f"chain {org.pk}: broken at row {first['id']} (seq 1): an unkeyed row" in output


@pytest.mark.django_db(transaction=True)
def test_a_forged_role_change_inserted_by_the_application_role_fails_verification(history):
    org, eve = history
    rows = chain_rows(org)
    last = rows[-1]
    role = f"ff_app_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    call_command("grant_app_role", role, password=password, stdout=io.StringIO())
    s = connection.settings_dict
    forged_ids = []
    try:
        with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, dbname=s["NAME"],
                             user=role, password=password, autocommit=True) as app:
            prev, seq = last["row_hash"], last["seq"]
            for key_id in (None, "dev"):  # claiming the legacy scheme, and claiming the current key
                seq += 1
                forged = {**last, "id": uuid.uuid4(), "action": "member.role_changed", "seq": seq,
                          "prev_hash": prev, "target_type": "membership", "target_id": str(eve.pk),
                          "metadata": {"user": eve.user.email, "role": {"before": "admin", "after": "owner"}},
                          "key_id": key_id}
                forged["row_hash"] = sha256_of(forged)
                app.execute(
                    "INSERT INTO core_auditlog (id, organization_id, actor_type, actor_user_id, actor_email, "
                    "actor_api_key_id, actor_api_key_prefix, action, target_type, target_id, metadata, ip_address, "
                    "user_agent, request_id, created_at, chain, seq, prev_hash, row_hash, key_id) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [forged["id"], forged["organization_id"], forged["actor_type"], forged["actor_user_id"],
                     forged["actor_email"], forged["actor_api_key_id"], forged["actor_api_key_prefix"],
                     forged["action"], forged["target_type"], forged["target_id"], json.dumps(forged["metadata"]),
                     forged["ip_address"], forged["user_agent"], forged["request_id"], forged["created_at"],
                     forged["chain"], forged["seq"], forged["prev_hash"], forged["row_hash"], forged["key_id"]])
                forged_ids.append(forged["id"])
                prev = forged["row_hash"]
    finally:
        with connection.cursor() as cur:
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE "{role}"')

    ok, output = audit_verify()
    assert not ok
    assert f"chain {org.pk}: broken at row {forged_ids[0]} (seq {last['seq'] + 1}): an unkeyed row" in output

    # The same forgery claiming the current key id: its SHA-256 is not the key's HMAC.
    as_owner_without_trigger("DELETE FROM core_auditlog WHERE id = %s", [forged_ids[0]])
    as_owner_without_trigger("UPDATE core_auditlog SET seq = %s, prev_hash = %s, row_hash = %s WHERE id = %s",
                             [last["seq"] + 1, last["row_hash"], "0" * 64, forged_ids[1]])
    row = AuditLog.objects.for_organization(org).values(*ROW_FIELDS).get(pk=forged_ids[1])
    as_owner_without_trigger("UPDATE core_auditlog SET row_hash = %s WHERE id = %s", [sha256_of(row), forged_ids[1]])
    ok, output = audit_verify()
    assert not ok
    assert (f"broken at row {forged_ids[1]} (seq {last['seq'] + 1}): its content does not match its hash "
            "(the HMAC under key 'dev')") in output


@pytest.mark.django_db
def test_deleting_a_whole_organizations_chain_fails_verification(history, make_org):
    org, _eve = history
    bystander = make_org()
    as_owner_without_trigger("DELETE FROM core_auditlog WHERE chain = %s", [str(org.pk)])
    assert not AuditLog.objects.for_organization(org).exists()

    ok, output = audit_verify()
    assert not ok
    assert f"chain {org.pk}: broken: organization {org.slug!r} has members, workflows or runs but no audit chain" in output
    assert str(bystander.pk) not in output


@pytest.mark.django_db
def test_a_truncated_tail_fails_verification_against_an_exported_head(history, tmp_path):
    org, _eve = history
    head = tmp_path / "head.json"
    ok, output = audit_verify("--export-head", str(head))
    assert ok, output
    exported = json.loads(head.read_text())
    last = chain_rows(org)[-1]
    assert exported["heads"][str(org.pk)] == {"seq": last["seq"], "row_hash": last["row_hash"]}
    assert exported["key_id"] == "dev" and len(exported["signature"]) == 64

    # Rows appended after the export are fine.
    record("test.later", actor=Actor.system(org))
    assert audit_verify("--head", str(head))[0]

    # Remove the newest rows, back to before the exported head: the walk alone cannot tell ...
    as_owner_without_trigger("DELETE FROM core_auditlog WHERE chain = %s AND seq >= %s", [str(org.pk), last["seq"] - 1])
    assert audit_verify()[0]
    # ... the head can.
    ok, output = audit_verify("--head", str(head))
    assert not ok
    assert (f"chain {org.pk}: broken: the chain ends at seq {last['seq'] - 2} but the exported head reached "
            f"seq {last['seq']}: rows {last['seq'] - 1}..{last['seq']} were removed") in output


@pytest.mark.django_db
def test_an_edited_head_file_is_refused(history, tmp_path):
    head = tmp_path / "head.json"
    assert audit_verify("--export-head", str(head))[0]
    doc = json.loads(head.read_text())
    org, _eve = history
    doc["heads"][str(org.pk)]["seq"] -= 2  # the attacker lowers the head to cover a truncation
    head.write_text(json.dumps(doc))
    ok, output = audit_verify("--head", str(head))
    assert not ok and "its signature does not verify" in output


@pytest.mark.django_db
def test_rows_signed_by_a_rotated_key_verify_while_it_is_configured_and_are_named_when_not(make_org, settings):
    k1, k2 = key_spec("k1"), key_spec("k2")
    settings.FLOWFORGE_AUDIT_KEYS = k1
    org = make_org()  # its organization.created row is the first signed by k1
    old = [*AuditLog.objects.for_organization(org), record("test.k1", actor=Actor.system(org))]
    settings.FLOWFORGE_AUDIT_KEYS = f"{k2},{k1}"
    new = [record("test.k2", actor=Actor.system(org)) for _ in range(2)]
    assert [r.key_id for r in old + new] == ["k1", "k1", "k2", "k2"] and old[0].seq == 1
    ok, output = audit_verify()
    assert ok, output

    settings.FLOWFORGE_AUDIT_KEYS = k2
    ok, output = audit_verify()
    assert not ok
    assert (f"chain {org.pk}: 2 row(s) from seq {old[0].seq} are unverifiable: signed with key id 'k1', "
            "which FLOWFORGE_AUDIT_KEYS does not hold") in output


@pytest.mark.django_db
def test_legacy_rows_verify_only_when_the_deployment_accepts_them_and_never_after_keyed_ones(org, settings):
    first = chain_rows(org)[0]
    # A deployment upgraded from unkeyed chains: its old rows stay plain SHA-256.
    as_owner_without_trigger("UPDATE core_auditlog SET key_id = NULL, row_hash = %s WHERE id = %s",
                             [sha256_of({**first, "key_id": None}), first["id"]])
    record("test.after_upgrade", actor=Actor.system(org))
    assert not audit_verify()[0]
    settings.FLOWFORGE_AUDIT_ACCEPT_LEGACY = True
    ok, output = audit_verify()
    assert ok, output
    # An unkeyed row appended after a keyed one is refused even so.
    rows = chain_rows(org)
    forged = {**rows[-1], "id": uuid.uuid4(), "seq": rows[-1]["seq"] + 1, "prev_hash": rows[-1]["row_hash"],
              "key_id": None, "action": "member.role_changed"}
    with transaction.atomic():
        AuditLog(**{**{k: v for k, v in forged.items() if k not in ("organization_id", "actor_user_id",
                                                                    "actor_api_key_id")},
                    "organization_id": forged["organization_id"], "row_hash": sha256_of(forged)}).save(force_insert=True)
    ok, output = audit_verify()
    assert not ok and f"broken at row {forged['id']} (seq {forged['seq']}): an unkeyed row after keyed rows" in output


@pytest.mark.parametrize("keys, message", [
    (None, "FLOWFORGE_AUDIT_KEYS is not set: with DEBUG off"),
    ("k1:bm90LWJhc2U2NA", "FLOWFORGE_AUDIT_KEYS entry 1 (k1): the key is not valid base64"),
    (f"k1:{base64.b64encode(b'short').decode()}", "FLOWFORGE_AUDIT_KEYS entry 1 (k1): the key is 5 bytes; at least 32"),
    # 32 zero bytes (a placeholder, as an image build once used): long enough, but not a secret.
    (f"k1:{base64.b64encode(bytes(32)).decode()}",
     "FLOWFORGE_AUDIT_KEYS entry 1 (k1): the key has 1 distinct byte values, not random"),
])
def test_a_production_start_without_usable_audit_keys_is_refused(keys, message):
    env = {k: v for k, v in os.environ.items() if k != "FLOWFORGE_AUDIT_KEYS"}
    env.update(DEBUG="false", SECRET_KEY=secrets.token_urlsafe(50), DJANGO_SETTINGS_MODULE="flowforge.settings")
    if keys is not None:
        env["FLOWFORGE_AUDIT_KEYS"] = keys
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert django_settings.FLOWFORGE_AUDIT_KEYS  # this test process itself runs with DEBUG's dev key
